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

/// What [`Accounts::signup_user_counted`](super::Accounts::signup_user_counted) found and counted: the signup's account, the
/// counts of its email (as [`Accounts::count_email_pair`](super::Accounts::count_email_pair) returns them), and the tenant's
/// enabled webhook endpoints (as [`Accounts::webhook_targets`](super::Accounts::webhook_targets)).
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

/// The row of [`Statements::signup_user_counted`](super::Statements::signup_user_counted).
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
