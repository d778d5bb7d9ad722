//! The storm: every intent (a signup with its own key) sent through `oncely-client`
//! round-robin to the APIs and retried until it has a final answer; then the drain.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use oncely_client::{Client, Operation, RetryPolicy};
use sqlx::PgPool;

use crate::Report;
use crate::monkey::Progress;

/// Sends every address's signup, `concurrency` at once, each retried with its key until a final
/// answer or `deadline`; counts the answers into `report`. Returns, for each address, whether
/// its signup was acknowledged (a 2xx).
pub(crate) async fn run(
    endpoints: Vec<reqwest::Url>,
    addresses: &[String],
    concurrency: usize,
    deadline: Instant,
    progress: &Progress,
    report: &mut Report,
) -> anyhow::Result<Vec<bool>> {
    let client = Client::with_endpoints(endpoints).policy(RetryPolicy {
        max_attempts: u32::MAX,
        initial_delay: Duration::from_millis(50),
        max_delay: Duration::from_secs(1),
        max_retry_after: Duration::from_secs(2),
        deadline: deadline.saturating_duration_since(Instant::now()),
        attempt_timeout: Duration::from_secs(10),
    });
    let attempts = Arc::new(AtomicU64::new(0));
    let answers: Vec<_> = futures::stream::iter(addresses.iter().cloned().enumerate())
        .map(|(i, email)| {
            let client = client.clone();
            let attempts = attempts.clone();
            let answered = progress.answered.clone();
            async move {
                let op =
                    Operation::post("/v1/signup").json(&serde_json::json!({ "email": email }))?;
                let answer = client.send(&op).await;
                answered.fetch_add(1, Ordering::Relaxed);
                if let Ok(a) = &answer {
                    attempts.fetch_add(u64::from(a.attempts), Ordering::Relaxed);
                } else if let Err(oncely_client::Error::GaveUp { attempts: n, .. }) = &answer {
                    attempts.fetch_add(u64::from(*n), Ordering::Relaxed);
                }
                anyhow::Ok((i, answer))
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    report.intents = addresses.len() as u64;
    report.attempts = attempts.load(Ordering::Relaxed);
    let mut acknowledged = vec![false; addresses.len()];
    for answer in answers {
        let (i, answer) = answer?;
        match answer {
            Ok(a) if a.is_success() => {
                acknowledged[i] = true;
                report.acknowledged += 1;
                report.replayed += u64::from(a.replayed);
            }
            Ok(_) => report.rejected += 1,
            Err(_) => report.unanswered += 1,
        }
    }
    Ok(acknowledged)
}

/// Waits until no outbox job is pending (a job failed by a fault waits for its retry delay:
/// 2 s, then 4 s, …) or `deadline`.
pub(crate) async fn drain(pool: &PgPool, deadline: Instant) {
    loop {
        let pending: Result<i64, _> =
            // Parked jobs too: the reconciler settles them, then they are sent.
            sqlx::query_scalar(
                "SELECT count(*) FROM oncely_outbox WHERE status IN ('pending', 'unknown')",
            )
                .fetch_one(pool)
                .await;
        if pending.is_ok_and(|n| n == 0) || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
