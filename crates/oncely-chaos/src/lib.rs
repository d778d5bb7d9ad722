//! The chaos run behind `scripts/chaos` (and its short form in the test suite).
//!
//! Real processes on loopback: `oncely serve --workers 0` three times, `oncely worker` twice, and
//! the test inbox in this process (provider mode, or plain SMTP). A storm of signups, each one a
//! logical intent with its own key, sent through `oncely-client` round-robin to the three APIs
//! and retried until it has a final answer. Meanwhile processes are SIGKILLed at random moments
//! and restarted, PostgreSQL is restarted once (if a command for it is given), and the inbox
//! rejects or accepts-then-drops a share of deliveries. At the end the database and the inbox are
//! audited: every acknowledged intent must have exactly one account and one email.
//!
//! The run also scans every process log and every database column for the addresses and the
//! tokens the run produced: none may appear in a log line, and no token may appear in the
//! database (only its hash is stored).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use oncely_client::{Client, Operation, RetryPolicy};
use oncely_inbox::{Faults, Inbox, Rejection};
use rand::Rng;
use serde::Serialize;
use sqlx::{PgPool, Row};
use tokio::process::{Child, Command};

/// How the workers deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// The inbox's Resend-compatible API, deduplicating by the idempotency key (like real
    /// providers): expected 0 duplicates.
    Provider,
    /// Plain SMTP, which cannot deduplicate: a send whose answer was lost is sent again, and the
    /// duplicates are counted.
    Smtp,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `oncely` binary.
    pub oncely: PathBuf,
    /// A PostgreSQL database of its own (migrated by the run).
    pub database_url: String,
    /// Logical intents (signups) in the storm.
    pub intents: usize,
    /// Intents in flight at once.
    pub concurrency: usize,
    /// Time between two kills: drawn from this range.
    pub kill_every: (Duration, Duration),
    /// A shell command that restarts PostgreSQL, run once in the middle of the storm.
    pub restart_postgres: Option<String>,
    /// Share of delivery attempts the inbox fails, during the storm and the drain after it (half
    /// rejected with a temporary error, half accepted and then the connection dropped).
    pub fault_rate: f64,
    /// How the workers deliver.
    pub delivery: Delivery,
    /// The storm and the drain after it must end within this.
    pub time_limit: Duration,
    /// Keep the process logs here (otherwise a temporary directory, removed at the end).
    pub logs: Option<PathBuf>,
}

impl Config {
    /// A short run: a few seconds, no PostgreSQL restart.
    pub fn short(oncely: PathBuf, database_url: String) -> Self {
        Self {
            oncely,
            database_url,
            intents: 150,
            concurrency: 12,
            kill_every: (Duration::from_millis(300), Duration::from_millis(800)),
            restart_postgres: None,
            fault_rate: 0.1,
            delivery: Delivery::Provider,
            time_limit: Duration::from_secs(120),
            logs: None,
        }
    }
}

/// What the audit found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// How the workers delivered.
    pub delivery: Option<Delivery>,
    /// Intents sent.
    pub intents: u64,
    /// Intents that got a 2xx.
    pub acknowledged: u64,
    /// Intents that got a final 4xx (none expected).
    pub rejected: u64,
    /// Intents the client gave up on (none expected).
    pub unanswered: u64,
    /// HTTP attempts the storm made (retries included).
    pub attempts: u64,
    /// Answers that were replays.
    pub replayed: u64,
    /// Accounts in the database for the run's addresses.
    pub users: u64,
    /// Acknowledged intents with no account.
    pub users_missing: u64,
    /// Emails received by the inbox (distinct deliveries).
    pub emails: u64,
    /// Acknowledged intents with no email (and no dead job to explain it).
    pub lost: u64,
    /// Emails beyond the first per address.
    pub duplicates: u64,
    /// Duplicates per million acknowledged intents.
    pub duplicates_per_million: f64,
    /// Outbox rows by status.
    pub jobs: BTreeMap<String, u64>,
    /// Dead outbox rows by reason.
    pub dead_reasons: BTreeMap<String, u64>,
    /// API processes killed.
    pub api_kills: u64,
    /// Worker processes killed.
    pub worker_kills: u64,
    /// PostgreSQL restarts.
    pub postgres_restarts: u64,
    /// Inbox counters: attempts, rejected, dropped after accept, deduplicated.
    pub inbox: BTreeMap<String, u64>,
    /// Log lines that contain one of the run's addresses.
    pub addresses_in_logs: u64,
    /// Log lines that contain one of the run's raw tokens.
    pub tokens_in_logs: u64,
    /// Database values that contain one of the run's raw tokens.
    pub tokens_in_database: u64,
    /// Idempotency-key rows that contain one of the run's addresses.
    pub addresses_in_key_table: u64,
    /// Seconds from the first intent to the end of the drain.
    pub seconds: f64,
}

impl Report {
    /// Whether the run kept the promise: nothing lost, nothing unanswered, no leaks; and in
    /// provider mode no duplicates.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.users_missing == 0
            && self.unanswered == 0
            && self.rejected == 0
            && self.jobs.get("pending").copied().unwrap_or(0) == 0
            && self.addresses_in_logs == 0
            && self.tokens_in_logs == 0
            && self.tokens_in_database == 0
            && self.addresses_in_key_table == 0
            && (self.delivery != Some(Delivery::Provider) || self.duplicates == 0)
    }
}

const SECRET: &str = "chaos-secret-chaos-secret-chaos-secret";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Api,
    Worker,
}

/// One `oncely` process, restartable.
struct Proc {
    role: Role,
    args: Vec<String>,
    log: PathBuf,
    addr: Option<SocketAddr>,
    child: Option<Child>,
}

impl Proc {
    async fn start(&mut self, oncely: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(oncely)
            .args(&self.args)
            .env("ONCELY_SECRET", SECRET)
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

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await; // SIGKILL
        }
    }
}

async fn wait_ready(addr: SocketAddr) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
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

/// Runs the chaos and the audit.
pub async fn run(config: &Config) -> anyhow::Result<Report> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir()?;
    let logs = match &config.logs {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    let faults = |reject: u32, drop: u32| Faults {
        reject_next: reject,
        rejection: Rejection::Temporary,
        drop_after_accept: drop,
        dedupe_window_ms: (config.delivery == Delivery::Provider).then_some(24 * 3600 * 1000),
        ..Faults::default()
    };
    let (inbox, running) = Inbox::start_local(faults(0, 0)).await?;
    let mailer = match config.delivery {
        Delivery::Provider => format!("http://{}/emails", running.http_addr),
        Delivery::Smtp => format!("smtp://{}", running.smtp_addr),
    };

    let status = Command::new(&config.oncely)
        .args(["migrate", "--database-url", &config.database_url])
        .env("ONCELY_SECRET", SECRET)
        .stdout(Stdio::null())
        .status()
        .await?;
    anyhow::ensure!(status.success(), "oncely migrate failed");

    let common = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(
            [
                "--database-url",
                &config.database_url,
                "--mailer",
                &mailer,
                "--lease",
                "3s",
                // 5 processes × 12 stay under PostgreSQL's default 100 connections.
                "--database-pool",
                "12",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
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
            log: logs.join(format!("api-{i}.log")),
            addr: Some(addr),
            child: None,
        });
    }
    for i in 0..2 {
        procs.push(Proc {
            role: Role::Worker,
            args: common(&["worker", "--workers", "2"]),
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

    let started = Instant::now();
    let deadline = started + config.time_limit;
    let run_id: u32 = rand::random();
    let addresses: Vec<String> = (0..config.intents)
        .map(|i| format!("chaos-{run_id}-{i}@example.com"))
        .collect();

    // The monkey: kills and restarts processes, restarts PostgreSQL once, injects inbox faults.
    let storm_over = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let monkey = {
        let storm_over = storm_over.clone();
        let answered = answered.clone();
        let config = config.clone();
        tokio::spawn(async move {
            let mut report = Report::default();
            let mut restarted_pg = config.restart_postgres.is_none();
            let halfway = (config.intents / 2) as u64;
            while !storm_over.load(Ordering::Relaxed) {
                let (low, high) = config.kill_every;
                let pause = rand::rng().random_range(low..=high.max(low));
                tokio::time::sleep(pause).await;
                if storm_over.load(Ordering::Relaxed) {
                    break;
                }
                if !restarted_pg && answered.load(Ordering::Relaxed) >= halfway {
                    let command = config.restart_postgres.as_deref().unwrap_or_default();
                    eprintln!("chaos: restarting PostgreSQL: {command}");
                    let ok = Command::new("sh")
                        .args(["-c", command])
                        .status()
                        .await
                        .is_ok_and(|s| s.success());
                    if !ok {
                        return Err(anyhow::anyhow!("restarting PostgreSQL failed: {command}"));
                    }
                    report.postgres_restarts += 1;
                    restarted_pg = true;
                    continue;
                }
                let victim = rand::rng().random_range(0..procs.len());
                let proc = &mut procs[victim];
                proc.kill().await;
                match proc.role {
                    Role::Api => report.api_kills += 1,
                    Role::Worker => report.worker_kills += 1,
                }
                let down = Duration::from_millis(rand::rng().random_range(0..300));
                tokio::time::sleep(down).await;
                // After a PostgreSQL restart a process may fail to start for a moment: retry.
                let mut tries = 0;
                while let Err(error) = proc.start(&config.oncely).await {
                    tries += 1;
                    if tries > 20 {
                        return Err(error.context("a process would not restart"));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            Ok((report, procs))
        })
    };

    // The fault injector, until the drain ends: every 50 ms, owes the inbox fault_rate of the
    // attempts it saw since the last tick, alternately as an accept-then-drop and a rejection.
    let drained = Arc::new(AtomicBool::new(false));
    let injector = {
        let drained = drained.clone();
        let inbox = inbox.clone();
        let rate = config.fault_rate.clamp(0.0, 1.0);
        tokio::spawn(async move {
            let (mut seen, mut owed, mut reject) = (0u64, 0.0f64, false);
            while !drained.load(Ordering::Relaxed) && rate > 0.0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let attempts = inbox.stats().attempts;
                owed += rate * attempts.saturating_sub(seen) as f64;
                seen = attempts;
                let mut faults = inbox.faults();
                while owed >= 1.0 {
                    owed -= 1.0;
                    if reject {
                        faults.reject_next += 1;
                    } else {
                        faults.drop_after_accept += 1;
                    }
                    reject = !reject;
                }
                inbox.set_faults(faults);
            }
        })
    };

    // The storm: every intent retried with its key until it has a final answer.
    let client = Client::with_endpoints(endpoints).policy(RetryPolicy {
        max_attempts: u32::MAX,
        initial_delay: Duration::from_millis(50),
        max_delay: Duration::from_secs(1),
        max_retry_after: Duration::from_secs(2),
        deadline: deadline.saturating_duration_since(Instant::now()),
        attempt_timeout: Duration::from_secs(10),
    });
    let attempts = Arc::new(AtomicU64::new(0));
    let answers: Vec<_> = futures::stream::iter(addresses.iter().cloned())
        .map(|email| {
            let client = client.clone();
            let attempts = attempts.clone();
            let answered = answered.clone();
            async move {
                let op =
                    Operation::post("/v1/signup").json(&serde_json::json!({ "email": email }))?;
                let answer = client.send(&op).await;
                answered.fetch_add(1, Ordering::Relaxed);
                if let Ok(a) = &answer {
                    attempts.fetch_add(u64::from(a.attempts), Ordering::Relaxed);
                } else if let Err(oncely_client::Error::GaveUp { attempts: n, .. }) = &answer {
                    attempts.fetch_add(u64::from(*n), Ordering::Relaxed);
                }
                anyhow::Ok(answer)
            }
        })
        .buffer_unordered(config.concurrency.max(1))
        .collect()
        .await;
    storm_over.store(true, Ordering::Relaxed);
    let (mut report, mut procs) = monkey.await??;
    report.delivery = Some(config.delivery);
    report.intents = config.intents as u64;
    report.attempts = attempts.load(Ordering::Relaxed);
    for answer in answers {
        match answer? {
            Ok(a) if a.is_success() => {
                report.acknowledged += 1;
                report.replayed += u64::from(a.replayed);
            }
            Ok(_) => report.rejected += 1,
            Err(_) => report.unanswered += 1,
        }
    }

    // Drain: every worker up, faults still on, until nothing is pending (a job failed by a
    // fault waits for its retry delay: 2 s, then 4 s, …).
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&config.database_url)
        .await?;
    loop {
        let pending: Result<i64, _> =
            sqlx::query_scalar("SELECT count(*) FROM oncely_outbox WHERE status = 'pending'")
                .fetch_one(&pool)
                .await;
        if pending.is_ok_and(|n| n == 0) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drained.store(true, Ordering::Relaxed);
    injector.await?;
    inbox.set_faults(faults(0, 0));
    report.seconds = started.elapsed().as_secs_f64();
    for proc in &mut procs {
        proc.kill().await;
    }

    audit(&mut report, &pool, &inbox, &addresses, &logs, run_id).await?;
    pool.close().await;
    Ok(report)
}

async fn audit(
    report: &mut Report,
    pool: &PgPool,
    inbox: &Inbox,
    addresses: &[String],
    logs: &Path,
    run_id: u32,
) -> anyhow::Result<()> {
    let prefix = format!("chaos-{run_id}-%");
    report.users =
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM oncely_users WHERE email LIKE $1")
            .bind(&prefix)
            .fetch_one(pool)
            .await? as u64;
    report.users_missing = report.acknowledged.saturating_sub(report.users);
    for row in sqlx::query("SELECT status, count(*) AS n FROM oncely_outbox GROUP BY status")
        .fetch_all(pool)
        .await?
    {
        report
            .jobs
            .insert(row.try_get("status")?, row.try_get::<i64, _>("n")? as u64);
    }
    for row in sqlx::query(
        "SELECT coalesce(last_error, '?') AS reason, count(*) AS n FROM oncely_outbox
          WHERE status = 'dead' GROUP BY 1",
    )
    .fetch_all(pool)
    .await?
    {
        report
            .dead_reasons
            .insert(row.try_get("reason")?, row.try_get::<i64, _>("n")? as u64);
    }

    let messages = inbox.messages(None);
    report.emails = messages.len() as u64;
    let mut per_address: HashMap<&str, u64> = HashMap::new();
    let mut tokens = HashSet::new();
    for message in &messages {
        for to in &message.to {
            *per_address.entry(to.as_str()).or_default() += 1;
        }
        tokens.extend(tokens_in(&message.text));
    }
    anyhow::ensure!(
        tokens.iter().all(|t| t.len() == 43),
        "a link carried a token that is not 43 characters"
    );
    let dead = report.jobs.get("dead").copied().unwrap_or(0);
    let received = addresses
        .iter()
        .filter(|a| per_address.contains_key(a.as_str()))
        .count() as u64;
    report.lost = report.acknowledged.saturating_sub(received + dead);
    report.duplicates = per_address.values().map(|n| n.saturating_sub(1)).sum();
    report.duplicates_per_million = if report.acknowledged == 0 {
        0.0
    } else {
        report.duplicates as f64 * 1e6 / report.acknowledged as f64
    };
    let stats = inbox.stats();
    report.inbox = BTreeMap::from([
        ("attempts".into(), stats.attempts),
        ("rejected".into(), stats.rejected),
        ("dropped_after_accept".into(), stats.dropped),
        ("deduplicated".into(), stats.deduplicated),
    ]);

    // Leaks: addresses and tokens in log lines; tokens anywhere in the database; addresses in
    // the idempotency table.
    let marker = format!("chaos-{run_id}-");
    for entry in std::fs::read_dir(logs)? {
        let text = std::fs::read_to_string(entry?.path())?;
        for line in text.lines() {
            report.addresses_in_logs += u64::from(line.contains(&marker));
            report.tokens_in_logs += u64::from(contains_any(line, &tokens));
        }
    }
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
          WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_all(pool)
    .await?;
    for table in tables {
        let sql = format!("SELECT t::text FROM \"{table}\" t");
        let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await?;
        for row in &rows {
            report.tokens_in_database += u64::from(contains_any(row, &tokens));
            if table == "oncely_idempotency_keys" {
                report.addresses_in_key_table += u64::from(row.contains(&marker));
            }
        }
    }
    Ok(())
}

/// Whether `text` contains one of `tokens` (all 43 URL-safe characters): every 43-character
/// window of every run of URL-safe characters is looked up, so the scan is linear in the text.
fn contains_any(text: &str, tokens: &HashSet<String>) -> bool {
    const LEN: usize = 43;
    let bytes = text.as_bytes();
    let url_safe = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    let mut start = 0;
    while start < bytes.len() {
        if !url_safe(bytes[start]) {
            start += 1;
            continue;
        }
        let end = (start..bytes.len())
            .find(|&i| !url_safe(bytes[i]))
            .unwrap_or(bytes.len());
        if end - start >= LEN && (start..=end - LEN).any(|i| tokens.contains(&text[i..i + LEN])) {
            return true;
        }
        start = end;
    }
    false
}

/// The raw tokens in an email's text: the value of every `token=` parameter.
pub fn tokens_in(text: &str) -> Vec<String> {
    text.match_indices("token=")
        .map(|(at, _)| {
            text[at + 6..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect::<String>()
        })
        .filter(|t| t.len() >= 16)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_found_anywhere_in_a_line_and_nothing_else_matches() {
        let token = "A".repeat(21) + "-" + &"b".repeat(21);
        let tokens = HashSet::from([token.clone()]);
        assert!(contains_any(&format!("x {token} y"), &tokens));
        assert!(contains_any(&format!("{{\"t\":\"zz{token}zz\"}}"), &tokens));
        assert!(!contains_any(&token[1..], &tokens));
        assert!(!contains_any(&"A".repeat(100), &tokens));
        assert!(!contains_any("", &tokens));
    }

    #[test]
    fn tokens_are_found_in_links() {
        let text = "Verify: http://x/v1/verify?token=abcdefghijklmnop_QRS-123&x=1\nbye token=short";
        assert_eq!(
            tokens_in(text),
            vec!["abcdefghijklmnop_QRS-123".to_string()]
        );
    }
}
