//! Recording results: every attempt finished by the time one is recorded goes in the same
//! write, and a failed write is retried, fenced by the lease tokens.

use std::time::Duration;

use futures::FutureExt;

use super::backoff::Backoff;
use super::executor::Ran;
use super::producer::InFlight;
use super::{KindOptions, Worker};
use crate::job::{Job, JobStatus};
use crate::store::{Finish, JobStore, OutboxError};

impl<S: JobStore> Worker<S> {
    /// Waits for the next job to finish and records it with every other one finished by then
    /// (see [`Worker::record_with`]).
    pub(super) async fn record_next(
        &self,
        flight: &mut InFlight,
    ) -> Result<Option<Duration>, OutboxError> {
        match flight.next().await {
            Some(first) => self.record_with(first, flight).await,
            None => Ok(None),
        }
    }

    /// Records `first` and every other job finished by now in one write; returns the soonest
    /// retry it scheduled.
    pub(super) async fn record_with(
        &self,
        first: Ran,
        flight: &mut InFlight,
    ) -> Result<Option<Duration>, OutboxError> {
        let mut done = vec![first];
        while let Some(Some(more)) = flight.next().now_or_never() {
            done.push(more);
        }
        self.observe(&done);
        let finished: Vec<(&Job, &Finish)> = done
            .iter()
            .filter_map(|ran| Some((&ran.job, ran.finish.as_ref()?)))
            .collect();
        if finished.is_empty() {
            return Ok(None);
        }
        let owned = self.finish_with_retries(&finished).await?;
        let mut soonest: Option<Duration> = None;
        for ((job, finish), owned) in finished.into_iter().zip(owned) {
            if !owned {
                tracing::warn!(
                    job = job.id,
                    "outbox lease lost before the attempt was recorded"
                );
            } else if finish.status == JobStatus::Pending {
                soonest = Some(soonest.map_or(finish.retry_in, |s| s.min(finish.retry_in)));
            }
        }
        Ok(soonest)
    }

    /// Records finished attempts. A failed write (a database blip) is retried with backoff for
    /// up to a lease: the attempts already happened, and a result that is never recorded makes
    /// the job run — the email be sent — again after its lease. Every write is fenced by the
    /// claim's lease token, so a late one cannot overwrite another worker's claim (it reports
    /// the lease as lost instead).
    async fn finish_with_retries(
        &self,
        finished: &[(&Job, &Finish)],
    ) -> Result<Vec<bool>, OutboxError> {
        let mut backoff = Backoff::until(tokio::time::Instant::now() + self.config.lease);
        loop {
            let error = match self.store.finish_all(finished).await {
                Ok(owned) => return Ok(owned),
                Err(error) => error,
            };
            let Some(delay) = backoff.next() else {
                return Err(error);
            };
            tracing::warn!(%error, retry_in = ?delay, jobs = finished.len(), "recording outbox attempts failed; retrying");
            metrics::counter!("oncely_outbox_finish_retries_total").increment(1);
            tokio::time::sleep(delay).await;
        }
    }

    /// Tells the holds what the finished attempts said about the other side (a refusal pauses
    /// their kind, an acceptance or a throttle resumes it; a throttle's wait holds it; see
    /// `holds.rs`).
    fn observe(&self, done: &[Ran]) {
        let now = self.store.now();
        let mut holds = self.holds();
        for ran in done {
            let interval = self
                .handlers
                .get(&ran.job.kind)
                .map_or(KindOptions::DEFAULT_PROBE_INTERVAL, |r| {
                    r.options.probe_interval
                });
            holds.observe(&ran.job.kind, ran.verdict.as_ref(), now, interval);
        }
    }
}
