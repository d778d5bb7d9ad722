//! Issue 14, item 3: one key, one payload. A verification email whose first attempt met an
//! unknown outcome is retried after its recipient, the public URL and the sender changed (a new
//! address in the database; the service restarted with other settings): the retry carries the
//! email of the first attempt, so the provider (the inbox in provider mode, which refuses
//! another payload under a key it has seen, like Resend) deduplicates it — one email, sent.

use std::future::Future;
use std::time::Duration;

use oncely_inbox::{Faults, Inbox, Running};
use oncely_server::accounts::Accounts;
use oncely_server::app::Application;
use oncely_server::settings::Settings;
use oncely_testdb::TestDb;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::requests::{SENT_JOBS, idempotent_post, token};
use crate::support::{both_databases, count, execute, on_backend, settings, token_in};

both_databases!(a_retry_after_an_unknown_outcome_sends_the_first_attempts_email_whatever_changed);

/// The service on `url`, mailing over SMTP to `running`, until the returned sender is used
/// (or dropped); its base URL and its task.
async fn serve(
    url: &str,
    running: &Running,
    configure: impl FnOnce(&mut Settings),
) -> (String, oneshot::Sender<()>, JoinHandle<()>) {
    let mut settings = settings(url, &format!("smtp://{}", running.smtp_addr));
    // The inbox deduplicates by the key (provider mode, as Resend's SMTP does): unknown outcomes
    // are resent, and the resend must carry the first attempt's payload.
    settings.on_unknown = Some(oncely_outbox::OnUnknown::Resend);
    configure(&mut settings);
    let (stop, stopped) = oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopped.await;
    };
    on_backend!(url, start(settings, stopped, stop))
}

async fn start<B: Accounts>(
    settings: Settings,
    stopped: impl Future<Output = ()> + Send + 'static,
    stop: oneshot::Sender<()>,
) -> (String, oneshot::Sender<()>, JoinHandle<()>) {
    let app = Application::<B>::build(settings).await.unwrap();
    let base = format!("http://{}", app.addr());
    let task = tokio::spawn(async move { app.run_until(stopped).await.unwrap() });
    (base, stop, task)
}

/// Waits (10 s at most) until `query` counts `n`.
async fn until(url: &str, query: &str, n: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count(url, query).await != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{query} never counted {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_retry_after_an_unknown_outcome_sends_the_first_attempts_email_whatever_changed(
    url: String,
    _db: TestDb,
) {
    const UNKNOWN: &str = "SELECT count(*) FROM oncely_outbox_attempts WHERE result = 'unknown'";
    let faults = Faults {
        drop_after_accept: 1,
        ..Faults::provider()
    };
    let (inbox, running): (Inbox, Running) = Inbox::start_local(faults).await.unwrap();

    // The first service: its worker sends, the provider keeps the email and the answer is lost;
    // the retry waits minutes (its first delay is an hour, capped).
    let (base, stop, first) = serve(&url, &running, |s| {
        s.public_url = Some("https://first.example".into());
        s.brand.from = "first@example.com".into();
        s.retry_base = Duration::from_secs(3600);
    })
    .await;
    let signup = idempotent_post(&oncely_testdb::http(), &base, "/v1/signup", "k")
        .json(&json!({ "email": "ada@example.com" }))
        .send()
        .await
        .unwrap();
    assert_eq!(signup.status(), 202);
    until(&url, UNKNOWN, 1).await;
    stop.send(()).unwrap();
    first.await.unwrap();

    // Before the retry: the address changes, and the service comes back with another public
    // URL and sender. The retry is made due now.
    execute(&url, "UPDATE oncely_users SET email = 'moved@example.com'").await;
    let due_now = if url.starts_with("postgres") {
        "UPDATE oncely_outbox SET run_after = now() - interval '1 second'"
    } else {
        "UPDATE oncely_outbox SET run_after = 0"
    };
    execute(&url, due_now).await;
    let (base, _stop, _second) = serve(&url, &running, |s| {
        s.public_url = Some("https://second.example".into());
        s.brand.from = "second@example.com".into();
    })
    .await;
    until(
        &url,
        "SELECT count(*) FROM oncely_outbox WHERE status <> 'pending'",
        1,
    )
    .await;
    assert_eq!(
        count(&url, SENT_JOBS).await,
        1,
        "sent, not dead: another payload under the key is refused (SMTP 554, HTTP 409)"
    );

    let results = "SELECT count(*) FROM oncely_outbox_attempts WHERE result IN ('unknown', 'sent')";
    assert_eq!(count(&url, results).await, 2, "unknown, then sent");
    let emails = inbox.messages(None);
    assert_eq!(emails.len(), 1, "exactly one email: {emails:#?}");
    let email = &emails[0];
    assert_eq!(
        (email.to.as_slice(), email.from.as_str()),
        (&["ada@example.com".to_owned()][..], "first@example.com")
    );
    assert!(
        email
            .text
            .contains("https://first.example/v1/verify?token="),
        "{}",
        email.text
    );
    let stats = inbox.stats();
    assert_eq!(
        (stats.deduplicated, stats.mismatched),
        (1, 0),
        "the retry carried the same payload"
    );
    // The link of the first attempt still works (its token is derived again, never stored).
    let verify = idempotent_post(&oncely_testdb::http(), &base, "/v1/verify", "v")
        .json(&token(&token_in(email)))
        .send()
        .await
        .unwrap();
    assert_eq!(verify.status(), 200);
}
