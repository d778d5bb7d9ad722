//! A transactional outbox: side effects recorded in the business transaction, delivered by
//! workers that claim, lease, retry and forward a stable delivery key.
//!
//! 1. Inside your transaction, [`JobStore::enqueue`] inserts a [`NewJob`] named after the
//!    business intent (`signup-verification:t:42:1`). Its operation key is unique: enqueueing
//!    the same intent twice is a no-op that says so. Idle workers learn of the job when it
//!    commits, with nothing to call afterwards: on SQLite the store signals this process's
//!    workers (their claim waits for the commit); on PostgreSQL a NOTIFY, rate-limited to one
//!    notifying commit per short window, reaches workers in every process through one listener
//!    per process on a connection of its own ([`store::postgres`]). A worker is woken only for
//!    the kinds it runs, once however many jobs arrived while it was busy ([`store::Wakeup`]).
//!    Polling stays as the fallback.
//! 2. A [`Worker`] claims due jobs in batches (`FOR UPDATE SKIP LOCKED` on PostgreSQL) under a
//!    lease, runs the [`Handler`] of each job's kind *outside* any transaction (stopped at 90 %
//!    of the lease counted from before the claim), and records the attempt. `sent_at` is set only after the handler reports the effect happened.
//! 3. Failures retry with exponential backoff and jitter ([`RetryPolicy`]) up to a maximum
//!    number of attempts and a horizon; then the job is dead, with its reason. A throttling
//!    provider ([`Delivery::Throttled`]) is waited for without spending an attempt, and the
//!    worker holds the kind until its `Retry-After`; a provider that refuses our credentials
//!    ([`Delivery::Refused`]) pauses the kind, with one probe job per interval, until it
//!    accepts again. A crashed worker's jobs come back when their lease ends.
//!
//! 4. A job's final status (sent, dead, skipped) is written with its *follow-up jobs*, in the
//!    same write: [`Handler::then`] names them from how the job [`Ended`] (an `email.sent`
//!    event), the store inserts them only if its finish still owns the job, each unless its
//!    operation key exists, and wakes their workers. If `then` fails, the final status waits:
//!    the job stays pending and runs again soon, spending no attempt, under the same key.
//!
//! Jobs of a kind may name a *partition* ([`NewJob::partition`]: a webhook's endpoint); with
//! [`KindOptions::per_partition`] a worker runs at most that many jobs of one partition at once,
//! and a partition at its limit never keeps the kind's other partitions waiting
//! ([`JobStore::claim_partitioned`]).
//!
//! Handlers get [`Job::delivery_key`]: stable for the job, to forward to providers that
//! deduplicate (an email API's `Idempotency-Key`, SMTP `Message-ID`). An *unknown* outcome
//! (timeout after the request was handed over) is retried with the same key — and, for a
//! handler that freezes its payload at the first attempt ([`Handler::freeze`],
//! [`Job::frozen`]), with the same payload, as a deduplicating provider requires. Under
//! [`OnUnknown::Reconcile`] such a job is parked instead, until someone knows — but only if the
//! attempt may have reached the provider: a handler whose transport can tell the moment its data
//! is handed over (the mailers: SMTP after `DATA`'s 354, HTTP before the request) records that
//! *point of no return* in the attempt's row first ([`PointOfNoReturn`],
//! [`Handler::run_marked`]), so an attempt abandoned before it is retried as any retry.
//!
//! Map: [`job`] (jobs, outcomes, attempt results), [`http`] (calling an API with the job's key),
//! [`policy`] (the retry policy and its decision), [`store`] (the [`JobStore`] trait, written
//! once over a dialect: PostgreSQL with feature `postgres`, SQLite with feature `sqlite`, both
//! on by default), [`worker`] (producer, executor, completer; shutdown), [`mail`] (email
//! messages and the SMTP and HTTP mailers).

#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod http;
pub mod job;
pub mod mail;
pub mod policy;
pub mod store;
pub mod worker;

pub use job::{
    AttemptResult, Delivery, DeliveryFuture, Ended, Enqueued, FreezeFuture, Job, JobRecord,
    JobStatus, MarkFuture, NewJob, PointOfNoReturn, ReconcileFuture, Reconciled, ThenError,
    ThenFuture, Unrecorded,
};
pub use policy::{OnUnknown, RetryPolicy};
pub use store::{JobStore, OutboxError, ParkedJob, Settlement};
pub use worker::{Handler, KindOptions, Reconciliation, Worker, WorkerConfig};
