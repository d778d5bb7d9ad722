//! The test inbox as a CI tool (issue 21, item 2): `oncely inbox expect` against a real
//! `oncely inbox` process, and the link scanner against a real signup.

use std::time::Duration;

use oncely_inbox::Faults;
use serde_json::{Value, json};

use crate::requests::{VERIFIED_USERS, app_with_faults, json_of};
use crate::support::{
    oncely_binary, run_to_end, spawn_inbox, spawn_inbox_with_env, sqlite_db, token_in,
};

/// `oncely inbox expect --http <base> <args>`: its exit code, stdout and stderr.
async fn expect(base: &str, args: &[&str]) -> (i32, String, String) {
    run_to_end(oncely_binary(&["inbox", "expect", "--http", base]).args(args)).await
}

/// Sends a message with `text` to `to` through the inbox's HTTP intake.
async fn send(base: &str, to: &str, text: &str) {
    let response = oncely_testdb::http()
        .post(format!("{base}/emails"))
        .json(&json!({ "from": "app@example.com", "to": [to], "subject": "Verify", "text": text }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn inbox_expect_prints_the_matching_link_once_mail_arrives_and_exits_distinctly_for_each_failure()
 {
    let (_inbox, base) = spawn_inbox().await;
    let run: Value = json_of(oncely_testdb::http().post(format!("{base}/runs"))).await;
    let id = run["run"].as_str().unwrap().to_owned();
    let ada = format!("ada@{id}.run.test");
    // Waiting before the mail is sent: it answers when it arrives.
    let waiting = tokio::spawn({
        let (base, ada) = (base.clone(), ada.clone());
        async move {
            expect(
                &base,
                &[
                    "--to",
                    &ada,
                    "--within",
                    "20s",
                    "--link-matches",
                    r"/v1/verify\?token=",
                ],
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    send(
        &base,
        &ada,
        "Help: http://127.0.0.1:9/help\nVerify: http://127.0.0.1:9/v1/verify?token=T0k-en_1.",
    )
    .await;
    let (code, stdout, stderr) = waiting.await.unwrap();
    assert_eq!(
        (code, stdout.as_str()),
        (0, "http://127.0.0.1:9/v1/verify?token=T0k-en_1\n"),
        "{stderr}"
    );

    let (code, stdout, _) = expect(&base, &["--run", &id, "--json"]).await;
    assert_eq!(code, 0);
    let document: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(document["messages"][0]["to"][0], ada.as_str());
    assert_eq!(
        document["messages"][0]["links"].as_array().unwrap().len(),
        2
    );
    let (code, stdout, _) = expect(&base, &["--run", &id]).await;
    assert_eq!(
        (code, stdout.trim()),
        (0, document["messages"][0]["id"].as_str().unwrap()),
        "the ids"
    );

    for (args, want, reason) in [
        (
            vec!["--run", id.as_str(), "--count", "2", "--within", "300ms"],
            3,
            "1 of 2 message(s) of run",
        ),
        (
            vec!["--to", "nobody@example.com", "--within", "100ms"],
            3,
            "0 of 1 message(s) to nobody@example.com",
        ),
        (vec!["--run", "nosuchrun"], 3, "has no run \"nosuchrun\""),
        // An empty address (a shell variable that was not set) is a usage error, not a wait.
        (vec!["--to", ""], 2, "'--to <ADDR>'"),
        (vec!["--to", "  "], 2, "'--to <ADDR>'"),
        (vec!["--run", ""], 2, "'--run <ID>'"),
        (
            vec!["--to", ada.as_str(), "--link-matches", "/reset"],
            4,
            "no link matches",
        ),
        (
            vec!["--to", ada.as_str(), "--link-matches", "verify("],
            2,
            "not a regular expression",
        ),
    ] {
        let (code, stdout, stderr) = expect(&base, &args).await;
        assert_eq!(code, want, "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(
            stderr.lines().next().unwrap().contains(reason),
            "{args:?}: {stderr}"
        );
    }
    let (code, _, stderr) = expect(
        &base,
        &["--run", &id, "--count", "2", "--within", "100ms", "--json"],
    )
    .await;
    let failure: Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!((code, failure["error"].as_str()), (3, Some("timeout")));

    // An inbox that is not there: a port just freed.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, _, stderr) = expect(&format!("{free}"), &["--to", "a@example.com"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot reach the inbox"), "{stderr}");
    // A password or a token in --http (an inbox behind basic auth) never reaches the output:
    // CI logs. Not when the inbox is not there, nor when the value does not parse.
    for (http, code) in [
        (format!("http://ci:hunter2secret@{free}"), 1),
        (format!("http://hunter2secret@{free}"), 1),
        ("ci:hunter2secret@127.0.0.1:notaport".to_owned(), 2),
        (format!("ftp://ci:hunter2secret@{free}"), 2),
    ] {
        for json in [false, true] {
            let mut args = vec!["--to", "a@example.com"];
            if json {
                args.push("--json");
            }
            let (status, _, stderr) = expect(&http, &args).await;
            assert_eq!(status, code, "{http}: {stderr}");
            assert!(!stderr.contains("hunter2secret"), "{http}: {stderr}");
        }
    }
    let (_, _, stderr) = expect(
        &format!("http://ci:hunter2secret@{free}"),
        &["--to", "a@x.io"],
    )
    .await;
    assert!(
        stderr.contains("cannot reach the inbox at http://***@"),
        "{stderr}"
    );
    // A wait longer than a day is a mistake (a CI step stuck), refused as usage, not a panic.
    for within in ["25h", "18446744073709551615s"] {
        let (code, _, stderr) = expect(&base, &["--to", "a@example.com", "--within", within]).await;
        assert_eq!(code, 2, "{within}: {stderr}");
        assert!(stderr.contains("--within"), "{within}: {stderr}");
    }
}

/// A provider's link scanner (or a mail client's preview) opens every link of a message before
/// the person does: the verification page it gets verifies nobody, and the link still works
/// for the person afterwards — only the POST from the page verifies.
#[tokio::test]
async fn a_link_scanner_opening_the_verification_link_verifies_nobody_and_the_link_still_works() {
    let (url, _db) = sqlite_db().await;
    let app = app_with_faults(
        &url,
        Faults {
            link_scanner: true,
            ..Faults::default()
        },
    )
    .await;
    // The scanner opens the service's own links (issue 36, item 5): its origin is named.
    app.inbox
        .set_scan_origins([oncely_inbox::Origin::parse(&app.base).unwrap()]);
    let password = "correct horse battery";
    let signup = app
        .post(
            "/v1/signup",
            "s1",
            &json!({ "email": "ada@example.com", "password": password }),
        )
        .await;
    assert_eq!(signup.status(), 202);
    let email = app
        .inbox
        .wait_for("ada@example.com", 1, Duration::from_secs(10))
        .await
        .remove(0);
    let mut links = app.inbox.links(&email.id).unwrap();
    for _ in 0..250 {
        if links.scanned.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        links = app.inbox.links(&email.id).unwrap();
    }
    let token = token_in(&email);
    let link = links
        .links
        .iter()
        .find(|l| l.contains("/v1/verify?token=") && l.contains(&token))
        .expect("the verification link is extracted");
    let scans = links.scanned.expect("the scanner finished");
    assert!(
        scans
            .iter()
            .any(|s| &s.url == link && s.status == Some(200)),
        "the scanner got the page: {scans:?}"
    );
    assert_eq!(app.count(VERIFIED_USERS).await, 0, "a GET verifies nobody");

    let page = app.client.get(link).send().await.unwrap();
    assert_eq!(page.status(), 200, "the link still works for the person");
    let verified = app
        .post(
            "/v1/verify",
            "v1",
            &json!({ "token": token, "password": password }),
        )
        .await;
    let body: Value = verified.json().await.unwrap();
    assert_eq!(body["status"], "verified", "{body}");
    assert_eq!(app.count(VERIFIED_USERS).await, 1);
}

/// A loopback port that counts the connections it gets (and answers nothing).
async fn counting_port() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, hits)
}

/// What the scanner recorded for the one message to `to` at the inbox `base`: (url, status).
async fn scanned_at(base: &str, to: &str) -> Vec<(String, Value)> {
    let http = oncely_testdb::http();
    for _ in 0..250 {
        let messages: Value = json_of(http.get(format!("{base}/messages?to={to}"))).await;
        if let Some(id) = messages[0]["id"].as_str() {
            let links: Value = json_of(http.get(format!("{base}/messages/{id}/links"))).await;
            if let Some(scans) = links["scanned"].as_array() {
                return scans
                    .iter()
                    .map(|s| (s["url"].as_str().unwrap().to_owned(), s["status"].clone()))
                    .collect();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the scanner recorded nothing for mail to {to} at {base}");
}

/// Issue 36, item 5, for `oncely serve`'s dev inbox: its link scanner opens the service's own
/// links (the origin of its public URL) and no other port of the machine; and the dev inbox is
/// bounded by the default byte budget (item 4).
#[tokio::test]
async fn the_dev_inbox_scanner_opens_the_service_s_own_links_only() {
    let (url, _db) = sqlite_db().await;
    let app = oncely_server::app::Application::<oncely_server::backend::Sqlite>::build(
        crate::support::settings(&url, "dev"),
    )
    .await
    .unwrap();
    let inbox = app.dev_inbox().expect("the dev mailer's inbox").0.clone();
    let base = format!("http://{}", app.addr());
    tokio::spawn(app.run_until(std::future::pending()));
    let config = inbox.config();
    assert_eq!(
        config.scan_origins,
        [oncely_inbox::Origin::parse(&base).unwrap()],
        "the service's public URL's origin"
    );
    assert_eq!(config.retention.max_bytes, oncely_inbox::DEFAULT_MAX_BYTES);
    let http = oncely_testdb::http();
    let on = http
        .put(format!("{base}/_dev/inbox/faults"))
        .body(r#"{"link_scanner": true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(on.status(), 200);
    let (other, hits) = counting_port().await;
    let links = [
        format!("{base}/healthz"),
        format!("http://127.0.0.1:{other}/admin/delete?all=1"),
        format!("{base}@127.0.0.1:{other}/"),
    ];
    send(
        &format!("{base}/_dev/inbox"),
        "ada@example.com",
        &links.join(" "),
    )
    .await;
    let scans = scanned_at(&format!("{base}/_dev/inbox"), "ada@example.com").await;
    assert_eq!(
        scans,
        [
            (links[0].clone(), json!(200)),
            (links[1].clone(), Value::Null),
            (links[2].clone(), Value::Null),
        ]
    );
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// Issue 36, item 5, for `oncely inbox`: `--scan-origin` names what the scanner opens; without
/// it, it cannot be switched on.
#[tokio::test]
async fn oncely_inbox_s_scanner_opens_only_the_scan_origins_named() {
    let (_plain, plain) = spawn_inbox().await;
    let refused = oncely_testdb::http()
        .put(format!("{plain}/faults"))
        .body(r#"{"link_scanner": true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("--scan-origin"));

    let (named, named_hits) = counting_port().await;
    let (other, other_hits) = counting_port().await;
    let named = format!("http://127.0.0.1:{named}");
    let (_child, base) = crate::support::spawn_inbox_with(&["--scan-origin", &named]).await;
    let on = oncely_testdb::http()
        .put(format!("{base}/faults"))
        .body(r#"{"link_scanner": true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(on.status(), 200);
    let text = format!("{named}/verify http://127.0.0.1:{other}/admin/delete?all=1");
    send(&base, "ada@example.com", &text).await;
    let scans = scanned_at(&base, "ada@example.com").await;
    assert_eq!(scans.len(), 2, "{scans:?}");
    assert_eq!(named_hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(other_hits.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// Issue 36, item 4: under glibc `oncely inbox` runs with a fixed malloc mmap threshold, so that
/// the large messages it evicts are given back and the process stays near its byte budget
/// (without it: about 95 MiB beyond 256 MiB under 300 messages of 1.9 MB over HTTP); an
/// operator's own setting stands.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[tokio::test]
async fn oncely_inbox_runs_with_a_fixed_malloc_mmap_threshold() {
    let environ = |pid: u32| {
        let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        raw.split(|&b| b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .filter(|v| v.starts_with("MALLOC_MMAP_THRESHOLD_="))
            .collect::<Vec<_>>()
    };
    let (child, base) = spawn_inbox().await;
    assert_eq!(
        environ(child.id().unwrap()),
        ["MALLOC_MMAP_THRESHOLD_=131072"]
    );
    let stats = oncely_testdb::http()
        .get(format!("{base}/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(stats.status(), 200, "the same process serves");
    drop(child);

    let (mut own, _) = spawn_inbox_with_env(&[], &[("MALLOC_MMAP_THRESHOLD_", "262144")]).await;
    assert_eq!(
        environ(own.id().unwrap()),
        ["MALLOC_MMAP_THRESHOLD_=262144"]
    );
    own.kill().await.unwrap();
}
