//! Calling an HTTP API from a job with the job's key as `Idempotency-Key`, and reading the
//! outcome the way every such API needs: 2xx done; 3xx (never followed), 408/409/429/5xx and
//! connection failures retried, except a 409 that says the key was used with another payload
//! (Resend's `invalid_idempotent_request`: it can never succeed under this key); other 4xx
//! permanent; a timeout or a broken connection after sending *unknown* (retried with the same
//! key, which a deduplicating API turns into one effect).

use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::job::Delivery;

/// POSTs `body` to `url` with `Idempotency-Key: key` (and a bearer token if given). `Ok` holds
/// the JSON answer of a 2xx (`Null` if it was not JSON); `Err` the outcome to report.
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
        return Ok(response.json::<Value>().await.unwrap_or(Value::Null));
    }
    let text = response.text().await.unwrap_or_default();
    let error = format!(
        "HTTP {status}: {}",
        text.chars().take(200).collect::<String>()
    );
    Err(match status.as_u16() {
        409 if key_used_with_another_payload(&text) => Delivery::Permanent(format!(
            "the provider refuses this key with another payload, so no retry under it can \
             succeed: {error}"
        )),
        408 | 409 | 429 => Delivery::Retry(error),
        400..=499 => Delivery::Permanent(error),
        _ => Delivery::Retry(error),
    })
}

/// Whether a 409's body says the key was used before with another payload — Resend's
/// `{"name": "invalid_idempotent_request"}` — rather than that a request with the key is still
/// running (`concurrent_idempotent_requests`, or any other conflict: worth a retry).
fn key_used_with_another_payload(body: &str) -> bool {
    serde_json::from_str::<Value>(body)
        .is_ok_and(|answer| answer["name"] == "invalid_idempotent_request")
}

/// A client with `timeout` on connecting and on the whole request (TLS via rustls and ring)
/// that never follows a redirect: a followed 301/302 turns the POST into a GET elsewhere, a
/// followed 307/308 sends the job a second time to an address nobody configured. A redirect is
/// answered as what it is — the API's URL is wrong — and retried (never sent on).
pub fn client(timeout: std::time::Duration) -> Result<reqwest::Client, reqwest::Error> {
    crate::mail::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}
