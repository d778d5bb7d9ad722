//! `oncely gateway`: the Idempotency-Key contract in front of an application in any language.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use oncely::store::shared_secret::SharedSecretStore;
use oncely::store::{Dialect, KeyStore, SqlKeyStore};
use oncely_gateway::start::{self, Schemas};
use oncely_server::environment::Environment;
use oncely_server::settings::defaults;
use oncely_sql::open::{Open, unsupported};

use crate::args::DatabaseArgs;
use crate::args::SecretArgs;
use crate::args::parse_duration;

/// Settings of `oncely gateway`. Its `Debug` shows no secret.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// The application behind the gateway: `http://host:port`, optionally with a base path
    /// (`http://127.0.0.1:3000/api`). Plain HTTP: run the gateway beside the application.
    #[arg(long, env = "ONCELY_GATEWAY_UPSTREAM")]
    pub upstream: String,

    /// A route to protect: `'METHOD /path'`, with `{name}` for a path segment
    /// (`--route 'POST /signup' --route 'POST /orders/{id}/pay'`). Repeat for more. Literal
    /// segments match without regard to case, and a trailing slash is ignored. Every other
    /// request passes through untouched.
    #[arg(long = "route", value_name = "'METHOD /path'")]
    pub routes: Vec<String>,

    /// A file of routes to protect, one `METHOD /path` per line (`#` starts a comment), in
    /// addition to any --route.
    #[arg(long, env = "ONCELY_GATEWAY_ROUTES", value_name = "FILE")]
    pub routes_file: Option<std::path::PathBuf>,

    /// A route (`'POST /path/{param}'`: a request's own method and path) whose requests may
    /// carry a method override (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`,
    /// a `_method` parameter) — for an application whose forms need one there. Elsewhere any
    /// override is 400 `request-ambiguous`; here only one that names a method protected at
    /// the path. Repeat for more.
    #[arg(long = "allow-method-override", value_name = "'METHOD /path'")]
    pub allow_method_override: Vec<String>,

    /// Listen address.
    #[arg(long, env = "ONCELY_GATEWAY_BIND", default_value = defaults::GATEWAY_BIND)]
    pub bind: SocketAddr,

    /// A header that names the tenant, set by a proxy you trust in front of the gateway (never
    /// by clients: whoever can set it chooses whose keys they use). Keys of one tenant never
    /// answer another's. Without it (or when a request lacks it) the tenant is the request's
    /// credential, hashed; without a credential, the shared anonymous tenant.
    #[arg(long, env = "ONCELY_GATEWAY_TENANT_HEADER", value_name = "NAME")]
    pub tenant_header: Option<http::HeaderName>,

    /// The header whose value (an API key, a bearer token) is the caller's credential: the
    /// tenant becomes a keyed hash of it, so two callers' keys never collide.
    #[arg(
        long,
        env = "ONCELY_GATEWAY_CREDENTIAL_HEADER",
        default_value = "authorization",
        value_name = "NAME"
    )]
    pub credential_header: http::HeaderName,

    /// A cookie that is the caller's credential (a session cookie), used when the credential
    /// header is absent.
    #[arg(long, env = "ONCELY_GATEWAY_CREDENTIAL_COOKIE", value_name = "NAME")]
    pub credential_cookie: Option<String>,

    /// The header that carries the stable derived key to the upstream, for its own downstream
    /// calls (the client's key is replaced by it: unique per tenant, route and key).
    #[arg(
        long,
        env = "ONCELY_GATEWAY_FORWARD_KEY_HEADER",
        default_value = "idempotency-key",
        value_name = "NAME"
    )]
    pub forward_key_header: http::HeaderName,

    /// How long to wait for the upstream's answer (a protected route's whole answer). A
    /// protected request's key is held, its lease renewed, for as long as it waits. Past it:
    /// 504, and the key is kept (the upstream may have acted): retries get 422.
    #[arg(long, env = "ONCELY_GATEWAY_UPSTREAM_TIMEOUT", default_value = defaults::GATEWAY_UPSTREAM_TIMEOUT, value_parser = parse_duration)]
    pub upstream_timeout: Duration,

    /// How long a claimed key is held before another process may take it over (renewed while
    /// the upstream works).
    #[arg(long, env = "ONCELY_LEASE", default_value = defaults::LEASE, value_parser = parse_duration)]
    pub lease: Duration,

    /// How long results are replayed (`24h`, `90m`, …).
    #[arg(long, env = "ONCELY_KEY_RETENTION", default_value = defaults::KEY_RETENTION, value_parser = parse_duration)]
    pub key_retention: Duration,

    /// Bytes of finished keys kept in memory, so that repeats are answered without the database
    /// (each entry until its key's retention ends; 0: none).
    #[arg(long, env = "ONCELY_REPLAY_CACHE_BYTES", default_value_t = defaults::REPLAY_CACHE_BYTES)]
    pub replay_cache_bytes: u64,

    /// The largest request body a protected route takes (413 beyond; nothing forwarded).
    #[arg(long, env = "ONCELY_GATEWAY_MAX_REQUEST_BODY", default_value_t = defaults::GATEWAY_MAX_REQUEST_BODY)]
    pub max_request_body: usize,

    /// The largest answer stored for replay; a larger one reaches the first caller (streamed)
    /// and its key is tombstoned: retries get 422, never a second run.
    #[arg(long, env = "ONCELY_GATEWAY_MAX_STORED_BODY", default_value_t = defaults::GATEWAY_MAX_STORED_BODY)]
    pub max_stored_body: usize,

    /// The most protected requests in flight at once (each holds its body, up to
    /// --max-request-body); more are answered 503 with Retry-After.
    #[arg(long, env = "ONCELY_GATEWAY_MAX_IN_FLIGHT", default_value_t = defaults::GATEWAY_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,

    /// How long a client may take to send a request's head (its line and headers) once it
    /// starts one; past it the connection is closed.
    #[arg(long, env = "ONCELY_GATEWAY_HEADER_TIMEOUT", default_value = defaults::GATEWAY_HEADER_TIMEOUT, value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// How long a client may take to send a protected request's body (408 past it).
    #[arg(long, env = "ONCELY_GATEWAY_BODY_TIMEOUT", default_value = defaults::GATEWAY_BODY_TIMEOUT, value_parser = parse_duration)]
    pub body_timeout: Duration,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,

    /// Most PostgreSQL connections this process opens.
    #[arg(long, env = "ONCELY_DATABASE_POOL", default_value_t = defaults::DATABASE_POOL, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub database_pool: u32,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub secrets: SecretArgs,
}

/// Runs `oncely gateway` until Ctrl-C or SIGTERM, on the database `DATABASE_URL` names.
pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let url = args.database.database_url.as_str();
    if sqlx::Postgres::accepts(url) {
        run_on::<sqlx::Postgres>(args).await
    } else if sqlx::Sqlite::accepts(url) {
        run_on::<sqlx::Sqlite>(args).await
    } else {
        Err(unsupported(url).into())
    }
}

/// Runs `oncely gateway` on database `DB`. The database opens with the key store's migrations
/// alone (in development, migrated; in production, checked: [`oncely_gateway::start`]), with
/// `serve`'s server secret rules and the same check that every process of the database uses
/// one secret.
async fn run_on<DB>(args: GatewayArgs) -> anyhow::Result<()>
where
    DB: Open + Dialect,
    SqlKeyStore<DB>: KeyStore + SharedSecretStore,
{
    let plan = args.plan()?;
    let environment = args.secrets.environment;
    let location = args.database.location();
    let secrets = &args.secrets;
    let given = oncely_server::secret::server_secret(
        environment,
        (secrets.secret.as_ref(), secrets.secret_previous.as_ref()),
        &location.url,
    )?;
    let schemas = match environment {
        Environment::Development => Schemas::Migrate,
        Environment::Production => Schemas::Require,
    };
    let (keys, secret) = start::open::<DB>(&location, args.database_pool, schemas, given).await?;
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("cannot listen on {} (ONCELY_GATEWAY_BIND)", args.bind))?;
    oncely_gateway::serve(
        listener,
        keys,
        secret,
        plan,
        (args.header_timeout, <DB as Open>::NAME),
        crate::shutdown_signal(),
    )
    .await
}
