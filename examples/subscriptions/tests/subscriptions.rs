//! One subscription and one charge, however the request and the job are retried or interrupted.

use std::time::{Duration, Instant};

use axum::Router;
use oncely::ServerSecret;
use oncely::store::sqlite::SqliteKeyStore;
use oncely_example_subscriptions::{CHARGE, ChargeHandler, FakeProvider, app, migrate};
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::{JobStatus, JobStore, Worker, WorkerConfig};
use oncely_testdb::TestSqlite;
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Setup {
    _db: TestSqlite,
    pool: sqlx::SqlitePool,
    jobs: SqliteJobStore,
    base: String,
    provider: FakeProvider,
    payments: String,
}

async fn setup() -> Setup {
    let db = TestSqlite::new();
    let pool = db.pool(8).await;
    let (keys, jobs) = (
        SqliteKeyStore::new(pool.clone()),
        SqliteJobStore::new(pool.clone()),
    );
    migrate(&keys, &jobs).await.unwrap();
    let secret = ServerSecret::new(b"test-secret-test-secret-test-secret".to_vec()).unwrap();
    let router: Router = app(keys, jobs.clone(), secret);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let provider = FakeProvider::default();
    let payments = provider.start().await.unwrap();
    Setup {
        _db: db,
        pool,
        jobs,
        base,
        provider,
        payments,
    }
}

fn worker(s: &Setup, lease: Duration, timeout: Duration) -> Worker<SqliteJobStore> {
    let handler = ChargeHandler {
        client: oncely_outbox::http::client(timeout).unwrap(),
        url: s.payments.clone(),
        pool: s.pool.clone(),
    };
    let config = WorkerConfig {
        lease,
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    Worker::new(s.jobs.clone(), config).handle(CHARGE, handler)
}

async fn subscribe(client: &reqwest::Client, base: &str, key: &str) -> (u16, String) {
    let r = client
        .post(format!("{base}/v1/subscriptions"))
        .header("idempotency-key", key)
        .json(&json!({ "customer": "cus_1", "plan": "pro", "amount_cents": 2900 }))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn count(pool: &sqlx::SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_and_concurrent_subscription_makes_one_subscription_and_one_charge() {
    let s = setup().await;
    let client = oncely_testdb::http();
    let mut answers = Vec::new();
    for _ in 0..20 {
        answers.push(subscribe(&client, &s.base, "sub-1").await);
    }
    answers.extend(
        futures::future::join_all((0..20).map(|_| subscribe(&client, &s.base, "sub-1"))).await,
    );
    assert!(
        answers.iter().all(|a| a == &answers[0] && a.0 == 201),
        "{answers:?}"
    );
    assert_eq!(
        count(&s.pool, "SELECT count(*) FROM subscriptions").await,
        1
    );
    assert_eq!(
        count(&s.pool, "SELECT count(*) FROM oncely_outbox").await,
        1
    );

    worker(&s, Duration::from_secs(30), Duration::from_secs(5))
        .drain()
        .await
        .unwrap();
    assert_eq!((s.provider.charges(), s.provider.requests()), (1, 1));
    assert_eq!(
        count(
            &s.pool,
            "SELECT count(*) FROM subscriptions WHERE status = 'active' AND charge_id LIKE 'ch_%'"
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_after_the_provider_accepted_is_retried_with_the_same_key_and_charges_once()
{
    let s = setup().await;
    let client = oncely_testdb::http();
    assert_eq!(subscribe(&client, &s.base, "sub-2").await.0, 201);
    s.provider.stall_after_accept(1);

    // The first worker's charge is accepted, then it dies waiting for the answer.
    let lease = Duration::from_millis(500);
    let shutdown = CancellationToken::new();
    let doomed = tokio::spawn(worker(&s, lease, Duration::from_secs(60)).run(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.provider.requests() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    doomed.abort();
    assert_eq!(s.provider.charges(), 1);

    // Another worker takes the job when the lease ends and retries with the same key.
    let survivor = worker(&s, lease, Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(10);
    let record = loop {
        survivor.drain().await.unwrap();
        let record = s.jobs.list(&Default::default()).await.unwrap().remove(0);
        if record.status != JobStatus::Pending || Instant::now() > deadline {
            break record;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(record.status, JobStatus::Sent);
    assert_eq!(s.provider.requests(), 2, "the job was retried");
    assert_eq!(
        s.provider.charges(),
        1,
        "and the provider still made one charge"
    );
    let results: Vec<_> = s
        .jobs
        .attempts(record.id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.result.unwrap_or_default())
        .collect();
    assert_eq!(results, ["abandoned", "sent"]);
    assert_eq!(
        count(
            &s.pool,
            "SELECT count(*) FROM subscriptions WHERE status = 'active'"
        )
        .await,
        1
    );
}
