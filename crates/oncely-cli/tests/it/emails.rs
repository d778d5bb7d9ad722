//! Emails a team can ship: every message from templates, in the account's language, with its
//! tenant's branding, a text and an HTML part carrying the same link — and templates checked
//! before anything is sent.

use std::path::Path;
use std::time::Duration;

use oncely_inbox::Message;
use oncely_testdb::TestDb;
use serde_json::{Value, json};

use crate::requests::{app_with_mail_caps, email, nth_token, token};
use crate::support::{TestApp, both_databases};

/// Each message's subject in English and German (an invitation's starts so).
const SUBJECTS: [(&str, &str, &str); 8] = [
    (
        "verification",
        "Confirm your email address",
        "Bestätigen Sie Ihre E-Mail-Adresse",
    ),
    (
        "password_reset",
        "Reset your password",
        "Passwort zurücksetzen",
    ),
    ("magic_link", "Your sign-in link", "Ihr Anmeldelink"),
    ("invite", "You are invited to join", "Einladung zu"),
    (
        "email_change",
        "Confirm your new email address",
        "Bestätigen Sie Ihre neue E-Mail-Adresse",
    ),
    (
        "signup_notice",
        "Someone tried to sign up with your address",
        "Jemand wollte sich mit Ihrer Adresse registrieren",
    ),
    (
        "email_change_notice",
        "Your email address is being changed",
        "Ihre E-Mail-Adresse soll geändert werden",
    ),
    (
        "email_taken_notice",
        "Someone tried to use your email address",
        "Jemand wollte Ihre E-Mail-Adresse verwenden",
    ),
];

fn subject(message: &str, locale: &str) -> &'static str {
    let (_, en, de) = SUBJECTS.iter().find(|(m, _, _)| *m == message).unwrap();
    if locale == "de" { de } else { en }
}

async fn app(url: &str) -> TestApp {
    app_with_mail_caps(url, 100, 1000, |_| {}).await
}

/// The links with a token in a text: its `http…` words.
fn text_links(text: &str) -> Vec<String> {
    text.split_whitespace()
        .filter(|w| w.starts_with("http") && w.contains("token="))
        .map(str::to_owned)
        .collect()
}

/// The links with a token in an HTML part: its `href`s, unescaped.
fn html_links(html: &str) -> Vec<String> {
    html.split("href=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|href| href.contains("token="))
        .map(|href| href.replace("&amp;", "&"))
        .collect()
}

/// `message` has both parts and, if `with_link`, one link, the same in both (the HTML part
/// shows it twice: the button and the address to copy). Returns it.
fn both_parts(message: &Message, with_link: bool) -> Option<String> {
    let html = message
        .html
        .as_deref()
        .unwrap_or_else(|| panic!("no HTML part: {}", message.raw));
    assert!(
        html.starts_with("<!doctype html>") && html.trim_end().ends_with("</html>"),
        "{html}"
    );
    assert!(!message.text.trim().is_empty());
    let (text, html) = (text_links(&message.text), html_links(html));
    if !with_link {
        assert!(text.is_empty() && html.is_empty(), "{text:?} {html:?}");
        return None;
    }
    assert_eq!(text.len(), 1, "{}", message.text);
    assert!(
        !html.is_empty() && html.iter().all(|l| *l == text[0]),
        "{html:?} vs {text:?}"
    );
    Some(text[0].clone())
}

/// The one email to `to` since the inbox was cleared, checked: subject of `message` in
/// `locale`, both parts, the link identical in both. Returns it.
async fn one_email(app: &TestApp, to: &str, message: &str, locale: &str) -> Message {
    let emails = app.emails_to(to, 1).await;
    assert_eq!(emails.len(), 1, "{message} to {to}: {emails:?}");
    let email = emails.into_iter().next().unwrap();
    assert!(
        email.subject.starts_with(subject(message, locale)),
        "{message} in {locale}: {:?}",
        email.subject
    );
    let with_link = !message.ends_with("_notice");
    both_parts(&email, with_link);
    assert!(
        email
            .html
            .as_deref()
            .unwrap()
            .contains(&format!("lang=\"{locale}\"")),
        "{message} in {locale}"
    );
    email
}

fn with_locale(mut body: Value, locale: &str) -> Value {
    body["locale"] = json!(locale);
    body
}

both_databases!(
    every_message_in_both_shipped_languages_through_the_inbox,
    the_locale_comes_from_the_request_then_accept_language_then_the_account,
    tenant_branding_names_the_product_and_the_sender_and_is_inert_in_html,
);

async fn every_message_in_both_shipped_languages_through_the_inbox(url: String, _db: TestDb) {
    let app = app(&url).await;
    let key = app.create_tenant("acme").await;
    for locale in ["en", "de"] {
        app.inbox.clear();
        let ada = format!("ada-{locale}@example.com");
        // Verification: the signup's locale.
        let body = with_locale(email(&ada), locale);
        let signup = app.post("/v1/signup", &format!("s-{locale}"), &body).await;
        assert_eq!(signup.status(), 202);
        let verification = one_email(&app, &ada, "verification", locale).await;
        let link = both_parts(&verification, true).unwrap();
        let presented = token(link.rsplit("token=").next().unwrap());
        let verify = app
            .post("/v1/verify", &format!("v-{locale}"), &presented)
            .await;
        assert_eq!(verify.status(), 200);
        // Everything later without a locale: the account's.
        for (path, message) in [
            ("/v1/signup", "signup_notice"),
            ("/v1/password-reset", "password_reset"),
            ("/v1/magic-link", "magic_link"),
        ] {
            app.inbox.clear();
            let key = format!("{message}-{locale}");
            assert_eq!(app.post(path, &key, &email(&ada)).await.status(), 202);
            one_email(&app, &ada, message, locale).await;
        }
        // An invitation, in the locale it names.
        app.inbox.clear();
        let guest = format!("guest-{locale}@example.com");
        let body = with_locale(email(&guest), locale);
        let invited = app
            .post_as(&key, "/v1/invites", &format!("i-{locale}"), &body)
            .await;
        assert_eq!(invited.status(), 202);
        let invite = one_email(&app, &guest, "invite", locale).await;
        let accept =
            json!({ "token": crate::support::token_in(&invite), "password": "guest password" });
        let accepted = app
            .post_as(&key, "/v1/invites/accept", &format!("a-{locale}"), &accept)
            .await;
        assert_eq!(accepted.status(), 200);
        let user_id = app
            .count(&format!(
                "SELECT count(*) FROM oncely_users WHERE email = '{guest}' AND locale = '{locale}'"
            ))
            .await;
        assert_eq!(
            user_id, 1,
            "the invited account keeps the invitation's locale"
        );
        // An email change of the invited account: the link to the new address and the notice
        // to the old one; then a change to a taken address: the notice to its owner.
        let id = user_id_of(&app, &guest).await;
        let new = format!("new-{locale}@example.com");
        app.inbox.clear();
        let path = format!("/v1/users/{id}/email-change");
        change_address(&app, &key, &path, &format!("c-{locale}"), &new).await;
        one_email(&app, &new, "email_change", locale).await;
        one_email(&app, &guest, "email_change_notice", locale).await;
        let other = format!("other-{locale}@example.com");
        let body = with_locale(email(&other), locale);
        app.post_as(&key, "/v1/invites", &format!("o-{locale}"), &body)
            .await;
        let invite = nth_token(&app, &other, 1).await;
        let accept = json!({ "token": invite });
        assert_eq!(
            app.status_as(&key, "/v1/invites/accept", &format!("oa-{locale}"), &accept)
                .await,
            200
        );
        app.inbox.clear();
        change_address(&app, &key, &path, &format!("t-{locale}"), &other).await;
        one_email(&app, &other, "email_taken_notice", locale).await;
    }
}

/// Asks, as the tenant of `api_key` with Idempotency-Key `key`, for the change of the address at
/// `path` to `to`: accepted (202).
async fn change_address(app: &TestApp, api_key: &str, path: &str, key: &str, to: &str) {
    let change = json!({ "new_email": to });
    let asked = app.post_as(api_key, path, key, &change).await;
    assert_eq!(asked.status(), 202);
}

async fn user_id_of(app: &TestApp, address: &str) -> uuid::Uuid {
    let sql = format!("SELECT id FROM oncely_users WHERE email = '{address}'");
    crate::support::scalar(&app.database_url, &sql).await
}

async fn the_locale_comes_from_the_request_then_accept_language_then_the_account(
    url: String,
    _db: TestDb,
) {
    let app = app(&url).await;
    let signup = |address: &str, key: &str, locale: Option<&str>, accept: Option<&str>| {
        let mut body = email(address);
        if let Some(locale) = locale {
            body["locale"] = json!(locale);
        }
        let mut request = app
            .client
            .post(format!("{}/v1/signup", app.base))
            .header("idempotency-key", key)
            .json(&body);
        if let Some(accept) = accept {
            request = request.header("accept-language", accept);
        }
        request.send()
    };
    // Accept-Language: the first language there are templates in (fr has none, de has).
    let browser = "bea@example.com";
    let answer = signup(
        browser,
        "b1",
        None,
        Some("fr-CH, fr;q=0.9, de-AT;q=0.8, en;q=0.5"),
    )
    .await
    .unwrap();
    assert_eq!(answer.status(), 202);
    let link = one_email(&app, browser, "verification", "de").await;
    // The account takes the locale of the link its owner verified with.
    let stored =
        "SELECT count(*) FROM oncely_users WHERE email = 'bea@example.com' AND locale = 'de-AT'";
    assert_eq!(
        app.count(stored).await,
        0,
        "not before the address is proven"
    );
    let presented = json!({ "token": crate::support::token_in(&link) });
    assert_eq!(app.post("/v1/verify", "bv", &presented).await.status(), 200);
    assert_eq!(
        app.count(stored).await,
        1,
        "the account keeps the tag asked for"
    );
    // `locale` wins over Accept-Language; a locale without templates is English, never an error.
    let (ja, fr) = ("jun@example.com", "fleur@example.com");
    let answer = signup(ja, "j1", Some("ja"), Some("de")).await.unwrap();
    assert_eq!(answer.status(), 202);
    one_email(&app, ja, "verification", "en").await;
    assert_eq!(
        signup(fr, "f1", Some("fr-CA"), None)
            .await
            .unwrap()
            .status(),
        202
    );
    one_email(&app, fr, "verification", "en").await;
    // A malformed locale is a clear 400, and nothing is written.
    let bad = signup("bad@example.com", "x1", Some("de_AT<script>"), None)
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let problem: Value = bad.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("locale"),
        "{problem}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_users WHERE email = 'bad@example.com'")
            .await,
        0
    );
    // A German account: a stranger's signup in English gets the owner a German notice, and
    // does not change the account's language.
    let owner = "otto@example.com";
    signup(owner, "o1", Some("de"), None).await.unwrap();
    let link = one_email(&app, owner, "verification", "de").await;
    let verified = app
        .post(
            "/v1/verify",
            "ov",
            &json!({ "token": crate::support::token_in(&link) }),
        )
        .await;
    assert_eq!(verified.status(), 200);
    app.inbox.clear();
    signup(owner, "o2", Some("en"), Some("en")).await.unwrap();
    one_email(&app, owner, "signup_notice", "de").await;
    // A reset asked for in English is English; the next email without a locale is German again.
    app.inbox.clear();
    let reset = with_locale(email(owner), "en");
    assert_eq!(
        app.post("/v1/password-reset", "r1", &reset).await.status(),
        202
    );
    one_email(&app, owner, "password_reset", "en").await;
    app.inbox.clear();
    assert_eq!(
        app.post("/v1/magic-link", "m1", &email(owner))
            .await
            .status(),
        202
    );
    one_email(&app, owner, "magic_link", "de").await;
    let german =
        "SELECT count(*) FROM oncely_users WHERE email = 'otto@example.com' AND locale = 'de'";
    assert_eq!(app.count(german).await, 1);
    // A stranger who signs up first with the owner's address names no language for the owner:
    // the owner's own signup (a backend's: no locale, no Accept-Language) is English, and so is
    // the account once the owner verifies with that link.
    let victim = "vera@example.com";
    signup(victim, "stranger", Some("de"), Some("de"))
        .await
        .unwrap();
    app.emails_to(victim, 1).await;
    app.inbox.clear();
    signup(victim, "owner", None, None).await.unwrap();
    let own = one_email(&app, victim, "verification", "en").await;
    let presented = json!({ "token": crate::support::token_in(&own) });
    assert_eq!(app.post("/v1/verify", "vv", &presented).await.status(), 200);
    app.inbox.clear();
    signup(victim, "stranger-again", Some("de"), Some("de"))
        .await
        .unwrap();
    one_email(&app, victim, "signup_notice", "en").await;
    let untouched =
        "SELECT count(*) FROM oncely_users WHERE email = 'vera@example.com' AND locale IS NULL";
    assert_eq!(app.count(untouched).await, 1);
}

/// Runs `oncely tenant set NAME args…` with `env`; (success, stdout, stderr).
async fn tenant_set(app: &TestApp, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"));
    command
        .args(["tenant", "set"])
        .args(args)
        .args(["--database-url", &app.database_url])
        .env_remove("ONCELY_MAIL_FROM")
        .env_remove("ONCELY_MAIL_FROM_DOMAINS");
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().await.unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn tenant_branding_names_the_product_and_the_sender_and_is_inert_in_html(
    url: String,
    _db: TestDb,
) {
    // The service may send as acme.test (ONCELY_MAIL_FROM_DOMAINS on `serve`); `tenant set`
    // checks against its own environment.
    let app = app_with_mail_caps(&url, 100, 1000, |s| {
        s.brand.from_domains = vec!["acme.test".into()];
    })
    .await;
    let key = app.create_tenant("acme").await;
    // A sender on a domain the mailer may not send as: refused, one line, nothing changed.
    let (ok, _, stderr) = tenant_set(
        &app,
        &["acme", "--mail-from", "Acme <hello@acme.test>"],
        &[],
    )
    .await;
    assert!(!ok);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("acme.test") && stderr.contains("ONCELY_MAIL_FROM_DOMAINS"),
        "{stderr}"
    );
    let branded = "SELECT count(*) FROM oncely_tenants WHERE mail_from IS NOT NULL";
    assert_eq!(app.count(branded).await, 0);
    // The default tenant's branding is the service's settings.
    let (ok, _, stderr) = tenant_set(&app, &["default", "--product-name", "X"], &[]).await;
    assert!(!ok && stderr.contains("ONCELY_PRODUCT_NAME"), "{stderr}");
    // Bad values, each refused.
    for bad in [
        &["acme", "--product-name", "Acme\nBcc: x@evil.example"][..],
        &["acme", "--support-email", "not an address"],
        &[
            "acme",
            "--mail-from",
            "hello@acme.test\r\nBcc: x@evil.example",
        ],
    ] {
        let (ok, _, stderr) =
            tenant_set(&app, bad, &[("ONCELY_MAIL_FROM_DOMAINS", "acme.test")]).await;
        assert!(!ok, "{bad:?}: {stderr}");
    }
    // Allowed once the domain is one the mailer may send as.
    let hostile = "<script>alert(1)</script> Acme";
    let args = [
        "acme",
        "--mail-from",
        "Acme <hello@acme.test>",
        "--product-name",
        hostile,
        "--support-email",
        "Help@Acme.test",
    ];
    let (ok, stdout, stderr) =
        tenant_set(&app, &args, &[("ONCELY_MAIL_FROM_DOMAINS", "acme.test")]).await;
    assert!(ok, "{stderr}");
    assert!(stdout.contains("help@acme.test"), "{stdout}");
    let ada = "ada@example.com";
    let signup = app.post_as(&key, "/v1/signup", "s1", &email(ada)).await;
    assert_eq!(signup.status(), 202);
    let email_ = one_email(&app, ada, "verification", "en").await;
    sent_as(&email_.raw, "Acme <hello@acme.test>", "help@acme.test");
    assert!(
        email_.text.contains(&format!("Welcome to {hostile}!")),
        "{}",
        email_.text
    );
    let html = email_.html.unwrap();
    assert!(!html.contains("<script>"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt; Acme"),
        "{html}"
    );
    // `tenant list --json` shows it; `""` gives the service's back.
    let (ok, _, stderr) = tenant_set(
        &app,
        &["acme", "--product-name", "", "--mail-from", ""],
        &[],
    )
    .await;
    assert!(ok, "{stderr}");
    app.inbox.clear();
    app.post_as(&key, "/v1/signup", "s2", &email(ada)).await;
    let again = one_email(&app, ada, "verification", "en").await;
    let host = app.base.trim_start_matches("http://");
    assert!(
        again.text.contains(&format!("Welcome to acme on {host}!")),
        "{}",
        again.text
    );
    sent_as(&again.raw, "oncely@localhost", "help@acme.test");
}

/// Asserts that the raw message `raw` is from `from` with replies to `reply_to`.
fn sent_as(raw: &str, from: &str, reply_to: &str) {
    assert!(raw.contains(&format!("From: {from}")), "{raw}");
    assert!(raw.contains(&format!("Reply-To: {reply_to}")), "{raw}");
}

/// A templates directory with `files` (path, text).
fn templates_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// `oncely ARGS…` with `env`: (exit code, stdout, stderr).
/// `templates check --dir <dir> --database-url <database>`.
fn templates_check<'a>(dir: &'a str, database: &'a str) -> [&'a str; 6] {
    [
        "templates",
        "check",
        "--dir",
        dir,
        "--database-url",
        database,
    ]
}

async fn oncely(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"));
    command.args(args).env_remove("ONCELY_TEMPLATES");
    for (k, v) in env {
        command.env(k, v);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const BROKEN: &str =
    "{% extends \"layout.txt\" %}\n{% block body %}\nHello {{ recipient }\n{% endblock %}\n";

#[tokio::test]
async fn a_broken_override_stops_serve_and_worker_with_one_line_and_check_lists_it() {
    let dir = templates_dir(&[("acme/de/verification.txt", BROKEN)]);
    let file = dir.path().join("acme/de/verification.txt");
    let file = file.display().to_string();
    let database = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", database.path().join("o.db").display());
    let templates = dir.path().display().to_string();
    let env = [("ONCELY_TEMPLATES", templates.as_str())];
    for command in [
        &["serve", "--bind", "127.0.0.1:0", "--database-url", &sqlite][..],
        &[
            "worker",
            "--database-url",
            &sqlite,
            "--mailer",
            "smtp://127.0.0.1:1",
        ],
    ] {
        let (code, _, stderr) = oncely(command, &env).await;
        assert_eq!(code, Some(1), "{command:?}: {stderr}");
        let line = stderr.trim();
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.contains("ONCELY_TEMPLATES"), "{line}");
        assert!(line.contains(&format!("{file}:3:")), "{line}");
        assert!(line.contains("syntax error"), "{line}");
    }
    // Nothing was created: refused before anything connected.
    assert!(!database.path().join("o.db").exists());
    // `templates check` lists each problem; with --json, a document.
    let dir_arg = dir.path().display().to_string();
    let (code, stdout, stderr) = oncely(&["templates", "check", "--dir", &dir_arg], &[]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stdout.starts_with(&format!("{file}:3: syntax error")),
        "{stdout}"
    );
    assert!(stderr.contains("problem(s)"), "{stderr}");
    let (code, stdout, _) = oncely(&["templates", "check", "--dir", &dir_arg, "--json"], &[]).await;
    assert_eq!(code, Some(1));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["problems"][0]["line"], 3);
    // The embedded templates alone are fine.
    let (code, stdout, stderr) = oncely(&["templates", "check"], &[]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("templates OK"), "{stdout}");
}

#[tokio::test]
async fn preview_writes_the_message_as_it_would_be_sent() {
    let dir = templates_dir(&[(
        "_default/de/magic_link.subject",
        "Anmelden bei {{ product_name }}\n",
    )]);
    let dir_arg = dir.path().display().to_string();
    let args = [
        "templates",
        "preview",
        "magic_link",
        "--locale",
        "de-AT",
        "--dir",
        &dir_arg,
        "--product-name",
        "Acme",
        "--public-url",
        "https://accounts.acme.test",
    ];
    let (code, stdout, stderr) = oncely(&[&args[..], &["--part", "subject"]].concat(), &[]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "Anmelden bei Acme\n");
    let (_, html, _) = oncely(&[&args[..], &["--part", "html"]].concat(), &[]).await;
    assert!(
        html.contains("href=\"https://accounts.acme.test/v1/magic-link/consume?token="),
        "{html}"
    );
    assert!(html.contains("15 Minuten"), "{html}");
    let (code, eml, _) = oncely(&args, &[]).await;
    assert_eq!(code, Some(0));
    assert!(eml.contains("multipart/alternative"), "{eml}");
    assert!(
        eml.contains("text/plain") && eml.contains("text/html"),
        "{eml}"
    );
    let (code, _, stderr) = oncely(&["templates", "preview", "welcome"], &[]).await;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("verification, password_reset"), "{stderr}");
}

/// A template that passes the check (its sample recipient is short) but fails for a long
/// address: the job ends dead with the file and the reason, nothing half-rendered is sent, and
/// other emails go on.
#[tokio::test]
async fn a_template_that_fails_at_send_time_ends_its_job_dead_and_sends_nothing() {
    let trap = "{% extends \"layout.txt\" %}\n{% block body %}\n{% if recipient|length > 30 %}{{ recipient[100] }}{% endif %}\n{{ link }}\n{% endblock %}\n";
    let dir = templates_dir(&[("_default/en/verification.txt", trap)]);
    let (url, _db) = crate::support::sqlite_db().await;
    let path = dir.path().to_path_buf();
    let app = app_with_mail_caps(&url, 100, 1000, |s| s.templates = Some(path)).await;
    let long = "a-rather-long-address-for-this-test@example.com";
    assert_eq!(
        app.post("/v1/signup", "l1", &email(long)).await.status(),
        202
    );
    let short = "bo@example.com";
    assert_eq!(
        app.post("/v1/signup", "s1", &email(short)).await.status(),
        202
    );
    assert_eq!(app.emails_to(short, 1).await.len(), 1);
    let dead =
        "SELECT count(*) FROM oncely_outbox WHERE kind = 'email.verification' AND status = 'dead'";
    assert!(crate::requests::wait_for_count(&app, dead, Duration::from_secs(10), |n| n == 1).await);
    let reason: String = crate::support::scalar(
        &url,
        "SELECT last_error FROM oncely_outbox WHERE status = 'dead'",
    )
    .await;
    assert!(reason.contains("does not render"), "{reason}");
    assert!(
        reason.contains(
            &Path::new("_default/en/verification.txt")
                .display()
                .to_string()
        ),
        "{reason}"
    );
    assert!(
        app.inbox.messages(Some(long)).is_empty(),
        "nothing half-rendered is sent"
    );
}

/// Review of issue 18: a tenant folder with a typo (`acmee`) or the wrong case (`Acme`) fell
/// back in silence. `serve` refuses to start; `templates check` says so when the database
/// opens, and says the folders were not checked when it does not.
#[tokio::test]
async fn a_tenant_folder_that_names_no_tenant_stops_serve_and_check_says_so() {
    let dir = templates_dir(&[("acmee/en/verification.subject", "Hi {{ product_name }}\n")]);
    let dir_arg = dir.path().display().to_string();
    let database = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", database.path().join("o.db").display());
    let (code, _, stderr) = oncely(&["migrate", "--database-url", &sqlite], &[]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = oncely(
        &["tenant", "create", "acme", "--database-url", &sqlite],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    let env = [("ONCELY_TEMPLATES", dir_arg.as_str())];
    let serve = ["serve", "--bind", "127.0.0.1:0", "--database-url", &sqlite];
    let (code, _, stderr) = oncely(&serve, &env).await;
    assert_eq!(code, Some(1), "{stderr}");
    let line = stderr.trim();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains("acmee") && line.contains("name no tenant"),
        "{line}"
    );
    let (code, stdout, _) = oncely(&templates_check(&dir_arg, &sqlite), &[]).await;
    assert_eq!(code, Some(1));
    assert!(stdout.contains("acmee"), "{stdout}");
    // Without a database to ask, the folders are not checked, and the report says so.
    let nowhere = format!("sqlite://{}", database.path().join("none.db").display());
    let (code, stdout, stderr) = oncely(&templates_check(&dir_arg, &nowhere), &[]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("tenant folders not checked"), "{stdout}");
}
