//! The account statements: one set per dialect ([`AccountSql::ACCOUNT_SQL`], in
//! `accounts/postgres.rs` and `accounts/sqlite.rs`), per aggregate, under the names of the aggregate's statements
//! (beside its rows: [`UserStatements`], [`TokenStatements`], …). Each field says what the Rust
//! binds, in order ($1, $2, … on PostgreSQL; ?1, ?2, … on SQLite): the binding is written once,
//! in [`super::Accounts`], so both dialects must take the same parameters in the same order.
//!
//! `now` is an instant bound by the caller ([`crate::backend::Backend::at`]): NULL on
//! PostgreSQL, which then reads its own clock (`COALESCE($n, now())`); on SQLite the process
//! clock, in Unix milliseconds.

use super::{
    CodeStatements, EndpointStatements, LimitStatements, TenantStatements, TokenStatements,
    UserStatements,
};
use crate::backend::Backend;

/// A backend's account statements, in its dialect: implemented beside them (in
/// `accounts/postgres.rs` and `accounts/sqlite.rs`), so that the backend seam names no
/// statement of the account flows.
pub trait AccountSql: Backend {
    /// The account statements in this database's dialect.
    const ACCOUNT_SQL: Statements;
}

/// The SQL of the account flows in one dialect, per aggregate.
#[derive(Debug, Clone, Copy)]
pub struct Statements {
    /// The statements of users.
    pub users: UserStatements,
    /// The statements of the email and login caps' counters.
    pub limits: LimitStatements,
    /// The statements of token records.
    pub tokens: TokenStatements,
    /// The statements of tenants.
    pub tenants: TenantStatements,
    /// The statements of one-time codes.
    pub codes: CodeStatements,
    /// The statements of webhook endpoints.
    pub endpoints: EndpointStatements,
}

/// A dialect's [`Statements`]: its aggregates' sets, the consts `USERS`, `LIMITS`, `TOKENS`,
/// `TENANTS`, `CODES` and `ENDPOINTS` of the module it is written in.
macro_rules! statements {
    () => {
        Statements {
            users: USERS,
            limits: LIMITS,
            tokens: TOKENS,
            tenants: TENANTS,
            codes: CODES,
            endpoints: ENDPOINTS,
        }
    };
}
pub(super) use statements;
