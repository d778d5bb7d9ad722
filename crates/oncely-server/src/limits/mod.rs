//! Limits: the caps on emails sent ([`mail`]) and on failed logins ([`login`]) — what they are,
//! how an attempt is counted against them, and the names of their counters. The routes that
//! email or log in count through them; the database rows are the account storage's.

use oncely::ServerSecret;

pub mod login;
pub mod mail;

/// How many times its total a per-address cap lets through at most, first attempts of new
/// clients included (they pass the total itself, so that strangers cannot lock an owner out).
pub const HARD_CEILING: i64 = 2;

/// The counter of `value` under `kind`: a keyed hash, so that the limits table never holds an
/// address.
pub fn bucket(secret: &ServerSecret, kind: &str, value: &str) -> String {
    let mac = secret.mac("oncely/rate-limit/v1", &[kind.as_bytes(), value.as_bytes()]);
    format!("{kind}:{}", hex::encode(&mac[..16]))
}
