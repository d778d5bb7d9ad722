//! `oncely worker`: outbox workers only.

use std::sync::Arc;

use clap::Args;
use oncely::store::shared_secret::share_secret;
use oncely_server::accounts::Accounts;
use oncely_server::app;
use oncely_server::mail::MailContext;
use oncely_server::settings::WorkerSettings;
use oncely_server::settings::defaults;
use oncely_server::startup;
use oncely_server::templates::Templates;
use oncely_server::workers;
use tokio_util::sync::CancellationToken;

use crate::args::CommonArgs;

/// Settings of `oncely worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,

    /// Concurrent workers in this process.
    #[arg(long, env = "ONCELY_WORKERS", default_value_t = defaults::WORKERS)]
    pub workers: usize,

    /// Run only these job kinds (comma-separated); default: all.
    #[arg(long, env = "ONCELY_WORKER_KINDS", value_delimiter = ',')]
    pub kinds: Vec<String>,
}

/// Runs `oncely worker` on backend `B` until Ctrl-C or SIGTERM.
pub async fn run<B: Accounts>(settings: WorkerSettings) -> anyhow::Result<()> {
    let templates = Templates::for_start(settings.templates.as_deref())?;
    let backend: B = startup::open_to_serve(
        &settings.database.location(),
        settings.database.pool,
        settings.environment,
    )
    .await?;
    let secret = share_secret(
        backend.keys(),
        backend.db(),
        settings.secret,
        settings.generated_secret.as_ref(),
    )
    .await?;
    let (mailer, _) = app::mailer(&settings.mailer).await?;
    app::warn_unless_reconciled(settings.plan.options.on_unknown, &*mailer);
    let context = Arc::new(MailContext {
        secret,
        public_url: settings.public_url,
        brand: settings.brand,
        templates,
        mailer,
    });
    oncely_server::webhooks::delivery::reseal_at_start(&backend, &context.secret).await;
    let tenants: Vec<String> = backend.tenants().await?.into_iter().map(|t| t.id).collect();
    context
        .templates
        .validate_tenants(&tenants)
        .map_err(anyhow::Error::msg)?;
    let shutdown = CancellationToken::new();
    let jobs = backend.jobs(settings.poll_only);
    let handles = workers::spawn(&backend, &jobs, &context, &settings.plan, &shutdown)?;
    println!(
        "oncely worker: {} worker(s) on {}",
        settings.plan.count,
        B::NAME
    );
    crate::shutdown_signal().await;
    shutdown.cancel();
    for handle in handles {
        handle.await?;
    }
    Ok(())
}
