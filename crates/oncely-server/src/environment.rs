//! The deployment environment (`ONCELY_ENV`): what the defaults, the secret's rules and the
//! dev pages depend on.

/// The deployment environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Environment {
    /// A developer's machine.
    Development,
    /// Real traffic: no generated secrets, no dev pages.
    Production,
}

impl Environment {
    /// Every environment, as written in `ONCELY_ENV`.
    pub const ALL: [Self; 2] = [Self::Development, Self::Production];

    /// As written in `ONCELY_ENV`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Development => "development",
            Self::Production => "production",
        }
    }

    /// What it means, for `--help`.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::Development => "A developer's machine",
            Self::Production => "Real traffic: no generated secrets, no dev pages",
        }
    }
}

impl std::str::FromStr for Environment {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == text)
            .ok_or_else(|| format!("expected development or production, not {text:?}"))
    }
}
