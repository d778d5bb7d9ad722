//! Runs: mailboxes a CI job creates for itself (`POST /runs`) so that its mail is kept apart
//! from every other job's sharing the inbox. A run has an id; mail to any address at its domain
//! (`anyone@<id>.run.test`) or with its id as a plus tag (`anyone+<id>@any.domain`) is the
//! run's, listed, counted, waited for and deleted by run.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// What a run's domain ends with: `.test` is reserved (RFC 2606), so no run address can be
/// anyone's real mailbox.
pub const RUN_DOMAIN_SUFFIX: &str = ".run.test";

/// The most runs remembered: creating one more forgets the oldest (its messages stay, until
/// the [`crate::Retention`] bound takes them). A run is also forgotten when it is older than
/// the retention's `max_age`.
pub const MAX_RUNS: usize = 1000;

/// A run, as `POST /runs` and `GET /runs/{id}` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// Its id: 12 lower-case hex digits.
    pub run: String,
    /// Mail to any address at this domain is the run's: `<id>.run.test`.
    pub domain: String,
    /// Mail to an address with this plus tag (`anyone+<tag>@any.domain`) is the run's too.
    pub tag: String,
    /// An address of the run, to copy.
    pub example: String,
    /// When it was created (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// How many of its messages are kept now.
    pub messages: usize,
}

impl Run {
    fn new(id: &str, created_at: OffsetDateTime, messages: usize) -> Self {
        let domain = format!("{id}{RUN_DOMAIN_SUFFIX}");
        Self {
            run: id.to_owned(),
            example: format!("user@{domain}"),
            domain,
            tag: id.to_owned(),
            created_at,
            messages,
        }
    }
}

/// The runs that exist, oldest first.
#[derive(Default)]
pub(crate) struct Runs {
    created: HashMap<String, OffsetDateTime>,
    order: VecDeque<String>,
}

impl Runs {
    /// Creates a run at `now`, forgetting the oldest beyond [`MAX_RUNS`]; its id.
    pub(crate) fn create(&mut self, now: OffsetDateTime) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        self.created.insert(id.clone(), now);
        self.order.push_back(id.clone());
        while self.order.len() > MAX_RUNS {
            self.forget_oldest();
        }
        id
    }

    /// When the run `id` was created, if it exists.
    pub(crate) fn created_at(&self, id: &str) -> Option<OffsetDateTime> {
        self.created.get(id).copied()
    }

    /// The run ids, oldest first.
    pub(crate) fn ids(&self) -> impl Iterator<Item = &String> {
        self.order.iter()
    }

    /// Forgets the run `id`; whether it existed.
    pub(crate) fn remove(&mut self, id: &str) -> bool {
        self.order.retain(|r| r != id);
        self.created.remove(id).is_some()
    }

    /// Forgets the runs created at or before `oldest` (as messages go at their age).
    pub(crate) fn expire(&mut self, oldest: OffsetDateTime) {
        while let Some(first) = self.order.front() {
            if self.created.get(first).is_some_and(|at| *at > oldest) {
                break;
            }
            self.forget_oldest();
        }
    }

    /// Forgets every run.
    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    fn forget_oldest(&mut self) {
        if let Some(id) = self.order.pop_front() {
            self.created.remove(&id);
        }
    }
}

/// The summary of run `id`.
pub(crate) fn summary(id: &str, created_at: OffsetDateTime, messages: usize) -> Run {
    Run::new(id, created_at, messages)
}

/// The run an address (lower case) names, if any: the first label of a `*.run.test` domain,
/// or the plus tag of its local part. Whether such a run exists is not looked at here.
pub(crate) fn run_of(address: &str) -> Option<&str> {
    let (local, domain) = address.rsplit_once('@')?;
    if let Some(id) = domain.strip_suffix(RUN_DOMAIN_SUFFIX)
        && !id.is_empty()
        && !id.contains('.')
    {
        return Some(id);
    }
    local
        .rsplit_once('+')
        .map(|(_, tag)| tag)
        .filter(|tag| !tag.is_empty())
}

#[cfg(test)]
mod tests {
    use super::run_of;

    #[test]
    fn an_address_names_its_run_by_domain_or_plus_tag() {
        assert_eq!(run_of("ada@0123abcd4567.run.test"), Some("0123abcd4567"));
        assert_eq!(run_of("ada+0123abcd4567@example.com"), Some("0123abcd4567"));
        assert_eq!(run_of("a+b+r1@example.com"), Some("r1"));
        for none in [
            "ada@example.com",
            "ada@run.test",
            "ada@.run.test",
            "ada@x.y.run.test",
            "ada+@example.com",
            "no-at-sign",
        ] {
            assert_eq!(run_of(none), None, "{none}");
        }
    }
}
