//! The inbox as pages for a person: a list of messages, and one message with its links
//! clickable. Everything received is escaped; only `http(s)://` words become links.

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use crate::Inbox;

/// Escapes text for HTML.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes text and turns each `http://…` or `https://…` word into a link.
pub fn linkify(text: &str) -> String {
    text.split_inclusive(char::is_whitespace)
        .map(|piece| {
            let word = piece.trim_end();
            let space = &piece[word.len()..];
            if word.starts_with("http://") || word.starts_with("https://") {
                let url = escape(word);
                format!("<a href=\"{url}\">{url}</a>{space}")
            } else {
                escape(piece)
            }
        })
        .collect()
}

const STYLE: &str = "<style>body{font:15px system-ui,sans-serif;max-width:56rem;margin:2rem auto;padding:0 1rem}\
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.3rem .6rem;border-bottom:1px solid #ddd}\
pre{white-space:pre-wrap;background:#f6f6f6;padding:1rem}</style>";

/// `GET /`: every message, newest first.
pub async fn list(State(inbox): State<Inbox>, OriginalUri(uri): OriginalUri) -> Html<String> {
    // Links work wherever the inbox is mounted (`/`, `/_dev/inbox`, …).
    let base = uri.path().trim_end_matches('/').to_owned();
    let mut rows = String::new();
    for m in inbox.messages(None).iter().rev() {
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td><a href=\"{base}/view/{}\">{}</a></td><td>{}</td></tr>",
            m.received_at.time(),
            escape(&m.to.join(", ")),
            escape(&m.id),
            escape(&m.subject),
            match m.intake {
                crate::Intake::Smtp => "SMTP",
                crate::Intake::Http => "HTTP",
            }
        ));
    }
    let stats = inbox.stats();
    let retention = inbox.config().retention;
    Html(format!(
        "<!doctype html><meta charset=\"utf-8\"><title>Dev inbox</title>{STYLE}<h1>Dev inbox</h1>\
         <p>{} messages kept of {} delivered ({} duplicates), {} deduplicated, {} rejected by faults. \
         The newest {} messages of the last {} are kept.</p>\
         <table><tr><th>received</th><th>to</th><th>subject</th><th>via</th></tr>{rows}</table>",
        stats.kept,
        stats.delivered,
        stats.duplicates,
        stats.deduplicated,
        stats.rejected + stats.throttled + stats.unauthorized,
        retention.max_messages,
        humanize(retention.max_age),
    ))
}

/// A retention as a person reads it: `24 h`, `90 min`, `45 s`.
fn humanize(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 && s.is_multiple_of(3600) {
        format!("{} h", s / 3600)
    } else if s >= 60 && s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

/// `GET /view/{id}`: one message, links clickable.
pub async fn view(
    State(inbox): State<Inbox>,
    Path(id): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Response {
    let path = uri.path();
    let back = path.find("/view/").map_or("/", |i| &path[..i]);
    let back = if back.is_empty() { "/" } else { back };
    let Some(m) = inbox.message(&id) else {
        return (
            StatusCode::NOT_FOUND,
            Html("<p>No such message.</p>".to_owned()),
        )
            .into_response();
    };
    Html(format!(
        "<!doctype html><meta charset=\"utf-8\"><title>{subject}</title>{STYLE}<p><a href=\"{back}\">← inbox</a></p>\
         <h1>{subject}</h1><p>From {from} to {to}</p><pre>{body}</pre>",
        subject = escape(&m.subject),
        from = escape(&m.from),
        to = escape(&m.to.join(", ")),
        body = linkify(&m.text),
        back = escape(back),
    ))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_become_anchors_and_everything_else_is_escaped() {
        let html = linkify("Open\nhttp://x.io/v1/verify?token=a_b-c&d=1 now <script>");
        assert!(
            html.contains(r#"<a href="http://x.io/v1/verify?token=a_b-c&amp;d=1">"#),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"));
        assert!(!html.contains("<script>"));
    }
}
