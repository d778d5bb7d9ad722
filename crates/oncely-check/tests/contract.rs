//! The checker against fixtures that keep the contract or break it one way each: it must pass
//! the first and name exactly the rows the others break.

mod support;

use oncely_check::Verdict;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixture_that_keeps_the_contract_passes_every_row_but_retry_after() {
    let base = spawn_fixture(CORRECT, 6).await;
    let report = assert_conforms(&fixture_config(&base, 6)).await;
    assert_eq!(report.row("key-per-route").unwrap().verdict, Verdict::Pass);
    assert_eq!(
        report.row("retry-after").unwrap().verdict,
        Verdict::NotApplicable,
        "{}",
        report.table()
    );
    assert_evidence(&report, "concurrent", "probe 3 → 4");
}

/// A busy answer with `Retry-After` is load, not a verdict: the checker waits and sends the
/// same request again, and says how often it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_answers_outside_the_burst_are_retried_after_their_retry_after() {
    let base = spawn_fixture(behaving(|b| b.busy_first = 3), 6).await;
    let report = assert_conforms(&fixture_config(&base, 6)).await;
    assert_eq!(report.busy_retries, 3);
    assert!(
        report
            .table()
            .contains("(3 busy answers retried after its Retry-After)"),
        "{}",
        report.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_ignores_the_key_fails_the_rows_that_need_one() {
    let (base, report) = fixture_report(behaving(|b| b.ignores_key = true), 6).await;
    assert_fails(&report, &IGNORES_THE_KEY);
    let concurrent = &report.row("concurrent").unwrap().evidence;
    assert!(
        concurrent.contains("the probe counted 7 executions"),
        "the probe counted every request, the retry after the burst too: {concurrent}"
    );
    // Without a probe, the answers differ (a fresh id each): still a failure.
    let mut config = fixture_config(&base, 6);
    config.probe = None;
    let report = oncely_check::run(&config).await.unwrap();
    assert!(
        failures(&report).contains("concurrent"),
        "{}",
        report.table()
    );
    assert_evidence(&report, "concurrent", "different success bodies");
}

/// Same answers every time: the answers cannot tell one execution from seven, the probe can.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_probe_catches_a_server_that_runs_every_duplicate_with_the_same_answer() {
    let (base, report) = fixture_report(
        behaving(|b| {
            b.ignores_key = true;
            b.constant_answer = true;
        }),
        6,
    )
    .await;
    let concurrent = report.row("concurrent").unwrap();
    assert_eq!(concurrent.verdict, Verdict::Fail, "{}", report.table());
    assert!(
        concurrent
            .evidence
            .contains("the probe counted 7 executions"),
        "{}",
        concurrent.evidence
    );
    // The replay is byte for byte the same, but it is not marked as one.
    assert_eq!(report.row("replay").unwrap().verdict, Verdict::Pass);
    assert_eq!(report.row("replay-header").unwrap().verdict, Verdict::Fail);

    let mut config = fixture_config(&base, 6);
    config.probe = None;
    let report = oncely_check::run(&config).await.unwrap();
    let concurrent = report.row("concurrent").unwrap();
    assert_eq!(concurrent.verdict, Verdict::Pass, "{}", report.table());
    assert!(
        concurrent
            .evidence
            .contains("compared answers (no --probe)"),
        "{}",
        concurrent.evidence
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_stores_by_key_only_fails_reuse_with_another_body() {
    let (_, report) = fixture_report(behaving(|b| b.compares_body = false), 6).await;
    assert_fails(&report, &["reuse-other-body"]);
    let evidence = &report.row("reuse-other-body").unwrap().evidence;
    assert!(
        evidence.contains("expected 422, got 201") && evidence.contains("Idempotent-Replayed"),
        "{evidence}"
    );
    for name in [
        "key-missing",
        "replay",
        "replay-header",
        "key-per-route",
        "concurrent",
    ] {
        assert_eq!(
            report.row(name).unwrap().verdict,
            Verdict::Pass,
            "{}",
            report.table()
        );
    }

    // The same, one key for every route: the other route replays the first one's answer.
    let (_, report) = fixture_report(
        behaving(|b| {
            b.compares_body = false;
            b.per_route = false;
        }),
        6,
    )
    .await;
    assert_fails(&report, &["reuse-other-body", "key-per-route"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicts_in_the_burst_pass_with_retry_after_and_fail_without() {
    let base = spawn_fixture(behaving(|b| b.conflicts = Some(true)), 5).await;
    let report = assert_conforms(&fixture_config(&base, 5)).await;
    let row = report.row("retry-after").unwrap();
    assert_eq!(row.verdict, Verdict::Pass, "{}", report.table());
    assert!(
        row.evidence.contains("409×4 with Retry-After (1)"),
        "{}",
        row.evidence
    );

    let (_, report) = fixture_report(behaving(|b| b.conflicts = Some(false)), 5).await;
    assert_fails(&report, &["retry-after"]);
    assert_eq!(
        report.row("concurrent").unwrap().verdict,
        Verdict::Pass,
        "{}",
        report.table()
    );
}
