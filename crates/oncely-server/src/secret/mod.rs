//! The secrets: the server secret — given (`ONCELY_SECRET`, with `ONCELY_SECRET_PREVIOUS` during
//! a rotation) or, in development, generated and then shared through the database (the check
//! that every process of a database uses the same one is the key store's:
//! `oncely::store::shared_secret`) — and the webhook endpoints' signing secrets, sealed under it
//! ([`signing`]).

use std::path::{Path, PathBuf};

use anyhow::bail;
use oncely::ServerSecret;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};

use oncely::store::shared_secret::development_secret;

use crate::backend::Backend;
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
    oncely_sql::open::directory(database_url).unwrap_or_else(|| PathBuf::from("."))
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

/// The server secret of a process that is not `serve` (the gateway, the commands that seal
/// webhook secrets), resolved as `serve` resolves it: given, or in development the one its
/// database stores.
pub async fn command_secret<B: Backend>(
    backend: &B,
    environment: Environment,
    secrets: (Option<&SecretString>, Option<&SecretString>),
    database_url: &str,
) -> anyhow::Result<ServerSecret> {
    let (secret, generated) = server_secret(environment, secrets, database_url)?;
    match generated {
        Some(generated) => Ok(development_secret(backend.keys(), &generated, &secret).await?),
        None => Ok(secret),
    }
}
