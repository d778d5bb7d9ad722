//! The outbox's statements on SQLite. One writer at a time: writes of several statements run
//! in `BEGIN IMMEDIATE` (the store's write transaction) instead of `SKIP LOCKED`, and SQLite has
//! no data-modifying CTEs, so they are several statements in one query (sqlx runs them in
//! order, binding each `?n` by number). Times are Unix milliseconds; `now` is the clock's time.

use sqlx::Sqlite;

/// The ids of the oldest `?5` due jobs of `status` (due at `?1`) of the kinds in the JSON
/// array `?4`, and the parenthesis of the `WHERE id IN (` before it: what a claim and a
/// reconciler's claim of parked jobs take.
macro_rules! due_per_kind {
    ($status:literal) => {
        concat!(
            "SELECT id FROM oncely_outbox
             WHERE status = '",
            $status,
            "' AND run_after <= ?1
               AND kind IN (SELECT value FROM json_each(?4))
             ORDER BY run_after, id
             LIMIT ?5)"
        )
    };
}

/// The claimed jobs, found again by index after the claim: the claim just set `run_after` to
/// `now + lease` and the lease token, which no other row has.
macro_rules! claimed {
    () => {
        "SELECT id FROM oncely_outbox
          WHERE status = 'pending' AND kind IN (SELECT value FROM json_each(?4))
            AND run_after = ?1 + ?2 AND lease_token = ?3"
    };
}

/// The end of a claim, after its `UPDATE … RETURNING`: the claimed rows' columns, then their
/// unfinished earlier attempts closed as `abandoned` and this claim's opened — `point_of_no_return
/// = 'ahead'` for the jobs whose kind is in the JSON array bound at `$marking` (their worker
/// records the point of no return), `NULL` (unknown) for the others.
macro_rules! attempts {
    ($marking:literal) => {
        concat!(
            " id, operation_key, kind, payload, delivery_key, attempts, free_attempts,
                  created_at, redriven_at, not_after, frozen, partition_key, settled;
        UPDATE oncely_outbox_attempts
           SET finished_at = ?1, result = 'abandoned',
               error = 'the worker''s lease ended before the attempt finished'
         WHERE finished_at IS NULL AND job_id IN (",
            claimed!(),
            ");
        INSERT INTO oncely_outbox_attempts
               (job_id, attempt, worker, lease_token, started_at, point_of_no_return)
        SELECT id, attempts, ?6, ?3, ?1,
               CASE WHEN kind IN (SELECT value FROM json_each(",
            $marking,
            ")) THEN 'ahead' END
          FROM oncely_outbox WHERE id IN (",
            claimed!(),
            ") ORDER BY id"
        )
    };
}

/// The finished batch, one row per attempt, from the JSON array bound as `?1` (lease tokens
/// are stored as 16 bytes).
macro_rules! done {
    () => {
        "WITH done AS (
             SELECT value ->> 'id' AS id, unhex(value ->> 'lease_token', '-') AS lease_token,
                    value ->> 'status' AS status, value ->> 'retry_ms' AS retry_ms,
                    value ->> 'result' AS result,
                    value ->> 'provider_message_id' AS provider_message_id,
                    value ->> 'error' AS error, value ->> 'free' AS free,
                    value ->> 'thaw' AS thaw
               FROM json_each(?1))"
    };
}

/// The dead jobs a filter matches: 1 kind, 2 dead at or after, 3 a substring of the last
/// error, ignoring (ASCII) case, 4 dead at or before (each `NULL`: any).
macro_rules! dead {
    () => {
        "
         WHERE o.status = 'dead' AND (?1 IS NULL OR o.kind = ?1)
           AND (?2 IS NULL OR o.dead_at >= ?2)
           AND (?3 IS NULL OR instr(lower(o.last_error), lower(?3)) > 0)
           AND (?4 IS NULL OR o.dead_at <= ?4)"
    };
}

impl super::Statements for Sqlite {
    // Differs: no `now()` in milliseconds: `run_after` and `created_at` are bound.
    const ENQUEUE: &'static str = "
        INSERT INTO oncely_outbox
               (operation_key, kind, payload, delivery_key, not_after, run_after, created_at,
                partition_key)
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7)
        ON CONFLICT (operation_key) DO NOTHING
        RETURNING id";

    // Differs: three statements in the write transaction (no row locks to skip: the
    // transaction holds the only write lock). The attempts are closed and opened for the rows
    // the first statement claimed.
    const CLAIM: &'static str = concat!(
        "
        UPDATE oncely_outbox
           SET run_after = ?1 + ?2, lease_token = ?3, attempts = attempts + 1
         WHERE id IN (
            ",
        due_per_kind!("pending"),
        "
        RETURNING",
        attempts!("?7")
    );

    // Differs: three statements in the write transaction, as `CLAIM`; no LATERAL and no
    // correlated LIMIT in SQLite, so a recursive CTE walks each partition's due jobs one index
    // step at a time, at most its room. Index: `oncely_outbox_due_by_partition` (kind,
    // partition_key, run_after, id; pending only). `parts` hops from one partition of the kind
    // to the next (one index descent per partition that has pending jobs, however many it has);
    // `picked` takes, for each partition with room, its oldest due job and then the next after
    // it (one descent each), at most its room: a partition at its limit is not read past its
    // first index entry. The jobs without a partition come from the same index (`partition_key
    // IS NULL`). With 100,000 due jobs in one full partition, the claim reads one index entry of
    // it. The oldest `limit` candidates are claimed.
    const CLAIM_PARTITIONED: &'static str = concat!(
        "
        WITH RECURSIVE parts(key) AS (
            SELECT (SELECT partition_key FROM oncely_outbox
                     WHERE status = 'pending' AND kind = (?4 ->> 0) AND partition_key IS NOT NULL
                     ORDER BY partition_key LIMIT 1)
            UNION ALL
            SELECT (SELECT n.partition_key FROM oncely_outbox n
                     WHERE n.status = 'pending' AND n.kind = (?4 ->> 0) AND n.partition_key > p.key
                     ORDER BY n.partition_key LIMIT 1)
              FROM parts p WHERE p.key IS NOT NULL
        ), room(key, room) AS (
            SELECT p.key, min(?7 - COALESCE(r.value, 0), ?5)
              FROM parts p LEFT JOIN json_each(?8) r ON r.key = p.key
             WHERE p.key IS NOT NULL
        ), picked(key, room, n, id) AS (
            SELECT r.key, r.room, 1,
                   (SELECT i.id FROM oncely_outbox i
                     WHERE i.status = 'pending' AND i.kind = (?4 ->> 0) AND i.partition_key = r.key
                       AND i.run_after <= ?1
                     ORDER BY i.run_after, i.id LIMIT 1)
              FROM room r WHERE r.room > 0
            UNION ALL
            SELECT p.key, p.room, p.n + 1,
                   (SELECT i.id FROM oncely_outbox i, oncely_outbox prev
                     WHERE prev.id = p.id AND i.status = 'pending' AND i.kind = (?4 ->> 0)
                       AND i.partition_key = p.key AND i.run_after <= ?1
                       AND (i.run_after, i.id) > (prev.run_after, prev.id)
                     ORDER BY i.run_after, i.id LIMIT 1)
              FROM picked p WHERE p.id IS NOT NULL AND p.n < p.room
        ), candidates(id) AS (
            SELECT id FROM picked WHERE id IS NOT NULL
            UNION ALL
            SELECT id FROM (
                SELECT id FROM oncely_outbox
                 WHERE status = 'pending' AND kind = (?4 ->> 0) AND partition_key IS NULL
                   AND run_after <= ?1
                 ORDER BY run_after, id LIMIT ?5)
        )
        UPDATE oncely_outbox
           SET run_after = ?1 + ?2, lease_token = ?3, attempts = attempts + 1
         WHERE id IN (
            SELECT o.id FROM candidates c JOIN oncely_outbox o ON o.id = c.id
             ORDER BY o.run_after, o.id
             LIMIT ?5)
        RETURNING",
        attempts!("?9")
    );

    // Differs: three statements in the write transaction. The attempt rows and the follow-ups
    // first, while the jobs' lease tokens still say which claims own them; then the jobs.
    const FINISH: &'static str = concat!(
        done!(),
        "
        UPDATE oncely_outbox_attempts AS a
           SET finished_at = ?2, result = d.result, provider_message_id = d.provider_message_id,
               error = d.error
          FROM done AS d
          JOIN oncely_outbox AS o
            ON o.id = d.id AND o.lease_token = d.lease_token AND o.status = 'pending'
         WHERE a.job_id = d.id AND a.lease_token = d.lease_token AND a.finished_at IS NULL;
        INSERT INTO oncely_outbox
               (operation_key, kind, payload, delivery_key, not_after, run_after, created_at,
                partition_key)
        SELECT f.value ->> 'operation_key', f.value ->> 'kind', f.value -> 'payload',
               unhex(f.value ->> 'delivery_key', '-'), f.value ->> 'not_after_ms', ?2, ?2,
               f.value ->> 'partition_key'
          FROM json_each(?3) AS f
          JOIN oncely_outbox AS o
            ON o.id = f.value ->> 'job_id'
           AND o.lease_token = unhex(f.value ->> 'lease_token', '-') AND o.status = 'pending'
         WHERE true
        ON CONFLICT (operation_key) DO NOTHING
        RETURNING NULL AS id, kind;
        ",
        done!(),
        "
        UPDATE oncely_outbox AS o
           SET status = d.status, lease_token = NULL, last_error = d.error,
               run_after = CASE WHEN d.status IN ('pending', 'unknown') THEN ?2 + d.retry_ms
                                ELSE o.run_after END,
               free_attempts = o.free_attempts + CASE WHEN d.free THEN 1 ELSE 0 END,
               frozen = CASE WHEN d.thaw THEN NULL ELSE o.frozen END,
               sent_at = CASE WHEN d.status = 'sent' THEN ?2 END,
               dead_at = CASE WHEN d.status = 'dead' THEN ?2 END,
               skipped_at = CASE WHEN d.status = 'skipped' THEN ?2 END,
               parked_at = CASE WHEN d.status = 'unknown' THEN ?2 END,
               settled = CASE WHEN d.status = 'pending' THEN o.settled END,
               provider_message_id = COALESCE(d.provider_message_id, o.provider_message_id)
          FROM done AS d
         WHERE o.id = d.id AND o.lease_token = d.lease_token AND o.status = 'pending'
        RETURNING id, NULL AS kind"
    );

    // Differs: the clock's time is bound.
    const PASS: &'static str = "
        UPDATE oncely_outbox_attempts
           SET point_of_no_return = 'passed', handed_over_at = COALESCE(handed_over_at, ?3)
         WHERE job_id = ?1 AND lease_token = ?2 AND finished_at IS NULL
           AND EXISTS (SELECT 1 FROM oncely_outbox o
                        WHERE o.id = ?1 AND o.lease_token = ?2 AND o.status = 'pending')
        RETURNING job_id";

    // Differs: two statements in the write transaction; the attempt row goes first, if the
    // claim still owns the job.
    const RELEASE: &'static str = "
        DELETE FROM oncely_outbox_attempts
         WHERE job_id = ?1 AND lease_token = ?2 AND finished_at IS NULL
           AND EXISTS (SELECT 1 FROM oncely_outbox
                        WHERE id = ?1 AND lease_token = ?2 AND status = 'pending');
        UPDATE oncely_outbox SET run_after = ?3, lease_token = NULL, attempts = attempts - 1
         WHERE id = ?1 AND lease_token = ?2 AND status = 'pending'
        RETURNING id";

    // Differs: milliseconds to seconds by hand; never negative.
    const BACKLOG: &'static str = "
        SELECT p.pending, p.oldest_pending_seconds, u.parked, u.oldest_parked_seconds
          FROM (SELECT count(*) AS pending,
                       COALESCE(max(?1 - min(created_at), 0) / 1000.0, 0.0) AS oldest_pending_seconds
                  FROM oncely_outbox WHERE status = 'pending') p,
               (SELECT count(*) AS parked,
                       COALESCE(max(?1 - min(parked_at), 0) / 1000.0, 0.0) AS oldest_parked_seconds
                  FROM oncely_outbox WHERE status = 'unknown') u";

    // Differs: no SKIP LOCKED (nor any need: the delete waits for the one writer lock).
    const PRUNE: &'static str = "
        DELETE FROM oncely_outbox WHERE id IN (
            SELECT id FROM oncely_outbox
             WHERE status <> 'pending' AND COALESCE(sent_at, dead_at, skipped_at) < ?3 - ?1
             ORDER BY COALESCE(sent_at, dead_at, skipped_at)
             LIMIT ?2)
        RETURNING id";

    const REDRIVE: &'static str = "
        UPDATE oncely_outbox
           SET status = 'pending', run_after = ?2, attempts = 0, free_attempts = 0,
               redriven_at = ?2, dead_at = NULL, lease_token = NULL, last_error = NULL,
               settled = NULL
         WHERE operation_key = ?1 AND status = 'dead'
        RETURNING id";

    const SETTLE: &'static str = "
        UPDATE oncely_outbox
           SET status = 'pending', run_after = ?3, parked_at = NULL, lease_token = NULL,
               last_error = NULL,
               settled = CASE WHEN ?2 = 'sent' THEN 'sent' END,
               attempts = CASE WHEN ?2 = 'sent' THEN attempts ELSE 0 END,
               free_attempts = CASE WHEN ?2 = 'sent' THEN free_attempts ELSE 0 END,
               redriven_at = CASE WHEN ?2 = 'sent' THEN redriven_at ELSE ?3 END,
               provider_message_id = COALESCE(?5, provider_message_id)
         WHERE id = ?1 AND status = 'unknown' AND (?4 IS NULL OR lease_token = ?4)
           AND (?6 IS NULL OR parked_at <= ?3 - ?6)
        RETURNING id";

    // Differs: no row locks to skip (the store's write transaction holds the one write lock).
    const CLAIM_PARKED: &'static str = concat!(
        "
        UPDATE oncely_outbox SET run_after = ?1 + ?2, lease_token = ?3
         WHERE id IN (
            ",
        due_per_kind!("unknown"),
        "
        RETURNING id, operation_key, kind, payload, delivery_key, attempts, free_attempts,
                  created_at, redriven_at, not_after, frozen, partition_key, settled, parked_at,
                  max(?1 - coalesce(parked_at, created_at), 0) AS parked_ms"
    );

    // Differs: milliseconds.
    const LOOK_LATER: &'static str = "
        UPDATE oncely_outbox SET run_after = ?3 + ?4, lease_token = NULL
         WHERE id = ?1 AND lease_token = ?2 AND status = 'unknown'
        RETURNING id";

    // Differs: no `FILTER` needed (`count` of a CASE), `instr` (PostgreSQL: `strpos`),
    // milliseconds; `lower` folds only ASCII letters.
    const DEAD_COUNT: &'static str = concat!(
        "
        SELECT count(*) AS matching,
               count(CASE WHEN EXISTS (
                   SELECT 1 FROM oncely_outbox_attempts a
                    WHERE a.job_id = o.id AND a.result IN ('unknown', 'abandoned')
                      AND a.point_of_no_return IS NOT 'ahead'
                      AND a.finished_at < ?5 - ?6
               ) THEN 1 END) AS unknown_past_window,
               ?5 AS as_of
          FROM oncely_outbox o",
        dead!()
    );

    const DEAD_SAMPLE: &'static str = concat!(
        "
        SELECT o.operation_key, o.last_error FROM oncely_outbox o",
        dead!(),
        "
         ORDER BY o.dead_at DESC, o.id DESC LIMIT ?5"
    );

    // Differs: no row locks; the re-drive's transaction (`BEGIN IMMEDIATE`) holds the one write
    // lock from its start, so no job dies between this count and the re-drive.
    const DEAD_IDS: &'static str = concat!(
        "
        SELECT o.id FROM oncely_outbox o",
        dead!(),
        "
         ORDER BY o.id"
    );

    const REDRIVE_IDS: &'static str = "
        UPDATE oncely_outbox
           SET status = 'pending', run_after = ?2, attempts = 0, free_attempts = 0,
               redriven_at = ?2, dead_at = NULL, lease_token = NULL, last_error = NULL,
               settled = NULL
         WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'dead'
        RETURNING id";
}
