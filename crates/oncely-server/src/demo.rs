//! `oncely demo`: a storm against an embedded instance, and the table that shows what
//! survived it — one account and one email per intent.
//!
//! Per intent (a signup for its own address): the request retried in a row, the same request
//! sent concurrently, and once the key reused with another body. The inbox rejects the first
//! delivery attempts (a provider hiccup) so that retries show too.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use oncely::ServerSecret;
use oncely_inbox::{Faults, Inbox};
use serde_json::json;

use crate::accounts::Accounts;
use crate::app::Application;
use crate::backend::Sqlite;
use crate::settings::{MailerChoice, Settings};

/// What the storm did and what came out of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Logical operations (signups for distinct addresses).
    pub intents: usize,
    /// HTTP requests sent.
    pub requests: usize,
    /// Answers by idempotency outcome.
    pub outcomes: BTreeMap<&'static str, usize>,
    /// Accounts in the database.
    pub users: i64,
    /// Emails in the inbox.
    pub emails: usize,
    /// Delivery attempts recorded (including the injected failures).
    pub attempts: i64,
    /// Delivery attempts that failed and were retried.
    pub failed_attempts: i64,
}

impl Report {
    /// Whether every intent produced exactly one account and one email.
    pub fn one_per_intent(&self) -> bool {
        self.users == self.intents as i64 && self.emails == self.intents
    }

    /// The answers so far, in a line.
    fn progress(&self) -> String {
        let answered = |outcome| self.outcomes.get(outcome).copied().unwrap_or(0);
        format!(
            "{} requests: {} created, {} replayed, {} in progress, {} key reused",
            self.requests,
            answered("created"),
            answered("replayed"),
            answered("in_progress"),
            answered("mismatch")
        )
    }

    /// The table `oncely demo` prints.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let row = |out: &mut String, k: &str, v: String| {
            writeln!(out, "  {k:<38} {v:>8}").expect("write to a String")
        };
        row(
            &mut out,
            "intents (signups, distinct addresses)",
            self.intents.to_string(),
        );
        row(&mut out, "HTTP requests sent", self.requests.to_string());
        for (outcome, n) in &self.outcomes {
            row(&mut out, &format!("  answered {outcome}"), n.to_string());
        }
        row(&mut out, "accounts created", self.users.to_string());
        row(
            &mut out,
            "delivery attempts (failed, retried)",
            format!("{} ({})", self.attempts, self.failed_attempts),
        );
        row(&mut out, "emails delivered", self.emails.to_string());
        let verdict = if self.one_per_intent() { "yes" } else { "NO" };
        row(
            &mut out,
            "one account and one email per intent",
            verdict.to_owned(),
        );
        out
    }
}

/// Runs the storm with `intents` intents on a throwaway SQLite database (the embedded default:
/// nothing to set up).
pub async fn run(intents: usize) -> anyhow::Result<Report> {
    // The demo's own directory (random name, owner only), removed when the demo ends — on an
    // error too.
    let dir = tempfile::Builder::new().prefix("oncely-demo-").tempdir()?;
    let database_url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let (inbox, running) = Inbox::start_local(Faults {
        reject_next: 3,
        ..Faults::default()
    })
    .await?;
    let secret = ServerSecret::new(hex::encode(rand::random::<[u8; 32]>()).into_bytes())?;
    let mut settings = Settings::new(database_url, secret);
    settings.bind = ([127, 0, 0, 1], 0).into();
    settings.mailer.choice = MailerChoice::Url(format!("smtp://{}", running.smtp_addr));
    settings.retry_base = Duration::from_millis(50);
    settings.limits.per_client = 100_000;
    let app = Application::<Sqlite>::build(settings).await?;
    let base = format!("http://{}", app.addr());
    let backend = app.backend().clone();
    tokio::spawn(app.run_until(std::future::pending()));

    let client = oncely_outbox::http::client(Duration::from_secs(10))?;
    let mut report = Report {
        intents,
        ..Report::default()
    };
    let send = |key: String, email: String| {
        let client = client.clone();
        let url = format!("{base}/v1/signup");
        async move {
            let response = client
                .post(url)
                .header("idempotency-key", key)
                .json(&json!({ "email": email }))
                .send()
                .await?;
            let replayed = response.headers().contains_key("idempotent-replayed");
            Ok::<_, reqwest::Error>(match (response.status().as_u16(), replayed) {
                (202, false) => "created",
                (202, true) => "replayed",
                (409, _) => "in_progress",
                (422, _) => "mismatch",
                _ => "other",
            })
        }
    };
    let progress = storm_progress(intents);
    for i in 0..intents {
        let (key, email) = (format!("demo-{i}"), format!("user{i}@example.com"));
        let mut answers = Vec::new();
        for _ in 0..5 {
            answers.push(send(key.clone(), email.clone()).await?);
        }
        let concurrent =
            futures::future::join_all((0..5).map(|_| send(key.clone(), email.clone()))).await;
        for answer in concurrent {
            answers.push(answer?);
        }
        answers.push(send(key.clone(), format!("someone-else{i}@example.com")).await?);
        report.requests += answers.len();
        for answer in answers {
            *report.outcomes.entry(answer).or_default() += 1;
        }
        progress.inc(1);
        progress.set_message(report.progress());
    }

    progress.set_prefix("deliveries");
    progress.set_position(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let delivered = inbox.messages(None).len();
        progress.set_position(delivered as u64);
        progress.set_message("emails in the inbox");
        if delivered >= intents || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    progress.finish_and_clear();
    report.emails = inbox.messages(None).len();
    report.users = backend
        .scalar("SELECT count(*) FROM oncely_users".into())
        .await?;
    report.attempts = backend
        .scalar("SELECT count(*) FROM oncely_outbox_attempts".into())
        .await?;
    report.failed_attempts = backend
        .scalar(
            "SELECT count(*) FROM oncely_outbox_attempts WHERE result IN ('retry', 'throttled')"
                .into(),
        )
        .await?;
    Ok(report)
}

/// A new file for the embedded service's logs (unless `-v`): a fresh random name in the
/// temporary directory, created exclusively and readable by its owner only — never an existing
/// file, nor a link someone planted at a name they could guess, and never another demo's log.
pub fn log_file() -> std::io::Result<(std::fs::File, std::path::PathBuf)> {
    let file = tempfile::Builder::new()
        .prefix("oncely-demo-")
        .suffix(".log")
        .tempfile()?;
    file.keep().map_err(|e| e.error)
}

/// One live line on the terminal while the storm runs (nothing when stderr is not one).
fn storm_progress(intents: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(intents as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {prefix} {pos}/{len} · {wide_msg}")
            .expect("a valid template"),
    );
    bar.set_prefix("intents");
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    /// Found by the review of issue 13: the log was `/tmp/oncely-demo.log`, opened with
    /// `File::create`, so a link planted there made the demo overwrite its target, and two demos
    /// wrote over each other.
    #[test]
    fn each_demo_logs_to_a_new_private_file() {
        let (mut first, first_path) = super::log_file().unwrap();
        let (_, second_path) = super::log_file().unwrap();
        assert_ne!(first_path, second_path);
        first.write_all(b"line").unwrap();
        assert_eq!(std::fs::read(&first_path).unwrap(), b"line");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&first_path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "readable by its owner only");
        }
        for path in [first_path, second_path] {
            std::fs::remove_file(path).unwrap();
        }
    }
}
