//! Property tests: key parsing and body canonicalisation.

use oncely::IdempotencyKey;
use oncely::fingerprint::canonical_body;
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
}
