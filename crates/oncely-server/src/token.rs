//! One-time tokens (verification, reset, magic links, invites, email changes).
//!
//! A token is 256 bits: HMAC-SHA256 of the server secret over its flow and its record's random
//! id, base64url. Only SHA-256 of the token is stored. The worker derives the same token again
//! when it sends the email, so the token is never stored anywhere in plaintext — not in the
//! tokens table, not in the outbox — and every retry of a send carries the same link.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use oncely::ServerSecret;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Which flow a token belongs to; a token of one flow is useless in another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Email verification after signup (24 h).
    Verification,
    /// Password reset (1 h).
    PasswordReset,
    /// Sign-in link (15 min).
    MagicLink,
    /// Invitation to a tenant (7 days).
    Invite,
    /// Confirmation of a new address for an account (1 h); the token carries the new address.
    EmailChange,
}

impl Flow {
    /// The name stored in the `flow` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Verification => "verification",
            Self::PasswordReset => "password_reset",
            Self::MagicLink => "magic_link",
            Self::Invite => "invite",
            Self::EmailChange => "email_change",
        }
    }

    /// The flow stored as `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Verification,
            Self::PasswordReset,
            Self::MagicLink,
            Self::Invite,
            Self::EmailChange,
        ]
        .into_iter()
        .find(|f| f.as_str() == name)
    }

    /// How long its tokens live.
    pub fn lifetime(self) -> time::Duration {
        match self {
            Self::Verification => time::Duration::hours(24),
            Self::PasswordReset => time::Duration::hours(1),
            Self::MagicLink => time::Duration::minutes(15),
            Self::Invite => time::Duration::days(7),
            Self::EmailChange => time::Duration::hours(1),
        }
    }

    /// The outbox job kind of its email.
    pub fn job_kind(self) -> &'static str {
        match self {
            Self::Verification => "email.verification",
            Self::PasswordReset => "email.password_reset",
            Self::MagicLink => "email.magic_link",
            Self::Invite => "email.invite",
            Self::EmailChange => "email.email_change",
        }
    }

    /// The path its link opens (a page that consumes nothing; its button POSTs there).
    pub fn path(self) -> &'static str {
        match self {
            Self::Verification => "/v1/verify",
            Self::PasswordReset => "/v1/password-reset/confirm",
            Self::MagicLink => "/v1/magic-link/consume",
            Self::Invite => "/v1/invites/accept",
            Self::EmailChange => "/v1/email-change/confirm",
        }
    }
}

/// A token in plaintext: only ever in memory and in the email. Never printed.
pub struct Token(String);

impl Token {
    /// The token of record `id` in `flow`.
    pub fn derive(secret: &ServerSecret, flow: Flow, id: Uuid) -> Self {
        let mac = secret.mac(
            "oncely/token/v1",
            &[flow.as_str().as_bytes(), id.as_bytes()],
        );
        Self(URL_SAFE_NO_PAD.encode(mac))
    }

    /// The text to put in a link.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What is stored: SHA-256 of the token.
    pub fn hash(&self) -> Vec<u8> {
        hash(&self.0)
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token([REDACTED])")
    }
}

/// SHA-256 of a presented token, to look it up. Malformed input just hashes to nothing stored.
pub fn hash(presented: &str) -> Vec<u8> {
    Sha256::digest(presented.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_256_bits_stable_per_record_and_never_printed() {
        let secret = ServerSecret::new(vec![9; 32]).unwrap();
        let id = Uuid::new_v4();
        let a = Token::derive(&secret, Flow::Verification, id);
        let b = Token::derive(&secret, Flow::Verification, id);
        assert_eq!(a.expose(), b.expose());
        assert_eq!(a.expose().len(), 43);
        assert_ne!(
            a.expose(),
            Token::derive(&secret, Flow::Verification, Uuid::new_v4()).expose()
        );
        assert_eq!(a.hash(), hash(a.expose()));
        assert_eq!(format!("{a:?}"), "Token([REDACTED])");
    }
}
