//! The account statements: one set per dialect ([`super::postgres::STATEMENTS`],
//! [`super::sqlite::STATEMENTS`]), under these names. Each field says what the Rust binds, in
//! order ($1, $2, … on PostgreSQL; ?1, ?2, … on SQLite): the binding is written once, in
//! [`super::Accounts`], so both dialects must take the same parameters in the same order.
//!
//! `now` is an instant bound by the caller ([`crate::backend::Backend::at`]): NULL on
//! PostgreSQL, which then reads its own clock (`COALESCE($n, now())`); on SQLite the process
//! clock, in Unix milliseconds.

use crate::backend::Backend;

/// A backend's account statements, in its dialect: implemented beside them (in
/// `accounts/postgres.rs` and `accounts/sqlite.rs`), so that the backend seam names no
/// statement of the account flows.
pub trait AccountSql: Backend {
    /// The account statements in this database's dialect.
    const ACCOUNT_SQL: Statements;
}

/// The SQL of the account flows in one dialect.
#[derive(Debug, Clone, Copy)]
pub struct Statements {
    /// Binds id, tenant, email, source, now. Inserts the user unless (tenant, email) exists;
    /// returns `id` if it did (no row otherwise).
    pub insert_user: &'static str,
    /// Where the dialect can in one statement (data-modifying CTEs): [`Self::insert_user`],
    /// the email's per-address counters and the tenant's webhook endpoints. Binds id, tenant,
    /// email, source, now, the address-and-client bucket (NULL: the client is unknown, only
    /// the address counts), the address bucket, window_start, the per-address cap (64-bit),
    /// whether the client's own cap let the email through. Returns `inserted` (the id, if this
    /// inserted the user), `found`, `verified` (the user that existed in the statement's
    /// snapshot, if any, locked for share: its latest version once a transaction changing it
    /// ended), `from_client` (0 when unknown), `to_address` (NULL if not counted),
    /// both 64-bit, as [`Self::count_email_pair`] counts them, and `targets` (NULL or a JSON
    /// array of `[id, events]`, as [`Self::webhook_targets`] reads them). `None`: those
    /// statements one after another.
    pub signup_user_counted: Option<&'static str>,
    /// Binds tenant, email. Returns `id`, `verified`.
    pub find_user: &'static str,
    /// Binds tenant, email. Returns `id`, `verified`, locking the row until the transaction
    /// ends (PostgreSQL; SQLite's transaction holds the write lock): what an invitation's
    /// acceptance finds stays true until it commits.
    pub lock_user: &'static str,
    /// Binds tenant, email. Returns `id`, `verified`, `password_hash` (login).
    pub login_user: &'static str,
    /// Binds tenant, bucket, window_start. Takes one back from a counter (an attempt that
    /// turned out not to count); never below 0.
    pub uncount: &'static str,
    /// Binds user_id, old password_hash, new password_hash. Replaces the hash only if it is
    /// still the old one (a concurrent reset wins).
    pub rehash_password: &'static str,
    /// Binds tenant, bucket, window_start. Counts one more email; returns the count (64-bit).
    pub count_email: &'static str,
    /// Where the dialect can in one statement (data-modifying CTEs): binds tenant, the
    /// address-and-client bucket, the address bucket, window_start, the per-address cap
    /// (64-bit), whether the client's own cap let the email through. Counts one more email to
    /// the address from the client, and — if that is within the cap and the client's cap let
    /// it through — one more to the address; returns both counts (64-bit; the second NULL if
    /// not counted). `None`: [`Self::count_email`] twice.
    pub count_email_pair: Option<&'static str>,
    /// Binds user_id, flow, supersede (bool), now. Supersedes the user's live tokens of the
    /// flow that carry no signup password, if `supersede`.
    pub supersede_flow: &'static str,
    /// Binds id, tenant, user_id, email, flow, token_hash, expires_at, now, password_hash,
    /// return_to, locale, tenants_first (bool: store the tenant's first return URL, read in the
    /// statement, instead of return_to).
    pub insert_token: &'static str,
    /// Where the dialect can in one statement: [`Self::supersede_flow`] then
    /// [`Self::insert_token`]; binds as `insert_token`, then supersede (bool). `None`: the two.
    pub supersede_and_insert_token: Option<&'static str>,
    /// Binds token_hash. Locks the account the token belongs to (if any) until the transaction
    /// ends, before the token is consumed.
    pub lock_token_account: &'static str,
    /// Binds token_hash, tenant (or NULL: any), flow, now. Consumes a live, owned token;
    /// returns `tenant`, `user_id`, `email`, `password_hash`, `return_to`, `locale`.
    pub consume_token: &'static str,
    /// Binds token_hash, tenant (or NULL: any), now. Counts an attempt at the signup password
    /// of a live verification token; returns `password_hash`, `password_attempts` (64-bit).
    pub signup_password_attempt: &'static str,
    /// Binds token_hash. Takes back one attempt at the token's signup password (never below 0).
    pub signup_password_unattempt: &'static str,
    /// Binds user_id, now, password_hash, locale. Verifies a pending user, setting its password
    /// and its locale (the verifying link's: what a stranger's signup left is not kept).
    pub mark_verified: &'static str,
    /// Binds user_id, now. Supersedes the user's live verification tokens.
    pub supersede_verification: &'static str,
    /// Binds user_id, password_hash.
    pub set_password: &'static str,
    /// Binds id, tenant, email, password_hash, now, locale. Creates the invited user verified,
    /// or verifies the existing one (a verified account's locale kept, or set if it had none; a
    /// pending one's replaced); returns its `id`.
    pub accept_invite: &'static str,
    /// Binds id, tenant, email, password_hash, now, locale. Creates the invited user verified
    /// unless (tenant, email) exists (then no row).
    pub insert_invited_user: &'static str,
    /// Binds tenant, user_id, now. Adds the membership once.
    pub add_membership: &'static str,
    /// Binds token_id, now. Returns `flow`, `tenant`, `user_id`, `token_hash`, `recipient` (the
    /// token's own address if it has one, else its user's), `locale` (the token's, else its
    /// user's if the user is verified), `live`.
    pub token_for_send: &'static str,
    /// Binds user_id. Returns `email`.
    pub user_email: &'static str,
    /// Binds user_id. Returns `email`, `locale` (NULL while the user is pending).
    pub user_email_and_locale: &'static str,
    /// Binds user_id, tenant. Returns the `email` of the user if it belongs to the tenant.
    pub user_in_tenant: &'static str,
    /// Binds user_id, email, now. Gives the user the address, verified (a pending account's
    /// password is cleared, as [`Statements::mark_verified`] does), unless another account of
    /// its tenant has it: then no row changes (the unique index would refuse it anyway).
    pub change_email: &'static str,
    /// Binds user_id, now, invites (bool). Supersedes every live token of the user — its
    /// invitations only if `invites`.
    pub supersede_user_tokens: &'static str,
    /// Binds now, expired_for (seconds, a float), limit. Deletes up to `limit` tokens that
    /// expired more than `expired_for` before `now`.
    pub prune_tokens: &'static str,
    /// Binds before_window, limit. Deletes up to `limit` counters of earlier windows.
    pub prune_rate_limits: &'static str,
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
    /// Binds tenant. The tenant's enabled webhook endpoints, oldest first: `id`, `events` (a
    /// JSON array of event types; `[]`: every event).
    pub webhook_targets: &'static str,
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
    /// Binds id, tenant, url, events (JSON array), secret_sealed, now.
    pub insert_webhook_endpoint: &'static str,
    /// Binds id, now. One endpoint as an [`EndpointRecord`](super::EndpointRecord) (the previous
    /// secret only while its grace runs).
    pub webhook_endpoint: &'static str,
    /// Binds tenant (or NULL: every tenant), now. Endpoints as
    /// [`EndpointRecord`](super::EndpointRecord)s, by tenant, oldest first.
    pub webhook_endpoints: &'static str,
    /// Binds id, now, reason. Disables an endpoint (`reason` NULL: enables it again); changes
    /// no row for an unknown id.
    pub set_webhook_disabled: &'static str,
    /// Binds id, new secret_sealed, grace (seconds, a float), now. The current secret becomes
    /// the previous one until now + grace (grace 0: it stops at once); returns
    /// `previous_secret_expires_at_ms`.
    pub rotate_webhook_secret: &'static str,
    /// Binds id, old sealed secret, new sealed secret. Replaces the endpoint's current or
    /// previous sealed signing secret that is still `old` by `new` (a re-seal under the current
    /// server secret; a concurrent rotation wins).
    pub reseal_webhook_secret: &'static str,
    /// Binds id. Deletes an endpoint.
    pub remove_webhook_endpoint: &'static str,
}
