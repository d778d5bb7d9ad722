//! The command line resolved: each command's arguments become the service's settings
//! ([`oncely_server::settings`]), checked once — the first setting that does not hold is the
//! error, one line naming its variable.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use http::HeaderName;

use anyhow::bail;
use oncely::ServerSecret;
use oncely_gateway::{Plan, Route, Routes, Scoping, Upstream};
use oncely_server::branding::ServiceBrand;
use oncely_server::connections::ConnectionLimits;
use oncely_server::environment::Environment;
use oncely_server::limits::login::LoginLimits;
use oncely_server::secret::server_secret;
use oncely_server::settings::{
    DatabaseSettings, MailerChoice, MailerSettings, Settings, WorkerSettings, defaults,
    development_public_url, mail_limits,
};
use oncely_server::webhooks::WebhookSettings;
use oncely_server::workers::WorkerPlan;
use secrecy::{ExposeSecret, SecretString};

use crate::args::{CommonArgs, WebhookArgs};
use crate::commands::gateway::GatewayArgs;
use crate::commands::serve::ServeArgs;
use crate::commands::worker::WorkerArgs;

impl ServeArgs {
    /// Resolves and checks `oncely serve`'s command line; the first setting that does not
    /// hold is the error (one line, naming its variable).
    pub fn settings(self) -> anyhow::Result<Settings> {
        let args = self;
        args.validate()?;
        let common = &args.common;
        let database = common.database_settings()?;
        let (secret, generated_secret) = common.server_secret()?;
        let mailer = common.mailer_settings()?;
        let public_url = common.public_url(Some(args.bind))?;
        Ok(Settings {
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

impl WorkerArgs {
    /// Resolves and checks `oncely worker`'s command line.
    pub fn settings(self) -> anyhow::Result<WorkerSettings> {
        let args = self;
        let common = &args.common;
        let database = common.database_settings()?;
        let mailer = common.mailer_settings()?;
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
        Ok(WorkerSettings {
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
            oncely_server::branding::validate_product_name(name)
                .map_err(|why| anyhow::anyhow!("ONCELY_PRODUCT_NAME: {why}"))?;
        }
        let support_email = emails
            .support_email
            .as_deref()
            .map(oncely_server::branding::parse_support_email)
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

    /// Refuses, in production, a SQLite database that lives in the working directory or in
    /// memory (the development default among them).
    fn database_settings(&self) -> anyhow::Result<DatabaseSettings> {
        let common = self;
        let url = &common.database.database_url;
        if common.environment == Environment::Production
            && let Some(what) = not_for_production(url)
        {
            bail!(
                "DATABASE_URL={url} is {what}: production needs postgres://… (or a SQLite file by absolute path, sqlite:///var/lib/oncely/oncely.db, on one machine)"
            );
        }
        Ok(DatabaseSettings {
            url: url.clone(),
            pool: common.database_pool,
            direct_url: common.database.database_direct_url.clone(),
            pooler: common.database.database_pooler,
        })
    }

    /// Where email goes, checked.
    fn mailer_settings(&self) -> anyhow::Result<MailerSettings> {
        let common = self;
        let choice = common.mailer_choice()?;
        if let Some(template) = &common.mailer_lookup {
            // The check the mailer makes when it is built, made now: a bad value stops start-up
            // with its variable's name.
            oncely_outbox::mail::LookedUp::validate(template)
                .map_err(|error| anyhow::anyhow!("ONCELY_MAILER_LOOKUP: {error}"))?;
        }
        Ok(MailerSettings {
            choice,
            api_key: common.mailer_api_key.clone(),
            idempotency_header: common.mailer_idempotency_header.clone(),
            lookup: common.mailer_lookup.clone(),
            lookup_grace: common.lookup_grace,
        })
    }
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

impl WebhookArgs {
    /// The URL policy of webhooks in `environment`.
    pub fn policy(&self, environment: Environment) -> oncely_server::webhooks::UrlPolicy {
        oncely_server::webhooks::UrlPolicy {
            production: environment == Environment::Production,
            allow_private: self.webhook_allow_private,
        }
    }
}

impl GatewayArgs {
    /// Checks the command line (reading `--routes-file`): every mistake in one line.
    pub fn plan(&self) -> anyhow::Result<Plan> {
        let args = self;
        let file = match &args.routes_file {
            Some(path) => Some((
                path.display().to_string(),
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading --routes-file {}", path.display()))?,
            )),
            None => None,
        };
        let routes = Routes::new(
            &args.routes,
            file.as_ref()
                .map(|(name, text)| (name.as_str(), text.as_str())),
        )
        .map_err(anyhow::Error::msg)?;
        if let Some(cookie) = &args.credential_cookie {
            let valid = !cookie.is_empty()
                && cookie
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
            anyhow::ensure!(valid, "--credential-cookie {cookie:?} is not a cookie name");
        }
        anyhow::ensure!(
            args.lease >= Duration::from_millis(500),
            "--lease must be at least 500ms (a live request renews it every third of it)"
        );
        anyhow::ensure!(
            args.max_stored_body > 0 && args.max_request_body > 0 && args.max_in_flight > 0,
            "--max-request-body, --max-stored-body and --max-in-flight must be above zero"
        );
        let forward = &args.forward_key_header;
        let reserved = [
            http::header::AUTHORIZATION,
            http::header::COOKIE,
            http::header::HOST,
            http::header::CONTENT_LENGTH,
            http::header::CONTENT_TYPE,
            http::header::CONNECTION,
            http::header::TRANSFER_ENCODING,
            http::header::TE,
            http::header::UPGRADE,
            HeaderName::from_static("keep-alive"),
            HeaderName::from_static("proxy-connection"),
            http::header::PROXY_AUTHORIZATION,
            HeaderName::from_static("x-forwarded-for"),
            HeaderName::from_static("x-forwarded-host"),
            HeaderName::from_static("x-forwarded-proto"),
        ];
        anyhow::ensure!(
            !reserved.contains(forward)
                && *forward != args.credential_header
                && args.tenant_header.as_ref() != Some(forward),
            "--forward-key-header {forward} would replace a header the request or the connection needs: name a header of its own (the default is idempotency-key)"
        );
        if let Some(tenant) = &args.tenant_header {
            anyhow::ensure!(
                !reserved.contains(tenant) && *tenant != args.credential_header,
                "--tenant-header {tenant} is a header clients send for another purpose: name the header your proxy sets (X-Tenant-Id)"
            );
        }
        let allow_method_override: Vec<Route> = args
            .allow_method_override
            .iter()
            .map(|spec| {
                Route::parse(spec).map_err(|e| anyhow::anyhow!("--allow-method-override: {e}"))
            })
            .collect::<anyhow::Result<_>>()?;
        if let Some(protected) = allow_method_override
            .iter()
            .find(|allowed| routes.iter().any(|route| route.same_as(allowed)))
        {
            anyhow::bail!(
                "--allow-method-override {protected} is a protected route: name the route whose requests carry the override (a form's POST), not the method it names"
            );
        }
        let upstream = Upstream::new(
            &args.upstream,
            args.upstream_timeout,
            args.forward_key_header.clone(),
            args.max_stored_body,
        )
        .map_err(anyhow::Error::msg)?;
        Ok(Plan {
            routes,
            upstream,
            scoping: Scoping {
                tenant_header: args.tenant_header.clone(),
                credential_header: args.credential_header.clone(),
                credential_cookie: args.credential_cookie.clone(),
            },
            lease: args.lease,
            retention: args.key_retention,
            replay_cache_bytes: args.replay_cache_bytes,
            max_request_body: args.max_request_body,
            max_stored_body: args.max_stored_body,
            max_in_flight: args.max_in_flight,
            body_timeout: args.body_timeout,
            allow_method_override,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use std::path::PathBuf;

    use oncely_outbox::OnUnknown;
    use oncely_server::secret::data_dir;

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

    fn worker(args: &[&str]) -> WorkerArgs {
        let mut argv = vec!["oncely", "worker"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).expect("valid flags").command {
            Command::Worker(args) => args,
            _ => unreachable!(),
        }
    }

    /// Where `oncely serve ARGS` sends email.
    fn mailer(args: &[&str]) -> anyhow::Result<MailerChoice> {
        serve(args).common.mailer_choice()
    }

    /// Why `oncely serve ARGS` has no mailer, in one line.
    fn mailer_error(args: &[&str]) -> String {
        mailer(args).unwrap_err().to_string()
    }

    /// One source of defaults: `oncely serve` without flags resolves to [`Settings::new`].
    #[test]
    fn the_command_line_defaults_are_the_settings_defaults() {
        let secret = "0123456789abcdef0123456789abcdef-defaults";
        let resolved = (serve(&["--database-url", "sqlite://x.db", "--secret", secret]))
            .settings()
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
        let defaults = (serve(&["--secret", secret])).settings().unwrap();
        assert_eq!(
            defaults.worker_plan().webhooks,
            WebhookSettings::development()
        );
        assert_eq!(defaults.webhooks.timeout, Duration::from_secs(10));
        let given = (serve(&[
            "--secret",
            secret,
            "--webhook-timeout",
            "300ms",
            "--webhook-allow-private",
        ]))
        .settings()
        .unwrap();
        let plan = given.worker_plan();
        assert_eq!(plan.webhooks.timeout, Duration::from_millis(300));
        assert!(plan.webhooks.policy.allow_private && !plan.webhooks.policy.production);
        let args = worker(&[
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
        ]);
        let settings = args.settings().unwrap();
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
            (serve(&argv)).settings().unwrap()
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
            let limits = (serve(&argv)).settings().unwrap().limits;
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
            let set = |flags: &[&str]| {
                caps(&[&["--env", env, "--mailer", "smtp://m.example:25"], flags].concat())
            };
            assert_eq!(
                set(&["--mail-cap-per-address", "7", "--mail-cap-per-client", "9"]),
                (7, 28, 9),
                "{env}"
            );
            assert_eq!(set(&["--mail-cap-per-address-total", "3"]).1, 3, "{env}");
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
        let header = |args: ServeArgs| args.settings().unwrap().mailer.idempotency_header;
        assert_eq!(header(serve(&secret)), None, "the transport's default");
        let given = [
            &secret[..],
            &["--mailer-idempotency-header", "X-Provider-Key"],
        ]
        .concat();
        assert_eq!(header(serve(&given)).unwrap().as_str(), "X-Provider-Key");
        let args = worker(&[
            "--mailer",
            "smtp://127.0.0.1:2525",
            "--mailer-idempotency-header",
            "Idempotency-Key",
            "--secret",
            secret[1],
        ]);
        let settings = args.settings().unwrap();
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
        let choice = mailer(&[
            "--mailer",
            "smtps://mailer-user@smtp.example.com:465",
            "--smtp-password",
            "smtp-password-3",
        ])
        .unwrap();
        assert!(!format!("{choice:?}").contains("smtp-password-3"));
    }

    #[test]
    fn the_smtp_password_fills_in_the_mailer_url_encoded() {
        let choice = |url: &str| mailer(&["--mailer", url, "--smtp-password", "p@ss:w/rd %"]);
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
            mailer(&["--mailer", "smtps://u:given@h:465"]).unwrap(),
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
            let error = mailer_error(&["--mailer", bad]);
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
            let error = mailer_error(&["--mailer", bad]);
            assert!(error.contains(why), "{bad}: {error}");
        }
        assert!(mailer(&["--mailer", "smtps://user@smtp.example.com:465"]).is_ok());
        let error = mailer_error(&["--mailer", "smtps://user:hunter2@:465"]);
        assert!(!error.contains("hunter2"), "{error}");
    }

    /// Issue 15, item 1: production on the development default (a file in the working
    /// directory) started; docs/operations.md says production needs PostgreSQL.
    #[test]
    fn production_refuses_a_sqlite_file_in_the_working_directory_or_in_memory() {
        let secret = "0123456789abcdef0123456789abcdef-production";
        let production = |url: &str| {
            let args = [
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
            ];
            let (serve, worker) = (serve(&args), worker(&args));
            let serve = serve.settings().map(|_| ());
            let worker = worker.settings().map(|_| ());
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
        (serve(&["--secret", secret])).settings().unwrap();
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
        let settings = (serve(&["--pause-probe", "5s", "--workers", "2"]))
            .settings()
            .expect("valid settings");
        let plan = settings.worker_plan();
        assert_eq!(plan.options.probe_interval, Duration::from_secs(5));
        let default = (serve(&[])).settings().expect("valid settings");
        assert_eq!(
            default.worker_plan().options.probe_interval,
            Duration::from_secs(30)
        );
        assert!(Cli::try_parse_from(["oncely", "serve", "--pause-probe", "0s"]).is_err());
    }

    #[test]
    fn the_mailer_lookup_is_checked_at_start_and_named_in_its_error() {
        let lookup = |value: &str| {
            (serve(&["--mailer-lookup", value]))
                .settings()
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
        assert_eq!((serve(&[])).settings().unwrap().mailer.lookup, None);
        // A lookup URL may carry a credential: neither the settings' Debug nor an error shows it.
        let with_secret = "https://user:SuperSecret@lookup.example/d/{key}?token=QSECRET";
        let settings = (serve(&["--mailer-lookup", with_secret]))
            .settings()
            .unwrap();
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
            (serve(&["--lookup-grace", "30s"]))
                .settings()
                .unwrap()
                .worker_plan()
                .options
                .reconcile_grace,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn on_unknown_reaches_the_email_kinds_of_both_worker_plans_and_never_the_webhooks() {
        let settings = (serve(&["--on-unknown", "reconcile"]))
            .settings()
            .expect("valid settings");
        let plan = settings.worker_plan();
        assert_eq!(plan.options.on_unknown, OnUnknown::Reconcile);
        assert_eq!(
            oncely_server::workers::webhook_options(plan.options).on_unknown,
            OnUnknown::Resend,
            "webhook receivers deduplicate by the event's id"
        );
        // Unset: by transport — SMTP (no deduplication by key) and the dev inbox reconcile, an
        // HTTP API (it deduplicates by the key) resends.
        let by_mailer = |mailer: &str| {
            (serve(&["--mailer", mailer]))
                .settings()
                .expect("valid settings")
                .worker_plan()
                .options
                .on_unknown
        };
        assert_eq!(by_mailer("smtp://127.0.0.1:2525"), OnUnknown::Reconcile);
        assert_eq!(by_mailer("smtps://m.example:465"), OnUnknown::Reconcile);
        assert_eq!(by_mailer("dev"), OnUnknown::Reconcile);
        assert_eq!(by_mailer("https://api.example/emails"), OnUnknown::Resend);
        let set = (serve(&[
            "--mailer",
            "smtp://127.0.0.1:2525",
            "--on-unknown",
            "resend",
        ]))
        .settings()
        .expect("valid settings");
        assert_eq!(set.worker_plan().options.on_unknown, OnUnknown::Resend);
        let args = worker(&[
            "--database-url",
            "postgres://db/oncely",
            "--mailer",
            "smtp://127.0.0.1:2525",
            "--on-unknown",
            "reconcile",
        ]);
        let settings = args.settings().expect("valid settings");
        assert_eq!(settings.plan.options.on_unknown, OnUnknown::Reconcile);
        let args = worker(&[
            "--database-url",
            "postgres://db/oncely",
            "--mailer",
            "https://api.example/emails",
        ]);
        let settings = args.settings().expect("valid settings");
        assert_eq!(settings.plan.options.on_unknown, OnUnknown::Resend);
        for bad in ["Reconcile", "skip", ""] {
            assert!(
                Cli::try_parse_from(["oncely", "serve", "--on-unknown", bad]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_mailer_defaults_to_dev_in_development_and_is_required_in_production() {
        assert_eq!(mailer(&[]).unwrap(), MailerChoice::Dev);
        let production = mailer_error(&["--env", "production"]);
        assert!(
            production.contains("ONCELY_MAILER is required in production"),
            "{production}"
        );
        let invalid = mailer_error(&["--mailer", "ftp://x"]);
        assert!(invalid.contains("must be dev, smtp://"), "{invalid}");
        assert!(mailer(&["--env", "production", "--mailer", "dev"]).is_err());
        assert_eq!(
            mailer(&["--mailer", "smtp://127.0.0.1:2525"]).unwrap(),
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
