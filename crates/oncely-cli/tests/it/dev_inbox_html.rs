//! Issue 18: an HTML email in the dev inbox, in headless Chromium. The message page draws the
//! HTML part in a sandboxed frame: its text and style show, and nothing else happens — no
//! script, no inline handler, no dialog, no request to another server (a remote image would
//! tell the sender the email was opened). The email goes the way the service's own do: the
//! SMTP mailer into the dev inbox that `serve` mounts at `/_dev/inbox`. The screenshot goes to
//! `target/tmp/screenshots/dev-inbox-html.png` (its path is printed).

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use oncely_outbox::Delivery;
use oncely_outbox::mail::{Email, from_url};
use oncely_server::app::Application;
use oncely_server::backend::Sqlite;
use oncely_testdb::TestSqlite;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::support::settings;

/// A server that notes every connection made to it, and the first line each one sent (a
/// browser may connect ahead of a request: a connection alone tells the sender that the email
/// was opened too): where the email's remote resources point.
async fn tracker() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(Mutex::new(Vec::new()));
    let kept = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            kept.lock().unwrap().push("a connection".to_owned());
            let kept = kept.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut first = vec![0; 2048];
                let n = stream.read(&mut first).await.unwrap_or(0);
                let sent = String::from_utf8_lossy(&first[..n]);
                let line = sent.lines().next().unwrap_or_default();
                kept.lock().unwrap().push(format!("then: {line:?}"));
            });
        }
    });
    (port, hits)
}

/// Every node of a DOM tree (`DOM.getDocument` with `depth: -1, pierce: true`), frames'
/// documents included, depth first.
fn nodes(node: &Value, out: &mut Vec<Value>) {
    out.push(node.clone());
    for key in ["children", "shadowRoots", "pseudoElements"] {
        for child in node[key].as_array().into_iter().flatten() {
            nodes(child, out);
        }
    }
    if node["contentDocument"].is_object() {
        nodes(&node["contentDocument"], out);
    }
}

/// The frame's document as Chromium holds it: Chromium runs a sandboxed frame in a process of
/// its own, so it is read over the frame's own session ([`Browser::watch_frames`]).
/// The frame whose URL ends with `url_end` (its session and document) once its text contains
/// `text` (within 15 s; `what` names it otherwise).
async fn frame_showing(
    browser: &mut Browser,
    url_end: &str,
    text: &str,
    what: &str,
) -> (String, Value) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some((session, document)) = frame_document(browser, url_end).await
            && text_of(&document).contains(text)
        {
            return (session, document);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the frame shows no {what}; frames: {:?}; log: {:?}",
            browser.frames,
            browser.log
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn frame_document(browser: &mut Browser, url_end: &str) -> Option<(String, Value)> {
    browser.eval("1").await; // takes in the events so far: the frame's attachment among them
    let sessions: Vec<String> = browser.frames.iter().map(|(s, _)| s.clone()).collect();
    for session in sessions {
        let Ok(document) = browser
            .frame_command(&session, "DOM.getDocument", json!({ "depth": -1 }))
            .await
        else {
            continue;
        };
        if document["root"]["documentURL"]
            .as_str()
            .is_some_and(|url| url.ends_with(url_end))
        {
            return Some((session, document["root"].clone()));
        }
    }
    None
}

/// The node of `name` with `id` in a DOM tree, if there is one.
fn find(root: &Value, name: &str, id: &str) -> Option<Value> {
    let mut all = Vec::new();
    nodes(root, &mut all);
    all.into_iter().find(|n| {
        n["nodeName"] == name
            && n["attributes"]
                .as_array()
                .is_some_and(|a| a.chunks(2).any(|p| p[0] == "id" && p[1] == id))
    })
}

/// The node of `name` with `id` in a DOM tree.
fn element(root: &Value, name: &str, id: &str) -> Value {
    find(root, name, id).unwrap_or_else(|| panic!("no {name}#{id}"))
}

/// Waits (up to 15 s) until the page or one of its frames logged a line with `needle`.
async fn logged(browser: &mut Browser, needle: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !browser.log.iter().any(|l| l.contains(needle)) {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing logged {needle:?}: {:?}",
            browser.log
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        browser.eval("1").await;
    }
}

/// The text of a DOM tree: its text nodes' values, in order.
fn text_of(node: &Value) -> String {
    let mut all = Vec::new();
    nodes(node, &mut all);
    all.iter()
        .filter(|n| n["nodeType"] == 3)
        .filter_map(|n| n["nodeValue"].as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn the_dev_inbox_draws_an_html_email_in_a_sandbox_where_no_script_runs_and_nothing_loads() {
    let db = TestSqlite::new();
    let app = Application::<Sqlite>::build(settings(db.url(), "dev"))
        .await
        .unwrap();
    let (inbox, running) = app.dev_inbox().expect("the dev mailer's inbox");
    let (inbox, smtp) = (inbox.clone(), running.smtp_addr);
    let base = format!("http://{}", app.addr());
    tokio::spawn(app.run_until(std::future::pending()));
    let Some(mut browser) = Browser::launch("the dev inbox HTML email test", &[]).await else {
        return;
    };
    // Where the email's resources point (nothing may reach it), and where its frames point:
    // Chromium connects to a frame's server before the policy refuses the frame (it sends
    // nothing: no request, no URL, no cookie), a connection that no header of the inbox can
    // prevent; nothing may be requested there either.
    let (port, hits) = tracker().await;
    let remote = format!("http://127.0.0.1:{port}");
    let (framed_port, framed_hits) = tracker().await;
    let framed = format!("http://127.0.0.1:{framed_port}");
    let html = format!(
        "<!doctype html><html><head><link rel=\"stylesheet\" href=\"{remote}/style.css\">\
         <style>@import url({remote}/import.css); .box {{ border: 3px solid rgb(0, 90, 200); \
         padding: 12px; }}</style></head><body>\
         <div class=\"box\"><h1 id=\"hello\" style=\"color: rgb(200, 0, 0)\">Grüße from the HTML \
         part</h1><p style=\"background: url({remote}/background.png)\">Styled, \
         with a <a id=\"away\" href=\"{framed}/link\">link</a>.</p></div>\
         <script>document.title = 'pwned'; console.log('script ran'); alert('script'); \
         document.body.insertAdjacentHTML('beforeend', '<p id=script-ran>ran</p>');</script>\
         <img src=\"x\" onerror=\"console.log('onerror ran'); alert('onerror'); \
         document.body.insertAdjacentHTML('beforeend', '<p id=handler-ran>ran</p>')\">\
         <img src=\"{remote}/pixel.png\" alt=\"\">\
         <form action=\"{remote}/steal\" method=\"post\"><input name=\"p\" value=\"secret\">\
         <button id=\"go\">go</button></form>\
         <iframe src=\"{framed}/frame\"></iframe><object data=\"{framed}/object\"></object>\
         <embed src=\"{framed}/embed\">\
         <svg><image href=\"{remote}/svg.png\"/></svg></body></html>"
    );
    let email = Email {
        from: "app@example.com".into(),
        to: "html@example.com".into(),
        subject: "An HTML email".into(),
        text: "The text part: Grüße.".into(),
        html: Some(html.clone()),
        reply_to: Some("support@example.com".into()),
    };
    let mailer = from_url(
        &format!("smtp://{smtp}"),
        None,
        Duration::from_secs(5),
        None,
    )
    .unwrap();
    match mailer.send(&email, "html-in-a-browser").await {
        Delivery::Sent { .. } => {}
        other => panic!("not sent: {other:?}"),
    }
    let received = inbox
        .wait_for("html@example.com", 1, Duration::from_secs(10))
        .await;
    assert_eq!(
        received[0].html.as_deref().map(|h| h.replace("\r\n", "\n")),
        Some(html.clone())
    );
    let id = received[0].id.clone();

    browser.watch_frames().await;
    browser.goto(&format!("{base}/_dev/inbox/view/{id}")).await;
    browser
        .wait_for("document.querySelector('iframe#html') !== null")
        .await;
    let sandbox = browser
        .eval("document.querySelector('iframe#html').getAttribute('sandbox')")
        .await;
    assert_eq!(sandbox, "", "a sandbox with no exception");
    assert_eq!(
        browser
            .eval("document.querySelectorAll('iframe').length")
            .await,
        1
    );
    // The frame's document, once drawn.
    let frame_url = format!("/_dev/inbox/view/{id}/html");
    let (session, document) = frame_showing(
        &mut browser,
        &frame_url,
        "Grüße from the HTML part",
        "HTML part",
    )
    .await;
    let text = text_of(&document);
    assert!(text.contains("Styled"), "{text}");
    for ran in ["script-ran", "handler-ran"] {
        assert_eq!(
            find(&document, "P", ran),
            None,
            "no script of the email ran"
        );
    }
    // Drawn: the heading has a box, in the colour the email gave it.
    let heading = element(&document, "H1", "hello");
    let model = browser
        .frame_command(
            &session,
            "DOM.getBoxModel",
            json!({ "backendNodeId": heading["backendNodeId"] }),
        )
        .await
        .unwrap();
    assert!(
        model["model"]["width"].as_f64() > Some(0.0)
            && model["model"]["height"].as_f64() > Some(0.0),
        "{model}"
    );
    browser
        .frame_command(&session, "CSS.enable", json!({}))
        .await
        .unwrap();
    let style = browser
        .frame_command(
            &session,
            "CSS.getComputedStyleForNode",
            json!({ "nodeId": heading["nodeId"] }),
        )
        .await
        .unwrap();
    let color = style["computedStyle"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "color")
        .map(|p| p["value"].clone());
    assert_eq!(color, Some(json!("rgb(200, 0, 0)")));
    // The page around it: its own title, its text part, the HTML source as text.
    assert_eq!(browser.eval("document.title").await, "An HTML email");
    let page = browser.text().await;
    assert!(page.contains("The text part: Grüße."), "{page}");
    let source = browser
        .eval("[...document.querySelectorAll('details pre')].map(p => p.textContent).join('\\n')")
        .await;
    assert!(
        source.as_str().unwrap().contains("<script>document.title"),
        "{source}"
    );

    // The email's form, submitted (by DevTools: the frame runs no script of its own), sends
    // nothing: a sandbox without allow-forms.
    let submitted = browser
        .frame_command(
            &session,
            "Runtime.evaluate",
            json!({ "expression": "document.getElementById('go').click(); \
                                   document.forms[0].requestSubmit(); 'submitted'",
                    "returnByValue": true }),
        )
        .await
        .unwrap();
    assert_eq!(submitted["result"]["value"], "submitted", "{submitted}");
    browser.wait_for("document.readyState === 'complete'").await;

    // The frame was watched: Chromium says what it blocked there.
    for blocked in [
        format!(
            "Blocked form submission to '{remote}/steal' because the form's frame is sandboxed"
        ),
        "Blocked script execution in".to_owned(),
        format!("Loading the image '{remote}/pixel.png' violates"),
    ] {
        logged(&mut browser, &blocked).await;
    }
    let shot = browser.screenshot("dev-inbox-html").await;
    assert!(shot.exists());
    browser.eval("1").await; // what was logged by now
    assert!(
        browser.dialogs.is_empty(),
        "no dialog opened: {:?}",
        browser.dialogs
    );
    assert!(
        !browser
            .log
            .iter()
            .any(|l| l.contains("script ran") || l.contains("onerror ran")),
        "{:?}",
        browser.log
    );
    assert_eq!(
        browser.eval("document.title").await,
        "An HTML email",
        "the page's title is its own"
    );
    let title = browser
        .frame_command(
            &session,
            "Runtime.evaluate",
            json!({ "expression": "document.title", "returnByValue": true }),
        )
        .await
        .unwrap();
    assert_eq!(
        title["result"]["value"], "",
        "the email's script set no title"
    );
    assert_eq!(
        *hits.lock().unwrap(),
        Vec::<String>::new(),
        "nothing was requested from another server; log: {:?}",
        browser.log
    );
    // A link followed in the frame goes nowhere: the page frames its own origin only, so
    // Chromium shows its error page in the frame, and requests nothing.
    browser
        .frame_command(
            &session,
            "Runtime.evaluate",
            json!({ "expression": "document.getElementById('away').click()" }),
        )
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let href = browser
            .frame_command(
                &session,
                "Runtime.evaluate",
                json!({ "expression": "location.href", "returnByValue": true }),
            )
            .await;
        let href = href
            .map(|h| h["result"]["value"].clone())
            .unwrap_or_default();
        if href.as_str().is_some_and(|h| !h.ends_with(&frame_url)) {
            assert_eq!(href, "chrome-error://chromewebdata/");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the link did nothing: {href}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let requested: Vec<String> = framed_hits
        .lock()
        .unwrap()
        .iter()
        .filter(|hit| hit.starts_with("then: ") && *hit != "then: \"\"")
        .cloned()
        .collect();
    assert!(
        requested.is_empty(),
        "nothing was requested from the frames' server: {requested:?}"
    );
    browser.close().await;
}

/// A real email of the service, as a team ships it: a signup asking for German, through the
/// service's own templates and the dev mailer, drawn in the dev inbox's frame — the German
/// heading, the button and the link (the text part's), the footer. The screenshot goes to
/// `target/tmp/screenshots/dev-inbox-verification-de.png`.
#[tokio::test]
async fn a_templated_email_of_the_service_is_drawn_in_the_dev_inbox_in_its_language() {
    let db = TestSqlite::new();
    let app = Application::<Sqlite>::build(settings(db.url(), "dev"))
        .await
        .unwrap();
    let (inbox, _) = app.dev_inbox().expect("the dev mailer's inbox");
    let inbox = inbox.clone();
    let base = format!("http://{}", app.addr());
    tokio::spawn(app.run_until(std::future::pending()));
    let Some(mut browser) = Browser::launch("the dev inbox templated email test", &[]).await else {
        return;
    };
    let signup = oncely_testdb::http()
        .post(format!("{base}/v1/signup"))
        .header("idempotency-key", "signup-de")
        .header("accept-language", "de-DE,de;q=0.9,en;q=0.5")
        .json(&json!({ "email": "lena@example.com" }))
        .send()
        .await
        .unwrap();
    assert_eq!(signup.status(), 202);
    let received = inbox
        .wait_for("lena@example.com", 1, Duration::from_secs(10))
        .await;
    let message = &received[0];
    assert_eq!(message.subject, "Bestätigen Sie Ihre E-Mail-Adresse");
    let link = message
        .text
        .split_whitespace()
        .find(|w| w.contains("token="))
        .expect("the link in the text part")
        .to_owned();
    let id = message.id.clone();
    browser.watch_frames().await;
    browser.goto(&format!("{base}/_dev/inbox/view/{id}")).await;
    browser
        .wait_for("document.querySelector('iframe#html') !== null")
        .await;
    let frame_url = format!("/_dev/inbox/view/{id}/html");
    let (_, document) =
        frame_showing(&mut browser, &frame_url, "Willkommen bei", "German email").await;
    let text = text_of(&document);
    for shown in [
        "Adresse bestätigen",
        "24 Stunden gültig",
        "Diese E-Mail wurde",
        &link,
    ] {
        assert!(text.contains(shown), "{shown:?} not in the frame: {text}");
    }
    let mut all = Vec::new();
    nodes(&document, &mut all);
    let hrefs: Vec<&str> = all
        .iter()
        .filter(|n| n["nodeName"] == "A")
        .filter_map(|n| n["attributes"].as_array())
        .flat_map(|a| a.chunks(2))
        .filter(|p| p[0] == "href")
        .filter_map(|p| p[1].as_str())
        .collect();
    assert!(
        hrefs.len() >= 2 && hrefs.iter().all(|h| *h == link),
        "the button and the copied link are the text part's link: {hrefs:?} vs {link}"
    );
    browser.screenshot("dev-inbox-verification-de").await;
    browser.close().await;
}
