//! Calling an HTTP API from a job with the job's key as `Idempotency-Key`, and reading the
//! outcome the way every such API needs:
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx | done |
//! | 429; 503 with `Retry-After` | [`Delivery::Throttled`], with the `Retry-After` (seconds or an HTTP date) |
//! | 401, 403, 407 | [`Delivery::Refused`]: our credentials or configuration are wrong, not the job |
//! | 409 saying the key was used with another payload (Resend's `invalid_idempotent_request`) | [`Delivery::Permanent`]: no retry under this key can succeed |
//! | 303 See Other (the request was processed; the answer is elsewhere) | [`Delivery::Unknown`] |
//! | other 3xx (never followed), 408, other 409, other 5xx, connection failures | [`Delivery::Retry`] |
//! | other 4xx | [`Delivery::Permanent`] |
//! | a timeout or a broken connection after sending | [`Delivery::Unknown`] (retried with the same key, which a deduplicating API turns into one effect) |
//!
//! An API whose URL is fixed by configuration rather than by the job (an email provider's
//! `/emails`: the HTTP mailer) reads three more answers as configuration errors,
//! [`Delivery::Refused`] (the kind pauses until it is fixed) rather than the job's fault: a
//! redirect (but 303), 404 and 405 — the URL is wrong for every job alike; the reason carries a
//! redirect's `Location`.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::job::Delivery;

/// The most of an answer's body anything here reads (a verdict, a provider's id, an error's
/// text are a few hundred bytes): the other side may be misconfigured or hostile — a webhook
/// endpoint is a tenant's — and a body read whole is memory it chooses.
pub const MAX_ANSWER: usize = 64 * 1024;

/// What [`read_at_most`] read: the bytes, and how the reading ended.
pub struct ReadAtMost {
    /// At most the limit: all of the body, or its start.
    pub body: Vec<u8>,
    /// How it ended.
    pub end: ReadEnd,
}

/// How [`read_at_most`] ended.
pub enum ReadEnd {
    /// The body was all read.
    Complete,
    /// The body is longer than the limit (the rest was left unread).
    TooLong,
    /// Reading failed (a timeout, a broken connection) after `body`.
    Failed(reqwest::Error),
}

/// Reads `response`'s body up to `limit` bytes. A longer body is left unread beyond the limit
/// and the connection dropped with it; what was read before a failure is kept (an error's text
/// says what it can).
pub async fn read_at_most(mut response: reqwest::Response, limit: usize) -> ReadAtMost {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    return ReadAtMost {
                        body,
                        end: ReadEnd::TooLong,
                    };
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => {
                return ReadAtMost {
                    body,
                    end: ReadEnd::Complete,
                };
            }
            Err(error) => {
                return ReadAtMost {
                    body,
                    end: ReadEnd::Failed(error),
                };
            }
        }
    }
}

/// POSTs `body` to `url` with `Idempotency-Key: key` (and a bearer token if given). `Ok` holds
/// the JSON answer of a 2xx (`Null` if it was not JSON); `Err` the outcome to report (see the
/// module's table). The answer's text in an error is cut to 200 characters, and the bearer
/// token, should the other side echo it, is blanked out.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
    bearer: Option<&SecretString>,
) -> Result<Value, Delivery> {
    post_json_keyed(client, url, "Idempotency-Key", key, body, bearer).await
}

/// [`post_json`] with the key in the header `header` (an API that reads another name).
pub async fn post_json_keyed(
    client: &reqwest::Client,
    url: &str,
    header: &str,
    key: &str,
    body: &Value,
    bearer: Option<&SecretString>,
) -> Result<Value, Delivery> {
    post(client, (url, Url::OfTheJob), (header, key), body, bearer).await
}

/// [`post_json_keyed`] to an API whose URL configuration fixes for every job (an email
/// provider's): a redirect, 404 and 405 mean that URL is wrong, a [`Delivery::Refused`].
pub(crate) async fn post_json_to_endpoint(
    client: &reqwest::Client,
    url: &str,
    (header, key): (&str, &str),
    body: &Value,
    bearer: Option<&SecretString>,
) -> Result<Value, Delivery> {
    post(client, (url, Url::Configured), (header, key), body, bearer).await
}

/// Where a URL comes from, which decides what a redirect, 404 or 405 means.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Url {
    /// The job's (a resource it names): the answer is about the job.
    OfTheJob,
    /// Configuration's, the same for every job: the answer is about the configuration.
    Configured,
}

async fn post(
    client: &reqwest::Client,
    (url, origin): (&str, Url),
    (header, key): (&str, &str),
    body: &Value,
    bearer: Option<&SecretString>,
) -> Result<Value, Delivery> {
    let mut request = client.post(url).header(header, key).json(body);
    if let Some(token) = bearer {
        request = request.bearer_auth(token.expose_secret());
    }
    let response = match request.send().await {
        Ok(response) => response,
        // Never reached the server: safe to retry. Anything later: the outcome is unknown.
        Err(error) if error.is_connect() => return Err(Delivery::Retry(format!("HTTP: {error}"))),
        Err(error) => return Err(Delivery::Unknown(format!("HTTP: {error}"))),
    };
    let status = response.status();
    if status.is_success() {
        // A JSON answer within MAX_ANSWER, else Null: the job is done either way.
        let read = read_at_most(response, MAX_ANSWER).await;
        return Ok(match read.end {
            ReadEnd::Complete => serde_json::from_slice(&read.body).unwrap_or(Value::Null),
            _ => Value::Null,
        });
    }
    let headers = response.headers().clone();
    let after = retry_after(&headers, SystemTime::now());
    // The start of the answer's text is enough to say what went wrong.
    let mut body =
        String::from_utf8_lossy(&read_at_most(response, MAX_ANSWER).await.body).into_owned();
    // Blanked out before the cut: a key that straddled the cut would leave a piece behind.
    if let Some(token) = bearer.map(ExposeSecret::expose_secret)
        && !token.is_empty()
    {
        body = body.replace(token, "[redacted]");
    }
    let text: String = body.chars().take(200).collect();
    let error = format!("HTTP {status}: {text}");
    if origin == Url::Configured && matches!(status.as_u16(), 300..=302 | 304..=399 | 404 | 405) {
        let location = headers
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(|l| format!(" (Location: {l})"))
            .unwrap_or_default();
        return Err(Delivery::Refused(format!(
            "the configured URL is wrong (every job would get this answer): {error}{location}"
        )));
    }
    if status.as_u16() == 303 {
        // See Other after a POST: the request was processed, the answer is elsewhere.
        return Err(Delivery::Unknown(format!(
            "{error} (303 See Other: the request may have been processed)"
        )));
    }
    Err(match status.as_u16() {
        429 => Delivery::Throttled {
            reason: error,
            after,
        },
        // Maintenance, or an overloaded provider that says when to come back.
        503 if after.is_some() => Delivery::Throttled {
            reason: error,
            after,
        },
        401 | 403 | 407 => Delivery::Refused(error),
        409 if key_used_with_another_payload(&body) => Delivery::Permanent(format!(
            "the provider refuses this key with another payload, so no retry under it can \
             succeed: {error}"
        )),
        408 | 409 => Delivery::Retry(error),
        400..=499 => Delivery::Permanent(error),
        _ => Delivery::Retry(error),
    })
}

/// The wait a `Retry-After` header asks for, read at `now`: delta-seconds (`120`) or an HTTP
/// date (`Wed, 21 Oct 2015 07:28:00 GMT`, and the two obsolete forms RFC 9110 accepts).
/// `None` without the header, for a date in the past, and for anything unreadable. Not capped:
/// the retry policy cuts a long one to its `max_delay`.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Absurdly many digits saturate; the policy cuts the wait anyway.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    at.duration_since(now).ok().filter(|wait| !wait.is_zero())
}

/// Whether a 409's body says the key was used before with another payload — Resend's
/// `{"name": "invalid_idempotent_request"}` — rather than that a request with the key is still
/// running (`concurrent_idempotent_requests`, or any other conflict: worth a retry).
fn key_used_with_another_payload(body: &str) -> bool {
    serde_json::from_str::<Value>(body)
        .is_ok_and(|answer| answer["name"] == "invalid_idempotent_request")
}

/// TLS uses rustls with the ring provider; install it once per process.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client with `timeout` on connecting and on the whole request (TLS via rustls and ring)
/// that never follows a redirect: a followed 301/302 turns the POST into a GET elsewhere, a
/// followed 307/308 sends the job a second time to an address nobody configured. A redirect is
/// answered as what it is — the API's URL is wrong — and retried (never sent on).
pub fn client(timeout: std::time::Duration) -> Result<reqwest::Client, reqwest::Error> {
    install_crypto_provider();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, value.parse().unwrap());
        headers
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates_and_ignores_the_rest() {
        // 1994-11-06T08:49:37Z, the date RFC 9110 uses, in its three forms.
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        let now = at - Duration::from_secs(90);
        let read = |value: &str| retry_after(&with(value), now);
        assert_eq!(read("120"), Some(Duration::from_secs(120)));
        assert_eq!(read(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            read("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            read("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            read("Sun Nov  6 08:49:37 1994"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(read("Sun, 06 Nov 1994 08:47:07 GMT"), None, "in the past");
        assert_eq!(read("Sun, 06 Nov 1994 08:48:07 GMT"), None, "now");
        assert_eq!(read("soon"), None);
        assert_eq!(read("-5"), None);
        assert_eq!(read("1.5"), None);
        assert_eq!(
            read("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX)),
            "saturates; the policy cuts it"
        );
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
