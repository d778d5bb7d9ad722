//! `oncely inbox expect`: waits for mail in a running test inbox, for shell scripts in CI. It
//! asks the inbox's `GET /messages/wait` (in turns of at most a minute, the most one wait
//! takes), then each message's `GET /messages/{id}/links`, and prints one line — the link
//! `--link-matches` chose, or the messages' ids — or one JSON document with `--json`.
//!
//! Failures are errors that [`crate::output::failed`] prints as one line: fewer messages than
//! expected in time or an unknown run exit 3 ([`Failure::Timeout`], [`Failure::NotFound`]), no
//! matching link 4 ([`Failure::NoMatchingLink`]), an inbox that cannot be reached or answers
//! something else 1.

use std::time::Duration;

use anyhow::Context;
use anyhow::bail;
use serde_json::Value;
use serde_json::json;

use crate::commands::inbox::ExpectArgs;
use crate::output::Failure;
use crate::output::refuse;

/// The longest one `GET /messages/wait` may be asked to wait (the inbox's bound).
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Runs `oncely inbox expect`: what it prints on success.
pub async fn run(args: &ExpectArgs) -> anyhow::Result<String> {
    let base = args.http.as_str().trim_end_matches('/').to_owned();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(MAX_WAIT + Duration::from_secs(10))
        .build()
        .context("cannot make an HTTP client")?;
    let messages = wait(&http, &base, args).await?;
    let mut found = Vec::with_capacity(messages.len());
    for message in &messages {
        let id = message["id"].as_str().unwrap_or_default();
        let links: Value = get(&http, &format!("{base}/messages/{id}/links"))
            .await?
            .json()
            .await
            .with_context(|| format!("{}/messages/{id}/links did not answer JSON", shown(&base)))?;
        found.push(json!({
            "id": id,
            "to": message["to"],
            "subject": message["subject"],
            "links": links["links"],
            "codes": links["codes"],
        }));
    }
    let links = || {
        found
            .iter()
            .flat_map(|m| m["links"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
    };
    let link = match &args.link_matches {
        Some(pattern) => match links().find(|link| pattern.is_match(link)) {
            Some(link) => Some(link.to_owned()),
            None => {
                let seen: Vec<&str> = links().collect();
                return Err(refuse(
                    Failure::NoMatchingLink,
                    format!(
                        "{} message(s) came, but no link matches the regular expression given: \
                         their links: {}",
                        found.len(),
                        if seen.is_empty() {
                            "none".to_owned()
                        } else {
                            seen.join(" ")
                        }
                    ),
                ));
            }
        },
        None => None,
    };
    if args.json {
        let document = json!({ "complete": true, "messages": found, "link": link });
        return Ok(format!("{}\n", serde_json::to_string_pretty(&document)?));
    }
    let line = link.unwrap_or_else(|| {
        found
            .iter()
            .filter_map(|m| m["id"].as_str())
            .collect::<Vec<_>>()
            .join(" ")
    });
    Ok(format!("{line}\n"))
}

/// What `args` wait for, in words: `2 message(s) to ada@x.io of run 1a2b`.
fn wanted(args: &ExpectArgs) -> String {
    let mut what = format!("{} message(s)", args.count);
    if let Some(to) = &args.to {
        what.push_str(&format!(" to {to}"));
    }
    if let Some(run) = &args.run {
        what.push_str(&format!(" of run {run}"));
    }
    what
}

/// Waits (in turns) until the inbox keeps `args.count` matching messages; their JSON.
async fn wait(http: &reqwest::Client, base: &str, args: &ExpectArgs) -> anyhow::Result<Vec<Value>> {
    let deadline = tokio::time::Instant::now() + args.within;
    loop {
        let turn = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(MAX_WAIT);
        let mut query = vec![
            ("count", args.count.to_string()),
            ("timeout", format!("{}ms", turn.as_millis())),
        ];
        query.extend(args.to.clone().map(|to| ("to", to)));
        query.extend(args.run.clone().map(|run| ("run", run)));
        let mut url = url::Url::parse(&format!("{base}/messages/wait"))
            .with_context(|| format!("{} is not a URL", shown(base)))?;
        url.query_pairs_mut().extend_pairs(&query);
        let response = http
            .get(url.clone())
            .send()
            .await
            .map_err(|e| unreachable_inbox(base, &e))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        match status {
            200 => return Ok(body["messages"].as_array().cloned().unwrap_or_default()),
            408 if tokio::time::Instant::now() < deadline => continue,
            408 => {
                return Err(refuse(
                    Failure::Timeout,
                    format!(
                        "{} of {} came within {}",
                        body["count"].as_u64().unwrap_or(0),
                        wanted(args),
                        humantime::format_duration(args.within)
                    ),
                ));
            }
            404 if body["problem"] == "unknown_run" => {
                return Err(refuse(
                    Failure::NotFound,
                    format!(
                        "the inbox at {shown} has no run {:?}: create one with POST {shown}/runs",
                        args.run.as_deref().unwrap_or_default(),
                        shown = shown(base),
                    ),
                ));
            }
            400 => bail!(
                "the inbox at {} refused the wait: {}",
                shown(base),
                body["detail"].as_str().unwrap_or("400")
            ),
            _ => bail!(
                "{} answered {status}: is --http the address of an oncely inbox (`oncely inbox \
                 --http host:port`), or of a server's dev inbox (http://host:port/_dev/inbox)?",
                shown(url.as_str())
            ),
        }
    }
}

/// A GET that must answer 200.
async fn get(http: &reqwest::Client, url: &str) -> anyhow::Result<reqwest::Response> {
    let response = http
        .get(url)
        .send()
        .await
        .map_err(|e| unreachable_inbox(url, &e))?;
    if !response.status().is_success() {
        bail!("{} answered {}", shown(url), response.status());
    }
    Ok(response)
}

/// What messages show of a URL: any user or password in it as `***` (an inbox behind basic
/// auth, or a token as the user name, must not reach CI logs).
fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
            let _ = url.set_username("***");
            let _ = url.set_password(None);
            url.to_string().trim_end_matches('/').to_owned()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "the inbox".to_owned(),
    }
}

/// Why the inbox at `base` could not be asked, and what to check.
fn unreachable_inbox(base: &str, error: &reqwest::Error) -> anyhow::Error {
    // The innermost cause says it ("Connection refused"); the outer ones repeat the URL.
    let mut why = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        why = cause.to_string();
        source = cause.source();
    }
    anyhow::anyhow!(
        "cannot reach the inbox at {} ({why}): is `oncely inbox` running there (--http names \
         its HTTP address)?",
        shown(base)
    )
}
