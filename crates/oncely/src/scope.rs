//! Who a key belongs to: the tenant, the method and the route template.

use std::fmt;

use crate::IdempotencyKey;

/// A tenant: the owner of a set of keys. Keys of one tenant never answer another's requests.
///
/// 1–128 characters of `A-Z a-z 0-9 - _ . :`; [`TenantId::default`] is `default`.
///
/// ```
/// use oncely::TenantId;
/// assert_eq!(TenantId::parse("acme").unwrap().as_str(), "acme");
/// assert!(TenantId::parse("a b").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantId(String);

/// A tenant name that [`TenantId::parse`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a tenant id is 1-128 characters of A-Z a-z 0-9 - _ . :")]
pub struct InvalidTenant;

impl TenantId {
    /// Validates a tenant id.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidTenant> {
        let value = value.into();
        let valid = (1..=128).contains(&value.len())
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if valid {
            Ok(Self(value))
        } else {
            Err(InvalidTenant)
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TenantId {
    fn default() -> Self {
        Self("default".to_owned())
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The namespace of a key: (tenant, method, route template, key). Two requests share a stored
/// result only if all four are equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    /// Whose key it is.
    pub tenant: TenantId,
    /// The HTTP method, upper case (`POST`).
    pub method: String,
    /// The route template (`/payments/{id}`), not the concrete path.
    pub route: String,
    /// The client's key.
    pub key: IdempotencyKey,
}

impl Scope {
    /// Builds a scope.
    pub fn new(
        tenant: TenantId,
        method: impl Into<String>,
        route: impl Into<String>,
        key: IdempotencyKey,
    ) -> Self {
        Self {
            tenant,
            method: method.into(),
            route: route.into(),
            key,
        }
    }
}
