//! Who an email is from and what it calls the product: the service's defaults
//! (`ONCELY_MAIL_FROM`, `ONCELY_PRODUCT_NAME`, `ONCELY_SUPPORT_EMAIL`) and each tenant's own
//! (`oncely tenant set --mail-from --product-name --support-email`), and which senders the
//! mailer may send as (`ONCELY_MAIL_FROM_DOMAINS`).

use lettre::message::Mailbox;

use crate::accounts::Branding;
use crate::email::EmailAddress;

/// The longest product name taken.
pub const MAX_PRODUCT_NAME: usize = 100;

/// The service's branding: what a tenant without its own gets, and the senders it allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceBrand {
    /// `ONCELY_MAIL_FROM`: the sender of every email whose tenant names none.
    pub from: String,
    /// `ONCELY_PRODUCT_NAME`; `None`: the public URL's host (and, for a tenant other than
    /// `default`, the tenant: `acme on accounts.example.com`).
    pub product_name: Option<String>,
    /// `ONCELY_SUPPORT_EMAIL`: where users write with questions (the templates show it; it is
    /// the emails' `Reply-To`).
    pub support_email: Option<String>,
    /// `ONCELY_MAIL_FROM_DOMAINS`: the domains a tenant's sender may have besides
    /// `ONCELY_MAIL_FROM`'s (the domains the mail provider lets this service send as).
    pub from_domains: Vec<String>,
}

/// What one email says about its sender and product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sender {
    /// `From`.
    pub from: String,
    /// The product name the templates show.
    pub product_name: String,
    /// The support address (templates, `Reply-To`).
    pub support_email: Option<String>,
}

impl ServiceBrand {
    /// Whether the mailer may send as `from` (`Name <address>` or an address): its domain is
    /// `ONCELY_MAIL_FROM`'s or one of `ONCELY_MAIL_FROM_DOMAINS`. The error is one line that
    /// says what to do.
    pub fn validate_from(&self, from: &str) -> Result<(), String> {
        let mailbox: Mailbox = from.parse().map_err(|_| {
            format!("{from:?} is not a sender: write an address or \"Name <address>\"")
        })?;
        if let Some(name) = &mailbox.name
            && (looks_like_an_address(name) || has_hidden_characters(name))
        {
            return Err(format!(
                "the sender's name {name:?} must not look like an address (no @, < or >) nor hide characters (control or direction marks)"
            ));
        }
        let domain = ascii_domain(mailbox.email.domain());
        let own = self
            .from
            .parse::<Mailbox>()
            .ok()
            .map(|m| ascii_domain(m.email.domain()));
        let allowed: Vec<String> = own
            .into_iter()
            .chain(self.from_domains.iter().map(|d| ascii_domain(d.trim())))
            .filter(|d| !d.is_empty())
            .collect();
        if allowed.contains(&domain) {
            return Ok(());
        }
        Err(format!(
            "the mailer may not send as {}: its domain {domain} is not ONCELY_MAIL_FROM's nor one of ONCELY_MAIL_FROM_DOMAINS ({}); add it there once the mail provider lets this service send as it",
            mailbox.email,
            match allowed.as_slice() {
                [] => "none".to_owned(),
                domains => domains.join(", "),
            }
        ))
    }

    /// The sender of `tenant`'s emails with its `branding`, whose links start with `site`
    /// (the public URL's host). A tenant sender the mailer may no longer send as (the allowed
    /// domains changed since `tenant set`) gives way to `ONCELY_MAIL_FROM`, with a warning.
    pub fn sender(&self, tenant: &str, branding: &Branding, site: &str) -> Sender {
        let from = match &branding.mail_from {
            Some(from) => match self.validate_from(from) {
                Ok(()) => from.clone(),
                Err(why) => {
                    tracing::warn!(tenant, "{why}: sending as ONCELY_MAIL_FROM instead");
                    self.from.clone()
                }
            },
            None => self.from.clone(),
        };
        let product_name = branding
            .product_name
            .clone()
            .or_else(|| self.product_name.clone())
            .unwrap_or_else(|| match tenant == oncely::TenantId::default().as_str() {
                true => site.to_owned(),
                false => format!("{tenant} on {site}"),
            });
        Sender {
            from,
            product_name,
            support_email: branding
                .support_email
                .clone()
                .or_else(|| self.support_email.clone()),
        }
    }
}

/// A domain in ASCII (IDNA) and lower case, as it is compared (`bücher.example` →
/// `xn--bcher-kva.example`); as given if it does not convert.
pub fn ascii_domain(domain: &str) -> String {
    idna::domain_to_ascii(domain).unwrap_or_else(|_| domain.to_ascii_lowercase())
}

/// Whether `text` holds characters a reader does not see: controls (newlines among them), line
/// and paragraph separators, and the format and filler characters that reorder, hide or blank
/// text (bidirectional marks, overrides and isolates, zero-width characters, the soft hyphen,
/// tag characters, Hangul fillers).
fn has_hidden_characters(text: &str) -> bool {
    text.chars().any(|c| {
        c.is_control()
            || matches!(
                c,
                '\u{00ad}'
                    | '\u{061c}'
                    | '\u{115f}'..='\u{1160}'
                    | '\u{180e}'
                    | '\u{200b}'..='\u{200f}'
                    | '\u{2028}'..='\u{202e}'
                    | '\u{2060}'..='\u{206f}'
                    | '\u{3164}'
                    | '\u{feff}'
                    | '\u{ffa0}'
                    | '\u{e0000}'..='\u{e007f}'
            )
    })
}

/// Whether a sender's display name could be read as an address: `@`, `<`, `>` or a look-alike
/// of one (fullwidth, small forms).
fn looks_like_an_address(name: &str) -> bool {
    name.contains([
        '@', '<', '>', '\u{ff20}', '\u{fe6b}', '\u{ff1c}', '\u{ff1e}', '\u{fe64}', '\u{fe65}',
    ])
}

/// A product name as given: 1–[`MAX_PRODUCT_NAME`] characters, not only spaces, nothing hidden
/// (no control characters, no direction marks).
pub fn validate_product_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() || name.chars().count() > MAX_PRODUCT_NAME {
        return Err(format!("a product name is 1-{MAX_PRODUCT_NAME} characters"));
    }
    if has_hidden_characters(name) {
        return Err(
            "a product name has no control characters (no newlines) and no direction or zero-width marks"
                .into(),
        );
    }
    Ok(())
}

/// A support address as given: an address the service accepts and the mailers can send as
/// `Reply-To` (no quoted local part), returned normalized.
pub fn parse_support_email(address: &str) -> Result<String, String> {
    let refused = || format!("{address:?} is not an email address a mailer can reply to");
    let address = EmailAddress::parse(address).map_err(|_| refused())?;
    // As the SMTP mailer reads a `Reply-To`.
    address.as_str().parse::<Mailbox>().map_err(|_| refused())?;
    Ok(address.as_str().to_owned())
}

/// The host (and port) of a public URL: `https://accounts.example.com:8443/auth/` →
/// `accounts.example.com:8443` (no path: it names the site).
pub fn site_of(public_url: &str) -> String {
    match url::Url::parse(public_url) {
        Ok(url) => match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            _ => public_url.to_owned(),
        },
        Err(_) => public_url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brand() -> ServiceBrand {
        ServiceBrand {
            from: "Accounts <no-reply@mail.example.com>".into(),
            from_domains: vec!["Acme.test".into()],
            ..ServiceBrand::default()
        }
    }

    #[test]
    fn a_sender_is_allowed_only_on_the_services_domains() {
        let brand = brand();
        brand.validate_from("Acme <hello@acme.test>").unwrap();
        brand.validate_from("team@MAIL.example.com").unwrap();
        let refused = brand
            .validate_from("Acme <hello@evil.example>")
            .unwrap_err();
        assert!(refused.contains("evil.example"), "{refused}");
        assert!(refused.contains("mail.example.com, acme.test"), "{refused}");
        assert!(brand.validate_from("not a mailbox").is_err());
        // A name that looks like another sender, or hides characters (review of issue 18).
        for name in [
            "\"Acme <x@evil.example>\" <hello@acme.test>",
            "\"x@evil.example\" <hello@acme.test>",
            "\"Acme \u{202e}moc.live\" <hello@acme.test>",
            "\"x\u{ff20}evil.example\" <hello@acme.test>",
            "\"Acme\u{2028}x\" <hello@acme.test>",
        ] {
            assert!(brand.validate_from(name).is_err(), "{name}");
        }
        // An internationalized domain compares in its ASCII form, however it is written.
        let idn = ServiceBrand {
            from_domains: vec!["bücher.example".into()],
            ..brand.clone()
        };
        idn.validate_from("Bücher <hello@bücher.example>").unwrap();
        idn.validate_from("hello@xn--bcher-kva.example").unwrap();
        assert!(
            brand
                .validate_from("a@acme.test\r\nBcc: x@evil.example")
                .is_err()
        );
    }

    #[test]
    fn a_tenant_without_branding_gets_the_services_and_a_refused_sender_falls_back() {
        let brand = brand();
        let plain = brand.sender("acme", &Branding::default(), "accounts.example.com");
        assert_eq!(plain.product_name, "acme on accounts.example.com");
        assert_eq!(plain.from, brand.from);
        let default = brand.sender("default", &Branding::default(), "accounts.example.com");
        assert_eq!(default.product_name, "accounts.example.com");
        let moved = Branding {
            mail_from: Some("Acme <hello@gone.example>".into()),
            product_name: Some("Acme".into()),
            support_email: Some("help@acme.test".into()),
        };
        let sender = brand.sender("acme", &moved, "accounts.example.com");
        assert_eq!(sender.from, brand.from);
        assert_eq!(sender.product_name, "Acme");
        assert_eq!(sender.support_email.as_deref(), Some("help@acme.test"));
    }

    #[test]
    fn the_site_is_the_public_urls_host_and_port_without_its_path() {
        assert_eq!(
            site_of("https://accounts.example.com/auth/"),
            "accounts.example.com"
        );
        assert_eq!(site_of("http://127.0.0.1:8080"), "127.0.0.1:8080");
        assert_eq!(site_of("https://[::1]:8443/x"), "[::1]:8443");
    }

    #[test]
    fn product_names_and_support_addresses_are_checked() {
        validate_product_name("Acme Accounts").unwrap();
        for bad in ["", "   ", "Acme\nBcc: x", &"a".repeat(101)] {
            assert!(validate_product_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_support_email(" Help@Acme.test ").unwrap(),
            "help@acme.test"
        );
        assert!(parse_support_email("nope").is_err());
        // Accepted by the address rules but not sendable as Reply-To: every email would die.
        assert!(parse_support_email("\"a b\"@acme.test").is_err());
        for hidden in [
            "\u{202e}",
            "\u{061c}",
            "\u{2028}",
            "\u{e0041}",
            "\u{3164}",
            "\u{00ad}",
        ] {
            assert!(
                validate_product_name(&format!("Acme {hidden}x")).is_err(),
                "{hidden:?}"
            );
        }
    }
}
