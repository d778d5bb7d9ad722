//! Configuration: flags with environment fallbacks. Secrets never print.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use oncely::ServerSecret;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};

/// `oncely`: retried requests and re-run jobs become harmless.
#[derive(Debug, Parser)]
#[command(name = "oncely", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API (and, unless `--workers 0`, outbox workers in the same process).
    Serve(ServeArgs),
    /// Run outbox workers only.
    Worker(WorkerArgs),
    /// Apply the database migrations and exit.
    Migrate(DatabaseArgs),
    /// Run the test inbox: SMTP and a Resend-compatible HTTP API that keep every message.
    Inbox(InboxArgs),
    /// Manage tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Inspect outbox jobs and re-drive dead ones.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Delete expired keys, old outbox history, expired tokens and old email-cap counters, in
    /// small batches (safe while serving).
    Prune(PruneArgs),
    /// Run a storm of retried, concurrent and conflicting signups against an embedded instance,
    /// and show that every intent made one account and one email.
    Demo {
        /// How many intents (signups for distinct addresses).
        #[arg(long, default_value_t = 10)]
        intents: usize,
    },
    /// Look up idempotency keys (for a support case).
    #[command(subcommand)]
    Key(KeyCommand),
}

impl Command {
    /// The database a command works on; `None` for the commands that need none.
    pub fn database_url(&self) -> Option<&str> {
        let database = match self {
            Self::Serve(args) => &args.common.database,
            Self::Worker(args) => &args.common.database,
            Self::Migrate(database) => database,
            Self::Tenant(TenantCommand::Create { database, .. }) => database,
            Self::Outbox(command) => command.database(),
            Self::Prune(args) => &args.database,
            Self::Key(KeyCommand::Show { database, .. }) => database,
            Self::Inbox(_) | Self::Demo { .. } => return None,
        };
        Some(&database.database_url)
    }
}

/// `oncely key …`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Show where a key stands: in progress, completed (with the stored answer) or tombstoned.
    Show {
        /// The key, as the client sent it (without sf-string quotes).
        key: String,
        /// The route template.
        #[arg(long, default_value = "/v1/signup")]
        route: String,
        /// The method.
        #[arg(long, default_value = "POST")]
        method: String,
        /// The tenant.
        #[arg(long, default_value = "default")]
        tenant: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
    },
}

/// `oncely outbox …`.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// List jobs, newest first.
    List {
        /// Only this kind (`email.verification`, `charge`, …).
        #[arg(long)]
        kind: Option<String>,
        /// Only this status.
        #[arg(long, value_enum)]
        status: Option<JobStatusArg>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
    },
    /// List dead jobs with their reasons (`list --status dead`).
    Dead {
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
    },
    /// Show a job (by operation key) and every attempt.
    Show {
        /// The job's operation key.
        key: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
    },
    /// Re-drive a dead job: due now, fresh attempts, the same delivery key.
    Retry {
        /// The job's operation key.
        key: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
    },
}

impl OutboxCommand {
    /// Where the jobs are.
    pub fn database(&self) -> &DatabaseArgs {
        match self {
            Self::List { database, .. }
            | Self::Dead { database, .. }
            | Self::Show { database, .. }
            | Self::Retry { database, .. } => database,
        }
    }
}

/// A job status on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JobStatusArg {
    /// Waiting or running.
    Pending,
    /// Done.
    Sent,
    /// Given up or skipped, with a reason.
    Dead,
}

/// `oncely tenant …`.
#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its API key (once: only its hash is stored).
    Create {
        /// The tenant's id: 1-128 characters of A-Z a-z 0-9 - _ . : (not `default`).
        name: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
    },
}

/// Where the data lives. Prints its URL without the password.
#[derive(Clone, Args)]
pub struct DatabaseArgs {
    /// `postgres://…` or `sqlite://…`.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://oncely.db",
        hide_env_values = true
    )]
    pub database_url: String,
}

impl std::fmt::Debug for DatabaseArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseArgs")
            .field("database_url", &crate::backend::redact(&self.database_url))
            .finish()
    }
}

/// Settings shared by `serve` and `worker`. Its `Debug` shows no secret.
#[derive(Clone, Args)]
pub struct CommonArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,

    /// Most PostgreSQL connections this process opens. Keep the sum over all `serve` and `worker`
    /// processes under the server's `max_connections` (100 by default).
    #[arg(long, env = "ONCELY_DATABASE_POOL", default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub database_pool: u32,

    /// `development` (generated secret, dev inbox) or `production` (everything explicit).
    #[arg(
        long = "env",
        env = "ONCELY_ENV",
        value_enum,
        default_value = "development"
    )]
    pub environment: Environment,

    /// Server secret (fingerprints, keyed hashes, tokens); at least 32 characters. Generated per
    /// data directory in development; required in production.
    #[arg(long, env = "ONCELY_SECRET", hide_env_values = true)]
    pub secret: Option<SecretString>,

    /// The server secret before a rotation, kept for a grace period (at least the key
    /// retention and the longest link lifetime, 7 days): retries of requests stored under it
    /// still replay, and links and emails it derived still work. New work uses ONCELY_SECRET.
    #[arg(long, env = "ONCELY_SECRET_PREVIOUS", hide_env_values = true)]
    pub secret_previous: Option<SecretString>,

    /// Base of links in emails: `http(s)://host[:port][/path]`, no query or fragment. Default
    /// `http://<bind>` in development; required in production.
    #[arg(long, env = "ONCELY_PUBLIC_URL", hide_env_values = true)]
    pub public_url: Option<String>,

    /// `dev` (the built-in inbox), `smtp://host:port` (`smtps://` for TLS), or
    /// `http(s)://host/emails` (Resend-compatible). Default `dev` in development; required in
    /// production. May hold SMTP credentials (`smtps://user:password@host`): never printed.
    #[arg(long, env = "ONCELY_MAILER", hide_env_values = true)]
    pub mailer: Option<String>,

    /// The SMTP password, kept out of `ONCELY_MAILER` (which then names the user:
    /// `smtps://user@host:465`).
    #[arg(long, env = "ONCELY_SMTP_PASSWORD", hide_env_values = true)]
    pub smtp_password: Option<SecretString>,

    /// Bearer token for an HTTP mailer.
    #[arg(long, env = "ONCELY_MAILER_API_KEY", hide_env_values = true)]
    pub mailer_api_key: Option<SecretString>,

    /// Sender address of every email.
    #[arg(long, env = "ONCELY_MAIL_FROM", default_value = "oncely@localhost")]
    pub mail_from: String,

    /// How long a claimed key or outbox job is held before another process may take it over.
    #[arg(long, env = "ONCELY_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,

    /// First delay before an email is retried (doubling, with jitter, up to 10 minutes).
    #[arg(long, env = "ONCELY_RETRY_BASE", default_value = "2s", value_parser = parse_duration)]
    pub retry_base: Duration,

    /// Workers only poll for jobs (for PostgreSQL behind a transaction-mode pooler, where
    /// LISTEN does not work).
    #[arg(long, env = "ONCELY_POLL_ONLY")]
    pub poll_only: bool,
}

impl std::fmt::Debug for CommonArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommonArgs")
            .field("database", &self.database)
            .field("database_pool", &self.database_pool)
            .field("environment", &self.environment)
            .field("secret", &self.secret)
            .field("secret_previous", &self.secret_previous)
            .field("public_url", &self.public_url)
            .field(
                "mailer",
                &self.mailer.as_deref().map(crate::backend::redact),
            )
            .field("mailer_api_key", &self.mailer_api_key)
            .field("smtp_password", &self.smtp_password)
            .field("mail_from", &self.mail_from)
            .field("lease", &self.lease)
            .field("retry_base", &self.retry_base)
            .field("poll_only", &self.poll_only)
            .finish()
    }
}

/// Settings of `oncely serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,

    /// Listen address.
    #[arg(long, env = "ONCELY_BIND", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,

    /// Bearer token that `GET /metrics` requires. Without one, `/metrics` is open in
    /// development and answers 404 in production: its counters (emails sent or skipped) must
    /// not tell an outsider which addresses have accounts.
    #[arg(long, env = "ONCELY_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<SecretString>,

    /// How long idempotent results are replayed (`24h`, `90m`, …).
    #[arg(long, env = "ONCELY_KEY_RETENTION", default_value = "24h", value_parser = parse_duration)]
    pub key_retention: Duration,

    /// Outbox workers inside this process (0: API only).
    #[arg(long, env = "ONCELY_WORKERS", default_value_t = 1)]
    pub workers: usize,

    /// Emails per window to one address requested by one client (counted whether or not the
    /// address has an account); more are not sent, and the answer does not change. Per client,
    /// so that one client cannot use up the owner's own emails.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_ADDRESS", default_value_t = 5)]
    pub mail_cap_per_address: u32,

    /// Emails per window to one address from all clients together: the ceiling that protects a
    /// mailbox from many clients at once. Default: 4 × ONCELY_MAIL_CAP_PER_ADDRESS.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_ADDRESS_TOTAL")]
    pub mail_cap_per_address_total: Option<u32>,

    /// Emails per window requested by one client address.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_CLIENT", default_value_t = 30)]
    pub mail_cap_per_client: u32,

    /// Proxies (comma-separated CIDRs or addresses) whose `X-Forwarded-For` / `Forwarded`
    /// name the client for the per-client cap. Default: none (the headers are ignored and the
    /// connection's peer is the client).
    #[arg(
        long,
        env = "ONCELY_TRUSTED_PROXIES",
        value_delimiter = ',',
        value_parser = crate::client_addr::parse_trusted_proxy
    )]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub retention: RetentionArgs,

    /// How often `serve` prunes expired rows (see `oncely prune`).
    #[arg(long, env = "ONCELY_PRUNE_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub prune_interval: Duration,
}

/// How long rows are kept (used by `serve`'s pruner and by `oncely prune`).
#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// The window of both email caps (their counters are kept two windows).
    #[arg(long, env = "ONCELY_MAIL_CAP_WINDOW", default_value = "1h", value_parser = parse_duration)]
    pub mail_cap_window: Duration,

    /// How long sent and dead outbox jobs (and their attempts) are kept after they finished.
    #[arg(long, env = "ONCELY_OUTBOX_RETENTION", default_value = "7d", value_parser = parse_duration)]
    pub outbox_retention: Duration,
}

impl RetentionArgs {
    /// As the pruner takes it.
    pub fn retention(&self) -> crate::prune::Retention {
        crate::prune::Retention {
            outbox: self.outbox_retention,
            tokens: Duration::from_secs(7 * 24 * 3600),
            cap_window: self.mail_cap_window,
        }
    }
}

/// Settings of `oncely prune`.
#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub retention: RetentionArgs,
}

/// Settings of `oncely worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,

    /// Concurrent workers in this process.
    #[arg(long, env = "ONCELY_WORKERS", default_value_t = 1)]
    pub workers: usize,

    /// Run only these job kinds (comma-separated); default: all.
    #[arg(long, env = "ONCELY_WORKER_KINDS", value_delimiter = ',')]
    pub kinds: Vec<String>,
}

/// Settings of `oncely inbox`.
#[derive(Debug, Clone, Args)]
pub struct InboxArgs {
    /// SMTP listen address.
    #[arg(long, default_value = "127.0.0.1:2525")]
    pub smtp: SocketAddr,
    /// HTTP listen address (`POST /emails`, `GET /messages`, `GET /stats`, `PUT /faults`).
    #[arg(long, default_value = "127.0.0.1:8025")]
    pub http: SocketAddr,
    /// Behave like a real provider: a repeat of an idempotency key within 24 h is acknowledged
    /// but not delivered again.
    #[arg(long)]
    pub provider_mode: bool,
}

/// The deployment environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Environment {
    /// A developer's machine.
    Development,
    /// Real traffic: no generated secrets, no dev pages.
    Production,
}

/// The shortest `ONCELY_SECRET` accepted.
pub const MIN_SECRET_CHARS: usize = 32;

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 15m, 24h)"))?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

impl ServeArgs {
    /// Checks settings that depend on each other.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.common.lease >= self.key_retention {
            bail!(
                "ONCELY_LEASE ({:?}) must be shorter than ONCELY_KEY_RETENTION ({:?})",
                self.common.lease,
                self.key_retention
            );
        }
        if self.trusted_proxies.iter().any(|net| net.prefix_len() == 0) {
            tracing::warn!(
                "ONCELY_TRUSTED_PROXIES trusts every address (a /0): any client can name itself in X-Forwarded-For and escape the per-client email cap; list only your proxies"
            );
        }
        Ok(())
    }
}

/// Where email goes. Its `Debug` shows no password.
#[derive(Clone, PartialEq, Eq)]
pub enum MailerChoice {
    /// The built-in inbox of this process (development).
    Dev,
    /// `smtp://`, `smtps://`, `http://` or `https://` (with `ONCELY_SMTP_PASSWORD` filled in).
    Url(String),
}

impl std::fmt::Debug for MailerChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dev => f.write_str("Dev"),
            Self::Url(url) => f
                .debug_tuple("Url")
                .field(&crate::backend::redact(url))
                .finish(),
        }
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for URL userinfo).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `smtps://user@host` and a password: `smtps://user:password@host` (password encoded).
fn with_smtp_password(url: &str, password: &str) -> anyhow::Result<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("ONCELY_SMTP_PASSWORD needs an smtp:// or smtps:// ONCELY_MAILER");
    };
    if scheme != "smtp" && scheme != "smtps" {
        bail!(
            "ONCELY_SMTP_PASSWORD is for smtp:// and smtps:// mailers (an HTTP mailer takes ONCELY_MAILER_API_KEY)"
        );
    }
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        bail!("ONCELY_SMTP_PASSWORD needs the user in ONCELY_MAILER ({scheme}://user@host:port)");
    };
    let user = &rest[..at];
    if user.contains(':') {
        bail!(
            "ONCELY_MAILER already has a password; set it there or in ONCELY_SMTP_PASSWORD, not both"
        );
    }
    Ok(format!(
        "{scheme}://{user}:{}{}",
        percent_encode(password),
        &rest[at..]
    ))
}

impl CommonArgs {
    /// The server secret: given, or (development only) read from or generated into the data
    /// directory, so that it survives restarts.
    /// With `ONCELY_SECRET_PREVIOUS`, the previous secret verifies what it made (see
    /// [`ServerSecret::with_previous`]).
    pub fn server_secret(&self) -> anyhow::Result<ServerSecret> {
        let current = self.current_secret()?;
        let Some(previous) = &self.secret_previous else {
            return Ok(current);
        };
        let previous = previous.expose_secret();
        if previous.len() < MIN_SECRET_CHARS {
            bail!("ONCELY_SECRET_PREVIOUS must be at least {MIN_SECRET_CHARS} characters");
        }
        if self.secret.as_ref().map(ExposeSecret::expose_secret) == Some(previous) {
            bail!(
                "ONCELY_SECRET_PREVIOUS is the same as ONCELY_SECRET; set it to the secret before the rotation"
            );
        }
        Ok(current.with_previous(vec![ServerSecret::new(previous.as_bytes().to_vec())?]))
    }

    fn current_secret(&self) -> anyhow::Result<ServerSecret> {
        if let Some(secret) = &self.secret {
            let secret = secret.expose_secret();
            if secret.len() < MIN_SECRET_CHARS {
                bail!("ONCELY_SECRET must be at least {MIN_SECRET_CHARS} characters");
            }
            return Ok(ServerSecret::new(secret.as_bytes().to_vec())?);
        }
        if self.environment == Environment::Production {
            bail!(
                "ONCELY_SECRET is required in production (at least {MIN_SECRET_CHARS} random characters)"
            );
        }
        let path = data_dir(&self.database.database_url).join(".oncely-secret");
        Ok(ServerSecret::new(dev_secret(&path)?)?)
    }

    /// The mailer to use; an invalid or (in production) missing one is a start-up error.
    pub fn mailer_choice(&self) -> anyhow::Result<MailerChoice> {
        let production = self.environment == Environment::Production;
        match self.mailer.as_deref() {
            None if production => {
                bail!(
                    "ONCELY_MAILER is required in production (smtp://…, smtps://… or https://…/emails)"
                )
            }
            Some("dev") if production => bail!("ONCELY_MAILER=dev is for development only"),
            None | Some("dev") => Ok(MailerChoice::Dev),
            Some(url)
                if ["smtp://", "smtps://", "http://", "https://"]
                    .iter()
                    .any(|s| url.starts_with(s)) =>
            {
                match &self.smtp_password {
                    Some(password) => Ok(MailerChoice::Url(with_smtp_password(
                        url,
                        password.expose_secret(),
                    )?)),
                    None => Ok(MailerChoice::Url(url.to_owned())),
                }
            }
            Some(other) => bail!(
                "ONCELY_MAILER must be dev, smtp://host:port, smtps://host:port or http(s)://host/emails (got {:?})",
                other.split("://").next().unwrap_or(other)
            ),
        }
    }

    /// The base of links, without a trailing slash. Required in production; `http(s)` with a
    /// host and no query or fragment.
    pub fn public_url(&self, bind: Option<SocketAddr>) -> anyhow::Result<String> {
        let url = match (&self.public_url, bind) {
            (Some(url), _) => url.clone(),
            (None, _) if self.environment == Environment::Production => bail!(
                "ONCELY_PUBLIC_URL is required in production (the base of links in emails, e.g. https://accounts.example.com)"
            ),
            // A wildcard bind is no address to click: development links go to loopback.
            (None, Some(bind)) if bind.ip().is_unspecified() => {
                format!("http://127.0.0.1:{}", bind.port())
            }
            (None, Some(bind)) => format!("http://{bind}"),
            (None, None) => "http://127.0.0.1:8080".to_owned(),
        };
        let parsed = url::Url::parse(&url).map_err(|e| {
            anyhow::anyhow!(
                "ONCELY_PUBLIC_URL {url:?} is not a URL ({e}); e.g. https://accounts.example.com"
            )
        })?;
        if !matches!(parsed.scheme(), "http" | "https") || !parsed.has_host() {
            bail!("ONCELY_PUBLIC_URL {url:?} must be an http:// or https:// URL with a host");
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            bail!(
                "ONCELY_PUBLIC_URL {url:?} must not have a query or a fragment (links append their own)"
            );
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            bail!("ONCELY_PUBLIC_URL must not hold credentials");
        }
        let unspecified = match parsed.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_unspecified(),
            Some(url::Host::Ipv6(ip)) => {
                ip.is_unspecified() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified())
            }
            _ => false,
        };
        if unspecified {
            bail!(
                "ONCELY_PUBLIC_URL {url:?} names no host anyone can reach (0.0.0.0 / [::] is a bind address); give the address users open, e.g. https://accounts.example.com"
            );
        }
        if self.environment == Environment::Production && parsed.scheme() == "http" {
            tracing::warn!(
                "ONCELY_PUBLIC_URL is plain http: links carry one-time tokens; use https in production"
            );
        }
        Ok(url.trim_end_matches('/').to_owned())
    }
}

/// Where development state (the generated secret) lives: beside the SQLite file, else here.
pub fn data_dir(database_url: &str) -> PathBuf {
    database_url
        .strip_prefix("sqlite://")
        .or_else(|| database_url.strip_prefix("sqlite:"))
        .map(|path| path.split('?').next().unwrap_or(path))
        .and_then(|path| Path::new(path).parent().map(Path::to_path_buf))
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."))
}

fn dev_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        let existing = existing.trim();
        if existing.len() >= MIN_SECRET_CHARS {
            return Ok(existing.as_bytes().to_vec());
        }
    }
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let secret = hex::encode(bytes);
    write_private(path, &secret)
        .with_context(|| format!("writing the development secret to {}", path.display()))?;
    Ok(secret.into_bytes())
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(contents.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> ServeArgs {
        let mut argv = vec!["oncely", "serve"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Serve(args) => args,
            _ => unreachable!(),
        }
    }

    /// Regression (chaos run): five processes with 32 connections each exceeded PostgreSQL's
    /// default 100 connections; the pool is now bounded and configurable.
    #[test]
    fn the_database_pool_defaults_to_16_and_is_bounded() {
        assert_eq!(serve(&[]).common.database_pool, 16);
        assert_eq!(serve(&["--database-pool", "8"]).common.database_pool, 8);
        for bad in ["0", "1", "1001", "many"] {
            assert!(
                Cli::try_parse_from(["oncely", "serve", "--database-pool", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn no_secret_of_the_command_line_prints() {
        let cli = Cli::try_parse_from([
            "oncely",
            "serve",
            "--database-url",
            "postgres://app:db-password-1@db:5432/oncely",
            "--secret",
            "server-secret-server-secret-server-secret",
            "--mailer",
            "https://api.example.com/emails",
            "--mailer-api-key",
            "mailer-api-key-1",
        ])
        .unwrap();
        let printed = format!("{cli:?} {cli:#?}");
        for secret in [
            "db-password-1",
            "server-secret-server-secret-server-secret",
            "mailer-api-key-1",
        ] {
            assert!(!printed.contains(secret), "{secret} printed: {printed}");
        }
        assert!(
            printed.contains("postgres://app:***@db:5432/oncely") || printed.contains("db:5432"),
            "{printed}"
        );
    }

    #[test]
    fn trusted_proxies_are_cidrs_and_a_bad_one_is_a_clear_startup_error() {
        assert!(serve(&[]).trusted_proxies.is_empty());
        let args = serve(&["--trusted-proxies", "10.0.0.0/8, 127.0.0.1"]);
        assert_eq!(args.trusted_proxies.len(), 2);
        let error = Cli::try_parse_from(["oncely", "serve", "--trusted-proxies", "10.0.0.0/33"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("\"10.0.0.0/33\" is not a CIDR"), "{error}");
    }

    /// Regression: `ONCELY_MAILER=smtps://user:password@…` printed in `Debug`.
    #[test]
    fn the_mailer_password_never_prints() {
        let args = serve(&[
            "--mailer",
            "smtps://mailer-user:smtp-password-1@smtp.example.com:465",
            "--smtp-password",
            "smtp-password-2",
        ]);
        let printed = format!("{args:?} {args:#?} {:?}", args.common);
        for secret in ["smtp-password-1", "smtp-password-2"] {
            assert!(!printed.contains(secret), "{secret} printed: {printed}");
        }
        assert!(
            printed.contains("smtps://mailer-user:***@smtp.example.com:465"),
            "{printed}"
        );
        let choice = serve(&[
            "--mailer",
            "smtps://mailer-user@smtp.example.com:465",
            "--smtp-password",
            "smtp-password-3",
        ])
        .common
        .mailer_choice()
        .unwrap();
        assert!(!format!("{choice:?}").contains("smtp-password-3"));
    }

    #[test]
    fn the_smtp_password_fills_in_the_mailer_url_encoded() {
        let choice = |mailer: &str| {
            serve(&["--mailer", mailer, "--smtp-password", "p@ss:w/rd %"])
                .common
                .mailer_choice()
        };
        assert_eq!(
            choice("smtps://mailer-user@smtp.example.com:465").unwrap(),
            MailerChoice::Url(
                "smtps://mailer-user:p%40ss%3Aw%2Frd%20%25@smtp.example.com:465".into()
            )
        );
        assert_eq!(
            choice("smtp://u@127.0.0.1:2525?tls=required").unwrap(),
            MailerChoice::Url("smtp://u:p%40ss%3Aw%2Frd%20%25@127.0.0.1:2525?tls=required".into())
        );
        for (mailer, error) in [
            ("smtps://smtp.example.com:465", "needs the user"),
            (
                "smtps://u:other@smtp.example.com:465",
                "already has a password",
            ),
            ("https://api.example.com/emails", "ONCELY_MAILER_API_KEY"),
        ] {
            let e = choice(mailer).unwrap_err().to_string();
            assert!(e.contains(error), "{mailer}: {e}");
            assert!(!e.contains("p@ss"), "{e}");
        }
        // Without it, the URL is used as given.
        assert_eq!(
            serve(&["--mailer", "smtps://u:given@h:465"])
                .common
                .mailer_choice()
                .unwrap(),
            MailerChoice::Url("smtps://u:given@h:465".into())
        );
    }

    /// Regression: production started without `ONCELY_PUBLIC_URL` and linked to
    /// `http://0.0.0.0:8080`.
    #[test]
    fn production_needs_a_public_url_and_development_has_a_default() {
        let bind: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let error = serve(&["--env", "production"])
            .common
            .public_url(Some(bind))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("ONCELY_PUBLIC_URL is required in production")
                && !error.contains('\n'),
            "{error}"
        );
        // Development links after a wildcard bind go to loopback (0.0.0.0 is no address to
        // open; browsers refuse it).
        assert_eq!(
            serve(&[]).common.public_url(Some(bind)).unwrap(),
            "http://127.0.0.1:8080"
        );
        let loopback: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        assert_eq!(
            serve(&[]).common.public_url(Some(loopback)).unwrap(),
            "http://127.0.0.1:9090"
        );
        assert_eq!(
            serve(&[
                "--env",
                "production",
                "--public-url",
                "https://accounts.example.com/auth/"
            ])
            .common
            .public_url(Some(bind))
            .unwrap(),
            "https://accounts.example.com/auth"
        );
    }

    #[test]
    fn a_public_url_must_be_http_without_query_or_fragment() {
        for (bad, why) in [
            ("ftp://accounts.example.com", "http:// or https://"),
            ("javascript:alert(1)", "http:// or https://"),
            ("accounts.example.com", "is not a URL"),
            (
                "https://accounts.example.com/?ref=mail",
                "query or a fragment",
            ),
            ("https://accounts.example.com/#top", "query or a fragment"),
            ("https://accounts.example.com?", "query or a fragment"),
            ("https://u:p@accounts.example.com", "credentials"),
            ("http://0.0.0.0:8080", "names no host"),
            ("http://[::]:8080/", "names no host"),
            ("http://[::ffff:0.0.0.0]/", "names no host"),
        ] {
            for env in ["development", "production"] {
                let error = serve(&["--env", env, "--public-url", bad])
                    .common
                    .public_url(None)
                    .unwrap_err()
                    .to_string();
                assert!(error.contains(why), "{bad}: {error}");
            }
        }
        assert_eq!(
            serve(&["--public-url", "http://localhost:3000"])
                .common
                .public_url(None)
                .unwrap(),
            "http://localhost:3000"
        );
    }

    #[test]
    fn production_without_a_secret_is_a_startup_error() {
        let args = serve(&["--env", "production", "--database-url", "sqlite::memory:"]);
        let error = args.common.server_secret().unwrap_err().to_string();
        assert!(
            error.contains("ONCELY_SECRET is required in production"),
            "{error}"
        );
    }

    #[test]
    fn a_short_secret_is_refused() {
        let args = serve(&["--secret", "short"]);
        assert!(
            args.common
                .server_secret()
                .unwrap_err()
                .to_string()
                .contains("at least 32")
        );
    }

    #[test]
    fn the_development_secret_is_generated_once_per_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("x.db").display());
        let args = serve(&["--database-url", &url]);
        args.common.server_secret().unwrap();
        let first = std::fs::read_to_string(dir.path().join(".oncely-secret")).unwrap();
        args.common.server_secret().unwrap();
        assert_eq!(
            first,
            std::fs::read_to_string(dir.path().join(".oncely-secret")).unwrap()
        );
        assert_eq!(first.len(), 64);
    }

    #[test]
    fn secrets_never_print() {
        let args = serve(&[
            "--secret",
            "0123456789abcdef0123456789abcdef-very-secret",
            "--secret-previous",
            "0123456789abcdef0123456789abcdef-old-secret",
        ]);
        let printed = format!("{args:?} {:?}", args.common.server_secret().unwrap());
        assert!(!printed.contains("very-secret"), "{printed}");
        assert!(!printed.contains("old-secret"), "{printed}");
    }

    #[test]
    fn a_previous_secret_joins_the_ring_and_must_differ_and_be_long() {
        let current = "0123456789abcdef0123456789abcdef-current";
        let ring = serve(&[
            "--secret",
            current,
            "--secret-previous",
            "0123456789abcdef0123456789abcdef-previous",
        ])
        .common
        .server_secret()
        .unwrap();
        assert_eq!(ring.previous().len(), 1);
        assert_eq!(
            ring.mac("x", &[]),
            ServerSecret::new(current.as_bytes().to_vec())
                .unwrap()
                .mac("x", &[]),
            "new work uses the current secret"
        );
        let same = serve(&["--secret", current, "--secret-previous", current])
            .common
            .server_secret();
        assert!(
            same.unwrap_err()
                .to_string()
                .contains("same as ONCELY_SECRET")
        );
        let short = serve(&["--secret", current, "--secret-previous", "short"])
            .common
            .server_secret();
        assert!(
            short
                .unwrap_err()
                .to_string()
                .contains("ONCELY_SECRET_PREVIOUS")
        );
    }

    #[test]
    fn durations_parse_and_lease_must_be_shorter_than_retention() {
        assert_eq!(
            serve(&["--lease", "5s"]).common.lease,
            Duration::from_secs(5)
        );
        assert!(
            serve(&["--lease", "2h", "--key-retention", "1h"])
                .validate()
                .is_err()
        );
        assert!(Cli::try_parse_from(["oncely", "serve", "--lease", "soon"]).is_err());
    }

    #[test]
    fn the_mailer_defaults_to_dev_in_development_and_is_required_in_production() {
        assert_eq!(
            serve(&[]).common.mailer_choice().unwrap(),
            MailerChoice::Dev
        );
        let production = serve(&["--env", "production"])
            .common
            .mailer_choice()
            .unwrap_err()
            .to_string();
        assert!(
            production.contains("ONCELY_MAILER is required in production"),
            "{production}"
        );
        let invalid = serve(&["--mailer", "ftp://x"])
            .common
            .mailer_choice()
            .unwrap_err()
            .to_string();
        assert!(invalid.contains("must be dev, smtp://"), "{invalid}");
        assert!(
            serve(&["--env", "production", "--mailer", "dev"])
                .common
                .mailer_choice()
                .is_err()
        );
        assert_eq!(
            serve(&["--mailer", "smtp://127.0.0.1:2525"])
                .common
                .mailer_choice()
                .unwrap(),
            MailerChoice::Url("smtp://127.0.0.1:2525".into())
        );
    }

    #[test]
    fn data_dir_follows_the_sqlite_file() {
        assert_eq!(data_dir("sqlite://oncely.db"), PathBuf::from("."));
        assert_eq!(
            data_dir("sqlite:///var/lib/oncely/o.db?mode=rwc"),
            PathBuf::from("/var/lib/oncely")
        );
        assert_eq!(data_dir("postgres://x/y"), PathBuf::from("."));
    }
}
