//! `oncely check URL`: the Idempotency-Key contract run against any API ([`oncely_check`]).

use std::time::Duration;

use anyhow::bail;
use clap::Args;

/// `oncely check URL`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The idempotent route to check (`http://` or `https://`), e.g.
    /// `http://localhost:8080/v1/signup`. Every row sends a fresh key, `oncely-check-<uuid>`.
    #[arg(value_name = "URL", value_parser = parse_http_url)]
    pub url: url::Url,
    /// The route's method.
    #[arg(long, default_value = "POST", value_parser = parse_method)]
    pub method: http::Method,
    /// A sample body that the route accepts. `{{unique}}` in it is replaced by a fresh random
    /// string for every row (so a signup's address is new each time); sent as
    /// `application/json` if it is JSON, unless -H names a Content-Type.
    #[arg(long, value_name = "BODY", conflicts_with = "body_file")]
    pub body: Option<String>,
    /// Read the sample body from this file (as --body).
    #[arg(long, value_name = "PATH", value_parser = read_body_file)]
    pub body_file: Option<String>,
    /// A header sent with every request and the probe, `Name: value` (repeatable), e.g.
    /// `-H 'Authorization: Bearer …'`. Its value is never printed.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    pub headers: Vec<oncely_check::Header>,
    /// Another idempotent route: the first request's key, sent there, must not get the first
    /// route's stored answer (without it the key-per-route row is n/a).
    #[arg(long, value_name = "URL", value_parser = parse_http_url)]
    pub other_url: Option<url::Url>,
    /// The body for --other-url (`{{unique}}` as in --body); default: the sample body.
    #[arg(long, value_name = "BODY", requires = "other_url")]
    pub other_body: Option<String>,
    /// A GET whose body counts the route's executions — a number, `{"count": n}`, a JSON
    /// object's numbers (`{"rows": 3, "emails": 3}`) or a JSON array (e.g.
    /// `http://localhost:3000/payments/count`): the concurrent row then checks that the burst
    /// grew the counts by exactly one. Without it, that row compares the answers.
    #[arg(long, value_name = "URL", value_parser = parse_http_url)]
    pub probe: Option<url::Url>,
    /// How many identical requests the concurrent row sends at once (2–100).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(2..=100))]
    pub concurrency: u16,
    /// How long one request may take (`10s`, `500ms`).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Print one JSON document on stdout: every row with its verdict and evidence, and the
    /// counts (docs/check.md). The exit codes stay the same.
    #[arg(long)]
    pub json: bool,
}

impl From<CheckArgs> for oncely_check::CheckConfig {
    fn from(args: CheckArgs) -> Self {
        Self {
            url: args.url,
            method: args.method,
            body: args.body.or(args.body_file),
            headers: args.headers,
            other_url: args.other_url,
            other_body: args.other_body,
            probe: args.probe,
            concurrency: usize::from(args.concurrency),
            timeout: args.timeout,
        }
    }
}

pub(crate) fn parse_header(text: &str) -> Result<oncely_check::Header, String> {
    text.parse()
}

pub(crate) fn parse_http_url(text: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(text).map_err(|e| format!("not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("expected an http:// or https:// URL with a host".into());
    }
    Ok(url)
}

pub(crate) fn parse_method(text: &str) -> Result<http::Method, String> {
    http::Method::from_bytes(text.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("`{text}` is not an HTTP method"))
}

pub(crate) fn read_body_file(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
}

/// `oncely check URL`: the table (or one JSON document) on stdout; exit 1 if a row failed.
pub async fn run(args: CheckArgs) -> anyhow::Result<()> {
    let json = args.json;
    let report = oncely_check::run(&args.into()).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    let failures = report.failures();
    if !failures.is_empty() {
        bail!(
            "{} of {} rows failed: {} (docs/check.md says what each checks)",
            failures.len(),
            report.rows.len(),
            failures.join(", ")
        );
    }
    Ok(())
}
