//! The secret every process on one database must share, kept in the key store's tables: a
//! check that refuses a process started with another server secret
//! ([`require_shared_secret`]), and the secret a development database makes for itself
//! ([`development_secret`]). `oncely serve`, `worker` and `gateway` run both at start; so does
//! any service of yours whose processes share a key store.
//!
//! Why a check: each process makes fingerprints (and, in the gateway, tenants from hashed
//! credentials) with the secret. A process with another secret answers its neighbours' retries
//! 422 — or, where keys are scoped by a hashed credential, runs them again. The database keeps
//! keyed hashes of the secrets (never a secret), so a process with another one is refused at
//! start, in one line.

use std::future::Future;

use secrecy::{ExposeSecret, SecretString};
use sqlx::{Encode, Executor, IntoArguments, Type};

use super::StoreError;
use super::sql::{Dialect, SqlKeyStore};
use crate::ServerSecret;
use oncely_sql::Db;
use oncely_sql::open::Open;

/// What the database keeps of the server secret its processes use, to check at start that
/// they all use the same one: keyed hashes, never the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretCheck {
    /// The MAC of the current secret, hex.
    pub current: String,
    /// The MAC of the previous secret, during a rotation, hex.
    pub previous: Option<String>,
    /// The MACs of the secrets of rotations that ended: never accepted again.
    pub retired: Vec<String>,
}

impl SecretCheck {
    /// The check of `secret` (its current secret and its first previous one).
    pub fn of(secret: &ServerSecret) -> Self {
        let mac = |s: &ServerSecret| hex::encode(s.mac("oncely-secret-check", &[]));
        Self {
            current: mac(secret),
            previous: secret.previous().first().map(mac),
            retired: Vec::new(),
        }
    }
}

/// Where the shared secret's rows are kept: the key store's database.
pub trait SharedSecretStore: Send + Sync {
    /// The development secret of this database: `candidate`, stored now, unless a process
    /// stored one before (then that one).
    fn development_secret(
        &self,
        candidate: &str,
    ) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// The secret check (none yet: `None`).
    fn secret_check(&self) -> impl Future<Output = Result<Option<SecretCheck>, StoreError>> + Send;

    /// Stores `check`: the first one (`replacing` is `None`), or in place of the one whose
    /// current MAC is `replacing`. `false`: another process wrote first.
    fn write_secret_check(
        &self,
        check: &SecretCheck,
        replacing: Option<&str>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

impl<DB> SharedSecretStore for SqlKeyStore<DB>
where
    DB: Dialect,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c Db<DB>: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'r> (String,): sqlx::FromRow<'r, DB::Row>,
    for<'r> (String, Option<String>, String): sqlx::FromRow<'r, DB::Row>,
{
    async fn development_secret(&self, candidate: &str) -> Result<String, StoreError> {
        let (stored,): (String,) = sqlx::query_as(DB::STATEMENTS.development_secret)
            .bind(candidate)
            .fetch_one(self.db())
            .await?;
        Ok(stored)
    }

    async fn secret_check(&self) -> Result<Option<SecretCheck>, StoreError> {
        let row: Option<(String, Option<String>, String)> =
            sqlx::query_as(DB::STATEMENTS.secret_check)
                .fetch_optional(self.db())
                .await?;
        Ok(row.map(|(current, previous, retired)| SecretCheck {
            current,
            previous,
            retired: retired
                .split(',')
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .collect(),
        }))
    }

    async fn write_secret_check(
        &self,
        check: &SecretCheck,
        replacing: Option<&str>,
    ) -> Result<bool, StoreError> {
        let retired = check.retired.join(",");
        let statement = match replacing {
            None => DB::STATEMENTS.add_secret_check,
            Some(_) => DB::STATEMENTS.replace_secret_check,
        };
        let mut query = sqlx::query(statement)
            .bind(check.current.as_str())
            .bind(check.previous.as_deref())
            .bind(retired.as_str());
        if let Some(stored) = replacing {
            query = query.bind(stored);
        }
        let done = query.execute(self.db()).await?;
        Ok(DB::rows_affected(&done) == 1)
    }
}

/// The tables the previous release kept the shared secret in (the account service's), beside
/// this one's: `(previous, now, columns)`.
const PREVIOUS_RELEASE: [(&str, &str, &str); 2] = [
    (
        "oncely_secret_check",
        "oncely_shared_secret_check",
        "id, current_mac, previous_mac, retired_macs",
    ),
    (
        "oncely_development_secret",
        "oncely_shared_development_secret",
        "id, secret",
    ),
];

/// Which of [`PREVIOUS_RELEASE`]'s tables this database has (a database the previous release
/// ran on: both; a fresh one: none). Asked once per start.
async fn previous_release_tables<DB: Open>(
    db: &Db<DB>,
) -> Result<Vec<(&'static str, &'static str, &'static str)>, StoreError> {
    let mut present = Vec::new();
    for tables in PREVIOUS_RELEASE {
        if DB::scalar(db, DB::has_table(tables.0)).await? > 0 {
            present.push(tables);
        }
    }
    Ok(present)
}

/// On a database the previous release ran on, its secret check and development secret become
/// this release's, unless this release's tables already hold theirs: a process started before
/// `oncely migrate` copied them (a gateway in development, which migrates the key store's
/// history alone, on SQLite, where the key store's migration cannot copy them) would otherwise
/// start the check afresh — accepting another secret, forgetting retired ones — and sign with
/// another development secret (the links already sent then fail). `present`: the previous
/// release's tables this database has.
async fn adopt_previous_release<DB: Open>(
    db: &Db<DB>,
    present: &[(&str, &str, &str)],
) -> Result<(), StoreError> {
    for (previous, now, columns) in present {
        DB::execute(
            db,
            format!(
                "INSERT INTO {now} ({columns}) SELECT {columns} FROM {previous} WHERE true \
                 ON CONFLICT (id) DO NOTHING"
            ),
        )
        .await?;
    }
    Ok(())
}

/// Writes this release's secret check and development secret into the previous release's
/// tables (`present`): a process of the previous release still running, or started during a
/// rolling upgrade or a rollback, reads only those — and would accept a secret that this
/// release's processes refuse, or one a rotation retired.
async fn mirror_to_previous_release<DB: Open>(
    db: &Db<DB>,
    present: &[(&str, &str, &str)],
) -> Result<(), StoreError> {
    for (previous, now, columns) in present {
        let update = columns
            .split(", ")
            .filter(|c| *c != "id")
            .map(|c| format!("{c} = excluded.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        DB::execute(
            db,
            format!(
                "INSERT INTO {previous} ({columns}) SELECT {columns} FROM {now} WHERE true \
                 ON CONFLICT (id) DO UPDATE SET {update}"
            ),
        )
        .await?;
    }
    Ok(())
}

/// Why a process may not use its server secret on this database.
#[derive(Debug, thiserror::Error)]
pub enum SharedSecretError {
    /// The secret check could not be read or written.
    #[error("reading the secret check: {0}")]
    Store(#[source] StoreError),
    /// The development secret could not be read or stored.
    #[error("reading the development secret: {0}")]
    Development(#[source] StoreError),
    /// A secret a rotation retired.
    #[error(
        "ONCELY_SECRET is a secret this database retired at the end of a rotation: the other processes no longer know it (and would not find its keys). Give this process the current secret"
    )]
    Retired,
    /// The others moved on to a secret this process does not know.
    #[error(
        "the other processes of this database already use a newer server secret, which this process does not know: it would not find their keys (and run their retries again). Give it the new secret (ONCELY_SECRET, with this one as ONCELY_SECRET_PREVIOUS), or both with the new one as ONCELY_SECRET_PREVIOUS (docs/operations.md, rotating the server secret)"
    )]
    Newer,
    /// Another secret altogether.
    #[error(
        "ONCELY_SECRET is not the secret the other processes of this database use (the database keeps a keyed hash of theirs): give every process the same ONCELY_SECRET; to rotate it, see docs/operations.md (rotating the server secret)"
    )]
    Different,
    /// Other processes kept rewriting the check.
    #[error(
        "the secret check of the database kept changing while this process started; start it again"
    )]
    Changing,
}

/// What a process does at start with its server secret `secret` (or, `generated` in
/// development when none was given, the one its database keeps): the previous release's rows
/// adopted (the account service's tables, where they exist), the development secret resolved
/// ([`development_secret`]), the secret required to be the one the other processes use
/// ([`require_shared_secret`]), and the outcome written back where the previous release's
/// processes read it. `store` is the key store on `db`.
pub async fn share_secret<S: SharedSecretStore, DB: Open>(
    store: &S,
    db: &Db<DB>,
    secret: ServerSecret,
    generated: Option<&SecretString>,
) -> Result<ServerSecret, SharedSecretError> {
    let present = previous_release_tables(db)
        .await
        .map_err(SharedSecretError::Store)?;
    adopt_previous_release(db, &present)
        .await
        .map_err(SharedSecretError::Store)?;
    let secret = match generated {
        Some(generated) => development_secret(store, generated, &secret).await?,
        None => secret,
    };
    require_shared_secret(store, &secret).await?;
    mirror_to_previous_release(db, &present)
        .await
        .map_err(SharedSecretError::Store)?;
    Ok(secret)
}

/// The server secret of a development process that was given none: the one stored in the
/// database (the first process stored the one it `generated`), with the previous secrets of
/// `secret` (the process's secret until now). Every process of the database then signs alike,
/// wherever it was started.
pub async fn development_secret<S: SharedSecretStore>(
    store: &S,
    generated: &SecretString,
    secret: &ServerSecret,
) -> Result<ServerSecret, SharedSecretError> {
    let stored = store
        .development_secret(generated.expose_secret())
        .await
        .map_err(SharedSecretError::Development)?;
    let stored = ServerSecret::new(stored.into_bytes())
        .map_err(|_| SharedSecretError::Development(StoreError::Corrupt("development secret")))?;
    Ok(stored.with_previous(secret.previous().to_vec()))
}

/// Refuses a process whose server secret is not the one the other processes of its database
/// use: its fingerprints would not match theirs (their retries answered 422 here), nor its
/// links, nor — where keys are scoped by a credential hashed with the secret (`oncely
/// gateway`) — its tenants (their retries run again here). The database keeps a keyed hash of
/// the current secret and of the previous one of the process that wrote it last. Accepted: the
/// same current secret; a ring whose previous secret is the stored current (the rotation's
/// switch rolling out: the check moves to the new secret); a current secret that is the stored
/// previous if the ring also holds the stored current (a process of the rotation's first step,
/// which verifies what the switched ones write). Refused: a process that knows only the old
/// secret once any process uses the new one — it would not find their keys; and, once a process
/// without the previous secret has started (the rotation ended), the old secret for good.
pub async fn require_shared_secret<S: SharedSecretStore>(
    store: &S,
    secret: &ServerSecret,
) -> Result<(), SharedSecretError> {
    let mine = SecretCheck::of(secret);
    let read = SharedSecretError::Store;
    for _ in 0..3 {
        let Some(stored) = store.secret_check().await.map_err(read)? else {
            if store.write_secret_check(&mine, None).await.map_err(read)? {
                return Ok(());
            }
            continue;
        };
        if stored.retired.contains(&mine.current) {
            return Err(SharedSecretError::Retired);
        }
        if stored.current == mine.current {
            let Some(old) = stored
                .previous
                .clone()
                .filter(|_| secret.previous().is_empty())
            else {
                return Ok(());
            };
            // The first process without the previous secret: the rotation has ended, and the
            // old secret is never accepted again (a stale replica of step 1 would otherwise
            // make keys the others cannot find).
            let mut ended = stored.clone();
            ended.previous = None;
            ended.retired.push(old);
            if store
                .write_secret_check(&ended, Some(&stored.current))
                .await
                .map_err(read)?
            {
                tracing::info!("the server secret's rotation has ended: the old secret is retired");
                return Ok(());
            }
            continue;
        }
        let previous: Vec<String> = secret
            .previous()
            .iter()
            .map(|p| SecretCheck::of(p).current)
            .collect();
        if stored.previous.as_deref() == Some(mine.current.as_str()) {
            // A process of the rotation's first step (the old secret, the next one accepted as
            // previous) while others already use the next one: it reads what they write.
            if previous.contains(&stored.current) {
                return Ok(());
            }
            return Err(SharedSecretError::Newer);
        }
        if !previous.contains(&stored.current) {
            return Err(SharedSecretError::Different);
        }
        let switched = SecretCheck {
            retired: stored.retired.clone(),
            ..mine.clone()
        };
        if store
            .write_secret_check(&switched, Some(&stored.current))
            .await
            .map_err(read)?
        {
            tracing::info!(
                "the server secret is rotating: the database's secret check now names the new secret"
            );
            return Ok(());
        }
    }
    Err(SharedSecretError::Changing)
}
