//! `oncely key show`: an idempotency key's record, for a support case.

use std::fmt::Write;

use clap::Subcommand;
use oncely_server::accounts::Accounts;
use oncely_server::backend::COMMAND_POOL;
use serde::Serialize;
use time::OffsetDateTime;

use crate::commands::OperatorArgs;
use crate::output::Failure;
use crate::output::clean;
use crate::output::refuse;
use crate::output::render;
use crate::output::when_or_dash;

/// `oncely key …`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Show where a key stands: in progress, completed (with the stored answer) or tombstoned.
    Show {
        /// The key, as the client sent it (without sf-string quotes).
        key: String,
        /// The route template.
        #[arg(long, default_value = "/v1/signup")]
        route: String,
        /// The method.
        #[arg(long, default_value = "POST")]
        method: String,
        /// The tenant.
        #[arg(long, default_value = "default")]
        tenant: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
}

/// `oncely key show --json`.
#[derive(Debug, Serialize)]
pub struct KeyView {
    /// The tenant.
    pub tenant: String,
    /// The method.
    pub method: String,
    /// The route template.
    pub route: String,
    /// The key.
    pub key: String,
    /// `in_progress`, `completed` or `tombstoned`.
    pub state: &'static str,
    /// For `in_progress`: whether its lease still runs (else the next retry takes it over).
    pub lease_active: Option<bool>,
    /// The request's fingerprint (HMAC-SHA256), 64 hex digits.
    pub fingerprint: String,
    /// When its retention ends: then the key is free again.
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    /// For `completed`: what it replays.
    pub response: Option<ResponseView>,
    /// For `tombstoned`: why.
    pub tombstone_reason: Option<String>,
}

/// The answer a completed key replays.
#[derive(Debug, Serialize)]
pub struct ResponseView {
    /// The status.
    pub status: u16,
    /// The replayed headers, `[name, value]` pairs.
    pub headers: Vec<(String, String)>,
    /// The body, as text (invalid UTF-8 replaced).
    pub body: String,
}

/// `oncely key show`: the state of one idempotency key, and the answer it replays. A key that
/// is not there (never used, or past its retention) is [`Failure::NotFound`].
pub async fn key_show<B: Accounts>(command: KeyCommand) -> anyhow::Result<String> {
    use oncely::store::{KeyStore, RecordState};
    use oncely::{IdempotencyKey, Scope, TenantId};
    let KeyCommand::Show {
        key,
        route,
        method,
        tenant,
        operator: OperatorArgs { database, output },
    } = command;
    let tenant = TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("{e}"))?;
    let key = IdempotencyKey::parse(&key).map_err(|e| anyhow::anyhow!("{e}"))?;
    let scope = Scope::new(tenant, method.to_uppercase(), route, key);
    let (backend, _): (B, _) =
        oncely_server::startup::open_for_keys(&database.location(), COMMAND_POOL).await?;
    let title = format!(
        "tenant {} · {} {} · key {:?}",
        scope.tenant,
        clean(&scope.method),
        clean(&scope.route),
        scope.key.as_str()
    );
    let Some(record) = backend.keys().get(&scope).await? else {
        return Err(refuse(
            Failure::NotFound,
            format!(
                "{title}: not found: never used, or its retention has passed (a request with it \
                 runs afresh)"
            ),
        ));
    };
    let (state, lease_active, response, tombstone_reason) = match record.state {
        RecordState::InProgress { lease_active } => ("in_progress", Some(lease_active), None, None),
        RecordState::Completed(response) => (
            "completed",
            None,
            Some(ResponseView {
                status: response.status,
                headers: response.headers,
                body: String::from_utf8_lossy(&response.body).into_owned(),
            }),
            None,
        ),
        RecordState::Tombstoned { reason } => ("tombstoned", None, None, Some(reason)),
    };
    let view = KeyView {
        tenant: scope.tenant.to_string(),
        method: scope.method.clone(),
        route: scope.route.clone(),
        key: scope.key.as_str().to_owned(),
        state,
        lease_active,
        fingerprint: hex::encode(record.fingerprint.as_bytes()),
        expires_at: record.expires_at.map(OffsetDateTime::from),
        response,
        tombstone_reason,
    };
    render(output, &view, |out| {
        writeln!(out, "{title}")?;
        match (&view.response, view.lease_active, &view.tombstone_reason) {
            (Some(response), _, _) => {
                writeln!(out, "state: completed; replays status {}", response.status)?;
            }
            (_, Some(true), _) => writeln!(out, "state: in progress (lease running)")?,
            (_, Some(false), _) => writeln!(
                out,
                "state: in progress, lease expired (the next retry takes it over)"
            )?,
            (_, _, reason) => writeln!(
                out,
                "state: tombstoned ({})",
                clean(reason.as_deref().unwrap_or_default())
            )?,
        }
        writeln!(out, "fingerprint: {}", view.fingerprint)?;
        writeln!(
            out,
            "expires: {} (then the key is free again)",
            when_or_dash(view.expires_at)
        )?;
        if let Some(response) = &view.response {
            for (name, value) in &response.headers {
                writeln!(out, "  {}: {}", clean(name), clean(value))?;
            }
            writeln!(out, "  body: {}", clean(&response.body))?;
        }
        Ok(())
    })
}
