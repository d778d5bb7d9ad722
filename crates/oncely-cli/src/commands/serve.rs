//! `oncely serve`: the HTTP API, and (unless `--workers 0`) outbox workers in the same process.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use oncely_server::accounts::Accounts;
use oncely_server::app::Application;
use oncely_server::settings::Settings;
use oncely_server::settings::defaults;
use secrecy::SecretString;

use crate::args::CommonArgs;
use crate::args::RetentionArgs;
use crate::args::parse_duration;

/// Settings of `oncely serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,

    /// Listen address.
    #[arg(long, env = "ONCELY_BIND", default_value = defaults::BIND)]
    pub bind: SocketAddr,

    /// Bearer token that `GET /metrics` requires. Without one, `/metrics` is open in
    /// development and answers 404 in production: its counters (emails sent or skipped) must
    /// not tell an outsider which addresses have accounts.
    #[arg(long, env = "ONCELY_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<SecretString>,

    /// How long idempotent results are replayed (`24h`, `90m`, …).
    #[arg(long, env = "ONCELY_KEY_RETENTION", default_value = defaults::KEY_RETENTION, value_parser = parse_duration)]
    pub key_retention: Duration,

    /// Bytes of finished keys kept in memory, so that repeats of a finished request are
    /// answered without the database (each entry until its key's retention ends; 0: none).
    #[arg(long, env = "ONCELY_REPLAY_CACHE_BYTES", default_value_t = defaults::REPLAY_CACHE_BYTES)]
    pub replay_cache_bytes: u64,

    /// Outbox workers inside this process (0: API only).
    #[arg(long, env = "ONCELY_WORKERS", default_value_t = defaults::WORKERS)]
    pub workers: usize,

    /// Emails per window to one address requested by one client (counted whether or not the
    /// address has an account); more are not sent, and the answer does not change. Per client,
    /// so that one client cannot use up the owner's own emails. Default: 5 in production, 100
    /// in development.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_ADDRESS")]
    pub mail_cap_per_address: Option<u32>,

    /// Emails per window to one address from all clients together: the ceiling that protects a
    /// mailbox from many clients at once. Default: 4 × ONCELY_MAIL_CAP_PER_ADDRESS.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_ADDRESS_TOTAL")]
    pub mail_cap_per_address_total: Option<u32>,

    /// Emails per window requested by one client address. Default: 30 in production, 1000 in
    /// development.
    #[arg(long, env = "ONCELY_MAIL_CAP_PER_CLIENT")]
    pub mail_cap_per_client: Option<u32>,

    /// Failed logins per window for one address from one client (counted whether or not the
    /// address has an account); then that client's attempts at it are refused (429) until the
    /// window ends.
    #[arg(long, env = "ONCELY_LOGIN_CAP_PER_ADDRESS", default_value_t = defaults::LOGIN_CAP_PER_ADDRESS)]
    pub login_cap_per_address: u32,

    /// Failed logins per window for one address from all clients together; a client with no
    /// failure of its own for the address in the window still gets its attempt (strangers
    /// cannot lock the owner out).
    #[arg(long, env = "ONCELY_LOGIN_CAP_PER_ADDRESS_TOTAL", default_value_t = defaults::LOGIN_CAP_PER_ADDRESS_TOTAL)]
    pub login_cap_per_address_total: u32,

    /// Failed logins per window from one client address, whatever the addresses.
    #[arg(long, env = "ONCELY_LOGIN_CAP_PER_CLIENT", default_value_t = defaults::LOGIN_CAP_PER_CLIENT)]
    pub login_cap_per_client: u32,

    /// Proxies (comma-separated CIDRs or addresses) whose `X-Forwarded-For` / `Forwarded`
    /// name the client for the per-client cap. Default: none (the headers are ignored and the
    /// connection's peer is the client).
    #[arg(
        long,
        env = "ONCELY_TRUSTED_PROXIES",
        value_delimiter = ',',
        value_parser = oncely_server::client_addr::parse_trusted_proxy
    )]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub retention: RetentionArgs,

    /// How often `serve` prunes expired rows (see `oncely prune`).
    #[arg(long, env = "ONCELY_PRUNE_INTERVAL", default_value = defaults::PRUNE_INTERVAL, value_parser = parse_duration)]
    pub prune_interval: Duration,

    /// Connections served at once; past it new ones wait in the kernel's backlog until one
    /// closes. The process raises its open-file limit for them where the hard limit allows.
    #[arg(long, env = "ONCELY_MAX_CONNECTIONS", default_value_t = defaults::MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Time a client has to send a request's headers, from its connection or its previous
    /// response (a slowloris client, or an idle keep-alive connection, is closed then).
    #[arg(long, env = "ONCELY_HEADER_READ_TIMEOUT", default_value = defaults::HEADER_READ_TIMEOUT, value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// Time a client has to send a request's whole body (408 `request-body-timeout` after it).
    #[arg(long, env = "ONCELY_BODY_READ_TIMEOUT", default_value = defaults::BODY_READ_TIMEOUT, value_parser = parse_duration)]
    pub body_read_timeout: Duration,

    /// Time a response may wait for a client that reads none of it (the connection is closed
    /// after it).
    #[arg(long, env = "ONCELY_WRITE_TIMEOUT", default_value = defaults::WRITE_TIMEOUT, value_parser = parse_duration)]
    pub write_timeout: Duration,
}

/// Runs `oncely serve` on backend `B` until Ctrl-C or SIGTERM.
pub async fn run<B: Accounts>(settings: Settings) -> anyhow::Result<()> {
    let workers = settings.workers;
    let app = Application::<B>::build(settings).await?;
    let addr = app.addr();
    tracing::info!(%addr, database = B::NAME, workers, "oncely is serving");
    println!("oncely API:   http://{addr}   (health: /healthz)");
    println!("dev inbox:    {}", app.dev_inbox_status());
    println!(
        "try:          curl -i http://{addr}/v1/signup -H 'Idempotency-Key: \"signup-1\"' \
         -H 'content-type: application/json' -d '{{\"email\":\"ada@example.com\"}}'"
    );
    app.run_until(crate::shutdown_signal()).await
}
