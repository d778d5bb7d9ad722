//! What the inbox holds, measured as the process's resident memory, not as the inbox counts
//! it: the byte budget is only as good as its count. One test in its own binary, so that no
//! other test allocates meanwhile.

mod common;

use common::{MIB, inbox, message, rss};
use oncely_inbox::Verdict;

/// Review 3, F1: what the inbox holds stays near its byte budget, however long the delivery
/// keys (each remembered apart from the mailbox, once as the whole `Message-ID` and once as its
/// key part: 40 messages with a 1 MiB `Message-ID` held 160 MiB of keys while the mailbox kept
/// 16 MiB).
#[test]
fn what_the_inbox_holds_stays_near_its_budget_however_long_the_delivery_keys() {
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
