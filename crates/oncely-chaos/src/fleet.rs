//! The processes under test: three `oncely serve --workers 0` and two `oncely worker`, on
//! loopback, each restartable after a kill.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::Config;

/// The server secret every process shares (links derived by one are valid at all).
pub(crate) const SECRET: &str = "chaos-secret-7c41e9a0b3d25f86-e1";

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Api,
    Worker,
}

/// One `oncely` process, restartable.
pub(crate) struct Proc {
    pub(crate) role: Role,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    addr: Option<SocketAddr>,
    child: Option<Child>,
}

impl Proc {
    pub(crate) async fn start(&mut self, oncely: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(oncely)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("ONCELY_SECRET", SECRET)
            // The webhook endpoint is the inbox on loopback: allowed in development (the
            // fleet's mode), and in production only with this.
            .env("ONCELY_WEBHOOK_ALLOW_PRIVATE", "true")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", oncely.display()))?;
        self.child = Some(child);
        if let Some(addr) = self.addr {
            wait_ready(addr).await?;
        }
        Ok(())
    }

    /// Whether the process has exited (by itself: a killed one has no child left).
    pub(crate) fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().is_ok_and(|status| status.is_some()))
    }

    /// Whether an API answers `/readyz` within `within` (a worker: whether it runs).
    pub(crate) async fn ready_within(&mut self, within: Duration) -> bool {
        match self.addr {
            Some(addr) => wait_ready_within(addr, within).await.is_ok(),
            None => !self.exited(),
        }
    }

    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await; // SIGKILL
        }
    }
}

/// The running processes and the API endpoints among them.
pub(crate) struct Fleet {
    pub(crate) procs: Vec<Proc>,
    pub(crate) endpoints: Vec<reqwest::Url>,
}

impl Fleet {
    /// Kills every process (the end of the run).
    pub(crate) async fn stop(&mut self) {
        for proc in &mut self.procs {
            proc.kill().await;
        }
    }
}

/// Migrates the database, then starts three APIs (no workers of their own) and two worker
/// processes delivering through `mailer` (with the flags `unknown` about unknown outcomes),
/// logging into `logs`.
pub(crate) async fn start(
    config: &Config,
    mailer: &str,
    unknown: &[String],
    logs: &Path,
) -> anyhow::Result<Fleet> {
    let status = Command::new(&config.oncely)
        .args(["migrate", "--database-url", &config.database_url])
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .env("ONCELY_SECRET", SECRET)
        .stdout(Stdio::null())
        .status()
        .await?;
    anyhow::ensure!(status.success(), "oncely migrate failed");

    let pause_probe = format!("{}ms", config.pause_probe.as_millis());
    let retry_base = format!("{}ms", config.retry_base.as_millis());
    let common = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(
            [
                "--database-url",
                &config.database_url,
                "--mailer",
                mailer,
                "--lease",
                "3s",
                "--pause-probe",
                &pause_probe,
                "--retry-base",
                &retry_base,
                // 5 processes × (10 + the outbox's listener and notifier) = 60 stay well under
                // PostgreSQL's default 100 connections, shared with the audit and other tests.
                "--database-pool",
                "10",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        // What an unknown outcome leads to (`--on-unknown`, `--mailer-lookup`).
        args.extend(unknown.iter().cloned());
        args
    };
    let mut procs = Vec::new();
    for i in 0..3 {
        let addr = free_port()?;
        let bind = addr.to_string();
        procs.push(Proc {
            role: Role::Api,
            args: common(&[
                "serve",
                "--workers",
                "0",
                "--bind",
                &bind,
                "--mail-cap-per-client",
                "1000000000",
                "--mail-cap-per-address",
                "1000000000",
            ]),
            env: config.env.clone(),
            log: logs.join(format!("api-{i}.log")),
            addr: Some(addr),
            child: None,
        });
    }
    for i in 0..2 {
        procs.push(Proc {
            role: Role::Worker,
            args: common(&["worker", "--workers", "2"]),
            env: config.env.clone(),
            log: logs.join(format!("worker-{i}.log")),
            addr: None,
            child: None,
        });
    }
    for proc in &mut procs {
        proc.start(&config.oncely).await?;
    }
    let endpoints = procs
        .iter()
        .filter_map(|p| p.addr)
        .map(|a| format!("http://{a}").parse())
        .collect::<Result<Vec<reqwest::Url>, _>>()?;
    Ok(Fleet { procs, endpoints })
}

/// Adds the default tenant's (the storm's) webhook endpoint at `url` receiving `user.created`
/// (`oncely tenant webhook add default URL --events user.created --json`); returns its signing
/// secret (`whsec_…`), which is printed this once.
pub(crate) async fn add_webhook(config: &Config, url: &str) -> anyhow::Result<String> {
    let output = Command::new(&config.oncely)
        .args(["tenant", "webhook", "add", "default", url])
        .args(["--events", "user.created", "--json"])
        .args(["--database-url", &config.database_url])
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .env("ONCELY_SECRET", SECRET)
        .env("ONCELY_WEBHOOK_ALLOW_PRIVATE", "true")
        .stdin(Stdio::null())
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "oncely tenant webhook add failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let added: serde_json::Value = serde_json::from_slice(&output.stdout)
        .context("oncely tenant webhook add --json printed no JSON")?;
    let secret = added["secret"]
        .as_str()
        .context("oncely tenant webhook add --json printed no secret")?;
    Ok(secret.to_owned())
}

async fn wait_ready(addr: SocketAddr) -> anyhow::Result<()> {
    wait_ready_within(addr, Duration::from_secs(20)).await
}

async fn wait_ready_within(addr: SocketAddr, within: Duration) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(r) = http.get(format!("http://{addr}/readyz")).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("oncely serve on {addr} did not become ready")
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}
