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
