//! Passwords: Argon2id with OWASP's minimum parameters (19 MiB, 2 passes, 1 lane), hashed on
//! the blocking pool so request threads keep serving.

use argon2::password_hash::{PasswordHasher, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use secrecy::{ExposeSecret, SecretString};

/// Shortest and longest accepted password, in characters.
pub const LENGTH: std::ops::RangeInclusive<usize> = 8..=128;

fn hasher() -> Argon2<'static> {
    let params = Params::new(19 * 1024, 2, 1, None).expect("valid Argon2 parameters");
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// Hashes a password into a PHC string (`$argon2id$v=19$m=19456,t=2,p=1$…`).
pub async fn hash(password: SecretString) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())
            .map_err(|e| anyhow::anyhow!("encoding a salt: {e}"))?;
        hasher()
            .hash_password(password.expose_secret().as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| anyhow::anyhow!("hashing a password: {e}"))
    })
    .await?
}

/// Whether `password` matches the PHC string `phc` (on the blocking pool, like [`hash`]).
pub async fn verify(phc: &str, password: SecretString) -> anyhow::Result<bool> {
    use argon2::{PasswordHash, PasswordVerifier};
    let phc = phc.to_owned();
    tokio::task::spawn_blocking(move || {
        let parsed = PasswordHash::new(&phc)
            .map_err(|e| anyhow::anyhow!("a stored hash is invalid: {e}"))?;
        Ok(hasher()
            .verify_password(password.expose_secret().as_bytes(), &parsed)
            .is_ok())
    })
    .await?
}

#[cfg(test)]
mod tests {
    use argon2::{PasswordHash, PasswordVerifier};

    #[tokio::test]
    async fn hashes_are_argon2id_with_owasp_parameters_and_verify() {
        let phc = super::hash("correct horse battery".to_owned().into())
            .await
            .unwrap();
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{phc}");
        let parsed = PasswordHash::new(&phc).unwrap();
        assert!(
            super::hasher()
                .verify_password(b"correct horse battery", &parsed)
                .is_ok()
        );
        assert!(super::hasher().verify_password(b"wrong", &parsed).is_err());
    }
}
