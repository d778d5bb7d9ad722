//! The audit after the storm: accounts and emails per acknowledged intent, the `user.created`
//! webhook of every created account, outbox rows, and leaks of addresses and tokens into logs
//! and the database.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use oncely_inbox::{Inbox, Verification};
use sqlx::{PgPool, Row};

use crate::{Report, WEBHOOK_NAME, WebhookReport};

/// The outbox kind of a webhook delivery (the server's `WEBHOOK_KIND`).
const WEBHOOK_KIND: &str = "webhook";

/// Fills the audit's half of `report`: what the database, the inbox and the logs hold for the
/// run `run_id`.
pub(crate) async fn audit(
    report: &mut Report,
    pool: &PgPool,
    inbox: &Inbox,
    (addresses, acknowledged): (&[String], &[bool]),
    logs: &Path,
    run_id: u32,
) -> anyhow::Result<()> {
    let prefix = format!("chaos-{run_id}-%");
    let users: HashSet<String> =
        sqlx::query_scalar::<_, String>("SELECT email FROM oncely_users WHERE email LIKE $1")
            .bind(&prefix)
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    report.users = users.len() as u64;
    // Address by address: an account of an intent that was not acknowledged does not make up
    // for one of an acknowledged intent that is missing.
    let acknowledged: Vec<&str> = addresses
        .iter()
        .zip(acknowledged)
        .filter(|(_, acked)| **acked)
        .map(|(address, _)| address.as_str())
        .collect();
    report.users_missing = acknowledged
        .iter()
        .filter(|address| !users.contains(**address))
        .count() as u64;
    for row in sqlx::query("SELECT status, count(*) AS n FROM oncely_outbox GROUP BY status")
        .fetch_all(pool)
        .await?
    {
        report
            .jobs
            .insert(row.try_get("status")?, row.try_get::<i64, _>("n")? as u64);
    }
    for row in sqlx::query(
        "SELECT coalesce(result, 'running') AS result, count(*) AS n FROM oncely_outbox_attempts
          GROUP BY 1",
    )
    .fetch_all(pool)
    .await?
    {
        report
            .attempts_by_result
            .insert(row.try_get("result")?, row.try_get::<i64, _>("n")? as u64);
    }
    // Unknown outcomes of the email jobs and how they were settled: a job settled as sent has
    // an attempt recorded sent without a run; one settled for resending got a fresh horizon
    // (`redriven_at`: the run re-drives nothing by hand); a parked one has a `parked` attempt
    // (after an abandoned one) or an `unknown` attempt and was settled since.
    let (unknown_outcomes, settled_sent, settled_resend, still_parked): (i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM oncely_outbox_attempts a
                                       WHERE a.job_id = o.id
                                         AND a.result IN ('unknown', 'abandoned'))),
                    count(*) FILTER (WHERE EXISTS (SELECT 1 FROM oncely_outbox_attempts a
                                       WHERE a.job_id = o.id AND a.result = 'sent'
                                         AND a.error LIKE 'not run: settled as sent%')),
                    count(*) FILTER (WHERE o.redriven_at IS NOT NULL),
                    count(*) FILTER (WHERE o.status = 'unknown')
               FROM oncely_outbox o WHERE o.kind <> $1",
        )
        .bind(WEBHOOK_KIND)
        .fetch_one(pool)
        .await?;
    report.unknown_outcomes = unknown_outcomes as u64;
    report.settled_sent = settled_sent as u64;
    report.settled_resend = settled_resend as u64;
    report.parked = (settled_sent + settled_resend + still_parked) as u64;
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
    report.abandoned = abandoned(pool, &messages).await?;
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
    // Acknowledged intents whose address got no email. A dead job does not excuse one: any
    // dead job fails the run by itself (`Report::passed`), and which address a dead job was for
    // is not in every payload.
    report.lost = acknowledged
        .iter()
        .filter(|address| !per_address.contains_key(**address))
        .count() as u64;
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
        // Another payload under a seen key (409 invalid_idempotent_request): must stay 0.
        ("mismatched".into(), stats.mismatched),
        ("concurrent".into(), stats.concurrent),
        ("throttled".into(), stats.throttled),
        ("unauthorized".into(), stats.unauthorized),
    ]);

    report.webhooks = webhooks(pool, inbox, &prefix).await?;

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

/// The email attempts that killed workers abandoned (issue 36), by where they stood with their
/// point of no return, and what the inbox received during each: a copy under the job's delivery
/// key (its idempotency header, else its `Message-ID`) received between the attempt's start and
/// its end (when the next claim closed it) came from that attempt.
async fn abandoned(
    pool: &PgPool,
    messages: &[oncely_inbox::Message],
) -> anyhow::Result<crate::Abandoned> {
    let mut received: HashMap<String, Vec<i64>> = HashMap::new();
    for message in messages {
        let at = i64::try_from(message.received_at.unix_timestamp_nanos() / 1_000_000)?;
        let key = message.idempotency_key.clone().or_else(|| {
            let id = message.message_id.as_deref()?;
            Some(
                id.trim_start_matches('<')
                    .trim_end_matches("@oncely>")
                    .to_owned(),
            )
        });
        if let Some(key) = key {
            received.entry(key).or_default().push(at);
        }
    }
    let rows = sqlx::query(
        "SELECT o.delivery_key::text AS key, a.point_of_no_return AS mark,
                (EXTRACT(EPOCH FROM a.started_at) * 1000)::int8 AS started,
                (EXTRACT(EPOCH FROM a.handed_over_at) * 1000)::int8 AS handed_over,
                (EXTRACT(EPOCH FROM a.finished_at) * 1000)::int8 AS finished
           FROM oncely_outbox_attempts a JOIN oncely_outbox o ON o.id = a.job_id
          WHERE o.kind <> $1 AND a.result = 'abandoned'",
    )
    .bind(WEBHOOK_KIND)
    .fetch_all(pool)
    .await?;
    let mut report = crate::Abandoned::default();
    for row in rows {
        let key: String = row.try_get("key")?;
        let mark: Option<String> = row.try_get("mark")?;
        let started: i64 = row.try_get("started")?;
        let handed_over: Option<i64> = row.try_get("handed_over")?;
        let finished: i64 = row.try_get("finished")?;
        let got = |from: i64| {
            received
                .get(&key)
                .is_some_and(|times| times.iter().any(|t| (from..=finished).contains(t)))
        };
        report.attempts += 1;
        match (mark.as_deref(), handed_over) {
            (Some("passed"), Some(at)) => {
                report.after_handover += 1;
                if got(at) {
                    report.after_handover_received += 1;
                } else {
                    report.cut_during_data += 1;
                }
            }
            (Some("ahead"), _) => {
                report.before_handover += 1;
                report.before_handover_received += u64::from(got(started));
            }
            _ => report.unmarked += 1,
        }
    }
    let parked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM oncely_outbox_attempts a
           JOIN oncely_outbox o ON o.id = a.job_id
          WHERE o.kind <> $1 AND a.result = 'parked'",
    )
    .bind(WEBHOOK_KIND)
    .fetch_one(pool)
    .await?;
    report.parked = parked as u64;
    Ok(report)
}

/// The webhook half of the audit: the run's accounts (`prefix`), the event ids their webhook
/// jobs carry, and the copies the inbox's endpoint [`WEBHOOK_NAME`] accepted.
async fn webhooks(pool: &PgPool, inbox: &Inbox, prefix: &str) -> anyhow::Result<WebhookReport> {
    let accounts: Vec<String> =
        sqlx::query_scalar("SELECT id::text FROM oncely_users WHERE email LIKE $1")
            .bind(prefix)
            .fetch_all(pool)
            .await?;
    let mut jobs = Vec::new();
    for row in
        sqlx::query("SELECT payload::text AS payload, status FROM oncely_outbox WHERE kind = $1")
            .bind(WEBHOOK_KIND)
            .fetch_all(pool)
            .await?
    {
        let payload: serde_json::Value =
            serde_json::from_str(&row.try_get::<String, _>("payload")?)?;
        jobs.push(WebhookJob::from_payload(&payload, row.try_get("status")?));
    }
    let stats = inbox.stats().webhooks;
    let mut copies: HashMap<String, u64> = HashMap::new();
    for copy in inbox.webhooks(Some(WEBHOOK_NAME), None) {
        if copy.verdict == Verification::Verified
            && let Some(id) = copy.webhook_id
        {
            *copies.entry(id).or_default() += 1;
        }
    }
    let mut report = judge(&accounts, &jobs, &copies);
    report.invalid = stats.invalid;
    report.unverified = stats.unverified;
    report.inbox = BTreeMap::from([
        ("attempts".into(), stats.attempts),
        ("received".into(), stats.received),
        ("rejected".into(), stats.rejected),
        ("dropped_after_accept".into(), stats.dropped),
        ("duplicates".into(), stats.duplicates),
    ]);
    Ok(report)
}

/// One webhook outbox job as the audit reads it.
#[derive(Debug, Clone)]
struct WebhookJob {
    event_id: Option<String>,
    event_type: Option<String>,
    /// `data.user_id` of the event's body.
    user_id: Option<String>,
    status: String,
}

impl WebhookJob {
    fn from_payload(payload: &serde_json::Value, status: String) -> Self {
        let body: Option<serde_json::Value> = payload["body"]
            .as_str()
            .and_then(|body| serde_json::from_str(body).ok());
        Self {
            event_id: payload["event_id"].as_str().map(str::to_owned),
            event_type: payload["type"].as_str().map(str::to_owned),
            user_id: body
                .as_ref()
                .and_then(|b| b["data"]["user_id"].as_str())
                .map(str::to_owned),
            status,
        }
    }
}

/// The webhook figures from the run's `accounts`, every webhook job, and the verified copies
/// per `webhook-id`: an account's event is lost if no verified copy of its id arrived and no
/// dead job explains it; each account must have exactly one `user.created` event id, and no
/// id may belong to two accounts.
fn judge(accounts: &[String], jobs: &[WebhookJob], copies: &HashMap<String, u64>) -> WebhookReport {
    let mut report = WebhookReport {
        expected: accounts.len() as u64,
        ..WebhookReport::default()
    };
    let ours: HashSet<&str> = accounts.iter().map(String::as_str).collect();
    let mut ids_of: HashMap<&str, HashSet<&str>> = HashMap::new();
    let mut accounts_of: HashMap<&str, HashSet<&str>> = HashMap::new();
    let mut dead_ids: HashSet<&str> = HashSet::new();
    let mut known_ids: HashSet<&str> = HashSet::new();
    for job in jobs {
        *report.jobs.entry(job.status.clone()).or_default() += 1;
        if job.status == "dead" {
            report.dead += 1;
        }
        let Some(id) = job.event_id.as_deref() else {
            continue;
        };
        known_ids.insert(id);
        if job.status == "dead" {
            dead_ids.insert(id);
        }
        if job.event_type.as_deref() != Some("user.created") {
            continue;
        }
        if let Some(user) = job.user_id.as_deref().filter(|u| ours.contains(u)) {
            ids_of.entry(user).or_default().insert(id);
            accounts_of.entry(id).or_default().insert(user);
        }
    }
    report.events = accounts_of.len() as u64;
    report.ids_shared = accounts_of.values().filter(|a| a.len() > 1).count() as u64;
    for account in accounts {
        let ids = ids_of.get(account.as_str());
        if ids.is_none_or(|ids| ids.len() != 1) {
            report.accounts_without_one_event += 1;
        }
        let arrived = ids.is_some_and(|ids| ids.iter().any(|id| copies.contains_key(*id)));
        let dead = ids.is_some_and(|ids| ids.iter().any(|id| dead_ids.contains(id)));
        if !arrived && !dead {
            report.lost += 1;
        }
    }
    report.received = copies.len() as u64;
    report.unknown_ids = copies
        .keys()
        .filter(|id| !known_ids.contains(id.as_str()))
        .count() as u64;
    report.duplicates = copies.values().map(|n| n.saturating_sub(1)).sum();
    report.duplicates_per_million = if report.expected == 0 {
        0.0
    } else {
        report.duplicates as f64 * 1e6 / report.expected as f64
    };
    report
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

    fn job(event: &str, user: &str, status: &str) -> WebhookJob {
        let body = serde_json::json!({ "type": "user.created", "data": { "user_id": user } });
        WebhookJob::from_payload(
            &serde_json::json!({
                "endpoint_id": "e",
                "event_id": event,
                "type": "user.created",
                "body": body.to_string(),
            }),
            status.into(),
        )
    }

    #[test]
    fn webhook_audit_counts_lost_duplicates_dead_and_ids_that_are_not_one_per_account() {
        let accounts: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
        let jobs = vec![
            job("msg_a", "a", "sent"),
            job("msg_b", "b", "sent"),
            // c: its event went dead: reported, not lost.
            job("msg_c", "c", "dead"),
            // d: its job is sent but no verified copy came: lost.
            job("msg_d", "d", "sent"),
            // e: none at all: lost, and without an event.
            // Another tenant's account: not the run's.
            job("msg_x", "x", "sent"),
        ];
        let copies = HashMap::from([
            ("msg_a".to_owned(), 3),
            ("msg_b".to_owned(), 1),
            ("msg_zz".to_owned(), 1),
        ]);
        let report = judge(&accounts, &jobs, &copies);
        assert_eq!(report.expected, 5);
        assert_eq!(report.events, 4);
        assert_eq!(report.lost, 2);
        assert_eq!(report.dead, 1);
        assert_eq!(report.received, 3);
        assert_eq!(report.duplicates, 2);
        assert_eq!(report.duplicates_per_million, 400_000.0);
        assert_eq!(report.unknown_ids, 1);
        assert_eq!(report.accounts_without_one_event, 1);
        assert_eq!(report.ids_shared, 0);
        assert_eq!(report.jobs["sent"], 4);

        // One id for two accounts, two ids for one account: both caught.
        let jobs = vec![
            job("msg_a", "a", "sent"),
            job("msg_a", "b", "sent"),
            job("msg_c1", "c", "sent"),
            job("msg_c2", "c", "sent"),
        ];
        let copies = HashMap::from([
            ("msg_a".to_owned(), 1),
            ("msg_c1".to_owned(), 1),
            ("msg_c2".to_owned(), 1),
        ]);
        let report = judge(&accounts[..3], &jobs, &copies);
        assert_eq!(report.lost, 0);
        assert_eq!(report.ids_shared, 1);
        assert_eq!(report.accounts_without_one_event, 1);
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
