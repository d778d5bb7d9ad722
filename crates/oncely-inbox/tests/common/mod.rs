//! What the memory tests share: the process's resident set, an inbox with a budget, a message.
#![allow(dead_code)]

use std::time::Duration;

use oncely_inbox::{Config, Inbox, Intake, Message, Retention};
use time::OffsetDateTime;

/// The process's resident set, in bytes.
pub(crate) fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

pub(crate) const MIB: usize = 1024 * 1024;

pub(crate) fn message(to: Vec<String>, message_id: Option<String>) -> Message {
    Message {
        id: String::new(),
        intake: Intake::Http,
        received_at: OffsetDateTime::UNIX_EPOCH,
        from: "a@x.io".into(),
        to,
        subject: "s".into(),
        text: "t".into(),
        html: None,
        reply_to: None,
        message_id,
        idempotency_key: None,
        raw: String::new(),
    }
}

pub(crate) fn inbox(max_bytes: usize) -> Inbox {
    Inbox::with_config(Config {
        retention: Retention {
            max_messages: 10_000,
            max_age: Duration::from_secs(3600),
            max_bytes,
        },
        ..Config::default()
    })
}
