//! The outbox's statements on PostgreSQL. Every write is one statement (data-modifying CTEs),
//! so it needs no transaction of its own; claims lock with `FOR UPDATE SKIP LOCKED`, so workers
//! never wait for each other. Times are `timestamptz`, `now` is `COALESCE($n, now())`: the
//! database's clock unless a test's clock is bound.

use sqlx::Postgres;

/// Wakes listening workers: inside an enqueuing transaction it is delivered at commit, never
/// on rollback. Binds: 1 channel, 2 payload (the kinds it announces as a JSON array; empty:
/// every kind).
pub(crate) const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// The end of a claim, after a CTE `due` of the ids to claim: claims them, closes their
/// unfinished earlier attempts as `abandoned`, opens this claim's — `point_of_no_return =
/// 'ahead'` for the jobs whose kind is in the JSON array bound at `$marking` (their worker records
/// the point of no return), `NULL` (unknown) for the others — and returns the claimed rows.
macro_rules! claimed {
    ($marking:literal) => {
        concat!(
            "
        ), claimed AS (
            -- Here too `= ANY (ARRAY(…))`: joined with `due`, the planner chose a scan of every
            -- job kept for claims of 500 (7.8 ms of a 9.4 ms claim with 20,000 sent jobs).
            UPDATE oncely_outbox o
               SET run_after = COALESCE($1, now()) + $2 * interval '1 millisecond',
                   lease_token = $3, attempts = o.attempts + 1
             WHERE o.id = ANY (ARRAY(SELECT id FROM due))
            RETURNING o.id, o.operation_key, o.kind, o.payload, o.delivery_key, o.attempts,
                      o.free_attempts, o.created_at, o.redriven_at, o.not_after, o.frozen,
                      o.partition_key, o.settled
        ), abandoned AS (
            -- `= ANY (ARRAY(…))`, not `IN (SELECT …)`: the planner knows nothing of how many
            -- rows a CTE returns and chose a hash join over a scan of every attempt ever kept
            -- (11 ms per claim with 60,000 attempts, growing with the history); the array is
            -- computed first and each id is looked up in `oncely_outbox_attempts_job`.
            UPDATE oncely_outbox_attempts
               SET finished_at = COALESCE($1, now()), result = 'abandoned',
                   error = 'the worker''s lease ended before the attempt finished'
             WHERE job_id = ANY (ARRAY(SELECT id FROM claimed)) AND finished_at IS NULL
        ), opened AS (
            INSERT INTO oncely_outbox_attempts
                   (job_id, attempt, worker, lease_token, started_at, point_of_no_return)
            SELECT id, attempts, $6, $3, COALESCE($1, now()),
                   CASE WHEN kind IN (SELECT jsonb_array_elements_text(",
            $marking,
            ")) THEN 'ahead' END
              FROM claimed
        )
        SELECT * FROM claimed ORDER BY id"
        )
    };
}

/// The ids of the oldest due jobs of `status` of each kind in the JSON array `$4` (due at
/// `$1`, at most `$5` of each, locked with SKIP LOCKED), the oldest `$5` of them first: a
/// lateral walk of the due index per kind, as `d`. What a claim and a reconciler's claim of
/// parked jobs select from.
macro_rules! due_per_kind {
    ($status:literal) => {
        concat!(
            "FROM jsonb_array_elements_text($4) AS k(kind)
            CROSS JOIN LATERAL (
                SELECT id, run_after FROM oncely_outbox
                 WHERE status = '",
            $status,
            "' AND kind = k.kind
                   AND run_after <= COALESCE($1, now())
                 ORDER BY run_after, id
                 LIMIT $5
                   FOR UPDATE SKIP LOCKED
            ) d
            ORDER BY d.run_after, d.id
            LIMIT $5"
        )
    };
}

/// The dead jobs a filter matches: 1 kind, 2 dead at or after, 3 a substring of the last
/// error, ignoring case (each `NULL`: any).
macro_rules! dead {
    () => {
        "
         WHERE o.status = 'dead' AND ($1::text IS NULL OR o.kind = $1)
           AND ($2::timestamptz IS NULL OR o.dead_at >= $2)
           AND ($3::text IS NULL OR strpos(lower(o.last_error), lower($3)) > 0)
           AND ($4::timestamptz IS NULL OR o.dead_at <= $4)"
    };
}

impl super::Statements for Postgres {
    // Differs: `run_after` and `created_at` come from `now()` (the transaction's start), not
    // from the process clock.
    const ENQUEUE: &'static str = "
        INSERT INTO oncely_outbox
               (operation_key, kind, payload, delivery_key, not_after, run_after, created_at,
                partition_key)
        VALUES ($1, $2, $3, $4, $5, COALESCE($6, now()), COALESCE($6, now()), $7)
        ON CONFLICT (operation_key) DO NOTHING
        RETURNING id";

    // Differs: one statement. Walks the due index once per kind, oldest due first; at most
    // `limit` rows per kind are locked and the oldest `limit` of them claimed (the rest unlock
    // when the statement ends). SKIP LOCKED: concurrent claims take other rows instead of
    // waiting.
    const CLAIM: &'static str = concat!(
        "
        WITH due AS (
            SELECT d.id ",
        due_per_kind!("pending"),
        claimed!("$7")
    );

    // Differs: one statement, SKIP LOCKED. Index: `oncely_outbox_due_by_partition` (kind,
    // partition_key, run_after, id; pending only). `parts` hops from one partition of the kind
    // to the next (a loose index scan: one index descent per partition that has pending jobs,
    // however many jobs it has); for each, a lateral scan takes at most its room (LIMIT 0 for a
    // partition at its limit: nothing of its backlog is read) of its oldest due jobs, locked
    // with SKIP LOCKED; the jobs without a partition come from the same index (`partition_key
    // IS NULL`; sorted by due time, at most `limit` of them locked). With 100,000 due jobs in
    // one full partition, the claim reads one index entry of it. The oldest `limit` candidates
    // are claimed; the others unlock when the statement ends.
    const CLAIM_PARTITIONED: &'static str = concat!(
        "
        WITH RECURSIVE parts(key) AS (
            (SELECT partition_key FROM oncely_outbox
              WHERE status = 'pending' AND kind = ($4 ->> 0) AND partition_key IS NOT NULL
              ORDER BY partition_key LIMIT 1)
            UNION ALL
            SELECT (SELECT n.partition_key FROM oncely_outbox n
                     WHERE n.status = 'pending' AND n.kind = ($4 ->> 0)
                       AND n.partition_key > p.key
                     ORDER BY n.partition_key LIMIT 1)
              FROM parts p WHERE p.key IS NOT NULL
        ), candidates AS (
            SELECT d.id, d.run_after FROM parts p
            CROSS JOIN LATERAL (
                SELECT id, run_after FROM oncely_outbox
                 WHERE status = 'pending' AND kind = ($4 ->> 0) AND partition_key = p.key
                   AND run_after <= COALESCE($1, now())
                 ORDER BY run_after, id
                 LIMIT GREATEST(LEAST($7 - COALESCE(($8 ->> p.key)::int8, 0), $5), 0)
                   FOR UPDATE SKIP LOCKED
            ) d
             WHERE p.key IS NOT NULL
            UNION ALL
            SELECT u.id, u.run_after FROM (
                SELECT id, run_after FROM oncely_outbox
                 WHERE status = 'pending' AND kind = ($4 ->> 0) AND partition_key IS NULL
                   AND run_after <= COALESCE($1, now())
                 ORDER BY run_after, id
                 LIMIT $5
                   FOR UPDATE SKIP LOCKED
            ) u
        ), due AS (
            SELECT id FROM candidates ORDER BY run_after, id LIMIT $5",
        claimed!("$9")
    );

    // Differs: one statement; the attempt rows are closed and the follow-ups inserted only for
    // the jobs the job update returned (the ones whose lease the batch still held).
    const FINISH: &'static str = "
        WITH done AS (
            SELECT * FROM jsonb_to_recordset($1)
                       AS d(id int8, lease_token uuid, status text, retry_ms int8, result text,
                            provider_message_id text, error text, free bool,
                            thaw bool)
        ), job AS (
            UPDATE oncely_outbox o
               SET status = d.status, lease_token = NULL, last_error = d.error,
                   run_after = CASE WHEN d.status IN ('pending', 'unknown')
                                    THEN COALESCE($2, now()) + d.retry_ms * interval '1 millisecond'
                                    ELSE o.run_after END,
                   free_attempts = o.free_attempts + CASE WHEN d.free THEN 1 ELSE 0 END,
                   frozen = CASE WHEN d.thaw THEN NULL ELSE o.frozen END,
                   sent_at = CASE WHEN d.status = 'sent' THEN COALESCE($2, now()) END,
                   dead_at = CASE WHEN d.status = 'dead' THEN COALESCE($2, now()) END,
                   skipped_at = CASE WHEN d.status = 'skipped' THEN COALESCE($2, now()) END,
                   parked_at = CASE WHEN d.status = 'unknown' THEN COALESCE($2, now()) END,
                   settled = CASE WHEN d.status = 'pending' THEN o.settled END,
                   provider_message_id = COALESCE(d.provider_message_id, o.provider_message_id)
              FROM done d
             WHERE o.id = d.id AND o.lease_token = d.lease_token AND o.status = 'pending'
            RETURNING o.id, d.lease_token, d.result, d.provider_message_id, d.error
        ), attempt AS (
            UPDATE oncely_outbox_attempts a
               SET finished_at = COALESCE($2, now()), result = j.result,
                   provider_message_id = j.provider_message_id, error = j.error
              FROM job j
             WHERE a.job_id = j.id AND a.lease_token = j.lease_token AND a.finished_at IS NULL
        ), follow_up AS (
            INSERT INTO oncely_outbox
                   (operation_key, kind, payload, delivery_key, not_after, run_after,
                    created_at, partition_key)
            SELECT f.operation_key, f.kind, f.payload, f.delivery_key,
                   to_timestamp(f.not_after_ms / 1000.0), COALESCE($2, now()),
                   COALESCE($2, now()), f.partition_key
              FROM jsonb_to_recordset($3)
                       AS f(job_id int8, lease_token uuid, operation_key text, kind text,
                            payload jsonb, delivery_key uuid, not_after_ms int8,
                            partition_key text)
              JOIN job j ON j.id = f.job_id AND j.lease_token = f.lease_token
            ON CONFLICT (operation_key) DO NOTHING
            RETURNING kind
        )
        SELECT id, NULL::text AS kind FROM job
        UNION ALL
        SELECT NULL::int8, kind FROM follow_up";

    // Differs: the database's clock.
    const PASS: &'static str = "
        UPDATE oncely_outbox_attempts a
           SET point_of_no_return = 'passed',
               handed_over_at = COALESCE(a.handed_over_at, COALESCE($3, now()))
         WHERE a.job_id = $1 AND a.lease_token = $2 AND a.finished_at IS NULL
           AND EXISTS (SELECT 1 FROM oncely_outbox o
                        WHERE o.id = $1 AND o.lease_token = $2 AND o.status = 'pending')
        RETURNING a.job_id";

    // Differs: one statement (the attempt row goes only if the job update matched).
    const RELEASE: &'static str = "
        WITH job AS (
            UPDATE oncely_outbox
               SET run_after = COALESCE($3, now()), lease_token = NULL, attempts = attempts - 1
             WHERE id = $1 AND lease_token = $2 AND status = 'pending'
            RETURNING id
        ), attempt AS (
            DELETE FROM oncely_outbox_attempts
             WHERE job_id = ANY (ARRAY(SELECT id FROM job)) AND lease_token = $2
               AND finished_at IS NULL
        )
        SELECT id FROM job";

    // Differs: the ages are intervals, computed by the database.
    const BACKLOG: &'static str = "
        SELECT p.pending, p.oldest_pending_seconds, u.parked, u.oldest_parked_seconds
          FROM (SELECT count(*) AS pending,
                       COALESCE(EXTRACT(EPOCH FROM COALESCE($1, now()) - min(created_at))::float8, 0)
                           AS oldest_pending_seconds
                  FROM oncely_outbox WHERE status = 'pending') p,
               (SELECT count(*) AS parked,
                       COALESCE(EXTRACT(EPOCH FROM COALESCE($1, now()) - min(parked_at))::float8, 0)
                           AS oldest_parked_seconds
                  FROM oncely_outbox WHERE status = 'unknown') u";

    // Differs: SKIP LOCKED, so pruning never waits for a worker holding a row.
    const PRUNE: &'static str = "
        DELETE FROM oncely_outbox WHERE id = ANY (ARRAY(
            SELECT id FROM oncely_outbox
             WHERE status <> 'pending'
               AND COALESCE(sent_at, dead_at, skipped_at)
                   < COALESCE($3, now()) - $1 * interval '1 millisecond'
             ORDER BY COALESCE(sent_at, dead_at, skipped_at)
             LIMIT $2
               FOR UPDATE SKIP LOCKED))
        RETURNING id";

    const REDRIVE: &'static str = "
        UPDATE oncely_outbox
           SET status = 'pending', run_after = COALESCE($2, now()), attempts = 0,
               free_attempts = 0, redriven_at = COALESCE($2, now()), dead_at = NULL,
               lease_token = NULL, last_error = NULL, settled = NULL
         WHERE operation_key = $1 AND status = 'dead'
        RETURNING id";

    const SETTLE: &'static str = "
        UPDATE oncely_outbox
           SET status = 'pending', run_after = COALESCE($3, now()), parked_at = NULL,
               lease_token = NULL, last_error = NULL,
               settled = CASE WHEN $2 = 'sent' THEN 'sent' END,
               attempts = CASE WHEN $2 = 'sent' THEN attempts ELSE 0 END,
               free_attempts = CASE WHEN $2 = 'sent' THEN free_attempts ELSE 0 END,
               redriven_at = CASE WHEN $2 = 'sent' THEN redriven_at ELSE COALESCE($3, now()) END,
               provider_message_id = COALESCE($5, provider_message_id)
         WHERE id = $1 AND status = 'unknown' AND ($4::uuid IS NULL OR lease_token = $4)
           AND ($6::int8 IS NULL
                OR parked_at <= COALESCE($3, now()) - $6 * interval '1 millisecond')
        RETURNING id";

    // Differs: a lateral walk per kind (as CLAIM), SKIP LOCKED (two reconcilers take different
    // jobs), the age in milliseconds from the database's clock.
    const CLAIM_PARKED: &'static str = concat!(
        "
        WITH due AS (
            SELECT d.id, d.run_after ",
        due_per_kind!("unknown"),
        "
        )
        UPDATE oncely_outbox o
           SET run_after = COALESCE($1, now()) + $2 * interval '1 millisecond', lease_token = $3
         WHERE o.id = ANY (ARRAY(SELECT id FROM due)) AND o.status = 'unknown'
        RETURNING o.id, o.operation_key, o.kind, o.payload, o.delivery_key, o.attempts,
                  o.free_attempts, o.created_at, o.redriven_at, o.not_after, o.frozen,
                  o.partition_key, o.settled, o.parked_at,
                  GREATEST(EXTRACT(EPOCH FROM COALESCE($1, now()) - o.parked_at) * 1000, 0)::int8
                      AS parked_ms"
    );

    // Differs: an interval.
    const LOOK_LATER: &'static str = "
        UPDATE oncely_outbox
           SET run_after = COALESCE($3, now()) + $4 * interval '1 millisecond', lease_token = NULL
         WHERE id = $1 AND lease_token = $2 AND status = 'unknown'
        RETURNING id";

    // Differs: `count(*) FILTER`, `strpos` (SQLite: `instr`), an interval; `lower` folds every
    // letter's case (SQLite's only ASCII).
    const DEAD_COUNT: &'static str = concat!(
        "
        SELECT count(*) AS matching,
               count(*) FILTER (WHERE EXISTS (
                   SELECT 1 FROM oncely_outbox_attempts a
                    WHERE a.job_id = o.id AND a.result IN ('unknown', 'abandoned')
                      AND a.point_of_no_return IS DISTINCT FROM 'ahead'
                      AND a.finished_at < COALESCE($5, now()) - $6 * interval '1 millisecond'
               )) AS unknown_past_window,
               COALESCE($5, now()) AS as_of
          FROM oncely_outbox o",
        dead!()
    );

    const DEAD_SAMPLE: &'static str = concat!(
        "
        SELECT o.operation_key, o.last_error FROM oncely_outbox o",
        dead!(),
        "
         ORDER BY o.dead_at DESC, o.id DESC LIMIT $5"
    );

    // Differs: the rows are locked until the re-drive's transaction ends (in id order, as any
    // other bulk re-drive locks them). A job that dies after this statement began is not among
    // them: it was not dead in the statement's snapshot.
    const DEAD_IDS: &'static str = concat!(
        "
        SELECT o.id FROM oncely_outbox o",
        dead!(),
        "
         ORDER BY o.id
           FOR UPDATE"
    );

    const REDRIVE_IDS: &'static str = "
        UPDATE oncely_outbox
           SET status = 'pending', run_after = COALESCE($2, now()), attempts = 0,
               free_attempts = 0, redriven_at = COALESCE($2, now()), dead_at = NULL,
               lease_token = NULL, last_error = NULL, settled = NULL
         WHERE id IN (SELECT value::int8 FROM jsonb_array_elements_text($1))
           AND status = 'dead'
        RETURNING id";
}
