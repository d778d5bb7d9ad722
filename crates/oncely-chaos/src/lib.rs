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
//! Before the storm the default tenant (the one the storm signs up on) gets a webhook endpoint
//! at the inbox, `http://<inbox>/webhooks/chaos`, receiving `user.created`; the inbox knows its
//! signing secret and verifies every copy. The webhook intake is faulted like mail (a share of
//! deliveries rejected with a 503, a share accepted and then the connection dropped), and the
//! audit checks that every account the run created has one event id, delivered (verified) at
//! least once: duplicates by `webhook-id` are counted, as a receiver dedupes by it.
//!
//! The run also scans every process log and every database column for the addresses and the
//! tokens the run produced: none may appear in a log line, and no token may appear in the
//! database (only its hash is stored).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use oncely_inbox::{Faults, Inbox, Rejection};
use serde::Serialize;

mod audit;
pub mod failover;
mod fleet;
mod monkey;
pub mod patroni;
mod storm;

pub use audit::tokens_in;

/// The inbox's name for the run's webhook endpoint (`/webhooks/chaos`).
pub const WEBHOOK_NAME: &str = "chaos";

/// How the workers deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// The inbox's Resend-compatible API, deduplicating by the idempotency key (like real
    /// providers): expected 0 duplicates.
    Provider,
    /// Plain SMTP, which cannot deduplicate. The workers reconcile (the service's default over
    /// SMTP): a send whose answer was lost is parked and settled by asking the inbox's delivery
    /// lookup (`--mailer-lookup`), never resent blindly — expected 0 duplicates. With
    /// [`Config::resend_unknown`], they resend it instead, and the duplicates are counted.
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
    /// At most this many new intents per second (`None`: as fast as `concurrency` allows) — a
    /// steady load whose second half outlasts a fault made in its middle.
    pub rate: Option<f64>,
    /// Whether oncely's processes are SIGKILLed and restarted at random moments. Without kills
    /// the monkey watches them instead: one that exits by itself is restarted and counted in
    /// [`Report::restarts_needed`], and so is one that is not ready or does not drain after
    /// the storm.
    pub kills: bool,
    /// Time between two kills: drawn from this range.
    pub kill_every: (Duration, Duration),
    /// A shell command that restarts PostgreSQL, run once in the middle of the storm.
    pub restart_postgres: Option<String>,
    /// A primary and its standby (`database_url` leads through their proxy): in the middle of
    /// the storm the primary is SIGKILLed and the standby promoted.
    pub failover: Option<Arc<failover::Pair>>,
    /// A fault of a Patroni cluster (`database_url` leads to it by one of its routes), made in
    /// the middle of the storm.
    pub patroni: Option<Arc<patroni::Fault>>,
    /// Settings every `oncely` process gets besides `--database-url` (a route's pooler
    /// settings).
    pub env: Vec<(String, String)>,
    /// The URL this process itself uses for the drain and the audit, if not `database_url`
    /// (behind a pooler, or a multi-host URL its driver cannot take).
    pub own_url: Option<String>,
    /// Share of delivery attempts the inbox fails, during the storm and the drain after it (half
    /// rejected with a temporary error, half accepted and then the connection dropped); the
    /// same share of webhook deliveries (half rejected with a 503, half accepted then dropped).
    pub fault_rate: f64,
    /// How the workers deliver.
    pub delivery: Delivery,
    /// Over SMTP, resend an email whose outcome is unknown (`--on-unknown resend`, the
    /// behaviour before reconciling) instead of reconciling it: what the duplicates cost.
    pub resend_unknown: bool,
    /// Reconciling over SMTP: how long the workers wait before they believe the inbox's "not
    /// accepted" (`--lookup-grace`; the service's default is 10 minutes, the inbox here decides
    /// at once: no delay fault holds a message).
    pub lookup_grace: Duration,
    /// The provider throttles every this-many-th delivery attempt (HTTP 429 / SMTP 450, with
    /// `Retry-After: retry_after_s`), from the start to the end of the drain; 0: never.
    pub throttle_every: u32,
    /// The `Retry-After` of a throttled attempt, in seconds.
    pub retry_after_s: u64,
    /// Once a third of the storm is answered, the provider refuses our credentials (HTTP 401 /
    /// SMTP 535) on every attempt for this long — an API key rotated at the provider before the
    /// service got the new one; `None`: never.
    pub credentials_outage: Option<Duration>,
    /// The workers' first retry delay (`--retry-base`; doubling, jittered).
    pub retry_base: Duration,
    /// How often a worker probes a kind it paused because the provider refused our credentials
    /// (`--pause-probe` of the workers).
    pub pause_probe: Duration,
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
            rate: None,
            kills: true,
            kill_every: (Duration::from_millis(300), Duration::from_millis(800)),
            restart_postgres: None,
            failover: None,
            patroni: None,
            env: Vec::new(),
            own_url: None,
            fault_rate: 0.1,
            delivery: Delivery::Provider,
            resend_unknown: false,
            lookup_grace: Duration::from_secs(5),
            throttle_every: 10,
            retry_after_s: 1,
            credentials_outage: Some(Duration::from_secs(2)),
            pause_probe: Duration::from_secs(1),
            // Short: the drain does not wait out long backoffs of unlucky jobs.
            retry_base: Duration::from_millis(250),
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
    /// Whether the workers resent emails whose outcome was unknown (plain SMTP, the old way):
    /// then duplicates are counted, not failed.
    pub resends_unknown: bool,
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
    /// Acknowledged intents with no email (address by address; a dead job explains none: dead
    /// jobs fail the run on their own).
    pub lost: u64,
    /// Emails beyond the first per address.
    pub duplicates: u64,
    /// Duplicates per million acknowledged intents.
    pub duplicates_per_million: f64,
    /// Outbox rows by status.
    pub jobs: BTreeMap<String, u64>,
    /// Email jobs with an attempt whose outcome was unknown (`unknown`: the answer was lost;
    /// `abandoned`: the worker died mid-attempt).
    pub unknown_outcomes: u64,
    /// Email jobs that were parked instead of resent (their kind reconciles).
    pub parked: u64,
    /// Parked jobs settled as sent (the provider had accepted them): recorded, not resent.
    pub settled_sent: u64,
    /// Parked jobs settled for resending (the provider had not accepted them).
    pub settled_resend: u64,
    /// The email attempts killed workers abandoned, by their point of no return.
    pub abandoned: Abandoned,
    /// Attempts by result (`sent`, `retry`, `unknown`, `throttled`, `paused`, …).
    pub attempts_by_result: BTreeMap<String, u64>,
    /// How long the provider refused our credentials (milliseconds; 0: not at all).
    pub credentials_outage_ms: u64,
    /// Dead outbox rows by reason.
    pub dead_reasons: BTreeMap<String, u64>,
    /// API processes killed.
    pub api_kills: u64,
    /// Worker processes killed.
    pub worker_kills: u64,
    /// PostgreSQL restarts.
    pub postgres_restarts: u64,
    /// Processes of oncely that had to be restarted without having been killed: exited by
    /// themselves, not ready 30 s after the storm, or (workers) with jobs pending and none sent
    /// for 30 s after it. Counted when the run does not kill ([`Config::kills`]); goal 0.
    pub restarts_needed: u64,
    /// What the storm's client met, attempt by attempt (retries included).
    pub availability: Availability,
    /// The Patroni cluster's fault, when the run had one.
    pub patroni: Option<patroni::FaultReport>,
    /// The failover, when the run had a primary and a standby.
    pub failover: Option<failover::FailoverReport>,
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
    /// The `user.created` webhooks to the inbox's endpoint `chaos`.
    pub webhooks: WebhookReport,
    /// Seconds from the first intent to the end of the drain.
    pub seconds: f64,
    /// Seconds from the first intent to the last answer of the storm.
    pub storm_seconds: f64,
}

/// What the storm's client met, attempt by attempt: the figures of a failover as a client sees
/// them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Availability {
    /// Attempts answered 2xx.
    pub answers_2xx: u64,
    /// Attempts answered 503 (storage unavailable, commit failed: retried with the key).
    pub answers_503: u64,
    /// Attempts answered with another 5xx.
    pub answers_other_5xx: u64,
    /// Attempts answered 409 or 429 (the key in flight, busy).
    pub answers_409_429: u64,
    /// Attempts with no answer (connection refused or broken, timed out).
    pub no_answer: u64,
    /// The longest stretch of the storm without any 2xx answer, in seconds.
    pub longest_without_2xx_s: f64,
    /// When it began, in seconds from the storm's start.
    pub longest_without_2xx_from_s: f64,
}

/// The email attempts that killed workers abandoned (`abandoned`: the next claim found them
/// open), by where they stood with their point of no return — the moment the message's data is
/// handed over (SMTP: after `DATA` was accepted, before the content) — which each attempt
/// records in its row before it sends anything; and what the inbox received during each (a copy
/// under the job's key, received between the attempt's start and its end).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Abandoned {
    /// Abandoned email attempts.
    pub attempts: u64,
    /// Still ahead of their point of no return: nothing was handed over; retried as any retry.
    pub before_handover: u64,
    /// Of those, the inbox received a copy during the attempt: 0, or the mark is wrong.
    pub before_handover_received: u64,
    /// Past their point of no return: the message may have arrived; parked.
    pub after_handover: u64,
    /// Of those, the inbox had the whole message (the worker died after the end of `DATA`,
    /// before its answer was recorded).
    pub after_handover_received: u64,
    /// Of those, the inbox had no copy: sends cut off during `DATA`.
    pub cut_during_data: u64,
    /// With no mark (an earlier release's attempt, a handler without the hook): parked.
    pub unmarked: u64,
    /// Email attempts recorded `parked`: each is the claim after an abandoned attempt that
    /// passed its point of no return or has no mark (`after_handover + unmarked`).
    pub parked: u64,
}

/// What the audit found of the webhook endpoint `chaos` (the default tenant's, `user.created`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct WebhookReport {
    /// Events expected: the accounts the run created (one `user.created` each).
    pub expected: u64,
    /// Distinct event ids among the run's webhook jobs (`user.created` of the run's accounts).
    pub events: u64,
    /// Accounts of the run whose webhook jobs carry no event id, or more than one.
    pub accounts_without_one_event: u64,
    /// Event ids that the jobs of more than one account carry (one id per state change: 0).
    pub ids_shared: u64,
    /// Distinct `webhook-id`s the inbox accepted with a verified signature.
    pub received: u64,
    /// Accounts whose event never arrived (verified) and has no dead webhook job.
    pub lost: u64,
    /// Verified copies beyond the first per `webhook-id` (at-least-once: the receiver dedupes).
    pub duplicates: u64,
    /// Duplicates per million expected events.
    pub duplicates_per_million: f64,
    /// Copies refused for a missing, stale or wrong signature.
    pub invalid: u64,
    /// Copies accepted without a check (no secret known to the inbox: 0 expected).
    pub unverified: u64,
    /// Verified `webhook-id`s that are no event of the run's jobs (0 expected).
    pub unknown_ids: u64,
    /// Webhook outbox rows by status.
    pub jobs: BTreeMap<String, u64>,
    /// Dead webhook jobs (a dead one explains a missing event: not lost, but reported).
    pub dead: u64,
    /// The inbox's webhook counters: attempts, rejected (injected 503), dropped after accept.
    pub inbox: BTreeMap<String, u64>,
}

impl Report {
    /// Whether the run kept the promise: nothing lost, nothing unanswered, no leaks, never
    /// another payload under a key; in provider mode no duplicate email; and no webhook event
    /// lost or badly signed, each created account with one event id of its own.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.users_missing == 0
            && self.unanswered == 0
            && self.rejected == 0
            && self.jobs.get("pending").copied().unwrap_or(0) == 0
            // None of the run's faults is the message's: nothing may die of them.
            && self.jobs.get("dead").copied().unwrap_or(0) == 0
            // Nothing left parked: the reconciler settled every unknown outcome.
            && self.jobs.get("unknown").copied().unwrap_or(0) == 0
            // Nothing reached the inbox from an attempt abandoned before its point of no
            // return: it was retried as any retry, which is right only if so.
            && self.abandoned.before_handover_received == 0
            // A failover asked for took place.
            && self.failover.as_ref().is_none_or(|f| f.failovers == 1)
            // A Patroni fault asked for took place, and no oncely process needed a restart.
            // (and the storm outlasted it: its figures cover the fault)
            && self
                .patroni
                .as_ref()
                .is_none_or(|p| p.faults == 1 && p.answered_at_writable < self.intents)
            && self.restarts_needed == 0
            && self.addresses_in_logs == 0
            && self.tokens_in_logs == 0
            && self.tokens_in_database == 0
            && self.addresses_in_key_table == 0
            && (self.resends_unknown || self.duplicates == 0)
            // One key, one payload: the provider never saw another payload under a key.
            && self.inbox.get("mismatched").copied().unwrap_or(0) == 0
            // Webhooks: every created account's one event arrived signed; duplicates by id are
            // counted, not failed (at-least-once delivery, one id).
            && self.webhooks.lost == 0
            && self.webhooks.invalid == 0
            && self.webhooks.accounts_without_one_event == 0
            && self.webhooks.ids_shared == 0
    }
}

/// The harness's own connections, for draining and the audit. Through a proxy in front of a
/// cluster that has just switched over (HAProxy closes its sessions when the old primary's
/// check fails; on a loaded machine that can come after the storm), a first connection may be
/// cut: it is tried again for up to a minute, as an operator's audit would.
async fn audit_pool(url: &str) -> anyhow::Result<sqlx::PgPool> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(url)
            .await;
        match attempt {
            Ok(pool) => return Ok(pool),
            Err(error) if Instant::now() < until => {
                eprintln!("chaos: connecting for the audit failed ({error}); trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Runs the chaos and the audit: [`fleet::start`], then the [`storm`] while the [`monkey`]
/// kills, then the drain and the [`audit`].
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
    let faults = |reject: u32, drop: u32, throttle_every: u32| Faults {
        reject_next: reject,
        rejection: Rejection::Temporary,
        drop_after_accept: drop,
        dedupe_window_ms: (config.delivery == Delivery::Provider).then_some(24 * 3600 * 1000),
        throttle_every,
        retry_after_s: config.retry_after_s,
        ..Faults::default()
    };
    // Every copy is kept for the audit, however long the run.
    let inbox = Inbox::with_config(oncely_inbox::Config {
        retention: oncely_inbox::Retention {
            max_messages: usize::MAX,
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: usize::MAX,
        },
        ..oncely_inbox::Config::default()
    });
    let (inbox, running) = inbox
        .start_local_with(faults(0, 0, config.throttle_every))
        .await?;
    let mailer = match config.delivery {
        Delivery::Provider => format!("http://{}/emails", running.http_addr),
        Delivery::Smtp => format!("smtp://{}", running.smtp_addr),
    };
    let resends_unknown = config.delivery == Delivery::Smtp && config.resend_unknown;
    let unknown = match config.delivery {
        Delivery::Smtp if resends_unknown => vec!["--on-unknown".to_owned(), "resend".to_owned()],
        // Reconciling, the SMTP default: asking the inbox what it accepted.
        Delivery::Smtp => vec![
            "--mailer-lookup".to_owned(),
            format!("http://{}/deliveries/{{key}}", running.http_addr),
            "--lookup-grace".to_owned(),
            format!("{}ms", config.lookup_grace.as_millis()),
        ],
        Delivery::Provider => Vec::new(),
    };
    let fleet = fleet::start(config, &mailer, &unknown, &logs).await?;
    let webhook_url = format!("http://{}/webhooks/{WEBHOOK_NAME}", running.http_addr);
    let secret = fleet::add_webhook(config, &webhook_url).await?;
    inbox.set_webhook_secrets(WEBHOOK_NAME, [secret.as_str()])?;
    drop(secret);
    let endpoints = fleet.endpoints.clone();

    let started = Instant::now();
    let deadline = started + config.time_limit;
    let run_id: u32 = rand::random();
    let addresses: Vec<String> = (0..config.intents)
        .map(|i| format!("chaos-{run_id}-{i}@example.com"))
        .collect();

    let progress = monkey::Progress::default();
    let mut monkey = monkey::spawn(config, fleet, progress.clone());
    let drained = Arc::new(AtomicBool::new(false));
    let outage = config.credentials_outage.map(|outage| monkey::Outage {
        after_answers: (config.intents / 3) as u64,
        lasting: outage,
        progress: progress.clone(),
    });
    let injector = monkey::inject_faults(inbox.clone(), config.fault_rate, outage, drained.clone());

    let mut report = Report {
        delivery: Some(config.delivery),
        resends_unknown,
        credentials_outage_ms: config
            .credentials_outage
            .map_or(0, |outage| outage.as_millis() as u64),
        ..Report::default()
    };
    // The monkey ends with the storm, or before it only when it failed (a process that would
    // not restart, a failed failover): then the run stops at once.
    let stormed = tokio::select! {
        stormed = storm::run(
            endpoints,
            &addresses,
            config.concurrency,
            config.rate,
            deadline,
            &progress,
            &mut report,
        ) => stormed,
        ended = &mut monkey => {
            ended??;
            anyhow::bail!("the monkey stopped before the storm ended");
        }
    };
    progress.storm_over.store(true, Ordering::Relaxed);
    report.storm_seconds = started.elapsed().as_secs_f64();
    let (mischief, mut fleet) = monkey.await??;
    let acknowledged = stormed?;
    mischief.add_to(&mut report);

    let pool = audit_pool(config.own_url.as_deref().unwrap_or(&config.database_url)).await?;
    if config.kills {
        // Drain: every worker up, faults still on, until nothing is pending.
        storm::drain(&pool, deadline).await;
    } else {
        // Nothing was killed: every process must be ready and the workers must drain on their
        // own; one that is not, or does not, is restarted and counted.
        for proc in &mut fleet.procs {
            if !proc.ready_within(Duration::from_secs(30)).await {
                eprintln!(
                    "chaos: an oncely process is not ready 30 s after the storm: restarting it"
                );
                report.restarts_needed += 1;
                monkey::restart(proc, config).await?;
            }
        }
        if !storm::drain_moving(&pool, deadline, Duration::from_secs(30)).await {
            eprintln!("chaos: the outbox stopped moving for 30 s: restarting the workers");
            for proc in fleet
                .procs
                .iter_mut()
                .filter(|p| p.role == fleet::Role::Worker)
            {
                report.restarts_needed += 1;
                monkey::restart(proc, config).await?;
            }
            storm::drain(&pool, deadline).await;
        }
    }
    drained.store(true, Ordering::Relaxed);
    injector.await?;
    inbox.set_faults(faults(0, 0, 0));
    report.seconds = started.elapsed().as_secs_f64();
    fleet.stop().await;
    report.failover = config.failover.as_ref().map(|pair| pair.report());
    report.patroni = config.patroni.as_ref().map(|fault| fault.report());

    audit::audit(
        &mut report,
        &pool,
        &inbox,
        (&addresses, &acknowledged),
        &logs,
        run_id,
    )
    .await?;
    pool.close().await;
    Ok(report)
}
