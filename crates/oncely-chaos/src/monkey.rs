//! The monkey: kills and restarts processes at random moments, restarts PostgreSQL once; and
//! the fault injector that makes the inbox fail a share of deliveries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use oncely_inbox::Inbox;
use rand::Rng;
use tokio::process::Command;
use tokio::task::JoinHandle;

use crate::fleet::{Fleet, Role};
use crate::{Config, Report};

/// What the storm shares with the monkey: whether it is over, how many intents have a final
/// answer (PostgreSQL is restarted, or the primary failed over, once half of them do).
#[derive(Clone, Default)]
pub(crate) struct Progress {
    pub(crate) storm_over: Arc<AtomicBool>,
    pub(crate) answered: Arc<AtomicU64>,
}

/// What the monkey did.
#[derive(Debug, Default)]
pub(crate) struct Mischief {
    api_kills: u64,
    worker_kills: u64,
    postgres_restarts: u64,
    restarts_needed: u64,
}

impl Mischief {
    pub(crate) fn add_to(&self, report: &mut Report) {
        report.api_kills += self.api_kills;
        report.worker_kills += self.worker_kills;
        report.postgres_restarts += self.postgres_restarts;
        report.restarts_needed += self.restarts_needed;
    }
}

/// Kills a random process every `config.kill_every` and restarts it after up to 300 ms, until
/// the storm is over; hands the fleet back with what it did. Without kills (`config.kills`
/// false) it watches instead: a process that exited by itself is restarted and counted as a
/// restart needed.
pub(crate) fn spawn(
    config: &Config,
    mut fleet: Fleet,
    progress: Progress,
) -> JoinHandle<anyhow::Result<(Mischief, Fleet)>> {
    let config = config.clone();
    tokio::spawn(async move {
        let mut mischief = Mischief::default();
        let mut restarted_pg = config.restart_postgres.is_none();
        let halfway = (config.intents / 2) as u64;
        // The failover (or the Patroni cluster's fault) runs beside the kills, as soon as half
        // the storm is answered.
        let at_halfway = |progress: Progress| async move {
            while progress.answered.load(Ordering::Relaxed) < halfway {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let mut failover = match (config.failover.clone(), config.patroni.clone()) {
            (Some(pair), _) => {
                let halfway = at_halfway(progress.clone());
                Some(tokio::spawn(async move {
                    halfway.await;
                    pair.fail_over().await
                }))
            }
            (None, Some(fault)) => {
                let halfway = at_halfway(progress.clone());
                let answered = progress.answered.clone();
                Some(tokio::spawn(async move {
                    halfway.await;
                    fault.make(&answered).await
                }))
            }
            (None, None) => None,
        };
        let over = || progress.storm_over.load(Ordering::Relaxed);
        while !over() {
            let (low, high) = config.kill_every;
            let pause = if config.kills {
                rand::rng().random_range(low..=high.max(low))
            } else {
                Duration::from_millis(250)
            };
            tokio::time::sleep(pause).await;
            if over() {
                break;
            }
            // A failed failover ends the run now, not at the storm's deadline.
            if let Some(done) = failover.take_if(|f| f.is_finished()) {
                done.await??;
            }
            if !config.kills {
                for proc in &mut fleet.procs {
                    if proc.exited() {
                        eprintln!("chaos: an oncely process exited by itself: restarting it");
                        mischief.restarts_needed += 1;
                        restart(proc, &config).await?;
                    }
                }
                continue;
            }
            if !restarted_pg && progress.answered.load(Ordering::Relaxed) >= halfway {
                restart_postgres(config.restart_postgres.as_deref().unwrap_or_default()).await?;
                mischief.postgres_restarts += 1;
                restarted_pg = true;
                continue;
            }

            let victim = rand::rng().random_range(0..fleet.procs.len());
            let proc = &mut fleet.procs[victim];
            proc.kill().await;
            match proc.role {
                Role::Api => mischief.api_kills += 1,
                Role::Worker => mischief.worker_kills += 1,
            }
            let down = Duration::from_millis(rand::rng().random_range(0..300));
            tokio::time::sleep(down).await;
            restart(proc, &config).await?;
        }
        if let Some(failover) = failover {
            failover.await??;
        }
        Ok((mischief, fleet))
    })
}

/// Starts `proc` again. After a PostgreSQL restart a process may fail to start for a moment:
/// retried.
pub(crate) async fn restart(proc: &mut crate::fleet::Proc, config: &Config) -> anyhow::Result<()> {
    proc.kill().await;
    let mut tries = 0;
    while let Err(error) = proc.start(&config.oncely).await {
        tries += 1;
        if tries > 20 {
            return Err(error.context("a process would not restart"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

async fn restart_postgres(command: &str) -> anyhow::Result<()> {
    eprintln!("chaos: restarting PostgreSQL: {command}");
    let ok = Command::new("sh")
        .args(["-c", command])
        .status()
        .await
        .is_ok_and(|s| s.success());
    anyhow::ensure!(ok, "restarting PostgreSQL failed: {command}");
    Ok(())
}

/// A period during which the provider refuses our credentials: it starts once the storm has
/// `after_answers` final answers or the inbox has seen as many delivery attempts, whichever
/// comes first (on a starved machine the workers can send every email before the storm's
/// answers reach a third: then no attempt would meet the outage).
pub(crate) struct Outage {
    pub(crate) after_answers: u64,
    pub(crate) lasting: Duration,
    pub(crate) progress: Progress,
}

/// The fault injector, until `drained`: every 50 ms, owes the inbox `rate` of the attempts it
/// saw since the last tick, alternately as an accept-then-drop and a rejection — mail and
/// webhooks apart (a webhook rejection is the inbox's `webhook_reject_status`, 503); and starts the
/// `outage` once (every change to the inbox's faults is made here, read-modify-write, so none
/// overwrites another).
pub(crate) fn inject_faults(
    inbox: Inbox,
    rate: f64,
    mut outage: Option<Outage>,
    drained: Arc<AtomicBool>,
) -> JoinHandle<()> {
    let rate = rate.clamp(0.0, 1.0);
    tokio::spawn(async move {
        let (mut seen, mut owed, mut reject) = (0u64, 0.0f64, false);
        let (mut hooks_seen, mut hooks_owed, mut hooks_reject) = (0u64, 0.0f64, true);
        while !drained.load(Ordering::Relaxed) && (rate > 0.0 || outage.is_some()) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let stats = inbox.stats();
            owed += rate * stats.attempts.saturating_sub(seen) as f64;
            seen = stats.attempts;
            hooks_owed += rate * stats.webhooks.attempts.saturating_sub(hooks_seen) as f64;
            hooks_seen = stats.webhooks.attempts;
            let mut faults = inbox.faults();
            let due = outage.as_ref().is_some_and(|o| {
                o.progress.answered.load(Ordering::Relaxed) >= o.after_answers
                    || stats.attempts >= o.after_answers
            });
            if due && let Some(o) = outage.take() {
                eprintln!(
                    "chaos: the provider refuses our credentials for {:?}",
                    o.lasting
                );
                faults.unauthorized_for_ms = o.lasting.as_millis() as u64;
            }
            while owed >= 1.0 {
                owed -= 1.0;
                if reject {
                    faults.reject_next += 1;
                } else {
                    faults.drop_after_accept += 1;
                }
                reject = !reject;
            }
            while hooks_owed >= 1.0 {
                hooks_owed -= 1.0;
                if hooks_reject {
                    faults.webhook_reject_next += 1;
                } else {
                    faults.webhook_drop_after_accept += 1;
                }
                hooks_reject = !hooks_reject;
            }
            inbox.set_faults(faults);
        }
    })
}
