//! Flags several commands share: the database, the server secret, `--json`, the service's
//! common settings (mailer, emails, webhooks, retention), and the value parsers.

use std::time::Duration;

use clap::Args;
use clap::builder::TypedValueParser as _;
use oncely_outbox::OnUnknown;
use oncely_outbox::mail::IdempotencyHeader;
use oncely_server::backend::Pooler;
use oncely_server::environment::Environment;
use oncely_server::settings::defaults;
use secrecy::SecretString;
use time::OffsetDateTime;

/// `--on-unknown`: `resend` or `reconcile`.
pub(crate) fn on_unknown() -> impl clap::builder::TypedValueParser<Value = OnUnknown> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([OnUnknown::Resend, OnUnknown::Reconcile].map(OnUnknown::as_str))
        .map(|s: String| OnUnknown::parse(&s).expect("the parser offers only the policies' names"))
}

/// The server secret, for commands that seal or unseal webhook signing secrets: resolved as
/// `serve` resolves it (development without `ONCELY_SECRET`: the database's stored secret;
/// production: `ONCELY_SECRET`, required). Its `Debug` shows no secret.
#[derive(Clone, Args)]
pub struct SecretArgs {
    /// `development` or `production` (production: `ONCELY_SECRET` is required, webhook URLs
    /// must be https and public).
    #[arg(
        long = "env",
        env = "ONCELY_ENV",
        value_parser = environment(),
        default_value = "development"
    )]
    pub environment: Environment,
    /// The server secret (as `serve`'s).
    #[arg(long, env = "ONCELY_SECRET", hide_env_values = true)]
    pub secret: Option<SecretString>,
    /// The server secret before a rotation (as `serve`'s).
    #[arg(long, env = "ONCELY_SECRET_PREVIOUS", hide_env_values = true)]
    pub secret_previous: Option<SecretString>,
}

impl SecretArgs {
    /// The server secret, resolved as `serve` resolves it (given; in development without one,
    /// the one `backend` stores).
    pub async fn server_secret<B: oncely_server::backend::Backend>(
        &self,
        backend: &B,
        database_url: &str,
    ) -> anyhow::Result<oncely::ServerSecret> {
        oncely_server::secret::command_secret(
            backend,
            self.environment,
            (self.secret.as_ref(), self.secret_previous.as_ref()),
            database_url,
        )
        .await
    }
}

impl std::fmt::Debug for SecretArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretArgs")
            .field("environment", &self.environment)
            .field("secret", &self.secret)
            .field("secret_previous", &self.secret_previous)
            .finish()
    }
}

/// Where the data lives. Prints its URL without the password.
#[derive(Clone, Args)]
pub struct DatabaseArgs {
    /// `postgres://…` or `sqlite://…`. PostgreSQL: several hosts (`user@h1:5432,h2:5432/db`)
    /// are tried in order, and `target_session_attrs=read-write` (or `primary`) takes the one
    /// that accepts writes, as libpq does, and follows it after a failover.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = defaults::DATABASE_URL,
        hide_env_values = true
    )]
    pub database_url: String,

    /// What stands between oncely and PostgreSQL: `none`, `session` (a pooler in session mode)
    /// or `transaction` (PgBouncer's `pool_mode = transaction` and the hosted poolers like it).
    #[arg(
        long,
        env = "ONCELY_DATABASE_POOLER",
        value_parser = pooler(),
        default_value = "none"
    )]
    pub database_pooler: Pooler,

    /// A `postgres://` URL straight to the server (not through a transaction-mode pooler), for
    /// what needs one session: migrations, the workers' LISTEN, the dev inbox's lock. Behind a
    /// transaction-mode pooler without it, workers poll and migrations are refused.
    #[arg(long, env = "ONCELY_DATABASE_DIRECT_URL", hide_env_values = true)]
    pub database_direct_url: Option<String>,
}

impl DatabaseArgs {
    /// Where the database is.
    pub fn location(&self) -> oncely_server::backend::Location {
        oncely_server::backend::Location {
            url: self.database_url.clone(),
            direct_url: self.database_direct_url.clone(),
            pooler: self.database_pooler,
        }
    }
}

impl std::fmt::Debug for DatabaseArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseArgs")
            .field("location", &self.location())
            .finish()
    }
}

/// Settings shared by `serve` and `worker`. Its `Debug` shows no secret.
#[derive(Clone, Args)]
pub struct CommonArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,

    /// PostgreSQL connections of this process's one pool; a process whose workers LISTEN opens one
    /// more (the listener), and in development the `serve` that serves the dev inbox one more
    /// (its lock). Keep the sum over all `serve` and `worker` processes under the server's (or
    /// the pooler's) limit: see docs/deploying.md.
    #[arg(long, env = "ONCELY_DATABASE_POOL", default_value_t = defaults::DATABASE_POOL, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub database_pool: u32,

    /// `development` (generated secret, dev inbox) or `production` (everything explicit).
    #[arg(
        long = "env",
        env = "ONCELY_ENV",
        value_parser = environment(),
        default_value = "development"
    )]
    pub environment: Environment,

    /// Server secret (fingerprints, keyed hashes, tokens); at least 32 characters. In
    /// development, without it: generated once per database and kept in it, shared by every
    /// process of that database; required in production.
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

    /// Sender of every email whose tenant names none (`tenant set --mail-from`): an address
    /// or "Name <address>".
    #[arg(long, env = "ONCELY_MAIL_FROM", default_value = defaults::MAIL_FROM)]
    pub mail_from: String,

    /// The header that carries each email's delivery key to the provider, which deduplicates
    /// retries by it. Default per transport: `Idempotency-Key` over HTTP (Resend's API, most
    /// APIs), `Resend-Idempotency-Key` over SMTP (Resend's SMTP). Plain SMTP relays read none:
    /// there a retry after a lost answer can be a second email.
    #[arg(long, env = "ONCELY_MAILER_IDEMPOTENCY_HEADER", value_parser = parse_idempotency_header)]
    pub mailer_idempotency_header: Option<IdempotencyHeader>,

    /// How long a claimed key or outbox job is held before another process may take it over.
    #[arg(long, env = "ONCELY_LEASE", default_value = defaults::LEASE, value_parser = parse_duration)]
    pub lease: Duration,

    /// First delay before an email is retried (doubling, with jitter, up to an hour; up to 60
    /// failed attempts within a 23 h horizon; throttled attempts spend none).
    #[arg(long, env = "ONCELY_RETRY_BASE", default_value = defaults::RETRY_BASE, value_parser = parse_duration)]
    pub retry_base: Duration,

    /// How often a worker sends one probe job of an email kind it paused because the provider
    /// refused our credentials or configuration (HTTP 401/403, SMTP 530/535, the HTTP mailer's URL
    /// answering 404/405 or a redirect); the kind resumes by itself once a probe is accepted.
    #[arg(long, env = "ONCELY_PAUSE_PROBE", default_value = defaults::PAUSE_PROBE, value_parser = parse_duration)]
    pub pause_probe: Duration,

    /// What an email whose outcome is unknown (the answer to a handed-over message was lost, a
    /// worker died mid-send) leads to: `resend` sends it again under the same delivery key —
    /// one email where the provider deduplicates by that key, maybe two over a plain SMTP relay
    /// — or `reconcile` parks it until it is settled, by the delivery lookup
    /// (ONCELY_MAILER_LOOKUP) or an operator (`oncely outbox unknown`, `oncely outbox settle`),
    /// so that nothing is sent twice. Default: `reconcile` over SMTP and the dev inbox,
    /// `resend` over an HTTP API (which deduplicates by the key). Webhook deliveries always
    /// resend: their receivers deduplicate by the event's id.
    #[arg(long, env = "ONCELY_ON_UNKNOWN", value_parser = on_unknown())]
    pub on_unknown: Option<OnUnknown>,

    /// Where to ask whether the mailer's provider accepted an email, by its delivery key: a URL
    /// with `{key}` where the key goes, answering JSON with `accepted` (true or false) — the
    /// test inbox's `http://host:port/deliveries/{key}`. A parked email (see --on-unknown) is
    /// then settled automatically: sent if accepted, else sent again. The dev inbox is asked
    /// without it. May carry a credential (never printed).
    #[arg(long, env = "ONCELY_MAILER_LOOKUP", hide_env_values = true)]
    pub mailer_lookup: Option<String>,

    /// How long a parked email waits before the lookup's "not accepted" is believed and it is
    /// sent again: a message still in the provider's hands when the answer was lost (slow, not
    /// lost) may be accepted after. An "accepted" settles it at once.
    #[arg(long, env = "ONCELY_LOOKUP_GRACE", default_value = defaults::LOOKUP_GRACE, value_parser = parse_duration)]
    pub lookup_grace: Duration,

    /// Workers only poll for jobs (for PostgreSQL behind a transaction-mode pooler, where
    /// LISTEN does not work).
    #[arg(long, env = "ONCELY_POLL_ONLY", value_parser = clap::builder::BoolishValueParser::new())]
    pub poll_only: bool,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub webhooks: WebhookArgs,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub emails: EmailArgs,

    /// Connect and total timeout of one webhook delivery attempt (a timeout after the request
    /// was sent is retried with the same `webhook-id`).
    #[arg(long, env = "ONCELY_WEBHOOK_TIMEOUT", default_value = defaults::WEBHOOK_TIMEOUT, value_parser = parse_duration)]
    pub webhook_timeout: Duration,
}

/// How emails look (shared by `serve`, `worker` and `templates`).
#[derive(Debug, Clone, Default, Args)]
pub struct EmailArgs {
    /// A directory of templates that override the embedded ones:
    /// `<dir>/<tenant or _default>/<locale>/<message>.{subject,txt,html}` (docs/emails.md).
    /// Read and checked at start: a broken template stops start-up.
    #[arg(long, env = "ONCELY_TEMPLATES", value_name = "DIR", value_parser = parse_templates_dir)]
    pub templates: Option<std::path::PathBuf>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub brand: BrandArgs,
}

/// The service's branding of emails (shared by `serve`, `worker` and `templates preview`).
#[derive(Debug, Clone, Default, Args)]
pub struct BrandArgs {
    /// The product name emails show for tenants without their own (`tenant set
    /// --product-name`). Default: the public URL's host.
    #[arg(long, env = "ONCELY_PRODUCT_NAME", value_name = "NAME")]
    pub product_name: Option<String>,

    /// Where users write with questions: shown in emails and used as their Reply-To, for
    /// tenants without their own (`tenant set --support-email`).
    #[arg(long, env = "ONCELY_SUPPORT_EMAIL", value_name = "ADDRESS")]
    pub support_email: Option<String>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub senders: SenderArgs,
}

/// A templates directory as given: not empty (`ONCELY_TEMPLATES=` set to nothing).
pub(crate) fn parse_templates_dir(value: &str) -> Result<std::path::PathBuf, String> {
    match value.trim().is_empty() {
        true => Err("empty: name the templates' directory, or leave ONCELY_TEMPLATES unset for the embedded templates".into()),
        false => Ok(value.into()),
    }
}

/// Which senders the mailer may send as (shared by `serve`, `worker` and `tenant set`).
#[derive(Debug, Clone, Default, Args)]
pub struct SenderArgs {
    /// Domains a tenant's sender (`tenant set --mail-from`) may have besides
    /// ONCELY_MAIL_FROM's: those the mail provider lets this service send as (comma-separated).
    #[arg(
        long,
        env = "ONCELY_MAIL_FROM_DOMAINS",
        value_name = "DOMAINS",
        value_delimiter = ','
    )]
    pub mail_from_domains: Vec<String>,
}

/// Which webhook URLs are allowed (shared by `serve`, `worker` and `tenant webhook add`).
#[derive(Debug, Clone, Copy, Args)]
pub struct WebhookArgs {
    /// Let webhooks reach private, link-local, CGNAT and (in production) loopback addresses:
    /// for receivers on a private network. Off by default: a tenant's URL must not reach the
    /// deployment's own network (SSRF).
    #[arg(long, env = "ONCELY_WEBHOOK_ALLOW_PRIVATE", value_parser = clap::builder::BoolishValueParser::new())]
    pub webhook_allow_private: bool,
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
                &self.mailer.as_deref().map(oncely_server::backend::redact),
            )
            .field("mailer_api_key", &self.mailer_api_key)
            .field("smtp_password", &self.smtp_password)
            .field("mail_from", &self.mail_from)
            .field("mailer_idempotency_header", &self.mailer_idempotency_header)
            .field("lease", &self.lease)
            .field("retry_base", &self.retry_base)
            .field("pause_probe", &self.pause_probe)
            .field("on_unknown", &self.on_unknown)
            .field(
                "mailer_lookup",
                &self
                    .mailer_lookup
                    .as_deref()
                    .map(oncely_outbox::mail::LookedUp::shown),
            )
            .field("lookup_grace", &self.lookup_grace)
            .field("poll_only", &self.poll_only)
            .field("webhooks", &self.webhooks)
            .field("emails", &self.emails)
            .field("webhook_timeout", &self.webhook_timeout)
            .finish()
    }
}

/// How long rows are kept (used by `serve`'s pruner and by `oncely prune`).
#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// The window of both email caps (their counters are kept two windows).
    #[arg(long, env = "ONCELY_MAIL_CAP_WINDOW", default_value = defaults::MAIL_CAP_WINDOW, value_parser = parse_duration)]
    pub mail_cap_window: Duration,

    /// How long sent, dead and skipped outbox jobs (and their attempts) are kept after they
    /// finished.
    #[arg(long, env = "ONCELY_OUTBOX_RETENTION", default_value = defaults::OUTBOX_RETENTION, value_parser = parse_duration)]
    pub outbox_retention: Duration,

    /// The window of the login caps (their counters are kept two windows).
    #[arg(long, env = "ONCELY_LOGIN_CAP_WINDOW", default_value = defaults::LOGIN_CAP_WINDOW, value_parser = parse_duration)]
    pub login_cap_window: Duration,
}

impl RetentionArgs {
    /// The longest window of the email and login caps: counters are pruned after two of it.
    pub fn cap_window(&self) -> Duration {
        self.mail_cap_window.max(self.login_cap_window)
    }
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 15m, 24h)"))?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// `--since`: an RFC 3339 time, or a duration before now (`2h`).
pub(crate) fn parse_since(s: &str) -> Result<OffsetDateTime, String> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(at) = OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(at);
    }
    let ago = humantime::parse_duration(s).map_err(|_| {
        format!("{s:?} is neither an RFC 3339 time (2025-01-31T08:00:00Z) nor a duration ago (2h, 30m, 1d)")
    })?;
    // To the whole second: a dry run prints it back, and a window a fraction of a second
    // wider changes nothing.
    time::Duration::try_from(ago)
        .ok()
        .and_then(|ago| OffsetDateTime::now_utc().checked_sub(ago))
        .and_then(|at| at.replace_nanosecond(0).ok())
        .ok_or_else(|| format!("{s:?} is too long ago"))
}

/// `--env`: `development` or `production`, each with its meaning in `--help`.
pub(crate) fn environment() -> impl clap::builder::TypedValueParser<Value = Environment> {
    let values =
        Environment::ALL.map(|e| clap::builder::PossibleValue::new(e.as_str()).help(e.meaning()));
    clap::builder::PossibleValuesParser::new(values)
        .map(|name| name.parse::<Environment>().expect("a possible value"))
}

/// `--database-pooler`: `none`, `session` or `transaction`, each with its meaning in `--help`.
pub(crate) fn pooler() -> impl clap::builder::TypedValueParser<Value = Pooler> {
    let values =
        Pooler::ALL.map(|p| clap::builder::PossibleValue::new(p.as_str()).help(p.meaning()));
    clap::builder::PossibleValuesParser::new(values).map(|name| {
        Pooler::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
            .expect("a possible value")
    })
}

pub(crate) fn parse_idempotency_header(s: &str) -> Result<IdempotencyHeader, String> {
    IdempotencyHeader::new(s).map_err(|e| e.to_string())
}
