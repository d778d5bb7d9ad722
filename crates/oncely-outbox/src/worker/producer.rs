//! The producer: claims due jobs whenever a claim group has free slots, and sleeps until a
//! wake-up, a retry it scheduled comes due, or the poll interval.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::executor::Ran;
use super::{Registered, Worker};
use crate::job::Job;
use crate::store::{JobStore, OutboxError};

/// One claim a round makes: every unlimited kind together (up to the batch size), each kind
/// with a concurrency or a per-partition limit on its own (up to its concurrency). A claim's
/// index in [`ClaimGroups`] is its group in [`InFlight`].
pub(super) struct ClaimGroup {
    pub(super) kinds: Vec<String>,
    /// How many of its jobs run at once.
    pub(super) limit: u32,
    /// At most this many jobs of one partition at once ([`KindOptions::per_partition`](
    /// super::KindOptions::per_partition); its one kind's).
    pub(super) per_partition: Option<u32>,
}

/// The claims one round makes; see [`ClaimGroup`].
pub(super) type ClaimGroups = Vec<ClaimGroup>;

impl<S: JobStore> Worker<S> {
    /// See [`ClaimGroups`].
    pub(super) fn claim_groups(&self) -> ClaimGroups {
        let mut unlimited = Vec::new();
        let mut groups = Vec::new();
        for (kind, registered) in &self.handlers {
            let options = &registered.options;
            if options.concurrency.is_none() && options.per_partition.is_none() {
                unlimited.push(kind.clone());
                continue;
            }
            let limit = options.concurrency.unwrap_or(self.config.batch);
            groups.push(ClaimGroup {
                kinds: vec![kind.clone()],
                // Its own slots: a kind's concurrency may exceed the batch size.
                limit: limit.max(1),
                per_partition: options.per_partition.map(|n| n.max(1)),
            });
        }
        if !unlimited.is_empty() {
            groups.push(ClaimGroup {
                kinds: unlimited,
                limit: self.config.batch,
                per_partition: None,
            });
        }
        groups
    }

    /// Runs until `shutdown` is cancelled: then it stops claiming, lets the jobs in hand finish
    /// (each handler is bounded by the lease), and returns.
    ///
    /// Jobs run continuously: whenever a claim group (the unlimited kinds, or a limited kind)
    /// has free slots, the worker claims that many more; a slow job holds its own slot only,
    /// never the next claim.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), OutboxError> {
        let mut wakeup = self.store.wakeup(&self.kinds());
        tracing::info!(worker = %self.config.id, kinds = ?self.kinds(), "outbox worker started");
        // Parked jobs are looked at beside the claims, every poll interval, in a task of their
        // own: a slow provider lookup never holds up a claim.
        let reconciler = self
            .reconciler()
            .map(|reconciler| tokio::spawn(reconciler.run(shutdown.clone())));
        let groups = self.claim_groups();
        let mut flight = InFlight::default();
        // A retry this worker scheduled is due before the next poll: wake for it, not later.
        let mut retry_at: Option<Instant> = None;
        loop {
            let (free_slots, claim_failed) = if shutdown.is_cancelled() {
                (false, false)
            } else {
                self.claim_free_slots(&groups, &mut flight, &shutdown).await
            };
            if flight.is_empty() && shutdown.is_cancelled() {
                break;
            }
            let now = Instant::now();
            retry_at = retry_at.filter(|at| *at > now);
            let wait = match (claim_failed, retry_at) {
                (true, _) | (false, None) => self.config.poll_interval,
                (false, Some(at)) => (at - now).min(self.config.poll_interval),
            };
            let recorded = if flight.is_empty() {
                // Idle: until new work is announced, a retry comes due, or the poll interval.
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = wakeup.wait(wait), if !claim_failed => {}
                    () = tokio::time::sleep(wait), if claim_failed => {}
                }
                Ok(None)
            } else if free_slots && !shutdown.is_cancelled() {
                // Busy with room to spare: a finished job, or new work, whichever comes first.
                // (Only the wait for a finished job is cancelled here, never its recording.)
                let finished = tokio::select! {
                    biased;
                    finished = flight.next() => finished,
                    () = shutdown.cancelled() => None,
                    () = wakeup.wait(wait) => None,
                };
                match finished {
                    Some(first) => self.record_with(first, &mut flight).await,
                    None => Ok(None),
                }
            } else {
                self.record_next(&mut flight).await
            };
            match recorded {
                Ok(Some(delay)) => {
                    let at = Instant::now() + delay;
                    retry_at = Some(retry_at.map_or(at, |r| r.min(at)));
                }
                Ok(None) => {}
                Err(error) => tracing::error!(
                    %error,
                    "outbox attempts not recorded; they run again when their lease ends"
                ),
            }
        }
        if let Some(reconciler) = reconciler
            && let Err(error) = reconciler.await
        {
            tracing::error!(%error, "outbox reconciler task failed");
        }
        tracing::info!(worker = %self.config.id, "outbox worker stopped");
        Ok(())
    }

    /// Claims as many jobs as each group has free slots and starts them (no group once
    /// `shutdown` is cancelled, even between two groups). Returns whether some
    /// group kept free slots (it found fewer jobs than it asked for), and whether a claim
    /// failed.
    async fn claim_free_slots(
        &self,
        groups: &ClaimGroups,
        flight: &mut InFlight,
        shutdown: &CancellationToken,
    ) -> (bool, bool) {
        let (mut free_slots, mut claim_failed) = (false, false);
        for (group, claim) in groups.iter().enumerate() {
            // Each group's claim is a statement of its own that can wait (a lock, a busy
            // database): a shutdown signalled meanwhile stops the groups not yet claimed.
            if shutdown.is_cancelled() {
                break;
            }
            let free = claim.limit.saturating_sub(flight.running(group));
            if free == 0 {
                continue;
            }
            let deadline = self.deadline();
            let (jobs, claimed) = self
                .claim_kinds(claim, free, flight.partitions(group))
                .await;
            free_slots |= (jobs.len() as u32) < free;
            for job in jobs {
                flight.push(group, job.partition.clone(), self.spawn(job, deadline));
            }
            if let Err(error) = claimed {
                tracing::error!(%error, "outbox worker could not claim; retrying");
                free_slots = true;
                claim_failed = true;
            }
        }
        (free_slots, claim_failed)
    }

    /// Claims up to `free` due jobs of the group's kinds, leaving out the kinds this worker
    /// holds back (`holds.rs`): a throttled kind until its wait ends, a paused kind but for one
    /// probe job when its probe is due. A group with a per-partition limit takes at most each
    /// partition's room, `running` saying how many jobs of each it runs now. Returns the jobs
    /// claimed even when a later claim failed (they must run), and the failure.
    pub(super) async fn claim_kinds(
        &self,
        group: &ClaimGroup,
        mut free: u32,
        running: HashMap<String, u32>,
    ) -> (Vec<Job>, Result<(), OutboxError>) {
        let claimable = self.holds().claimable(&group.kinds, self.store.now());
        let mut jobs = Vec::new();
        let mut claimed = Ok(());
        if !claimable.free.is_empty() {
            match self.claim(&claimable.free, free, group, &running).await {
                Ok(found) => {
                    free = free.saturating_sub(found.len() as u32);
                    jobs = found;
                }
                Err(error) => claimed = Err(error),
            }
        }
        for kind in claimable.probes {
            let probe = if free == 0 || claimed.is_err() {
                Ok(Vec::new())
            } else {
                let kind = std::slice::from_ref(&kind);
                self.claim(kind, 1, group, &running).await
            };
            match probe {
                Ok(found) if !found.is_empty() => {
                    free -= 1;
                    jobs.extend(found);
                }
                Ok(_) => self.holds().no_probe(&kind),
                Err(error) => {
                    self.holds().no_probe(&kind);
                    claimed = Err(error);
                }
            }
        }
        (jobs, claimed)
    }

    /// One claim of up to `limit` jobs of `kinds` (of `group`): by partition when the group has
    /// a per-partition limit (its one kind).
    async fn claim(
        &self,
        kinds: &[String],
        limit: u32,
        group: &ClaimGroup,
        running: &HashMap<String, u32>,
    ) -> Result<Vec<Job>, OutboxError> {
        let (id, lease) = (&self.config.id, self.config.lease);
        // The kinds whose attempts record their point of no return: armed by the claim.
        let marking: Vec<String> = kinds
            .iter()
            .filter(|kind| self.handlers.get(*kind).is_some_and(Registered::marks))
            .cloned()
            .collect();
        match (group.per_partition, kinds) {
            (Some(per_partition), [kind]) => {
                let marks = !marking.is_empty();
                self.store
                    .claim_partitioned_marking(
                        id,
                        kind,
                        limit,
                        per_partition,
                        running,
                        lease,
                        marks,
                    )
                    .await
            }
            _ => {
                self.store
                    .claim_marking(id, kinds, limit, lease, &marking)
                    .await
            }
        }
    }
}

/// The jobs a worker is running, each in its own task, with a count per claim group and per
/// partition of a group.
#[derive(Default)]
pub(super) struct InFlight {
    tasks: FuturesUnordered<Tagged>,
    per_group: HashMap<usize, u32>,
    per_partition: HashMap<(usize, String), u32>,
}

/// A running job's task, its claim group and its partition.
type Tagged = Pin<Box<dyn Future<Output = (usize, Option<String>, Option<Ran>)> + Send>>;

impl InFlight {
    pub(super) fn push(&mut self, group: usize, partition: Option<String>, task: JoinHandle<Ran>) {
        *self.per_group.entry(group).or_default() += 1;
        if let Some(partition) = &partition {
            *self
                .per_partition
                .entry((group, partition.clone()))
                .or_default() += 1;
        }
        self.tasks
            .push(Box::pin(async move { (group, partition, task.await.ok()) }));
    }

    fn running(&self, group: usize) -> u32 {
        self.per_group.get(&group).copied().unwrap_or(0)
    }

    /// How many jobs of each partition of `group` run.
    pub(super) fn partitions(&self, group: usize) -> HashMap<String, u32> {
        self.per_partition
            .iter()
            .filter(|((g, _), _)| *g == group)
            .map(|((_, partition), n)| (partition.clone(), *n))
            .collect()
    }

    pub(super) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The next finished job (`None` once nothing runs). A task that failed outright (it cannot:
    /// the executor catches panics) leaves its job to run again when its lease ends.
    pub(super) async fn next(&mut self) -> Option<Ran> {
        loop {
            let (group, partition, result) = self.tasks.next().await?;
            if let Some(count) = self.per_group.get_mut(&group) {
                *count -= 1;
            }
            if let Some(partition) = partition {
                let key = (group, partition);
                if let Some(count) = self.per_partition.get_mut(&key) {
                    *count -= 1;
                    if *count == 0 {
                        self.per_partition.remove(&key);
                    }
                }
            }
            match result {
                Some(ran) => return Some(ran),
                None => tracing::error!(
                    "an outbox job's task failed; it runs again when its lease ends"
                ),
            }
        }
    }
}
