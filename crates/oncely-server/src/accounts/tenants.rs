//! Tenants: their records, API keys and their rotation, branding.

use sqlx::FromRow;
use time::OffsetDateTime;

/// A tenant as operators see it (`oncely tenant list`): never its key, only hashes.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct TenantRecord {
    /// The tenant's id.
    pub id: String,
    /// SHA-256 of its API key.
    pub api_key_hash: Vec<u8>,
    /// When it was created, in Unix milliseconds.
    pub created_at_ms: i64,
    /// SHA-256 of its previous API key, while that key is still valid.
    pub previous_key_hash: Option<Vec<u8>>,
    /// Until when the previous key is valid (Unix milliseconds).
    pub previous_key_expires_at_ms: Option<i64>,
    /// How its emails go out: `mail` (oncely sends them) or `webhook` (an `email.requested`
    /// event to its endpoints, carrying the email).
    pub email_delivery: String,
    /// Its product name in emails (`None`: the service's).
    pub product_name: Option<String>,
    /// The sender of its emails (`None`: the service's).
    pub mail_from: Option<String>,
    /// Where its users write with questions (`None`: the service's, if any).
    pub support_email: Option<String>,
}

/// A tenant's branding of its emails (`oncely tenant set --product-name --mail-from
/// --support-email`); each `None` is the service's.
#[derive(Debug, Clone, Default, PartialEq, Eq, FromRow)]
pub struct Branding {
    /// The product name.
    pub product_name: Option<String>,
    /// The sender, `Name <address>` or an address.
    pub mail_from: Option<String>,
    /// The support address.
    pub support_email: Option<String>,
}

/// What a key rotation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRotation {
    /// Until when the replaced key keeps working (`None`: it stopped at once).
    pub previous_valid_until: Option<OffsetDateTime>,
}
