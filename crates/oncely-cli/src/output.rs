//! What the commands print: tables whose columns fit their content, times for people
//! (`2025-01-31 08:00:00 UTC`), control characters escaped, or with `--json` exactly one JSON
//! document; a failure as one line (or one JSON object) on stderr, and the exit code: 3 not
//! found, 4 refused ([`Failure`]), 1 anything else (clap's usage errors: 2). The views each
//! command prints are documented field by field in docs/operations.md.

use std::fmt::Write;
use std::process::ExitCode;

use oncely_server::display::when;
use serde::Serialize;
use serde_json::json;
use time::OffsetDateTime;
use unicode_width::UnicodeWidthStr;

use clap::Args;

/// How an operator command prints.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct OutputArgs {
    /// Print exactly one JSON document on stdout, for scripts (an array for lists); a failure
    /// prints one JSON object on stderr instead. Field names and exit codes:
    /// docs/operations.md.
    #[arg(long)]
    pub json: bool,
}

/// Why an operator command refused or found nothing: its exit code and its JSON `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No such job, key or tenant (exit 3).
    NotFound,
    /// `outbox retry` of a job that was sent (exit 4).
    AlreadySent,
    /// `outbox retry` of a job that is still pending (exit 4).
    StillPending,
    /// `outbox retry` of a job deliberately not sent (exit 4): skipped jobs are never re-driven.
    Skipped,
    /// `outbox retry --expect N --yes` found another number of dead jobs (exit 4).
    CountDiffers,
    /// `tenant create` of a name that is taken (exit 4).
    TenantExists,
    /// A JOB that is both an operation key and another job's id (exit 4).
    Ambiguous,
    /// `outbox settle` of a job that is not parked, or `outbox retry` of one that is (exit 4).
    Parked,
    /// `inbox expect`: fewer messages came than were expected, in the time given (exit 3).
    Timeout,
    /// `inbox expect`: the messages came, but none has a link that matches (exit 4).
    NoMatchingLink,
}

impl Failure {
    /// The process's exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::NotFound | Self::Timeout => 3,
            _ => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::AlreadySent => "already_sent",
            Self::StillPending => "still_pending",
            Self::Skipped => "skipped",
            Self::CountDiffers => "count_differs",
            Self::TenantExists => "tenant_exists",
            Self::Ambiguous => "ambiguous",
            Self::Parked => "parked",
            Self::Timeout => "timeout",
            Self::NoMatchingLink => "no_matching_link",
        }
    }
}

/// An operator command that found nothing or refused: [`Failure`] says which, the message says
/// what to do.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    /// Which failure.
    pub failure: Failure,
    /// One line for people.
    pub message: String,
}

pub(crate) fn refuse(failure: Failure, message: impl Into<String>) -> anyhow::Error {
    CommandError {
        failure,
        message: message.into(),
    }
    .into()
}

/// Prints why a command failed on stderr — `oncely: <message>`, or with `json` one JSON object
/// `{"error": "<not_found|already_sent|…|failed>", "message": "…"}` — and returns its exit
/// code: a [`Failure`]'s, else 1.
pub fn failed(error: &anyhow::Error, json: bool) -> ExitCode {
    let failure = error.downcast_ref::<CommandError>().map(|e| e.failure);
    // One line, each cause once, never a backtrace.
    let message = oncely_server::display::one_line(error);
    if json {
        let code = failure.map_or("failed", Failure::name);
        eprintln!("{}", json!({ "error": code, "message": message }));
    } else {
        eprintln!("oncely: {message}");
    }
    ExitCode::from(failure.map_or(1, Failure::exit_code))
}

/// `value` as one JSON document (with `--json`), else what `human` writes.
pub(crate) fn render<T: Serialize>(
    output: OutputArgs,
    value: &T,
    human: impl FnOnce(&mut String) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let mut out = String::new();
    if output.json {
        out = serde_json::to_string_pretty(value)?;
        out.push('\n');
    } else {
        human(&mut out)?;
    }
    Ok(out)
}

/// [`render`] of a `value` that people read as one `line`.
pub(crate) fn render_line<T: Serialize>(
    output: OutputArgs,
    value: &T,
    line: impl std::fmt::Display,
) -> anyhow::Result<String> {
    render(output, value, |out| Ok(writeln!(out, "{line}")?))
}

/// What becomes of a replaced key or secret, in words: it `keeps` working "until" `until`,
/// or it `ends` at once (no grace).
pub(crate) fn grace_words(until: Option<OffsetDateTime>, keeps: &str, ends: &str) -> String {
    match until {
        Some(at) => format!("{keeps} until {}", when(at)),
        None => ends.to_owned(),
    }
}

/// An optional moment for people (`-` when there is none).
pub(crate) fn when_or_dash(at: Option<OffsetDateTime>) -> String {
    at.map_or_else(|| "-".into(), when)
}

/// Text from the database or a provider, safe on a terminal and on one line: control
/// characters (newlines, escape sequences) are shown escaped.
pub(crate) fn clean(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// A list: with `--json` the array, for people a table of `header` and one row per item, or
/// the line `empty` when there is none.
pub(crate) fn render_list<T: Serialize>(
    output: OutputArgs,
    items: &[T],
    empty: &str,
    header: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<String> {
    render(output, &items, |out| {
        if items.is_empty() {
            writeln!(out, "{empty}")?;
            return Ok(());
        }
        let rows: Vec<Vec<String>> = items.iter().map(row).collect();
        for line in table(header, &rows) {
            writeln!(out, "{line}")?;
        }
        Ok(())
    })
}

/// Lines of a table: the header and then each row, every column as wide as its widest cell
/// (the last column unpadded), two spaces between columns.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.width()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.width());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut line = String::new();
        let last = cells.len().saturating_sub(1);
        for (i, (cell, width)) in cells.into_iter().zip(&widths).enumerate() {
            line.push_str(cell);
            if i < last {
                line.push_str(&" ".repeat(width - cell.width() + 2));
            }
        }
        line.trim_end().to_owned()
    };
    std::iter::once(line(header.to_vec()))
        .chain(
            rows.iter()
                .map(|row| line(row.iter().map(String::as_str).collect())),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 15, item 5: fixed widths cut long keys and misaligned the rest.
    #[test]
    fn table_columns_fit_their_widest_cell() {
        let long = "verification:default:0123456789abcdef0123456789abcdef0123456789";
        let lines = table(
            &["id", "operation key", "error"],
            &[
                vec!["7".into(), long.into(), "boom".into()],
                vec!["12345".into(), "k".into(), String::new()],
            ],
        );
        assert_eq!(
            lines[0],
            format!("id     operation key{}  error", " ".repeat(long.len() - 13))
        );
        assert_eq!(lines[1], format!("7      {long}  boom"));
        assert_eq!(lines[2], "12345  k", "no trailing spaces");
    }

    /// A provider's error text reaches the operator's terminal: no escape sequences, one line.
    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(
            clean("550 no\r\n\u{1b}[31mred"),
            "550 no\\r\\n\\u{1b}[31mred"
        );
    }
}
