//! Fuzzing by property, at scale: email normalization and token handling take any input without
//! panicking and keep their invariants. `ONCELY_FUZZ_CASES` sets the cases per property (default
//! 4,000; the whole file runs in seconds).

use oncely::{CanonicalJson, ServerSecret};
use oncely_server::email::{EmailAddress, normalize_json_email};
use oncely_server::token::{Flow, Token, hash};
use proptest::prelude::*;
use serde_json::json;

fn cases() -> u32 {
    std::env::var("ONCELY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000)
}

/// Address-like text: mostly near-valid shapes, with Unicode, spaces, dots and brackets mixed in.
fn addressish() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ \\t]{0,2}[A-Za-z0-9._%+\\-\"()<>\\[\\]\\\\,;:é漢]{0,70}@[A-Za-z0-9.\\-é漢\\[\\]]{0,70}[ ]{0,2}",
        "[a-z]{1,64}@[a-z]{1,63}\\.[a-z]{2,6}",
        "[a-zA-Z0-9.]{1,300}@[a-z]{1,200}\\.com",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn address_normalization_never_panics_and_is_a_fixed_point(raw in addressish()) {
        if let Ok(address) = EmailAddress::parse(&raw) {
            let text = address.as_str();
            prop_assert!(text.len() <= 254);
            prop_assert_eq!(text, text.to_lowercase());
            prop_assert_eq!(text.trim(), text);
            prop_assert!(text.rsplit_once('@').unwrap().1.is_ascii(), "the domain is ASCII (IDNA): {}", text);
            let again = EmailAddress::parse(text).expect("a normalized address parses");
            prop_assert_eq!(again.as_str(), text, "normalization is idempotent");
            // Logs get the first character of the local part and the domain, never the rest.
            let (local, domain) = text.rsplit_once('@').unwrap();
            let first = local.chars().next().unwrap();
            prop_assert_eq!(address.masked(), format!("{first}***@{domain}"));
            let printed = format!("{:?}", address);
            prop_assert!(printed.contains(&address.masked()), "{}", printed);
            // (A one-character local part is all shown by the rule above — and `*@d` is inside
            // the mask `****@d`: the rest is what must not show.)
            if local.chars().count() > 1 {
                prop_assert!(!printed.contains(text), "Debug shows the address: {}", printed);
            }
        }
    }

    #[test]
    fn body_normalization_never_panics_and_only_touches_a_valid_email(
        raw in addressish(),
        other in any::<i64>(),
    ) {
        let text = serde_json::to_vec(&json!({ "email": raw, "n": other })).unwrap();
        let mut body = CanonicalJson::parse(&text).expect("a JSON object parses");
        normalize_json_email(&mut body);
        let email = body.get("email").and_then(CanonicalJson::as_str);
        match EmailAddress::parse(&raw) {
            Ok(address) => prop_assert_eq!(email, Some(address.as_str())),
            Err(_) => prop_assert_eq!(email, Some(raw.as_str())),
        }
        let n = other.to_string();
        prop_assert_eq!(
            body.get("n"),
            Some(&CanonicalJson::Number(oncely::fingerprint::JsonNumber::parse(&n).unwrap()))
        );
        let mut twice = body.clone();
        normalize_json_email(&mut twice);
        prop_assert_eq!(twice, body);
    }

    #[test]
    fn any_presented_token_hashes_without_panicking(presented in any::<String>()) {
        prop_assert_eq!(hash(&presented).len(), 32);
    }

    #[test]
    fn issued_tokens_are_url_safe_43_characters_and_hash_as_presented(
        secret in prop::collection::vec(any::<u8>(), 32..64),
        id in any::<u128>(),
    ) {
        let secret = ServerSecret::new(secret).unwrap();
        for flow in [Flow::Verification, Flow::PasswordReset, Flow::MagicLink, Flow::Invite, Flow::EmailChange] {
            let token = Token::derive(&secret, flow, uuid::Uuid::from_u128(id));
            let text = token.expose();
            prop_assert_eq!(text.len(), 43);
            prop_assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            prop_assert_eq!(hash(text), token.hash(), "the stored hash is the hash of the link's token");
            prop_assert_eq!(format!("{token:?}"), "Token([REDACTED])");
        }
    }
}
