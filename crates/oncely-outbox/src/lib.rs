//! A transactional outbox: side effects recorded in the business transaction, delivered by
//! workers that claim, lease, retry and forward a stable delivery key.
//!
//! 1. Inside your transaction, [`postgres::enqueue`](store::postgres::enqueue) (or the SQLite
//!    one) inserts a [`NewJob`] named after the business intent (`signup-verification:t:42:1`).
//!    Its operation key is unique: enqueueing the same intent twice is a no-op that says so.
//!    After the transaction commits, call [`JobStore::wake`] on the job store: idle workers (in
//!    every process, on PostgreSQL) start at once. Enqueue itself does not notify — inside the
//!    transaction a NOTIFY would serialise every commit — and without a wake workers still find
//!    the job at their next poll.
//! 2. A [`Worker`] claims due jobs in batches (`FOR UPDATE SKIP LOCKED` on PostgreSQL) under a
//!    lease, runs the [`Handler`] of each job's kind *outside* any transaction, and records the
//!    attempt. `sent_at` is set only after the handler reports the effect happened.
//! 3. Failures retry with exponential backoff and jitter ([`RetryPolicy`]) up to a maximum
//!    number of attempts and a horizon; then the job is dead, with its reason. A crashed
//!    worker's jobs come back when their lease ends.
//!
//! Handlers get [`Job::delivery_key`]: stable for the job, to forward to providers that
//! deduplicate (an email API's `Idempotency-Key`, SMTP `Message-ID`). An *unknown* outcome
//! (timeout after the request was handed over) is retried with the same key.
//!
//! Map: [`job`] (jobs, outcomes), [`http`] (calling an API with the job's key), [`policy`] (the retry policy and its decision), [`store`] (the [`JobStore`] trait,
//! PostgreSQL and SQLite), [`worker`] (producer, executor, completer; shutdown), [`mail`] (email
//! messages and the SMTP and HTTP mailers).

#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod http;
pub mod job;
pub mod mail;
pub mod policy;
pub mod store;
pub mod worker;

pub use job::{AttemptResult, Delivery, Enqueued, Job, JobRecord, JobStatus, NewJob};
pub use policy::RetryPolicy;
pub use store::{JobStore, OutboxError};
pub use worker::{Handler, KindOptions, Worker, WorkerConfig};
