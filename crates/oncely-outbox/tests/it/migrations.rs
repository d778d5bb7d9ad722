//! The migrators (`sqlx::migrate!`) keep what the hand-built ones of earlier releases recorded:
//! the same versions and checksums in the same history table, so a database an earlier release
//! migrated keeps migrating.

use futures::future::join_all;
use oncely_outbox::JobStore;
use oncely_outbox::store::{Dialect, MIGRATIONS_TABLE, SqlJobStore};
use oncely_outbox::store::{postgres, sqlite};
use oncely_testdb::{TestPostgres, TestSqlite};
use sqlx::migrate::{Migrate, Migration, MigrationType, Migrator};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Executor, IntoArguments, Pool, SqlSafeStr};

/// What the hand-built migrator recorded: version, description, SHA-384 of the SQL.
const RECORDED: [(i64, &str, &str, &str); 4] = [
    (
        1,
        "outbox",
        "5014ec46cb2a822a830d0c9999bc69a61578557631226ac3fe5fd6bd69d8a5fbaf01f0dfd1c6b9474860e2689610a65f",
        "395b6c769553c969f6e7d6ccbfd443f335f69d9cfb00a6c38890f0a0d6ae2f4201f452a60980503f1d17428f5f2e4263",
    ),
    (
        2,
        "skipped attempts",
        "c29da3fd74b8e00557514965755892fd73dc948e136effe47d5137a82fa456d5c4afa81adb2bf96fd66a202180defd76",
        "7ff47ac884c1a544f7b1c9b69e5d5cf4c13bf8224ed2774e86f5d9bfd7768a636a4a189c7c084b660a7ff4be3f4f2430",
    ),
    (
        3,
        "prune index",
        "a8e342e161ad150eda5b250bdfd391026eda9cde1abfe587e3fe1d71d9544284b921f64452fee54064c41055de916f1d",
        "a3415776d58185319b0037f35e66b75144fb31608af26a610012e178f583ead961b93c9be3d0ec63c849431907733d03",
    ),
    (
        4,
        "due index by kind",
        "f12c8cf5d8a611870cbe73952de2d0416b76ba78b12ee0845b70c92004972982214cb46ea006c2d306eb5ee47c7272ab",
        "f23c6159fc88f5921d34d1852f4006d7e7ae11bc35e9b526a41d097c19d0feed33ee981c1713445b09152c17b5c73377",
    ),
];

fn recorded(migrator: &Migrator) -> Vec<(i64, String, String)> {
    migrator
        .iter()
        .map(|m| {
            let hex = m.checksum.iter().map(|b| format!("{b:02x}")).collect();
            (m.version, m.description.to_string(), hex)
        })
        .collect()
}

#[test]
fn the_migrators_keep_the_versions_descriptions_and_checksums_of_the_hand_built_ones() {
    let expected = |dialect: usize| -> Vec<(i64, String, String)> {
        RECORDED
            .iter()
            .map(|r| {
                let checksum = if dialect == 0 { r.2 } else { r.3 };
                (r.0, r.1.to_owned(), checksum.to_owned())
            })
            .collect()
    };
    // The hand-built ones first; later migrations (0005 on) came with `sqlx::migrate!`.
    let hand_built = |migrator: &Migrator| recorded(migrator)[..RECORDED.len()].to_vec();
    assert_eq!(hand_built(&postgres::migrator()), expected(0));
    assert_eq!(hand_built(&sqlite::migrator()), expected(1));
    for migrator in [postgres::migrator(), sqlite::migrator()] {
        assert_eq!(migrator.table_name, MIGRATIONS_TABLE);
        assert!(
            migrator.ignore_missing,
            "a newer release's versions are fine"
        );
        assert!(migrator.iter().all(|m| !m.no_tx));
    }
}

/// How many migrations this release has.
fn all_versions<D: Dialect>() -> i64 {
    i64::try_from(D::migrator().iter().count()).unwrap()
}

/// The migrator of the release before `sqlx::migrate!`, as it was built, up to `version`.
fn previous_release(current: &Migrator, version: i64) -> Migrator {
    let migrations = current
        .iter()
        .filter(|m| m.version <= version)
        .map(|m| {
            let description = RECORDED[usize::try_from(m.version - 1).unwrap()].1;
            let sql = AssertSqlSafe(m.sql.as_str().to_owned()).into_sql_str();
            Migration::new(
                m.version,
                description.into(),
                MigrationType::Simple,
                sql,
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator.set_ignore_missing(true);
    migrator
}

/// A database migrated by an earlier release (up to each version) migrates with this one, and
/// ends with every version applied once; a version from a newer release does not stop it.
async fn an_earlier_release_s_database_keeps_migrating<D: Dialect>(pools: Vec<Pool<D>>)
where
    SqlJobStore<D>: JobStore<Database = D>,
    D::Connection: Migrate,
    for<'c> &'c Pool<D>: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'r> (i64,): sqlx::FromRow<'r, D::Row>,
{
    join_all((1..=4).zip(pools).map(|(version, pool)| async move {
        previous_release(&D::migrator(), version)
            .run(&pool)
            .await
            .unwrap();
        let store = SqlJobStore::new(pool.clone());
        store.migrate().await.unwrap();
        store.migrate().await.unwrap();
        let applied: i64 =
            sqlx::query_scalar("SELECT count(*) FROM _oncely_outbox_migrations WHERE success")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            applied,
            all_versions::<D>(),
            "migrated from version {version}"
        );
        assert_eq!(store.pending().await.unwrap(), 0);
        sqlx::query(
            "INSERT INTO _oncely_outbox_migrations
                        (version, description, success, checksum, execution_time)
                 SELECT 9999, 'from a newer release', success, checksum, execution_time
                   FROM _oncely_outbox_migrations WHERE version = 1",
        )
        .execute(&pool)
        .await
        .unwrap();
        store.migrate().await.unwrap();
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_earlier_release_s_database_keeps_migrating() {
    // One database, a schema per starting version (creating databases is slow).
    let db = TestPostgres::empty().await;
    let mut pools = Vec::new();
    for version in 1..=4 {
        let schema = format!("from_version_{version}");
        sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&db.pool(1).await)
            .await
            .unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .after_connect(move |conn, _| {
                let set = format!("SET search_path TO {schema}");
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(set)).execute(conn).await?;
                    Ok(())
                })
            })
            .connect(db.url())
            .await
            .unwrap();
        pools.push(pool);
    }
    an_earlier_release_s_database_keeps_migrating(pools).await;
    for version in 1..=4 {
        let sql = format!("SELECT count(*) FROM from_version_{version}._oncely_outbox_migrations");
        let rows: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&db.pool(1).await)
            .await
            .unwrap();
        assert_eq!(
            rows,
            all_versions::<sqlx::Postgres>() + 1,
            "each schema has its own history (and the newer version)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_earlier_release_s_database_keeps_migrating() {
    let dbs: Vec<_> = (1..=4).map(|_| TestSqlite::new()).collect();
    let pools = join_all(dbs.iter().map(|db| db.pool(2))).await;
    an_earlier_release_s_database_keeps_migrating(pools).await;
}

/// The jobs a release before 0007 left, each with its attempts' results in order: a job it made
/// dead for a skip (its last attempt `skipped`) becomes skipped; every other job stays as it was.
const BEFORE_SKIPPED: [(&str, &str, &[&str], &str); 5] = [
    ("decoy", "dead", &["skipped"], "skipped"),
    (
        "capped-after-a-retry",
        "dead",
        &["retry", "skipped"],
        "skipped",
    ),
    ("failed", "dead", &["dead"], "dead"),
    (
        "skipped-then-re-driven-then-failed",
        "dead",
        &["skipped", "dead"],
        "dead",
    ),
    ("sent", "sent", &["sent"], "sent"),
];

/// This release's migrator up to `version` (as the release that ended there ran it).
fn release_up_to(current: &Migrator, version: i64) -> Migrator {
    let migrations = current
        .iter()
        .filter(|m| m.version <= version)
        .cloned()
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator.set_ignore_missing(true);
    migrator
}

/// Migrates as the release before 0007 did, then writes
/// [`BEFORE_SKIPPED`] as that release left it, with the dialect's statements (`insert_job`
/// returns the job's id); how many attempts it wrote.
async fn write_before_skipped<D: Dialect>(
    pool: &Pool<D>,
    insert_job: &'static str,
    insert_attempt: &'static str,
) -> i64
where
    D::Connection: Migrate,
    for<'c> &'c Pool<D>: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> &'q str: sqlx::Encode<'q, D> + sqlx::Type<D>,
    for<'q> uuid::Uuid: sqlx::Encode<'q, D> + sqlx::Type<D>,
    for<'q> i32: sqlx::Encode<'q, D> + sqlx::Type<D>,
    for<'q> i64: sqlx::Encode<'q, D> + sqlx::Decode<'q, D> + sqlx::Type<D>,
    for<'r> (i64,): sqlx::FromRow<'r, D::Row>,
{
    release_up_to(&D::migrator(), 6).run(pool).await.unwrap();
    let mut attempts = 0;
    for (key, status, results, _) in BEFORE_SKIPPED {
        let id: i64 = sqlx::query_scalar(insert_job)
            .bind(key)
            .bind(uuid::Uuid::new_v4())
            .bind(status)
            .bind(i32::try_from(results.len()).unwrap())
            .fetch_one(pool)
            .await
            .unwrap();
        for (n, result) in results.iter().enumerate() {
            sqlx::query(insert_attempt)
                .bind(id)
                .bind(i32::try_from(n + 1).unwrap())
                .bind(uuid::Uuid::new_v4())
                .bind(*result)
                .execute(pool)
                .await
                .unwrap();
            attempts += 1;
        }
    }
    attempts
}

/// After 0007: each job's status, whether `dead_at` and `skipped_at` are set, and how many
/// attempts are kept; then a prune far in the future deletes every job and (the foreign key
/// still in place) every attempt.
async fn skips_became_skipped<D: Dialect>(pool: &Pool<D>, attempts_before: i64)
where
    SqlJobStore<D>: JobStore<Database = D>,
    for<'c> &'c Pool<D>: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> &'q str: sqlx::Encode<'q, D> + sqlx::Type<D>,
    for<'r> (String, bool, bool): sqlx::FromRow<'r, D::Row>,
    for<'r> (i64,): sqlx::FromRow<'r, D::Row>,
{
    let clock = oncely_outbox::store::Clock::manual(
        time::OffsetDateTime::now_utc() + std::time::Duration::from_secs(1000 * 24 * 3600),
    );
    let store = SqlJobStore::new(pool.clone()).with_clock(clock);
    store.migrate().await.unwrap();
    for (key, _, _, expected) in BEFORE_SKIPPED {
        let (status, dead_at, skipped_at): (String, bool, bool) = sqlx::query_as(
            "SELECT status, dead_at IS NOT NULL, skipped_at IS NOT NULL
               FROM oncely_outbox WHERE operation_key = $1",
        )
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(status, expected, "{key}");
        assert_eq!(dead_at, expected == "dead", "{key}: dead_at");
        assert_eq!(skipped_at, expected == "skipped", "{key}: skipped_at");
    }
    let count = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    assert_eq!(
        count("SELECT count(*) FROM oncely_outbox_attempts").await,
        attempts_before,
        "every attempt is kept"
    );
    let skipped: Vec<String> = store
        .skipped(10)
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.operation_key)
        .collect();
    assert_eq!(skipped, ["capped-after-a-retry", "decoy"]);
    assert!(
        sqlx::query("UPDATE oncely_outbox SET status = 'gone' WHERE operation_key = 'sent'")
            .execute(pool)
            .await
            .is_err(),
        "the status is still checked"
    );
    assert_eq!(
        store
            .prune(std::time::Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        BEFORE_SKIPPED.len() as u64
    );
    assert_eq!(
        count("SELECT count(*) FROM oncely_outbox_attempts").await,
        0,
        "attempts still cascade"
    );
}

#[tokio::test]
async fn postgres_jobs_an_earlier_release_made_dead_for_a_skip_become_skipped() {
    let db = TestPostgres::empty().await;
    let pool = db.pool(2).await;
    let attempts = write_before_skipped(
        &pool,
        "INSERT INTO oncely_outbox
                (operation_key, kind, payload, delivery_key, status, attempts, sent_at,
                 dead_at, last_error)
         VALUES ($1, 'email', '{}', $2, $3, $4,
                 CASE WHEN $3 = 'sent' THEN now() END,
                 CASE WHEN $3 = 'dead' THEN now() END, 'why')
         RETURNING id",
        "INSERT INTO oncely_outbox_attempts
                (job_id, attempt, worker, lease_token, finished_at, result)
         VALUES ($1, $2, 'w', $3, now(), $4)",
    )
    .await;
    skips_became_skipped(&pool, attempts).await;
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'oncely_outbox' ORDER BY indexname",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        indexes.iter().any(|i| i.contains("oncely_outbox_finished")
            && i.contains("COALESCE(sent_at, dead_at, skipped_at)")
            && i.contains("<> 'pending'")),
        "{indexes:?}"
    );
}

#[tokio::test]
async fn sqlite_jobs_an_earlier_release_made_dead_for_a_skip_become_skipped() {
    let db = TestSqlite::new();
    let pool = db.pool(2).await;
    let attempts = write_before_skipped(
        &pool,
        "INSERT INTO oncely_outbox
                (operation_key, kind, payload, delivery_key, status, attempts, run_after,
                 created_at, sent_at, dead_at, last_error)
         VALUES (?1, 'email', '{}', ?2, ?3, ?4, 0, 0,
                 CASE WHEN ?3 = 'sent' THEN 1000 END,
                 CASE WHEN ?3 = 'dead' THEN 1000 END, 'why')
         RETURNING id",
        "INSERT INTO oncely_outbox_attempts
                (job_id, attempt, worker, lease_token, started_at, finished_at, result)
         VALUES (?1, ?2, 'w', ?3, 0, 1000, ?4)",
    )
    .await;
    skips_became_skipped(&pool, attempts).await;
    // Every index is there again, and pruning and claims use theirs.
    let plan = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("; ")
        }
    };
    let prune = plan(
        "SELECT id FROM oncely_outbox
          WHERE status <> 'pending' AND COALESCE(sent_at, dead_at, skipped_at) < 5
          ORDER BY COALESCE(sent_at, dead_at, skipped_at) LIMIT 10",
    )
    .await;
    assert!(prune.contains("oncely_outbox_finished"), "{prune}");
    let claim = plan(
        "SELECT id FROM oncely_outbox WHERE status = 'pending' AND kind = 'email'
          AND run_after <= 5 ORDER BY run_after, id LIMIT 10",
    )
    .await;
    assert!(claim.contains("oncely_outbox_due_by_kind"), "{claim}");
    let attempts =
        plan("SELECT * FROM oncely_outbox_attempts WHERE job_id = 1 ORDER BY attempt").await;
    assert!(
        attempts.contains("oncely_outbox_attempts_job"),
        "{attempts}"
    );
    let unique = plan("SELECT id FROM oncely_outbox WHERE operation_key = 'decoy'").await;
    assert!(
        unique.contains("INDEX"),
        "the operation key stays unique: {unique}"
    );
}

/// A job as the release before 0008 enqueued it (no partition), on PostgreSQL and on SQLite.
const PREVIOUS_ENQUEUE: [&str; 2] = [
    "INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key)
     VALUES ($1, 'webhook', '{}', $2)",
    "INSERT INTO oncely_outbox (operation_key, kind, payload, delivery_key, run_after, created_at)
     VALUES ($1, 'webhook', '{}', $2, 0, 0)",
];

/// 0008 adds partitions to a database the previous release (up to 0007) wrote: its jobs are
/// kept, without a partition, and claimed by a partitioned claim (only a kind's limits apply to
/// them); the previous release's enqueue still runs on the migrated database.
async fn partitions_keep_the_previous_release_s_jobs<D: Dialect>(pool: Pool<D>, enqueue: &str)
where
    SqlJobStore<D>: JobStore<Database = D>,
    D::Connection: Migrate,
    for<'c> &'c Pool<D>: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> &'q str: sqlx::Encode<'q, D> + sqlx::Type<D>,
    for<'q> uuid::Uuid: sqlx::Encode<'q, D> + sqlx::Type<D>,
{
    release_up_to(&D::migrator(), 7).run(&pool).await.unwrap();
    let previous = |key: &'static str| {
        let pool = pool.clone();
        let sql = AssertSqlSafe(enqueue.to_owned());
        async move {
            sqlx::query(sql)
                .bind(key)
                .bind(uuid::Uuid::new_v4())
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    previous("old").await;
    let store = SqlJobStore::new(pool.clone());
    store.migrate().await.unwrap();
    let old = store.job("old").await.unwrap().unwrap();
    assert_eq!(old.partition, None);
    previous("old-after").await;
    let claimed = store
        .claim_partitioned(
            "w",
            "webhook",
            10,
            1,
            &std::collections::HashMap::new(),
            std::time::Duration::from_secs(30),
        )
        .await
        .unwrap();
    let keys: Vec<_> = claimed.iter().map(|j| j.operation_key.as_str()).collect();
    assert_eq!(
        keys,
        ["old", "old-after"],
        "no partition: only the kind's limit"
    );
    assert!(claimed.iter().all(|j| j.partition.is_none()));
}

#[tokio::test]
async fn postgres_partitions_keep_the_previous_release_s_jobs() {
    let db = TestPostgres::empty().await;
    let pool = db.pool(2).await;
    partitions_keep_the_previous_release_s_jobs(pool.clone(), PREVIOUS_ENQUEUE[0]).await;
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'oncely_outbox_due_by_partition'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        indexes
            .iter()
            .any(|i| i
                .contains("(kind, partition_key, run_after, id) WHERE (status = 'pending'::text)")),
        "{indexes:?}"
    );
}

#[tokio::test]
async fn sqlite_partitions_keep_the_previous_release_s_jobs() {
    let db = TestSqlite::new();
    let pool = db.pool(2).await;
    partitions_keep_the_previous_release_s_jobs(pool.clone(), PREVIOUS_ENQUEUE[1]).await;
    // The partitioned claim's hop to the next partition and its walk of one partition use the
    // partition index.
    for sql in [
        "SELECT partition_key FROM oncely_outbox
          WHERE status = 'pending' AND kind = 'webhook' AND partition_key > 'a'
          ORDER BY partition_key LIMIT 1",
        "SELECT id FROM oncely_outbox
          WHERE status = 'pending' AND kind = 'webhook' AND partition_key = 'a'
            AND run_after <= 5 ORDER BY run_after, id LIMIT 1",
    ] {
        let rows: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                .fetch_all(&pool)
                .await
                .unwrap();
        let plan = rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("; ");
        assert!(plan.contains("oncely_outbox_due_by_partition"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "no sort: {plan}");
    }
}

/// A dead job with a partition, a frozen payload and an attempt, as the release before 0009
/// wrote it, on PostgreSQL and on SQLite; then its attempt (both dialects alike).
const PREVIOUS_DEAD_JOB: [&str; 3] = [
    "INSERT INTO oncely_outbox
            (operation_key, kind, payload, delivery_key, run_after, created_at, partition_key,
             frozen, status, dead_at, last_error, attempts, free_attempts)
     VALUES ($1, 'webhook', '{\"a\":1}', $2, now(), now(), 'endpoint-1', '{\"f\":2}', 'dead',
             now(), 'gave up', 3, 1)",
    "INSERT INTO oncely_outbox
            (operation_key, kind, payload, delivery_key, run_after, created_at, partition_key,
             frozen, status, dead_at, last_error, attempts, free_attempts)
     VALUES ($1, 'webhook', '{\"a\":1}', $2, 0, 0, 'endpoint-1', '{\"f\":2}', 'dead', 0,
             'gave up', 3, 1)",
    "INSERT INTO oncely_outbox_attempts
            (job_id, attempt, worker, lease_token, started_at, finished_at, result, error)
     SELECT id, 1, 'w', delivery_key, created_at, created_at, 'retry', 'busy'
       FROM oncely_outbox WHERE operation_key = $1",
];

/// 0009 (parked jobs) keeps every job and attempt the previous release (up to 0008) wrote, every
/// column of them (on SQLite it rebuilds both tables to widen their checks); the previous
/// release's enqueue still runs on the migrated database, and its jobs can be parked.
async fn parking_keeps_the_previous_release_s_jobs<D: Dialect>(pool: Pool<D>, dialect: usize)
where
    SqlJobStore<D>: JobStore<Database = D>,
    D::Connection: Migrate,
    for<'c> &'c Pool<D>: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> &'q str: sqlx::Encode<'q, D> + sqlx::Type<D>,
    for<'q> uuid::Uuid: sqlx::Encode<'q, D> + sqlx::Type<D>,
{
    release_up_to(&D::migrator(), 8).run(&pool).await.unwrap();
    let delivery_key = uuid::Uuid::new_v4();
    sqlx::query(AssertSqlSafe(PREVIOUS_DEAD_JOB[dialect].to_owned()))
        .bind("old")
        .bind(delivery_key)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(AssertSqlSafe(PREVIOUS_DEAD_JOB[2].to_owned()))
        .bind("old")
        .execute(&pool)
        .await
        .unwrap();
    let store = SqlJobStore::new(pool.clone());
    store.migrate().await.unwrap();
    let old = store.job("old").await.unwrap().unwrap();
    assert_eq!(old.status, oncely_outbox::JobStatus::Dead);
    assert_eq!(old.kind, "webhook");
    assert_eq!(old.payload, serde_json::json!({ "a": 1 }));
    assert_eq!(old.frozen, Some(serde_json::json!({ "f": 2 })));
    assert_eq!(old.partition.as_deref(), Some("endpoint-1"));
    assert_eq!(old.delivery_key, delivery_key);
    assert_eq!(old.last_error.as_deref(), Some("gave up"));
    assert_eq!((old.attempts, old.free_attempts), (3, 1));
    let attempts = store.attempts(old.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].result.as_deref(), Some("retry"));
    assert_eq!(attempts[0].error.as_deref(), Some("busy"));
    // The previous release's enqueue runs; the job parks (the widened check takes 'unknown').
    sqlx::query(AssertSqlSafe(PREVIOUS_ENQUEUE[dialect].to_owned()))
        .bind("new")
        .bind(uuid::Uuid::new_v4())
        .execute(&pool)
        .await
        .unwrap();
    let claimed = store
        .claim(
            "w",
            &["webhook".to_owned()],
            10,
            std::time::Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let finish = oncely_outbox::store::Finish::retry(
        oncely_outbox::AttemptResult::Unknown,
        std::time::Duration::from_secs(1),
        "lost".into(),
    )
    .parked();
    assert!(store.finish(&claimed[0], &finish).await.unwrap());
    assert_eq!(
        store.job("new").await.unwrap().unwrap().status,
        oncely_outbox::JobStatus::Unknown
    );
}

#[tokio::test]
async fn postgres_parking_keeps_the_previous_release_s_jobs() {
    let db = TestPostgres::empty().await;
    parking_keeps_the_previous_release_s_jobs(db.pool(2).await, 0).await;
}

#[tokio::test]
async fn sqlite_parking_keeps_the_previous_release_s_jobs() {
    let db = TestSqlite::new();
    parking_keeps_the_previous_release_s_jobs(db.pool(2).await, 1).await;
}
