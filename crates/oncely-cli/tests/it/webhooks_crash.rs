//! A worker killed after the endpoint accepted a delivery (issue 17, item 6): a real
//! `oncely worker` process delivers a `user.created` event to a receiver that keeps the copy
//! (signature verified by the test inbox's library) and then never answers; once the receiver
//! has it, the worker is SIGKILLed. Another worker takes the job over when its lease ends and
//! delivers it again with the same `webhook-id`: the receiver counts one distinct id and one
//! duplicate (it dedupes by that id), and the job ends sent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::requests::sign_up;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use oncely_inbox::{Faults, Inbox, Verification, WebhookHeaders, WebhookVerdict};
use oncely_testdb::TestDb;
use serde_json::Value;

use crate::support::{
    SECRET, both_databases, count, migrate, oncely_binary, run_ok, spawn_app_with_inbox,
    spawn_worker_with, start_inbox,
};

both_databases!(a_worker_killed_after_the_endpoint_accepted_is_followed_by_the_same_webhook_id);

/// The receiver's endpoint name in its inbox.
const NAME: &str = "hook";

/// A receiver that hands every request to an inbox (which verifies the signature, keeps the
/// copy and counts duplicates by `webhook-id`), then never answers the first one and answers
/// the others as the inbox decided.
#[derive(Clone)]
struct Receiver {
    inbox: Inbox,
    /// Requests received so far.
    requests: Arc<Mutex<usize>>,
}

impl Receiver {
    async fn start(inbox: Inbox) -> (Self, String) {
        let receiver = Self {
            inbox,
            requests: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{addr}/hook"))
    }

    fn requests(&self) -> usize {
        *self.requests.lock().unwrap()
    }

    /// Waits until `n` requests came, bounded (30 s: a process starting and a lease ending).
    async fn wait_for(&self, n: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.requests() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.requests()
    }
}

async fn receive(
    axum::extract::State(receiver): axum::extract::State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let headers = WebhookHeaders {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
    };
    let verdict = receiver.inbox.receive_webhook(NAME, headers, &body).await;
    let first = {
        let mut requests = receiver.requests.lock().unwrap();
        *requests += 1;
        *requests == 1
    };
    if first {
        // Accepted and kept; the answer never comes (the worker is killed while it waits).
        std::future::pending::<()>().await;
    }
    match verdict {
        WebhookVerdict::Accepted(_) => StatusCode::NO_CONTENT,
        WebhookVerdict::Invalid(..) => StatusCode::UNAUTHORIZED,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// `oncely tenant webhook add default URL --events user.created --json` with the test secret
/// (the workers unseal with it); returns the signing secret it printed.
async fn add_endpoint(url: &str, target: &str) -> String {
    let added = run_ok(
        oncely_binary(&["tenant", "webhook", "add", "default", target])
            .args(["--events", "user.created", "--json", "--database-url", url])
            .env("ONCELY_SECRET", SECRET)
            .env_remove("ONCELY_ENV"),
    )
    .await;
    let added: Value = serde_json::from_str(&added).unwrap();
    added["secret"].as_str().unwrap().to_owned()
}

/// The webhook job's status, waiting (bounded) until it is no longer pending.
async fn final_status(url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sent = count(
            url,
            "SELECT count(*) FROM oncely_outbox WHERE kind = 'webhook' AND status = 'sent'",
        )
        .await;
        if sent == 1 || Instant::now() >= deadline {
            return format!(
                "{sent} sent of {} webhook jobs",
                count(
                    url,
                    "SELECT count(*) FROM oncely_outbox WHERE kind = 'webhook'"
                )
                .await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_worker_killed_after_the_endpoint_accepted_is_followed_by_the_same_webhook_id(
    url: String,
    _db: TestDb,
) {
    migrate(&url).await;
    let receiver_inbox = Inbox::new();
    let (receiver, target) = Receiver::start(receiver_inbox.clone()).await;
    let signing = add_endpoint(&url, &target).await;
    receiver_inbox
        .set_webhook_secrets(NAME, [signing.as_str()])
        .unwrap();

    // The API without workers of its own: the signup writes the account, its email and its
    // `user.created` delivery, and nothing is delivered until a worker process runs.
    let (mail, running) = start_inbox(Faults::default()).await;
    let mailer = format!("smtp://{}", running.smtp_addr);
    let app = spawn_app_with_inbox(&url, mail, running, |s| s.workers = 0).await;
    sign_up(&app, "crash-1", "crash@example.com").await;
    // A short lease, so that the job comes back soon after the kill; a long webhook timeout, so
    // that the first worker never gives up on the delivery by itself before it is killed.
    let worker_args = ["--lease", "2s", "--webhook-timeout", "60s"];

    let mut first = spawn_worker_with(&url, &mailer, &worker_args).await;
    assert_eq!(receiver.wait_for(1).await, 1, "the first delivery came");
    first.kill().await.unwrap(); // SIGKILL, with the request accepted and unanswered
    let at_kill = receiver_inbox.webhook_ids(NAME);
    assert_eq!(receiver.requests(), 1, "only the killed worker delivered");

    let _second = spawn_worker_with(&url, &mailer, &worker_args).await;
    assert_eq!(receiver.wait_for(2).await, 2, "the delivery came again");
    let status = final_status(&url).await;
    assert_eq!(status, "1 sent of 1 webhook jobs");

    // The same webhook-id both times, both copies verified: one event, one duplicate.
    let ids = receiver_inbox.webhook_ids(NAME);
    assert_eq!(at_kill.len(), 1, "{at_kill:?}");
    assert_eq!(
        ids.keys().collect::<Vec<_>>(),
        at_kill.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        ids.values().copied().collect::<Vec<_>>(),
        vec![2],
        "{ids:?}"
    );
    let stats = receiver_inbox.stats().webhooks;
    assert_eq!((stats.distinct, stats.duplicates), (1, 1), "{stats:?}");
    assert_eq!((stats.invalid, stats.unverified), (0, 0), "{stats:?}");
    let copies = receiver_inbox.webhooks(Some(NAME), None);
    assert!(
        copies.iter().all(|c| c.verdict == Verification::Verified
            && c.event_type.as_deref() == Some("user.created")
            && c.body == copies[0].body),
        "{copies:?}"
    );
    // The id is the event's: the one the outbox job carries.
    let id = ids.keys().next().unwrap();
    let jobs = count(
        &url,
        &format!(
            "SELECT count(*) FROM oncely_outbox WHERE kind = 'webhook' AND CAST(payload AS TEXT) LIKE '%{id}%'"
        ),
    )
    .await;
    assert_eq!(jobs, 1, "the received id is the job's event id");
}
