//! Worker benchmarks on PostgreSQL, printing one JSON line each:
//! - `drain seed N`: inserts N pending jobs of kind `noop` (one statement);
//! - `drain run W [B]`: W workers (no-op handler, claiming B jobs at a time, 64 by default)
//!   until nothing is pending; jobs and seconds. BEST, as bench/run runs it: 4 workers in all,
//!   B = 500. Measured here (2 cores, PostgreSQL 15, 20,000 jobs, 2026-12-02, ±20 % between
//!   repeats), jobs/s, 1 process: 1 × 64 ≈ 6,000; 1 × 256 ≈ 8,300; 1 × 1000 ≈ 7,000;
//!   2 × 500 ≈ 10,800–13,300; 4 × 500 ≈ 11,000–14,900; 4 × 1000 ≈ 9,500; 8 × 250 ≈ 9,100.
//!   2 processes (per process): 1 × 64 ≈ 3,700–11,800; 1 × 500 ≈ 14,800; 2 × 250 ≈ 12,100;
//!   2 × 500 ≈ 9,000–16,300. Where the time goes: the drain process used 0.37 s of CPU in a
//!   1.86 s drain — PostgreSQL is the bound (claims of 500 take 10–40 ms, finishes about 10).
//!   Neither writing each attempt row once (at its end) nor dropping the attempts' foreign
//!   key moved the figure by more than the noise (about 5 %);
//! - `drain latency N`: one idle worker (LISTEN/NOTIFY); N jobs enqueued one per commit (the
//!   store notifies by itself), 10 ms apart; the delay from commit to the handler starting,
//!   p50/p95/p99;
//! - `drain enqueue C [in-tx]`: C concurrent enqueuers for 5 s, each transaction one job (the
//!   store's rate-limited NOTIFY); with `in-tx`, a `pg_notify` inside every transaction as well
//!   (how enqueue notified before issue 12): commits per second.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oncely_outbox::store::postgres::PgJobStore;
use oncely_outbox::{Delivery, Handler, Job, JobStore, NewJob, Worker, WorkerConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Noop(Option<Arc<Mutex<Vec<f64>>>>);

impl Handler for Noop {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        if let Some(latencies) = &self.0 {
            let waited = time::OffsetDateTime::now_utc() - job.created_at;
            latencies
                .lock()
                .expect("lock")
                .push(waited.as_seconds_f64() * 1000.0);
        }
        Box::pin(async {
            Delivery::Sent {
                provider_message_id: None,
            }
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (command, n) = (
        args.get(1).map(String::as_str),
        args.get(2)
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1),
    );
    // The pool as `oncely serve` has it: no ping before every acquire.
    let pool = oncely::store::postgres::pool_options()
        .max_connections(if command == Some("enqueue") {
            n as u32 + 2
        } else {
            8
        })
        .connect(&std::env::var("DATABASE_URL")?)
        .await?;
    let store = PgJobStore::new(pool.clone());
    store.migrate().await?;
    match command {
        Some("seed") => {
            sqlx::query(
                "INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key)
                 SELECT 'noop:' || gen_random_uuid(), 'noop', '{}'::jsonb, gen_random_uuid() FROM generate_series(1, $1)",
            )
            .bind(n as i64)
            .execute(&pool)
            .await?;
            println!("{}", json!({ "seeded": n }));
        }
        Some("run") => {
            let batch = args
                .get(3)
                .and_then(|b| b.parse::<u32>().ok())
                .unwrap_or(64);
            let started = Instant::now();
            let mut workers = Vec::new();
            for i in 0..n {
                let config = WorkerConfig {
                    id: format!("bench-{i}"),
                    batch,
                    poll_interval: Duration::from_millis(20),
                    ..WorkerConfig::default()
                };
                let worker = Worker::new(store.clone(), config).handle("noop", Noop(None));
                workers.push(tokio::spawn(async move { worker.drain().await }));
            }
            let mut done = 0;
            for w in workers {
                done += w.await??;
            }
            println!(
                "{}",
                json!({ "jobs": done, "seconds": started.elapsed().as_secs_f64() })
            );
        }
        Some("latency") => {
            let latencies = Arc::new(Mutex::new(Vec::new()));
            let shutdown = CancellationToken::new();
            let config = WorkerConfig {
                poll_interval: Duration::from_secs(5),
                ..WorkerConfig::default()
            };
            let worker =
                Worker::new(store.clone(), config).handle("noop", Noop(Some(latencies.clone())));
            let running = tokio::spawn(worker.run(shutdown.clone()));
            tokio::time::sleep(Duration::from_millis(300)).await;
            for i in 0..n {
                let mut tx = pool.begin().await?;
                let job = NewJob::new(format!("latency:{i}:{}", uuid()), "noop", json!({}));
                store.enqueue(&mut tx, &job).await?;
                tx.commit().await?;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            shutdown.cancel();
            running.await??;
            let mut l = latencies.lock().expect("lock").clone();
            l.sort_by(f64::total_cmp);
            let pct = |p: f64| {
                l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or(0.0)
            };
            println!(
                "{}",
                json!({ "jobs": l.len(), "p50_ms": pct(0.5), "p95_ms": pct(0.95), "p99_ms": pct(0.99) })
            );
        }
        Some("enqueue") => {
            let in_tx = args.get(3).map(String::as_str) == Some("in-tx");
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut tasks = Vec::new();
            for t in 0..n {
                let (pool, store) = (pool.clone(), store.clone());
                tasks.push(tokio::spawn(async move {
                    let mut commits = 0u64;
                    while Instant::now() < deadline {
                        let mut tx = pool.begin().await?;
                        let job = NewJob::new(format!("enq:{t}:{}", uuid()), "noop", json!({}));
                        store.enqueue(&mut tx, &job).await?;
                        if in_tx {
                            sqlx::query("SELECT pg_notify('oncely_outbox', 'noop')")
                                .execute(&mut *tx)
                                .await?;
                        }
                        tx.commit().await?;
                        commits += 1;
                    }
                    anyhow::Ok(commits)
                }));
            }
            let mut commits = 0;
            for task in tasks {
                commits += task.await??;
            }
            println!(
                "{}",
                json!({ "enqueuers": n, "notify": if in_tx { "in every transaction" } else { "rate-limited in transaction" }, "commits_per_s": commits as f64 / 5.0 })
            );
        }
        _ => anyhow::bail!(
            "usage: drain seed N | drain run WORKERS | drain latency N | drain enqueue C [in-tx]"
        ),
    }
    Ok(())
}

fn uuid() -> u64 {
    rand::random()
}
