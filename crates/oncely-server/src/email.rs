//! Email addresses as the service stores and compares them.

use std::fmt;

/// A normalized, validated address: trimmed, domain converted to ASCII (IDNA), lower case.
/// Uniqueness of accounts is on this form.
///
/// Strict on purpose: no display names (`Ada <a@x.io>`), no domain literals (`a@[1.2.3.4]`),
/// a dot in the domain, at most 254 characters, and only what the mailer can address
/// ([`oncely_outbox::mail::recipient`]: no quoted local parts) through any SMTP server (a local
/// part in ASCII: SMTPUTF8 is not everywhere; the domain may be international, as IDNA).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EmailAddress(String);

/// Why an address was refused (one generic message: the reasons are for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a valid email address")]
pub struct InvalidEmail(pub &'static str);

impl EmailAddress {
    /// Normalizes and validates: an address oncely takes and mails.
    pub fn parse(raw: &str) -> Result<Self, InvalidEmail> {
        let address = Self::parse_stored(raw)?;
        let local = address.0.rsplit_once('@').map_or("", |(local, _)| local);
        // And what the mailer can send to (RFC 5322 allows quoted local parts it refuses): an
        // address accepted here must never die in the worker. A local part beyond ASCII needs
        // a server that offers SMTPUTF8 (RFC 6531), which not every one does: refused too.
        oncely_outbox::mail::recipient(&address.0).map_err(|_| InvalidEmail("not deliverable"))?;
        if !local.is_ascii() {
            return Err(InvalidEmail("local part beyond ASCII"));
        }
        Ok(address)
    }

    /// Normalizes and validates as [`EmailAddress::parse`] did before it refused what the
    /// mailer cannot send to: to find an account an earlier release may have stored (a login,
    /// which sends nothing), never to take a new address.
    pub fn parse_stored(raw: &str) -> Result<Self, InvalidEmail> {
        let trimmed = raw.trim();
        let (local, domain) = trimmed.rsplit_once('@').ok_or(InvalidEmail("no @"))?;
        if local.is_empty() || domain.is_empty() {
            return Err(InvalidEmail("empty part"));
        }
        if domain.starts_with('[') {
            return Err(InvalidEmail("domain literal"));
        }
        let domain = idna::domain_to_ascii(domain).map_err(|_| InvalidEmail("domain not IDNA"))?;
        if !domain.contains('.') || domain.starts_with('.') || domain.ends_with('.') {
            return Err(InvalidEmail("domain needs a dot"));
        }
        let address = format!("{local}@{domain}").to_lowercase();
        if address.len() > 254 {
            return Err(InvalidEmail("too long"));
        }
        let options = email_address::Options::default()
            .without_display_text()
            .without_domain_literal();
        email_address::EmailAddress::parse_with_options(&address, options)
            .map_err(|_| InvalidEmail("syntax"))?;
        Ok(Self(address))
    }

    /// The normalized address.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A form safe for logs: first letter of the local part and the domain (`a***@example.com`).
    pub fn masked(&self) -> String {
        masked(&self.0)
    }
}

/// `address` as [`EmailAddress::masked`] shows it.
pub fn masked(address: &str) -> String {
    let (local, domain) = address.rsplit_once('@').unwrap_or(("", address));
    format!("{}***@{domain}", local.chars().next().unwrap_or('*'))
}

impl fmt::Debug for EmailAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EmailAddress({})", self.masked())
    }
}

/// Rewrites `email` (and an email change's `new_email`) fields of a JSON body to their
/// normalized form before fingerprinting, so that `Ada@Example.com` and `ada@example.com` are
/// the same request.
pub fn normalize_json_email(value: &mut oncely::CanonicalJson) {
    for field in ["email", "new_email"] {
        if let Some(raw) = value
            .get_mut(field)
            .and_then(oncely::CanonicalJson::as_string_mut)
            && let Ok(email) = EmailAddress::parse(raw)
        {
            *raw = email.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_trimmed_lowercased_and_idna_encoded() {
        assert_eq!(
            EmailAddress::parse("  Ada@Example.COM ").unwrap().as_str(),
            "ada@example.com"
        );
        assert_eq!(
            EmailAddress::parse("jo@bücher.de").unwrap().as_str(),
            "jo@xn--bcher-kva.de"
        );
    }

    #[test]
    fn strict_validation() {
        for bad in [
            "",
            "ada",
            "@x.io",
            "ada@",
            "ada@localhost",
            "Ada <ada@x.io>",
            "ada@[127.0.0.1]",
            "a b@x.io",
            "ada@x..io",
            "ada@.x.io",
            // Quoted local parts: valid RFC 5322, refused by the mailer.
            "\"<img src=x onerror=alert(1)>\"@acme.test",
            "\"ada lovelace\"@acme.test",
            "\"a@b\"@acme.test",
            // Beyond ASCII, a local part needs SMTPUTF8 of every server on the way.
            "jörg@acme.test",
            "用户@acme.test",
        ] {
            assert!(
                EmailAddress::parse(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
        let long = format!("{}@example.com", "a".repeat(250));
        assert!(EmailAddress::parse(&long).is_err());
    }

    #[test]
    fn an_account_an_earlier_release_stored_is_still_found() {
        for stored in ["jörg@acme.test", "\"ada lovelace\"@acme.test"] {
            assert!(EmailAddress::parse(stored).is_err());
            assert_eq!(EmailAddress::parse_stored(stored).unwrap().as_str(), stored);
        }
    }

    #[test]
    fn logs_get_a_masked_form() {
        let email = EmailAddress::parse("ada@example.com").unwrap();
        assert_eq!(email.masked(), "a***@example.com");
        assert!(!format!("{email:?}").contains("ada@"));
    }
}
