//! The inbox as pages for a person, a developer who keeps it open (compare Mailpit): the
//! messages newest first with readable times (date, time and zone: the page shows them in the
//! browser's time zone), refreshed live, searchable by address or subject, deletable one by one
//! or all at once; one message with its headers (Message-ID, the idempotency key), its HTML part
//! drawn in a sandboxed frame ([`html`]), its links clickable and its raw source; the duplicate counter; the faults, switchable from the page;
//! and — given a feed ([`Options::suppressed_feed`]) — the emails the sender chose not to send.
//!
//! Everything received is escaped where the page is made (here, in Rust); the script
//! (`page/inbox.js`) only moves server-made HTML around and writes the feed's fields as text.
//! Pages are sent with a Content-Security-Policy that allows no inline script and no other
//! origin; the page's actions are `fetch` calls with `DELETE`, `PUT` or a JSON body, which a
//! form on another site cannot send, and the router refuses a browser's cross-origin request
//! that would change something (see the router in `http.rs`).

use std::sync::Arc;

use axum::Extension;
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::{Faults, Inbox, Intake, Message, Problem, Verification};

/// What the pages show beyond the inbox itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// A same-origin URL that answers a JSON array of the emails the sender chose not to send
    /// (a decoy for an address without an account, an email over a rate limit), newest first:
    /// `[{"to": "a@x.io" | null, "kind": "…", "reason": "…", "at": "<RFC 3339>"}]`. The list page
    /// then shows them as "Suppressed", so that a developer sees why an email never came.
    pub suppressed_feed: Option<String>,
}

/// The most messages the list page shows (the newest that match).
pub const LIST_LIMIT: usize = 500;

/// The page's script.
pub const SCRIPT: &str = include_str!("page/inbox.js");

/// The page's style sheet.
pub const STYLE: &str = include_str!("page/inbox.css");

/// What the pages allow: their own script, style sheet and requests, nothing inline, nothing
/// from another origin, no framing of them; they may frame their own origin only (a message's
/// HTML part, [`html`], which sandboxes itself).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; frame-src 'self'; form-action 'self'; \
     base-uri 'none'; frame-ancestors 'none'";

/// What a message's HTML part may do when shown ([`html`]): nothing but be drawn. A sandbox
/// (an opaque origin, no script, no forms, no popups, no navigation of the page around it), no
/// request of its own (only inline styles, `data:` images and fonts: a remote image would tell
/// its sender the message was opened, and from where), and framed only by the inbox's pages.
pub const HTML_PART_POLICY: &str = "sandbox; default-src 'none'; style-src 'unsafe-inline'; \
     img-src data:; font-src data:; form-action 'none'; base-uri 'none'; frame-ancestors 'self'";

/// Escapes text for HTML (text and attribute values).
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
                format!("<a href=\"{url}\" rel=\"noreferrer\">{url}</a>{space}")
            } else {
                escape(piece)
            }
        })
        .collect()
}

/// A page: HTML with the headers every page of the inbox carries.
fn page(status: StatusCode, html: String) -> Response {
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `GET /assets/inbox.js`.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /assets/inbox.css`.
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The head of every page: title, style sheet, script; `body` carries where the inbox is
/// mounted (`data-base`) and the other data the script reads.
fn head(title: &str, base: &str, body_data: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title><link rel=\"stylesheet\" href=\"{base}/assets/inbox.css\">\
         <script src=\"{base}/assets/inbox.js\" defer></script></head>\
         <body data-base=\"{base}\"{body_data}>",
        title = escape(title),
        base = escape(base),
    )
}

/// A moment as the page first shows it (UTC; the script shows it in the browser's zone), in a
/// `<time>` the script finds.
fn time(at: OffsetDateTime) -> String {
    let utc = at.to_offset(time::UtcOffset::UTC);
    let shown = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        utc.year(),
        u8::from(utc.month()),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second()
    );
    let machine = utc.format(&Rfc3339).unwrap_or_default();
    format!("<time datetime=\"{machine}\">{shown}</time>")
}

fn intake(intake: Intake) -> &'static str {
    match intake {
        Intake::Smtp => "SMTP",
        Intake::Http => "HTTP",
    }
}

/// `?q=`: the search.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    /// Part of an address or a subject.
    #[serde(default)]
    q: String,
}

/// `GET /`: the messages (newest first; those that match `?q=`), the counters, the faults,
/// and the suppressed emails when there is a feed.
pub async fn list(
    State(inbox): State<Inbox>,
    Extension(options): Extension<Arc<Options>>,
    OriginalUri(uri): OriginalUri,
    Query(query): Query<ListQuery>,
) -> Response {
    // Links and actions work wherever the inbox is mounted (`/`, `/_dev/inbox`, …).
    let base = uri.path().trim_end_matches('/').to_owned();
    let found = inbox.search(&query.q, LIST_LIMIT);
    let mut rows = String::new();
    for (m, copies) in &found.messages {
        let duplicate = if *copies > 1 {
            format!(
                " <span class=\"badge\" title=\"{copies} copies with this idempotency key (or \
                 Message-ID): the sender delivered it {copies} times\">×{copies}</span>"
            )
        } else {
            String::new()
        };
        let subject = if m.subject.is_empty() {
            "(no subject)".to_owned()
        } else {
            escape(&m.subject)
        };
        rows.push_str(&format!(
            "<tr data-id=\"{id}\"><td class=\"when\">{when}</td><td>{from}</td><td>{to}</td>\
             <td><a href=\"{base}/view/{id}\">{subject}</a>{duplicate}</td><td>{via}</td>\
             <td><button type=\"button\" class=\"quiet\" data-delete=\"{id}\" \
             title=\"Delete this message\">Delete</button></td></tr>",
            id = escape(&m.id),
            when = time(m.received_at),
            from = escape(&m.from),
            to = escape(&m.to.join(", ")),
            base = escape(&base),
            via = intake(m.intake),
        ));
    }
    let shown = found.messages.len();
    let note = match (found.matching, query.q.trim().is_empty()) {
        (0, true) => {
            "<p class=\"empty\">No messages yet. They appear here as they arrive.</p>".to_owned()
        }
        (0, false) => format!(
            "<p class=\"empty\">No message to, from or about “{}”.</p>",
            escape(query.q.trim())
        ),
        (matching, _) if matching > shown => {
            format!("<p class=\"note\">The newest {shown} of {matching} matching messages.</p>")
        }
        _ => String::new(),
    };
    let stats = inbox.stats();
    let retention = inbox.config().retention;
    let faults = inbox.faults();
    let feed = options
        .suppressed_feed
        .as_deref()
        .map_or(String::new(), |feed| {
            format!(" data-feed=\"{}\"", escape(feed))
        });
    let suppressed = if options.suppressed_feed.is_some() {
        "<section id=\"suppressed\"><h2>Suppressed <span class=\"count\"></span></h2>\
         <p class=\"note\">Emails the service chose not to send: to an address without an \
         account (a decoy, so that nobody can tell which addresses have one), over an email \
         cap, or whose link was used or replaced first.</p>\
         <table><thead><tr><th>when</th><th>to</th><th>kind</th><th>why</th></tr></thead>\
         <tbody></tbody></table><p class=\"empty\" hidden>None.</p></section>"
    } else {
        ""
    };
    let html = format!(
        "{head}<header><h1>Dev inbox</h1>\
         <form id=\"search\" role=\"search\" method=\"get\" action=\"{action}\">\
         <input type=\"search\" name=\"q\" value=\"{q}\" \
         placeholder=\"Search by address, subject or webhook\" \
         aria-label=\"Search by address, subject or webhook\" autocomplete=\"off\"></form>\
         <label class=\"live\" title=\"Refresh the list every 2 seconds\">\
         <input type=\"checkbox\" id=\"live\" checked> Live</label>\
         <button type=\"button\" id=\"delete-all\" class=\"danger\">Delete all</button></header>\
         <main><p id=\"stats\">{kept} messages kept of {delivered} delivered \
         (<span class=\"duplicates\">{duplicates} duplicates</span>), {deduplicated} deduplicated, \
         {refused} rejected by faults. The newest {max} messages of the last {age} are kept.</p>\
         {faults}\
         <section id=\"messages\"><table><thead><tr><th>received</th><th>from</th><th>to</th>\
         <th>subject</th><th>via</th><th></th></tr></thead><tbody>{rows}</tbody></table>{note}\
         </section>{webhooks}{suppressed}</main></body></html>",
        head = head("Dev inbox", &base, &feed),
        action = escape(if base.is_empty() { "/" } else { &base }),
        q = escape(&query.q),
        kept = stats.kept,
        delivered = stats.delivered,
        duplicates = stats.duplicates,
        deduplicated = stats.deduplicated,
        refused = stats.rejected + stats.throttled + stats.unauthorized,
        max = retention.max_messages,
        age = humanize(retention.max_age),
        faults = faults_panel(&faults),
        webhooks = webhooks_section(&inbox, &query.q, stats.webhooks),
    );
    page(StatusCode::OK, html)
}

/// The webhooks received (those that match the search by endpoint, type or `webhook-id`),
/// newest first: endpoint, type, `webhook-id`, verdict, copies, time, and the body as text.
fn webhooks_section(inbox: &Inbox, q: &str, stats: crate::WebhookStats) -> String {
    let (found, matching) = inbox.search_webhooks(q, LIST_LIMIT);
    let mut rows = String::new();
    for (w, copies) in &found {
        let or_none = |v: &Option<String>| {
            v.as_deref()
                .map_or("<span class=\"none\">none</span>".to_owned(), |v| {
                    format!("<code>{}</code>", escape(v))
                })
        };
        let verdict = match (w.verdict, w.problem) {
            (Verification::Verified, _) => "<span class=\"ok\">verified</span>".to_owned(),
            (Verification::Unverified, _) => {
                "<span class=\"unverified\" title=\"No secret known for this endpoint\">\
                 unverified</span>"
                    .to_owned()
            }
            (Verification::Invalid, problem) => format!(
                "<span class=\"invalid\" title=\"{detail}\">invalid: {code}</span>",
                detail = escape(problem.map_or("", Problem::detail)),
                code = problem.map_or("", Problem::code),
            ),
        };
        let duplicate = if *copies > 1 {
            format!(
                " <span class=\"badge\" title=\"{copies} accepted copies with this webhook-id: \
                 the sender delivered it {copies} times\">×{copies}</span>"
            )
        } else {
            String::new()
        };
        rows.push_str(&format!(
            "<tr data-webhook=\"{id}\"><td class=\"when\">{when}</td><td>{name}</td>\
             <td>{event_type}</td><td>{webhook_id}{duplicate}</td><td>{verdict}</td>\
             <td><details><summary>body</summary><pre class=\"body\">{body}</pre></details></td>\
             </tr>",
            id = escape(&w.id),
            when = time(w.received_at),
            name = escape(&w.name),
            event_type = or_none(&w.event_type),
            webhook_id = or_none(&w.webhook_id),
            body = escape(&w.body),
        ));
    }
    let note = if matching == 0 {
        "<p class=\"empty\">No webhooks yet. Deliveries to <code>POST /webhooks/{name}</code> \
         appear here.</p>"
            .to_owned()
    } else if matching > found.len() {
        format!(
            "<p class=\"note\">The newest {} of {matching} matching webhooks.</p>",
            found.len()
        )
    } else {
        String::new()
    };
    format!(
        "<section id=\"webhooks\"><h2>Webhooks</h2><p class=\"webhook-stats\">{kept} kept of \
         {received} received: {distinct} distinct ids (<span class=\"duplicates\">{duplicates} \
         duplicates</span>), {invalid} invalid signatures, {unverified} unverified, {rejected} \
         rejected by faults, {dropped} dropped after accepting.</p>\
         <table><thead><tr><th>received</th><th>endpoint</th><th>type</th><th>webhook-id</th>\
         <th>signature</th><th></th></tr></thead><tbody>{rows}</tbody></table>{note}</section>",
        kept = stats.kept,
        received = stats.received,
        distinct = stats.distinct,
        duplicates = stats.duplicates,
        invalid = stats.invalid,
        unverified = stats.unverified,
        rejected = stats.rejected,
        dropped = stats.dropped,
    )
}

/// The faults in force, in words ("none" when there are none).
fn faults_summary(f: &Faults) -> String {
    let mut on = Vec::new();
    let rejection = match f.rejection {
        crate::Rejection::Temporary => "temporary",
        crate::Rejection::Permanent => "permanent",
    };
    if f.reject_next > 0 {
        on.push(format!("reject the next {} ({rejection})", f.reject_next));
    }
    if f.delay_ms > 0 {
        on.push(format!("delay {} ms", f.delay_ms));
    }
    if f.drop_after_accept > 0 {
        on.push(format!(
            "drop the connection after accepting the next {}",
            f.drop_after_accept
        ));
    }
    if let Some(window) = f.dedupe_window_ms {
        on.push(format!(
            "provider mode (keys kept {})",
            humanize(std::time::Duration::from_millis(window))
        ));
    }
    if f.throttle_next > 0 {
        on.push(format!("throttle the next {}", f.throttle_next));
    }
    if f.throttle_every > 0 {
        on.push(format!("throttle every {}th", f.throttle_every));
    }
    if f.unauthorized_next > 0 {
        on.push(format!(
            "refuse the credentials of the next {}",
            f.unauthorized_next
        ));
    }
    if f.unauthorized_for_ms > 0 {
        on.push(format!(
            "refuse every credential for {} ms more",
            f.unauthorized_for_ms
        ));
    }
    if f.webhook_reject_next > 0 {
        on.push(format!(
            "reject the next {} webhooks ({})",
            f.webhook_reject_next, f.webhook_reject_status
        ));
    }
    if f.webhook_delay_ms > 0 {
        on.push(format!("delay webhooks {} ms", f.webhook_delay_ms));
    }
    if f.webhook_drop_after_accept > 0 {
        on.push(format!(
            "drop the connection after accepting the next {} webhooks",
            f.webhook_drop_after_accept
        ));
    }
    if f.link_scanner {
        on.push("the link scanner GETs each message's links to the origins named".to_owned());
    }
    if on.is_empty() {
        "none".to_owned()
    } else {
        on.join(", ")
    }
}

/// The faults: a summary, and a form that sets them (`PUT /faults` from the script).
fn faults_panel(f: &Faults) -> String {
    let number = |name: &str, label: &str, value: u64| {
        format!(
            "<label>{label} <input type=\"number\" min=\"0\" step=\"1\" name=\"{name}\" \
             value=\"{value}\"></label>"
        )
    };
    let selected = |yes: bool| if yes { " selected" } else { "" };
    let permanent = f.rejection == crate::Rejection::Permanent;
    format!(
        "<section id=\"faults-panel\"><details><summary>Faults: \
         <span id=\"faults-summary\">{summary}</span></summary>\
         <form id=\"faults\" class=\"faults\">\
         <fieldset><legend>Reject</legend>{reject_next}<label>as <select name=\"rejection\">\
         <option value=\"temporary\"{temporary}>temporary (SMTP 451, HTTP 503)</option>\
         <option value=\"permanent\"{permanent}>permanent (SMTP 550, HTTP 422)</option>\
         </select></label></fieldset>\
         <fieldset><legend>Throttle</legend>{throttle_next}{throttle_every}{retry_after}</fieldset>\
         <fieldset><legend>Refuse the credentials</legend>{unauthorized_next}{unauthorized_for}\
         </fieldset>\
         <fieldset><legend>Answer</legend>{delay}{drop}\
         <label><input type=\"checkbox\" name=\"provider\"{provider}> provider mode: a repeated \
         idempotency key is acknowledged, not delivered again (24 h)</label></fieldset>\
         <fieldset><legend>Webhooks</legend>{webhook_reject_next}\
         <label>with status <input type=\"number\" min=\"400\" max=\"599\" step=\"1\" \
         name=\"webhook_reject_status\" value=\"{webhook_reject_status}\"></label>\
         {webhook_delay}{webhook_drop}</fieldset>\
         <p><button type=\"submit\">Apply</button> \
         <button type=\"button\" id=\"faults-clear\">No faults</button> \
         <span id=\"faults-status\" role=\"status\"></span></p></form></details></section>",
        summary = escape(&faults_summary(f)),
        reject_next = number("reject_next", "next attempts", f.reject_next.into()),
        temporary = selected(!permanent),
        permanent = selected(permanent),
        throttle_next = number("throttle_next", "next attempts", f.throttle_next.into()),
        throttle_every = number(
            "throttle_every",
            "every n-th attempt (0: off)",
            f.throttle_every.into()
        ),
        retry_after = number("retry_after_s", "Retry-After (s)", f.retry_after_s),
        unauthorized_next = number(
            "unauthorized_next",
            "next attempts",
            f.unauthorized_next.into()
        ),
        unauthorized_for = number("unauthorized_for_ms", "for (ms)", f.unauthorized_for_ms),
        delay = number("delay_ms", "delay each answer (ms)", f.delay_ms),
        drop = number(
            "drop_after_accept",
            "accept, then drop the connection (next)",
            f.drop_after_accept.into()
        ),
        webhook_reject_next = number(
            "webhook_reject_next",
            "reject the next",
            f.webhook_reject_next.into()
        ),
        webhook_reject_status = f.webhook_reject_status,
        webhook_delay = number(
            "webhook_delay_ms",
            "delay each answer (ms)",
            f.webhook_delay_ms
        ),
        webhook_drop = number(
            "webhook_drop_after_accept",
            "accept, then close without an answer (next)",
            f.webhook_drop_after_accept.into()
        ),
        provider = if f.dedupe_window_ms.is_some() {
            " checked"
        } else {
            ""
        },
    )
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

/// `GET /view/{id}`: one message — its headers, its text with links clickable, its HTML part
/// rendered in a sandboxed frame ([`html`]) and as source, and its raw source (as text).
pub async fn view(
    State(inbox): State<Inbox>,
    Path(id): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Response {
    let path = uri.path();
    let base = path.find("/view/").map_or("", |i| &path[..i]);
    let back = if base.is_empty() { "/" } else { base };
    let Some(m) = inbox.message(&id) else {
        let html = format!(
            "{}<main><p><a href=\"{}\">← Inbox</a></p><h1>No such message</h1>\
             <p>It was deleted, or it is older than the inbox keeps.</p></main></body></html>",
            head("No such message", base, ""),
            escape(back)
        );
        return page(StatusCode::NOT_FOUND, html);
    };
    page(StatusCode::OK, message_page(&inbox, &m, base, back))
}

fn message_page(inbox: &Inbox, m: &Message, base: &str, back: &str) -> String {
    let copies = inbox.copies(m);
    let or_none = |value: Option<&str>| {
        value.map_or("<span class=\"none\">none</span>".to_owned(), |v| {
            format!("<code>{}</code>", escape(v))
        })
    };
    // The HTML part drawn in a frame that may do nothing else ([`html`]: `sandbox` here and in
    // its own Content-Security-Policy), then its source as text.
    let html_part = m.html.as_deref().map_or(String::new(), |html| {
        format!(
            "<h2>HTML</h2><iframe id=\"html\" sandbox src=\"{base}/view/{id}/html\" \
             title=\"The HTML part, rendered (no script, nothing loaded from elsewhere)\" \
             referrerpolicy=\"no-referrer\"></iframe>\
             <details><summary>HTML source</summary><pre>{source}</pre></details>",
            base = escape(base),
            id = escape(&m.id),
            source = escape(html)
        )
    });
    format!(
        "{head}<main><p><a href=\"{back}\">← Inbox</a></p><h1>{subject}</h1>\
         <table class=\"headers\">\
         <tr><th>From</th><td>{from}</td></tr><tr><th>To</th><td>{to}</td></tr>{reply_to}\
         <tr><th>Received</th><td>{when} over {via}</td></tr>\
         <tr><th>Message-ID</th><td>{message_id}</td></tr>\
         <tr><th>{key_header}</th><td>{key}</td></tr>\
         <tr><th>Copies</th><td id=\"copies\">{copies_text}</td></tr></table>\
         <p class=\"actions\"><button type=\"button\" data-delete=\"{id}\" data-then=\"{back}\">\
         Delete</button> <a href=\"{base}/messages/{id}/raw\">Raw source as a file</a></p>\
         {html_part}<h2>Text</h2><pre class=\"body\">{body}</pre>\
         <details id=\"raw\"><summary>Raw source</summary><pre>{raw}</pre></details>\
         </main></body></html>",
        head = head(&m.subject, base, ""),
        back = escape(back),
        base = escape(base),
        id = escape(&m.id),
        subject = if m.subject.is_empty() {
            "(no subject)".to_owned()
        } else {
            escape(&m.subject)
        },
        from = escape(&m.from),
        to = escape(&m.to.join(", ")),
        reply_to = m.reply_to.as_deref().map_or(String::new(), |r| {
            format!("<tr><th>Reply-To</th><td>{}</td></tr>", escape(r))
        }),
        when = time(m.received_at),
        via = intake(m.intake),
        message_id = or_none(m.message_id.as_deref()),
        key_header = escape(&inbox.idempotency_header(m.intake)),
        key = or_none(m.idempotency_key.as_deref()),
        copies_text = if copies > 1 {
            format!("{copies}: a duplicate (the same idempotency key, or Message-ID)")
        } else {
            "1: no duplicate".to_owned()
        },
        body = linkify(&m.text),
        raw = escape(&m.raw),
    )
}

/// `GET /view/{id}/html`: the message's HTML part as a page of its own, for the frame of the
/// message page — sandboxed by [`HTML_PART_POLICY`], never cached, no referrer; 404 for an
/// unknown message or one without HTML.
pub async fn html(State(inbox): State<Inbox>, Path(id): Path<String>) -> Response {
    let Some(html) = inbox.message(&id).and_then(|m| m.html) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut response = html.into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CONTENT_SECURITY_POLICY, HTML_PART_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "SAMEORIGIN"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `GET /messages/{id}/raw`: the message as it came in, as plain text.
pub async fn raw(State(inbox): State<Inbox>, Path(id): Path<String>) -> Response {
    let Some(m) = inbox.message(&id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut response = m.raw.into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
        (
            header::CONTENT_SECURITY_POLICY,
            "sandbox; default-src 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_become_anchors_and_everything_else_is_escaped() {
        let html = linkify("Open\nhttp://x.io/v1/verify?token=a_b-c&d=1 now <script>");
        assert!(
            html.contains(
                r#"<a href="http://x.io/v1/verify?token=a_b-c&amp;d=1" rel="noreferrer">"#
            ),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"));
        assert!(!html.contains("<script>"));
        // A quote cannot end the attribute.
        let html = linkify("http://x.io/\"onmouseover=alert(1)");
        assert!(!html.contains("\"onmouseover"), "{html}");
    }

    #[test]
    fn times_are_utc_with_date_and_zone_and_machine_readable() {
        let at = OffsetDateTime::UNIX_EPOCH + std::time::Duration::from_secs(86_400 + 3_723);
        assert_eq!(
            time(at.to_offset(time::UtcOffset::from_hms(9, 0, 0).unwrap())),
            "<time datetime=\"1970-01-02T01:02:03Z\">1970-01-02 01:02:03 UTC</time>"
        );
    }

    #[test]
    fn the_faults_summary_names_each_fault_in_force() {
        assert_eq!(faults_summary(&Faults::default()), "none");
        let summary = faults_summary(&Faults {
            reject_next: 2,
            rejection: crate::Rejection::Permanent,
            ..Faults::provider()
        });
        assert_eq!(
            summary,
            "reject the next 2 (permanent), provider mode (keys kept 24 h)"
        );
    }
}
