//! What a failed send means: nothing sent (a plain retry) or perhaps sent (unknown). Issue 14,
//! item 5: a refused connection or a failed TLS handshake sent nothing; an HTTP mailer never
//! follows a redirect (a POST would become a GET elsewhere). Item 3: a provider that refuses a
//! key used with another payload can never accept it (permanent); one whose first request with
//! the key still runs is worth a retry.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use oncely_inbox::{Faults, Inbox};
use oncely_outbox::Delivery;
use oncely_outbox::mail::{Email, from_url};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn email() -> Email {
    Email {
        from: "from@example.com".into(),
        to: "to@example.com".into(),
        subject: "Hi".into(),
        text: "hello".into(),
    }
}

async fn send(url: &str) -> Delivery {
    let mailer = from_url(url, None, Duration::from_secs(5), None).unwrap();
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
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                // One request per connection; its head and small body arrive in one read or two.
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let answer = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{addr}/elsewhere\r\n\
                     Content-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    let outcome = send(&format!("http://{addr}/emails")).await;
    assert!(matches!(outcome, Delivery::Retry(_)), "{outcome:?}");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "the redirect was not followed"
    );
}

/// Sends `email` with `key` over `url`'s transport.
async fn send_with_key(url: &str, email: &Email, key: &str) -> Delivery {
    let mailer = from_url(url, None, Duration::from_secs(5), None).unwrap();
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
    for (url, key) in [(&http, "http-slow"), (&smtp, "smtp-slow")] {
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
                Delivery::Retry(reason) => Some(reason),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{url}: {outcomes:?}"));
        assert!(retry.contains("concurrent_idempotent_requests"), "{retry}");
    }
    assert_eq!(inbox.messages(None).len(), 4);
}
