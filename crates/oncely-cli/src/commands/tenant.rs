//! `oncely tenant create|list|rotate-key|set`.

use std::fmt::Write;
use std::time::Duration;

use anyhow::bail;
use clap::Subcommand;
use clap::ValueEnum;
use oncely_server::accounts::AccountError;
use oncely_server::accounts::Accounts;
use oncely_server::accounts::TenantRecord;
use oncely_server::accounts::from_millis;
use oncely_server::backend::COMMAND_POOL;
use oncely_server::display::when;
use oncely_server::settings::defaults;
use oncely_server::webhooks::EventType;
use oncely_server::webhooks::events::subscribed;
use serde::Serialize;
use serde_json::json;
use time::OffsetDateTime;

use crate::args::DatabaseArgs;
use crate::args::SenderArgs;
use crate::commands::OperatorArgs;
use crate::commands::outbox::rfc3339;
use crate::commands::webhook::WebhookCommand;
use crate::commands::webhook::parse_grace;
use crate::commands::webhook::webhook;
use crate::output::Failure;
use crate::output::OutputArgs;
use crate::output::clean;
use crate::output::grace_words;
use crate::output::refuse;
use crate::output::render;
use crate::output::render_line;
use crate::output::render_list;

/// `oncely tenant …`.
#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its API key (once: only its hash is stored).
    Create {
        /// The tenant's id: 1-128 characters of A-Z a-z 0-9 - _ . : (not `default`).
        name: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// List tenants: name, created, the fingerprint of each valid key (never a key), and the
    /// return URLs.
    List {
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Give a tenant a new API key and print it (once). The old key stops working at once, or
    /// with --grace when that period ends (one previous key at a time: a rotation within a
    /// grace period ends the older key's).
    RotateKey {
        /// The tenant's id.
        name: String,
        /// Keep the old key working this long (`1h`, `30m`, at most `30d`), while clients move
        /// to the new one. Default: it stops at once.
        #[arg(long, value_parser = parse_grace)]
        grace: Option<Duration>,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Set a tenant's return URLs (where its links send the browser back, with a one-time code
    /// its backend exchanges: `POST /v1/exchange`; the list is replaced, the first is the
    /// default of requests that name none), how its emails go out (`--email-delivery`), and
    /// its emails' branding (`--product-name`, `--mail-from`, `--support-email`; docs/emails.md).
    /// At least one of them.
    #[command(group(
        clap::ArgGroup::new("what")
            .required(true)
            .multiple(true)
            .args(["return_urls", "no_return_urls", "email_delivery", "product_name", "mail_from", "support_email"])
    ))]
    Set {
        /// The tenant's id (not `default`: it has no API key to exchange codes with).
        name: String,
        /// A return URL (repeat for several, in order): https (http only for localhost,
        /// 127.0.0.0/8 or [::1]), no user info, no fragment, written canonically.
        #[arg(
            long = "return-url",
            value_name = "URL",
            conflicts_with = "no_return_urls"
        )]
        return_urls: Vec<String>,
        /// Clear the list: links return nowhere, as before.
        #[arg(long)]
        no_return_urls: bool,
        /// How the tenant's emails go out: `mail` (oncely sends them, the default) or `webhook`
        /// (oncely sends none: each is an `email.requested` event to the tenant's endpoints,
        /// for the application to send). `webhook` needs an enabled endpoint that receives
        /// `email.requested` (explicitly or by receiving every event).
        #[arg(long, value_enum, value_name = "HOW")]
        email_delivery: Option<EmailDelivery>,
        /// The product name the tenant's emails show (`""`: the service's, ONCELY_PRODUCT_NAME).
        #[arg(long, value_name = "NAME")]
        product_name: Option<String>,
        /// The sender of the tenant's emails, `"Name <address>"` or an address, on a domain the
        /// mailer may send as (ONCELY_MAIL_FROM's or one of ONCELY_MAIL_FROM_DOMAINS); `""`: the
        /// service's, ONCELY_MAIL_FROM.
        #[arg(long, value_name = "SENDER")]
        mail_from: Option<String>,
        /// Where the tenant's users write with questions: shown in its emails, and their
        /// Reply-To (`""`: the service's, ONCELY_SUPPORT_EMAIL).
        #[arg(long, value_name = "ADDRESS")]
        support_email: Option<String>,
        /// The service's sender: a tenant's must share its domain (or one of
        /// ONCELY_MAIL_FROM_DOMAINS).
        #[arg(long = "service-mail-from", env = "ONCELY_MAIL_FROM", default_value = defaults::MAIL_FROM, hide = true)]
        service_mail_from: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        senders: SenderArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        operator: OperatorArgs,
    },
    /// Manage the tenant's webhook endpoints: where its events go, signed.
    #[command(subcommand)]
    Webhook(WebhookCommand),
}

/// How a tenant's emails go out (`oncely tenant set --email-delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmailDelivery {
    /// oncely sends them (the mailer).
    Mail,
    /// oncely hands each to the tenant's endpoints as an `email.requested` event.
    Webhook,
}

impl EmailDelivery {
    /// As stored (`oncely_tenants.email_delivery`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mail => "mail",
            Self::Webhook => "webhook",
        }
    }
}

impl TenantCommand {
    /// Where the tenants are, and how it prints.
    pub fn operator(&self) -> &OperatorArgs {
        match self {
            Self::Create { operator, .. }
            | Self::List { operator, .. }
            | Self::RotateKey { operator, .. }
            | Self::Set { operator, .. } => operator,
            Self::Webhook(command) => command.operator(),
        }
    }

    /// Where the tenants are.
    pub fn database(&self) -> &DatabaseArgs {
        &self.operator().database
    }

    /// How it prints.
    pub fn output(&self) -> OutputArgs {
        self.operator().output
    }
}

/// The name of a tenant a command acts on: a valid tenant id other than `default`.
pub fn tenant_name(name: &str) -> anyhow::Result<oncely::TenantId> {
    let tenant = oncely::TenantId::parse(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    if tenant == oncely::TenantId::default() {
        bail!("`default` is the tenant of requests without an API key; choose another name");
    }
    Ok(tenant)
}

/// The name of a new tenant: a [`tenant_name`] other than the reserved ones — `gateway:…` (the
/// tenants of `oncely gateway`, which may share the database: a tenant named so would share
/// keys with a gateway's callers) and `_default` (the templates' folder of tenants without
/// their own), in any case.
pub fn new_tenant_name(name: &str) -> anyhow::Result<oncely::TenantId> {
    let tenant = tenant_name(name)?;
    let prefix = oncely_gateway::TENANT_PREFIX;
    if name
        .get(..prefix.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
    {
        bail!("names starting with `{prefix}` are the gateway's tenants; choose another name");
    }
    if name.eq_ignore_ascii_case("_default") {
        bail!(
            "`_default` is the templates' folder of tenants without their own; choose another name"
        );
    }
    Ok(tenant)
}

/// What identifies an API key without revealing it: the first 12 hex digits of its SHA-256
/// (the stored hash): `printf %s "$KEY" | sha256sum | cut -c1-12` gives the same.
pub fn key_fingerprint(api_key_hash: &[u8]) -> String {
    let mut hex = hex::encode(api_key_hash);
    hex.truncate(12);
    hex
}

/// `oncely tenant create`: creates `tenant` with a new API key and returns the key (only its
/// hash is stored). A name that is taken says so; any other failure (the database down, busy)
/// says what it was.
pub async fn create_tenant<B: Accounts>(
    backend: &B,
    tenant: &oncely::TenantId,
) -> anyhow::Result<String> {
    use oncely_server::routes::tenants::{hash_api_key, new_api_key};
    let key = new_api_key();
    match backend
        .create_tenant(tenant.as_str(), &hash_api_key(&key))
        .await
    {
        Ok(()) => Ok(key),
        Err(AccountError::Conflict(_)) => Err(refuse(
            Failure::TenantExists,
            format!(
                "tenant {tenant} already exists (`oncely tenant rotate-key {tenant}` gives it a new key)"
            ),
        )),
        Err(error) => {
            Err(anyhow::Error::new(error).context(format!("tenant {tenant} was not created")))
        }
    }
}

/// A tenant in `tenant list --json`.
#[derive(Debug, Serialize)]
pub struct TenantView {
    /// The tenant's id.
    pub tenant: String,
    /// When it was created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Its API key's fingerprint ([`key_fingerprint`]).
    pub key_fingerprint: String,
    /// The previous key's fingerprint, while that key still works (after a rotation with
    /// `--grace`).
    pub previous_key_fingerprint: Option<String>,
    /// Until when the previous key works.
    #[serde(with = "time::serde::rfc3339::option")]
    pub previous_key_valid_until: Option<OffsetDateTime>,
    /// Where its links return, in order (`tenant set --return-url`).
    pub return_urls: Vec<String>,
    /// How its emails go out: `mail` or `webhook` (`tenant set --email-delivery`).
    pub email_delivery: String,
    /// Its emails' product name (`tenant set --product-name`); null: the service's.
    pub product_name: Option<String>,
    /// Its emails' sender (`tenant set --mail-from`); null: the service's.
    pub mail_from: Option<String>,
    /// Its emails' support address (`tenant set --support-email`); null: the service's.
    pub support_email: Option<String>,
}

impl From<TenantRecord> for TenantView {
    fn from(tenant: TenantRecord) -> Self {
        Self {
            tenant: tenant.id,
            created_at: from_millis(tenant.created_at_ms),
            key_fingerprint: key_fingerprint(&tenant.api_key_hash),
            previous_key_fingerprint: tenant.previous_key_hash.as_deref().map(key_fingerprint),
            previous_key_valid_until: tenant.previous_key_expires_at_ms.map(from_millis),
            return_urls: Vec::new(),
            email_delivery: tenant.email_delivery,
            product_name: tenant.product_name,
            mail_from: tenant.mail_from,
            support_email: tenant.support_email,
        }
    }
}

/// The tenant of `tenant set`, and its return URLs, each checked
/// ([`oncely_server::code::validate_return_url`]); the `default` tenant is refused: it has no API key, so
/// its codes could never be exchanged, and no row for branding (the service's settings are its).
pub(crate) fn tenant_to_set(
    name: &str,
    urls: &[String],
    urls_given: bool,
) -> anyhow::Result<oncely::TenantId> {
    let tenant = oncely::TenantId::parse(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    if tenant == oncely::TenantId::default() {
        match urls_given {
            true => bail!(
                "the default tenant takes no return URLs: it has no API key, so its codes could never be exchanged (create a tenant with `oncely tenant create`)"
            ),
            false => bail!(
                "the default tenant has no settings of its own: oncely sends its emails, with the service's branding (ONCELY_PRODUCT_NAME, ONCELY_MAIL_FROM, ONCELY_SUPPORT_EMAIL); create a tenant for anything else (`oncely tenant create`)"
            ),
        }
    }
    for (i, url) in urls.iter().enumerate() {
        oncely_server::code::validate_return_url(url)?;
        if urls[..i].contains(url) {
            bail!("{url:?} is given twice");
        }
    }
    Ok(tenant)
}

/// `oncely tenant create|list|rotate-key|set` on backend `B`: what to print.
pub async fn tenant<B: Accounts>(command: TenantCommand) -> anyhow::Result<String> {
    use oncely_server::routes::tenants::{hash_api_key, new_api_key};
    let command = match command {
        TenantCommand::Webhook(command) => return webhook::<B>(command).await,
        command => command,
    };
    let output = command.output();
    // Checked before anything connects.
    let named = match &command {
        TenantCommand::Create { name, .. } => Some(new_tenant_name(name)?),
        TenantCommand::RotateKey { name, .. } => Some(tenant_name(name)?),
        TenantCommand::List { .. } | TenantCommand::Webhook(_) => None,
        TenantCommand::Set {
            name,
            return_urls,
            no_return_urls,
            ..
        } => {
            // At least one of them: clap's group `what` (a usage error, exit 2, otherwise).
            let urls = !return_urls.is_empty() || *no_return_urls;
            Some(tenant_to_set(name, return_urls, urls)?)
        }
    };
    let backend: B =
        oncely_server::startup::open_existing(&command.database().location(), COMMAND_POOL).await?;
    match (command, named) {
        (TenantCommand::Create { .. }, Some(tenant)) => {
            let key = create_tenant(&backend, &tenant).await?;
            let value = json!({
                "tenant": tenant.as_str(),
                "api_key": key,
                "key_fingerprint": key_fingerprint(&hash_api_key(&key)),
            });
            render_line(
                output,
                &value,
                format_args!(
                    "tenant {tenant} created. Its API key (shown once; only a hash is stored):\n{key}"
                ),
            )
        }
        (TenantCommand::RotateKey { grace, .. }, Some(tenant)) => {
            let key = new_api_key();
            let grace = grace.unwrap_or_default();
            let Some(rotated) = backend
                .rotate_tenant_key(tenant.as_str(), &hash_api_key(&key), grace)
                .await?
            else {
                return Err(refuse(
                    Failure::NotFound,
                    format!("no tenant {tenant} (`oncely tenant list` shows them)"),
                ));
            };
            let until = rotated.previous_valid_until;
            let value = json!({
                "tenant": tenant.as_str(),
                "api_key": key,
                "key_fingerprint": key_fingerprint(&hash_api_key(&key)),
                "previous_key_valid_until": until.map(rfc3339),
            });
            let old = grace_words(until, "keeps working", "no longer works");
            render_line(
                output,
                &value,
                format_args!(
                    "tenant {tenant} has a new API key; the old key {old}. The new key (shown \
                     once; only a hash is stored):\n{key}"
                ),
            )
        }
        (
            TenantCommand::Set {
                return_urls,
                no_return_urls,
                email_delivery,
                product_name,
                mail_from,
                support_email,
                service_mail_from,
                senders,
                ..
            },
            Some(tenant),
        ) => {
            let brand = oncely_server::branding::ServiceBrand {
                from: service_mail_from,
                from_domains: senders.mail_from_domains,
                ..Default::default()
            };
            // `""` clears; anything else is checked before anything changes.
            let given = |value: Option<String>| value.map(|v| Some(v).filter(|v| !v.is_empty()));
            let (product_name, mail_from, support_email) =
                (given(product_name), given(mail_from), given(support_email));
            if let Some(Some(name)) = &product_name {
                oncely_server::branding::validate_product_name(name)
                    .map_err(|why| anyhow::anyhow!("--product-name: {why}"))?;
            }
            if let Some(Some(from)) = &mail_from {
                brand
                    .validate_from(from)
                    .map_err(|why| anyhow::anyhow!("--mail-from: {why}"))?;
            }
            let support_email = match support_email {
                Some(Some(address)) => Some(Some(
                    oncely_server::branding::parse_support_email(&address)
                        .map_err(|why| anyhow::anyhow!("--support-email: {why}"))?,
                )),
                other => other,
            };
            let branding_given =
                product_name.is_some() || mail_from.is_some() || support_email.is_some();
            let not_found = || {
                refuse(
                    Failure::NotFound,
                    format!("no tenant {tenant} (`oncely tenant list` shows them)"),
                )
            };
            if !backend
                .tenants()
                .await?
                .iter()
                .any(|t| t.id == tenant.as_str())
            {
                return Err(not_found());
            }
            // Refused before anything changes.
            if email_delivery == Some(EmailDelivery::Webhook) {
                let receives = backend
                    .webhook_endpoints(Some(tenant.as_str()))
                    .await?
                    .iter()
                    .any(|e| {
                        e.disabled_at_ms.is_none()
                            && subscribed(&e.events, EventType::EmailRequested)
                    });
                if !receives {
                    bail!(
                        "tenant {tenant} has no enabled webhook endpoint that receives email.requested: its emails would go nowhere. Add one first (`oncely tenant webhook add {tenant} URL --events email.requested`, or without --events for every event)"
                    );
                }
            }
            let urls_given = !return_urls.is_empty() || no_return_urls;
            if urls_given
                && !backend
                    .set_return_urls(tenant.as_str(), &return_urls)
                    .await?
            {
                return Err(not_found());
            }
            if let Some(how) = email_delivery
                && !backend
                    .set_email_delivery(tenant.as_str(), how.as_str())
                    .await?
            {
                return Err(not_found());
            }
            let mut branding = backend.branding(tenant.as_str()).await?;
            if branding_given {
                if let Some(name) = product_name {
                    branding.product_name = name;
                }
                if let Some(from) = mail_from {
                    branding.mail_from = from;
                }
                if let Some(address) = support_email {
                    branding.support_email = address;
                }
                if !backend.set_branding(tenant.as_str(), &branding).await? {
                    return Err(not_found());
                }
            }
            let mut value = json!({ "tenant": tenant.as_str() });
            if branding_given {
                value["product_name"] = json!(branding.product_name);
                value["mail_from"] = json!(branding.mail_from);
                value["support_email"] = json!(branding.support_email);
            }
            if urls_given {
                value["return_urls"] = json!(return_urls);
            }
            if let Some(how) = email_delivery {
                value["email_delivery"] = json!(how.as_str());
            }
            render(output, &value, |out| {
                if urls_given {
                    match return_urls.as_slice() {
                        [] => writeln!(out, "tenant {tenant} has no return URLs")?,
                        urls => writeln!(
                            out,
                            "tenant {tenant} returns to (the first by default):\n{}",
                            urls.join("\n")
                        )?,
                    }
                }
                match email_delivery {
                    Some(EmailDelivery::Webhook) => writeln!(
                        out,
                        "tenant {tenant}'s emails go to its endpoints as email.requested events: oncely mails none"
                    )?,
                    Some(EmailDelivery::Mail) => {
                        writeln!(out, "tenant {tenant}'s emails are sent by oncely")?;
                    }
                    None => {}
                }
                if branding_given {
                    let or_service = |value: &Option<String>, setting: &str| {
                        value
                            .clone()
                            .unwrap_or_else(|| format!("the service's ({setting})"))
                    };
                    writeln!(
                        out,
                        "tenant {tenant}'s emails: product name {}, from {}, support address {}",
                        or_service(&branding.product_name, "ONCELY_PRODUCT_NAME"),
                        or_service(&branding.mail_from, "ONCELY_MAIL_FROM"),
                        or_service(&branding.support_email, "ONCELY_SUPPORT_EMAIL"),
                    )?;
                }
                Ok(())
            })
        }
        (TenantCommand::List { .. }, _) => {
            let mut tenants: Vec<TenantView> = backend
                .tenants()
                .await?
                .into_iter()
                .map(TenantView::from)
                .collect();
            for (id, url) in backend.all_return_urls().await? {
                if let Some(view) = tenants.iter_mut().find(|t| t.tenant == id) {
                    view.return_urls.push(url);
                }
            }
            render_list(
                output,
                &tenants,
                "no tenants (requests without an API key act for `default`)",
                &[
                    "tenant",
                    "created",
                    "key (sha256)",
                    "previous key",
                    "return URLs",
                    "emails",
                ],
                |t| {
                    vec![
                        t.tenant.clone(),
                        when(t.created_at),
                        t.key_fingerprint.clone(),
                        match (&t.previous_key_fingerprint, t.previous_key_valid_until) {
                            (Some(previous), Some(until)) => {
                                format!("{previous} until {}", when(until))
                            }
                            _ => "-".into(),
                        },
                        match t.return_urls.as_slice() {
                            [] => "-".into(),
                            urls => clean(&urls.join(" ")),
                        },
                        t.email_delivery.clone(),
                    ]
                },
            )
        }
        (
            TenantCommand::Create { .. }
            | TenantCommand::RotateKey { .. }
            | TenantCommand::Set { .. },
            None,
        ) => {
            unreachable!("named above")
        }
        (TenantCommand::Webhook(_), _) => unreachable!("handled above"),
    }
}
