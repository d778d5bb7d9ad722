//! `oncely templates check` and `oncely templates preview`.

use std::fmt::Write;
use std::path::Path;

use anyhow::{Context, bail};
use oncely_outbox::mail::Email;
use serde_json::json;

use super::{Locale, Message, Problems, Templates, Vars, escape_link};
use crate::accounts::{Accounts, Branding};
use crate::backend::COMMAND_POOL;
use crate::branding::{ServiceBrand, site_of};
use crate::cli::{DatabaseArgs, OutputArgs, PreviewArgs, PreviewPart};

/// `oncely templates check [--dir]`: every problem on its own line (`file:line: reason`), on
/// stdout; an error (exit 1) if there is any. Tenant folders are checked against the tenants of
/// the database if it opens (else the report says they were not).
pub async fn check<B: Accounts>(
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
                !name.starts_with('.') && name != super::DEFAULT_SCOPE
            })
        })
    });
    if let (true, Some(templates)) = (folders, &templates) {
        match crate::startup::open_existing::<B>(&database.location(), COMMAND_POOL).await {
            Ok(backend) => {
                let tenants: Vec<String> =
                    backend.tenants().await?.into_iter().map(|t| t.id).collect();
                if let Err(line) = templates.check_tenants(&tenants) {
                    problems.push(super::Problem {
                        file: dir.map(|d| d.display().to_string()).unwrap_or_default(),
                        line: None,
                        reason: line,
                    });
                }
            }
            Err(error) => {
                tenants_note = Some(format!(
                    "tenant folders not checked against the tenants (DATABASE_URL: {})",
                    crate::startup::one_line(&error)
                ));
            }
        }
    }
    if problems.is_empty() {
        let templates = templates.expect("loaded without problems");
        let files = templates.sources.overrides.len();
        let tenants = templates.sources.tenant_scopes().len();
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
                crate::startup::open_existing(&database.location(), COMMAND_POOL).await?;
            let tenants: Vec<String> = backend.tenants().await?.into_iter().map(|t| t.id).collect();
            if !tenants.iter().any(|t| t == tenant.as_str()) {
                bail!("no tenant {tenant} (`oncely tenant list` shows them)");
            }
            // As `serve` would refuse them: a folder that names no tenant is a typo.
            templates
                .check_tenants(&tenants)
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
