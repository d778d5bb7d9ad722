//! The secrets: the server secret — given (`ONCELY_SECRET`, with `ONCELY_SECRET_PREVIOUS` during
//! a rotation) or, in development, generated and then shared through the database — and the
//! check that every process of a database uses the same one; and the webhook endpoints' signing
//! secrets, sealed under it ([`signing`]).

use std::path::{Path, PathBuf};

use anyhow::bail;
use oncely::ServerSecret;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};

use crate::accounts::{AccountError, Accounts, SecretCheck};
use crate::environment::Environment;

pub mod signing;

/// The shortest `ONCELY_SECRET` accepted.
pub const MIN_SECRET_CHARS: usize = 32;

/// The fewest different characters an `ONCELY_SECRET` has: 32 spaces or one repeated
/// character is a placeholder. (Not asked of `ONCELY_SECRET_PREVIOUS`: rotating away from a
/// weak secret must stay possible.)
pub const MIN_SECRET_DISTINCT_CHARS: usize = 8;

/// The length of the piece `secret` repeats (`change-me-change-me-…`: 10), if it is one piece
/// of at most half its length written again and again (the last copy may be cut short).
fn repeated_piece(secret: &str) -> Option<usize> {
    let bytes = secret.as_bytes();
    (1..=bytes.len() / 2).find(|&period| {
        bytes
            .iter()
            .enumerate()
            .skip(period)
            .all(|(i, b)| *b == bytes[i - period])
    })
}

/// Where development state (the generated secret) lives: beside the SQLite file, else here.
pub fn data_dir(database_url: &str) -> PathBuf {
    crate::backend::Sqlite::directory(database_url).unwrap_or_else(|| PathBuf::from("."))
}

/// A development secret for a process given none: the `.oncely-secret` an earlier release
/// generated into `data_dir`, if there is one (its database's links keep working), else 32
/// random bytes in hex. The database keeps the first one a process stored
/// ([`development_secret`]); nothing is written here.
fn generated_secret(data_dir: &Path) -> String {
    if let Ok(existing) = std::fs::read_to_string(data_dir.join(".oncely-secret")) {
        let existing = existing.trim();
        if existing.len() >= MIN_SECRET_CHARS {
            return existing.to_owned();
        }
    }
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The server secret: given, or (development only) read from or generated into the data
/// directory, so that it survives restarts.
/// With `ONCELY_SECRET_PREVIOUS`, the previous secret verifies what it made (see
/// [`ServerSecret::with_previous`]).
/// The second value is the generated secret, when none was given (development). Used by
/// `serve`, `worker` and the commands that seal webhook secrets.
pub fn server_secret(
    environment: Environment,
    (secret, secret_previous): (Option<&SecretString>, Option<&SecretString>),
    database_url: &str,
) -> anyhow::Result<(ServerSecret, Option<SecretString>)> {
    let (current, generated) = current_secret(environment, secret, database_url)?;
    let Some(previous) = secret_previous else {
        return Ok((current, generated));
    };
    let previous = previous.expose_secret();
    if previous.len() < MIN_SECRET_CHARS {
        bail!("ONCELY_SECRET_PREVIOUS must be at least {MIN_SECRET_CHARS} characters");
    }
    if secret.map(ExposeSecret::expose_secret) == Some(previous) {
        bail!(
            "ONCELY_SECRET_PREVIOUS is the same as ONCELY_SECRET; set it to the secret before the rotation"
        );
    }
    let ring = current.with_previous(vec![ServerSecret::new(previous.as_bytes().to_vec())?]);
    Ok((ring, generated))
}

fn current_secret(
    environment: Environment,
    secret: Option<&SecretString>,
    database_url: &str,
) -> anyhow::Result<(ServerSecret, Option<SecretString>)> {
    if let Some(secret) = secret {
        let secret = secret.expose_secret();
        if secret.len() < MIN_SECRET_CHARS {
            bail!("ONCELY_SECRET must be at least {MIN_SECRET_CHARS} characters");
        }
        let distinct = secret
            .chars()
            .collect::<std::collections::HashSet<_>>()
            .len();
        if distinct < MIN_SECRET_DISTINCT_CHARS {
            bail!(
                "ONCELY_SECRET is a placeholder, not a secret (only {distinct} different character{}): use at least {MIN_SECRET_CHARS} random characters, e.g. `openssl rand -hex 32`",
                if distinct == 1 { "" } else { "s" }
            );
        }
        if let Some(period) = repeated_piece(secret) {
            bail!(
                "ONCELY_SECRET is a placeholder, not a secret (one piece of {period} characters repeated): use at least {MIN_SECRET_CHARS} random characters, e.g. `openssl rand -hex 32`"
            );
        }
        return Ok((ServerSecret::new(secret.as_bytes().to_vec())?, None));
    }
    if environment == Environment::Production {
        bail!(
            "ONCELY_SECRET is required in production (at least {MIN_SECRET_CHARS} random characters)"
        );
    }
    let generated = generated_secret(&data_dir(database_url));
    let secret = ServerSecret::new(generated.as_bytes().to_vec())?;
    Ok((secret, Some(generated.into())))
}

/// The server secret of a development process that was given none: the one stored in the
/// database (the first process stored the one it `generated`), with the previous secrets of
/// `secret` (the process's secret until now). Every process of the database then signs alike,
/// wherever it was started.
pub async fn development_secret<A: Accounts>(
    accounts: &A,
    generated: &SecretString,
    secret: &ServerSecret,
) -> anyhow::Result<ServerSecret> {
    let stored = accounts
        .development_secret(generated.expose_secret())
        .await
        .map_err(|e| anyhow::anyhow!("reading the development secret: {e}"))?;
    Ok(ServerSecret::new(stored.into_bytes())?.with_previous(secret.previous().to_vec()))
}

/// The server secret of a process that is not `serve` (the gateway, the commands that seal
/// webhook secrets), resolved as `serve` resolves it: given, or in development the one its
/// database stores.
pub async fn command_secret<B: Accounts>(
    backend: &B,
    environment: Environment,
    secrets: (Option<&SecretString>, Option<&SecretString>),
    database_url: &str,
) -> anyhow::Result<ServerSecret> {
    let (secret, generated) = server_secret(environment, secrets, database_url)?;
    match generated {
        Some(generated) => development_secret(backend, &generated, &secret).await,
        None => Ok(secret),
    }
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
pub async fn check_secret<A: Accounts>(accounts: &A, secret: &ServerSecret) -> anyhow::Result<()> {
    let mine = SecretCheck::of(secret);
    let read = |e: AccountError| anyhow::anyhow!("reading the secret check: {e}");
    for _ in 0..3 {
        let Some(stored) = accounts.secret_check().await.map_err(read)? else {
            if accounts
                .write_secret_check(&mine, None)
                .await
                .map_err(read)?
            {
                return Ok(());
            }
            continue;
        };
        if stored.retired.contains(&mine.current) {
            anyhow::bail!(
                "ONCELY_SECRET is a secret this database retired at the end of a rotation: the other processes no longer know it (and would not find its keys). Give this process the current secret"
            );
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
            if accounts
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
            anyhow::bail!(
                "the other processes of this database already use a newer server secret, which this process does not know: it would not find their keys (and run their retries again). Give it the new secret (ONCELY_SECRET, with this one as ONCELY_SECRET_PREVIOUS), or both with the new one as ONCELY_SECRET_PREVIOUS (docs/operations.md, rotating the server secret)"
            );
        }
        if !previous.contains(&stored.current) {
            anyhow::bail!(
                "ONCELY_SECRET is not the secret the other processes of this database use (the database keeps a keyed hash of theirs): give every process the same ONCELY_SECRET; to rotate it, see docs/operations.md (rotating the server secret)"
            );
        }
        let switched = SecretCheck {
            retired: stored.retired.clone(),
            ..mine.clone()
        };
        if accounts
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
    anyhow::bail!(
        "the secret check of the database kept changing while this process started; start it again"
    )
}
