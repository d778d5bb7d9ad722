//! How idle workers learn of new jobs, one implementation for both dialects: a [`Hub`] per store
//! (shared by its clones) that fans wake-ups out to the store's workers, each woken only for the
//! kinds it runs, however many announcements arrive while it is busy collapsed into one pending
//! wake-up ([`Wakeup`]).
//!
//! What signals the hub differs by dialect: on SQLite an enqueue signals its job's kind at once
//! (`sqlite.rs`); on PostgreSQL one listener per store, on a connection of its own, drains the
//! NOTIFYs enqueues send at commit and signals the kinds their payloads name (`postgres.rs`).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;

/// How an idle worker waits for jobs of its kinds ([`JobStore::wakeup`](super::JobStore::wakeup)).
/// A wake-up that arrives while the worker is busy is kept, one however many arrive: its next
/// wait returns at once, and the one after waits again.
#[derive(Debug, Default)]
pub struct Wakeup {
    signal: Option<Arc<Notify>>,
}

impl Wakeup {
    /// A wake-up that never comes: the worker only polls.
    pub fn poll() -> Self {
        Self { signal: None }
    }

    /// Waits for a wake-up, at most `max` (the polling interval: a worker finds jobs nobody
    /// announced, and every job when announcements fail, at its next poll).
    pub async fn wait(&mut self, max: Duration) {
        match &self.signal {
            None => tokio::time::sleep(max).await,
            Some(signal) => {
                let _ = tokio::time::timeout(max, signal.notified()).await;
            }
        }
    }
}

/// The workers of one store, by the kinds they run.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    subscribers: Mutex<Vec<Subscriber>>,
}

/// A worker's [`Wakeup`], as the hub sees it: gone when the worker dropped it.
#[derive(Debug)]
struct Subscriber {
    kinds: Box<[String]>,
    signal: Weak<Notify>,
}

impl Hub {
    /// A wake-up for a worker of `kinds`.
    pub(crate) fn subscribe(&self, kinds: &[String]) -> Wakeup {
        let signal = Arc::new(Notify::new());
        let mut subscribers = self.subscribers();
        subscribers.retain(|s| s.signal.strong_count() > 0);
        subscribers.push(Subscriber {
            kinds: kinds.into(),
            signal: Arc::downgrade(&signal),
        });
        Wakeup {
            signal: Some(signal),
        }
    }

    /// Wakes the workers that run one of `named`.
    pub(crate) fn wake_kinds<K: AsRef<str>>(&self, named: &[K]) {
        self.wake(|kinds| kinds.iter().any(|k| named.iter().any(|n| n.as_ref() == k)));
    }

    /// Wakes every worker.
    pub(crate) fn wake_all(&self) {
        self.wake(|_| true);
    }

    /// Wakes the workers of the kinds a NOTIFY `payload` names (see [`payload`]); every worker
    /// for any other payload (empty: a [`JobStore::wake`](super::JobStore::wake), or a release
    /// that names no kinds).
    #[cfg(feature = "postgres")]
    pub(crate) fn wake_payload(&self, payload: &str) {
        match serde_json::from_str::<Vec<String>>(payload) {
            Ok(named) => self.wake_kinds(&named),
            Err(_) => self.wake_all(),
        }
    }

    fn wake(&self, runs: impl Fn(&[String]) -> bool) {
        for subscriber in self.subscribers().iter() {
            if runs(&subscriber.kinds)
                && let Some(signal) = subscriber.signal.upgrade()
            {
                // Stores one permit when the worker is not waiting: any number of wake-ups
                // while it is busy are one.
                signal.notify_one();
            }
        }
    }

    fn subscribers(&self) -> MutexGuard<'_, Vec<Subscriber>> {
        self.subscribers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The longest NOTIFY payload PostgreSQL accepts is 7999 bytes.
#[cfg(feature = "postgres")]
const MAX_PAYLOAD: usize = 7999;

/// A NOTIFY payload naming `kinds`: a JSON array of them, or empty (every kind) when they do not
/// fit in one payload.
#[cfg(feature = "postgres")]
pub(crate) fn payload<'a>(kinds: impl IntoIterator<Item = &'a str>) -> String {
    let kinds: Vec<&str> = kinds.into_iter().collect();
    match serde_json::to_string(&kinds) {
        Ok(json) if json.len() <= MAX_PAYLOAD => json,
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Whether a wake-up is pending (without waiting for one).
    fn pending(wakeup: &Wakeup) -> bool {
        let signal = wakeup.signal.as_ref().unwrap();
        let notified = signal.notified();
        tokio::pin!(notified);
        // A stored permit completes the future on its first poll.
        futures::FutureExt::now_or_never(notified).is_some()
    }

    #[test]
    fn a_worker_is_woken_for_its_kinds_only_and_many_wakeups_are_one() {
        let hub = Hub::default();
        let a = hub.subscribe(&kinds(&["a"]));
        let ab = hub.subscribe(&kinds(&["a", "b"]));
        hub.wake_kinds(&["b"]);
        assert!(!pending(&a), "a worker of a is not woken for b");
        assert!(pending(&ab));
        for _ in 0..1000 {
            hub.wake_kinds(&["a"]);
        }
        assert!(pending(&a), "woken");
        assert!(!pending(&a), "once, however many wake-ups came");
        hub.wake_all();
        assert!(pending(&a) && pending(&ab));
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn a_payload_names_its_kinds_and_anything_else_wakes_everyone() {
        let hub = Hub::default();
        let a = hub.subscribe(&kinds(&["a"]));
        let b = hub.subscribe(&kinds(&["b"]));
        hub.wake_payload(&payload(["b", "c"]));
        assert!(!pending(&a) && pending(&b));
        hub.wake_payload("");
        assert!(
            pending(&a) && pending(&b),
            "an empty payload wakes everyone"
        );
        let long = "k".repeat(MAX_PAYLOAD);
        assert_eq!(payload([long.as_str()]), "", "too long: every kind");
    }

    #[test]
    fn a_dropped_wakeup_leaves_the_hub() {
        let hub = Hub::default();
        drop(hub.subscribe(&kinds(&["a"])));
        let _b = hub.subscribe(&kinds(&["b"]));
        assert_eq!(hub.subscribers().len(), 1);
    }
}
