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
#[derive(Clone)]
pub struct TenantId {
    id: String,
    /// How many leading bytes of `id` logs show (all but a secret suffix).
    shown: usize,
}

/// A tenant name that [`TenantId::parse`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a tenant id is 1-128 characters of A-Z a-z 0-9 - _ . :")]
pub struct InvalidTenant;

impl TenantId {
    /// Validates a tenant id.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidTenant> {
        let id = value.into();
        let valid = (1..=128).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if valid {
            Ok(Self {
                shown: id.len(),
                id,
            })
        } else {
            Err(InvalidTenant)
        }
    }

    /// `prefix` followed by `secret` (a keyed hash of a credential, say): the tenant is both, but
    /// logs and `Debug` show only `prefix` and `…` ([`TenantId::for_logs`]). Validated as
    /// [`TenantId::parse`].
    ///
    /// ```
    /// use oncely::TenantId;
    /// let tenant = TenantId::with_secret_suffix("caller-", "3fa9c2").unwrap();
    /// assert_eq!(tenant.as_str(), "caller-3fa9c2");
    /// assert_eq!(tenant.for_logs(), "caller-…");
    /// assert!(!format!("{tenant:?}").contains("3fa9"));
    /// ```
    pub fn with_secret_suffix(prefix: &str, secret: &str) -> Result<Self, InvalidTenant> {
        let mut tenant = Self::parse(format!("{prefix}{secret}"))?;
        tenant.shown = prefix.len();
        Ok(tenant)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The id as logs show it: whole, or without its secret suffix
    /// ([`TenantId::with_secret_suffix`]).
    pub fn for_logs(&self) -> std::borrow::Cow<'_, str> {
        match self.shown < self.id.len() {
            true => format!("{}…", &self.id[..self.shown]).into(),
            false => self.id.as_str().into(),
        }
    }
}

// Equal ids are one tenant, however they were made.
impl PartialEq for TenantId {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for TenantId {}

impl std::hash::Hash for TenantId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TenantId").field(&self.for_logs()).finish()
    }
}

impl Default for TenantId {
    fn default() -> Self {
        Self::parse("default").expect("a valid tenant id")
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
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
