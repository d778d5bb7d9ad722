//! Text for people, shared by the service and the commands: a moment (`2025-01-31 08:00:00
//! UTC`) and an error as one line. Imports nothing of the crate.

use time::OffsetDateTime;

/// A moment for people: `2025-01-31 08:00:00 UTC`.
pub fn when(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    format!(
        "{}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// An error as one line: each cause once (a cause whose text an outer message already holds
/// is not repeated), without the driver's framing ("error returned from database: ").
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let mut text = cause.to_string();
        for noise in [
            "while executing migrations: ",
            "error returned from database: ",
            "error communicating with database: ",
        ] {
            text = text.replace(noise, "");
        }
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("error returned from database: (code: 1) no such table: oncely_outbox")]
    struct Driver;

    /// A library error that prints its source and also returns it as `source()`.
    #[derive(Debug, thiserror::Error)]
    #[error("database error: {0}")]
    struct Library(#[source] Driver);

    /// Regression: `oncely outbox list` on an unmigrated database printed "no such table"
    /// three times, framed by the driver each time.
    #[test]
    fn each_cause_appears_once_without_the_drivers_framing() {
        let error = anyhow::Error::new(Library(Driver)).context("listing jobs");
        assert_eq!(
            one_line(&error),
            "listing jobs: database error: (code: 1) no such table: oncely_outbox"
        );
        let io = std::io::Error::other("line one\nline two");
        assert_eq!(
            one_line(&anyhow::Error::new(io).context("reading")),
            "reading: line one line two"
        );
    }
}
