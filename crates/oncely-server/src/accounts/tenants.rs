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

/// The statements of tenants. One set per dialect (`postgres.rs`, `sqlite.rs`), in
/// [`Statements`](super::Statements).
#[derive(Debug, Clone, Copy)]
pub struct TenantStatements {
    /// Binds id, api_key_hash, now.
    pub create_tenant: &'static str,
    /// Binds api_key_hash, now. Returns the `id` of the tenant whose current key, or whose
    /// previous key before its expiry, has this hash.
    pub tenant_by_key: &'static str,
    /// Binds id, new api_key_hash, grace (seconds, a float), now. Replaces the tenant's key;
    /// with a grace above 0 the replaced key stays valid until now + grace (the previous key
    /// it held before is forgotten), else no previous key remains. Returns
    /// `previous_key_expires_at_ms` (Unix milliseconds or NULL); no row if no such tenant.
    pub rotate_tenant_key: &'static str,
    /// Binds now. Every tenant by id: `id`, `api_key_hash`, `created_at_ms`, and while it is
    /// valid `previous_key_hash` and `previous_key_expires_at_ms` (else NULL); `email_delivery`,
    /// `product_name`, `mail_from`, `support_email`.
    pub tenants: &'static str,
    /// Binds tenant. The tenant's return URLs in order: `url`.
    pub return_urls: &'static str,
    /// Binds nothing. Every tenant's return URLs, by tenant and in order: `tenant`, `url`.
    pub all_return_urls: &'static str,
    /// Binds tenant. Returns its `id` if the tenant exists (on PostgreSQL locking its row:
    /// concurrent replacements of its return URLs take turns).
    pub lock_tenant: &'static str,
    /// Binds tenant. Deletes its return URLs.
    pub clear_return_urls: &'static str,
    /// Binds tenant, position, url.
    pub add_return_url: &'static str,
    /// Binds tenant. Returns the tenant's `email_delivery` (`mail` or `webhook`); no row for an
    /// unknown tenant (and `default`, which has no row).
    pub email_delivery: &'static str,
    /// Binds id, email_delivery. Sets the tenant's email delivery; changes no row for an
    /// unknown tenant.
    pub set_email_delivery: &'static str,
    /// Binds tenant. Returns its `product_name`, `mail_from`, `support_email`; no row for an
    /// unknown tenant (and `default`).
    pub branding: &'static str,
    /// Binds id, product_name, mail_from, support_email. Replaces the tenant's branding;
    /// changes no row for an unknown tenant.
    pub set_branding: &'static str,
}
