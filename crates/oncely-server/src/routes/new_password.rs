//! A password a request chooses (signup, password reset, invite): its length checked, then
//! hashed before any database work — for every request that has one, whatever the address —
//! within the caller's share of the hashing pool.

use secrecy::SecretString;

use super::error::ApiError;
use crate::client_addr::CallerAddr;
use crate::password;

/// The Argon2id hash of `password`, if given; 400 if it is not 8–128 characters, 503 `busy` if
/// the hashers are.
pub async fn hash_new_password(
    password: Option<String>,
    caller: &CallerAddr,
) -> Result<Option<String>, ApiError> {
    let Some(password) = password else {
        return Ok(None);
    };
    if !password::LENGTH.contains(&password.chars().count()) {
        return Err(ApiError::invalid_request(
            "password must be 8 to 128 characters",
        ));
    }
    let share = caller.bucket();
    let hashed = password::hash_for(share.as_deref(), SecretString::from(password)).await?;
    Ok(Some(hashed))
}
