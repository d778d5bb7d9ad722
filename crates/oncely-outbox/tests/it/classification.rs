//! What a failed send means: nothing sent (a plain retry) or perhaps sent (unknown). Issue 14,
//! item 5: a refused connection or a failed TLS handshake sent nothing; an HTTP mailer never
//! follows a redirect (a POST would become a GET elsewhere). Item 3: a provider that refuses a
//! key used with another payload can never accept it (permanent); one whose first request with
//! the key still runs is worth a retry.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use oncely_inbox::{Faults, Inbox};
use oncely_outbox::Delivery;
use oncely_outbox::mail::{Email, from_url};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::mailer;

fn email() -> Email {
    Email {
        from: "from@example.com".into(),
        to: "to@example.com".into(),
        subject: "Hi".into(),
        text: "hello".into(),
        ..Default::default()
    }
}

async fn send(url: &str) -> Delivery {
    let mailer = mailer(url, Duration::from_secs(5));
    mailer.send(&email(), "key-1").await
}

#[tokio::test]
async fn an_smtp_server_that_refuses_the_connection_is_a_plain_retry() {
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // dropped: nothing listens there now
    let outcome = send(&format!("smtp://127.0.0.1:{port}")).await;
    assert!(matches!(outcome, Delivery::Retry(_)), "{outcome:?}");
}

#[tokio::test]
async fn a_failed_tls_handshake_is_a_plain_retry() {
    // A peer that answers the TLS ClientHello with something that is not TLS.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0; 1024];
            let _ = stream.read(&mut buf).await;
            let _ = stream.write_all(b"220 not tls at all\r\n").await;
        }
    });
    let outcome = send(&format!("smtps://localhost:{port}")).await;
    assert!(matches!(outcome, Delivery::Retry(_)), "{outcome:?}");
}

#[tokio::test]
async fn an_http_mailer_does_not_follow_a_redirect() {
    use crate::provider::FakeApi;
    let api = FakeApi::start(|_| {
        // Where it points does not matter: a followed redirect is a second request.
        let location = "Location: /elsewhere".to_owned();
        (307, vec![location], String::new())
    })
    .await;
    let outcome = send(&api.url).await;
    // The mailer's URL is wrong for every email: the kind pauses until it is fixed.
    assert!(matches!(outcome, Delivery::Refused(_)), "{outcome:?}");
    assert_eq!(api.requests(), 1, "the redirect was not followed");
}

/// Issue 14, items 1 and 2: what an HTTP provider's answer means. A throttle (429; 503 with
/// `Retry-After`) waits and spends no attempt; a refusal of our credentials (401, 403, 407)
/// pauses the kind; neither is the job's fault. Before, 429 was a plain retry and 401/403/407
/// permanent (dead at once).
#[tokio::test]
async fn an_http_provider_s_throttling_and_refusals_are_told_apart_from_failures() {
    use crate::provider::FakeApi;
    let answer = |status: u16, headers: &[&str]| {
        let headers: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
        move |_| (status, headers.clone(), r#"{"message":"no"}"#.to_owned())
    };
    let secs = Some(Duration::from_secs(120));
    let cases: Vec<(u16, Vec<&str>, Delivery)> = vec![
        (429, vec!["Retry-After: 120"], throttled(secs)),
        (429, vec![], throttled(None)),
        (429, vec!["Retry-After: whenever"], throttled(None)),
        (503, vec!["Retry-After: 120"], throttled(secs)),
        (503, vec![], Delivery::Retry(String::new())),
        (401, vec![], Delivery::Refused(String::new())),
        (403, vec![], Delivery::Refused(String::new())),
        (407, vec![], Delivery::Refused(String::new())),
        (408, vec![], Delivery::Retry(String::new())),
        (422, vec![], Delivery::Permanent(String::new())),
        (500, vec![], Delivery::Retry(String::new())),
    ];
    for (status, headers, expected) in cases {
        let api = FakeApi::start(answer(status, &headers)).await;
        let outcome = send(&api.url).await;
        assert_eq!(
            blank(&outcome),
            expected,
            "{status} {headers:?}: {outcome:?}"
        );
        let reason = match &outcome {
            Delivery::Throttled { reason, .. }
            | Delivery::Refused(reason)
            | Delivery::Retry(reason)
            | Delivery::Permanent(reason) => reason,
            other => panic!("{other:?}"),
        };
        assert!(reason.starts_with(&format!("HTTP {status}")), "{reason}");
    }
}

/// `Retry-After` as an HTTP date: the wait until then.
#[tokio::test]
async fn a_retry_after_date_is_the_wait_until_then() {
    use crate::provider::FakeApi;
    let at = std::time::SystemTime::now() + Duration::from_secs(600);
    let header = format!("Retry-After: {}", httpdate::fmt_http_date(at));
    let api = FakeApi::start(move |_| (429, vec![header.clone()], String::new())).await;
    let Delivery::Throttled {
        after: Some(after), ..
    } = send(&api.url).await
    else {
        panic!("not throttled with a wait")
    };
    // The date has whole seconds; the request took a moment.
    assert!(
        after > Duration::from_secs(590) && after <= Duration::from_secs(600),
        "{after:?}"
    );
}

/// The reason an HTTP mailer with API key `key` records for a 401 whose body is `body`.
async fn refusal_echoing(key: &str, body: String) -> String {
    use crate::provider::FakeApi;
    let api = FakeApi::start(move |_| (401, vec![], body.clone())).await;
    let mailer = from_url(
        &api.url,
        Some(key.to_owned().into()),
        Duration::from_secs(5),
        None,
    )
    .unwrap();
    match mailer.send(&email(), "key-1").await {
        Delivery::Refused(reason) => reason,
        outcome => panic!("{outcome:?}"),
    }
}

/// A provider that echoes our API key in its refusal does not get it into the job's error.
#[tokio::test]
async fn a_refusal_that_echoes_the_api_key_is_recorded_without_it() {
    let key = "re_live_0123456789abcdef";
    let reason = refusal_echoing(key, format!(r#"{{"message":"API key {key} is invalid"}}"#)).await;
    assert!(
        !reason.contains(key) && reason.contains("[redacted]"),
        "{reason}"
    );
}

/// Review of issue 14: the answer was cut to 200 characters before the key was blanked out, so
/// a key that straddled the cut left its first characters in the job's error and the log.
#[tokio::test]
async fn an_echoed_api_key_that_straddles_the_cut_leaves_no_piece_behind() {
    let key = "re_SuperSecretApiKey0123456789";
    let reason = refusal_echoing(key, format!("{}{key} is invalid", "x".repeat(190))).await;
    assert!(!reason.contains(&key[..6]), "{reason}");
}

/// Review of issue 14: an email provider's URL is configuration, the same for every job: a
/// wrong path (404, 405) or a redirect pauses the kind until it is fixed, instead of killing
/// every email at once (404 was permanent) or spending their budget (a redirect was a retry).
/// A URL of the job's own (`http::post_json`) keeps reading them as the job's answer.
#[tokio::test]
async fn a_wrong_mailer_url_is_a_configuration_refusal_not_the_email_s_fault() {
    use crate::provider::FakeApi;
    for (status, headers) in [
        (404, vec![]),
        (405, vec![]),
        (308, vec!["Location: /v2/emails".to_owned()]),
    ] {
        let api = FakeApi::start(move |_| (status, headers.clone(), String::new())).await;
        let outcome = send(&api.url).await;
        assert!(
            matches!(outcome, Delivery::Refused(_)),
            "{status}: {outcome:?}"
        );
        let client = oncely_outbox::http::client(Duration::from_secs(5)).unwrap();
        let job_s_own = oncely_outbox::http::post_json(
            &client,
            &api.url,
            "key-1",
            &serde_json::json!({}),
            None,
        )
        .await;
        let expected_permanent = status != 308;
        assert!(
            match &job_s_own {
                Err(Delivery::Permanent(_)) => expected_permanent,
                Err(Delivery::Retry(_)) => !expected_permanent,
                _ => false,
            },
            "{status}: {job_s_own:?}"
        );
        assert_eq!(api.requests(), 2, "no redirect followed");
    }
}

/// Issue 14, items 1 and 2, over SMTP: 421/450/451 are throttling (no Retry-After: the
/// backoff applies), 452 a plain retry; 530/534/535/538, and no authentication mechanism in
/// common, a refusal of our credentials or configuration. Before, the 4xx were all plain
/// retries and the 5xx permanent.
#[tokio::test]
async fn an_smtp_server_s_throttling_and_refusals_are_told_apart_from_failures() {
    use crate::provider::smtp_answering;
    let (retry, refused) = (
        Delivery::Retry(String::new()),
        Delivery::Refused(String::new()),
    );
    let permanent = Delivery::Permanent(String::new());
    let cases = [
        (
            "MAIL",
            "421 4.7.0 Try later, closing connection",
            throttled(None),
        ),
        (
            "MAIL",
            "450 4.2.1 Mailbox busy, greylisted",
            throttled(None),
        ),
        ("RCPT", "451 4.7.1 Rate limited", throttled(None)),
        ("RCPT", "452 4.3.1 Insufficient system storage", retry),
        ("MAIL", "530 5.7.0 Authentication required", refused.clone()),
        ("AUTH", "534 5.7.9 Mechanism too weak", refused.clone()),
        ("AUTH", "535 5.7.8 Credentials invalid", refused.clone()),
        ("AUTH", "538 5.7.11 Encryption required", refused.clone()),
        // The server offers no AUTH: lettre finds no mechanism for our credentials.
        ("EHLO", "250 fake", refused),
        ("RCPT", "550 5.1.1 No such user", permanent.clone()),
        ("DATA", "554 5.6.0 Message rejected", permanent),
    ];
    for (verb, reply, expected) in cases {
        let addr = smtp_answering(verb, reply).await;
        let outcome = send(&format!("smtp://user:secret@{addr}")).await;
        assert_eq!(blank(&outcome), expected, "{reply}: {outcome:?}");
    }
}

fn throttled(after: Option<Duration>) -> Delivery {
    Delivery::Throttled {
        reason: String::new(),
        after,
    }
}

/// `outcome` without its reason text, to compare kinds (and a throttle's wait).
fn blank(outcome: &Delivery) -> Delivery {
    match outcome {
        Delivery::Throttled { after, .. } => throttled(*after),
        Delivery::Refused(_) => Delivery::Refused(String::new()),
        Delivery::Retry(_) => Delivery::Retry(String::new()),
        Delivery::Permanent(_) => Delivery::Permanent(String::new()),
        Delivery::Unknown(_) => Delivery::Unknown(String::new()),
        other => other.clone(),
    }
}

/// Sends `email` with `key` over `url`'s transport.
async fn send_with_key(url: &str, email: &Email, key: &str) -> Delivery {
    let mailer = mailer(url, Duration::from_secs(5));
    mailer.send(email, key).await
}

/// The provider-mode inbox's 409s (HTTP) and their SMTP replies, read by each mailer.
#[tokio::test]
async fn a_key_used_with_another_payload_is_permanent_and_a_key_in_flight_a_plain_retry() {
    let (inbox, running) = Inbox::start_local(Faults::provider()).await.unwrap();
    let http = format!("http://{}/emails", running.http_addr);
    let smtp = format!("smtp://{}", running.smtp_addr);
    for (url, key) in [(&http, "http-key"), (&smtp, "smtp-key")] {
        let first = send_with_key(url, &email(), key).await;
        assert!(matches!(first, Delivery::Sent { .. }), "{first:?}");
        let moved = Email {
            to: "moved@example.com".into(),
            ..email()
        };
        let outcome = send_with_key(url, &moved, key).await;
        let Delivery::Permanent(reason) = outcome else {
            panic!("{url}: {outcome:?}")
        };
        assert!(reason.contains("invalid_idempotent_request"), "{reason}");
    }

    inbox.set_faults(Faults {
        delay_ms: 500,
        ..Faults::provider()
    });
    // Over HTTP a 409 `concurrent_idempotent_requests` is a plain retry; over SMTP the inbox
    // answers 451 4.7.0, which the mailer reads as throttling (no attempt spent).
    for (url, key, smtp) in [(&http, "http-slow", false), (&smtp, "smtp-slow", true)] {
        let same = email();
        let (a, b) = tokio::join!(
            send_with_key(url, &same, key),
            send_with_key(url, &same, key)
        );
        let outcomes = [&a, &b];
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| matches!(o, Delivery::Sent { .. }))
                .count(),
            1,
            "{url}: {outcomes:?}"
        );
        let retry = outcomes
            .iter()
            .find_map(|o| match o {
                Delivery::Retry(reason) if !smtp => Some(reason),
                Delivery::Throttled {
                    reason,
                    after: None,
                } if smtp => Some(reason),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{url}: {outcomes:?}"));
        assert!(retry.contains("concurrent_idempotent_requests"), "{retry}");
    }
    assert_eq!(inbox.messages(None).len(), 4);
}

/// Second review of issue 14: a 303 See Other after a POST means the request was processed; read
/// as a wrong URL it would pause the kind forever while every probe was delivered. It is an
/// unknown outcome (retried with the same key, which a deduplicating provider absorbs).
#[tokio::test]
async fn a_see_other_after_the_post_is_an_unknown_outcome() {
    use crate::provider::FakeApi;
    let api =
        FakeApi::start(|_| (303, vec!["Location: /emails/42".to_owned()], String::new())).await;
    let outcome = send(&api.url).await;
    assert!(matches!(outcome, Delivery::Unknown(_)), "{outcome:?}");
    let api =
        FakeApi::start(|_| (308, vec!["Location: /v2/emails".to_owned()], String::new())).await;
    let Delivery::Refused(reason) = send(&api.url).await else {
        panic!("not refused")
    };
    assert!(reason.contains("Location: /v2/emails"), "{reason}");
}

/// A server whose every answer is `status` with a body that never ends (chunked, 64 KiB at a
/// time); the count of body bytes it managed to write before the client hung up.
async fn endless_answer(status: u16) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let counted = written.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut request = [0; 16 * 1024];
                let _ = stream.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 {status} Answer\r\ncontent-type: application/json\r\n\
                     transfer-encoding: chunked\r\n\r\n"
                );
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = format!("10000\r\n{}\r\n", " ".repeat(0x10000));
                while stream.write_all(chunk.as_bytes()).await.is_ok() {
                    counted.fetch_add(0x10000, Ordering::Relaxed);
                }
            });
        }
    });
    (format!("http://{addr}"), written)
}

/// More than a bounded reader and the sockets' buffers can hold; far less than an unbounded
/// read takes from loopback in the 2 s the calls below may last.
const READ_WHOLE: u64 = 64 * 1024 * 1024;

/// Review of issue 21: an answer's body is read up to 64 KiB, never whole — a provider, a
/// delivery lookup or a tenant's webhook endpoint that answers without end costs the worker
/// 64 KiB, not its memory (a lookup answering 800 MiB took a worker to 1.6 GB).
#[tokio::test]
async fn an_endless_answer_is_read_no_further_than_64_kib() {
    use oncely_outbox::mail::{LookedUp, Mailer};
    // A provider's 200 (the job is done: the answer's JSON is only informative) and its 500
    // (retried; the error quotes the start of the text).
    for (status, expected) in [
        (
            200,
            Delivery::Sent {
                provider_message_id: None,
            },
        ),
        (500, Delivery::Retry(String::new())),
    ] {
        let (url, written) = endless_answer(status).await;
        let mailer = mailer(&format!("{url}/emails"), Duration::from_secs(2));
        let outcome = mailer.send(&email(), "key-1").await;
        assert_eq!(
            std::mem::discriminant(&outcome),
            std::mem::discriminant(&expected),
            "{status}: {outcome:?}"
        );
        let written = written.load(Ordering::Relaxed);
        assert!(written < READ_WHOLE, "{status}: read {written} bytes");
    }
    // A delivery lookup: no verdict in 64 KiB is no answer.
    let (url, written) = endless_answer(200).await;
    let smtp = mailer("smtp://127.0.0.1:9", Duration::from_secs(2));
    let lookup = LookedUp::new(
        smtp,
        &format!("{url}/deliveries/{{key}}"),
        Duration::from_secs(2),
    )
    .unwrap();
    let verdict = lookup
        .look_up("key-1", time::OffsetDateTime::now_utc())
        .await;
    assert!(
        matches!(&verdict, oncely_outbox::Reconciled::Unknown(why) if why.contains("over 64 KiB")),
        "{verdict:?}"
    );
    let written = written.load(Ordering::Relaxed);
    assert!(written < READ_WHOLE, "lookup: read {written} bytes");
}

/// Review of issue 21: an error answer whose body stalls keeps what arrived in its reason (the
/// bounded reader dropped it on the timeout).
#[tokio::test]
async fn an_error_answer_that_stalls_keeps_what_arrived_in_its_reason() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0; 16 * 1024];
                let _ = stream.read(&mut request).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 500 Oops\r\ncontent-length: 1000\r\n\r\nprovider says no")
                    .await;
                // The other 984 bytes never come.
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    let mailer = mailer(&format!("http://{addr}/emails"), Duration::from_millis(500));
    let outcome = mailer.send(&email(), "key-1").await;
    assert!(
        matches!(&outcome, Delivery::Retry(reason) if reason.contains("provider says no")),
        "{outcome:?}"
    );
}

/// An address that needs SMTPUTF8 (a local part beyond ASCII), sent to a server that does not
/// offer it: nothing is sent, and no retry would go otherwise — permanent, with the reason.
/// (It was an unknown outcome, parked for an operator to settle though nothing had left.)
#[tokio::test]
async fn an_address_the_smtp_server_cannot_take_is_permanent_not_unknown() {
    use crate::provider::smtp_answering;
    // The server's EHLO offers AUTH only: no SMTPUTF8.
    let addr = smtp_answering("NOOP", "250 ok").await;
    let mailer = mailer(&format!("smtp://{addr}"), Duration::from_secs(5));
    let to_joerg = Email {
        to: "jörg@example.com".into(),
        ..email()
    };
    let outcome = mailer.send(&to_joerg, "key-utf8").await;
    let Delivery::Permanent(reason) = &outcome else {
        panic!("{outcome:?}")
    };
    assert!(reason.contains("SMTPUTF8"), "{reason}");
}
