//! `oncely-chaos`: see the library docs and `docs/reliability.md`. Prints the report as JSON and
//! exits 1 if the run broke the promise.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use oncely_chaos::failover::{Pair, Replication};
use oncely_chaos::patroni::{self, Cluster, Fault, Route, Scenario};
use oncely_chaos::{Config, Delivery, Report, run};
use serde::Serialize;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Standby {
    /// `synchronous_standby_names` names the standby: a commit is acknowledged once it holds it.
    Sync,
    /// No synchronous standby: a commit is acknowledged at once.
    Async,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RouteArg {
    /// DATABASE_URL is HAProxy's port (HAProxy routes to the leader by Patroni's REST check).
    Haproxy,
    /// PgBouncer in transaction mode in front of HAProxy (ONCELY_DATABASE_POOLER=transaction,
    /// ONCELY_DATABASE_DIRECT_URL = HAProxy's URL).
    Pgbouncer,
    /// A multi-host DATABASE_URL naming both nodes, target_session_attrs=read-write: no proxy.
    Multihost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FaultArg {
    /// SIGKILL the leader's postmaster.
    KillPostgres,
    /// SIGKILL the leader node: its Patroni and its PostgreSQL together.
    KillNode,
    /// patronictl switchover --force to the synchronous standby.
    Switchover,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Provider,
    Smtp,
}

#[derive(Debug, Parser)]
#[command(
    about = "Kill, restart and fault oncely under a retrying storm; audit losses and duplicates"
)]
struct Args {
    /// The `oncely` binary.
    #[arg(long, default_value = "target/release/oncely")]
    oncely: PathBuf,
    /// A PostgreSQL database for the run (it is migrated, and should be empty).
    #[arg(long, env = "DATABASE_URL", required_unless_present_any = ["failover", "patroni"])]
    database_url: Option<String>,
    /// Instead of `--database-url` (then not used): a primary and a streaming standby of their own on this
    /// machine (initdb, pg_basebackup; `ONCELY_PG_BIN` names the programs' directory if they
    /// are not found), behind a proxy; midway the primary is SIGKILLed and the standby
    /// promoted.
    #[arg(long, value_enum, conflicts_with = "restart_postgres")]
    failover: Option<Standby>,
    /// Instead of `--database-url`: a Patroni cluster of the run's own (etcd, two PostgreSQL
    /// nodes with `synchronous_mode: true`, HAProxy; Debian's packages, `deploy/`'s
    /// configuration). Each scenario runs a storm of `--intents` on a database of its own and
    /// makes its fault once half of it is answered; oncely's processes are not killed (the run
    /// counts those that needed a restart).
    #[arg(long, conflicts_with_all = ["restart_postgres", "failover"])]
    patroni: bool,
    /// With --patroni: how oncely reaches the database.
    #[arg(long, value_enum, default_value = "haproxy", requires = "patroni")]
    route: RouteArg,
    /// With --patroni: the scenarios, in turn (default: all three).
    #[arg(long, value_enum, value_delimiter = ',', requires = "patroni")]
    scenario: Vec<FaultArg>,
    /// With --failover: the round-trip time the standby's link to the primary adds, in
    /// milliseconds (a standby in another zone: 1–2; in another region: 50–100).
    #[arg(long, default_value_t = 0, requires = "failover")]
    replication_rtt_ms: u64,
    /// Logical intents (signups).
    #[arg(long, default_value_t = 2000)]
    intents: usize,
    /// Intents in flight.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// At most this many new intents per second (default: as fast as --concurrency allows;
    /// with --patroni: 100, so that the storm's second half outlasts the fault).
    #[arg(long)]
    rate: Option<f64>,
    /// Shortest time between kills, in milliseconds.
    #[arg(long, default_value_t = 300)]
    kill_min_ms: u64,
    /// Longest time between kills, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    kill_max_ms: u64,
    /// Shell command that restarts PostgreSQL (run once, halfway).
    #[arg(long)]
    restart_postgres: Option<String>,
    /// Share of delivery attempts the inbox fails.
    #[arg(long, default_value_t = 0.1)]
    fault_rate: f64,
    /// How the workers deliver.
    #[arg(long, value_enum, default_value = "provider")]
    delivery: Mode,
    /// Over SMTP, resend an email whose outcome is unknown instead of reconciling it with the
    /// inbox's delivery lookup (the behaviour before reconciling: duplicates are counted).
    #[arg(long)]
    resend_unknown: bool,
    /// Reconciling over SMTP: milliseconds before the inbox's "not accepted" is believed.
    #[arg(long, default_value_t = 5_000)]
    lookup_grace_ms: u64,
    /// The provider throttles every this-many-th delivery attempt (429 / SMTP 450); 0: never.
    #[arg(long, default_value_t = 10)]
    throttle_every: u32,
    /// The Retry-After of a throttled attempt, in seconds.
    #[arg(long, default_value_t = 1)]
    retry_after: u64,
    /// Once a third of the storm is answered, the provider refuses our credentials (401 /
    /// SMTP 535) for this many milliseconds; 0: never.
    #[arg(long, default_value_t = 10_000)]
    credentials_outage_ms: u64,
    /// The workers' first retry delay, in milliseconds (the service's default: 2 s).
    #[arg(long, default_value_t = 2_000)]
    retry_base_ms: u64,
    /// How often the workers probe a kind paused by refused credentials, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pause_probe_ms: u64,
    /// Upper bound on the whole run, in seconds.
    #[arg(long, default_value_t = 1800)]
    time_limit: u64,
    /// Keep the process logs in this directory.
    #[arg(long)]
    logs: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // On Ctrl-C, SIGTERM or SIGHUP (the terminal closed) — from the first moment, the failover
    // pair's set-up included — return: dropping the run kills every process it started and
    // stops the pair's clusters (which run in sessions of their own: no signal reaches them).
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    if args.patroni {
        let runs = tokio::select! {
            runs = run_patroni(args) => runs?,
            _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; the processes were stopped"),
            _ = term.recv() => anyhow::bail!("terminated; the processes were stopped"),
            _ = hangup.recv() => anyhow::bail!("hung up; the processes were stopped"),
        };
        println!("{}", serde_json::to_string_pretty(&runs)?);
        if !runs.passed {
            eprintln!("chaos: the run broke the promise (see the report)");
            std::process::exit(1);
        }
        return Ok(());
    }
    let report = tokio::select! {
        report = set_up_and_run(args) => report?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; the processes were stopped"),
        _ = term.recv() => anyhow::bail!("terminated; the processes were stopped"),
        _ = hangup.recv() => anyhow::bail!("hung up; the processes were stopped"),
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    if !report.passed() {
        eprintln!("chaos: the run broke the promise (see the report)");
        std::process::exit(1);
    }
    Ok(())
}

/// The report of `--patroni`: one chaos run per scenario.
#[derive(Debug, Serialize)]
struct PatroniRuns {
    route: Route,
    passed: bool,
    scenarios: Vec<ScenarioRun>,
}

#[derive(Debug, Serialize)]
struct ScenarioRun {
    scenario: Scenario,
    passed: bool,
    report: Report,
}

/// Starts the Patroni cluster, then for each scenario: waits until it is settled, makes a
/// database, and runs the storm with the scenario's fault in its middle. The cluster is stopped
/// and removed when this returns or is dropped.
async fn run_patroni(args: Args) -> anyhow::Result<PatroniRuns> {
    let route = match args.route {
        RouteArg::Haproxy => Route::Haproxy,
        RouteArg::Pgbouncer => Route::Pgbouncer,
        RouteArg::Multihost => Route::Multihost,
    };
    let scenarios: Vec<Scenario> = if args.scenario.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenario
            .iter()
            .map(|s| match s {
                FaultArg::KillPostgres => Scenario::KillPostgres,
                FaultArg::KillNode => Scenario::KillNode,
                FaultArg::Switchover => Scenario::Switchover,
            })
            .collect()
    };
    if let Some(missing) = patroni::missing() {
        anyhow::bail!("the Patroni cluster cannot run here: {missing}");
    }
    if let Some(logs) = &args.logs {
        std::fs::create_dir_all(logs)?;
    }
    eprintln!("chaos: patroni: starting etcd, two Patroni nodes and HAProxy ({route:?} route)");
    let cluster = Arc::new(Cluster::start(route, args.logs.as_deref()).await?);
    let mut runs = PatroniRuns {
        route,
        passed: true,
        scenarios: Vec::new(),
    };
    for scenario in scenarios {
        let leader = cluster.settle().await?;
        let name = format!("{scenario:?}").to_lowercase();
        let database = format!("oncely_chaos_{name}");
        eprintln!("chaos: patroni: {scenario:?}: leader {leader}, a synchronous standby streaming");
        cluster.create_database(&database).await?;
        let fault = Arc::new(Fault::new(cluster.clone(), scenario).await?);
        let config = Config {
            database_url: cluster.url(&database),
            own_url: Some(cluster.direct_url(&database)),
            env: cluster.env(&database),
            rate: args.rate.or(Some(100.0)),
            kills: false,
            patroni: Some(fault),
            logs: args.logs.as_ref().map(|logs| logs.join(&name)),
            ..args.config()
        };
        let report = run(&config).await?;
        let passed = report.passed();
        eprintln!(
            "chaos: patroni: {scenario:?}: {} acknowledged, {} lost, {} duplicates, {:.1} s without a 2xx, {} answers 503, {} restarts needed{}",
            report.acknowledged,
            report.users_missing.max(report.lost),
            report.duplicates,
            report.availability.longest_without_2xx_s,
            report.availability.answers_503,
            report.restarts_needed,
            if passed { "" } else { ": FAILED" }
        );
        runs.passed &= passed;
        runs.scenarios.push(ScenarioRun {
            scenario,
            passed,
            report,
        });
    }
    Ok(runs)
}

impl Args {
    /// The run's settings every mode takes from the command line (the storm, the provider's
    /// faults, the retry timings); each mode sets its database, its faults and its logs.
    fn config(&self) -> Config {
        Config {
            oncely: self.oncely.clone(),
            database_url: String::new(),
            intents: self.intents,
            concurrency: self.concurrency,
            rate: self.rate,
            kills: false,
            kill_every: (
                Duration::from_millis(self.kill_min_ms),
                Duration::from_millis(self.kill_max_ms),
            ),
            restart_postgres: None,
            failover: None,
            patroni: None,
            env: Vec::new(),
            own_url: None,
            fault_rate: self.fault_rate,
            delivery: match self.delivery {
                Mode::Provider => Delivery::Provider,
                Mode::Smtp => Delivery::Smtp,
            },
            resend_unknown: self.resend_unknown,
            lookup_grace: Duration::from_millis(self.lookup_grace_ms),
            throttle_every: self.throttle_every,
            retry_after_s: self.retry_after,
            credentials_outage: (self.credentials_outage_ms > 0)
                .then(|| Duration::from_millis(self.credentials_outage_ms)),
            pause_probe: Duration::from_millis(self.pause_probe_ms),
            retry_base: Duration::from_millis(self.retry_base_ms),
            time_limit: Duration::from_secs(self.time_limit),
            logs: None,
        }
    }
}

/// Makes the failover pair if asked, then runs; the pair is stopped when this returns or is
/// dropped.
async fn set_up_and_run(args: Args) -> anyhow::Result<oncely_chaos::Report> {
    // With --failover: the pair first, the run's database made on its primary.
    let pair = match args.failover {
        Some(standby) => {
            let replication = match standby {
                Standby::Sync => Replication::Synchronous,
                Standby::Async => Replication::Asynchronous,
            };
            if let Some(logs) = &args.logs {
                std::fs::create_dir_all(logs)?;
            }
            let rtt = Duration::from_millis(args.replication_rtt_ms);
            let pair = Pair::start(replication, rtt, args.logs.as_deref()).await?;
            pair.create_database("oncely_chaos").await?;
            Some(Arc::new(pair))
        }
        None => None,
    };
    let database_url = match &pair {
        Some(pair) => pair.url("oncely_chaos"),
        None => args
            .database_url
            .clone()
            .context("--database-url or --failover")?,
    };
    let shared = args.config();
    let config = Config {
        database_url,
        kills: true,
        restart_postgres: args.restart_postgres,
        failover: pair,
        logs: args.logs,
        ..shared
    };
    run(&config).await
}
