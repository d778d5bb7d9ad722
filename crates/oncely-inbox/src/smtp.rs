//! The SMTP intake: greeting, EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT. No TLS, no AUTH:
//! it listens on loopback for tests and development.
//!
//! Bounded: EHLO advertises the largest message it takes (`SIZE`,
//! [`crate::Retention::max_message_bytes`]); a `MAIL FROM` whose `SIZE=` is larger, and a DATA
//! section that turns out larger (read to its end, not kept), are answered `552 5.3.4`, and so
//! is a message that, as the inbox would keep it, alone takes more than its byte budget. No line
//! is held beyond its bound: a command line over [`MAX_COMMAND_LINE`] is answered `500`. A
//! message has at most [`crate::MAX_RECIPIENTS`] recipients (a `RCPT TO` beyond is answered
//! `452 4.5.3`, the session going on), and its recipients' bytes count against its size: a
//! `RCPT TO` that would take them past the limit is answered `552 5.3.4`, and the DATA section
//! may take only what they leave.

use std::time::Duration;

use mail_parser::MessageParser;
use time::OffsetDateTime;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::{Conflict, Inbox, Intake, Message, Rejection, Verdict};

/// The largest message accepted as sent (bytes), whatever the budget
/// ([`crate::MAX_MESSAGE_BYTES`]; the inbox's own limit is
/// [`crate::Retention::max_message_bytes`]).
pub const MAX_MESSAGE: usize = crate::MAX_MESSAGE_BYTES;

/// The longest command line read (bytes, with its CRLF); RFC 5321 allows 512.
pub const MAX_COMMAND_LINE: usize = 4096;

/// The answer to a message larger than the inbox takes (RFC 1870).
const TOO_LARGE: &str = "552 5.3.4 Message size exceeds fixed maximum message size\r\n";

/// The answer to a `RCPT TO` beyond [`crate::MAX_RECIPIENTS`] (RFC 5321, 4.5.3.1.10).
const TOO_MANY_RECIPIENTS: &str = "452 4.5.3 Too many recipients\r\n";

/// Accepts connections until the listener fails.
pub async fn serve(listener: TcpListener, inbox: Inbox) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let inbox = inbox.clone();
                tokio::spawn(async move {
                    if let Err(error) = session(stream, inbox).await {
                        tracing::debug!(%error, "smtp session ended");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "smtp accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn session(stream: TcpStream, inbox: Inbox) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    write.write_all(b"220 oncely-inbox ESMTP ready\r\n").await?;
    let limit = inbox.max_message_bytes();
    let mut from = String::new();
    let mut to: Vec<String> = Vec::new();
    // The bytes of `to`, counted against the message's size.
    let mut to_bytes = 0usize;
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = read_line_bounded(&mut lines, &mut line, MAX_COMMAND_LINE).await?;
        if read == 0 {
            return Ok(());
        }
        if read > line.len() {
            write.write_all(b"500 5.5.2 Line too long\r\n").await?;
            continue;
        }
        let line = String::from_utf8_lossy(&line);
        let command = line.trim_end();
        let verb = command
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "EHLO" => {
                format!("250-oncely-inbox\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE {limit}\r\n")
            }
            "HELO" => "250 oncely-inbox\r\n".into(),
            "MAIL" if declared_size(command).is_some_and(|size| size > limit) => {
                from.clear();
                to.clear();
                to_bytes = 0;
                TOO_LARGE.into()
            }
            "MAIL" => {
                from = address_of(command);
                to.clear();
                to_bytes = 0;
                "250 2.1.0 Ok\r\n".into()
            }
            "RCPT" if to.len() >= crate::MAX_RECIPIENTS => TOO_MANY_RECIPIENTS.into(),
            "RCPT" => {
                let address = address_of(command);
                if to_bytes + address.len() > limit {
                    TOO_LARGE.into()
                } else {
                    to_bytes += address.len();
                    to.push(address);
                    "250 2.1.5 Ok\r\n".into()
                }
            }
            "DATA" => {
                if to.is_empty() {
                    "503 5.5.1 RCPT first\r\n".into()
                } else {
                    write
                        .write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                        .await?;
                    let data = read_data(&mut lines, limit - to_bytes).await?;
                    let verdict = match data {
                        Some(data) => {
                            let header = inbox.idempotency_header(Intake::Smtp);
                            let message = parse(&data, &from, &to, &header);
                            drop(data);
                            inbox.attempt(message).await
                        }
                        None => {
                            inbox.count_too_large();
                            Verdict::TooLarge
                        }
                    };
                    to.clear();
                    to_bytes = 0;
                    // Kept but dropped: the sender never hears so (the unknown outcome).
                    let Some(reply) = reply(&verdict) else {
                        return Ok(());
                    };
                    reply
                }
            }
            "RSET" => {
                from.clear();
                to.clear();
                to_bytes = 0;
                "250 2.0.0 Ok\r\n".into()
            }
            "NOOP" => "250 2.0.0 Ok\r\n".into(),
            "QUIT" => {
                write.write_all(b"221 2.0.0 Bye\r\n").await?;
                return Ok(());
            }
            _ => "502 5.5.2 Command not recognized\r\n".into(),
        };
        write.write_all(reply.as_bytes()).await?;
    }
}

/// The `SIZE=` a `MAIL FROM` declares (RFC 1870), if it declares one that is a number: after
/// the `<address>`, or, unbracketed (`MAIL FROM:a@b SIZE=…`), after the address.
fn declared_size(command: &str) -> Option<usize> {
    let params = match command.find('>') {
        Some(i) => &command[i + 1..],
        None => {
            // `MAIL FROM:` and the address, possibly after a space: the parameters follow.
            let after = command
                .find(':')
                .map_or("", |i| command[i + 1..].trim_start());
            after
                .split_once(char::is_whitespace)
                .map_or("", |(_, rest)| rest)
        }
    };
    params.split_whitespace().find_map(|param| {
        let (name, value) = param.split_once('=')?;
        // A size beyond usize is larger than any limit.
        name.eq_ignore_ascii_case("SIZE")
            .then(|| value.parse::<u128>().ok())
            .flatten()
            .map(|size| usize::try_from(size).unwrap_or(usize::MAX))
    })
}

/// Reads one line (through `\n`, or to the end of the stream) and keeps at most `max` bytes of
/// it in `line`: the rest is read and dropped. Returns how many bytes the line had (0: the end
/// of the stream); more than `line` holds when it was cut.
async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(total);
        }
        let (taken, done) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        let room = max.saturating_sub(line.len());
        line.extend_from_slice(&available[..taken.min(room)]);
        reader.consume(taken);
        total += taken;
        if done {
            return Ok(total);
        }
    }
}

/// The reply to the end of DATA (`None`: drop the connection instead). A throttled attempt
/// hears 450 with the delay in its text (SMTP has no `Retry-After`); refused credentials 535
/// (at the end of DATA: the inbox has no AUTH, so this is where it can refuse); provider mode's
/// conflicts the closest codes to Resend's 409s: a key used with another message can never
/// succeed (554 5.7.0), a key in flight in another session is worth another try (451 4.7.0).
fn reply(verdict: &Verdict) -> Option<String> {
    Some(match verdict {
        Verdict::Accepted(id) => format!("250 2.0.0 Ok: queued as {id}\r\n"),
        Verdict::AcceptedThenDrop(_) => return None,
        Verdict::Rejected(Rejection::Temporary) => {
            "451 4.3.0 Temporary failure (injected)\r\n".into()
        }
        Verdict::Rejected(Rejection::Permanent) => {
            "550 5.7.1 Message rejected (injected)\r\n".into()
        }
        Verdict::Throttled(seconds) => {
            format!("450 4.7.0 Rate limit exceeded, try again in {seconds} seconds (injected)\r\n")
        }
        Verdict::Unauthorized => {
            "535 5.7.8 Authentication credentials invalid (injected)\r\n".into()
        }
        Verdict::Conflict(conflict @ Conflict::InvalidIdempotentRequest) => {
            format!("554 5.7.0 {}: {}\r\n", conflict.name(), conflict.message())
        }
        Verdict::Conflict(conflict @ Conflict::ConcurrentIdempotentRequests) => {
            format!("451 4.7.0 {}: {}\r\n", conflict.name(), conflict.message())
        }
        Verdict::TooLarge => TOO_LARGE.into(),
    })
}

/// Reads the message up to the lone `.` line, undoing dot-stuffing: `None` if it is larger
/// than `limit` (then read to its end and dropped, so that the session goes on; at most `limit`
/// bytes of it are ever held).
async fn read_data<R: AsyncBufRead + Unpin>(
    lines: &mut R,
    limit: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut data = Vec::new();
    let mut too_large = false;
    let mut line = Vec::new();
    loop {
        line.clear();
        // A line longer than the limit (plus its dot and CRLF) makes the message too large.
        let read = read_line_bounded(lines, &mut line, limit.saturating_add(3)).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if line == b".\r\n" || line == b".\n" {
            return Ok((!too_large).then_some(data));
        }
        if too_large {
            continue;
        }
        let unstuffed = if line.starts_with(b"..") {
            &line[1..]
        } else {
            &line[..]
        };
        if read > line.len() || data.len() + unstuffed.len() > limit {
            too_large = true;
            data = Vec::new();
            continue;
        }
        data.extend_from_slice(unstuffed);
    }
}

/// `MAIL FROM:<a@b>` → `a@b`; unbracketed, `MAIL FROM:a@b SIZE=1` → `a@b` (the word after
/// the colon).
fn address_of(command: &str) -> String {
    let Some(start) = command.find('<').map(|i| i + 1) else {
        return command
            .split_once(':')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("")
            .to_owned();
    };
    let end = command[start..]
        .find('>')
        .map_or(command.len(), |i| start + i);
    command[start..end].to_owned()
}

/// The message of a DATA section; its idempotency key is the value of `idempotency_header`.
fn parse(
    data: &[u8],
    envelope_from: &str,
    envelope_to: &[String],
    idempotency_header: &str,
) -> Message {
    let parsed = MessageParser::default().parse(data);
    let header = |name: &str| {
        parsed
            .as_ref()
            .and_then(|m| m.header_raw(name))
            .map(|v| v.trim().to_owned())
    };
    Message {
        id: String::new(),
        intake: Intake::Smtp,
        received_at: OffsetDateTime::now_utc(),
        from: envelope_from.to_owned(),
        to: envelope_to.to_vec(),
        subject: parsed
            .as_ref()
            .and_then(|m| m.subject())
            .unwrap_or_default()
            .to_owned(),
        text: parsed
            .as_ref()
            .and_then(|m| m.body_text(0))
            .map(|t| t.into_owned())
            .unwrap_or_default(),
        // An HTML part the message has: mail-parser would render a text-only message's text
        // as HTML, which the sender never sent.
        html: parsed
            .as_ref()
            .filter(|m| m.html_part(0).is_some_and(|part| part.is_text_html()))
            .and_then(|m| m.body_html(0))
            .map(|t| t.into_owned()),
        reply_to: parsed.as_ref().and_then(|m| m.reply_to()).map(|address| {
            address
                .iter()
                .map(|a| match (a.name(), a.address()) {
                    (Some(name), Some(address)) => format!("{name} <{address}>"),
                    (name, address) => address.or(name).unwrap_or_default().to_owned(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        }),
        message_id: parsed
            .as_ref()
            .and_then(|m| m.message_id())
            .map(str::to_owned),
        idempotency_key: header(idempotency_header),
        raw: String::from_utf8_lossy(data).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_addresses_are_unwrapped() {
        assert_eq!(address_of("MAIL FROM:<a@b.io> SIZE=10"), "a@b.io");
        assert_eq!(address_of("RCPT TO:<c@d.io>"), "c@d.io");
        // Unbracketed (review 3, F10: its SIZE= is read too): the address alone.
        assert_eq!(address_of("MAIL FROM:a@b.io SIZE=10"), "a@b.io");
        assert_eq!(address_of("RCPT TO: c@d.io"), "c@d.io");
    }

    #[test]
    fn quoted_printable_bodies_and_the_configured_idempotency_header_are_decoded() {
        let raw = b"From: a@b.io\r\nTo: c@d.io\r\nSubject: Hi\r\nMessage-ID: <k1@oncely>\r\n\
Idempotency-Key: other\r\nresend-idempotency-key: k1\r\n\
Content-Type: text/plain; charset=utf-8\r\n\
Content-Transfer-Encoding: quoted-printable\r\n\r\nhttp://x/verify?token=3Dabc=\r\ndef\r\n";
        let m = parse(
            raw,
            "a@b.io",
            &["c@d.io".into()],
            crate::SMTP_IDEMPOTENCY_HEADER,
        );
        assert_eq!(m.subject, "Hi");
        assert_eq!(m.message_id.as_deref(), Some("k1@oncely"));
        assert_eq!(
            m.idempotency_key.as_deref(),
            Some("k1"),
            "the configured header only, in any case"
        );
        assert!(
            m.text.contains("http://x/verify?token=abcdef"),
            "{}",
            m.text
        );
        let other = parse(raw, "a@b.io", &["c@d.io".into()], "X-Not-Sent");
        assert_eq!(other.idempotency_key, None, "no fallback to another header");
    }

    #[test]
    fn a_multipart_alternative_message_yields_its_text_and_its_html_decoded() {
        let long = "x".repeat(200);
        let raw = format!(
            "From: a@b.io\r\nTo: c@d.io\r\nSubject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\n\
Reply-To: =?utf-8?q?J=C3=BCrgen?= <j@b.io>\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/alternative; boundary=\"XX\"\r\n\r\n\
--XX\r\nContent-Type: text/plain; charset=utf-8\r\n\
Content-Transfer-Encoding: quoted-printable\r\n\r\n\
Gr=C3=BC=C3=9Fe, {q}=\r\n{q}\r\n\
--XX\r\nContent-Type: text/html; charset=utf-8\r\n\
Content-Transfer-Encoding: base64\r\n\r\n{b64}\r\n--XX--\r\n",
            q = &long[..70],
            b64 = "PHA+R3LDvMOfZTwvcD48c2NyaXB0PmFsZXJ0KDEpPC9zY3JpcHQ+",
        );
        let m = parse(raw.as_bytes(), "a@b.io", &["c@d.io".into()], "X-Key");
        assert_eq!(m.subject, "Grüße");
        assert_eq!(
            m.text.trim_end(),
            format!("Grüße, {}{}", &long[..70], &long[..70])
        );
        assert_eq!(
            m.html.as_deref(),
            Some("<p>Grüße</p><script>alert(1)</script>"),
            "the HTML part as sent (the page escapes or sandboxes it)"
        );
        assert_eq!(m.reply_to.as_deref(), Some("Jürgen <j@b.io>"));
    }

    #[test]
    fn a_text_only_message_has_no_html_even_inside_a_multipart() {
        let raw = b"From: a@b.io\r\nTo: c@d.io\r\nSubject: s\r\n\
Content-Type: multipart/mixed; boundary=\"XX\"\r\n\r\n\
--XX\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nhello <b>\r\n\
--XX\r\nContent-Type: application/octet-stream\r\n\r\nbin\r\n--XX--\r\n";
        let m = parse(raw, "a@b.io", &["c@d.io".into()], "X-Key");
        assert_eq!(m.text.trim_end(), "hello <b>");
        assert_eq!(m.html, None);
        assert_eq!(m.reply_to, None);
    }

    /// An SMTP session on an inbox keeping at most `max_bytes`: the inbox and a function that
    /// sends `what` and reads one reply (all its lines).
    async fn session_with(max_bytes: usize) -> (Inbox, tokio::net::TcpStream) {
        let inbox = Inbox::with_config(crate::Config {
            retention: crate::Retention {
                max_bytes,
                ..crate::Retention::default()
            },
            ..crate::Config::default()
        });
        let (inbox, running) = inbox
            .start_local_with(crate::Faults::default())
            .await
            .unwrap();
        let mut stream = tokio::net::TcpStream::connect(running.smtp_addr)
            .await
            .unwrap();
        assert!(said(&mut stream, b"").await.starts_with("220"));
        (inbox, stream)
    }

    /// Sends `what`, then reads one reply (up to a line whose code is followed by a space).
    /// Sends `what` and asserts that the reply starts with `code`.
    async fn answered(stream: &mut tokio::net::TcpStream, what: &[u8], code: &str) {
        let reply = said(stream, what).await;
        assert!(reply.starts_with(code), "{reply}");
    }

    async fn said(stream: &mut tokio::net::TcpStream, what: &[u8]) -> String {
        use tokio::io::AsyncReadExt;
        stream.write_all(what).await.unwrap();
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte))
                .await
                .expect("a reply within 10 s")
                .unwrap();
            assert_eq!(n, 1, "the connection closed after {reply:?}");
            reply.push(byte[0]);
            let text = String::from_utf8_lossy(&reply);
            if let Some(last) = text
                .strip_suffix("\r\n")
                .and_then(|t| t.rsplit("\r\n").next())
                && last.as_bytes().get(3) == Some(&b' ')
            {
                return text.into_owned();
            }
        }
    }

    /// Issue 36, item 4: a message larger than the inbox takes is answered 552 — declared too
    /// large in `MAIL FROM … SIZE=`, or found so in DATA (read to its end, never held whole, in
    /// lines or in one line) — and the session goes on; a message within the limit is kept.
    #[tokio::test]
    async fn a_message_over_the_limit_is_refused_with_552_and_the_session_goes_on() {
        // A budget of 400 KiB: messages of at most 100 KiB as sent.
        let (inbox, mut smtp) = session_with(400 * 1024).await;
        let ehlo = said(&mut smtp, b"EHLO t\r\n").await;
        assert!(ehlo.contains("250 SIZE 102400\r\n"), "{ehlo}");
        let declared = said(&mut smtp, b"MAIL FROM:<a@x.io> SIZE=102401\r\n").await;
        assert!(declared.starts_with("552 5.3.4"), "{declared}");
        let big_in_lines = format!("Subject: big\r\n\r\n{}", "y".repeat(998) + "\r\n")
            .repeat(110)
            .into_bytes();
        let one_long_line = [
            b"Subject: long\r\n\r\n".as_slice(),
            &[b'z'; 1024 * 1024],
            b"\r\n",
        ]
        .concat();
        for body in [big_in_lines, one_long_line] {
            answered(&mut smtp, b"MAIL FROM:<a@x.io> SIZE=1000\r\n", "250").await;
            answered(&mut smtp, b"RCPT TO:<b@x.io>\r\n", "250").await;
            answered(&mut smtp, b"DATA\r\n", "354").await;
            let reply = said(&mut smtp, &[body.as_slice(), b".\r\n"].concat()).await;
            assert!(reply.starts_with("552 5.3.4"), "{reply}");
        }
        let long_command = [b"NOOP ".as_slice(), &[b'n'; 5000], b"\r\n"].concat();
        answered(&mut smtp, &long_command, "500").await;
        answered(&mut smtp, b"MAIL FROM:<a@x.io>\r\n", "250").await;
        answered(&mut smtp, b"RCPT TO:<b@x.io>\r\n", "250").await;
        answered(&mut smtp, b"DATA\r\n", "354").await;
        let small = format!("Subject: small\r\n\r\n{}\r\n.\r\n", "s".repeat(50_000));
        let kept = said(&mut smtp, small.as_bytes()).await;
        assert!(kept.starts_with("250"), "{kept}");
        let messages = inbox.messages(None);
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].subject, "small");
        assert_eq!(inbox.stats().too_large, 2);
    }

    /// Review 3, F2: a message takes at most [`crate::MAX_RECIPIENTS`] recipients (300,000
    /// `RCPT TO` of 4 KB reached 1.16 GB): one more is answered `452 4.5.3`, and the session
    /// goes on with those taken.
    #[tokio::test]
    async fn a_recipient_beyond_the_limit_is_answered_452_and_the_session_goes_on() {
        let (inbox, mut smtp) = session_with(crate::DEFAULT_MAX_BYTES).await;
        answered(&mut smtp, b"EHLO t\r\n", "250").await;
        answered(&mut smtp, b"MAIL FROM:<a@x.io>\r\n", "250").await;
        let rcpts: String = (0..crate::MAX_RECIPIENTS)
            .map(|n| format!("RCPT TO:<r{n}@x.io>\r\n"))
            .collect();
        // Pipelined: one reply each, all 250.
        use tokio::io::AsyncReadExt;
        smtp.write_all(rcpts.as_bytes()).await.unwrap();
        let expected = (0..crate::MAX_RECIPIENTS)
            .map(|_| "250 2.1.5 Ok\r\n")
            .collect::<String>();
        let mut replies = vec![0u8; expected.len()];
        smtp.read_exact(&mut replies).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&replies), expected);
        for _ in 0..3 {
            let more = said(&mut smtp, b"RCPT TO:<more@x.io>\r\n").await;
            assert_eq!(more, "452 4.5.3 Too many recipients\r\n");
        }
        answered(&mut smtp, b"DATA\r\n", "354").await;
        let kept = said(&mut smtp, b"Subject: many\r\n\r\nhi\r\n.\r\n").await;
        assert!(kept.starts_with("250"), "{kept}");
        let messages = inbox.messages(None);
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].to.len(), crate::MAX_RECIPIENTS);
        assert!(!messages[0].to.contains(&"more@x.io".to_owned()));
        // The next transaction starts afresh.
        answered(&mut smtp, b"MAIL FROM:<a@x.io>\r\n", "250").await;
        answered(&mut smtp, b"RCPT TO:<b@x.io>\r\n", "250").await;
    }

    /// Review 3, F2: the recipients' bytes count against the message's size — a `RCPT TO` that
    /// takes them past the limit is `552 5.3.4`, and a DATA section that fits the limit alone
    /// but not with them is too.
    #[tokio::test]
    async fn the_recipients_bytes_count_against_the_message_size() {
        // A budget of 400 KiB: messages of at most 100 KiB (102,400 bytes) as sent.
        let (inbox, mut smtp) = session_with(400 * 1024).await;
        answered(&mut smtp, b"EHLO t\r\n", "250").await;
        answered(&mut smtp, b"MAIL FROM:<a@x.io>\r\n", "250").await;
        // 25 recipients of 4,000 bytes: 100,000.
        let long = |n: usize| format!("RCPT TO:<{n:02}{}@x.io>\r\n", "l".repeat(3993));
        for n in 0..25 {
            let reply = said(&mut smtp, long(n).as_bytes()).await;
            assert!(reply.starts_with("250"), "{n}: {reply}");
        }
        let past = said(&mut smtp, long(25).as_bytes()).await;
        assert!(past.starts_with("552 5.3.4"), "{past}");
        answered(&mut smtp, b"DATA\r\n", "354").await;
        let body = format!("Subject: s\r\n\r\n{}\r\n.\r\n", "b".repeat(10_000));
        let reply = said(&mut smtp, body.as_bytes()).await;
        assert!(reply.starts_with("552 5.3.4"), "{reply}");
        assert!(inbox.messages(None).is_empty());
    }

    /// Review 3, F10: `SIZE=` is read whether the address is bracketed or not.
    #[test]
    fn the_declared_size_is_read_with_or_without_brackets() {
        for command in [
            "MAIL FROM:<a@x.io> SIZE=99999999",
            "MAIL FROM:a@x.io SIZE=99999999",
            "MAIL FROM: a@x.io SIZE=99999999",
            "MAIL FROM:a@x.io BODY=8BITMIME SIZE=99999999",
        ] {
            assert_eq!(declared_size(command), Some(99_999_999), "{command}");
        }
        assert_eq!(declared_size("MAIL FROM:size=5@x.io"), None);
        assert_eq!(declared_size("MAIL FROM:a@x.io"), None);
    }

    #[test]
    fn every_verdict_has_its_reply_code() {
        let code = |verdict: Verdict| reply(&verdict).map(|r| r[..3].to_owned());
        assert_eq!(code(Verdict::Accepted("i".into())).as_deref(), Some("250"));
        assert_eq!(code(Verdict::AcceptedThenDrop("i".into())), None);
        assert_eq!(code(Verdict::Throttled(7)).as_deref(), Some("450"));
        assert!(reply(&Verdict::Throttled(7)).unwrap().contains("7 seconds"));
        assert_eq!(code(Verdict::Unauthorized).as_deref(), Some("535"));
        let conflict = |c| code(Verdict::Conflict(c));
        assert_eq!(
            conflict(Conflict::InvalidIdempotentRequest).as_deref(),
            Some("554")
        );
        assert_eq!(
            conflict(Conflict::ConcurrentIdempotentRequests).as_deref(),
            Some("451")
        );
    }
}
