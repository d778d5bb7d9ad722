//! The audit after the storm: accounts and emails per acknowledged intent, outbox rows, and
//! leaks of addresses and tokens into logs and the database.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use oncely_inbox::Inbox;
use sqlx::{PgPool, Row};

use crate::Report;

/// Fills the audit's half of `report`: what the database, the inbox and the logs hold for the
/// run `run_id`.
pub(crate) async fn audit(
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
        // Another payload under a seen key (409 invalid_idempotent_request): must stay 0.
        ("mismatched".into(), stats.mismatched),
        ("concurrent".into(), stats.concurrent),
        ("throttled".into(), stats.throttled),
        ("unauthorized".into(), stats.unauthorized),
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
