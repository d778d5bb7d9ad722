//! Settings: what the command line and the environment resolve to, checked once at start-up
//! — the server secret and the previous ones, the mailer, the public URL, the key policy, the
//! email caps, pruning, trusted proxies, the metrics token, the environment. `oncely serve`
//! hands [`Settings`] to [`crate::app::Application::build`], `oncely worker` runs on
//! [`WorkerSettings`]; tests build them directly ([`Settings::new`] and its public fields).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use clap::ValueEnum;
use oncely::ServerSecret;

use crate::branding::ServiceBrand;
use crate::connections::ConnectionLimits;
use crate::webhooks::WebhookSettings;
use oncely_outbox::OnUnknown;
use oncely_outbox::mail::IdempotencyHeader;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};

use crate::cli::{CommonArgs, ServeArgs, WorkerArgs, parse_duration};
use crate::prune::Retention;
use crate::routes::KeyPolicy;
use crate::routes::email_caps::MailLimits;
use crate::routes::login::LoginLimits;
use crate::workers::WorkerPlan;

/// The defaults of the command line (and of [`Settings::new`]).
pub mod defaults {
    /// `DATABASE_URL`.
    pub const DATABASE_URL: &str = "sqlite://oncely.db";
    /// `ONCELY_DATABASE_POOL`.
    pub const DATABASE_POOL: u32 = 16;
    /// `ONCELY_BIND`.
    pub const BIND: &str = "127.0.0.1:8080";
    /// `ONCELY_MAIL_FROM`.
    pub const MAIL_FROM: &str = "oncely@localhost";
    /// `ONCELY_LEASE`.
    pub const LEASE: &str = "30s";
    /// `ONCELY_RETRY_BASE`.
    pub const RETRY_BASE: &str = "2s";
    /// `ONCELY_PAUSE_PROBE`.
    pub const PAUSE_PROBE: &str = "30s";
    /// `ONCELY_WEBHOOK_TIMEOUT`.
    pub const WEBHOOK_TIMEOUT: &str = "10s";
    /// `ONCELY_KEY_RETENTION`.
    pub const KEY_RETENTION: &str = "24h";
    /// `ONCELY_WORKERS`.
    pub const WORKERS: usize = 1;
    /// `ONCELY_MAIL_CAP_PER_ADDRESS` in production (the total per address is 4 times it,
    /// unless given).
    pub const MAIL_CAP_PER_ADDRESS: u32 = 5;
    /// `ONCELY_MAIL_CAP_PER_ADDRESS` in development: generous, so that a developer who tries a
    /// flow again and again is not capped.
    pub const MAIL_CAP_PER_ADDRESS_DEVELOPMENT: u32 = 100;
    /// `ONCELY_MAIL_CAP_PER_CLIENT` in production.
    pub const MAIL_CAP_PER_CLIENT: u32 = 30;
    /// `ONCELY_MAIL_CAP_PER_CLIENT` in development (every request of a developer's machine
    /// comes from one client).
    pub const MAIL_CAP_PER_CLIENT_DEVELOPMENT: u32 = 1000;
    /// `ONCELY_MAIL_CAP_WINDOW`.
    pub const MAIL_CAP_WINDOW: &str = "1h";
    /// `ONCELY_LOGIN_CAP_PER_ADDRESS`.
    pub const LOGIN_CAP_PER_ADDRESS: u32 = 5;
    /// `ONCELY_LOGIN_CAP_PER_ADDRESS_TOTAL`.
    pub const LOGIN_CAP_PER_ADDRESS_TOTAL: u32 = 20;
    /// `ONCELY_LOGIN_CAP_PER_CLIENT`.
    pub const LOGIN_CAP_PER_CLIENT: u32 = 100;
    /// `ONCELY_LOGIN_CAP_WINDOW`.
    pub const LOGIN_CAP_WINDOW: &str = "15m";
    /// `ONCELY_OUTBOX_RETENTION`.
    pub const OUTBOX_RETENTION: &str = "7d";
    /// `ONCELY_PRUNE_INTERVAL`.
    pub const PRUNE_INTERVAL: &str = "10m";
    /// `ONCELY_LOOKUP_GRACE`: SMTP's longest wait for the answer to a message's data.
    pub const LOOKUP_GRACE: &str = "10m";
    /// `ONCELY_MAX_CONNECTIONS`.
    pub const MAX_CONNECTIONS: u32 = 16_384;
    /// `ONCELY_HEADER_READ_TIMEOUT`.
    pub const HEADER_READ_TIMEOUT: &str = "10s";
    /// `ONCELY_BODY_READ_TIMEOUT`.
    pub const BODY_READ_TIMEOUT: &str = "30s";
    /// `ONCELY_WRITE_TIMEOUT`.
    pub const WRITE_TIMEOUT: &str = "30s";
    /// `--replay-cache-bytes` of `oncely serve` and `oncely gateway` (8 MiB: about 5,000 small
    /// answers).
    pub const REPLAY_CACHE_BYTES: u64 = 8 * 1024 * 1024;
    /// `oncely gateway --bind`.
    pub const GATEWAY_BIND: &str = "127.0.0.1:8090";
    /// `oncely gateway --upstream-timeout`.
    pub const GATEWAY_UPSTREAM_TIMEOUT: &str = "60s";
    /// `oncely gateway --max-request-body` (1 MiB, as the layer's).
    pub const GATEWAY_MAX_REQUEST_BODY: usize = 1024 * 1024;
    /// `oncely gateway --max-stored-body` (256 KiB, as the layer's).
    pub const GATEWAY_MAX_STORED_BODY: usize = 256 * 1024;
    /// `oncely gateway --max-in-flight`.
    pub const GATEWAY_MAX_IN_FLIGHT: usize = 256;
    /// `oncely gateway --body-timeout`.
    pub const GATEWAY_BODY_TIMEOUT: &str = "30s";
    /// `oncely gateway --header-timeout`.
    pub const GATEWAY_HEADER_TIMEOUT: &str = "10s";
}

/// The email caps: the given ones (per address, per address in total, per client), and each
/// missing one at its default in `environment` — generous in development, where a developer
/// retrying a flow is the only client (the total is 4 × the per-address cap unless given).
fn mail_limits(
    environment: Environment,
    (per_address, per_address_total, per_client): (Option<u32>, Option<u32>, Option<u32>),
    window: Duration,
) -> MailLimits {
    let (address, client) = match environment {
        Environment::Development => (
            defaults::MAIL_CAP_PER_ADDRESS_DEVELOPMENT,
            defaults::MAIL_CAP_PER_CLIENT_DEVELOPMENT,
        ),
        Environment::Production => (
            defaults::MAIL_CAP_PER_ADDRESS,
            defaults::MAIL_CAP_PER_CLIENT,
        ),
    };
    let per_address = per_address.unwrap_or(address);
    MailLimits {
        per_address,
        per_address_total: per_address_total.unwrap_or_else(|| per_address.saturating_mul(4)),
        per_client: per_client.unwrap_or(client),
        window,
    }
}

fn default_duration(value: &str) -> Duration {
    parse_duration(value).expect("the defaults parse")
}

/// What `oncely serve` runs with. Its `Debug` shows no secret.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Development or production.
    pub environment: Environment,
    /// Where the data lives.
    pub database: DatabaseSettings,
    /// The listen address (port 0: any free port).
    pub bind: SocketAddr,
    /// Fingerprints, keyed hashes, tokens; with the previous secrets of a rotation.
    pub secret: ServerSecret,
    /// Development without `ONCELY_SECRET`: the secret this process generated. At start the
    /// database's development secret replaces [`Self::secret`] (the first process of the
    /// database stores its own), so that every process of the database signs alike.
    pub generated_secret: Option<SecretString>,
    /// The base of links in emails, without a trailing slash; `None`: `http://` and the address
    /// actually bound (development).
    pub public_url: Option<String>,
    /// Where email goes, and from whom.
    pub mailer: MailerSettings,
    /// How long a claimed key or outbox job is held.
    pub lease: Duration,
    /// How long idempotent results replay.
    pub key_retention: Duration,
    /// Bytes of finished keys kept in memory (0: none).
    pub replay_cache_bytes: u64,
    /// The first retry delay of an email.
    pub retry_base: Duration,
    /// How often a worker probes an email kind it paused because the provider refused our
    /// credentials.
    pub pause_probe: Duration,
    /// What an email's unknown outcome leads to: a resend, or a parked job; `None`: by the
    /// mailer's transport ([`MailerSettings::on_unknown`]).
    pub on_unknown: Option<OnUnknown>,
    /// Outbox workers in the process (0: API only).
    pub workers: usize,
    /// How often an idle worker looks for due jobs when nothing woke it (the outbox wakes its
    /// workers when a job is enqueued; polling finds scheduled retries). No flag: 1 s.
    pub poll_interval: Duration,
    /// Workers poll instead of LISTEN (PostgreSQL behind a transaction-mode pooler).
    pub poll_only: bool,
    /// Caps on emails.
    pub limits: MailLimits,
    /// Caps on failed logins.
    pub login: LoginLimits,
    /// How long sent and dead outbox jobs are kept.
    pub outbox_retention: Duration,
    /// How often `serve` prunes.
    pub prune_interval: Duration,
    /// Proxies whose forwarding headers name the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// What slow and hostile clients may hold ([`ConnectionLimits`]).
    pub connections: ConnectionLimits,
    /// The bearer token `GET /metrics` requires.
    pub metrics_token: Option<SecretString>,
    /// What webhook deliveries may reach, and their timeout.
    pub webhooks: WebhookSettings,
    /// The service's sender, product name and support address, and the senders it allows.
    pub brand: ServiceBrand,
    /// The templates' directory (`ONCELY_TEMPLATES`); `None`: the embedded ones only.
    pub templates: Option<std::path::PathBuf>,
}

impl Settings {
    /// The defaults of `oncely serve` in development, on `database_url`, with `secret`.
    pub fn new(database_url: impl Into<String>, secret: ServerSecret) -> Self {
        Self {
            environment: Environment::Development,
            database: DatabaseSettings {
                url: database_url.into(),
                pool: defaults::DATABASE_POOL,
                direct_url: None,
                pooler: crate::backend::Pooler::None,
            },
            bind: defaults::BIND
                .parse()
                .expect("the default bind address parses"),
            secret,
            generated_secret: None,
            public_url: None,
            mailer: MailerSettings {
                choice: MailerChoice::Dev,
                api_key: None,
                idempotency_header: None,
                lookup: None,
                lookup_grace: default_duration(defaults::LOOKUP_GRACE),
            },
            lease: default_duration(defaults::LEASE),
            key_retention: default_duration(defaults::KEY_RETENTION),
            replay_cache_bytes: defaults::REPLAY_CACHE_BYTES,
            retry_base: default_duration(defaults::RETRY_BASE),
            pause_probe: default_duration(defaults::PAUSE_PROBE),
            on_unknown: None,
            workers: defaults::WORKERS,
            poll_interval: oncely_outbox::WorkerConfig::default().poll_interval,
            poll_only: false,
            limits: mail_limits(
                Environment::Development,
                (None, None, None),
                default_duration(defaults::MAIL_CAP_WINDOW),
            ),
            login: LoginLimits {
                per_address: defaults::LOGIN_CAP_PER_ADDRESS,
                per_address_total: defaults::LOGIN_CAP_PER_ADDRESS_TOTAL,
                per_client: defaults::LOGIN_CAP_PER_CLIENT,
                window: default_duration(defaults::LOGIN_CAP_WINDOW),
            },
            outbox_retention: default_duration(defaults::OUTBOX_RETENTION),
            prune_interval: default_duration(defaults::PRUNE_INTERVAL),
            trusted_proxies: Vec::new(),
            connections: ConnectionLimits {
                max_connections: defaults::MAX_CONNECTIONS as usize,
                header_read_timeout: default_duration(defaults::HEADER_READ_TIMEOUT),
                body_read_timeout: default_duration(defaults::BODY_READ_TIMEOUT),
                write_timeout: default_duration(defaults::WRITE_TIMEOUT),
            },
            metrics_token: None,
            webhooks: WebhookSettings::development(),
            brand: ServiceBrand {
                from: defaults::MAIL_FROM.to_owned(),
                ..ServiceBrand::default()
            },
            templates: None,
        }
    }

    /// Resolves and checks `oncely serve`'s command line; the first setting that does not
    /// hold is the error (one line, naming its variable).
    pub fn from_args(args: ServeArgs) -> anyhow::Result<Self> {
        args.validate()?;
        let common = &args.common;
        let database = DatabaseSettings::from_args(common)?;
        let (secret, generated_secret) = common.server_secret()?;
        let mailer = MailerSettings::from_args(common)?;
        let public_url = common.public_url(Some(args.bind))?;
        Ok(Self {
            environment: common.environment,
            database,
            bind: args.bind,
            secret,
            generated_secret,
            // Only the development default depends on the port actually bound (`:0` in tests).
            public_url: common.public_url.is_some().then_some(public_url),
            mailer,
            lease: common.lease,
            key_retention: args.key_retention,
            replay_cache_bytes: args.replay_cache_bytes,
            retry_base: common.retry_base,
            pause_probe: common.pause_probe,
            on_unknown: common.on_unknown,
            workers: args.workers,
            poll_interval: oncely_outbox::WorkerConfig::default().poll_interval,
            poll_only: common.poll_only,
            limits: mail_limits(
                common.environment,
                (
                    args.mail_cap_per_address,
                    args.mail_cap_per_address_total,
                    args.mail_cap_per_client,
                ),
                args.retention.mail_cap_window,
            ),
            login: LoginLimits {
                per_address: args.login_cap_per_address,
                per_address_total: args.login_cap_per_address_total,
                per_client: args.login_cap_per_client,
                window: args.retention.login_cap_window,
            },
            outbox_retention: args.retention.outbox_retention,
            prune_interval: args.prune_interval,
            trusted_proxies: args.trusted_proxies,
            connections: ConnectionLimits {
                max_connections: args.max_connections as usize,
                header_read_timeout: args.header_read_timeout,
                body_read_timeout: args.body_read_timeout,
                write_timeout: args.write_timeout,
            },
            metrics_token: args.metrics_token,
            webhooks: common.webhook_settings(),
            brand: common.service_brand()?,
            templates: common.emails.templates.clone(),
        })
    }

    /// The idempotency settings of the `/v1` routes.
    pub fn key_policy(&self) -> KeyPolicy {
        KeyPolicy {
            lease: self.lease,
            retention: self.key_retention,
            replay_cache_bytes: self.replay_cache_bytes,
        }
    }

    /// The in-process workers: every job kind.
    pub fn worker_plan(&self) -> WorkerPlan {
        let mut plan = WorkerPlan::new(
            self.workers,
            self.lease,
            (self.retry_base, self.pause_probe),
            Vec::new(),
        );
        plan.config.poll_interval = self.poll_interval;
        plan.options.on_unknown = self.mailer.on_unknown(self.on_unknown);
        plan.options.reconcile_grace = self.mailer.lookup_grace;
        plan.webhooks = self.webhooks;
        plan
    }

    /// What the pruner keeps, and for how long.
    pub fn retention(&self) -> Retention {
        Retention::new(
            self.outbox_retention,
            self.limits.window.max(self.login.window),
        )
    }

    /// The base of links once the listener is bound at `addr`.
    pub fn public_url_at(&self, addr: SocketAddr) -> String {
        self.public_url
            .clone()
            .unwrap_or_else(|| development_public_url(addr))
    }
}

/// What `oncely worker` runs with. Its `Debug` shows no secret.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Where the jobs are.
    pub database: DatabaseSettings,
    /// Derives the links' tokens (with the previous secrets of a rotation).
    pub secret: ServerSecret,
    /// As [`Settings::generated_secret`].
    pub generated_secret: Option<SecretString>,
    /// Development or production.
    pub environment: Environment,
    /// The base of links in emails.
    pub public_url: String,
    /// Where email goes (never the dev inbox: it lives inside `oncely serve`).
    pub mailer: MailerSettings,
    /// How many workers, for which kinds, with which lease and retries.
    pub plan: WorkerPlan,
    /// Poll instead of LISTEN.
    pub poll_only: bool,
    /// As [`Settings::brand`].
    pub brand: ServiceBrand,
    /// As [`Settings::templates`].
    pub templates: Option<PathBuf>,
}

impl WorkerSettings {
    /// Resolves and checks `oncely worker`'s command line.
    pub fn from_args(args: WorkerArgs) -> anyhow::Result<Self> {
        let common = &args.common;
        let database = DatabaseSettings::from_args(common)?;
        let mailer = MailerSettings::from_args(common)?;
        if mailer.choice == MailerChoice::Dev {
            bail!(
                "ONCELY_MAILER{}: `oncely worker` would mail into an inbox of its own that nobody sees (the dev inbox is served by `oncely serve`, whose own workers send to it); set ONCELY_MAILER to a mailer (`oncely inbox`: smtp://127.0.0.1:2525), or run the workers in `oncely serve`",
                if common.mailer.is_some() {
                    "=dev"
                } else {
                    " is unset (dev)"
                }
            );
        }
        let (secret, generated_secret) = common.server_secret()?;
        let public_url = common.public_url(None)?;
        let on_unknown = mailer.on_unknown(common.on_unknown);
        Ok(Self {
            database,
            secret,
            generated_secret,
            environment: common.environment,
            public_url,
            mailer,
            brand: common.service_brand()?,
            templates: common.emails.templates.clone(),
            plan: {
                let mut plan = WorkerPlan::new(
                    args.workers,
                    common.lease,
                    (common.retry_base, common.pause_probe),
                    args.kinds,
                );
                plan.options.on_unknown = on_unknown;
                plan.options.reconcile_grace = common.lookup_grace;
                plan.webhooks = common.webhook_settings();
                plan
            },
            poll_only: common.poll_only,
        })
    }
}

/// Where the data lives. Its `Debug` shows the URL without its password.
#[derive(Clone)]
pub struct DatabaseSettings {
    /// `postgres://…` or `sqlite://…`.
    pub url: String,
    /// Most connections of the process (PostgreSQL): its pool. A process whose workers LISTEN
    /// opens one more, for the listener (see docs/deploying.md).
    pub pool: u32,
    /// `ONCELY_DATABASE_DIRECT_URL`.
    pub direct_url: Option<String>,
    /// `ONCELY_DATABASE_POOLER`.
    pub pooler: crate::backend::Pooler,
}

impl DatabaseSettings {
    /// Refuses, in production, a SQLite database that lives in the working directory or in
    /// memory (the development default among them).
    fn from_args(common: &CommonArgs) -> anyhow::Result<Self> {
        let url = &common.database.database_url;
        if common.environment == Environment::Production
            && let Some(what) = not_for_production(url)
        {
            bail!(
                "DATABASE_URL={url} is {what}: production needs postgres://… (or a SQLite file by absolute path, sqlite:///var/lib/oncely/oncely.db, on one machine)"
            );
        }
        Ok(Self {
            url: url.clone(),
            pool: common.database_pool,
            direct_url: common.database.database_direct_url.clone(),
            pooler: common.database.database_pooler,
        })
    }

    /// Where the database is.
    pub fn location(&self) -> crate::backend::Location {
        crate::backend::Location {
            url: self.url.clone(),
            direct_url: self.direct_url.clone(),
            pooler: self.pooler,
        }
    }
}

/// Why a SQLite `url` is no production database, if it is not: in memory, or relative to the
/// working directory (the development default is).
fn not_for_production(url: &str) -> Option<&'static str> {
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = path.split('?').next().unwrap_or(path);
    if path == ":memory:" || path.is_empty() || url.contains("mode=memory") {
        Some("in memory (lost at exit)")
    } else if url == defaults::DATABASE_URL {
        Some("the development default, a file in the working directory")
    } else if !Path::new(path).is_absolute() {
        Some("a file relative to the working directory")
    } else {
        None
    }
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &crate::backend::redact(&self.url))
            .field("pool", &self.pool)
            .finish()
    }
}

/// Where email goes (whom from: [`Settings::brand`]). Its `Debug` shows no credential.
#[derive(Clone)]
pub struct MailerSettings {
    /// The dev inbox or a mailer URL (with `ONCELY_SMTP_PASSWORD` filled in).
    pub choice: MailerChoice,
    /// Bearer token of an HTTP mailer.
    pub api_key: Option<SecretString>,
    /// The header that carries the delivery key (`ONCELY_MAILER_IDEMPOTENCY_HEADER`); `None`:
    /// the transport's default (HTTP `Idempotency-Key`, SMTP `Resend-Idempotency-Key`).
    pub idempotency_header: Option<IdempotencyHeader>,
    /// Where to ask whether the provider accepted a delivery key (`ONCELY_MAILER_LOOKUP`: a
    /// URL with `{key}`); the dev inbox is asked without it.
    pub lookup: Option<String>,
    /// How long a parked email waits before the lookup's "not accepted" is believed
    /// (`ONCELY_LOOKUP_GRACE`; [`oncely_outbox::KindOptions::reconcile_grace`]).
    pub lookup_grace: Duration,
}

impl std::fmt::Debug for MailerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailerSettings")
            .field("choice", &self.choice)
            .field("api_key", &self.api_key)
            .field("idempotency_header", &self.idempotency_header)
            .field(
                "lookup",
                &self
                    .lookup
                    .as_deref()
                    .map(oncely_outbox::mail::LookedUp::shown),
            )
            .field("lookup_grace", &self.lookup_grace)
            .finish()
    }
}

impl MailerSettings {
    fn from_args(common: &CommonArgs) -> anyhow::Result<Self> {
        let choice = common.mailer_choice()?;
        if let Some(template) = &common.mailer_lookup {
            // The check the mailer makes when it is built, made now: a bad value stops start-up
            // with its variable's name.
            oncely_outbox::mail::LookedUp::check(template)
                .map_err(|error| anyhow::anyhow!("ONCELY_MAILER_LOOKUP: {error}"))?;
        }
        Ok(Self {
            choice,
            api_key: common.mailer_api_key.clone(),
            idempotency_header: common.mailer_idempotency_header.clone(),
            lookup: common.mailer_lookup.clone(),
            lookup_grace: common.lookup_grace,
        })
    }

    /// What an email's unknown outcome leads to: `ONCELY_ON_UNKNOWN` if set, else by transport —
    /// `reconcile` over SMTP (no deduplication by key: a resend may be a second copy) and the
    /// dev inbox, `resend` over an HTTP API (it deduplicates by the key).
    pub fn on_unknown(&self, set: Option<OnUnknown>) -> OnUnknown {
        set.unwrap_or(match &self.choice {
            MailerChoice::Url(url) if url.starts_with("http://") || url.starts_with("https://") => {
                OnUnknown::Resend
            }
            MailerChoice::Url(_) | MailerChoice::Dev => OnUnknown::Reconcile,
        })
    }
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

/// The fewest different characters an `ONCELY_SECRET` has: 32 spaces or one repeated
/// character is a placeholder. (Not asked of `ONCELY_SECRET_PREVIOUS`: rotating away from a
/// weak secret must stay possible.)
pub const MIN_SECRET_DISTINCT_CHARS: usize = 8;

impl ServeArgs {
    /// Checks settings that depend on each other.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
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
    /// The service's branding: `ONCELY_MAIL_FROM` (a sender), `ONCELY_PRODUCT_NAME`,
    /// `ONCELY_SUPPORT_EMAIL`, `ONCELY_MAIL_FROM_DOMAINS`, each checked.
    pub fn service_brand(&self) -> anyhow::Result<ServiceBrand> {
        let emails = &self.emails.brand;
        if self.mail_from.parse::<lettre::message::Mailbox>().is_err() {
            bail!(
                "ONCELY_MAIL_FROM {:?} is not a sender: write an address or \"Name <address>\"",
                self.mail_from
            );
        }
        if let Some(name) = &emails.product_name {
            crate::branding::check_product_name(name)
                .map_err(|why| anyhow::anyhow!("ONCELY_PRODUCT_NAME: {why}"))?;
        }
        let support_email = emails
            .support_email
            .as_deref()
            .map(crate::branding::check_support_email)
            .transpose()
            .map_err(|why| anyhow::anyhow!("ONCELY_SUPPORT_EMAIL: {why}"))?;
        for domain in &emails.senders.mail_from_domains {
            let ok = !domain.trim().is_empty()
                && idna::domain_to_ascii(domain.trim()).is_ok_and(|d| d.contains('.'));
            if !ok {
                bail!(
                    "ONCELY_MAIL_FROM_DOMAINS: {domain:?} is not a domain name (e.g. mail.example.com)"
                );
            }
        }
        Ok(ServiceBrand {
            from: self.mail_from.clone(),
            product_name: emails.product_name.clone(),
            support_email,
            from_domains: emails.senders.mail_from_domains.clone(),
        })
    }

    /// What webhook deliveries may reach (`ONCELY_ENV`, `ONCELY_WEBHOOK_ALLOW_PRIVATE`) and
    /// their timeout (`ONCELY_WEBHOOK_TIMEOUT`).
    pub fn webhook_settings(&self) -> WebhookSettings {
        WebhookSettings {
            policy: self.webhooks.policy(self.environment),
            timeout: self.webhook_timeout,
        }
    }

    /// The server secret: given, or (development only) read from or generated into the data
    /// directory, so that it survives restarts ([`server_secret`]).
    pub(crate) fn server_secret(&self) -> anyhow::Result<(ServerSecret, Option<SecretString>)> {
        server_secret(
            self.environment,
            (self.secret.as_ref(), self.secret_previous.as_ref()),
            &self.database.database_url,
        )
    }

    /// The mailer to use; an invalid or (in production) missing one is a start-up error.
    pub(crate) fn mailer_choice(&self) -> anyhow::Result<MailerChoice> {
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
                let scheme = url.split("://").next().unwrap_or_default();
                let parsed = match url::Url::parse(url) {
                    Ok(parsed) => Some(parsed),
                    Err(url::ParseError::EmptyHost) => None,
                    Err(e) => bail!("ONCELY_MAILER ({scheme}://…) is not a URL: {e}"),
                };
                match parsed
                    .as_ref()
                    .map_or(Some(HostProblem::Missing), |p| host_problem(url, p))
                {
                    Some(HostProblem::Missing) => bail!(
                        "ONCELY_MAILER={scheme}://… names no host: e.g. smtps://smtp.example.com:465 or https://api.resend.com/emails"
                    ),
                    Some(HostProblem::Unspecified) => bail!(
                        "ONCELY_MAILER={scheme}://… names no host one can connect to (0.0.0.0 / [::] is a bind address): e.g. smtp://127.0.0.1:2525"
                    ),
                    None => {}
                }
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
    pub(crate) fn public_url(&self, bind: Option<SocketAddr>) -> anyhow::Result<String> {
        let url = match (&self.public_url, bind) {
            (Some(url), _) => url.clone(),
            (None, _) if self.environment == Environment::Production => bail!(
                "ONCELY_PUBLIC_URL is required in production (the base of links in emails, e.g. https://accounts.example.com)"
            ),
            (None, Some(bind)) => development_public_url(bind),
            (None, None) => "http://127.0.0.1:8080".to_owned(),
        };
        let parsed = url::Url::parse(&url).map_err(|e| {
            anyhow::anyhow!(
                "ONCELY_PUBLIC_URL {url:?} is not a URL ({e}); e.g. https://accounts.example.com"
            )
        })?;
        if !matches!(parsed.scheme(), "http" | "https")
            || host_problem(&url, &parsed) == Some(HostProblem::Missing)
        {
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
        if host_problem(&url, &parsed) == Some(HostProblem::Unspecified) {
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

/// What is wrong with the host a URL setting names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostProblem {
    /// None is written: `https://`, or `https:///emails` (what `https://$UNSET/emails` expands
    /// to, which URL parsing would read as the host `emails`).
    Missing,
    /// `0.0.0.0` or `[::]`: an address to bind, not one to connect to.
    Unspecified,
}

/// The problem with `written`'s host (`parsed` is the same URL parsed), if any.
fn host_problem(written: &str, parsed: &url::Url) -> Option<HostProblem> {
    let authority = written
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if host.is_empty() || host.starts_with(':') || !parsed.has_host() {
        return Some(HostProblem::Missing);
    }
    let unspecified = match parsed.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_unspecified(),
        Some(url::Host::Ipv6(ip)) => {
            ip.is_unspecified() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified())
        }
        _ => false,
    };
    unspecified.then_some(HostProblem::Unspecified)
}

/// `http://` and the address bound; a wildcard bind is no address to click: development
/// links go to loopback.
fn development_public_url(bind: SocketAddr) -> String {
    if bind.ip().is_unspecified() {
        format!("http://127.0.0.1:{}", bind.port())
    } else {
        format!("http://{bind}")
    }
}

/// Where development state (the generated secret) lives: beside the SQLite file, else here.
pub fn data_dir(database_url: &str) -> PathBuf {
    crate::backend::Sqlite::directory(database_url).unwrap_or_else(|| PathBuf::from("."))
}

/// A development secret for a process given none: the `.oncely-secret` an earlier release
/// generated into `data_dir`, if there is one (its database's links keep working), else 32
/// random bytes in hex. The database keeps the first one a process stored
/// ([`crate::startup::development_secret`]); nothing is written here.
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

impl crate::cli::WebhookArgs {
    /// The URL policy of webhooks in `environment`.
    pub fn policy(&self, environment: Environment) -> crate::webhooks::UrlPolicy {
        crate::webhooks::UrlPolicy {
            production: environment == Environment::Production,
            allow_private: self.webhook_allow_private,
        }
    }
}

/// The server secret: given, or (development only) read from or generated into the data
/// directory, so that it survives restarts.
/// With `ONCELY_SECRET_PREVIOUS`, the previous secret verifies what it made (see
/// [`ServerSecret::with_previous`]).
/// The second value is the generated secret, when none was given (development). Used by
/// `serve`, `worker` and the commands that seal webhook secrets.
pub(crate) fn server_secret(
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn serve(args: &[&str]) -> ServeArgs {
        let mut argv = vec!["oncely", "serve"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Serve(args) => *args,
            _ => unreachable!(),
        }
    }

    /// One source of defaults: `oncely serve` without flags resolves to [`Settings::new`].
    #[test]
    fn the_command_line_defaults_are_the_settings_defaults() {
        let secret = "0123456789abcdef0123456789abcdef-defaults";
        let resolved = Settings::from_args(serve(&[
            "--database-url",
            "sqlite://x.db",
            "--secret",
            secret,
        ]))
        .unwrap();
        let new = Settings::new("sqlite://x.db", resolved.secret.clone());
        assert_eq!(format!("{resolved:?}"), format!("{new:?}"));
    }

    /// The webhook settings reach the workers of `serve` and `worker`: the policy from
    /// `ONCELY_ENV` and `ONCELY_WEBHOOK_ALLOW_PRIVATE`, the timeout from `ONCELY_WEBHOOK_TIMEOUT`
    /// (10 s by default).
    #[test]
    fn the_webhook_settings_reach_the_worker_plans() {
        let secret = "0123456789abcdef0123456789abcdef-webhooks";
        let defaults = Settings::from_args(serve(&["--secret", secret])).unwrap();
        assert_eq!(
            defaults.worker_plan().webhooks,
            WebhookSettings::development()
        );
        assert_eq!(defaults.webhooks.timeout, Duration::from_secs(10));
        let given = Settings::from_args(serve(&[
            "--secret",
            secret,
            "--webhook-timeout",
            "300ms",
            "--webhook-allow-private",
        ]))
        .unwrap();
        let plan = given.worker_plan();
        assert_eq!(plan.webhooks.timeout, Duration::from_millis(300));
        assert!(plan.webhooks.policy.allow_private && !plan.webhooks.policy.production);
        let worker = Cli::try_parse_from([
            "oncely",
            "worker",
            "--env",
            "production",
            "--database-url",
            "postgres://db/oncely",
            "--mailer",
            "smtps://smtp.example.com:465",
            "--public-url",
            "https://app.example.com",
            "--secret",
            secret,
            "--webhook-timeout",
            "2s",
            "--kinds",
            "webhook",
        ])
        .unwrap();
        let Command::Worker(args) = worker.command else {
            unreachable!()
        };
        let settings = WorkerSettings::from_args(args).unwrap();
        assert_eq!(settings.plan.webhooks.timeout, Duration::from_secs(2));
        assert!(settings.plan.webhooks.policy.production);
        assert!(!settings.plan.webhooks.policy.allow_private);
        assert_eq!(settings.plan.kinds, ["webhook"]);
    }

    /// The login caps: their defaults, what is given, and counters kept two of the longer
    /// window (a login window longer than the email one must not be pruned early).
    #[test]
    fn the_login_caps_resolve_and_their_counters_outlive_the_longer_window() {
        let secret = "0123456789abcdef0123456789abcdef-login";
        let resolve = |args: &[&str]| {
            let mut argv = vec!["--secret", secret];
            argv.extend_from_slice(args);
            Settings::from_args(serve(&argv)).unwrap()
        };
        let defaults = resolve(&[]);
        assert_eq!(
            defaults.login,
            LoginLimits {
                per_address: 5,
                per_address_total: 20,
                per_client: 100,
                window: Duration::from_secs(15 * 60),
            }
        );
        assert_eq!(defaults.retention().cap_window, Duration::from_secs(3600));
        let given = resolve(&[
            "--login-cap-per-address",
            "2",
            "--login-cap-per-address-total",
            "9",
            "--login-cap-per-client",
            "40",
            "--login-cap-window",
            "3h",
        ]);
        assert_eq!(
            (
                given.login.per_address,
                given.login.per_address_total,
                given.login.per_client
            ),
            (2, 9, 40)
        );
        assert_eq!(given.retention().cap_window, Duration::from_secs(3 * 3600));
    }

    /// Issue 15, item 4: a developer who tried a flow six times in an hour was capped (5 per
    /// address, 30 per client, in every environment), and the dev inbox stayed empty. The
    /// defaults depend on ONCELY_ENV; what is given is kept in both.
    #[test]
    fn the_email_caps_are_generous_in_development_and_production_keeps_its_defaults() {
        let secret = "0123456789abcdef0123456789abcdef-caps";
        let caps = |args: &[&str]| {
            let mut argv = vec![
                "--secret",
                secret,
                "--public-url",
                "https://a.example",
                "--database-url",
                "postgres://db.example/oncely",
            ];
            argv.extend_from_slice(args);
            let limits = Settings::from_args(serve(&argv)).unwrap().limits;
            (
                limits.per_address,
                limits.per_address_total,
                limits.per_client,
            )
        };
        assert_eq!(caps(&["--env", "development"]), (100, 400, 1000));
        assert_eq!(
            caps(&["--env", "production", "--mailer", "smtp://m.example:25"]),
            (5, 20, 30)
        );
        for env in ["development", "production"] {
            assert_eq!(
                caps(&[
                    "--env",
                    env,
                    "--mailer",
                    "smtp://m.example:25",
                    "--mail-cap-per-address",
                    "7",
                    "--mail-cap-per-client",
                    "9"
                ]),
                (7, 28, 9),
                "{env}"
            );
            assert_eq!(
                caps(&[
                    "--env",
                    env,
                    "--mailer",
                    "smtp://m.example:25",
                    "--mail-cap-per-address-total",
                    "3"
                ])
                .1,
                3,
                "{env}"
            );
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

    /// Issue 14, item 4: the header that carries the delivery key is a mailer setting of
    /// `serve` and `worker`, checked at start.
    #[test]
    fn the_mailer_idempotency_header_is_a_checked_setting_of_serve_and_worker() {
        let secret = ["--secret", "0123456789abcdef0123456789abcdef-header"];
        let header = |args: ServeArgs| Settings::from_args(args).unwrap().mailer.idempotency_header;
        assert_eq!(header(serve(&secret)), None, "the transport's default");
        let given = [
            &secret[..],
            &["--mailer-idempotency-header", "X-Provider-Key"],
        ]
        .concat();
        assert_eq!(header(serve(&given)).unwrap().as_str(), "X-Provider-Key");
        let worker = Cli::try_parse_from([
            "oncely",
            "worker",
            "--mailer",
            "smtp://127.0.0.1:2525",
            "--mailer-idempotency-header",
            "Idempotency-Key",
            "--secret",
            secret[1],
        ])
        .unwrap();
        let Command::Worker(args) = worker.command else {
            unreachable!()
        };
        let settings = WorkerSettings::from_args(args).unwrap();
        assert_eq!(
            settings.mailer.idempotency_header.unwrap().as_str(),
            "Idempotency-Key"
        );
        for bad in ["Idempotency Key", "Message-ID", ""] {
            let error =
                Cli::try_parse_from(["oncely", "serve", "--mailer-idempotency-header", bad])
                    .unwrap_err()
                    .to_string();
            assert!(
                error.contains("invalid idempotency header name"),
                "{bad:?}: {error}"
            );
        }
    }

    #[test]
    fn the_inbox_reads_the_mailers_default_headers_unless_told_one_and_is_bounded() {
        let inbox = |args: &[&str]| {
            let argv = [&["oncely", "inbox"][..], args].concat();
            match Cli::try_parse_from(argv) {
                Ok(Cli {
                    command: Command::Inbox(args),
                }) => Ok(args.config()),
                Ok(_) => unreachable!(),
                Err(error) => Err(error.to_string()),
            }
        };
        assert_eq!(inbox(&[]).unwrap(), oncely_inbox::Config::default());
        let one = inbox(&[
            "--idempotency-header",
            "X-Key",
            "--max-messages",
            "5",
            "--max-age",
            "1h",
            "--max-bytes",
            "64MB",
        ])
        .unwrap();
        assert_eq!(
            (
                one.http_idempotency_header.as_str(),
                one.smtp_idempotency_header.as_str()
            ),
            ("X-Key", "X-Key")
        );
        assert_eq!(
            one.retention,
            oncely_inbox::Retention {
                max_messages: 5,
                max_age: Duration::from_secs(3600),
                max_bytes: 64_000_000,
            }
        );
        let bytes =
            |value: &str| inbox(&[&format!("--max-bytes={value}")]).map(|c| c.retention.max_bytes);
        assert_eq!(
            inbox(&[]).unwrap().retention.max_bytes,
            256 * 1024 * 1024,
            "the default fits a CI container"
        );
        for (value, expected) in [
            ("256MiB", 256 << 20),
            ("256 mib", 256 << 20),
            ("1GiB", 1 << 30),
            ("2GB", 2_000_000_000),
            ("1048576", 1 << 20),
            ("1048576B", 1 << 20),
            ("1500KiB", 1500 << 10),
        ] {
            assert_eq!(bytes(value), Ok(expected), "{value}");
        }
        for (bad, why) in [
            ("0", "at least 1MiB"),
            ("1000KB", "at least 1MiB"),
            ("1.5GiB", "not a size"),
            ("-1", "not a size"),
            ("64 megabytes", "not a size"),
            ("MiB", "not a size"),
            ("", "not a size"),
            ("99999999999999999999GiB", "not a size"),
            ("99999999999GiB", "too large"),
        ] {
            let error = bytes(bad).unwrap_err();
            assert!(
                error.contains(why) && error.contains("--max-bytes"),
                "{bad}: {error}"
            );
        }
        assert!(
            inbox(&["--max-messages", "0"])
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(inbox(&["--idempotency-header", "a:b"]).is_err());
        // The link scanner's origins: none unless named, compared as parsed.
        assert!(inbox(&[]).unwrap().scan_origins.is_empty());
        let named = inbox(&[
            "--scan-origin",
            "http://127.0.0.1:8080/",
            "--scan-origin",
            "HTTP://LOCALHOST:3000",
        ])
        .unwrap()
        .scan_origins;
        let shown: Vec<String> = named.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["http://127.0.0.1:8080", "http://localhost:3000"]);
        for bad in [
            "https://127.0.0.1:8080",
            "http://example.com",
            "http://127.0.0.1:8080/v1",
            "http://u@127.0.0.1:8080",
            "127.0.0.1:8080",
        ] {
            let error = inbox(&["--scan-origin", bad]).unwrap_err();
            assert!(
                error.contains("--scan-origin") && error.contains("origin"),
                "{bad}: {error}"
            );
        }
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
            // Review of issue 15: `https://$UNSET/accounts` was read as the host `accounts`.
            ("https:///accounts", "with a host"),
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

    /// Issue 15, item 1: the development secret is no longer a file per working directory
    /// (`serve` and `worker` started from two directories signed differently); the database
    /// keeps it. A file an earlier release generated is the candidate, so that its links keep
    /// working.
    #[test]
    fn a_development_secret_is_generated_and_an_earlier_releases_file_is_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("x.db").display());
        let args = serve(&["--database-url", &url]);
        let (_, first) = args.common.server_secret().unwrap();
        let (_, second) = args.common.server_secret().unwrap();
        let (first, second) = (first.unwrap(), second.unwrap());
        assert_eq!(first.expose_secret().len(), 64);
        assert_ne!(first.expose_secret(), second.expose_secret(), "random");
        assert!(
            !dir.path().join(".oncely-secret").exists(),
            "nothing written"
        );
        let earlier = "0123456789abcdef0123456789abcdef-from-a-file";
        std::fs::write(dir.path().join(".oncely-secret"), format!("{earlier}\n")).unwrap();
        let (_, adopted) = args.common.server_secret().unwrap();
        assert_eq!(adopted.unwrap().expose_secret(), earlier);
        let given = serve(&["--database-url", &url, "--secret", earlier]);
        assert!(given.common.server_secret().unwrap().1.is_none());
    }

    /// Issue 15, item 1: 32 spaces, or one character repeated, passed the length check.
    #[test]
    fn a_placeholder_secret_is_refused_naming_its_variable() {
        // Review of issue 15: `change-me-` written four times has 8 different characters.
        for placeholder in [
            " ".repeat(32),
            "x".repeat(40),
            "abcabcabc".repeat(4),
            "change-me-".repeat(4),
            "0123456789abcdef".repeat(2),
        ] {
            let error = serve(&["--secret", &placeholder])
                .common
                .server_secret()
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with("ONCELY_SECRET is a placeholder") && !error.contains('\n'),
                "{placeholder:?}: {error}"
            );
            assert!(!error.contains(&placeholder), "{error}");
        }
        // A weak previous secret is what a rotation moves away from: accepted.
        let (ring, _) = serve(&[
            "--secret",
            "0123456789abcdef0123456789abcdef-new",
            "--secret-previous",
            &"x".repeat(40),
        ])
        .common
        .server_secret()
        .unwrap();
        assert_eq!(ring.previous().len(), 1);
    }

    /// Issue 15, item 1: `ONCELY_MAILER=https://` started, and every email failed later.
    #[test]
    fn a_mailer_url_without_a_host_is_refused() {
        for bad in ["https://", "http://", "smtp://", "smtps://", "smtp://:25"] {
            let error = serve(&["--mailer", bad])
                .common
                .mailer_choice()
                .unwrap_err()
                .to_string();
            let scheme = bad.split("://").next().unwrap();
            assert!(
                error.starts_with(&format!("ONCELY_MAILER={scheme}://… names no host"))
                    || bad == "smtp://:25" && error.contains("is not a URL"),
                "{bad}: {error}"
            );
        }
        // Review of issue 15: what `https://$UNSET/emails` expands to was read as the host
        // `emails`, and an address to bind was taken for one to connect to.
        for (bad, why) in [
            ("https:///emails", "names no host:"),
            ("smtp:///", "names no host:"),
            ("smtp://[::]:25", "names no host one can connect to"),
            (
                "http://0.0.0.0:8025/emails",
                "names no host one can connect to",
            ),
        ] {
            let error = serve(&["--mailer", bad])
                .common
                .mailer_choice()
                .unwrap_err()
                .to_string();
            assert!(error.contains(why), "{bad}: {error}");
        }
        assert!(
            serve(&["--mailer", "smtps://user@smtp.example.com:465"])
                .common
                .mailer_choice()
                .is_ok()
        );
        let error = serve(&["--mailer", "smtps://user:hunter2@:465"])
            .common
            .mailer_choice()
            .unwrap_err()
            .to_string();
        assert!(!error.contains("hunter2"), "{error}");
    }

    /// Issue 15, item 1: production on the development default (a file in the working
    /// directory) started; docs/operations.md says production needs PostgreSQL.
    #[test]
    fn production_refuses_a_sqlite_file_in_the_working_directory_or_in_memory() {
        let secret = "0123456789abcdef0123456789abcdef-production";
        let production = |url: &str| {
            let worker = Cli::try_parse_from([
                "oncely",
                "worker",
                "--env",
                "production",
                "--database-url",
                url,
                "--secret",
                secret,
                "--mailer",
                "smtp://127.0.0.1:2525",
                "--public-url",
                "https://accounts.example.com",
            ])
            .unwrap();
            let Command::Worker(worker) = worker.command else {
                unreachable!()
            };
            let serve = serve(&[
                "--env",
                "production",
                "--database-url",
                url,
                "--secret",
                secret,
                "--mailer",
                "smtp://127.0.0.1:2525",
                "--public-url",
                "https://accounts.example.com",
            ]);
            let serve = Settings::from_args(serve).map(|_| ());
            let worker = WorkerSettings::from_args(worker).map(|_| ());
            assert_eq!(
                serve.as_ref().map_err(ToString::to_string),
                worker.as_ref().map_err(ToString::to_string),
                "serve and worker agree"
            );
            serve.map_err(|e| e.to_string())
        };
        for (url, why) in [
            ("sqlite://oncely.db", "the development default"),
            (
                "sqlite://data/o.db",
                "a file relative to the working directory",
            ),
            ("sqlite::memory:", "in memory"),
        ] {
            let error = production(url).unwrap_err();
            assert!(
                error.starts_with(&format!("DATABASE_URL={url} is {why}"))
                    && error.contains("postgres://"),
                "{url}: {error}"
            );
        }
        production("sqlite:///var/lib/oncely/oncely.db").unwrap();
        production("postgres://db.internal/oncely").unwrap();
        // Development keeps its default.
        Settings::from_args(serve(&["--secret", secret])).unwrap();
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
        let (ring, _) = serve(&[
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
    fn the_pause_probe_interval_reaches_every_email_kind_of_the_worker_plan() {
        let settings = Settings::from_args(serve(&["--pause-probe", "5s", "--workers", "2"]))
            .expect("valid settings");
        let plan = settings.worker_plan();
        assert_eq!(plan.options.probe_interval, Duration::from_secs(5));
        let default = Settings::from_args(serve(&[])).expect("valid settings");
        assert_eq!(
            default.worker_plan().options.probe_interval,
            Duration::from_secs(30)
        );
        assert!(Cli::try_parse_from(["oncely", "serve", "--pause-probe", "0s"]).is_err());
    }

    #[test]
    fn the_mailer_lookup_is_checked_at_start_and_named_in_its_error() {
        let lookup = |value: &str| {
            Settings::from_args(serve(&["--mailer-lookup", value]))
                .map(|s| s.mailer.lookup)
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            lookup("http://127.0.0.1:8025/deliveries/{key}").unwrap(),
            Some("http://127.0.0.1:8025/deliveries/{key}".to_owned())
        );
        for (bad, why) in [
            ("http://127.0.0.1:8025/deliveries/", "{key}"),
            ("ftp://h/{key}", "http://"),
            ("127.0.0.1:8025/{key}", "http://"),
            ("http://[bad/{key}", "invalid"),
        ] {
            let error = lookup(bad).unwrap_err();
            assert!(
                error.contains("ONCELY_MAILER_LOOKUP") && error.contains(why),
                "{bad}: {error}"
            );
        }
        assert_eq!(Settings::from_args(serve(&[])).unwrap().mailer.lookup, None);
        // A lookup URL may carry a credential: neither the settings' Debug nor an error shows it.
        let with_secret = "https://user:SuperSecret@lookup.example/d/{key}?token=QSECRET";
        let settings = Settings::from_args(serve(&["--mailer-lookup", with_secret])).unwrap();
        let shown = format!("{settings:?}");
        assert!(shown.contains("https://lookup.example"), "{shown}");
        assert!(
            !shown.contains("SuperSecret") && !shown.contains("QSECRET"),
            "{shown}"
        );
        let error = lookup("https://user:SuperSecret@lookup.example/d/?token=QSECRET").unwrap_err();
        assert!(
            !error.contains("SuperSecret") && !error.contains("QSECRET"),
            "{error}"
        );
        assert_eq!(
            Settings::from_args(serve(&["--lookup-grace", "30s"]))
                .unwrap()
                .worker_plan()
                .options
                .reconcile_grace,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn on_unknown_reaches_the_email_kinds_of_both_worker_plans_and_never_the_webhooks() {
        let settings =
            Settings::from_args(serve(&["--on-unknown", "reconcile"])).expect("valid settings");
        let plan = settings.worker_plan();
        assert_eq!(plan.options.on_unknown, OnUnknown::Reconcile);
        assert_eq!(
            crate::workers::webhook_options(plan.options).on_unknown,
            OnUnknown::Resend,
            "webhook receivers deduplicate by the event's id"
        );
        // Unset: by transport — SMTP (no deduplication by key) and the dev inbox reconcile, an
        // HTTP API (it deduplicates by the key) resends.
        let by_mailer = |mailer: &str| {
            Settings::from_args(serve(&["--mailer", mailer]))
                .expect("valid settings")
                .worker_plan()
                .options
                .on_unknown
        };
        assert_eq!(by_mailer("smtp://127.0.0.1:2525"), OnUnknown::Reconcile);
        assert_eq!(by_mailer("smtps://m.example:465"), OnUnknown::Reconcile);
        assert_eq!(by_mailer("dev"), OnUnknown::Reconcile);
        assert_eq!(by_mailer("https://api.example/emails"), OnUnknown::Resend);
        let set = Settings::from_args(serve(&[
            "--mailer",
            "smtp://127.0.0.1:2525",
            "--on-unknown",
            "resend",
        ]))
        .expect("valid settings");
        assert_eq!(set.worker_plan().options.on_unknown, OnUnknown::Resend);
        let Command::Worker(args) = Cli::try_parse_from([
            "oncely",
            "worker",
            "--database-url",
            "postgres://db/oncely",
            "--mailer",
            "smtp://127.0.0.1:2525",
            "--on-unknown",
            "reconcile",
        ])
        .expect("valid flags")
        .command
        else {
            panic!("not the worker command");
        };
        let worker = WorkerSettings::from_args(args).expect("valid settings");
        assert_eq!(worker.plan.options.on_unknown, OnUnknown::Reconcile);
        let Command::Worker(args) = Cli::try_parse_from([
            "oncely",
            "worker",
            "--database-url",
            "postgres://db/oncely",
            "--mailer",
            "https://api.example/emails",
        ])
        .expect("valid flags")
        .command
        else {
            panic!("not the worker command");
        };
        let worker = WorkerSettings::from_args(args).expect("valid settings");
        assert_eq!(worker.plan.options.on_unknown, OnUnknown::Resend);
        for bad in ["Reconcile", "skip", ""] {
            assert!(
                Cli::try_parse_from(["oncely", "serve", "--on-unknown", bad]).is_err(),
                "{bad:?}"
            );
        }
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
