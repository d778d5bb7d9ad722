//! The storm: every intent (a signup with its own key) sent through `oncely-client`
//! round-robin to the APIs and retried until it has a final answer; then the drain.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use oncely_client::{Attempted, Client, Operation, RetryPolicy};
use sqlx::PgPool;

use crate::monkey::Progress;
use crate::{Availability, Report};

/// Sends every address's signup, `concurrency` at once (and, with a `rate`, no more intents
/// per second than that), each retried with its key until a final
/// answer or `deadline`; counts the answers into `report`, and every attempt's outcome into
/// `report.availability`. Returns, for each address, whether its signup was acknowledged (a
/// 2xx).
pub(crate) async fn run(
    endpoints: Vec<reqwest::Url>,
    addresses: &[String],
    concurrency: usize,
    rate: Option<f64>,
    deadline: Instant,
    progress: &Progress,
    report: &mut Report,
) -> anyhow::Result<Vec<bool>> {
    let started = Instant::now();
    let seen: Arc<Mutex<Vec<(Duration, Attempted)>>> = Arc::default();
    let log = seen.clone();
    let client = Client::with_endpoints(endpoints)
        .on_attempt(move |attempted| {
            log.lock().unwrap().push((started.elapsed(), attempted));
        })
        .policy(RetryPolicy {
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
                // Paced: intent i starts no earlier than i / rate seconds into the storm.
                if let Some(rate) = rate.filter(|r| *r > 0.0) {
                    let due = started + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
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
    report.availability = availability(&seen.lock().unwrap(), started.elapsed());
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

/// The attempts' outcomes counted, and the longest stretch without a 2xx between the storm's
/// start and its `end`.
fn availability(seen: &[(Duration, Attempted)], end: Duration) -> Availability {
    let mut figures = Availability::default();
    let mut last_2xx = Duration::ZERO;
    let mut longest = (Duration::ZERO, Duration::ZERO);
    let mut gap_to = |at: Duration, last: &mut Duration| {
        let gap = at.saturating_sub(*last);
        if gap > longest.0 {
            longest = (gap, *last);
        }
        *last = at;
    };
    let mut ordered = seen.to_vec();
    ordered.sort_by_key(|(at, _)| *at);
    for (at, attempted) in ordered {
        match attempted {
            Attempted::Answered(status) if status.is_success() => {
                figures.answers_2xx += 1;
                gap_to(at, &mut last_2xx);
            }
            Attempted::Answered(status) if status.as_u16() == 503 => figures.answers_503 += 1,
            Attempted::Answered(status) if status.is_server_error() => {
                figures.answers_other_5xx += 1;
            }
            Attempted::Answered(status) if matches!(status.as_u16(), 409 | 429) => {
                figures.answers_409_429 += 1;
            }
            Attempted::Answered(_) => {}
            Attempted::NoAnswer => figures.no_answer += 1,
        }
    }
    gap_to(end, &mut last_2xx);
    figures.longest_without_2xx_s = longest.0.as_secs_f64();
    figures.longest_without_2xx_from_s = longest.1.as_secs_f64();
    figures
}

/// Waits until no outbox job is pending (a job failed by a fault waits for its retry delay:
/// 2 s, then 4 s, …) or `deadline`; returns whether none is.
pub(crate) async fn drain(pool: &PgPool, deadline: Instant) -> bool {
    loop {
        let pending: Result<i64, _> =
            // Parked jobs too: the reconciler settles them, then they are sent.
            sqlx::query_scalar(
                "SELECT count(*) FROM oncely_outbox WHERE status IN ('pending', 'unknown')",
            )
                .fetch_one(pool)
                .await;
        if pending.as_ref().is_ok_and(|n| *n == 0) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits like [`drain`], but gives up early when the outbox stops moving: no job sent for
/// `stall` while some job is more than 10 s overdue (a job waiting out its retry delay, a
/// throttle or a paused kind is not). Returns whether none is pending.
pub(crate) async fn drain_moving(pool: &PgPool, deadline: Instant, stall: Duration) -> bool {
    let mut sent_before = -1i64;
    let mut moved = Instant::now();
    loop {
        let counts: Result<(i64, i64, i64), _> = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status IN ('pending', 'unknown')), \
                    count(*) FILTER (WHERE status IN ('pending', 'unknown') \
                                     AND run_after < now() - interval '10 seconds'), \
                    count(*) FILTER (WHERE status = 'sent') FROM oncely_outbox",
        )
        .fetch_one(pool)
        .await;
        if let Ok((pending, overdue, sent)) = counts {
            if pending == 0 {
                return true;
            }
            if sent != sent_before || overdue == 0 {
                sent_before = sent;
                moved = Instant::now();
            }
        }
        if Instant::now() >= deadline || moved.elapsed() >= stall {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
