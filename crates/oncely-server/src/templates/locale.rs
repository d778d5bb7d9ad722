//! Locales: BCP 47 language tags, normalized (`de-AT`, `pt-BR`, `zh-Hant`), as flow requests name
//! them (`locale`, else `Accept-Language`) and as the template directory's folders are named.

use std::fmt;

/// The language of every email whose locale has no templates: the last step of every fallback.
pub const ENGLISH: &str = "en";

/// A well-formed BCP 47 language tag in its normal case (`de-at` → `de-AT`), at most
/// [`Locale::MAX_LEN`] bytes. Built only by [`Locale::parse`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Locale(String);

impl Locale {
    /// The longest tag taken (RFC 5646 §4.4.1 asks implementations for at least 35 bytes).
    pub const MAX_LEN: usize = 35;

    /// Parses and normalizes a tag; a private-use-only tag (`x-…`) is refused: it names no
    /// language.
    pub fn parse(tag: &str) -> Result<Self, String> {
        if tag.len() > Self::MAX_LEN {
            return Err(format!(
                "a locale is a BCP 47 language tag of at most {} characters (e.g. en, de-AT)",
                Self::MAX_LEN
            ));
        }
        let parsed = oxilangtag::LanguageTag::parse_and_normalize(tag)
            .map_err(|_| "a locale is a BCP 47 language tag (e.g. en, de-AT, pt-BR)".to_owned())?;
        if parsed.primary_language().eq_ignore_ascii_case("x") || parsed.as_str().starts_with("x-")
        {
            return Err("a private-use tag names no language (e.g. en, de-AT)".into());
        }
        Ok(Self(parsed.as_str().to_owned()))
    }

    /// The tag.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The tag, then each shorter tag down to its language, as RFC 4647's lookup truncates it
    /// (`zh-Hant-TW` → `zh-Hant-TW`, `zh-Hant`, `zh`; a single-letter subtag is never left at
    /// the end).
    pub fn fallbacks(&self) -> Vec<&str> {
        let mut tags = vec![self.0.as_str()];
        let mut tag = self.0.as_str();
        while let Some((shorter, _)) = tag.rsplit_once('-') {
            tag = shorter;
            if tag.rsplit('-').next().is_some_and(|last| last.len() == 1) {
                continue;
            }
            tags.push(tag);
        }
        tags
    }

    /// The language ranges of an `Accept-Language` header that are tags, best first (`*`, those
    /// with `q=0` — "not acceptable" — and anything malformed left out): a browser's
    /// preferences, never an error.
    pub fn accepted(header: &str) -> Vec<Self> {
        accept_language::parse_with_quality(header)
            .iter()
            .filter(|(_, quality)| *quality > 0.0)
            .filter_map(|(range, _)| Self::parse(range).ok())
            .collect()
    }
}

impl fmt::Display for Locale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_normalized_and_malformed_ones_refused() {
        assert_eq!(Locale::parse("de-at").unwrap().as_str(), "de-AT");
        assert_eq!(Locale::parse("EN").unwrap().as_str(), "en");
        assert_eq!(Locale::parse("zh-hant-tw").unwrap().as_str(), "zh-Hant-TW");
        let fallbacks = |tag: &str| {
            let locale = Locale::parse(tag).unwrap();
            locale
                .fallbacks()
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(fallbacks("de-AT"), ["de-AT", "de"]);
        assert_eq!(fallbacks("de"), ["de"]);
        assert_eq!(fallbacks("zh-Hant-TW"), ["zh-Hant-TW", "zh-Hant", "zh"]);
        assert_eq!(fallbacks("sr-Latn-RS"), ["sr-Latn-RS", "sr-Latn", "sr"]);
        assert_eq!(fallbacks("en-US-x-twain"), ["en-US-x-twain", "en-US", "en"]);
        for bad in [
            "",
            "de_AT",
            "<script>",
            "en-",
            "x-private",
            "../en",
            "en/../../etc",
            &"a".repeat(36),
        ] {
            assert!(Locale::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn accept_language_keeps_the_tags_in_preference_order() {
        let tags: Vec<String> =
            Locale::accepted("fr-CH, fr;q=0.9, *;q=0.5, de;q=0.8, <x>;q=1, it;q=0")
                .iter()
                .map(|l| l.to_string())
                .collect();
        assert_eq!(tags, ["fr-CH", "fr", "de"]);
        assert!(
            Locale::accepted("de;q=0").is_empty(),
            "q=0 is not acceptable"
        );
        assert!(Locale::accepted("").is_empty());
    }
}
