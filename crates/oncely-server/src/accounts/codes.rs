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

/// The statements of one-time codes. One set per dialect (`postgres.rs`, `sqlite.rs`), in
/// [`Statements`](super::Statements).
#[derive(Debug, Clone, Copy)]
pub struct CodeStatements {
    /// Binds code_hash, token_hash, user_id, lifetime (seconds, a float). Stores a code of the
    /// consumed token's tenant and flow, authenticated when the token was consumed, valid until
    /// then + lifetime — unless the token's return URL is no longer one of its tenant's (no row).
    pub insert_code: &'static str,
    /// Binds code_hash, tenant, now. Consumes a live code of the tenant; returns `user_id`,
    /// `email` and `email_verified` (the user's now), `flow`, `authenticated_at_ms` (Unix
    /// milliseconds).
    pub exchange_code: &'static str,
    /// Binds code_hash, tenant, now. Whether the tenant has a code with this hash whose
    /// lifetime has not ended (used or not): a row (`live`, 1) if so, none if not.
    pub code_live: &'static str,
    /// Binds now, limit. Deletes up to `limit` codes that expired before `now`.
    pub prune_codes: &'static str,
}
