//! The SMTP intake: greeting, EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT. No TLS, no AUTH:
//! it listens on loopback for tests and development.

use std::time::Duration;

use mail_parser::MessageParser;
use time::OffsetDateTime;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::{Conflict, Inbox, Intake, Message, Rejection, Verdict};

/// The largest message accepted (bytes).
pub const MAX_MESSAGE: usize = 10 * 1024 * 1024;

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
    let mut from = String::new();
    let mut to: Vec<String> = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let command = line.trim_end();
        let verb = command
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        let reply: &[u8] = match verb.as_str() {
            "EHLO" => b"250-oncely-inbox\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE 10485760\r\n",
            "HELO" => b"250 oncely-inbox\r\n",
            "MAIL" => {
                from = address_of(command);
                to.clear();
                b"250 2.1.0 Ok\r\n"
            }
            "RCPT" => {
                to.push(address_of(command));
                b"250 2.1.5 Ok\r\n"
            }
            "DATA" => {
                if to.is_empty() {
                    b"503 5.5.1 RCPT first\r\n"
                } else {
                    write
                        .write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                        .await?;
                    let data = read_data(&mut lines).await?;
                    let header = inbox.idempotency_header(Intake::Smtp);
                    let verdict = inbox.attempt(parse(&data, &from, &to, &header)).await;
                    to.clear();
                    // Kept but dropped: the sender never hears so (the unknown outcome).
                    let Some(reply) = reply(&verdict) else {
                        return Ok(());
                    };
                    write.write_all(reply.as_bytes()).await?;
                    continue;
                }
            }
            "RSET" => {
                from.clear();
                to.clear();
                b"250 2.0.0 Ok\r\n"
            }
            "NOOP" => b"250 2.0.0 Ok\r\n",
            "QUIT" => {
                write.write_all(b"221 2.0.0 Bye\r\n").await?;
                return Ok(());
            }
            _ => b"502 5.5.2 Command not recognized\r\n",
        };
        write.write_all(reply).await?;
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
    })
}

/// Reads the message up to the lone `.` line, undoing dot-stuffing.
async fn read_data<R: AsyncBufReadExt + Unpin>(lines: &mut R) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if lines.read_until(b'\n', &mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if line == b".\r\n" || line == b".\n" {
            return Ok(data);
        }
        let unstuffed = if line.starts_with(b"..") {
            &line[1..]
        } else {
            &line[..]
        };
        if data.len() + unstuffed.len() > MAX_MESSAGE {
            return Err(std::io::Error::other("message too large"));
        }
        data.extend_from_slice(unstuffed);
    }
}

/// `MAIL FROM:<a@b>` → `a@b`.
fn address_of(command: &str) -> String {
    let start = command.find('<').map_or(0, |i| i + 1);
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
