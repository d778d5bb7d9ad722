//! What provider mode remembers of idempotency keys, measured as the process's resident
//! memory. One test in its own binary, so that no other test allocates meanwhile.

mod common;

use common::{MIB, inbox, message, rss};
use oncely_inbox::{Faults, Verdict};

/// Provider mode remembers each idempotency key for its window (24 h) apart from the mailbox,
/// as the delivery keys are (review 3, F1): by a digest, not as sent. As sent, 40 messages with
/// a 1 MiB key held 80 MiB of keys while the mailbox kept 16 MiB.
#[test]
fn provider_mode_remembers_long_idempotency_keys_in_bounded_memory() {
    const BUDGET: usize = 16 * MIB;
    let inbox = inbox(BUDGET);
    inbox.set_faults(Faults::provider());
    let key_of = |n: usize| format!("{n:08}{}", "k".repeat(MIB));
    let before = rss();
    let mut first = None;
    for n in 0..40 {
        let mut sent = message(vec!["b@x.io".into()], None);
        sent.subject = format!("m{n}");
        sent.idempotency_key = Some(key_of(n));
        let verdict = inbox.receive(sent);
        let Verdict::Accepted(id) = verdict else {
            panic!("{verdict:?}");
        };
        first.get_or_insert(id);
    }
    let grown = rss().saturating_sub(before);
    assert!(inbox.stats().evicted > 0);
    // A repeat of the first, evicted from the mailbox, is still answered with its first id;
    // another payload under its key is a conflict.
    let mut again = message(vec!["b@x.io".into()], None);
    again.subject = "m0".into();
    again.idempotency_key = Some(key_of(0));
    assert_eq!(
        inbox.receive(again.clone()),
        Verdict::Accepted(first.unwrap())
    );
    again.subject = "other".into();
    assert!(matches!(inbox.receive(again), Verdict::Conflict(_)));
    assert!(
        grown < BUDGET + 32 * MIB,
        "long idempotency keys: {} MiB resident beyond a {} MiB budget",
        grown / MIB,
        BUDGET / MIB
    );
}
