//! Settings: what the command line and the environment resolve to, checked once at start-up
//! — the server secret and the previous ones, the mailer, the public URL, the key policy, the
//! email caps, pruning, trusted proxies, the metrics token, the environment. `oncely serve`
//! builds the application from [`Settings`], `oncely worker` runs on [`WorkerSettings`]; tests
//! build them directly ([`Settings::new`] and its public fields). The server secret is resolved
//! by the `secret` module.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use oncely::ServerSecret;

use crate::branding::ServiceBrand;
use crate::connections::ConnectionLimits;
use crate::environment::Environment;
use crate::webhooks::WebhookSettings;
use oncely_outbox::OnUnknown;
use oncely_outbox::mail::IdempotencyHeader;
use secrecy::SecretString;

use crate::limits::login::LoginLimits;
use crate::limits::mail::MailLimits;
use crate::prune::Retention;
use crate::routes::KeyPolicy;
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
pub fn mail_limits(
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

/// A default of [`defaults`] as a duration (`"30s"`).
pub fn default_duration(value: &str) -> Duration {
    humantime::parse_duration(value).expect("the defaults parse")
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
    /// Where the database is.
    pub fn location(&self) -> crate::backend::Location {
        crate::backend::Location {
            url: self.url.clone(),
            direct_url: self.direct_url.clone(),
            pooler: self.pooler,
        }
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

/// `http://` and the address bound; a wildcard bind is no address to click: development
/// links go to loopback.
pub fn development_public_url(bind: SocketAddr) -> String {
    if bind.ip().is_unspecified() {
        format!("http://127.0.0.1:{}", bind.port())
    } else {
        format!("http://{bind}")
    }
}
