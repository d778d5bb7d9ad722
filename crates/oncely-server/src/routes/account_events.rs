//! The account flows' events (issue 17, item 2): each is written by [`account_event`] in the
//! transaction of the state change it reports — the idempotency layer's, whose key a retry
//! replays — so a rollback (an error, a race lost, a token already used) writes none, and a
//! change commits with exactly one event id. Its data holds ids and masked addresses
//! ([`crate::email::masked`]) only: never a token, a code, a password or its hash, never an
//! address in clear.
//!
//! | event | written by | data |
//! |---|---|---|
//! | `user.created` | a signup that created the account; an invitation accepted by an address with no account | `user_id`, `email`, `email_verified` |
//! | `user.verified` | a link (verification, magic link, password reset, invitation, email change) that verified a pending account | `user_id`, `email` |
//! | `user.signed_in` | a magic link used; a successful `POST /v1/login` | `user_id`, `email`, `method` (`magic_link`, `password`) |
//! | `user.email_changed` | an email change confirmed | `user_id`, `email`, `previous_email` |
//! | `password.changed` | a password reset completed | `user_id`, `email` |
//! | `invite.accepted` | an invitation accepted | `user_id`, `email`, `created` |

use serde_json::{Value, json};
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use crate::accounts::Accounts;
use crate::backend::Connection;
use crate::email::masked;
use crate::webhooks::{Event, EventType, emit_to};

/// How someone signed in (`user.signed_in`'s `method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignInMethod {
    /// A magic link used.
    MagicLink,
    /// A password checked by `POST /v1/login`.
    Password,
}

impl SignInMethod {
    /// Its name in the event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MagicLink => "magic_link",
            Self::Password => "password",
        }
    }
}

/// The data of an account event: `{user_id, email}` (the address masked) and `extra`'s fields.
pub fn account_data(user: Uuid, email: &str, extra: Value) -> Value {
    let mut data = json!({ "user_id": user, "email": masked(email) });
    if let (Some(data), Value::Object(extra)) = (data.as_object_mut(), extra) {
        data.extend(extra);
    }
    data
}

/// Writes the event `kind` about account `user` (address `email`) of `tenant`, with `extra`
/// data, in the caller's transaction: one outbox job per enabled endpoint of the tenant that
/// subscribed to it (none when it has none).
pub async fn account_event<A: Accounts>(
    conn: &mut Connection<A>,
    state: &AppState<A>,
    tenant: &str,
    kind: EventType,
    user: Uuid,
    email: &str,
    extra: Value,
) -> Result<(), ApiError> {
    let targets = A::webhook_targets(conn, tenant).await?;
    account_event_to(conn, state, tenant, &targets, kind, user, email, extra).await
}

/// As [`account_event`], to the webhook endpoints `targets` the caller read in this
/// transaction.
#[allow(clippy::too_many_arguments)]
pub async fn account_event_to<A: Accounts>(
    conn: &mut Connection<A>,
    state: &AppState<A>,
    tenant: &str,
    targets: &[(Uuid, String)],
    kind: EventType,
    user: Uuid,
    email: &str,
    extra: Value,
) -> Result<(), ApiError> {
    let event = Event::new(kind, account_data(user, email, extra));
    let written = emit_to::<A>(conn, &state.jobs, targets, &event).await?;
    tracing::debug!(event = %event.id, kind = %kind, tenant, user = %user, written, "event written");
    Ok(())
}

/// The address of account `user` of `tenant`, read in the caller's transaction (a used link's
/// account: locked, so it is the address the event reports).
pub async fn address_of<A: Accounts>(
    conn: &mut Connection<A>,
    tenant: &str,
    user: Uuid,
) -> Result<String, ApiError> {
    A::user_in_tenant(conn, tenant, user)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the account of a used link is not its tenant's").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_data_holds_the_id_the_masked_address_and_the_extra_fields() {
        let user = Uuid::nil();
        let data = account_data(
            user,
            "ada@example.com",
            json!({ "previous_email": masked("old@example.com"), "created": true }),
        );
        assert_eq!(
            data,
            json!({
                "user_id": user,
                "email": "a***@example.com",
                "previous_email": "o***@example.com",
                "created": true,
            })
        );
        assert!(!data.to_string().contains("ada@"));
    }
}
