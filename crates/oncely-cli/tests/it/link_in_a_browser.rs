//! Issue 15, item 6: a link works from any browser. Over plain HTTP on a host that is not
//! localhost a page is no secure context, and `crypto.randomUUID` does not exist there: the
//! verify page's button did nothing. Chrome treats localhost and 127.0.0.0/8 as secure, so the
//! service is reached by a name (`oncely.test`, mapped to loopback inside Chromium only).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{RawQuery, Request};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use oncely_testdb::TestSqlite;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::requests::{VERIFIED_USERS, email, link_in, nth_link, problem_type, sign_up};
use crate::support::spawn_app_on;

/// Issue 16, item 4: a tenant's magic link, opened in a browser, takes the person back to the
/// tenant's return URL (the application's page, here a listener on loopback) with a one-time
/// code, which the application's backend exchanges once for who signed in.
#[tokio::test]
async fn a_magic_link_in_a_browser_lands_on_the_return_url_with_a_code_that_exchanges() {
    let db = TestSqlite::new();
    let app = spawn_app_on(db.url(), |_| {}).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback = format!(
        "http://127.0.0.1:{}/auth/callback?from=mail",
        listener.local_addr().unwrap().port()
    );
    let queries = Arc::new(Mutex::new(Vec::new()));
    let seen = queries.clone();
    let application = Router::new().route(
        "/auth/callback",
        get(move |RawQuery(query): RawQuery| async move {
            seen.lock().unwrap().push(query.unwrap_or_default());
            Html("<!doctype html><title>Back in the application</title><p>Signed in")
        }),
    );
    tokio::spawn(async move { axum::serve(listener, application).await });
    let Some(mut browser) = Browser::launch("the return URL test", &[]).await else {
        return;
    };
    let acme = app.create_tenant("acme").await;
    crate::support::set_return_url(db.url(), "acme", &callback).await;
    let ada = "ada@example.com";
    for (path, key) in [("/v1/signup", "s"), ("/v1/magic-link", "m")] {
        let r = app.post_as(&acme, path, key, &email(ada)).await;
        assert_eq!(r.status(), 202, "{path}");
    }
    // The two emails may arrive in either order (one worker sends them at once).
    let link = app
        .emails_to(ada, 2)
        .await
        .iter()
        .map(link_in)
        .find(|link| link.contains("/v1/magic-link/consume?token="))
        .expect("the magic link");

    browser.goto(&link).await;
    browser.click("#confirm").await;
    let landed = browser
        .wait_for("location.pathname === '/auth/callback' && document.readyState === 'complete' && location.href")
        .await;
    browser.screenshot("magic-link-returned").await;
    let landed = landed.as_str().unwrap().to_owned();
    let query = queries.lock().unwrap().clone();
    assert_eq!(query.len(), 1, "one visit: {query:?}");
    let code = query[0]
        .strip_prefix("from=mail&code=")
        .unwrap_or_else(|| panic!("the code joins the query: {query:?}"))
        .to_owned();
    assert_eq!(landed, format!("{callback}&code={code}"));

    let body = json!({ "code": code });
    let exchange = |key: &'static str| app.post_as(&acme, "/v1/exchange", key, &body);
    let identity = exchange("x1").await;
    assert_eq!(identity.status(), 200);
    let identity: Value = identity.json().await.unwrap();
    assert_eq!(
        (&identity["email"], &identity["flow"], &identity["tenant"]),
        (&json!(ada), &json!("magic_link"), &json!("acme"))
    );
    let again: Value = exchange("x2").await.json().await.unwrap();
    assert_eq!(problem_type(&again), "code-invalid");
    browser.close().await;
}

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
    sign_up(&app, "plain-http", "plain@example.com").await;
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

/// Issue 15, item 6: `ONCELY_PUBLIC_URL` may have a path (`http(s)://host[/path]`), as when a
/// proxy serves the service under `/accounts`. The emailed link opened the page there, but its
/// button POSTed to the absolute `/v1/verify` — another path of the proxy's site, a 404 — and
/// the page called that 404 "invalid or expired". Through such a proxy: an unexpected status
/// says so (and the link still works after it), the click verifies, and only the service's
/// invalid-token answer (the used link, opened again) reads as a dead link.
#[tokio::test]
async fn a_verify_link_under_a_path_prefix_posts_through_the_proxy_and_a_404_is_no_dead_link() {
    let db = TestSqlite::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let public_url = format!(
        "http://oncely.test:{}/accounts",
        listener.local_addr().unwrap().port()
    );
    let app = spawn_app_on(db.url(), |s| s.public_url = Some(public_url.clone())).await;
    let misroute = prefix_proxy(listener, "/accounts", &app.base);
    let Some(mut browser) = Browser::launch(
        "the path-prefixed verify link test",
        &["--host-resolver-rules=MAP oncely.test 127.0.0.1"],
    )
    .await
    else {
        return;
    };
    sign_up(&app, "prefix", "prefix@example.com").await;
    let link = nth_link(&app, "prefix@example.com", 1).await;
    assert!(
        link.starts_with(&format!("{public_url}/v1/verify?token=")),
        "{link}"
    );
    browser.goto(&link).await;
    let result = "document.getElementById('result').textContent";

    // The proxy answers 404 itself (a route it lacks, say): a failure to retry, not a dead link.
    misroute.store(true, Ordering::SeqCst);
    browser.click("#confirm").await;
    let shown = browser.wait_for(result).await;
    browser.screenshot("prefixed-link-proxy-404").await;
    assert!(
        shown
            .as_str()
            .unwrap()
            .starts_with("Something went wrong (status 404)."),
        "{shown}; page log: {:?}",
        browser.log
    );
    assert_eq!(app.count(VERIFIED_USERS).await, 0);

    misroute.store(false, Ordering::SeqCst);
    browser.eval(&format!("{result} = ''")).await;
    browser.click("#confirm").await;
    let shown = browser.wait_for(result).await;
    browser.screenshot("prefixed-link-verified").await;
    assert_eq!(shown, "Done.", "page log: {:?}", browser.log);
    assert_eq!(app.count(VERIFIED_USERS).await, 1);

    // The link is used: opened again (a new key), the service answers token-invalid.
    browser.goto(&link).await;
    browser.click("#confirm").await;
    let shown = browser.wait_for(result).await;
    assert_eq!(shown, "This link is invalid or has expired.");
    browser.close().await;
}

/// A reverse proxy on `listener` that serves `upstream` under `prefix` (which it strips), as
/// one in front of the service would; any other path is its own 404 — and so is every path
/// while the flag it returns is set.
fn prefix_proxy(
    listener: tokio::net::TcpListener,
    prefix: &'static str,
    upstream: &str,
) -> Arc<AtomicBool> {
    let misroute = Arc::new(AtomicBool::new(false));
    let (upstream, flag) = (upstream.to_owned(), misroute.clone());
    let client = oncely_testdb::http();
    let forward = move |request: Request| {
        let (upstream, flag, client) = (upstream.clone(), flag.clone(), client.clone());
        async move {
            let (parts, body) = request.into_parts();
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let Some(rest) = path
                .strip_prefix(prefix)
                .filter(|rest| rest.starts_with('/'))
            else {
                return (StatusCode::NOT_FOUND, "Not Found").into_response();
            };
            if flag.load(Ordering::SeqCst) {
                return (StatusCode::NOT_FOUND, "Not Found").into_response();
            }
            let mut headers = parts.headers;
            headers.remove(header::HOST);
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let answer = client
                .request(parts.method, format!("{upstream}{rest}"))
                .headers(headers)
                .body(body)
                .send()
                .await
                .unwrap();
            let (status, mut headers) = (answer.status(), answer.headers().clone());
            headers.remove(header::TRANSFER_ENCODING);
            (status, headers, answer.bytes().await.unwrap()).into_response()
        }
    };
    let proxy = Router::new().fallback(forward);
    tokio::spawn(async move { axum::serve(listener, proxy).await });
    misroute
}
