//! `oncely inbox`: the test inbox (SMTP and a Resend-compatible HTTP API that keep every
//! message); `oncely inbox expect` is [`super::inbox_expect`].

use std::net::SocketAddr;
use std::time::Duration;

use clap::ArgGroup;
use clap::Args;
use clap::Subcommand;
use oncely_inbox::Faults;
use oncely_inbox::Inbox;
use oncely_outbox::mail::IdempotencyHeader;

use crate::args::parse_duration;
use crate::args::parse_idempotency_header;

/// Settings of `oncely inbox`.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct InboxArgs {
    /// Ask a running inbox instead of running one.
    #[command(subcommand)]
    pub command: Option<InboxCommand>,
    /// SMTP listen address.
    #[arg(long, default_value = "127.0.0.1:2525")]
    pub smtp: SocketAddr,
    /// HTTP listen address (`POST /emails`, `GET /messages`, `DELETE /messages`, `GET /stats`,
    /// `PUT /faults`: changes the fields it names, `POST /reset` with `{}`; for CI: `POST /runs`,
    /// `GET /messages/wait`, `GET /messages/{id}/links`: docs/inbox.md).
    #[arg(long, default_value = "127.0.0.1:8025")]
    pub http: SocketAddr,
    /// Behave like a real provider (Resend): a repeat of an idempotency key within 24 h is
    /// acknowledged but not delivered again; the key with another message, or while a request
    /// with it is still being answered, is refused (409). Keys stay known when messages are
    /// deleted or other faults are set; `PUT /faults {"dedupe_window_ms": null}` turns it off.
    #[arg(long)]
    pub provider_mode: bool,
    /// The one header both intakes read the idempotency key from. Default per intake, as the
    /// mailers send: HTTP `Idempotency-Key`, SMTP `Resend-Idempotency-Key`.
    #[arg(long, value_parser = parse_idempotency_header)]
    pub idempotency_header: Option<IdempotencyHeader>,
    /// The most messages kept (the oldest go first).
    #[arg(long, default_value_t = oncely_inbox::Retention::default().max_messages, value_parser = parse_max_messages)]
    pub max_messages: usize,
    /// How long a message is kept (`24h`, `90m`, …).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub max_age: Duration,
    /// The most memory the kept messages and webhooks take, counted as the inbox holds them
    /// (a message's source, its decoded text and HTML parts, its headers and addresses): the
    /// oldest go first beyond it. `256MiB`, `64MB`, `1GiB` or bytes; at least 1MiB. One message
    /// is at most 10 MiB as sent and a quarter of this (larger: HTTP 413, SMTP 552).
    #[arg(long, default_value = "256MiB", value_parser = parse_max_bytes)]
    pub max_bytes: usize,
    /// An origin whose links the link scanner opens (`PUT /faults {"link_scanner": true}`):
    /// `http://` and a loopback host and port, e.g. `http://127.0.0.1:8080`, the service whose
    /// emails come here (repeat for more). It opens no other link; with none named it cannot
    /// be switched on.
    #[arg(long = "scan-origin", value_name = "URL", value_parser = parse_scan_origin)]
    pub scan_origins: Vec<oncely_inbox::Origin>,
}

/// `oncely inbox …`: what is asked of a running inbox.
#[derive(Debug, Clone, Subcommand)]
pub enum InboxCommand {
    /// Wait for mail in a running inbox, for shell scripts in CI: exits 0 and prints one line —
    /// the first link that matches --link-matches, or else the ids of the messages — once
    /// --count messages to --to (and/or of --run) are there; else one line on stderr saying
    /// why: exit 3 when fewer came within --within (or the run does not exist), 4 when none of
    /// their links matches, 1 when the inbox cannot be reached, 2 for a bad flag or regex
    /// (docs/inbox.md).
    Expect(ExpectArgs),
}

/// `oncely inbox expect`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("what").required(true).multiple(true).args(["to", "run"])))]
pub struct ExpectArgs {
    /// The recipient to wait for (any case).
    #[arg(long, value_name = "ADDR", value_parser = non_blank)]
    pub to: Option<String>,
    /// The run (`POST /runs`) whose mail to wait for; with --to, the run's mail to that address.
    #[arg(long, value_name = "ID", value_parser = non_blank)]
    pub run: Option<String>,
    /// How many messages (those already there count).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub count: u64,
    /// How long to wait (`10s`, `500ms`, `2m`; at most 24h).
    #[arg(long, default_value = "10s", value_parser = parse_within)]
    pub within: Duration,
    /// Print the first link of the messages (oldest message first, in each in order) that this
    /// regular expression matches somewhere, e.g. `/v1/verify\?token=`; exit 4 if none does.
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub link_matches: Option<regex_automata::meta::Regex>,
    /// The inbox's HTTP address, as `oncely inbox --http` was given it (`host:port`, or a URL
    /// such as `http://127.0.0.1:8025` or the dev inbox's `http://localhost:8080/_dev/inbox`).
    #[arg(long, default_value = "127.0.0.1:8025", value_parser = InboxUrl)]
    pub http: url::Url,
    /// Print one JSON document on stdout: `complete`, the `messages` (`id`, `to`, `subject`,
    /// `links`, `codes`), and the `link` --link-matches chose (or null); a failure is one JSON
    /// line on stderr. The exit codes stay the same.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn parse_regex(s: &str) -> Result<regex_automata::meta::Regex, String> {
    regex_automata::meta::Regex::new(s).map_err(|e| {
        // The parser's message spans lines (the pattern, a caret, then `error: why`): its last.
        let why = e
            .syntax_error()
            .and_then(|syntax| {
                let text = syntax.to_string();
                let last = text.lines().last()?.trim();
                Some(last.strip_prefix("error: ").unwrap_or(last).to_owned())
            })
            .unwrap_or_else(|| e.to_string());
        format!("not a regular expression: {why}")
    })
}

/// `inbox expect --http`: `host:port` or an http(s) URL. Its errors never repeat the value (clap's
/// own would): it may carry a password.
#[derive(Clone)]
pub(crate) struct InboxUrl;

impl clap::builder::TypedValueParser for InboxUrl {
    type Value = url::Url;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<url::Url, clap::Error> {
        let refuse = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '--http <HTTP>': {why}\n"),
            )
            .with_cmd(cmd)
        };
        let s = value.to_str().ok_or_else(|| refuse("not UTF-8".into()))?;
        let with_scheme = if s.contains("://") {
            s.to_owned()
        } else {
            format!("http://{s}")
        };
        let url = url::Url::parse(&with_scheme).map_err(|e| refuse(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(refuse("expected host:port or an http(s) URL".into()));
        }
        Ok(url)
    }
}

/// A value that is not blank (`--to ""`: a shell variable that was not set).
pub(crate) fn non_blank(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_owned())
}

impl InboxArgs {
    /// The inbox these settings describe.
    pub fn config(&self) -> oncely_inbox::Config {
        let defaults = oncely_inbox::Config::default();
        let header = |default: String| {
            self.idempotency_header
                .as_ref()
                .map_or(default, ToString::to_string)
        };
        oncely_inbox::Config {
            retention: oncely_inbox::Retention {
                max_messages: self.max_messages,
                max_age: self.max_age,
                max_bytes: self.max_bytes,
            },
            http_idempotency_header: header(defaults.http_idempotency_header),
            smtp_idempotency_header: header(defaults.smtp_idempotency_header),
            scan_origins: self.scan_origins.clone(),
        }
    }
}

pub(crate) fn parse_max_messages(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A size in bytes: a whole number, with or without a unit — `B`, `KB`, `MB`, `GB` (powers of
/// 1000), `KiB`, `MiB`, `GiB` (powers of 1024), in any case, a space allowed before it.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let text = s.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let bad = || {
        format!(
            "{s:?} is not a size: expected bytes or a whole number with a unit, e.g. 256MiB, 64MB, 1GiB, 1048576"
        )
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let factor: u64 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    number
        .checked_mul(factor)
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or_else(|| format!("{s:?} is too large"))
}

pub(crate) fn parse_scan_origin(s: &str) -> Result<oncely_inbox::Origin, String> {
    oncely_inbox::Origin::parse(s)
}

/// `inbox --max-bytes`: a size ([`parse_size`]) of at least 1 MiB.
pub(crate) fn parse_max_bytes(s: &str) -> Result<usize, String> {
    let bytes = parse_size(s)?;
    if bytes < 1 << 20 {
        return Err(format!(
            "{s:?}: at least 1MiB (1048576 bytes): the inbox needs room for a message (0 does not mean unbounded)"
        ));
    }
    Ok(bytes)
}

/// `inbox expect --within`: a duration up to a day (a CI step that waits longer is stuck).
pub(crate) fn parse_within(s: &str) -> Result<Duration, String> {
    let within = parse_duration(s)?;
    if within > Duration::from_secs(24 * 3600) {
        return Err("at most 24h".into());
    }
    Ok(within)
}

/// glibc's malloc raises its mmap threshold (up to 32 MiB) each time a large block is freed;
/// from then on the inbox's large messages come from the heap, and a stream of them, evicted
/// oldest first, leaves it fragmented: under 300 messages of 1.9 MB over HTTP the process held
/// about 95 MiB beyond its byte budget (`--max-bytes`). A fixed threshold gives every large
/// block back when it is freed (the same load: within 40 MiB of the budget). glibc reads it from
/// the environment when a process starts, and there is no safe call to set it later: so
/// `oncely inbox` starts itself again once with `MALLOC_MMAP_THRESHOLD_=131072` (glibc's
/// default, made fixed) — the same process, by `exec` — unless the variable is set (the
/// operator's choice stands). Elsewhere than glibc this does nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn with_fixed_mmap_threshold() {
    use std::os::unix::process::CommandExt;
    const VARIABLE: &str = "MALLOC_MMAP_THRESHOLD_";
    if std::env::var_os(VARIABLE).is_some() {
        return;
    }
    // argv[0] resolved, when it names a path (not a name found on PATH).
    let argv0 = std::env::args_os()
        .next()
        .filter(|a| a.as_encoded_bytes().contains(&b'/'))
        .and_then(|a| std::fs::canonicalize(a).ok());
    let me = match restart_target(std::env::current_exe(), argv0) {
        Ok(me) => me,
        Err(reason) => {
            eprintln!(
                "warning: oncely inbox runs with glibc's moving malloc mmap threshold ({reason}; set {VARIABLE}=131072 to fix it): it may hold more memory than --max-bytes"
            );
            return;
        }
    };
    let error = std::process::Command::new(me)
        .args(std::env::args_os().skip(1))
        .env(VARIABLE, "131072")
        .exec();
    // Only on failure: the inbox runs on, with glibc's moving threshold.
    eprintln!(
        "warning: oncely inbox cannot restart with a fixed malloc mmap threshold ({error}; set {VARIABLE}=131072 to fix it): it may hold more memory than --max-bytes"
    );
}

/// The program `oncely inbox` restarts itself as ([`with_fixed_mmap_threshold`]): this
/// executable (`exe`, `/proc/self/exe`), unless it is not this program — started through the
/// dynamic loader (`ld-linux-x86-64.so.2 oncely inbox`), `exe` is the loader, which would run
/// `inbox` (exit 127) — or it cannot be found. `argv0`: argv[0] resolved, when it names a path.
/// Err: why not, for the warning.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
fn restart_target(
    exe: std::io::Result<std::path::PathBuf>,
    argv0: Option<std::path::PathBuf>,
) -> Result<std::path::PathBuf, String> {
    let exe = exe.map_err(|error| format!("cannot find this program's path: {error}"))?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.starts_with("ld-") || name.starts_with("ld.so") {
        return Err(format!(
            "started through the dynamic loader {}",
            exe.display()
        ));
    }
    if let Some(argv0) = argv0
        && argv0 != exe
    {
        return Err(format!(
            "this program's path {} is not {}, the one it was started as",
            exe.display(),
            argv0.display()
        ));
    }
    Ok(exe)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn with_fixed_mmap_threshold() {}

/// Runs `oncely inbox` until Ctrl-C or SIGTERM.
pub async fn run(args: InboxArgs) -> anyhow::Result<()> {
    with_fixed_mmap_threshold();
    let inbox = Inbox::with_config(args.config());
    if args.provider_mode {
        inbox.set_faults(Faults::provider());
    }
    let running = inbox.start(args.smtp, args.http).await?;
    println!(
        "oncely inbox: SMTP {}  HTTP http://{}  (GET /messages, DELETE /messages, GET /stats, \
         PUT /faults with the fields to change, POST /reset with {{}}; for CI: POST /runs, \
         GET /messages/wait, `oncely inbox expect`)",
        running.smtp_addr, running.http_addr
    );
    println!("the page: http://{}/", running.http_addr);
    if !running.http_addr.ip().is_loopback() {
        eprintln!(
            "warning: --http {} is not a loopback address and the inbox has no authentication: \
             anyone who reaches it reads every message (bind 127.0.0.1 unless that is what you want)",
            running.http_addr
        );
    }
    let config = inbox.config();
    println!(
        "idempotency keys read from {} (HTTP) and {} (SMTP){}; keeps the newest {} messages of the last {}, within {} (one message at most {} as sent)",
        config.http_idempotency_header,
        config.smtp_idempotency_header,
        if args.provider_mode {
            ", deduplicated within 24 h"
        } else {
            ", duplicates counted"
        },
        config.retention.max_messages,
        humantime::format_duration(config.retention.max_age),
        bytes(config.retention.max_bytes),
        bytes(config.retention.max_message_bytes()),
    );
    if config.scan_origins.is_empty() {
        println!(
            "the link scanner (PUT /faults {{\"link_scanner\": true}}) opens no link: name the origins it may open with --scan-origin"
        );
    } else {
        let origins: Vec<String> = config
            .scan_origins
            .iter()
            .map(ToString::to_string)
            .collect();
        println!(
            "the link scanner, when on, opens links to {} only",
            origins.join(", ")
        );
    }
    crate::shutdown_signal().await;
    Ok(())
}

/// A size for people: whole MiB, KiB, or bytes.
fn bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::restart_target;

    /// Review 3, F8 and F9: `oncely inbox` restarts itself only as itself — started through the
    /// dynamic loader, `/proc/self/exe` is the loader, and restarting it ran `ld-linux inbox`
    /// (exit 127); it says why it does not, also when its path cannot be found (it said
    /// nothing).
    #[test]
    fn the_inbox_restarts_only_as_itself_and_says_why_not() {
        let dir = std::env::temp_dir().join(format!("oncely-restart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join("oncely");
        let other = dir.join("other");
        let loader = dir.join("ld-linux-x86-64.so.2");
        let link = dir.join("oncely-link");
        for file in [&program, &other, &loader] {
            std::fs::write(file, b"").unwrap();
        }
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&program, &link).unwrap();
        let real = std::fs::canonicalize(&program).unwrap();

        assert_eq!(restart_target(Ok(program.clone()), None), Ok(real.clone()));
        assert_eq!(
            restart_target(Ok(program.clone()), Some(real.clone())),
            Ok(real.clone())
        );
        assert_eq!(
            restart_target(Ok(link.clone()), Some(real.clone())),
            Ok(real.clone()),
            "the same file by another path"
        );
        // `/lib64/ld-linux-x86-64.so.2 target/release/oncely inbox`: argv[0] is the program.
        let through_loader = restart_target(Ok(loader.clone()), Some(real.clone()));
        assert!(
            through_loader
                .as_ref()
                .is_err_and(|why| why.contains("dynamic loader")),
            "{through_loader:?}"
        );
        let as_loader = restart_target(Ok(loader), None);
        assert!(as_loader.is_err(), "{as_loader:?}");
        let elsewhere = restart_target(
            Ok(other.clone()),
            Some(std::fs::canonicalize(&program).unwrap()),
        );
        assert!(elsewhere.is_err(), "{elsewhere:?}");
        let unknown = restart_target(Err(std::io::ErrorKind::NotFound.into()), None);
        assert!(
            unknown
                .as_ref()
                .is_err_and(|why| why.contains("cannot find this program's path")),
            "{unknown:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
