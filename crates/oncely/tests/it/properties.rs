//! Property tests: key parsing, body canonicalisation and exact numbers.

use oncely::IdempotencyKey;
use oncely::fingerprint::{JsonNumber, canonical_body};
use proptest::prelude::*;
use serde_json::Value;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-zA-Z0-9 é\"\\\\]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Writes a value with object keys in reverse order and extra whitespace.
fn scrambled(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.reverse();
            let inner: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| {
                    format!(
                        "\n  {} :  {}",
                        serde_json::to_string(k).unwrap(),
                        scrambled(v)
                    )
                })
                .collect();
            format!("{{ {} }}", inner.join(" ,"))
        }
        Value::Array(items) => {
            format!(
                "[ {} ]",
                items.iter().map(scrambled).collect::<Vec<_>>().join(" , ")
            )
        }
        scalar => serde_json::to_string(scalar).unwrap(),
    }
}

proptest! {
    #[test]
    fn any_bytes_parse_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = IdempotencyKey::parse(&bytes);
    }

    #[test]
    fn bare_visible_keys_round_trip(key in proptest::string::string_regex(&format!("{}{{1,255}}", oncely::key::BARE_KEY_CLASS)).unwrap()) {
        let parsed = IdempotencyKey::parse(&key).unwrap();
        prop_assert_eq!(parsed.as_str(), key.as_str());
    }

    #[test]
    fn sf_strings_round_trip(key in "[!-~]{1,255}") {
        let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
        let parsed = IdempotencyKey::parse(&quoted).unwrap();
        prop_assert_eq!(parsed.as_str(), key.as_str());
    }

    #[test]
    fn keys_over_255_characters_are_refused(key in "[a-z]{256,400}") {
        prop_assert!(IdempotencyKey::parse(&key).is_err());
        let quoted = format!("\"{}\"", key);
        prop_assert!(IdempotencyKey::parse(quoted).is_err());
    }

    #[test]
    fn key_order_and_whitespace_never_change_the_canonical_body(value in json_value()) {
        let compact = serde_json::to_vec(&value).unwrap();
        let messy = scrambled(&value);
        let a = canonical_body(Some("application/json"), &compact, None).unwrap();
        let b = canonical_body(Some("application/json"), messy.as_bytes(), None).unwrap();
        prop_assert_eq!(&a, &b);
        // Canonical form is a fixed point, and still means the same value.
        prop_assert_eq!(canonical_body(Some("application/json"), &a, None).unwrap(), a.clone());
        prop_assert_eq!(serde_json::from_slice::<Value>(&a).unwrap(), value);
    }

    #[test]
    fn different_values_have_different_canonical_bodies(a in json_value(), b in json_value()) {
        prop_assume!(a != b);
        let ca = canonical_body(Some("application/json"), &serde_json::to_vec(&a).unwrap(), None);
        let cb = canonical_body(Some("application/json"), &serde_json::to_vec(&b).unwrap(), None);
        prop_assert_ne!(ca, cb);
    }

    #[test]
    fn every_spelling_of_a_number_is_one_canonical_number(
        significand in 1u64..,
        exponent in -400i64..400,
        shift in 0usize..25,
        zeros in 0usize..4,
        negative in any::<bool>(),
    ) {
        let sign = if negative { "-" } else { "" };
        let digits = significand.to_string();
        let base = format!("{sign}{digits}e{exponent}");
        // The same value: trailing zeros added to the significand, the point moved left.
        let padded = format!("{sign}{digits}{}e{}", "0".repeat(zeros), exponent - zeros as i64);
        let (int, frac) = if shift < digits.len() {
            digits.split_at(digits.len() - shift)
        } else {
            ("0", digits.as_str())
        };
        let lead = if shift > digits.len() { "0".repeat(shift - digits.len()) } else { String::new() };
        let point = if frac.is_empty() { String::new() } else { format!(".{lead}{frac}") };
        let shifted = format!("{sign}{int}{point}E{:+}", exponent + shift as i64);
        let canonical = JsonNumber::parse(&base).unwrap();
        prop_assert_eq!(&JsonNumber::parse(&padded).unwrap(), &canonical);
        prop_assert_eq!(&JsonNumber::parse(&shifted).unwrap(), &canonical, "{}", shifted);
        // The canonical text is a fixed point.
        prop_assert_eq!(&JsonNumber::parse(canonical.as_str()).unwrap(), &canonical);
    }

    #[test]
    fn numbers_are_equal_exactly_when_their_values_are(
        a in 1u64..1_000_000, ea in -20i64..20,
        b in 1u64..1_000_000, eb in -20i64..20,
    ) {
        fn reduce(mut m: u64, mut e: i64) -> (u64, i64) {
            while m.is_multiple_of(10) { m /= 10; e += 1; }
            (m, e)
        }
        let same = reduce(a, ea) == reduce(b, eb);
        let ca = JsonNumber::parse(&format!("{a}e{ea}")).unwrap();
        let cb = JsonNumber::parse(&format!("{b}e{eb}")).unwrap();
        prop_assert_eq!(ca == cb, same);
    }

    #[test]
    fn integers_past_u64_stay_exact(n in (u64::MAX as u128 + 1)..u128::MAX) {
        let text = n.to_string();
        let canonical = JsonNumber::parse(&text).unwrap();
        prop_assert_eq!(canonical.as_str(), text.as_str());
        prop_assert_ne!(JsonNumber::parse(&text).unwrap(), JsonNumber::parse(&(n + 1).to_string()).unwrap());
        let json = |n: u128| canonical_body(Some("application/json"), format!("[{n}]").as_bytes(), None);
        prop_assert_ne!(json(n), json(n + 1));
    }

    #[test]
    fn integers_keep_their_plain_spelling(n in any::<i64>()) {
        let plain = JsonNumber::parse(&n.to_string()).unwrap();
        let pointed = JsonNumber::parse(&format!("{n}.000")).unwrap();
        prop_assert_eq!(plain.as_str(), n.to_string());
        prop_assert_eq!(pointed.as_str(), n.to_string());
    }
}
