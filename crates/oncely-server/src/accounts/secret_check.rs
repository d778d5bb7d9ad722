//! The secret check: what the database keeps of the server secret its processes use.

/// What the database keeps of the server secret its processes use, to check at start that
/// they all use the same one: keyed hashes, never the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretCheck {
    /// The MAC of the current secret, hex.
    pub current: String,
    /// The MAC of the previous secret, during a rotation, hex.
    pub previous: Option<String>,
    /// The MACs of the secrets of rotations that ended: never accepted again.
    pub retired: Vec<String>,
}

impl SecretCheck {
    /// The check of `secret` (its current secret and its first previous one).
    pub fn of(secret: &oncely::ServerSecret) -> Self {
        let mac = |s: &oncely::ServerSecret| hex::encode(s.mac("oncely-secret-check", &[]));
        Self {
            current: mac(secret),
            previous: secret.previous().first().map(mac),
            retired: Vec::new(),
        }
    }
}

/// The statements of the secret check and the development secret. One set per dialect
/// (`postgres.rs`, `sqlite.rs`), in [`Statements`](super::Statements).
#[derive(Debug, Clone, Copy)]
pub struct SecretCheckStatements {
    /// Binds secret. Stores the development secret of the database unless one is stored;
    /// returns the stored one.
    pub development_secret: &'static str,
    /// Binds nothing. The secret check: `current_mac`, `previous_mac`, `retired_macs` (no row:
    /// none yet).
    pub secret_check: &'static str,
    /// Binds current, previous, retired. Stores the secret check unless one is stored.
    pub add_secret_check: &'static str,
    /// Binds current, previous, retired, the current MAC it replaces. Replaces the secret check
    /// if it still holds that one.
    pub replace_secret_check: &'static str,
}
