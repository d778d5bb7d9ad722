//! One-time codes: minted when a link with a return URL is used, exchanged once.

use sqlx::FromRow;
use uuid::Uuid;

/// A one-time code to store (its hash only): minted when a link with a return URL is used.
#[derive(Debug, Clone)]
pub struct NewCode<'a> {
    /// SHA-256 of the code.
    pub hash: &'a [u8],
    /// SHA-256 of the token just consumed: the code takes its tenant (whose API key may
    /// exchange it), its flow and its consumption time (`authenticated_at`).
    pub token_hash: &'a [u8],
    /// The user the link proved.
    pub user_id: Uuid,
    /// How long it can be exchanged.
    pub lifetime: std::time::Duration,
}

/// A code that was exchanged: who it proves, as the user is now.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct ExchangedCode {
    /// The user.
    pub user_id: Uuid,
    /// Its address now.
    pub email: String,
    /// Whether the address is verified now.
    pub email_verified: bool,
    /// The flow that minted the code.
    pub flow: String,
    /// When the link was used (Unix milliseconds).
    pub authenticated_at_ms: i64,
}
