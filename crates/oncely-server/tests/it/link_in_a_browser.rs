//! Issue 15, item 6: a link works from any browser. Over plain HTTP on a host that is not
//! localhost a page is no secure context, and `crypto.randomUUID` does not exist there: the
//! verify page's button did nothing. Chrome treats localhost and 127.0.0.0/8 as secure, so the
//! service is reached by a name (`oncely.test`, mapped to loopback inside Chromium only).

use oncely_testdb::TestSqlite;
use serde_json::json;

use crate::browser::Browser;
use crate::requests::{VERIFIED_USERS, nth_link};
use crate::support::spawn_app_on;

#[tokio::test]
async fn a_verify_link_opened_over_plain_http_on_a_named_host_verifies_with_one_click() {
    let db = TestSqlite::new();
    // The emailed link names the host the browser opens (port 80 there; Chromium maps the name
    // and port to the service's loopback address).
    let app = spawn_app_on(db.url(), |s| {
        s.public_url = Some("http://oncely.test".into());
    })
    .await;
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    let rules = format!("--host-resolver-rules=MAP oncely.test 127.0.0.1:{port}");
    let Some(mut browser) = Browser::launch("the plain-HTTP verify link test", &[&rules]).await
    else {
        return;
    };
    let signup = app
        .post(
            "/v1/signup",
            "plain-http",
            &json!({ "email": "plain@example.com" }),
        )
        .await;
    assert_eq!(signup.status(), 202);
    let link = nth_link(&app, "plain@example.com", 1).await;
    assert!(
        link.starts_with("http://oncely.test/v1/verify?token="),
        "{link}"
    );

    browser.goto(&link).await;
    assert_eq!(
        browser
            .eval("[location.origin, window.isSecureContext]")
            .await,
        json!(["http://oncely.test", false]),
        "a plain-HTTP origin that is no secure context"
    );
    browser.click("#confirm").await;
    let result = browser
        .wait_for("document.getElementById('result').textContent")
        .await;
    browser.screenshot("verify-link-over-plain-http").await;
    assert_eq!(result, "Done.", "page log: {:?}", browser.log);
    assert_eq!(app.count(VERIFIED_USERS).await, 1);
    browser.close().await;
}
