//! The short form of `scripts/chaos`: real `oncely` processes killed and restarted under a
//! retrying storm with inbox faults, then the audit (see `docs/reliability.md`).

use std::path::PathBuf;

use oncely_chaos::{Config, Delivery, run};
use oncely_testdb::TestPostgres;

fn oncely() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_oncely"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_processes_and_failing_deliveries_lose_nothing_and_duplicate_nothing() {
    let db = TestPostgres::new().await;
    let config = Config::short(oncely(), db.url().to_owned());
    let report = run(&config).await.unwrap();
    let shown = serde_json::to_string_pretty(&report).unwrap();
    assert!(
        report.api_kills + report.worker_kills > 0,
        "nothing was killed: {shown}"
    );
    assert!(
        report.inbox["rejected"] + report.inbox["dropped_after_accept"] > 0,
        "no fault met: {shown}"
    );
    assert_eq!(report.acknowledged, report.intents, "{shown}");
    assert_eq!(report.users, report.intents, "{shown}");
    assert_eq!(report.lost, 0, "{shown}");
    assert_eq!(report.duplicates, 0, "{shown}");
    assert_eq!(report.emails, report.intents, "{shown}");
    assert!(report.passed(), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_plain_smtp_a_dropped_answer_is_a_counted_duplicate_and_nothing_is_lost() {
    let db = TestPostgres::new().await;
    let config = Config {
        intents: 80,
        fault_rate: 0.2,
        delivery: Delivery::Smtp,
        ..Config::short(oncely(), db.url().to_owned())
    };
    let report = run(&config).await.unwrap();
    let shown = serde_json::to_string_pretty(&report).unwrap();
    assert_eq!(report.lost, 0, "{shown}");
    assert_eq!(report.unanswered, 0, "{shown}");
    // Every accept-then-drop was sent again (SMTP cannot deduplicate), and so may be a send
    // whose worker was killed before it recorded it.
    assert!(
        report.duplicates >= report.inbox["dropped_after_accept"],
        "{shown}"
    );
    assert!(
        report.inbox["dropped_after_accept"] > 0,
        "no drop met: {shown}"
    );
    assert!(report.passed(), "{shown}");
}
