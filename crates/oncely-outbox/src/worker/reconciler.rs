//! The reconciler: settles parked jobs ([`JobStatus::Unknown`](crate::JobStatus)) of the kinds
//! that reconcile ([`OnUnknown::Reconcile`]) and whose handler can ask its provider
//! ([`Handler::reconciles`](super::Handler::reconciles)). Each look takes the due parked jobs
//! under a look lease ([`JobStore::claim_parked`]), asks the provider about each at once
//! ([`Handler::reconcile`](super::Handler::reconcile)), and acts on the answer:
//!
//! - **accepted**: settled as sent ([`Settlement::Sent`]) — the next claim records it sent
//!   without running it, naming its follow-ups;
//! - **not accepted**, once the job has been parked for its kind's
//!   [`KindOptions::reconcile_grace`](super::KindOptions::reconcile_grace) (10 minutes by
//!   default): settled for resending ([`Settlement::Resend`]) under the same delivery key.
//!   Sooner, a "no" is not believed yet: a message the provider was still taking when the
//!   attempt gave up (its answer slow, not lost) may be accepted after the attempt ended, and a
//!   resend then would be a second copy. It is asked again when the grace has passed. The age is
//!   the store's (on PostgreSQL the database's clock, which wrote `parked_at`), and the
//!   settlement checks it again in the same statement;
//! - **cannot say** (the lookup failed, timed out, panicked): asked again later, after as long
//!   as the job has been parked (from the policy's first delay up to its longest).
//!
//! Every change is guarded by the look's lease token and the parked status: an operator's
//! `oncely outbox settle` meanwhile wins, and a look that outlived its lease changes nothing. A
//! round that took a full batch is followed by another at once; otherwise the next comes after
//! the poll interval.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use super::{KindOptions, Registered, Worker};
use crate::job::Reconciled;
use crate::policy::OnUnknown;
use crate::store::{JobStore, OutboxError, ParkedJob, Settlement};

/// Share of the lease a look may take: the rest is margin before another look may take the job.
const LOOK_SHARE: f64 = 0.9;

/// What one round of looks did ([`Worker::reconcile_once`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciliation {
    /// Parked jobs looked at.
    pub looked: usize,
    /// Settled as sent: the provider had accepted them.
    pub sent: usize,
    /// Settled for resending: the provider had not accepted them.
    pub resend: usize,
    /// Left parked for a later look (the provider could not say yet, or too early to believe a
    /// "no"), or changed meanwhile by someone else.
    pub later: usize,
}

/// The reconciling kinds of a worker and what a look needs.
pub(super) struct Reconciler<S> {
    store: S,
    kinds: HashMap<String, Registered>,
    batch: u32,
    lease: Duration,
    poll_interval: Duration,
}

impl<S: JobStore> Worker<S> {
    /// The kinds whose parked jobs this worker looks at: they reconcile, and their handler can
    /// ask the provider. `None` if there are none.
    pub(super) fn reconciler(&self) -> Option<Reconciler<S>> {
        let kinds: HashMap<String, Registered> = self
            .handlers
            .iter()
            .filter(|(_, r)| r.options.on_unknown == OnUnknown::Reconcile && r.handler.reconciles())
            .map(|(kind, r)| (kind.clone(), r.clone()))
            .collect();
        (!kinds.is_empty()).then(|| Reconciler {
            store: self.store.clone(),
            kinds,
            batch: self.config.batch,
            lease: self.config.lease,
            poll_interval: self.config.poll_interval,
        })
    }

    /// Looks once at the parked jobs that are due for a look (up to the batch size) of the
    /// kinds that reconcile and can ask their provider, and settles them by the answers (see
    /// the module's docs). [`Worker::run`] does this every poll interval; call it yourself when
    /// you drive the worker with [`Worker::run_once`] or [`Worker::drain`].
    pub async fn reconcile_once(&self) -> Result<Reconciliation, OutboxError> {
        match self.reconciler() {
            Some(reconciler) => reconciler.once().await,
            None => Ok(Reconciliation::default()),
        }
    }
}

impl<S: JobStore> Reconciler<S> {
    /// Looks every poll interval until `shutdown` (at once again after a full batch).
    pub(super) async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.once().await {
                Ok(done) if done.looked >= self.batch as usize && !shutdown.is_cancelled() => {
                    continue;
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::error!(%error, "outbox reconciler could not look at parked jobs; retrying");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.poll_interval) => {}
            }
        }
    }

    /// One round of looks.
    pub(super) async fn once(&self) -> Result<Reconciliation, OutboxError> {
        let mut kinds: Vec<String> = self.kinds.keys().cloned().collect();
        kinds.sort();
        let parked = self
            .store
            .claim_parked(&kinds, self.batch, self.lease)
            .await?;
        let answers = join_all(parked.iter().map(|p| self.ask(p))).await;
        let mut done = Reconciliation {
            looked: parked.len(),
            ..Reconciliation::default()
        };
        for (parked, answer) in parked.iter().zip(answers) {
            self.act(parked, answer, &mut done).await?;
        }
        Ok(done)
    }

    /// The provider's answer about `parked`, bounded by the look's share of the lease.
    async fn ask(&self, parked: &ParkedJob) -> Reconciled {
        let Some(registered) = self.kinds.get(&parked.job.kind) else {
            return Reconciled::Unknown("no handler for its kind".to_owned());
        };
        let limit = self.lease.mul_f64(LOOK_SHARE);
        let look = AssertUnwindSafe(registered.handler.reconcile(&parked.job)).catch_unwind();
        match tokio::time::timeout(limit, look).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Reconciled::Unknown("the lookup panicked".to_owned()),
            Err(_) => Reconciled::Unknown(format!("no answer within {limit:?}")),
        }
    }

    /// Settles `parked` by `answer`, or leaves it for a later look; counts it in `done` (as
    /// `later` too when the look no longer held it: settled or taken by someone else meanwhile).
    async fn act(
        &self,
        parked: &ParkedJob,
        answer: Reconciled,
        done: &mut Reconciliation,
    ) -> Result<(), OutboxError> {
        let job = &parked.job;
        let parked_for = parked.parked_for;
        let grace = self
            .kinds
            .get(&job.kind)
            .map_or(KindOptions::DEFAULT_RECONCILE_GRACE, |r| {
                r.options.reconcile_grace
            });
        let settlement = match answer {
            Reconciled::Accepted {
                provider_message_id,
            } => Ok((Settlement::Sent, provider_message_id, None)),
            // Checked again by the settlement itself, on the clock that wrote `parked_at`.
            Reconciled::NotAccepted if parked_for >= grace => {
                Ok((Settlement::Resend, None, Some(grace)))
            }
            // Too early to believe a "no": asked again once the grace has passed.
            Reconciled::NotAccepted => Err(grace - parked_for),
            Reconciled::Unknown(reason) => {
                let policy = self.kinds.get(&job.kind).map(|r| r.options.policy);
                let policy = policy.unwrap_or_default();
                let after = parked_for.clamp(policy.base, policy.max_delay.max(policy.base));
                tracing::warn!(job = job.id, kind = %job.kind, %reason, ?after, "parked job: the provider cannot say whether it accepted it; asking again later");
                Err(after)
            }
        };
        match settlement {
            Ok((settlement, provider_message_id, parked_at_least)) => {
                let id = provider_message_id.as_deref();
                if self
                    .store
                    .settle_looked(parked, settlement, id, parked_at_least)
                    .await?
                {
                    match settlement {
                        Settlement::Sent => done.sent += 1,
                        Settlement::Resend => done.resend += 1,
                    }
                    tracing::info!(job = job.id, kind = %job.kind, settlement = settlement.as_str(), "parked job settled by asking its provider");
                    return Ok(());
                }
                tracing::info!(job = job.id, kind = %job.kind, settlement = settlement.as_str(), "parked job not settled by its look: settled meanwhile by an operator, taken over by a later look, or not parked long enough yet");
            }
            Err(after) => {
                self.store.look_later(parked, after).await?;
            }
        }
        done.later += 1;
        Ok(())
    }
}
