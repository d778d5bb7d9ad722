//! Account storage on both backends, through the library: migrations a previous release
//! applied, and time-dependent statements with an injected `now` (no sleeping).

use oncely_server::accounts::{
    Accounts, NewEndpoint, NewToken, ReturnTo, SignupCounted, SignupOutcome,
};
use oncely_server::backend::{Backend, Postgres, Sqlite};
use oncely_server::email::EmailAddress;
use oncely_testdb::TestDb;
use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use time::{Duration, OffsetDateTime};

use crate::support::{
    both_databases, both_empty_databases, on_backend, open_backend, open_migrated,
};

/// The account migrations as the previous release built them by hand (before
/// `sqlx::migrate!`), with their descriptions: what its databases recorded.
fn previous_release(files: [&'static str; 5]) -> Migrator {
    let descriptions = [
        "accounts",
        "tenants, invites, rate limits",
        "prune indexes",
        "signup password on its verification token",
        "signup password attempts",
    ];
    let migrations = (1..)
        .zip(descriptions.into_iter().zip(files))
        .map(|(version, (description, sql))| {
            Migration::new(
                version,
                description.into(),
                MigrationType::Simple,
                sql.into_sql_str(),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name("_oncely_server_migrations");
    migrator
}

macro_rules! account_migrations {
    ($dialect:literal) => {
        previous_release([
            include_str!(concat!(
                "../../../oncely-server/migrations/",
                $dialect,
                "/0001_accounts.sql"
            )),
            include_str!(concat!(
                "../../../oncely-server/migrations/",
                $dialect,
                "/0002_tenants_invites_limits.sql"
            )),
            include_str!(concat!(
                "../../../oncely-server/migrations/",
                $dialect,
                "/0003_prune_indexes.sql"
            )),
            include_str!(concat!(
                "../../../oncely-server/migrations/",
                $dialect,
                "/0004_signup_password_on_token.sql"
            )),
            include_str!(concat!(
                "../../../oncely-server/migrations/",
                $dialect,
                "/0005_signup_password_attempts.sql"
            )),
        ])
    };
}

fn versions_and_checksums(migrator: &Migrator) -> Vec<(i64, Vec<u8>)> {
    migrator
        .iter()
        .map(|m| (m.version, m.checksum.to_vec()))
        .collect()
}

/// Moving to `sqlx::migrate!` must not change what a migrated database recorded: a changed
/// checksum would stop every existing deployment at start-up. Later migrations only follow
/// them.
#[test]
fn sqlx_migrate_keeps_the_checksums_of_the_previous_release() {
    let [_, _, postgres] = Postgres::migrators();
    let [_, _, sqlite] = Sqlite::migrators();
    let previous = versions_and_checksums(&account_migrations!("postgres"));
    assert_eq!(
        versions_and_checksums(&postgres)[..previous.len()],
        previous
    );
    let previous = versions_and_checksums(&account_migrations!("sqlite"));
    assert_eq!(versions_and_checksums(&sqlite)[..previous.len()], previous);
}

// The previous release's migrations first: on an empty database.
both_empty_databases!(a_database_the_previous_release_migrated_migrates_and_is_ready);

both_databases!(
    expired_tokens_are_pruned_by_the_given_clock,
    a_signups_user_counters_and_endpoints_are_written_and_read_as_their_statements_do
);

async fn a_database_the_previous_release_migrated_migrates_and_is_ready(url: String, _db: TestDb) {
    if url.starts_with("postgres") {
        migrated_by_the_previous_release::<Postgres>(&url, account_migrations!("postgres")).await;
    } else {
        migrated_by_the_previous_release::<Sqlite>(&url, account_migrations!("sqlite")).await;
    }
}

async fn migrated_by_the_previous_release<B: Accounts>(url: &str, previous: Migrator) {
    let backend = open_backend::<B>(url).await;
    previous.run(backend.pool()).await.unwrap();
    oncely_server::startup::migrate(&backend)
        .await
        .expect("this release migrates it");
    backend.ready().await.expect("and is ready on it");
}

async fn expired_tokens_are_pruned_by_the_given_clock(url: String, _db: TestDb) {
    on_backend!(url, prune_tokens_at(&url));
}

async fn prune_tokens_at<B: Accounts>(url: &str) {
    let backend = open_migrated::<B>(url).await;
    let now = OffsetDateTime::now_utc();
    let token = NewToken {
        id: uuid::Uuid::new_v4(),
        tenant: "default",
        user_id: None,
        email: None,
        flow: "verification",
        hash: &[7; 32],
        expires_at: now + Duration::hours(1),
        password_hash: None,
        supersede: false,
        return_to: ReturnTo::Nowhere,
        locale: None,
    };
    let mut conn = backend.pool().acquire().await.unwrap();
    B::insert_token(&mut conn, &token).await.unwrap();
    drop(conn);
    let kept_for = std::time::Duration::from_secs(7 * 24 * 3600);
    let week = Duration::days(7);
    let later = |d: Duration| Some(now + d);
    assert_eq!(
        backend.prune_tokens(None, kept_for, 500).await.unwrap(),
        0,
        "not expired"
    );
    assert_eq!(
        backend
            .prune_tokens(later(week), kept_for, 500)
            .await
            .unwrap(),
        0,
        "expired less than the retention ago"
    );
    assert_eq!(
        backend
            .prune_tokens(later(week + Duration::hours(2)), kept_for, 500)
            .await
            .unwrap(),
        1,
        "expired more than the retention ago"
    );
}

/// An email to count on the counters `pair` (`None`: an unknown client) and "address", with a
/// per-address cap of `per_address`, the client's own cap letting it through or not.
fn email_count(
    pair: Option<&str>,
    per_address: i64,
    client_allowed: bool,
) -> oncely_server::limits::mail::MailCount {
    oncely_server::limits::mail::MailCount {
        pair: pair.map(str::to_owned),
        address: "address".to_owned(),
        window_start: 0,
        per_address,
        client_allowed,
        charge: oncely_server::limits::mail::ClientCharge::nothing(),
    }
}

/// Issue 20: a signup's user, its email's counters and the tenant's endpoints are one statement
/// on PostgreSQL and three on SQLite; both give what the separate statements give, for a known
/// and an unknown client, a client over its per-address cap or its own cap, a new, pending and
/// verified account, with and without (enabled) endpoints.
async fn a_signups_user_counters_and_endpoints_are_written_and_read_as_their_statements_do(
    url: String,
    _db: TestDb,
) {
    on_backend!(url, signup_user_counted_on(&url));
}

async fn signup_user_counted_on<B: Accounts>(url: &str) {
    use oncely_server::limits::mail::MailCount;

    let backend = open_migrated::<B>(url).await;
    let mut conn = backend.pool().acquire().await.unwrap();
    let ada = EmailAddress::parse("ada@example.com").unwrap();
    let count = |pair, client_allowed| email_count(pair, 2, client_allowed);
    let mut signup = async |count: MailCount| {
        B::signup_user_counted(&mut conn, "acme", &ada, Some("test"), &count)
            .await
            .unwrap()
    };
    let first = signup(count(Some("pair:one"), true)).await;
    let SignupOutcome::Created(id) = first.outcome else {
        panic!("{first:?}");
    };
    assert_eq!((first.counts, first.targets), ((1, Some(1)), vec![]));
    let known = |counts| SignupCounted {
        outcome: SignupOutcome::Pending(id),
        counts,
        targets: vec![],
    };
    assert_eq!(
        signup(count(Some("pair:one"), true)).await,
        known((2, Some(2)))
    );
    // Over the per-address cap of this client: the address's total is not counted.
    assert_eq!(
        signup(count(Some("pair:one"), true)).await,
        known((3, None))
    );
    // Over the client's own cap: neither is the total.
    assert_eq!(
        signup(count(Some("pair:two"), false)).await,
        known((1, None))
    );
    // An unknown client counts against the total only.
    assert_eq!(signup(count(None, true)).await, known((0, Some(3))));
    assert_eq!(
        signup(count(Some("pair:two"), true)).await,
        known((2, Some(4)))
    );

    let mut endpoints = vec![];
    for (n, (tenant, events, disabled)) in [
        ("acme", "[]", false),
        ("acme", r#"["user.created"]"#, false),
        ("acme", "[]", true),
        ("other", "[]", false),
    ]
    .into_iter()
    .enumerate()
    {
        let id = uuid::Uuid::new_v4();
        let url = format!("https://hooks.example.com/{n}");
        let (url, secret_sealed) = (url.as_str(), "sealed");
        let endpoint = NewEndpoint {
            id,
            tenant,
            url,
            events,
            secret_sealed,
        };
        backend.insert_webhook_endpoint(endpoint).await.unwrap();
        if disabled {
            assert!(
                backend
                    .set_webhook_disabled(id, Some("test"))
                    .await
                    .unwrap()
            );
        } else if tenant == "acme" {
            endpoints.push((id, events.to_owned()));
        }
    }
    crate::support::execute(url, "UPDATE oncely_users SET status = 'verified'").await;
    let verified = signup(count(Some("pair:three"), true)).await;
    let targets = B::webhook_targets(&mut conn, "acme").await.unwrap();
    let mut enabled = targets.clone();
    enabled.sort();
    endpoints.sort();
    assert_eq!(enabled, endpoints, "the tenant's enabled endpoints");
    assert_eq!(
        verified,
        SignupCounted {
            outcome: SignupOutcome::Verified(id),
            counts: (1, Some(5)),
            targets,
        }
    );
    let users = "SELECT count(*) FROM oncely_users";
    assert_eq!(crate::support::count(url, users).await, 1);
}

/// A migrated PostgreSQL database and the backend on it.
async fn migrated_postgres_backend() -> (String, TestDb, Postgres) {
    let (url, db) = crate::support::postgres_db().await;
    let backend = open_migrated::<Postgres>(url.as_str()).await;
    (url, db, backend)
}

/// Ada's signup (counted as `count`) in a transaction of its own while `holder` holds what it
/// needs: once it waits for `holder`, `holder` commits; the signup's result.
async fn ada_signs_up_behind(
    backend: &Postgres,
    url: &str,
    holder: sqlx::Transaction<'static, sqlx::Postgres>,
    count: oncely_server::limits::mail::MailCount,
) -> SignupCounted {
    let pool = backend.pool().clone();
    let signup = tokio::spawn(async move {
        let mut tx = pool.begin().await.unwrap();
        let ada = EmailAddress::parse("ada@example.com").unwrap();
        Postgres::signup_user_counted(&mut tx, "default", &ada, None, &count).await
    });
    until_a_transaction_waits(url).await;
    holder.commit().await.unwrap();
    signup.await.unwrap().unwrap()
}

/// Ada's new account of the default tenant, counted as `count`: its id.
async fn ada_created(
    conn: &mut sqlx::PgConnection,
    count: &oncely_server::limits::mail::MailCount,
) -> uuid::Uuid {
    let ada = EmailAddress::parse("ada@example.com").unwrap();
    let created = Postgres::signup_user_counted(conn, "default", &ada, None, count)
        .await
        .unwrap();
    let SignupOutcome::Created(id) = created.outcome else {
        panic!("{created:?}");
    };
    id
}

/// A new account of the default tenant at `address`: its id.
async fn created(conn: &mut sqlx::PgConnection, address: &EmailAddress) -> uuid::Uuid {
    match Postgres::signup_user(conn, "default", address, None)
        .await
        .unwrap()
    {
        SignupOutcome::Created(id) => id,
        other => panic!("{other:?}"),
    }
}

/// Issue 20: on PostgreSQL a signup's user is inserted and read back in one statement, whose
/// snapshot cannot see an account that a concurrent signup of the same address committed while
/// the insert waited for it: the account is then read by a statement of its own, and the
/// signup finds it (pending), never "vanished" and never a second account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signup_racing_another_for_its_address_finds_the_account_the_other_committed() {
    let (url, _db, backend) = migrated_postgres_backend().await;
    let count = email_count(Some("pair"), 10, true);
    let mut first = backend.pool().begin().await.unwrap();
    let id = ada_created(&mut first, &count).await;
    let raced = ada_signs_up_behind(&backend, &url, first, count).await;
    assert_eq!(raced.outcome, SignupOutcome::Pending(id));
    let users = "SELECT count(*) FROM oncely_users";
    assert_eq!(crate::support::count(&url, users).await, 1);
}

/// Review of issue 20: a signup whose address is being verified by another transaction waits
/// for it and finds the account verified (its email is the notice to an existing account),
/// not pending as the statement's snapshot had it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signup_racing_a_verification_of_its_address_finds_the_account_verified() {
    let (url, _db, backend) = migrated_postgres_backend().await;
    let count = email_count(None, 10, true);
    let mut conn = backend.pool().acquire().await.unwrap();
    let id = ada_created(&mut conn, &count).await;
    drop(conn);
    let mut verifying = backend.pool().begin().await.unwrap();
    sqlx::query("UPDATE oncely_users SET status = 'verified' WHERE id = $1")
        .bind(id)
        .execute(&mut *verifying)
        .await
        .unwrap();
    let raced = ada_signs_up_behind(&backend, &url, verifying, count).await;
    assert_eq!(raced.outcome, SignupOutcome::Verified(id));
}

/// Two accounts changing to one address at once on PostgreSQL: the second transaction's
/// statement saw no holder (the first had not committed), waits on the unique index, and the
/// violation it then gets — which aborts its transaction — is the same `false` as a taken
/// address, not an error (the route answers `token-invalid` and rolls back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_racing_to_one_address_is_refused_like_a_taken_one() {
    let (url, _db, backend) = migrated_postgres_backend().await;
    let mut conn = backend.pool().acquire().await.unwrap();
    let mut user = async |address: &str| {
        let address = EmailAddress::parse(address).unwrap();
        created(&mut conn, &address).await
    };
    let (ada, bob) = (user("ada@example.com").await, user("bob@example.com").await);
    drop(conn);
    let mut first = backend.pool().begin().await.unwrap();
    assert!(
        Postgres::change_email(&mut first, ada, "x@example.com")
            .await
            .unwrap()
    );
    let pool = backend.pool().clone();
    let second = tokio::spawn(async move {
        let mut second = pool.begin().await.unwrap();
        Postgres::change_email(&mut second, bob, "x@example.com").await
    });
    // The second transaction waits on the first's row in the index.
    until_a_transaction_waits(&url).await;
    first.commit().await.unwrap();
    let raced = second.await.unwrap();
    assert!(matches!(raced, Ok(false)), "{raced:?}");
    let holders = "SELECT count(*) FROM oncely_users WHERE email = 'x@example.com'";
    assert_eq!(crate::support::count(&url, holders).await, 1);
}

/// Second review of issue 16: a password reset and an email change of one account used at once
/// deadlocked on PostgreSQL (each locked its own link, then wanted the other's: the reset to
/// end it, the change to supersede it) and one of them was a 500. Using a link locks its
/// account first, so the second waits for the first and then finds its link ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_links_of_one_account_used_at_once_run_one_after_the_other() {
    let (url, _db, backend) = migrated_postgres_backend().await;
    let mut conn = backend.pool().acquire().await.unwrap();
    let address = EmailAddress::parse("ada@example.com").unwrap();
    let ada = created(&mut conn, &address).await;
    let (reset, change) = (vec![1u8; 32], vec![2u8; 32]);
    for (flow, hash, email) in [
        ("password_reset", &reset, None),
        ("email_change", &change, Some("new@example.com")),
    ] {
        let token = NewToken {
            id: uuid::Uuid::new_v4(),
            tenant: "default",
            user_id: Some(ada),
            email,
            flow,
            hash,
            expires_at: OffsetDateTime::now_utc() + Duration::hours(1),
            password_hash: None,
            supersede: false,
            return_to: ReturnTo::Nowhere,
            locale: None,
        };
        Postgres::insert_token(&mut conn, &token).await.unwrap();
    }
    drop(conn);

    let mut first = backend.pool().begin().await.unwrap();
    let used = Postgres::consume_token(&mut first, None, "password_reset", &reset).await;
    assert!(matches!(used, Ok(Some(_))), "{used:?}");
    let pool = backend.pool().clone();
    let second = tokio::spawn(async move {
        let mut second = pool.begin().await.unwrap();
        let used = Postgres::consume_token(&mut second, None, "email_change", &change).await?;
        if used.is_some() {
            Postgres::change_email(&mut second, ada, "new@example.com").await?;
        }
        second.commit().await.map_err(|e| anyhow::anyhow!(e))?;
        anyhow::Ok(used.is_some())
    });
    until_a_transaction_waits(&url).await;
    let ended = Postgres::end_links(&mut first, ada, false).await;
    assert!(ended.is_ok(), "the reset ends the other links: {ended:?}");
    first.commit().await.unwrap();
    let changed = second.await.unwrap();
    assert!(
        matches!(changed, Ok(false)),
        "the change finds its link ended: {changed:?}"
    );
    let moved = "SELECT count(*) FROM oncely_users WHERE email = 'new@example.com'";
    assert_eq!(crate::support::count(&url, moved).await, 0);
}

/// Waits (bounded) until a transaction of the test's database waits on a lock.
async fn until_a_transaction_waits(url: &str) {
    let waiting = "SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while crate::support::count(url, waiting).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Regression (the crate split's CI, under nextest): `oncely tenant set --return-url` on SQLite
/// while the service wrote failed at once with "database is locked". Its transaction began
/// deferred, read the tenant, then wrote: when another connection committed in between, SQLite
/// refuses the upgrade without waiting (the busy timeout does not apply). It now takes the
/// write lock when it begins, and waits for the other writer like every other write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setting_return_urls_on_sqlite_waits_for_the_services_writes() {
    let db = oncely_testdb::TestSqlite::new();
    crate::support::migrate(db.url()).await;
    let backend = open_backend::<Sqlite>(db.url()).await;
    let tenant = oncely::TenantId::parse("acme").unwrap();
    oncely_cli::commands::tenant::create_tenant(&backend, &tenant)
        .await
        .unwrap();
    // The service: another connection committing small writes back to back.
    let other = db.pool(1).await;
    sqlx::query("CREATE TABLE busy_writes (n INTEGER)")
        .execute(&other)
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut n = 0_i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                sqlx::query("INSERT INTO busy_writes (n) VALUES (?1)")
                    .bind(n)
                    .execute(&other)
                    .await
                    .unwrap();
                n += 1;
            }
            n
        }
    });
    for i in 0..100 {
        let url = format!("https://app.example/callback/{i}");
        let set = backend
            .set_return_urls("acme", std::slice::from_ref(&url))
            .await;
        assert!(matches!(set, Ok(true)), "attempt {i}: {set:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert!(writes > 0, "the other writer never wrote");
}
