//! Users: signing up, finding and locking an account by address, logging in, accepting an
//! invite — the rows the account statements read.

use sqlx::FromRow;
use uuid::Uuid;

/// What a signup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignupOutcome {
    /// A new account.
    Created(Uuid),
    /// The address has an account that is not verified yet.
    Pending(Uuid),
    /// The address has a verified account.
    Verified(Uuid),
}

/// A user found by address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct User {
    /// The user.
    pub id: Uuid,
    /// Whether the address is verified.
    pub verified: bool,
}

/// What [`Accounts::signup_user_counted`](super::Accounts::signup_user_counted) found and counted:
/// the signup's account, the counts of its email (as
/// [`Accounts::count_email_pair`](super::Accounts::count_email_pair) returns them), and the
/// tenant's enabled webhook endpoints (as
/// [`Accounts::webhook_targets`](super::Accounts::webhook_targets)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignupCounted {
    /// The account.
    pub outcome: SignupOutcome,
    /// This address from this client (0: the client is unknown), this address from all
    /// clients (`None`: not counted).
    pub counts: (i64, Option<i64>),
    /// The tenant's enabled webhook endpoints: `(id, events)`.
    pub targets: Vec<(Uuid, String)>,
}

/// The row of [`UserStatements::signup_user_counted`].
#[derive(Debug, FromRow)]
pub struct SignupRow {
    pub(super) inserted: Option<Uuid>,
    pub(super) found: Option<Uuid>,
    pub(super) verified: Option<bool>,
    pub(super) from_client: i64,
    pub(super) to_address: Option<i64>,
    pub(super) targets: Option<String>,
}

/// A user found by address for a login.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct LoginUser {
    /// The user.
    pub id: Uuid,
    /// Whether the address is verified.
    pub verified: bool,
    /// Its password's PHC string, if it has one.
    pub password_hash: Option<String>,
}

/// What accepting an invitation did ([`Accounts::accept_invite`](super::Accounts::accept_invite)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InviteAcceptance {
    /// The account.
    pub user_id: Uuid,
    /// Whether the account was created now (the address had none).
    pub created: bool,
    /// Whether an existing account went from pending to verified now.
    pub verified: bool,
}

/// The statements of users. One set per dialect (`postgres.rs`, `sqlite.rs`), in
/// [`Statements`](super::Statements).
#[derive(Debug, Clone, Copy)]
pub struct UserStatements {
    /// Binds id, tenant, email, source, now. Inserts the user unless (tenant, email) exists;
    /// returns `id` if it did (no row otherwise).
    pub insert_user: &'static str,
    /// Where the dialect can in one statement (data-modifying CTEs): [`Self::insert_user`], the
    /// email's per-address counters and the tenant's webhook endpoints. Binds id, tenant, email,
    /// source, now, the address-and-client bucket (NULL: the client is unknown, only the address
    /// counts), the address bucket, window_start, the per-address cap (64-bit), whether the
    /// client's own cap let the email through. Returns `inserted` (the id, if this inserted the
    /// user), `found`, `verified` (the user that existed in the statement's snapshot, if any,
    /// locked for share: its latest version once a transaction changing it ended), `from_client` (0
    /// when unknown), `to_address` (NULL if not counted), both 64-bit, as
    /// [`LimitStatements::count_email_pair`](super::LimitStatements::count_email_pair) counts them,
    /// and `targets` (NULL or a JSON array of `[id, events]`, as
    /// [`EndpointStatements::webhook_targets`](super::EndpointStatements::webhook_targets) reads
    /// them). `None`: those statements one after another.
    pub signup_user_counted: Option<&'static str>,
    /// Binds tenant, email. Returns `id`, `verified`.
    pub find_user: &'static str,
    /// Binds tenant, email. Returns `id`, `verified`, locking the row until the transaction
    /// ends (PostgreSQL; SQLite's transaction holds the write lock): what an invitation's
    /// acceptance finds stays true until it commits.
    pub lock_user: &'static str,
    /// Binds tenant, email. Returns `id`, `verified`, `password_hash` (login).
    pub login_user: &'static str,
    /// Binds user_id, old password_hash, new password_hash. Replaces the hash only if it is
    /// still the old one (a concurrent reset wins).
    pub rehash_password: &'static str,
    /// Binds user_id, now, password_hash, locale. Verifies a pending user, setting its password
    /// and its locale (the verifying link's: what a stranger's signup left is not kept).
    pub mark_verified: &'static str,
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
    /// Binds user_id. Returns `email`.
    pub user_email: &'static str,
    /// Binds user_id. Returns `email`, `locale` (NULL while the user is pending).
    pub user_email_and_locale: &'static str,
    /// Binds user_id, tenant. Returns the `email` of the user if it belongs to the tenant.
    pub user_in_tenant: &'static str,
    /// Binds user_id, email, now. Gives the user the address, verified (a pending account's
    /// password is cleared, as [`UserStatements::mark_verified`] does), unless another account of
    /// its tenant has it: then no row changes (the unique index would refuse it anyway).
    pub change_email: &'static str,
}
