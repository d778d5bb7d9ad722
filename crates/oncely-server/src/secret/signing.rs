//! An endpoint's signing secret: made (`whsec_` + base64 of 32 random bytes, as Standard
//! Webhooks writes it), sealed for the database, unsealed to sign, and the signature itself.
//!
//! Sealing: XChaCha20-Poly1305 under a key derived from the server secret (HMAC-SHA256 with the
//! label [`SEAL_LABEL`]), the endpoint's id as associated data (a sealed secret copied onto
//! another endpoint's row does not open), a random 24-byte nonce per seal. Stored as
//! `v1.` + base64(nonce ‖ ciphertext). Unsealing tries the current server secret, then the
//! previous ones (`ONCELY_SECRET_PREVIOUS`), as links do: a server-secret rotation keeps every
//! endpoint signing.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use oncely::ServerSecret;
use rand::RngCore;
use sha2::Sha256;
use uuid::Uuid;

/// The purpose label of the sealing key's derivation from the server secret.
pub const SEAL_LABEL: &str = "oncely/webhook-secret-seal/v1";

/// The prefix of a signing secret, as Standard Webhooks writes it.
pub const PREFIX: &str = "whsec_";

const SEALED_VERSION: &str = "v1.";

/// An endpoint's signing secret in clear: only in memory, once in the CLI's output, and in the
/// dev inbox. Its `Debug` shows nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(String);

impl SigningSecret {
    /// A new secret: `whsec_` + base64 of 32 random bytes.
    pub fn generate() -> Self {
        let mut key = [0_u8; 32];
        rand::rng().fill_bytes(&mut key);
        Self(format!("{PREFIX}{}", STANDARD.encode(key)))
    }

    /// A secret in its written form (`whsec_…`); `None` if it is not one (no prefix, not
    /// base64, or empty).
    pub fn parse(text: &str) -> Option<Self> {
        let key = STANDARD.decode(text.strip_prefix(PREFIX)?).ok()?;
        (!key.is_empty()).then(|| Self(text.to_owned()))
    }

    /// The written form, `whsec_…`: to print once, or to hand to a receiver.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The HMAC key: the bytes the base64 after `whsec_` encodes.
    fn key(&self) -> Vec<u8> {
        STANDARD
            .decode(self.0.strip_prefix(PREFIX).unwrap_or_default())
            .unwrap_or_default()
    }

    /// The Standard Webhooks signature of a message: `v1,` + base64 of
    /// HMAC-SHA256(key, `<id>.<timestamp>.<body>`).
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(&self.key())
            .expect("HMAC accepts keys of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret([REDACTED])")
    }
}

/// The `webhook-signature` header's value: one signature per secret, space-separated (during a
/// rotation's grace both the new and the previous secret sign, as the specification allows).
pub fn signature_header(
    secrets: &[SigningSecret],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .iter()
        .map(|secret| secret.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a sealed secret did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsealError {
    /// Not something [`seal`] wrote.
    #[error("the sealed signing secret is malformed")]
    Malformed,
    /// No server secret (current or previous) opens it, or it belongs to another endpoint.
    #[error(
        "no server secret opens the endpoint's signing secret (was ONCELY_SECRET changed without ONCELY_SECRET_PREVIOUS?)"
    )]
    NoKey,
}

fn cipher(secret: &ServerSecret) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new(&secret.mac(SEAL_LABEL, &[]).into())
}

/// Seals `signing` for the row of endpoint `endpoint` under the current server secret.
pub fn seal(secret: &ServerSecret, endpoint: Uuid, signing: &SigningSecret) -> String {
    let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
    let sealed = cipher(secret)
        .encrypt(
            &nonce,
            Payload {
                msg: signing.expose().as_bytes(),
                aad: endpoint.as_bytes(),
            },
        )
        .expect("XChaCha20-Poly1305 seals any message this short");
    let mut bytes = nonce.to_vec();
    bytes.extend_from_slice(&sealed);
    format!("{SEALED_VERSION}{}", STANDARD.encode(bytes))
}

/// Opens what [`seal`] wrote for endpoint `endpoint`, with the current server secret or a
/// previous one.
pub fn unseal(
    secret: &ServerSecret,
    endpoint: Uuid,
    sealed: &str,
) -> Result<SigningSecret, UnsealError> {
    open(secret, endpoint, sealed).map(|(signing, _)| signing)
}

/// [`unseal`], and whether it took a previous server secret (then the secret should be sealed
/// again under the current one: [`reseal`]).
pub fn open(
    secret: &ServerSecret,
    endpoint: Uuid,
    sealed: &str,
) -> Result<(SigningSecret, bool), UnsealError> {
    let bytes = sealed
        .strip_prefix(SEALED_VERSION)
        .and_then(|b| STANDARD.decode(b).ok())
        .filter(|b| b.len() > 24)
        .ok_or(UnsealError::Malformed)?;
    let (nonce, ciphertext) = bytes.split_at(24);
    let nonce: [u8; 24] = nonce.try_into().map_err(|_| UnsealError::Malformed)?;
    let nonce = XNonce::from(nonce);
    for (position, candidate) in secret.all().enumerate() {
        if let Ok(clear) = cipher(candidate).decrypt(
            &nonce,
            Payload {
                msg: ciphertext,
                aad: endpoint.as_bytes(),
            },
        ) {
            let text = String::from_utf8(clear).map_err(|_| UnsealError::Malformed)?;
            let signing = SigningSecret::parse(&text).ok_or(UnsealError::Malformed)?;
            return Ok((signing, position > 0));
        }
    }
    Err(UnsealError::NoKey)
}

/// `sealed` sealed again under the current server secret, if only a previous one opens it
/// (`None`: nothing to do, or no configured secret opens it).
pub fn reseal(secret: &ServerSecret, endpoint: Uuid, sealed: &str) -> Option<String> {
    match open(secret, endpoint, sealed) {
        Ok((signing, true)) => Some(seal(secret, endpoint, &signing)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(byte: u8) -> ServerSecret {
        ServerSecret::new(vec![byte; 32]).unwrap()
    }

    #[test]
    fn a_secret_is_whsec_and_32_bytes_and_never_printed() {
        let secret = SigningSecret::generate();
        assert!(secret.expose().starts_with("whsec_"));
        assert_eq!(secret.key().len(), 32);
        assert_ne!(secret, SigningSecret::generate());
        assert_eq!(format!("{secret:?}"), "SigningSecret([REDACTED])");
        assert!(SigningSecret::parse("whsec_").is_none());
        assert!(SigningSecret::parse("sec_AAAA").is_none());
    }

    /// The example of the Standard Webhooks specification (and of its reference libraries).
    #[test]
    fn signatures_match_the_specification_example() {
        let secret = SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signature = secret.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn sealing_round_trips_under_the_current_and_a_previous_server_secret() {
        let endpoint = Uuid::new_v4();
        let signing = SigningSecret::generate();
        let old = server(1);
        let sealed = seal(&old, endpoint, &signing);
        assert!(!sealed.contains(signing.expose()));
        assert!(!sealed.contains(signing.expose().trim_start_matches(PREFIX)));
        assert_ne!(
            sealed,
            seal(&old, endpoint, &signing),
            "a fresh nonce per seal"
        );
        assert_eq!(unseal(&old, endpoint, &sealed).unwrap(), signing);
        // After a server-secret rotation with the old one as previous: still opens.
        let rotated = server(2).with_previous(vec![server(1)]);
        assert_eq!(unseal(&rotated, endpoint, &sealed).unwrap(), signing);
        // Without it: does not.
        assert_eq!(
            unseal(&server(2), endpoint, &sealed),
            Err(UnsealError::NoKey)
        );
        // Another endpoint's row: does not.
        assert_eq!(
            unseal(&old, Uuid::new_v4(), &sealed),
            Err(UnsealError::NoKey)
        );
        assert_eq!(
            unseal(&old, endpoint, "v1.AAAA"),
            Err(UnsealError::Malformed)
        );
        assert_eq!(
            unseal(&old, endpoint, signing.expose()),
            Err(UnsealError::Malformed)
        );
    }
}
