//! Issue 18: an email with an HTML part and a Reply-To, over both transports into the test
//! inbox: both parts arrive as sent, the Reply-To with them; an email without them is sent as
//! before (one text/plain part over SMTP, no `html` key over HTTP).

use std::time::Duration;

use oncely_inbox::{Faults, Inbox, Message, Running};
use oncely_outbox::Delivery;
use oncely_outbox::mail::{Email, Mailer, from_url};

fn mailer(url: String) -> std::sync::Arc<dyn Mailer> {
    from_url(&url, None, Duration::from_secs(5), None).unwrap()
}

fn smtp(running: &Running) -> std::sync::Arc<dyn Mailer> {
    mailer(format!("smtp://{}", running.smtp_addr))
}

fn http(running: &Running) -> std::sync::Arc<dyn Mailer> {
    mailer(format!("http://{}/emails", running.http_addr))
}

/// Text and HTML that encodings get wrong: non-ASCII, lines longer than SMTP allows (998), a
/// lone dot line (SMTP's end of data), `=` (quoted-printable's escape), a MIME boundary look-alike.
fn email(to: &str) -> Email {
    let long = "Grüße ".repeat(300);
    Email {
        from: "app@example.com".into(),
        to: to.into(),
        subject: "Grüße aus Köln".into(),
        text: format!("Hallo Jürgen,\n\n{long}\n.\nsoft=break =3D\n--boundary\nEnde"),
        html: Some(format!(
            "<!doctype html><p style=\"color:#c00\">Hallo Jürgen,</p>\n<p>{long}</p>\n.\n\
             <a href=\"http://x.io/v?a=1&amp;b=2\">=3D</a>\n--boundary\n<p>Ende – ✓</p>"
        )),
        reply_to: Some("Support Team <support@example.com>".into()),
    }
}

async fn send(mailer: &dyn Mailer, email: &Email, key: &str) {
    match mailer.send(email, key).await {
        Delivery::Sent { .. } => {}
        other => panic!("not sent: {other:?}"),
    }
}

async fn received(inbox: &Inbox, to: &str) -> Message {
    let mut messages = inbox.wait_for(to, 1, Duration::from_secs(10)).await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    messages.remove(0)
}

/// Line endings as the transport leaves them (SMTP sends CRLF), for comparing bodies.
fn lf(text: &str) -> String {
    text.replace("\r\n", "\n")
}

#[tokio::test]
async fn an_html_email_with_a_reply_to_arrives_with_both_parts_over_smtp() {
    let (inbox, running) = Inbox::start_local(Faults::default()).await.unwrap();
    let sent = email("html-smtp@example.com");
    send(&*smtp(&running), &sent, "k-html-smtp").await;
    let m = received(&inbox, "html-smtp@example.com").await;
    assert_eq!(m.subject, sent.subject);
    assert_eq!(lf(&m.text).trim_end(), sent.text);
    assert_eq!(
        lf(m.html.as_deref().unwrap()).trim_end(),
        sent.html.unwrap()
    );
    assert_eq!(
        m.reply_to.as_deref(),
        Some("Support Team <support@example.com>")
    );
    assert_eq!(m.message_id.as_deref(), Some("k-html-smtp@oncely"));
    assert_eq!(m.idempotency_key.as_deref(), Some("k-html-smtp"));
    let head = &m.raw[..m.raw.find("\r\n\r\n").unwrap()];
    assert!(
        head.contains("Content-Type: multipart/alternative;"),
        "{head}"
    );
    let text = m
        .raw
        .find("Content-Type: text/plain; charset=utf-8")
        .unwrap();
    let html = m
        .raw
        .find("Content-Type: text/html; charset=utf-8")
        .unwrap();
    assert!(text < html, "the text part first, then the HTML");
    assert!(
        m.raw.lines().all(|line| line.len() <= 998),
        "no line over SMTP's limit"
    );
}

#[tokio::test]
async fn an_html_email_with_a_reply_to_arrives_with_both_parts_over_http() {
    let (inbox, running) = Inbox::start_local(Faults::default()).await.unwrap();
    let sent = email("html-http@example.com");
    send(&*http(&running), &sent, "k-html-http").await;
    let m = received(&inbox, "html-http@example.com").await;
    assert_eq!(m.subject, sent.subject);
    assert_eq!(m.text, sent.text);
    assert_eq!(m.html, sent.html);
    assert_eq!(m.reply_to, sent.reply_to);
    assert_eq!(m.idempotency_key.as_deref(), Some("k-html-http"));
}

#[tokio::test]
async fn an_email_without_html_is_sent_as_before_over_both_transports() {
    let (inbox, running) = Inbox::start_local(Faults::default()).await.unwrap();
    let plain = Email {
        html: None,
        reply_to: None,
        ..email("plain@example.com")
    };
    send(&*smtp(&running), &plain, "k-plain-smtp").await;
    send(&*http(&running), &plain, "k-plain-http").await;
    let messages = inbox
        .wait_for("plain@example.com", 2, Duration::from_secs(10))
        .await;
    let over = |intake| {
        messages
            .iter()
            .find(|m| m.intake == intake)
            .expect("a copy over each")
    };
    let smtp = over(oncely_inbox::Intake::Smtp);
    let head = &smtp.raw[..smtp.raw.find("\r\n\r\n").unwrap()];
    assert!(
        head.contains("Content-Type: text/plain; charset=utf-8"),
        "{head}"
    );
    assert!(!smtp.raw.contains("multipart") && !smtp.raw.contains("text/html"));
    assert!(!head.contains("Reply-To"), "{head}");
    assert_eq!(
        (smtp.html.as_deref(), smtp.reply_to.as_deref()),
        (None, None)
    );
    assert_eq!(lf(&smtp.text).trim_end(), plain.text);

    // The HTTP body as the inbox read it: no `html`, no `reply_to` key (a provider compares
    // the payload of a key: it must be what it always was).
    let http = over(oncely_inbox::Intake::Http);
    let body: serde_json::Value =
        serde_json::from_str(&http.raw[http.raw.find("\n\n").unwrap() + 2..]).unwrap();
    let mut keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["from", "headers", "subject", "text", "to"], "{body}");
    assert_eq!(
        (http.html.as_deref(), http.reply_to.as_deref()),
        (None, None)
    );
}

#[tokio::test]
async fn a_reply_to_that_is_not_an_address_is_a_permanent_failure_over_smtp() {
    let (inbox, running) = Inbox::start_local(Faults::default()).await.unwrap();
    for bad in [
        "support",
        "a@example.com\r\nBcc: victim@example.com",
        "a@example.com, b@example.com",
    ] {
        let email = Email {
            reply_to: Some(bad.into()),
            ..email("bad-reply@example.com")
        };
        match smtp(&running).send(&email, "k-bad").await {
            Delivery::Permanent(reason) => assert!(reason.contains("reply_to"), "{reason}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(inbox.messages(None).is_empty(), "nothing was sent");
}
