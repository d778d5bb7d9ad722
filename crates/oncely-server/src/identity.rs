//! What oncely proves to an application: who a person is. `POST /v1/exchange` (a one-time code
//! from a consumed link) and `POST /v1/login` (a password) answer the same [`Identity`]; the
//! application keeps its own sessions.

use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

/// How an identity was proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Proof {
    /// An email verification link (after signup).
    Verification,
    /// A password reset link.
    PasswordReset,
    /// A magic sign-in link.
    MagicLink,
    /// An invitation link.
    Invite,
    /// A password, `POST /v1/login`.
    Password,
}

/// The identity an application receives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Identity {
    /// The account.
    pub user_id: Uuid,
    /// Its address now (normalized).
    #[schema(example = "ada@example.com")]
    pub email: String,
    /// Whether the address is verified.
    pub email_verified: bool,
    /// The tenant of the account.
    #[schema(example = "acme")]
    pub tenant: String,
    /// How it was proven.
    pub flow: Proof,
    /// When it was proven (the link consumed, the password checked), RFC 3339.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub authenticated_at: OffsetDateTime,
}

/// Now, to the millisecond: the precision of the instants the exchange reads from the database,
/// so that every identity's `authenticated_at` reads alike.
pub fn now() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_millisecond(now.millisecond())
        .expect("a millisecond of a valid instant is valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_to_the_millisecond() {
        assert_eq!(now().nanosecond() % 1_000_000, 0);
    }

    #[test]
    fn an_identity_is_the_documented_json() {
        let identity = Identity {
            user_id: Uuid::nil(),
            email: "ada@example.com".into(),
            email_verified: true,
            tenant: "acme".into(),
            flow: Proof::MagicLink,
            authenticated_at: OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap(),
        };
        assert_eq!(
            serde_json::to_value(&identity).unwrap(),
            serde_json::json!({
                "user_id": "00000000-0000-0000-0000-000000000000",
                "email": "ada@example.com",
                "email_verified": true,
                "tenant": "acme",
                "flow": "magic_link",
                "authenticated_at": "2027-01-15T08:00:00Z",
            })
        );
    }
}
