//! `oncely templates check` and `oncely templates preview`.

use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use anyhow::bail;
use clap::Args;
use clap::Subcommand;
use clap::ValueEnum;
use oncely_outbox::mail::Email;
use oncely_server::accounts::Accounts;
use oncely_server::accounts::Branding;
use oncely_server::backend::COMMAND_POOL;
use oncely_server::branding::ServiceBrand;
use oncely_server::branding::site_of;
use oncely_server::settings::defaults;
use oncely_server::templates::Locale;
use oncely_server::templates::Message;
use oncely_server::templates::Problems;
use oncely_server::templates::Templates;
use oncely_server::templates::Vars;
use oncely_server::templates::escape_link;
use serde_json::json;

use crate::args::BrandArgs;
use crate::args::DatabaseArgs;
use crate::args::parse_templates_dir;
use crate::output::OutputArgs;

/// `oncely templates …`.
#[derive(Debug, Subcommand)]
pub enum TemplatesCommand {
    /// Render every template of every tenant folder and locale with sample data, and check
    /// each: syntax, unknown variables, well-formed HTML, the link in both parts. Each problem
    /// is one line `file:line: reason`; exit 1 if there is any (`serve` and `worker` refuse to
    /// start on the same problems).
    Check {
        /// The templates' directory (docs/emails.md); without it, the embedded templates.
        #[arg(long, env = "ONCELY_TEMPLATES", value_name = "DIR", value_parser = parse_templates_dir)]
        dir: Option<std::path::PathBuf>,
        /// Where the tenants are: each tenant folder must name one (if the database cannot be
        /// opened, the folders are not checked, and the output says so).
        #[command(flatten)]
        #[allow(missing_docs)]
        database: DatabaseArgs,
        #[command(flatten)]
        #[allow(missing_docs)]
        output: OutputArgs,
    },
    /// Render one message as it would be sent, with a sample recipient and link: the tenant's
    /// folder and locale (with the fallbacks), its branding from the database (`default`: the
    /// service's, ONCELY_PRODUCT_NAME …).
    Preview(Box<PreviewArgs>),
}

/// `oncely templates preview`.
#[derive(Debug, Args)]
pub struct PreviewArgs {
    /// The message: verification, password_reset, magic_link, invite, email_change,
    /// signup_notice, email_change_notice or email_taken_notice.
    pub message: String,
    /// Whose templates and branding.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// The locale (BCP 47), as a request would ask for it.
    #[arg(long)]
    pub locale: Option<String>,
    /// What to write: the whole message (`eml`, as sent over SMTP: open it in a mail
    /// client) or one part.
    #[arg(long, value_enum, default_value = "eml")]
    pub part: PreviewPart,
    /// Write to this file instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    /// The templates' directory; without it, the embedded templates.
    #[arg(long, env = "ONCELY_TEMPLATES", value_name = "DIR", value_parser = parse_templates_dir)]
    pub dir: Option<std::path::PathBuf>,
    /// The base of the sample link (as ONCELY_PUBLIC_URL). Default: `http://127.0.0.1:8080`.
    #[arg(long, env = "ONCELY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The service's sender.
    #[arg(long = "mail-from", env = "ONCELY_MAIL_FROM", default_value = defaults::MAIL_FROM)]
    pub mail_from: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub brand: BrandArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseArgs,
}

/// Which part `oncely templates preview` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PreviewPart {
    /// The whole message, MIME (`multipart/alternative`), as sent over SMTP.
    Eml,
    /// The subject line.
    Subject,
    /// The text part.
    Text,
    /// The HTML part (open it in a browser).
    Html,
}

/// `oncely templates check [--dir]`: every problem on its own line (`file:line: reason`), on
/// stdout; an error (exit 1) if there is any. Tenant folders are checked against the tenants of
/// the database if it opens (else the report says they were not).
pub async fn validate<B: Accounts>(
    dir: Option<&Path>,
    database: &DatabaseArgs,
    output: OutputArgs,
) -> anyhow::Result<String> {
    let source = dir.map_or_else(
        || "the embedded templates".to_owned(),
        |dir| format!("{} (over the embedded templates)", dir.display()),
    );
    let (templates, mut problems) = match Templates::load(dir) {
        Ok(templates) => (Some(templates), Vec::new()),
        Err(Problems(problems)) => (None, problems),
    };
    // Tenant folders: against the database's tenants, when there are folders to check.
    let mut tenants_note = None;
    let folders = dir.is_some_and(|dir| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.filter_map(Result::ok).any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                !name.starts_with('.') && name != oncely_server::templates::DEFAULT_SCOPE
            })
        })
    });
    if let (true, Some(templates)) = (folders, &templates) {
        match oncely_server::startup::open_existing::<B>(&database.location(), COMMAND_POOL).await {
            Ok(backend) => {
                let tenants: Vec<String> =
                    backend.tenants().await?.into_iter().map(|t| t.id).collect();
                if let Err(line) = templates.validate_tenants(&tenants) {
                    problems.push(oncely_server::templates::Problem {
                        file: dir.map(|d| d.display().to_string()).unwrap_or_default(),
                        line: None,
                        reason: line,
                    });
                }
            }
            Err(error) => {
                tenants_note = Some(format!(
                    "tenant folders not checked against the tenants (DATABASE_URL: {})",
                    oncely_server::display::one_line(&error)
                ));
            }
        }
    }
    if problems.is_empty() {
        let templates = templates.expect("loaded without problems");
        let files = templates.override_count();
        let tenants = templates.tenant_folder_count();
        if output.json {
            let value = json!({
                "ok": true, "overrides": files, "tenant_folders": tenants, "problems": [],
                "tenant_folders_checked": tenants_note.is_none(),
            });
            return Ok(format!("{}\n", serde_json::to_string_pretty(&value)?));
        }
        let mut out = format!(
            "templates OK: {source}: {files} override file(s), {tenants} tenant folder(s); every message of every folder and locale renders\n"
        );
        if let Some(note) = tenants_note {
            writeln!(out, "{note}")?;
        }
        return Ok(out);
    }
    let mut out = String::new();
    if output.json {
        let list: Vec<_> = problems
            .iter()
            .map(|p| json!({ "file": p.file, "line": p.line, "reason": p.reason }))
            .collect();
        let value = json!({ "ok": false, "problems": list });
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
    } else {
        for problem in &problems {
            writeln!(out, "{problem}")?;
        }
    }
    print!("{out}");
    bail!("{} problem(s) in {source}", problems.len())
}

/// `oncely templates preview MESSAGE`: the message as it would be sent to a sample recipient,
/// with a sample link; a tenant's branding is read from the database.
pub async fn preview<B: Accounts>(args: PreviewArgs) -> anyhow::Result<()> {
    let PreviewArgs {
        message,
        tenant,
        locale,
        part,
        out,
        dir,
        public_url,
        mail_from,
        brand,
        database,
    } = args;
    let Some(message) = Message::parse(&message) else {
        bail!(
            "no message {message:?}: one of {}",
            Message::ALL.map(Message::name).join(", ")
        );
    };
    let tenant = oncely::TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("{e}"))?;
    let locale = locale
        .as_deref()
        .map(Locale::parse)
        .transpose()
        .map_err(|why| anyhow::anyhow!("--locale: {why}"))?;
    let templates = Templates::for_start(dir.as_deref())?;
    let brand = ServiceBrand {
        from: mail_from,
        product_name: brand.product_name,
        support_email: brand.support_email,
        from_domains: brand.senders.mail_from_domains,
    };
    let branding = match tenant == oncely::TenantId::default() {
        true => Branding::default(),
        false => {
            let backend: B =
                oncely_server::startup::open_existing(&database.location(), COMMAND_POOL).await?;
            let tenants: Vec<String> = backend.tenants().await?.into_iter().map(|t| t.id).collect();
            if !tenants.iter().any(|t| t == tenant.as_str()) {
                bail!("no tenant {tenant} (`oncely tenant list` shows them)");
            }
            // As `serve` would refuse them: a folder that names no tenant is a typo.
            templates
                .validate_tenants(&tenants)
                .map_err(anyhow::Error::msg)?;
            backend.branding(tenant.as_str()).await?
        }
    };
    let public_url = public_url.as_deref().unwrap_or("http://127.0.0.1:8080");
    let public_url = public_url.trim_end_matches('/');
    let sender = brand.sender(tenant.as_str(), &branding, &site_of(public_url));
    let recipient = "ada@example.com";
    let link = message.flow().map(|flow| {
        format!(
            "{public_url}{}?token=SAMPLE-TOKEN-NOT-A-REAL-ONE",
            flow.path()
        )
    });
    let vars = Vars {
        product_name: sender.product_name.clone(),
        tenant: tenant.as_str().to_owned(),
        site: site_of(public_url),
        support_email: sender.support_email.clone(),
        recipient: recipient.to_owned(),
        link_lifetime_minutes: message.flow().map(|f| f.lifetime().whole_minutes()),
        link: link.clone(),
        new_email: Some("a***@example.net".to_owned()),
    };
    let rendered = templates
        .render(message, tenant.as_str(), locale.as_ref(), &vars)
        .map_err(|problem| anyhow::anyhow!("{problem}"))?;
    debug_assert!(
        link.as_deref()
            .is_none_or(|l| rendered.html.contains(&escape_link(l)))
    );
    let bytes = match part {
        PreviewPart::Subject => format!("{}\n", rendered.subject).into_bytes(),
        PreviewPart::Text => rendered.text.into_bytes(),
        PreviewPart::Html => rendered.html.into_bytes(),
        PreviewPart::Eml => {
            let email = Email {
                from: sender.from,
                to: recipient.to_owned(),
                subject: rendered.subject,
                text: rendered.text,
                html: Some(rendered.html),
                reply_to: sender.support_email,
            };
            oncely_outbox::mail::formatted(&email, "preview")
                .map_err(|why| anyhow::anyhow!("the message cannot be built: {why}"))?
        }
    };
    match out {
        Some(path) => std::fs::write(&path, bytes)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => {
            use std::io::Write as _;
            std::io::stdout().write_all(&bytes)?;
        }
    }
    Ok(())
}
