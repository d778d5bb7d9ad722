//! The outbox's statements: one module per dialect ([`postgres`](self::postgres),
//! [`sqlite`](self::sqlite)), each implementing [`Statements`] under the same names. The
//! store's Rust binds the same parameters, in the same order, for either; each statement's
//! contract is documented here once. Where the dialects' SQL differs, a comment there says why.
//! The defaults are the statements both dialects run word for word (sqlx binds `$n` on SQLite
//! too).
//!
//! Times: `now` is a moment of the dialect ([`Dialect::Moment`](super::Dialect::Moment)):
//! PostgreSQL binds `NULL` unless the store's clock is manual (`COALESCE($n, now())`), SQLite
//! always the clock's time. Durations are milliseconds.

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "postgres")]
pub(crate) use postgres::NOTIFY;

/// A job's record for operators, with `all_attempts`: its attempt rows over its whole life
/// (re-drives included). Both dialects, word for word.
macro_rules! record {
    () => {
        "
        SELECT o.id, o.operation_key, o.kind, o.status, o.attempts, o.free_attempts,
               (SELECT count(*) FROM oncely_outbox_attempts a WHERE a.job_id = o.id)
                   AS all_attempts,
               o.last_error, o.provider_message_id, o.payload, o.delivery_key, o.frozen,
               o.partition_key, o.created_at, o.run_after, o.sent_at, o.dead_at, o.skipped_at,
               o.redriven_at, o.parked_at
          FROM oncely_outbox o"
    };
}

/// The statements of one dialect.
pub trait Statements {
    /// Inserts a job unless its operation key exists. Binds: 1 operation key, 2 kind, 3 payload
    /// (JSON), 4 delivery key, 5 not after (nullable), 6 now, 7 partition (nullable). Returns its
    /// `id` (no row if the key exists). Index: the unique index on `operation_key`.
    const ENQUEUE: &'static str;

    /// Claims due jobs: pushes `run_after` to the lease's end (a dead worker's job is due again
    /// then), sets the lease token, counts the attempt (returned with `free_attempts` and
    /// `redriven_at` for the policy), closes an unfinished earlier attempt as
    /// `abandoned` and opens one for this claim — ready to record its point of no return
    /// (`point_of_no_return = 'ahead'`) if its kind is among the marking kinds, else `NULL`
    /// (unknown). Binds: 1 now, 2 lease (ms), 3 lease token, 4 kinds (JSON array), 5 limit,
    /// 6 worker, 7 the marking kinds (JSON array). Returns the claimed jobs' rows. Index:
    /// `oncely_outbox_due_by_kind` (partial, pending only), once per kind.
    const CLAIM: &'static str;

    /// Claims due jobs of one kind as [`Statements::CLAIM`] does, at most a partition's room of
    /// each partition: its limit minus the jobs of it the worker runs. Binds: 1–6 as `CLAIM`
    /// (4: a JSON array of the one kind), 7 the limit per partition, 8 the jobs the worker runs
    /// per partition (a JSON object, partition to count; absent: none), 9 the marking kinds (a
    /// JSON array: the one kind, or none). Returns the claimed jobs' rows. Index: `oncely_outbox_due_by_partition` (partial, pending only); each
    /// dialect's comment says what it reads.
    const CLAIM_PARTITIONED: &'static str;

    /// Ends a batch of attempts: each job by primary key, guarded by its lease token and
    /// `pending` (setting `sent_at`, `dead_at`, `skipped_at` or `parked_at` by its new status;
    /// `unknown`: parked, due for a look after `retry_ms`; a settlement kept only while the job
    /// stays pending, so that a retry still carries it), and its open
    /// attempt row (`oncely_outbox_attempts_job`). Binds: 1 the batch
    /// (a JSON array of `{id, lease_token, status, retry_ms, result, provider_message_id,
    /// error, free, thaw}`; `free` adds one to the job's `free_attempts`, `thaw` empties its
    /// `frozen`), 2 now, 3 the follow-up jobs (a JSON array of `{job_id, lease_token,
    /// operation_key, kind, payload, delivery_key, not_after_ms, partition_key}`), inserted —
    /// `ON CONFLICT (operation_key) DO NOTHING` — only for the jobs it finishes. Returns rows
    /// `(id, kind)`: one `(id, NULL)` per job it finished (the others' leases were lost), one
    /// `(NULL, kind)` per follow-up it inserted.
    const FINISH: &'static str;

    /// Stores what a claimed job's first attempt froze, unless the job holds a frozen value
    /// already (the first writer wins), guarded by the lease token and `pending`. Binds: 1 id,
    /// 2 lease token, 3 the value (JSON). Returns the job's frozen value (this one or the
    /// earlier), no row if the claim no longer owns the job. Index: the primary key.
    const FREEZE: &'static str = "
        UPDATE oncely_outbox SET frozen = COALESCE(frozen, $3)
         WHERE id = $1 AND lease_token = $2 AND status = 'pending'
        RETURNING frozen";

    /// Records that a claimed job's open attempt reached its point of no return (its message is
    /// about to be handed over): `point_of_no_return = 'passed'`, `handed_over_at` now (kept if
    /// set), guarded by the attempt's and the job's lease token, the attempt open and the job
    /// `pending`. Binds: 1 id, 2 lease token, 3 now. Returns the job id if the claim still owns
    /// the job (no row: nothing may be handed over). Index: `oncely_outbox_attempts_job`, the
    /// job by its primary key.
    const PASS: &'static str;

    /// Hands a claimed job back unstarted: due now, the attempt uncounted and its row deleted.
    /// Binds: 1 id, 2 lease token, 3 now. Returns the id if the claim still owned the job.
    const RELEASE: &'static str;

    /// A job's record by operation key. Binds: 1 operation key. Index: the unique index on
    /// `operation_key`; its attempts counted by `oncely_outbox_attempts_job`.
    const JOB: &'static str = concat!(record!(), " WHERE o.operation_key = $1");

    /// A job's record by id. Binds: 1 id. Index: the primary key.
    const JOB_BY_ID: &'static str = concat!(record!(), " WHERE o.id = $1");

    /// Records for operators, newest first. Binds: 1 kind (nullable), 2 status (nullable),
    /// 3 limit.
    const LIST: &'static str = concat!(
        record!(),
        "
         WHERE ($1 IS NULL OR o.kind = $1) AND ($2 IS NULL OR o.status = $2)
         ORDER BY o.id DESC LIMIT $3"
    );

    /// A job's attempts in order (`started_at`, `finished_at`, `handed_over_at` in the
    /// dialect's moments). Binds: 1 job id. Index: `oncely_outbox_attempts_job`.
    const ATTEMPTS: &'static str = "
        SELECT attempt, worker, result, provider_message_id, error, started_at, finished_at,
               point_of_no_return, handed_over_at
          FROM oncely_outbox_attempts WHERE job_id = $1 ORDER BY id";

    /// How many jobs are pending.
    const PENDING: &'static str = "SELECT count(*) FROM oncely_outbox WHERE status = 'pending'";

    /// Pending jobs and the age of the oldest in seconds (`pending`, `oldest_pending_seconds`),
    /// parked jobs and how long the oldest has been parked (`parked`, `oldest_parked_seconds`).
    /// Binds: 1 now. Index: the parked ones by `oncely_outbox_parked_by_kind`.
    const BACKLOG: &'static str;

    /// Deletes a batch of jobs that finished (sent, dead or skipped) before a retention (their
    /// attempts cascade). Binds: 1 retention (ms), 2 limit, 3 now. Returns the deleted ids.
    /// Index: `oncely_outbox_finished`.
    const PRUNE: &'static str;

    /// The most recently skipped jobs (`operation_key`, `kind`, `last_error`, `payload`,
    /// `skipped_at`), newest first. Binds: 1 limit. A scan of the skipped rows (an inspection
    /// tool: the dev inbox shows them), no index of its own.
    const SKIPPED: &'static str = "
        SELECT operation_key, kind, last_error, payload, skipped_at
          FROM oncely_outbox WHERE status = 'skipped'
         ORDER BY skipped_at DESC, id DESC LIMIT $1";

    /// Re-drives a dead job: pending and due now, a fresh attempt budget (`attempts` and
    /// `free_attempts` back to 0), a fresh horizon (`redriven_at` now), the same delivery key,
    /// no settlement (`settled`: one that a previous release's worker left would skip the run).
    /// Binds: 1 operation key, 2 now. Returns its id if it was dead.
    const REDRIVE: &'static str;

    /// Settles a parked job (`unknown`): pending and due now, its lease token and `parked_at`
    /// cleared. `sent`: its attempt count kept and `settled = 'sent'`, which the next claim
    /// carries to the worker (recorded sent without running). `resend`: as a re-drive — a fresh
    /// attempt budget and horizon, the same delivery key and frozen payload. Binds: 1 id,
    /// 2 the settlement (`sent` or `resend`), 3 now, 4 a look's lease token (`NULL`: an
    /// operator's, whatever holds the job), 5 the provider's message id (`NULL`: keep), 6 how
    /// long it must have been parked, in ms (`NULL`: any time; by the database's clock, as
    /// `parked_at` was written). Returns its id if it was parked (and, with a token, the look
    /// held it, and it was parked long enough). Index: the primary key.
    const SETTLE: &'static str;

    /// Takes parked jobs due for a look: `run_after` pushed to the look lease's end, a fresh
    /// lease token; they stay `unknown`. Binds: 1 now, 2 look lease (ms), 3 lease token,
    /// 4 kinds (JSON array), 5 limit. Returns the jobs' rows as a claim does, with `parked_at`
    /// and `parked_ms` (how long it has been parked, by the database's clock). Index:
    /// `oncely_outbox_parked_by_kind` (partial, parked only: `kind`, `run_after`, `id`).
    const CLAIM_PARKED: &'static str;

    /// Leaves a job a look took parked, due for its next look later: `run_after` = now + the
    /// delay, the look's lease token cleared; only while the look holds it and it is parked.
    /// Binds: 1 id, 2 the look's lease token, 3 now, 4 the delay (ms). Returns its id if the
    /// look held it. Index: the primary key.
    const LOOK_LATER: &'static str;

    /// The dead jobs a filter matches (`matching`), how many of them had an attempt with an
    /// unknown outcome (`unknown`, `abandoned`) that ended before a window
    /// (`unknown_past_window`), and the moment counted at (`as_of`: now). The filter's binds,
    /// each nullable: 1 kind, 2 dead at or after (a moment), 3 a substring of `last_error`,
    /// ignoring case, 4 dead at or before (a moment); then 5 now, 6 the window (ms). A scan of
    /// the table (an operator's tool); the attempts by `oncely_outbox_attempts_job`.
    const DEAD_COUNT: &'static str;

    /// A sample of the dead jobs a filter matches (`operation_key`, `last_error`), the most
    /// recently dead first. Binds: 1–4 the filter (see [`Statements::DEAD_COUNT`]), 5 limit.
    const DEAD_SAMPLE: &'static str;

    /// The ids of the dead jobs a filter matches, in id order, for a bulk re-drive in the same
    /// transaction: on PostgreSQL locked `FOR UPDATE`, so that none changes before the
    /// transaction ends (SQLite's transaction holds the write lock already). Binds: 1–4 the
    /// filter (see [`Statements::DEAD_COUNT`]).
    const DEAD_IDS: &'static str;

    /// Re-drives dead jobs by id, as [`Statements::REDRIVE`] does one. Binds: 1 the ids (a JSON
    /// array), 2 now. Returns their ids. Index: the primary key.
    const REDRIVE_IDS: &'static str;
}
