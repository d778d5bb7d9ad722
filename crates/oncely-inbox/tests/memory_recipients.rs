//! What the inbox holds of recipients, measured as the process's resident memory, not as the
//! inbox counts it. One test in its own binary, so that no other test allocates meanwhile.

mod common;

use common::{MIB, inbox, message, rss};
use oncely_inbox::{MAX_RECIPIENTS, Verdict};

/// Review 3, F3: what the inbox holds stays near its byte budget however many recipients its
/// messages have. Each is kept in the message and in the recipient index (its own key, a hash
/// entry, a tree node), and a run-tagged one (`a+N@b`) in the run index too: counted at a
/// fraction of that (the run index not at all), 8 posts of ~715k recipients reached 888 MB on a
/// 256 MiB budget.
#[test]
fn what_the_inbox_holds_stays_near_its_budget_however_many_recipients() {
    const BUDGET: usize = 16 * MIB;
    let inbox = inbox(BUDGET);
    let before = rss();
    let mut n = 0usize;
    for _ in 0..400 {
        let to = (0..MAX_RECIPIENTS)
            .map(|_| {
                n += 1;
                format!("a+{n}@b.io")
            })
            .collect();
        let verdict = inbox.receive(message(to, None));
        assert!(matches!(verdict, Verdict::Accepted(_)), "{verdict:?}");
    }
    let grown = rss().saturating_sub(before);
    let stats = inbox.stats();
    eprintln!("kept {} messages, {} MiB resident", stats.kept, grown / MIB);
    assert!(stats.evicted > 0, "the budget was reached: {stats:?}");
    assert!(
        grown < BUDGET + 16 * MIB,
        "many recipients: {} MiB resident for a {} MiB budget",
        grown / MIB,
        BUDGET / MIB
    );
}
