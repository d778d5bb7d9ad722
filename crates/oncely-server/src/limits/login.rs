//! The caps on failed logins: counted per address from one client, per address, per client
//! (the login route counts each attempt before it checks a password).

use std::time::Duration;

/// Caps on failed logins per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginLimits {
    /// Failures per window for one address from one client (whether or not it has an
    /// account): small, and a stranger who reaches it has used up only its own attempts.
    pub per_address: u32,
    /// Failures per window for one address from all clients. A client with no failure of its
    /// own for the address in the window still gets its attempt: strangers cannot lock the
    /// owner out, and each client address they control buys them one guess per window.
    pub per_address_total: u32,
    /// Failures per window from one client, whatever the addresses (credential stuffing).
    pub per_client: u32,
    /// The window.
    pub window: Duration,
}
