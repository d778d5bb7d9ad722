//! Operators: `oncely outbox list|show|retry` and `oncely worker --kinds`.

use std::time::{Duration, Instant};

use oncely_cli::commands::tenant as ops;
use oncely_inbox::{Faults, Rejection};
use oncely_server::accounts::Accounts;
use oncely_server::settings::Settings;
use oncely_testdb::TestDb;
use serde_json::{Value, json};

use crate::requests::{app_with_faults, app_with_mail_caps, assert_drained};
use crate::support::{
    SECRET, both_databases, execute, on_backend, oncely_binary, open_backend, run_to_end,
    spawn_app_with_inbox, start_inbox,
};

pub async fn oncely(args: &[&str]) -> (bool, String) {
    let (code, stdout, stderr) = run_to_end(&mut oncely_binary(args)).await;
    (code == 0, format!("{stdout}{stderr}"))
}

/// Inbox faults: the next `n` emails refused for good.
fn rejecting(n: u32) -> Faults {
    Faults {
        reject_next: n,
        rejection: Rejection::Permanent,
        ..Faults::default()
    }
}

/// The operation key of the first job `oncely outbox list` printed.
pub fn first_listed_key(listed: &str) -> &str {
    listed
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .nth(4)
        .unwrap()
}

both_databases!(
    a_dead_job_is_listed_with_its_reason_shown_with_its_attempts_and_redriven_with_the_same_key
);

async fn a_dead_job_is_listed_with_its_reason_shown_with_its_attempts_and_redriven_with_the_same_key(
    url: String,
    _db: TestDb,
) {
    let app = app_with_faults(&url, rejecting(1)).await;
    app.post("/v1/signup", "s", &json!({ "email": "bounce@example.com" }))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app
        .count("SELECT count(*) FROM oncely_outbox WHERE status = 'dead'")
        .await
        == 0
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let (ok, listed) =
        oncely(&["outbox", "list", "--status", "dead", "--database-url", &url]).await;
    assert!(ok, "{listed}");
    assert!(
        listed.contains("email.verification") && listed.contains("550"),
        "{listed}"
    );
    let key = first_listed_key(&listed).to_owned();
    assert!(key.starts_with("verification:default:"), "{key}");

    let (ok, dead) = oncely(&["outbox", "dead", "--database-url", &url]).await;
    assert!(ok && dead.contains(&key), "{dead}");

    let (ok, shown) = oncely(&["outbox", "show", &key, "--database-url", &url]).await;
    assert!(ok, "{shown}");
    assert!(
        shown.contains("attempts: 1") && shown.contains("dead since"),
        "{shown}"
    );
    let attempt = shown
        .lines()
        .find(|line| line.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("no attempt 1: {shown}"));
    assert!(
        attempt.contains(" dead ") && attempt.contains("550"),
        "{attempt}"
    );
    assert!(
        !shown.contains("bounce@example.com"),
        "job payloads carry ids, not addresses; the frozen email shows its field names only"
    );
    assert!(shown.contains("(field names only)"), "{shown}");
    let (_, shown, _) = oncely_json(&url, &["outbox", "show", &key]).await;
    assert!(
        shown["frozen"]
            .as_array()
            .unwrap()
            .iter()
            .all(Value::is_string),
        "{shown}"
    );
    assert!(!shown.to_string().contains("bounce@example.com"), "{shown}");

    let (ok, retried) = oncely(&["outbox", "retry", &key, "--database-url", &url]).await;
    assert!(ok && retried.contains("re-driven"), "{retried}");
    let (ok, again) = oncely(&["outbox", "retry", &key, "--database-url", &url]).await;
    assert!(!ok && again.contains("only dead jobs"), "{again}");
    // The in-process worker finds the re-driven job at its next poll and delivers it.
    assert_eq!(app.emails_to("bounce@example.com", 1).await.len(), 1);
}

both_databases!(skipped_emails_are_listed_as_skipped_and_are_neither_dead_nor_redriven);

/// Issue 15, item 4: an email over a cap and a decoy (a reset for an address with no account)
/// ended `dead`, listed by `outbox dead` with the real failures, counted and re-driven by
/// `outbox retry`. They are `skipped`, with their reason.
async fn skipped_emails_are_listed_as_skipped_and_are_neither_dead_nor_redriven(
    url: String,
    _db: TestDb,
) {
    let app = app_with_mail_caps(&url, 1, 1000, |_| {}).await;
    for key in ["s1", "s2"] {
        app.post("/v1/signup", key, &json!({ "email": "capped@example.com" }))
            .await;
    }
    app.post(
        "/v1/password-reset",
        "r1",
        &json!({ "email": "nobody@example.com" }),
    )
    .await;
    assert_drained(&app, Duration::from_secs(10)).await;
    assert_eq!(app.emails_to("capped@example.com", 1).await.len(), 1);

    let (ok, dead) = oncely(&["outbox", "dead", "--database-url", &url]).await;
    assert!(ok, "{dead}");
    assert_eq!(dead.lines().count(), 1, "only the header: {dead}");
    let (ok, skipped) = oncely(&[
        "outbox",
        "list",
        "--status",
        "skipped",
        "--database-url",
        &url,
    ])
    .await;
    assert!(ok, "{skipped}");
    let rows: Vec<&str> = skipped.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{skipped}");
    assert!(
        rows.iter().all(|row| row.contains(" skipped ")),
        "{skipped}"
    );
    assert!(
        rows.iter()
            .any(|row| row.contains("email.verification")
                && row.contains("suppressed: over 1 emails")),
        "{skipped}"
    );
    assert!(
        rows.iter().any(|row| row.contains("email.password_reset")
            && row.contains("no account for this address")),
        "{skipped}"
    );

    let (ok, dry_run) = oncely(&[
        "outbox",
        "retry",
        "--reason-like",
        "suppressed",
        "--database-url",
        &url,
    ])
    .await;
    assert!(ok && dry_run.contains("0 dead jobs match"), "{dry_run}");
    let (ok, every) = oncely(&[
        "outbox",
        "retry",
        "--since",
        "1h",
        "--yes",
        "--database-url",
        &url,
    ])
    .await;
    assert!(ok && every.contains("re-driven: 0 dead jobs"), "{every}");
    let key = rows[0].split_whitespace().nth(4).unwrap();
    let (ok, one) = oncely(&["outbox", "retry", key, "--database-url", &url]).await;
    assert!(
        !ok && one.contains("was deliberately not sent (no account for this address")
            && one.contains("skipped jobs are never re-driven"),
        "{one}"
    );
    // For scripts: its own error code (exit 4, refused), and `show` says when it was skipped.
    let (code, _, error) = oncely_json(&url, &["outbox", "retry", key]).await;
    assert_eq!((code, &error["error"]), (4, &json!("skipped")), "{error}");
    let (code, shown, _) = oncely_json(&url, &["outbox", "show", key]).await;
    assert_eq!(code, 0);
    assert_eq!(shown["status"], "skipped", "{shown}");
    assert!(shown["skipped_at"].is_string(), "{shown}");
    assert!(shown["dead_at"].is_null(), "{shown}");
    let (ok, human) = oncely(&["outbox", "show", key, "--database-url", &url]).await;
    assert!(ok && human.contains("skipped at "), "{human}");
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_outbox WHERE status = 'skipped'")
            .await,
        2
    );
}

both_databases!(dead_jobs_are_redriven_in_bulk_after_a_dry_run_each_with_its_delivery_key);

/// The delivery key `oncely outbox show` prints for `key`.
async fn delivery_key(url: &str, key: &str) -> String {
    let (code, shown, error) = oncely_json(url, &["outbox", "show", key]).await;
    assert_eq!(code, 0, "{error}");
    shown["delivery_key"].as_str().unwrap().to_owned()
}

/// Issue 14, items 2 and 8: `oncely outbox retry --kind --since --reason-like` counts first
/// (changing nothing) and warns about keys the provider no longer deduplicates; with `--yes`
/// it re-drives exactly the matching dead jobs, each with its delivery key.
async fn dead_jobs_are_redriven_in_bulk_after_a_dry_run_each_with_its_delivery_key(
    url: String,
    _db: TestDb,
) {
    let app = app_with_faults(&url, rejecting(3)).await;
    for i in 0..3 {
        let email = format!("bulk{i}@example.com");
        app.post("/v1/signup", &format!("s{i}"), &json!({ "email": email }))
            .await;
    }
    let dead = "SELECT count(*) FROM oncely_outbox WHERE status = 'dead'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(dead).await < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(app.count(dead).await, 3);
    let (ok, listed) = oncely(&["outbox", "dead", "--database-url", &url]).await;
    assert!(ok, "{listed}");
    let keys: Vec<String> = listed
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().nth(4).unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 3, "{listed}");
    let mut delivery_keys = Vec::new();
    for key in &keys {
        delivery_keys.push(delivery_key(&url, key).await);
    }
    // One of them had lost an answer more than a day ago: the provider forgot its key.
    let ago = if url.starts_with("postgres") {
        "now() - interval '25 hours'"
    } else {
        "(CAST(strftime('%s', 'now') AS INTEGER) - 25 * 3600) * 1000"
    };
    execute(
        &url,
        &format!(
            "UPDATE oncely_outbox_attempts SET result = 'unknown', finished_at = {ago}
              WHERE job_id = (SELECT id FROM oncely_outbox WHERE operation_key = '{}')",
            keys[0]
        ),
    )
    .await;

    let (ok, none) = oncely(&["outbox", "retry", "--database-url", &url]).await;
    assert!(
        !ok && none.contains("--kind"),
        "a filter is required: {none}"
    );
    let filters = [
        "--kind",
        "email.verification",
        "--since",
        "1h",
        "--reason-like",
        "REJECTED",
    ];
    let retry = |extra: &[&str]| {
        let mut args = vec!["outbox", "retry", "--database-url", url.as_str()];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        oncely(&args).await
    };
    let (ok, dry) = run(retry(&filters)).await;
    assert!(ok, "{dry}");
    assert!(dry.contains("dry run: 3 dead jobs match"), "{dry}");
    assert!(
        keys.iter().all(|key| dry.contains(key.as_str())),
        "a sample: {dry}"
    );
    assert!(dry.contains("550"), "with their reasons: {dry}");
    assert!(
        dry.contains("1 of them had an attempt with an unknown outcome"),
        "{dry}"
    );
    assert!(dry.contains("--yes"), "{dry}");
    assert_eq!(app.count(dead).await, 3, "a dry run changes nothing");
    let (ok, other) = run(retry(&["--reason-like", "401"])).await;
    assert!(
        ok && other.contains("dry run: 0 dead jobs match"),
        "{other}"
    );
    let (ok, later) = run(retry(&["--since", "2999-01-01T00:00:00Z"])).await;
    assert!(
        ok && later.contains("dry run: 0 dead jobs match"),
        "{later}"
    );
    let (ok, bad) = run(retry(&["--since", "last tuesday"])).await;
    assert!(!ok && bad.contains("RFC 3339"), "{bad}");

    let mut with_yes = filters.to_vec();
    with_yes.push("--yes");
    let (ok, done) = run(retry(&with_yes)).await;
    assert!(ok && done.contains("re-driven: 3 dead jobs"), "{done}");
    for i in 0..3 {
        let email = format!("bulk{i}@example.com");
        assert_eq!(app.emails_to(&email, 1).await.len(), 1, "{email}");
    }
    for (key, before) in keys.iter().zip(&delivery_keys) {
        assert_eq!(
            &delivery_key(&url, key).await,
            before,
            "{key} keeps its key"
        );
    }
}

both_databases!(a_job_that_dies_after_the_dry_run_is_not_redriven_by_the_command_it_printed);

/// Signs up `address` while the inbox rejects it for good, and waits until `dead` jobs are.
async fn signup_that_dies(app: &crate::support::TestApp, address: &str, dead: i64) {
    app.inbox.set_faults(Faults {
        reject_next: 1,
        rejection: Rejection::Permanent,
        ..Faults::default()
    });
    app.post("/v1/signup", address, &json!({ "email": address }))
        .await;
    let query = "SELECT count(*) FROM oncely_outbox WHERE status = 'dead'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count(query).await < dead && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(app.count(query).await, dead, "{address}'s job died");
}

/// Runs `oncely` with `args` against `url`.
async fn oncely_on(url: &str, args: &[&str]) -> (bool, String) {
    let mut args = args.to_vec();
    args.extend(["--database-url", url]);
    oncely(&args).await
}

/// Review of issue 14, A: `retry --reason-like injected` counted 4 dead jobs, two more died,
/// and the same command with `--yes` re-drove 6 (and a relative `--since` moved in between).
/// The dry run prints the exact command: absolute `--since`, `--until` its own moment and
/// `--expect` its count. Run later, that command leaves out the job that died after the dry
/// run; the filters alone with a stale `--expect` refuse and change nothing; `--until` bounds
/// a dry run too.
async fn a_job_that_dies_after_the_dry_run_is_not_redriven_by_the_command_it_printed(
    url: String,
    _db: TestDb,
) {
    let app = app_with_faults(&url, Faults::default()).await;
    signup_that_dies(&app, "early1@example.com", 1).await;
    signup_that_dies(&app, "early2@example.com", 2).await;
    let filters = [
        "outbox",
        "retry",
        "--since",
        "1h",
        "--reason-like",
        "rejected",
    ];
    let (ok, dry) = oncely_on(&url, &filters).await;
    assert!(ok && dry.contains("dry run: 2 dead jobs match"), "{dry}");
    let printed = dry
        .lines()
        .find_map(|line| line.trim().strip_prefix("oncely "))
        .unwrap_or_else(|| panic!("no command to run: {dry}"));
    let command = shlex::split(printed).unwrap();
    // `--name=value`, so that a value starting with `-` stays a value.
    let value = |name: &str| {
        command
            .iter()
            .find_map(|word| word.strip_prefix(&format!("{name}=")))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("{name} missing: {printed}"))
    };
    for moment in ["--since", "--until"] {
        let at = value(moment);
        assert!(
            time::OffsetDateTime::parse(&at, &time::format_description::well_known::Rfc3339)
                .is_ok(),
            "{moment} is an absolute time: {printed}"
        );
    }
    assert_eq!(value("--reason-like"), "rejected");
    assert_eq!(value("--expect"), "2");
    assert!(command.ends_with(&["--yes".to_owned()]), "{printed}");
    // For scripts: the same count, sample and command, the command's arguments as an array.
    let (code, dry_json, _) = oncely_json(&url, &filters).await;
    assert_eq!((code, &dry_json["matching"]), (0, &json!(2)), "{dry_json}");
    assert_eq!(dry_json["sample"].as_array().unwrap().len(), 2);
    let args: Vec<&str> = dry_json["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.starts_with(&["outbox", "retry"]) && args.contains(&"--expect=2"),
        "{dry_json}"
    );
    assert_eq!(
        shlex::split(dry_json["command"].as_str().unwrap()).unwrap()[1..],
        args
    );
    let until = value("--until");

    // A third job dies after the dry run.
    signup_that_dies(&app, "late@example.com", 3).await;
    let (ok, now) = oncely_on(&url, &filters).await;
    assert!(ok && now.contains("dry run: 3 dead jobs match"), "{now}");
    let mut bounded = filters.to_vec();
    bounded.extend(["--until", until.as_str()]);
    let (ok, then) = oncely_on(&url, &bounded).await;
    assert!(
        ok && then.contains("dry run: 2 dead jobs match"),
        "--until bounds it: {then}"
    );
    assert!(!then.contains("late@"), "{then}");
    let (ok, none) = oncely_on(
        &url,
        &["outbox", "retry", "--until", "2000-01-01T00:00:00Z"],
    )
    .await;
    assert!(ok && none.contains("dry run: 0 dead jobs match"), "{none}");
    let (ok, backwards) = oncely_on(
        &url,
        &[
            "outbox",
            "retry",
            "--since",
            "1h",
            "--until",
            "2000-01-01T00:00:00Z",
        ],
    )
    .await;
    assert!(
        !ok && backwards.contains("is before --since"),
        "{backwards}"
    );
    let (ok, no_yes) = oncely_on(&url, &["outbox", "retry", "--kind", "x", "--expect", "2"]).await;
    assert!(
        !ok && no_yes.contains("--yes"),
        "--expect needs --yes: {no_yes}"
    );

    // The filters with the dry run's count, but without its --until: 3 match now, not 2.
    let mut stale = filters.to_vec();
    stale.extend(["--expect", "2", "--yes"]);
    let (ok, refused) = oncely_on(&url, &stale).await;
    assert!(!ok, "a count that differs fails: {refused}");
    assert!(
        refused.contains("refused: 3 dead jobs match") && refused.contains("nothing was changed"),
        "{refused}"
    );
    let (code, _, error) = oncely_json(&url, &stale).await;
    assert_eq!(
        (code, &error["error"]),
        (4, &json!("count_differs")),
        "{error}"
    );
    let dead = "SELECT count(*) FROM oncely_outbox WHERE status = 'dead'";
    assert_eq!(app.count(dead).await, 3, "nothing was re-driven");

    // The printed command re-drives exactly the two the dry run counted.
    let args: Vec<&str> = command.iter().map(String::as_str).collect();
    let (ok, done) = oncely_on(&url, &args).await;
    assert!(ok && done.contains("re-driven: 2 dead jobs"), "{done}");
    for address in ["early1@example.com", "early2@example.com"] {
        assert_eq!(app.emails_to(address, 1).await.len(), 1, "{address}");
    }
    assert_eq!(app.count(dead).await, 1, "the late job stays dead");
    assert!(app.inbox.messages(Some("late@example.com")).is_empty());
}

#[tokio::test]
async fn a_worker_for_an_unknown_kind_refuses_to_start_and_names_the_known_ones() {
    let db = oncely_testdb::TestSqlite::new();
    let (ok, text) = oncely(&[
        "worker",
        "--database-url",
        db.url(),
        "--mailer",
        "smtp://127.0.0.1:1",
        "--secret",
        SECRET,
        "--kinds",
        "email.invite,charge",
    ])
    .await;
    assert!(!ok);
    assert!(
        text.contains("no handler for job kind \"charge\"") && text.contains("email.verification"),
        "{text}"
    );
    assert!(
        text.contains("webhook"),
        "webhook deliveries are a kind: {text}"
    );
}

both_databases!(tenant_create_tells_a_taken_name_from_an_unavailable_database);

/// Regression: `oncely tenant create` said "already exists" for every failure, a database
/// outage included.
async fn tenant_create_tells_a_taken_name_from_an_unavailable_database(url: String, _db: TestDb) {
    // Operator commands run on a migrated database (they do not migrate).
    crate::support::migrate(&url).await;
    let (ok, created) = oncely(&["tenant", "create", "acme", "--database-url", &url]).await;
    assert!(ok, "{created}");
    let (ok, again) = oncely(&["tenant", "create", "acme", "--database-url", &url]).await;
    assert!(
        !ok && again.contains("tenant acme already exists"),
        "{again}"
    );
    // The gateway's namespace and the templates' default folder are no tenant names.
    for reserved in [
        "gateway:tenant:acme",
        "gateway:anonymous",
        "Gateway:x",
        "_default",
    ] {
        let (ok, refused) = oncely(&["tenant", "create", reserved, "--database-url", &url]).await;
        assert!(
            !ok && refused.contains("choose another name"),
            "{reserved}: {refused}"
        );
    }
    let unavailable = on_backend!(url, create_tenant_without_a_database(&url));
    assert!(
        unavailable.contains("tenant other was not created: the database is unavailable")
            && !unavailable.contains("already exists"),
        "{unavailable}"
    );
}

/// What creating a tenant says when the database stopped answering (its pool closed).
async fn create_tenant_without_a_database<B: Accounts>(url: &str) -> String {
    let backend = open_backend::<B>(url).await;
    backend.pool().close().await;
    let tenant = ops::tenant_name("other").unwrap();
    let error = ops::create_tenant(&backend, &tenant).await.unwrap_err();
    format!("{error:#}")
}

both_databases!(prune_deletes_expired_keys_old_history_and_counters_but_keeps_pending_work);
crate::support::both_empty_databases!(
    a_database_a_newer_release_migrated_still_lets_this_release_start
);

/// Rolling upgrades: after a newer release ran `oncely migrate`, this release's `oncely migrate`
/// has nothing to do and its development `serve` still starts — not "migration N was previously
/// applied but is missing". (A production process serves it too, with a warning:
/// tests/it/schema.rs.)
async fn a_database_a_newer_release_migrated_still_lets_this_release_start(
    url: String,
    _db: TestDb,
) {
    let (code, migrated, _) = oncely_json(&url, &["migrate"]).await;
    assert_eq!(code, 0);
    let libraries = migrated["libraries"].as_array().unwrap();
    assert_eq!(
        libraries
            .iter()
            .map(|l| l["library"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["idempotency keys", "outbox", "accounts"]
    );
    assert!(
        libraries.iter().all(|l| l["applied"].as_u64() >= Some(1)
            && l["schema"].as_str() >= Some("0001")
            && l["unknown"] == 0),
        "{migrated}"
    );
    assert_eq!(
        migrated["applied"].as_u64(),
        Some(
            libraries
                .iter()
                .map(|l| l["applied"].as_u64().unwrap())
                .sum()
        ),
        "{migrated}"
    );
    let database = if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    assert_eq!(migrated["database"], database);
    for table in [
        "_oncely_server_migrations",
        "_oncely_outbox_migrations",
        "_oncely_idempotency_migrations",
    ] {
        let newer = if url.starts_with("postgres") {
            format!(
                "INSERT INTO {table} (version, description, success, checksum, execution_time)
                 VALUES (9999, 'from a newer release', true, '\\x00'::bytea, 1)"
            )
        } else {
            format!(
                "INSERT INTO {table} (version, description, success, checksum, execution_time)
                 VALUES (9999, 'from a newer release', 1, x'00', 1)"
            )
        };
        crate::support::execute(&url, &newer).await;
    }
    let (ok, text) = oncely(&["migrate", "--database-url", &url]).await;
    assert!(
        ok,
        "this release migrates (nothing to do) on a newer database: {text}"
    );
    let (_, migrated, _) = oncely_json(&url, &["migrate"]).await;
    assert_eq!(migrated["applied"], 0, "{migrated}");
    for library in migrated["libraries"].as_array().unwrap() {
        assert_eq!(
            (&library["schema"], &library["unknown"]),
            (&json!("9999"), &json!(1)),
            "the latest version in each history, and one this binary does not know: {migrated}"
        );
    }
    let app = crate::support::spawn_app_on(&url, |_| {}).await;
    assert_eq!(app.get("/readyz").await.status(), 200);
}

async fn prune_deletes_expired_keys_old_history_and_counters_but_keeps_pending_work(
    url: String,
    _db: TestDb,
) {
    let (inbox, running) = start_inbox(Faults::default()).await;
    let short = |s: &mut Settings| {
        s.lease = Duration::from_millis(300);
    };
    let app = spawn_app_with_inbox(&url, inbox, running, short).await;
    app.post("/v1/signup", "old", &json!({ "email": "old@example.com" }))
        .await;
    assert_eq!(app.emails_to("old@example.com", 1).await.len(), 1);
    // An hour passes for what is there now: the key expires, the sent job and the email-cap
    // counters fall out of the retention below (1 s). The rows are aged, nothing sleeps.
    age_an_hour(&url).await;
    // A job that is still pending is never pruned, however old.
    app.inbox.set_faults(Faults {
        reject_next: 100,
        ..Faults::default()
    });
    app.post("/v1/signup", "new", &json!({ "email": "new@example.com" }))
        .await;

    let (ok, out) = oncely(&[
        "prune",
        "--database-url",
        &url,
        "--outbox-retention",
        "1s",
        "--mail-cap-window",
        "1s",
    ])
    .await;
    assert!(ok, "{out}");
    assert!(out.contains("1 idempotency keys, 1 outbox jobs"), "{out}");
    let (code, pruned, _) = oncely_json(
        &url,
        &[
            "prune",
            "--outbox-retention",
            "1s",
            "--mail-cap-window",
            "1s",
        ],
    )
    .await;
    assert_eq!(code, 0, "no progress bar or text around the document");
    assert_eq!(
        pruned,
        json!({ "keys": 0, "jobs": 0, "tokens": 0, "rate_limits": 0, "total": 0 }),
        "nothing left to prune"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_idempotency_keys")
            .await,
        1,
        "the fresh key stays"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_outbox WHERE status = 'pending'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_outbox WHERE status = 'sent'")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_outbox_attempts WHERE result = 'sent'")
            .await,
        0,
        "attempts go with their job"
    );
    // The expired key is free again: the same key is a new request now.
    let again = app
        .post("/v1/signup", "old", &json!({ "email": "old@example.com" }))
        .await;
    assert!(again.headers().get("idempotent-replayed").is_none());
}

/// Ages every idempotency key past its expiry, every finished outbox job and every email-cap
/// counter by an hour, in place (as if an hour had passed since they were written).
async fn age_an_hour(url: &str) {
    let (expired, an_hour_earlier) = if url.starts_with("postgres") {
        ("now() - interval '1 hour'", "sent_at - interval '1 hour'")
    } else {
        // Unix milliseconds.
        ("0", "sent_at - 3600000")
    };
    for sql in [
        format!("UPDATE oncely_idempotency_keys SET expires_at = {expired}"),
        format!("UPDATE oncely_outbox SET sent_at = {an_hour_earlier} WHERE status = 'sent'"),
        // Unix seconds in both.
        "UPDATE oncely_rate_limits SET window_start = window_start - 3600".to_owned(),
    ] {
        execute(url, &sql).await;
    }
}

#[tokio::test]
async fn serve_prunes_in_the_background_and_counts_it() {
    let db = oncely_testdb::TestSqlite::new();
    let short = |s: &mut Settings| {
        s.lease = Duration::from_millis(300);
        s.key_retention = Duration::from_secs(1);
        s.prune_interval = Duration::from_millis(300);
        s.outbox_retention = Duration::from_secs(1);
    };
    let app = crate::support::spawn_app_on(db.url(), short).await;
    app.post("/v1/signup", "k", &json!({ "email": "bg@example.com" }))
        .await;
    app.emails_to("bg@example.com", 1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.count("SELECT count(*) FROM oncely_outbox").await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        app.count("SELECT count(*) FROM oncely_idempotency_keys")
            .await,
        0
    );
    assert_eq!(app.count("SELECT count(*) FROM oncely_outbox").await, 0);
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains(r#"oncely_pruned_rows_total{table="jobs"}"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn key_show_tells_support_what_a_key_replays() {
    let db = oncely_testdb::TestSqlite::new();
    let app = crate::support::spawn_app_on(db.url(), |_| {}).await;
    app.post(
        "/v1/signup",
        "\"support-1\"",
        &json!({ "email": "help@example.com" }),
    )
    .await;
    let (ok, out) = oncely(&["key", "show", "support-1", "--database-url", db.url()]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("state: completed; replays status 202")
            && out.contains("\"status\":\"accepted\""),
        "{out}"
    );
    assert!(
        !out.contains("help@example.com"),
        "a stored answer holds no address"
    );
    let (code, shown, _) = oncely_json(db.url(), &["key", "show", "support-1"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        (&shown["state"], &shown["response"]["status"]),
        (&json!("completed"), &json!(202))
    );
    let fingerprint = shown["fingerprint"].as_str().unwrap();
    assert!(
        fingerprint.len() == 64 && fingerprint.chars().all(|c| c.is_ascii_hexdigit()),
        "{shown}"
    );
    assert!(
        out.contains(&format!("fingerprint: {fingerprint}")),
        "hex for people too: {out}"
    );
    let expires = time_in(&shown["expires_at"]);
    let retention = time::Duration::hours(24);
    let now = time::OffsetDateTime::now_utc();
    assert!(
        expires > now + retention - time::Duration::minutes(5) && expires <= now + retention,
        "ONCELY_KEY_RETENTION (24 h) from the request: {shown}"
    );
    assert!(out.contains("expires: ") && out.contains(" UTC"), "{out}");
    // Issue 15, item 5: a key that is not there is an exit code, not a success that says so.
    let (ok, out) = oncely(&["key", "show", "never-used", "--database-url", db.url()]).await;
    assert!(!ok && out.contains("not found"), "{out}");
    let (code, _, error) = oncely_json(db.url(), &["key", "show", "never-used"]).await;
    assert_eq!((code, &error["error"]), (3, &json!("not_found")), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_demo_storm_shows_one_account_and_one_email_per_intent() {
    let report = oncely_server::demo::run(3).await.unwrap();
    assert_eq!(report.requests, 33);
    assert_eq!(report.outcomes["created"], 3);
    assert_eq!(report.outcomes["mismatch"], 3);
    let answered_ok: usize = ["created", "replayed", "in_progress"]
        .iter()
        .map(|k| report.outcomes.get(k).copied().unwrap_or(0))
        .sum();
    assert_eq!(answered_ok, 30);
    assert_eq!(
        (report.users, report.emails, report.failed_attempts),
        (3, 3, 3)
    );
    assert!(report.one_per_intent());
    assert!(
        report
            .table()
            .contains("one account and one email per intent        yes"),
        "{}",
        report.table()
    );
}

/// `oncely demo` shows its story: the embedded service's log lines go to a file it names, not
/// between the lines of the story (they appear with `-v`).
#[tokio::test]
async fn the_demo_prints_its_story_and_keeps_the_service_logs_in_a_file() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["demo", "--intents", "1"])
        .env("RUST_LOG", "info")
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("the embedded service logs to")
            && stdout.contains("one account and one email per intent        yes"),
        "{stdout}"
    );
    assert!(!stderr.contains("INFO"), "{stderr}");
}

#[tokio::test]
async fn help_documents_every_setting_and_never_shows_a_secret() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["serve", "--help"])
        .env("ONCELY_SECRET", "super-secret-value-0123456789-abcdef")
        .env("ONCELY_MAILER_API_KEY", "re_secret_api_key")
        .env("DATABASE_URL", "postgres://user:db-password@host/db")
        .output()
        .await
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    for variable in [
        "DATABASE_URL",
        "ONCELY_ENV",
        "ONCELY_BIND",
        "ONCELY_SECRET",
        "ONCELY_PUBLIC_URL",
        "ONCELY_MAILER",
        "ONCELY_MAIL_FROM",
        "ONCELY_WORKERS",
        "ONCELY_KEY_RETENTION",
        "ONCELY_LEASE",
    ] {
        assert!(
            help.contains(variable),
            "{variable} is not documented in serve --help"
        );
    }
    for secret in ["super-secret-value", "re_secret_api_key", "db-password"] {
        assert!(!help.contains(secret), "{secret} leaked into --help");
    }
}

/// `oncely ARGS…` with `--json`: its exit code, its stdout (parsed when it succeeded: exactly
/// one JSON document) and its stderr (one JSON object when it failed).
async fn oncely_json(url: &str, args: &[&str]) -> (i32, Value, Value) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(args)
        .args(["--json", "--database-url", url])
        .output()
        .await
        .unwrap();
    let code = output.status.code().unwrap();
    let (stdout, stderr) = (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    );
    let parse = |text: &str| {
        serde_json::from_str::<Value>(text)
            .unwrap_or_else(|e| panic!("{args:?}: not one JSON document ({e}): {text:?}"))
    };
    if code == 0 {
        (code, parse(&stdout), Value::Null)
    } else if code == 2 {
        // A usage error: clap's own message.
        (code, Value::Null, Value::String(stderr))
    } else {
        assert!(
            stdout.is_empty(),
            "{args:?}: a failure prints nothing on stdout: {stdout}"
        );
        let last = stderr.lines().last().unwrap_or_default();
        (code, Value::Null, parse(last))
    }
}

/// An RFC 3339 time in a JSON document.
fn time_in(value: &Value) -> time::OffsetDateTime {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a time: {value}"));
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap()
}

both_databases!(outbox_commands_answer_scripts_in_json_and_number_attempts_across_re_drives);

/// Issue 15, item 5: `outbox list|dead|show|retry --json` print one JSON document each; `show`
/// finds a job by the id `list` prints, shows its times and numbers its attempts over its
/// whole life, marking the re-drive; `retry` tells "already sent", "still pending" and "no such
/// job" apart by exit code and error.
async fn outbox_commands_answer_scripts_in_json_and_number_attempts_across_re_drives(
    url: String,
    _db: TestDb,
) {
    let app = app_with_faults(&url, Faults::default()).await;
    signup_that_dies(&app, "twice@example.com", 1).await;

    let (code, listed, _) = oncely_json(&url, &["outbox", "list"]).await;
    assert_eq!(code, 0);
    let jobs = listed.as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{listed}");
    let job = &jobs[0];
    let (id, key) = (
        job["id"].as_i64().unwrap(),
        job["operation_key"].as_str().unwrap(),
    );
    assert_eq!(
        (job["status"].as_str(), job["attempts"].as_i64()),
        (Some("dead"), Some(1))
    );
    assert!(
        job["next_run_at"].is_null(),
        "a dead job does not run: {job}"
    );
    assert!(time_in(&job["created_at"]) <= time_in(&job["dead_at"]));
    let (code, dead, _) = oncely_json(&url, &["outbox", "dead"]).await;
    assert_eq!((code, dead[0]["id"].as_i64()), (0, Some(id)));

    let (code, by_id, _) = oncely_json(&url, &["outbox", "show", &id.to_string()]).await;
    assert_eq!(code, 0);
    assert_eq!(by_id["operation_key"], key, "found by the id list prints");
    let (_, by_key, _) = oncely_json(&url, &["outbox", "show", key]).await;
    assert_eq!(by_key["id"], id);
    assert_eq!(by_key["history"].as_array().unwrap().len(), 1);

    let (code, redriven, _) = oncely_json(&url, &["outbox", "retry", &id.to_string()]).await;
    assert_eq!(
        (code, &redriven["redriven"]),
        (0, &json!(true)),
        "{redriven}"
    );
    assert_eq!(app.emails_to("twice@example.com", 1).await.len(), 1);
    let (_, shown, _) = oncely_json(&url, &["outbox", "show", key]).await;
    assert_eq!(shown["status"], "sent", "{shown}");
    assert_eq!(
        (shown["attempts"].as_i64(), shown["redrives"].as_i64()),
        (Some(2), Some(1))
    );
    let history = shown["history"].as_array().unwrap();
    let numbers: Vec<_> = history
        .iter()
        .map(|a| a["number"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, [1, 2], "numbered over the job's life: {shown}");
    let marks: Vec<_> = history
        .iter()
        .map(|a| a["after_redrive"].as_bool().unwrap())
        .collect();
    assert_eq!(marks, [false, true]);
    assert_eq!(
        history
            .iter()
            .map(|a| a["result"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["dead", "sent"]
    );
    let first_ended = time_in(&history[0]["finished_at"]);
    assert!(time_in(&history[0]["started_at"]) <= first_ended);
    assert!(first_ended <= time_in(&shown["redriven_at"]));
    assert!(time_in(&shown["redriven_at"]) <= time_in(&history[1]["started_at"]));
    assert!(time_in(&history[1]["finished_at"]) <= time_in(&shown["sent_at"]));
    let (ok, human) = oncely_on(&url, &["outbox", "show", key]).await;
    assert!(ok, "{human}");
    assert!(
        human.contains("-- re-driven --") && human.contains("sent at "),
        "{human}"
    );
    assert!(human.contains(" UTC"), "readable times: {human}");

    let (code, _, error) = oncely_json(&url, &["outbox", "retry", key]).await;
    assert_eq!(
        (code, &error["error"]),
        (4, &json!("already_sent")),
        "{error}"
    );
    let (code, _, error) = oncely_json(&url, &["outbox", "retry", "no-such-job"]).await;
    assert_eq!((code, &error["error"]), (3, &json!("not_found")), "{error}");
    let (code, _, error) = oncely_json(&url, &["outbox", "show", "999999"]).await;
    assert_eq!((code, &error["error"]), (3, &json!("not_found")), "{error}");
    let (ok, text) = oncely_on(&url, &["outbox", "retry", "no-such-job"]).await;
    assert!(
        !ok && text.starts_with("oncely: no job with operation key"),
        "{text}"
    );

    // A job that keeps failing stays pending: not re-driven, and said so.
    app.inbox.set_faults(Faults {
        reject_next: 1000,
        ..Faults::default()
    });
    app.post(
        "/v1/signup",
        "pending",
        &json!({ "email": "later@example.com" }),
    )
    .await;
    let (_, pending, _) = oncely_json(&url, &["outbox", "list", "--status", "pending"]).await;
    let pending_key = pending[0]["operation_key"].as_str().unwrap().to_owned();
    let other = pending[0]["id"].as_i64().unwrap();
    assert!(time_in(&pending[0]["next_run_at"]) >= time_in(&pending[0]["created_at"]));
    let (code, _, error) = oncely_json(&url, &["outbox", "retry", &pending_key]).await;
    assert_eq!(
        (code, &error["error"]),
        (4, &json!("still_pending")),
        "{error}"
    );

    // A number that is one job's operation key and another's id: refused, unless --by says.
    execute(
        &url,
        &format!("UPDATE oncely_outbox SET operation_key = '{other}' WHERE id = {id}"),
    )
    .await;
    let (code, _, error) = oncely_json(&url, &["outbox", "show", &other.to_string()]).await;
    assert_eq!((code, &error["error"]), (4, &json!("ambiguous")), "{error}");
    let (_, by_key, _) =
        oncely_json(&url, &["outbox", "show", &other.to_string(), "--by", "key"]).await;
    assert_eq!(by_key["id"], id);
    let (_, by_id, _) =
        oncely_json(&url, &["outbox", "show", &other.to_string(), "--by", "id"]).await;
    assert_eq!(by_id["id"], other);

    let (code, _, _) = oncely_json(&url, &["outbox", "list", "--status", "bogus"]).await;
    assert_eq!(code, 2, "a usage error");
}

both_databases!(a_tenant_s_key_is_rotated_at_once_or_after_a_grace_and_never_listed);

/// Issue 15, item 5: a lost or leaked API key is replaced with `oncely tenant rotate-key`; the
/// old key stops at once, or with `--grace` when that ends; `tenant list` shows each valid
/// key's fingerprint, never a key. Over HTTP, on a non-default tenant.
async fn a_tenant_s_key_is_rotated_at_once_or_after_a_grace_and_never_listed(
    url: String,
    _db: TestDb,
) {
    let app = crate::support::spawn_app_on(&url, |_| {}).await;
    let signup = |key: String, idempotency_key: &'static str| {
        let app = &app;
        async move {
            let body = json!({ "email": format!("{idempotency_key}@example.com") });
            app.post_as(&key, "/v1/signup", idempotency_key, &body)
                .await
        }
    };
    let (code, created, _) = oncely_json(&url, &["tenant", "create", "acme"]).await;
    assert_eq!(code, 0);
    let first = created["api_key"].as_str().unwrap().to_owned();
    let sha = |key: &str| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()));
    assert_eq!(
        created["key_fingerprint"].as_str().unwrap(),
        &sha(&first)[..12]
    );
    let answered = signup(first.clone(), "one").await;
    assert_eq!(answered.status(), 202);

    // At once: the old key is refused, the new one acts for the same tenant (its stored
    // answers replay).
    let (code, rotated, _) = oncely_json(&url, &["tenant", "rotate-key", "acme"]).await;
    assert_eq!(code, 0);
    assert!(rotated["previous_key_valid_until"].is_null(), "{rotated}");
    let second = rotated["api_key"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    assert_eq!(signup(first.clone(), "two").await.status(), 401);
    let again = signup(second.clone(), "one").await;
    assert_eq!(again.status(), 202);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true"),
        "the same tenant"
    );

    // With a grace: both keys work until it ends.
    let (code, rotated, _) =
        oncely_json(&url, &["tenant", "rotate-key", "acme", "--grace", "1h"]).await;
    assert_eq!(code, 0);
    let third = rotated["api_key"].as_str().unwrap().to_owned();
    let until = time_in(&rotated["previous_key_valid_until"]);
    let now = time::OffsetDateTime::now_utc();
    assert!(until > now + time::Duration::minutes(55) && until <= now + time::Duration::hours(1));
    assert_eq!(signup(second.clone(), "three").await.status(), 202);
    assert_eq!(signup(third.clone(), "four").await.status(), 202);
    assert_eq!(signup(first.clone(), "five").await.status(), 401);

    let (code, listed, _) = oncely_json(&url, &["tenant", "list"]).await;
    assert_eq!(code, 0);
    let acme = &listed.as_array().unwrap()[0];
    assert_eq!(acme["tenant"], "acme");
    assert_eq!(
        acme["key_fingerprint"].as_str().unwrap(),
        &sha(&third)[..12]
    );
    assert_eq!(
        acme["previous_key_fingerprint"].as_str().unwrap(),
        &sha(&second)[..12]
    );
    assert_eq!(
        time_in(&acme["previous_key_valid_until"]).unix_timestamp(),
        until.unix_timestamp()
    );
    let (ok, human) = oncely_on(&url, &["tenant", "list"]).await;
    assert!(ok && human.contains(&sha(&third)[..12]), "{human}");
    for key in [&first, &second, &third] {
        assert!(!listed.to_string().contains(key.as_str()) && !human.contains(key.as_str()));
    }

    // The grace ends: the previous key is refused, and no longer listed.
    let past = if url.starts_with("postgres") {
        "now() - interval '1 second'"
    } else {
        "(CAST(strftime('%s', 'now') AS INTEGER) - 1) * 1000"
    };
    execute(
        &url,
        &format!("UPDATE oncely_tenants SET previous_key_expires_at = {past}"),
    )
    .await;
    assert_eq!(signup(second.clone(), "six").await.status(), 401);
    assert_eq!(signup(third.clone(), "seven").await.status(), 202);
    let (_, listed, _) = oncely_json(&url, &["tenant", "list"]).await;
    assert!(listed[0]["previous_key_fingerprint"].is_null(), "{listed}");

    // Refusals: no such tenant, `default` (it has no key), a grace that is none or too long.
    let (code, _, error) = oncely_json(&url, &["tenant", "rotate-key", "globex"]).await;
    assert_eq!((code, &error["error"]), (3, &json!("not_found")), "{error}");
    let (code, _, error) = oncely_json(&url, &["tenant", "rotate-key", "default"]).await;
    assert_eq!((code, &error["error"]), (1, &json!("failed")), "{error}");
    for grace in ["0s", "31d", "soon"] {
        let (code, _, error) =
            oncely_json(&url, &["tenant", "rotate-key", "acme", "--grace", grace]).await;
        assert_eq!(code, 2, "--grace {grace}: {error}");
        assert!(error.as_str().unwrap().contains("--grace"), "{error}");
    }
    let (code, _, error) = oncely_json(&url, &["tenant", "create", "acme"]).await;
    assert_eq!(
        (code, &error["error"]),
        (4, &json!("tenant_exists")),
        "{error}"
    );
    assert_eq!(
        signup(third, "eight").await.status(),
        202,
        "refusals changed nothing"
    );
}

both_databases!(an_email_whose_answer_was_lost_is_parked_listed_and_settled_without_a_second_copy);

/// Polls `outbox ARGS… --json` until `done` holds for what it prints (10 s at most).
async fn outbox_until(url: &str, args: &[&str], done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, value, _) = oncely_json(url, args).await;
        if code == 0 && done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{args:?} never got there: {value}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 21, item 1: with `--on-unknown reconcile`, an email whose SMTP answer was lost after
/// the relay accepted it is parked, not sent again: `outbox unknown` lists it, `/metrics` counts
/// it, `outbox retry` refuses it; `outbox settle --sent` records it sent without a second copy
/// (and settles nothing twice); another, settled `--resend`, is sent again under the same
/// delivery key (`Message-ID`).
async fn an_email_whose_answer_was_lost_is_parked_listed_and_settled_without_a_second_copy(
    url: String,
    _db: TestDb,
) {
    let (inbox, running) = start_inbox(Faults {
        drop_after_accept: 1,
        ..Faults::default()
    })
    .await;
    // The operator's path: no lookup to ask (a plain relay), so parked emails wait for
    // `oncely outbox settle` and nothing settles them meanwhile.
    let app = spawn_app_with_inbox(&url, inbox, running, |s| {
        s.on_unknown = Some(oncely_outbox::OnUnknown::Reconcile);
        s.mailer.lookup = None;
    })
    .await;
    app.post(
        "/v1/signup",
        "lost-1",
        &json!({ "email": "lost@example.com" }),
    )
    .await;
    assert_eq!(app.emails_to("lost@example.com", 1).await.len(), 1);
    let parked = outbox_until(&url, &["outbox", "unknown"], |v| {
        v.as_array().is_some_and(|jobs| jobs.len() == 1)
    })
    .await;
    let job = &parked[0];
    assert_eq!(job["status"], "unknown", "{parked}");
    assert!(
        job["last_error"].as_str().unwrap().contains("parked"),
        "{parked}"
    );
    let id = job["id"].as_i64().unwrap().to_string();
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l == "oncely_outbox_parked 1"),
        "{metrics}"
    );

    let (code, _, error) = oncely_json(&url, &["outbox", "retry", &id]).await;
    assert_eq!((code, &error["error"]), (4, &json!("parked")), "{error}");
    let (code, _, _) = oncely_json(&url, &["outbox", "settle", &id]).await;
    assert_eq!(code, 2, "--sent or --resend is required");
    let (code, settled, _) = oncely_json(&url, &["outbox", "settle", &id, "--sent"]).await;
    assert_eq!(
        (code, &settled["settled"]),
        (0, &json!("sent")),
        "{settled}"
    );
    let shown = outbox_until(&url, &["outbox", "show", &id], |v| v["status"] == "sent").await;
    let results: Vec<_> = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["unknown", "sent"], "{shown}");
    assert_eq!(
        app.emails_to("lost@example.com", 1).await.len(),
        1,
        "settled as sent: no second copy"
    );
    let (code, _, error) = oncely_json(&url, &["outbox", "settle", &id, "--resend"]).await;
    assert_eq!((code, &error["error"]), (4, &json!("parked")), "{error}");
    let (_, parked, _) = oncely_json(&url, &["outbox", "unknown"]).await;
    assert_eq!(parked, json!([]));

    // Another answer lost; this one is settled for resending: a second copy, same Message-ID.
    app.inbox.set_faults(Faults {
        drop_after_accept: 1,
        ..Faults::default()
    });
    app.post(
        "/v1/signup",
        "lost-2",
        &json!({ "email": "again@example.com" }),
    )
    .await;
    let parked = outbox_until(&url, &["outbox", "unknown"], |v| {
        v.as_array().is_some_and(|jobs| jobs.len() == 1)
    })
    .await;
    let id = parked[0]["id"].as_i64().unwrap().to_string();
    let (code, settled, _) = oncely_json(&url, &["outbox", "settle", &id, "--resend"]).await;
    assert_eq!(
        (code, &settled["settled"]),
        (0, &json!("resend")),
        "{settled}"
    );
    outbox_until(&url, &["outbox", "show", &id], |v| v["status"] == "sent").await;
    let copies = app.emails_to("again@example.com", 2).await;
    assert_eq!(copies.len(), 2, "resent once");
    let message_ids: Vec<_> = copies.iter().map(|m| m.message_id.clone()).collect();
    assert!(message_ids[0].is_some(), "{copies:?}");
    assert_eq!(
        message_ids[0], message_ids[1],
        "under the same delivery key"
    );
}
