//! What the inbox holds, measured as the process's resident memory, not as the inbox counts
//! it: the byte budget is only as good as its count. One test in its own binary, so that no
//! other test allocates meanwhile.

use std::time::Duration;

use oncely_inbox::{Config, Inbox, Intake, Message, Retention, Verdict};
use time::OffsetDateTime;

/// The process's resident set, in bytes.
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

const MIB: usize = 1024 * 1024;

fn message(to: Vec<String>, message_id: Option<String>) -> Message {
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

fn inbox(max_bytes: usize) -> Inbox {
    Inbox::with_config(Config {
        retention: Retention {
            max_messages: 10_000,
            max_age: Duration::from_secs(3600),
            max_bytes,
        },
        ..Config::default()
    })
}

/// Review 3, F1 and F3: what the inbox holds stays near its byte budget, however long the
/// delivery keys (each remembered apart from the mailbox, once as the whole `Message-ID` and
/// once as its key part: 40 messages with a 1 MiB `Message-ID` held 160 MiB of keys while the
/// mailbox kept 16 MiB) and however many recipients (each in two indexes: counted at a
/// fraction of what they hold, 16 MiB of recipients held several times that).
#[test]
fn what_the_inbox_holds_stays_near_its_budget_whatever_the_keys_and_recipients() {
    const BUDGET: usize = 16 * MIB;

    // F1: long delivery keys. The messages themselves are evicted beyond the budget.
    let inbox = inbox(BUDGET);
    let before = rss();
    let id_of = |n: usize| format!("<{n:08}{}@x.io>", "k".repeat(MIB));
    for n in 0..40 {
        let verdict = inbox.receive(message(vec!["b@x.io".into()], Some(id_of(n))));
        assert!(matches!(verdict, Verdict::Accepted(_)), "{verdict:?}");
    }
    let grown = rss().saturating_sub(before);
    // The answers are those of the keys as sent: whole, and the key part.
    let first = inbox.delivery(&id_of(0));
    assert!(first.accepted && first.copies == 1, "{first:?}");
    let bare = id_of(39);
    let bare = bare[1..].split('@').next().unwrap();
    assert!(inbox.delivery(bare).accepted);
    assert!(!inbox.delivery(&id_of(40)).accepted);
    assert!(
        grown < BUDGET + 32 * MIB,
        "long delivery keys: {} MiB resident beyond a {} MiB budget",
        grown / MIB,
        BUDGET / MIB
    );
    drop(inbox);
}
