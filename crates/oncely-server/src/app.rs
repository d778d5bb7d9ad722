//! The application: database, mailer, HTTP routes and in-process workers, assembled once.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use oncely::store::shared_secret::share_secret;
use oncely_inbox::{Inbox, Running};
use oncely_outbox::OnUnknown;
use oncely_outbox::mail::{self, IdempotencyHeader, Mailer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::accounts::Accounts;
use crate::backend::{Backend, DevInboxHold};
use crate::client_addr::TrustedProxies;
use crate::environment::Environment;
use crate::mail::MailContext;
use crate::routes::{self, AppState};
use crate::settings::{MailerChoice, MailerSettings, Settings};
use crate::startup::Holds;
use crate::workers::{self, WorkerHandles};
use crate::{startup, telemetry};

/// How long one email send may take before its outcome counts as unknown.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// A bound, ready-to-run server on backend `B`. Tests bind port 0 and read
/// [`Application::addr`].
pub struct Application<B> {
    listener: TcpListener,
    router: Router,
    backend: B,
    dev_inbox: Option<(Inbox, Running)>,
    dev_inbox_status: DevInbox,
    /// Holds the dev inbox of the database for this process (see [`Backend::hold_dev_inbox`]).
    _dev_inbox_hold: Option<DevInboxHold>,
    shutdown: CancellationToken,
    workers: WorkerHandles,
    connections: crate::connections::ConnectionLimits,
}

/// Where this process's emails can be read: what `serve` prints on its `dev inbox:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevInbox {
    /// This process serves it: its page, and its SMTP intake.
    Served {
        /// `http://…/_dev/inbox`.
        page: String,
        /// The intake the workers send to.
        smtp: SocketAddr,
    },
    /// Another `serve` of this database serves it (this one runs no workers).
    Elsewhere(String),
    /// Not served, and why.
    Off(String),
}

impl std::fmt::Display for DevInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Served { page, smtp } => {
                write!(f, "{page}   (JSON: /_dev/inbox/messages; SMTP {smtp})")
            }
            Self::Elsewhere(by) => write!(
                f,
                "served by another `oncely serve` of this database: {by} (this one has --workers 0)"
            ),
            Self::Off(why) => write!(f, "off ({why})"),
        }
    }
}

/// The mailer the settings name; `dev` starts the built-in inbox.
pub async fn mailer(
    settings: &MailerSettings,
) -> anyhow::Result<(Arc<dyn Mailer>, Option<(Inbox, Running)>)> {
    match &settings.choice {
        MailerChoice::Url(url) => {
            let header = settings.idempotency_header.clone();
            let mailer = mail::from_url(url, settings.api_key.clone(), SEND_TIMEOUT, header)
                .with_context(|| {
                    format!(
                        "ONCELY_MAILER {:?}",
                        url.split("://").next().unwrap_or_default()
                    )
                })?;
            let mailer = match &settings.lookup {
                Some(template) => looked_up(mailer, template).context("ONCELY_MAILER_LOOKUP")?,
                None => mailer,
            };
            Ok((mailer, None))
        }
        MailerChoice::Dev => {
            // The dev inbox reads the header the mailer sends.
            let header = settings
                .idempotency_header
                .clone()
                .unwrap_or_else(|| IdempotencyHeader::default_for("smtp://"));
            let config = oncely_inbox::Config {
                smtp_idempotency_header: header.to_string(),
                ..oncely_inbox::Config::default()
            };
            let (inbox, running) = Inbox::with_config(config)
                .start_local_with(oncely_inbox::Faults::default())
                .await
                .context("starting the dev inbox")?;
            let url = format!("smtp://{}", running.smtp_addr);
            let mailer = mail::from_url(&url, None, SEND_TIMEOUT, Some(header))?;
            // The dev inbox answers for what it accepted: a parked email is settled by asking it.
            let own = format!("http://{}/deliveries/{{key}}", running.http_addr);
            let template = settings.lookup.as_deref().unwrap_or(&own);
            let mailer = looked_up(mailer, template).context("ONCELY_MAILER_LOOKUP")?;
            Ok((mailer, Some((inbox, running))))
        }
    }
}

/// Says at start-up that parked emails wait for an operator when they reconcile
/// ([`OnUnknown::Reconcile`]) and nothing can ask the provider about them.
pub fn warn_unless_reconciled(on_unknown: OnUnknown, mailer: &dyn Mailer) {
    if on_unknown == OnUnknown::Resend && mailer.looks_up() {
        tracing::warn!(
            "ONCELY_MAILER_LOOKUP is set but emails whose outcome is unknown are resent (ONCELY_ON_UNKNOWN=resend, the default over HTTP): the lookup is never asked; set ONCELY_ON_UNKNOWN=reconcile to use it"
        );
    }
    if on_unknown == OnUnknown::Reconcile && !mailer.looks_up() {
        tracing::warn!(
            "an email whose outcome is unknown is parked until an operator settles it (`oncely outbox unknown`, `oncely outbox settle`): nothing can ask the mailer's provider whether it accepted it; set ONCELY_MAILER_LOOKUP where it can answer, or ONCELY_ON_UNKNOWN=resend to send it again"
        );
    }
}

/// `mailer`, asked about delivery keys at `template` ([`mail::LookedUp`]).
fn looked_up(mailer: Arc<dyn Mailer>, template: &str) -> anyhow::Result<Arc<dyn Mailer>> {
    Ok(Arc::new(mail::LookedUp::new(
        mailer,
        template,
        SEND_TIMEOUT,
    )?))
}

impl<B: Accounts> Application<B> {
    /// Connects; migrates in development, checks the schema in production
    /// ([`startup::open_to_serve`]); binds; starts the workers and the pruner. `settings` were
    /// checked when they were resolved (by `oncely_cli::resolve`).
    pub async fn build(mut settings: Settings) -> anyhow::Result<Self> {
        // Before anything connects: a broken template stops start-up, never a send.
        let templates = crate::templates::Templates::for_start(settings.templates.as_deref())?;
        let backend: B = startup::open_to_serve(
            &settings.database.location(),
            settings.database.pool,
            settings.environment,
        )
        .await?;
        settings.secret = share_secret(
            backend.keys(),
            backend.db(),
            settings.secret.clone(),
            settings.generated_secret.as_ref(),
        )
        .await?;
        crate::webhooks::delivery::reseal_at_start(&backend, &settings.secret).await;
        let tenants: Vec<String> = backend.tenants().await?.into_iter().map(|t| t.id).collect();
        templates
            .validate_tenants(&tenants)
            .map_err(anyhow::Error::msg)?;
        let listener = TcpListener::bind(settings.bind)
            .await
            .with_context(|| format!("cannot listen on {} (ONCELY_BIND)", settings.bind))?;
        let addr = listener.local_addr()?;
        let development = settings.environment == Environment::Development;
        // Workers that mail into the dev inbox deliver into this process's inbox: one process
        // of a database may, or the emails split between inboxes.
        let page = format!("http://{addr}/_dev/inbox");
        // `None`: this process serves it.
        let (not_served, dev_inbox_hold) = match &settings.mailer.choice {
            MailerChoice::Url(_) => (
                Some(DevInbox::Off(
                    "ONCELY_MAILER is set: emails go to that mailer".into(),
                )),
                None,
            ),
            MailerChoice::Dev => {
                let me = format!("{page} (pid {})", std::process::id());
                match backend.hold_dev_inbox(&me).await? {
                    DevInboxHold::Elsewhere(by) if settings.workers > 0 => bail!(
                        "the dev inbox of this database is served by another `oncely serve` ({by}), whose workers send the emails: start this one with --workers 0 (ONCELY_WORKERS), or stop that one"
                    ),
                    DevInboxHold::Elsewhere(by) => (Some(DevInbox::Elsewhere(by)), None),
                    DevInboxHold::Held(_) if settings.workers == 0 => (
                        Some(DevInbox::Off(
                            "--workers 0: this process sends no email; emails wait for `oncely worker` or a `serve` with workers".into(),
                        )),
                        None,
                    ),
                    held if !addr.ip().is_loopback() => (
                        Some(DevInbox::Off(format!(
                            "bind {} is not loopback: the dev inbox is served on loopback only, and emails sent here are kept where nobody reads them; bind 127.0.0.1, or set ONCELY_MAILER",
                            settings.bind.ip()
                        ))),
                        Some(held),
                    ),
                    held => (None, Some(held)),
                }
            }
        };
        let (mailer, dev_inbox) = mailer(&settings.mailer).await?;
        if let Some((inbox, _)) = &dev_inbox {
            // The dev inbox's link scanner opens this service's own links only: the origin of
            // its public URL (when that is http:// on loopback; else it opens nothing).
            match oncely_inbox::Origin::of_url(&settings.public_url_at(addr)) {
                Ok(origin) => inbox.set_scan_origins([origin]),
                Err(why) => tracing::debug!(%why, "the dev inbox's link scanner opens no link"),
            }
        }
        if settings.workers > 0 {
            let on_unknown = settings.mailer.on_unknown(settings.on_unknown);
            warn_unless_reconciled(on_unknown, &*mailer);
        }
        let dev_inbox_status = match (not_served, &dev_inbox) {
            (Some(status), _) => status,
            (None, Some((_, running))) => DevInbox::Served {
                page,
                smtp: running.smtp_addr,
            },
            (None, None) => DevInbox::Off("no dev inbox started".into()),
        };
        let context = Arc::new(MailContext {
            secret: settings.secret.clone(),
            public_url: settings.public_url_at(addr),
            brand: settings.brand.clone(),
            templates: templates.clone(),
            mailer,
        });
        let shutdown = CancellationToken::new();
        let jobs = backend.jobs(settings.poll_only);
        let mut workers = workers::spawn(
            &backend,
            &jobs,
            &context,
            &settings.worker_plan(),
            &shutdown,
        )?;
        workers.push(tokio::spawn(prune_periodically(
            backend.clone(),
            jobs.clone(),
            (settings.prune_interval, settings.retention()),
            shutdown.clone(),
        )));
        let production = settings.environment == Environment::Production;
        // The dev inbox's pages: development, the dev mailer, a loopback address only, and
        // this process's workers mailing into it (what the banner says).
        let dev_inbox_page = dev_inbox
            .as_ref()
            .filter(|_| {
                development
                    && addr.ip().is_loopback()
                    && matches!(dev_inbox_status, DevInbox::Served { .. })
            })
            .map(|(inbox, _)| inbox.clone());
        if let Some(inbox) = &dev_inbox_page {
            // The dev inbox checks the signatures of this server's own endpoints: those whose
            // URL is its `/webhooks/{name}` on this address.
            let (accounts, secret, port) = (backend.clone(), settings.secret.clone(), addr.port());
            let _ = inbox
                .clone()
                .with_webhook_secrets_from(Arc::new(move |name: &str| {
                    let (accounts, secret) = (accounts.clone(), secret.clone());
                    let path = format!("/_dev/inbox/webhooks/{name}");
                    Box::pin(
                        async move { dev_inbox_secrets(&accounts, &secret, port, &path).await },
                    )
                }));
        }
        let state = AppState {
            accounts: backend.clone(),
            jobs: jobs.clone(),
            secret: settings.secret.clone(),
            limits: settings.limits,
            client_mail: crate::limits::mail::ClientMail::new(&settings.limits),
            login: settings.login,
            recipient_in_payload: dev_inbox_page.is_some(),
            templates,
        };
        let v1 = routes::v1(state, settings.key_policy());
        let v1 = if development
            && std::env::var("ONCELY_FAILPOINT").as_deref() == Ok("crash-after-commit")
        {
            tracing::warn!(
                "failpoint crash-after-commit is on: the process aborts after its first committed POST"
            );
            v1.layer(axum::middleware::from_fn(crash_after_commit))
        } else {
            v1
        };
        if production && settings.metrics_token.is_none() {
            tracing::warn!(
                "GET /metrics answers 404 in production without ONCELY_METRICS_TOKEN (its counters would tell outsiders which addresses have accounts); set one to scrape it"
            );
        }
        telemetry::prometheus();
        let mut router = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz::<B>))
            .route(
                "/metrics",
                get(metrics::<B>).layer(axum::Extension(MetricsAccess {
                    token: settings.metrics_token.as_ref().map(|token| {
                        use secrecy::ExposeSecret;
                        use sha2::Digest;
                        sha2::Sha256::digest(token.expose_secret().as_bytes()).into()
                    }),
                    production,
                })),
            )
            .route(
                "/openapi.json",
                get(|| async {
                    axum::Json(<crate::openapi::ApiDoc as utoipa::OpenApi>::openapi())
                }),
            )
            .with_state(backend.clone())
            .merge(v1)
            .route_layer(axum::middleware::from_fn(telemetry::record_http));
        // Served only when this process's workers mail into it, on a loopback bind, in
        // development (the dev mailer exists only there): exactly what the banner says.
        if let Some(inbox) = dev_inbox_page {
            router = router.nest("/_dev/inbox", dev_inbox_routes(inbox, jobs));
        }
        // Every error is problem+json, a path or method the service does not have too.
        let router = router
            .fallback(|| async { crate::routes::error::ApiError::NotFound })
            .method_not_allowed_fallback(|| async {
                crate::routes::error::ApiError::MethodNotAllowed
            });
        let connections = settings.connections;
        let router = telemetry::layer(router).layer(axum::Extension(TrustedProxies::new(
            settings.trusted_proxies,
        )));
        Ok(Self {
            listener,
            router,
            backend,
            dev_inbox,
            dev_inbox_status,
            _dev_inbox_hold: dev_inbox_hold,
            shutdown,
            workers,
            connections,
        })
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The backend in use.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The built-in inbox, when the mailer is `dev`.
    pub fn dev_inbox(&self) -> Option<&(Inbox, Running)> {
        self.dev_inbox.as_ref()
    }

    /// Whether this process serves the dev inbox, and if not, why (the `dev inbox:` line).
    pub fn dev_inbox_status(&self) -> &DevInbox {
        &self.dev_inbox_status
    }

    /// Serves until `shutdown` completes. Then, at once, the workers stop claiming (each
    /// finishes the jobs in hand) and the server stops accepting connections; it returns once
    /// the in-flight requests are answered and the workers are done.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stop_workers = self.shutdown.clone();
        let signal = async move {
            shutdown.await;
            // Not after the HTTP drain, which can take long: no job is claimed from now on.
            stop_workers.cancel();
            tracing::info!("shutting down: workers stop claiming, in-flight requests finish");
        };
        // With the peer address (the per-client email cap keys on it), bounded against slow and
        // hostile clients.
        let served =
            crate::connections::serve(self.listener, self.router, self.connections, signal).await;
        self.shutdown.cancel();
        for worker in self.workers {
            if let Err(error) = worker.await {
                tracing::error!(%error, "outbox worker supervisor failed");
            }
        }
        Ok(served?)
    }
}

/// Where the dev inbox's page reads the emails the service chose not to send.
pub const SUPPRESSED_FEED: &str = "/_dev/inbox/suppressed";

/// How many of the latest suppressed emails the dev inbox shows.
const SUPPRESSED_SHOWN: u32 = 200;

/// The dev inbox (mounted at `/_dev/inbox`): its pages and API, and `GET /suppressed`, the
/// emails the service chose not to send, which its page shows.
fn dev_inbox_routes<S: oncely_outbox::JobStore>(inbox: Inbox, jobs: S) -> Router {
    let options = oncely_inbox::page::Options {
        suppressed_feed: Some(SUPPRESSED_FEED.to_owned()),
    };
    // Behind the inbox's guards (another origin, DNS rebinding) like the rest of it.
    let feed = Router::new().route("/suppressed", get(suppressed::<S>).with_state(jobs));
    oncely_inbox::http::router_with(inbox, options, feed)
}

/// `GET /_dev/inbox/suppressed`: the latest skipped email jobs, newest first, as the dev inbox's
/// page reads them: `[{"to", "kind", "reason", "at"}]` (`to`: the address the request named,
/// recorded in development; null for a job written without it).
async fn suppressed<S: oncely_outbox::JobStore>(State(jobs): State<S>) -> axum::response::Response {
    use axum::response::IntoResponse;
    use time::format_description::well_known::Rfc3339;
    match jobs.skipped(SUPPRESSED_SHOWN).await {
        Ok(skipped) => {
            let rows: Vec<serde_json::Value> = skipped
                .into_iter()
                .map(|job| {
                    serde_json::json!({
                        "to": job.payload.get("recipient"),
                        "kind": job.kind,
                        "reason": job.reason,
                        "at": job.skipped_at.format(&Rfc3339).ok(),
                    })
                })
                .collect();
            axum::Json(rows).into_response()
        }
        Err(error) => {
            tracing::warn!(%error, "reading the suppressed emails for the dev inbox failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the suppressed emails could not be read from the outbox",
            )
                .into_response()
        }
    }
}

/// Test hook (development only, `ONCELY_FAILPOINT=crash-after-commit`): the process dies after
/// a POST committed and before its answer leaves, as a crash or a kill at the worst moment would.
async fn crash_after_commit(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let post = req.method() == axum::http::Method::POST;
    let response = next.run(req).await;
    if post && response.status().is_success() {
        std::process::abort();
    }
    response
}

/// `serve`'s pruner: a full pass every interval, until shutdown.
async fn prune_periodically<A: Accounts>(
    accounts: A,
    jobs: A::Jobs,
    (interval, retention): (Duration, crate::prune::Retention),
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        match crate::prune::prune_all(&accounts, &jobs, (retention, Holds::Service), |_, _| {})
            .await
        {
            Ok(pruned) if pruned.total() > 0 => tracing::info!(?pruned, "pruned expired rows"),
            Ok(_) => {}
            Err(error) => tracing::warn!(
                error = format!("{error:#}"),
                "pruning failed; next pass later"
            ),
        }
    }
}

/// Who may read `/metrics`: the bearer of `ONCELY_METRICS_TOKEN`; without a token, anyone in
/// development and nobody in production (a peer address proves nothing behind a local proxy).
#[derive(Clone)]
struct MetricsAccess {
    /// SHA-256 of `ONCELY_METRICS_TOKEN`.
    token: Option<[u8; 32]>,
    production: bool,
}

impl MetricsAccess {
    fn allows(&self, headers: &axum::http::HeaderMap) -> bool {
        use sha2::{Digest, Sha256};
        match &self.token {
            Some(digest) => {
                let presented = headers
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or_default();
                // Digests compared, not the strings: no early exit on the first differing byte.
                Sha256::digest(presented.as_bytes()).as_slice() == digest
            }
            None => !self.production,
        }
    }
}

/// Prometheus text; the outbox backlog is read now.
async fn metrics<B: Backend>(
    State(backend): State<B>,
    axum::Extension(access): axum::Extension<MetricsAccess>,
    headers: axum::http::HeaderMap,
) -> (StatusCode, String) {
    use oncely_outbox::JobStore;
    if !access.allows(&headers) {
        return (StatusCode::NOT_FOUND, String::new());
    }
    match backend.jobs(true).backlog().await {
        Ok(backlog) => {
            metrics::gauge!("oncely_outbox_pending").set(backlog.pending as f64);
            metrics::gauge!("oncely_outbox_oldest_pending_seconds")
                .set(backlog.oldest_pending_seconds);
            metrics::gauge!("oncely_outbox_parked").set(backlog.parked as f64);
            metrics::gauge!("oncely_outbox_oldest_parked_seconds")
                .set(backlog.oldest_parked_seconds);
        }
        Err(error) => tracing::warn!(%error, "reading the outbox backlog for /metrics"),
    }
    (StatusCode::OK, telemetry::prometheus().render())
}

async fn readyz<B: Accounts>(State(backend): State<B>) -> (StatusCode, String) {
    match backend.ready().await {
        Ok(()) => (StatusCode::OK, "ready".into()),
        Err(error) => {
            tracing::warn!(%error, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {error}"),
            )
        }
    }
}

/// The signing secrets (`whsec_…`) of this server's endpoints whose URL is `path` on a
/// loopback address at `port`: what the dev inbox checks a delivery to `path` with. None when
/// they cannot be read (the delivery is then kept unverified).
async fn dev_inbox_secrets<B: Accounts>(
    accounts: &B,
    secret: &oncely::ServerSecret,
    port: u16,
    path: &str,
) -> Vec<String> {
    use crate::webhooks::delivery::signing_secrets_of;
    let ours = |url: &str| {
        url::Url::parse(url).is_ok_and(|url| {
            let loopback = match url.host() {
                Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                None => false,
            };
            loopback && url.port_or_known_default() == Some(port) && url.path() == path
        })
    };
    let endpoints = match accounts.webhook_endpoints(None).await {
        Ok(endpoints) => endpoints,
        Err(error) => {
            tracing::warn!(%error, "the dev inbox could not read the webhook endpoints");
            return Vec::new();
        }
    };
    let mut secrets = Vec::new();
    for endpoint in endpoints.iter().filter(|e| ours(&e.url)) {
        // The listed row has the sealed secrets: no second read per endpoint.
        match signing_secrets_of(secret, endpoint) {
            Ok(found) => secrets.extend(found.iter().map(|s| s.expose().to_owned())),
            Err(error) => {
                tracing::warn!(%error, endpoint = %endpoint.id, "the dev inbox could not read an endpoint's signing secrets")
            }
        }
    }
    secrets
}
