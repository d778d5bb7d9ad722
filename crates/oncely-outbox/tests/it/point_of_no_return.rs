//! Issue 36, item 9: only emails that may have reached the provider are parked. A worker of a
//! kind that reconciles records each attempt's point of no return — over SMTP once `MAIL`,
//! `RCPT` and `DATA` were accepted, before the content — in the attempt's row, fenced by its
//! lease, and sends nothing if it cannot. An attempt abandoned before that point (its worker
//! killed) is retried as any retry: not parked, no operator, one email. One abandoned after it,
//! or whose mark is unknown (an earlier release, a handler without the hook), is parked as
//! before.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use oncely_inbox::{Faults, Inbox, Running};
use oncely_outbox::job::AttemptRecord;
use oncely_outbox::mail::{Email, EmailHandler, SmtpMailer};
use oncely_outbox::{
    Job, JobRecord, JobStatus, KindOptions, NewJob, OnUnknown, Worker, WorkerConfig,
};
use oncely_testdb::TestDb;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};

use crate::support::{Backend, LEASE, both_stores, job_in, kinds};

both_stores!(
    a_worker_killed_before_data_leaves_a_plain_retry_and_one_email,
    a_worker_killed_after_its_mark_parks_the_email,
    an_abandoned_attempt_parks_unless_it_was_still_ahead_of_its_mark,
    a_mark_that_cannot_be_written_sends_nothing,
    a_send_that_times_out_before_data_is_answered_is_a_plain_retry,
    an_attempt_past_its_mark_still_parks_behind_a_later_abandoned_claim,
    an_attempt_past_its_mark_still_parks_behind_a_claim_that_could_not_read_the_history,
    only_attempts_that_may_have_handed_something_over_count_as_maybe_delivered,
);

const KIND: &str = "email";

/// Where the scripted server stops answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hang {
    /// It never answers `DATA`: the client waits before its point of no return.
    AtData,
    /// It answers `DATA` with 354 once told to ([`Scripted::proceed`]), reads the content and
    /// never answers it.
    InContent,
}

/// A scripted SMTP server: `EHLO`, `MAIL` and `RCPT` accepted, then it hangs as [`Hang`] says.
/// It reports each stage it reaches (`stage`): `data` (the `DATA` command arrived), `content`
/// (the first bytes of content), `eof` (the client closed the connection), and keeps the
/// content bytes it read.
struct Scripted {
    addr: SocketAddr,
    stage: watch::Receiver<&'static str>,
    content: Arc<std::sync::Mutex<Vec<u8>>>,
    proceed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn scripted(hang: Hang) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, stage) = watch::channel("listening");
    let content = Arc::new(std::sync::Mutex::new(Vec::new()));
    let proceed = Arc::new(Notify::new());
    let (kept, go) = (content.clone(), proceed.clone());
    let task = tokio::spawn(async move {
        // One conversation: the tests make one attempt against it.
        let (socket, _) = listener.accept().await.unwrap();
        let (read, mut write) = socket.into_split();
        let mut read = BufReader::new(read);
        write.write_all(b"220 scripted ESMTP\r\n").await.unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                let _ = tx.send("eof");
                return;
            }
            let command = line.trim_end().to_ascii_uppercase();
            if command.starts_with("EHLO") {
                write.write_all(b"250 scripted\r\n").await.unwrap();
            } else if command.starts_with("MAIL") || command.starts_with("RCPT") {
                write.write_all(b"250 ok\r\n").await.unwrap();
            } else if command == "DATA" {
                let _ = tx.send("data");
                if hang == Hang::AtData {
                    // Never answered; the client's close is noted.
                    let mut rest = Vec::new();
                    let _ = read.read_to_end(&mut rest).await;
                    let _ = tx.send("eof");
                    return;
                }
                go.notified().await;
                write.write_all(b"354 go ahead\r\n").await.unwrap();
                let mut buf = [0u8; 4096];
                loop {
                    match read.read(&mut buf).await {
                        Ok(0) | Err(_) => {
                            let _ = tx.send("eof");
                            return;
                        }
                        Ok(n) => {
                            kept.lock().unwrap().extend_from_slice(&buf[..n]);
                            let _ = tx.send("content");
                        }
                    }
                }
            } else {
                write.write_all(b"250 ok\r\n").await.unwrap();
            }
        }
    });
    Scripted {
        addr,
        stage,
        content,
        proceed,
        task,
    }
}

impl Scripted {
    async fn reached(&mut self, stage: &'static str) {
        tokio::time::timeout(
            Duration::from_secs(10),
            self.stage.wait_for(|s| *s == stage),
        )
        .await
        .unwrap_or_else(|_| panic!("the scripted server never reached {stage}"))
        .unwrap();
    }
}

fn email(to: &str) -> Email {
    Email {
        from: "app@example.com".into(),
        to: to.into(),
        subject: "Your link".into(),
        text: "Hello".into(),
        ..Email::default()
    }
}

async fn enqueue<S: Backend>(store: &S, key: &str, to: &str) -> i64 {
    let job = NewJob::new(key, KIND, serde_json::to_value(email(to)).unwrap());
    match store.enqueue_with_business_row(job, true).await.unwrap() {
        oncely_outbox::Enqueued::Inserted(id) => id,
        other => panic!("{other:?}"),
    }
}

/// A worker of the email kind, reconciling (the SMTP default), a 2 s lease, mailing `smtp`.
fn worker<S: Backend>(store: &S, smtp: SocketAddr) -> Worker<S> {
    let mailer = SmtpMailer::new(&format!("smtp://{smtp}"), Duration::from_secs(30)).unwrap();
    let config = WorkerConfig {
        lease: Duration::from_secs(2),
        ..WorkerConfig::default()
    };
    let options = KindOptions {
        on_unknown: OnUnknown::Reconcile,
        ..KindOptions::default()
    };
    Worker::new(store.clone(), config).handle_with(
        KIND,
        EmailHandler::new(Arc::new(mailer)),
        options,
    )
}

/// Claims up to `batch` jobs of the email kind as `worker`, marking them.
async fn claim_marking<S: Backend>(store: &S, worker: &str, batch: u32) -> Vec<Job> {
    let email = kinds(&[KIND]);
    store
        .claim_marking(worker, &email, batch, LEASE, &email)
        .await
        .unwrap()
}

/// The job `signup:1` (its id), claimed by a worker that passed its point of no return and
/// died: its lease is over.
async fn abandoned_past_its_mark<S: Backend>(store: &S) -> i64 {
    let id = enqueue(store, "signup:1", "ada@example.com").await;
    let first = claim_marking(store, "dying", 10).await;
    assert!(store.pass_point_of_no_return(&first[0]).await.unwrap());
    store.clock().advance(LEASE + Duration::from_secs(1));
    id
}

/// A worker runs the job `signup:1` (`id`) again, mailing a fresh inbox, and leaves it in
/// `status`: the inbox, the job and its attempts.
async fn run_again<S: Backend>(
    store: &S,
    id: i64,
    status: JobStatus,
) -> (Inbox, JobRecord, Vec<AttemptRecord>) {
    let (inbox, running) = inbox().await;
    assert_eq!(worker(store, running.smtp_addr).drain().await.unwrap(), 1);
    let record = store.job("signup:1").await.unwrap().unwrap();
    assert_eq!(record.status, status, "{record:?}");
    let attempts = store.attempts(id).await.unwrap();
    (inbox, record, attempts)
}

async fn inbox() -> (Inbox, Running) {
    Inbox::start_local(Faults::default()).await.unwrap()
}

fn results(attempts: &[AttemptRecord]) -> Vec<&str> {
    attempts
        .iter()
        .map(|a| a.result.as_deref().unwrap_or("running"))
        .collect()
}

fn marks(attempts: &[AttemptRecord]) -> Vec<Option<&str>> {
    attempts
        .iter()
        .map(|a| a.point_of_no_return.as_deref())
        .collect()
}

/// The job `signup:1` (its id), and a worker's batch (in a task of its own) sending it to a
/// scripted server that has answered `DATA` and waits in the content.
async fn at_data<S: Backend>(
    store: &S,
) -> (
    i64,
    Scripted,
    tokio::task::JoinHandle<Result<usize, oncely_outbox::OutboxError>>,
) {
    let id = enqueue(store, "signup:1", "ada@example.com").await;
    let mut server = scripted(Hang::InContent).await;
    let run = {
        let worker = worker(store, server.addr);
        tokio::spawn(async move { worker.run_once().await })
    };
    server.reached("data").await;
    (id, server, run)
}

/// Runs one batch of `worker` in a task of its own and "kills" it once the scripted server
/// reaches `stage`: the batch is dropped, nothing of it is recorded (as when the process is
/// SIGKILLed); its attempts stay open until their lease ends.
async fn killed_at<S: Backend>(worker: Worker<S>, server: &mut Scripted, stage: &'static str) {
    let run = tokio::spawn(async move { worker.run_once().await });
    server.reached(stage).await;
    run.abort();
    let _ = run.await;
}

/// The case of the review: a worker killed while its SMTP server had not yet answered `DATA`.
/// Nothing of the message reached the server, so the next worker sends it as any retry: not
/// parked, no operator, one email. (Before: parked until someone settled it.)
async fn a_worker_killed_before_data_leaves_a_plain_retry_and_one_email<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let id = enqueue(&store, "signup:1", "ada@example.com").await;
    let mut server = scripted(Hang::AtData).await;
    killed_at(worker(&store, server.addr), &mut server, "data").await;
    store.clock().advance(Duration::from_secs(3));

    let (inbox, _, attempts) = run_again(&store, id, JobStatus::Sent).await;
    assert_eq!(results(&attempts), ["abandoned", "sent"]);
    assert_eq!(marks(&attempts)[0], Some("ahead"), "{attempts:?}");
    assert!(attempts[0].handed_over_at.is_none());
    assert_eq!(marks(&attempts)[1], Some("passed"));
    assert_eq!(inbox.messages(Some("ada@example.com")).len(), 1);
    assert!(
        server.content.lock().unwrap().is_empty(),
        "the killed attempt sent no content"
    );
}

/// A worker killed once its server accepted `DATA` and was reading the content: the message may
/// have arrived, so the email is parked as before — the mark says so.
async fn a_worker_killed_after_its_mark_parks_the_email<S: Backend>(store: S, _db: TestDb) {
    let (id, mut server, run) = at_data(&store).await;
    server.proceed.notify_one();
    server.reached("content").await;
    run.abort();
    let _ = run.await;
    assert!(!server.content.lock().unwrap().is_empty());
    store.clock().advance(Duration::from_secs(3));

    let (inbox, _, attempts) = run_again(&store, id, JobStatus::Unknown).await;
    assert_eq!(results(&attempts), ["abandoned", "parked"]);
    assert_eq!(marks(&attempts)[0], Some("passed"), "{attempts:?}");
    assert!(attempts[0].handed_over_at.is_some());
    assert!(
        inbox.messages(None).is_empty(),
        "not sent again while parked"
    );
}

/// The decision, by the store alone: a claimed job whose lease ended with its attempt open is
/// retried if the attempt was armed and never passed its point of no return; it parks if it
/// passed it, or if its mark is unknown (a claim that armed nothing: an earlier release's, or
/// a handler's without the hook).
async fn an_abandoned_attempt_parks_unless_it_was_still_ahead_of_its_mark<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let ahead = enqueue(&store, "signup:ahead", "a@example.com").await;
    let email = kinds(&[KIND]);
    let claimed = claim_marking(&store, "dying", 10).await;
    assert_eq!(claimed.len(), 1);
    let passed = enqueue(&store, "signup:passed", "p@example.com").await;
    let claimed = claim_marking(&store, "dying", 10).await;
    assert_eq!(claimed.len(), 1);
    assert!(store.pass_point_of_no_return(&claimed[0]).await.unwrap());
    let unknown = enqueue(&store, "signup:unknown", "u@example.com").await;
    assert_eq!(
        store.claim("old", &email, 10, LEASE).await.unwrap().len(),
        1
    );
    store.clock().advance(LEASE + Duration::from_secs(1));

    let (inbox, running) = inbox().await;
    assert_eq!(worker(&store, running.smtp_addr).drain().await.unwrap(), 3);
    for (key, status) in [
        ("signup:ahead", JobStatus::Sent),
        ("signup:passed", JobStatus::Unknown),
        ("signup:unknown", JobStatus::Unknown),
    ] {
        let record = store.job(key).await.unwrap().unwrap();
        assert_eq!(record.status, status, "{record:?}");
    }
    let attempts = store.attempts(ahead).await.unwrap();
    assert_eq!(results(&attempts), ["abandoned", "sent"]);
    assert_eq!(marks(&attempts), [Some("ahead"), Some("passed")]);
    let attempts = store.attempts(passed).await.unwrap();
    assert_eq!(results(&attempts), ["abandoned", "parked"]);
    assert_eq!(marks(&attempts)[0], Some("passed"));
    let attempts = store.attempts(unknown).await.unwrap();
    assert_eq!(results(&attempts), ["abandoned", "parked"]);
    assert_eq!(marks(&attempts)[0], None);
    assert_eq!(inbox.messages(None).len(), 1, "only the one that was ahead");
}

/// The mark is written before the content, or nothing is sent: a claim that lost its lease
/// (another worker took the job) cannot write it, and the mailer closes the connection after
/// the 354 without a byte of content — the server discards the transaction.
async fn a_mark_that_cannot_be_written_sends_nothing<S: Backend>(store: S, _db: TestDb) {
    let (id, mut server, run) = at_data(&store).await;
    // The lease is lost meanwhile (what a claim by another worker does to the job's token).
    store
        .execute_for_test(
            "UPDATE oncely_outbox SET lease_token = NULL WHERE id = $1",
            id,
        )
        .await;
    server.proceed.notify_one();
    server.reached("eof").await;
    run.await.unwrap().unwrap();
    assert!(
        server.content.lock().unwrap().is_empty(),
        "no content without the mark: {:?}",
        String::from_utf8_lossy(&server.content.lock().unwrap())
    );
    let attempts = store.attempts(id).await.unwrap();
    assert_eq!(marks(&attempts), [Some("ahead")], "{attempts:?}");
}

/// A send that runs out of time while the server has not answered `DATA` handed nothing over:
/// a plain retry, not an unknown outcome, so the email is not parked.
async fn a_send_that_times_out_before_data_is_answered_is_a_plain_retry<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let id = enqueue(&store, "signup:1", "ada@example.com").await;
    let server = scripted(Hang::AtData).await;
    // The attempt ends at 90 % of its 2 s lease.
    assert_eq!(worker(&store, server.addr).run_once().await.unwrap(), 1);
    let record = job_in(&store, "signup:1", JobStatus::Pending).await;
    let error = record.last_error.unwrap_or_default();
    assert!(error.contains("nothing was handed over"), "{error}");
    let attempts = store.attempts(id).await.unwrap();
    assert_eq!(results(&attempts), ["retry"]);
    assert_eq!(marks(&attempts), [Some("ahead")]);
}

/// Found by the chaos run: a worker killed past its mark (attempt 1), then the worker that
/// claimed the job next killed too, before it parked it (attempt 2, which never ran: still
/// `ahead`). Attempt 2 handed nothing over, but attempt 1 may have: the job parks.
async fn an_attempt_past_its_mark_still_parks_behind_a_later_abandoned_claim<S: Backend>(
    store: S,
    _db: TestDb,
) {
    let id = abandoned_past_its_mark(&store).await;
    let second = claim_marking(&store, "dying too", 10).await;
    assert_eq!(second.len(), 1);
    store.clock().advance(LEASE + Duration::from_secs(1));

    let (inbox, record, attempts) = run_again(&store, id, JobStatus::Unknown).await;
    assert_eq!(results(&attempts), ["abandoned", "abandoned", "parked"]);
    assert_eq!(marks(&attempts)[..2], [Some("passed"), Some("ahead")]);
    let error = record.last_error.unwrap_or_default();
    assert!(error.contains("attempt 1 was abandoned"), "{error}");
    assert!(inbox.messages(None).is_empty(), "not sent again");
}

/// A claim that could not read the history (a database blip) ends its attempt as a retry that
/// ran nothing — which must not hide the abandoned attempt before it that passed its mark: the
/// next claim that can read parks the job (a review sent the email twice: the scan stopped at
/// the retry).
async fn an_attempt_past_its_mark_still_parks_behind_a_claim_that_could_not_read_the_history<
    S: Backend,
>(
    store: S,
    _db: TestDb,
) {
    use oncely_outbox::job::AttemptResult;
    use oncely_outbox::store::Finish;
    let id = abandoned_past_its_mark(&store).await;
    let second = claim_marking(&store, "blind", 10).await;
    assert_eq!(second.len(), 1);
    // What the executor records when it cannot read the attempts.
    let blind = Finish::retry_free(
        AttemptResult::Retry,
        Duration::from_secs(1),
        "not run: its attempt history could not be read: simulated".into(),
    );
    store.finish(&second[0], &blind).await.unwrap();
    store.clock().advance(Duration::from_secs(2));

    let (inbox, record, attempts) = run_again(&store, id, JobStatus::Unknown).await;
    assert_eq!(results(&attempts), ["abandoned", "retry", "parked"]);
    let error = record.last_error.unwrap_or_default();
    assert!(error.contains("attempt 1 was abandoned"), "{error}");
    assert!(inbox.messages(None).is_empty(), "not sent again");
}

/// `oncely outbox retry`'s warning counts dead jobs with an attempt that may have reached the
/// provider: one abandoned before its mark handed nothing over and is not counted; one
/// abandoned past it is.
async fn only_attempts_that_may_have_handed_something_over_count_as_maybe_delivered<S: Backend>(
    store: S,
    _db: TestDb,
) {
    use oncely_outbox::job::AttemptResult;
    use oncely_outbox::store::{DeadFilter, Finish, PROVIDER_DEDUPE_WINDOW};
    for (key, passed) in [("ahead:1", false), ("passed:1", true)] {
        enqueue(&store, key, "ada@example.com").await;
        let first = claim_marking(&store, "dying", 1).await;
        if passed {
            assert!(store.pass_point_of_no_return(&first[0]).await.unwrap());
        }
        store.clock().advance(LEASE + Duration::from_secs(1));
        let second = claim_marking(&store, "w", 1).await;
        let dead = Finish::dead(AttemptResult::Dead, "550 no such user".into());
        assert!(store.finish(&second[0], &dead).await.unwrap());
    }
    store.clock().advance(Duration::from_secs(25 * 3600));
    let found = store
        .dead_jobs(&DeadFilter::default(), 10, PROVIDER_DEDUPE_WINDOW)
        .await
        .unwrap();
    assert_eq!((found.matching, found.unknown_past_window), (2, 1));
}
