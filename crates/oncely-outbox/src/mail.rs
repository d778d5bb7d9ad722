//! Email messages and the mailers that deliver them: SMTP (lettre) and a Resend-compatible HTTP
//! API (reqwest). Both forward the job's delivery key, so a provider that deduplicates turns a
//! retried unknown outcome into one email.

use std::sync::Arc;
use std::time::Duration;

use lettre::message::header::{ContentType, Header, HeaderName, HeaderValue};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::job::{Delivery, DeliveryFuture};

/// An email to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Email {
    /// Sender address.
    pub from: String,
    /// Recipient address.
    pub to: String,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub text: String,
}

/// Delivers email. The `delivery_key` is stable for one logical message across every attempt.
pub trait Mailer: Send + Sync + 'static {
    /// Sends once and reports what happened.
    fn send<'a>(&'a self, email: &'a Email, delivery_key: &'a str) -> DeliveryFuture<'a>;
}

/// A mailer URL that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MailerError {
    /// Not `smtp://`, `smtps://`, `http://` or `https://`.
    #[error("mailer URL must start with smtp://, smtps://, http:// or https:// (got {0:?})")]
    Scheme(String),
    /// lettre refused the SMTP URL.
    #[error("invalid SMTP URL: {0}")]
    Smtp(#[from] lettre::transport::smtp::Error),
    /// reqwest could not build a client.
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// Builds the mailer a URL names: `smtp://host:port` (plain; `?tls=required` for STARTTLS),
/// `smtps://host:port` (TLS), or `http(s)://host/emails` (Resend-compatible API, `api_key` as
/// bearer token). Every send is bounded by `timeout`.
pub fn from_url(
    url: &str,
    api_key: Option<SecretString>,
    timeout: Duration,
) -> Result<Arc<dyn Mailer>, MailerError> {
    if url.starts_with("smtp://") || url.starts_with("smtps://") {
        Ok(Arc::new(SmtpMailer::new(url, timeout)?))
    } else if url.starts_with("http://") || url.starts_with("https://") {
        Ok(Arc::new(HttpMailer::new(url, api_key, timeout)?))
    } else {
        Err(MailerError::Scheme(
            url.split("://").next().unwrap_or(url).to_owned(),
        ))
    }
}

/// The header that carries the delivery key over SMTP.
#[derive(Debug, Clone)]
struct IdempotencyKeyHeader(String);

impl Header for IdempotencyKeyHeader {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("Idempotency-Key")
    }

    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self(s.to_owned()))
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), self.0.clone())
    }
}

/// SMTP with lettre: `Message-ID: <delivery_key@oncely>` and `Idempotency-Key: delivery_key`.
pub struct SmtpMailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    timeout: Duration,
}

impl SmtpMailer {
    /// See [`from_url`].
    pub fn new(url: &str, timeout: Duration) -> Result<Self, MailerError> {
        install_crypto_provider();
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)?
            .timeout(Some(timeout))
            .build();
        Ok(Self { transport, timeout })
    }

    async fn deliver(&self, email: &Email, key: &str) -> Delivery {
        let message = match build_message(email, key) {
            Ok(message) => message,
            Err(error) => return Delivery::Permanent(format!("cannot build the message: {error}")),
        };
        match tokio::time::timeout(self.timeout, self.transport.send(message)).await {
            Err(_) => Delivery::Unknown(format!("SMTP send took longer than {:?}", self.timeout)),
            Ok(Ok(response)) => Delivery::Sent {
                provider_message_id: response.message().next().map(|line| line.trim().to_owned()),
            },
            Ok(Err(error)) if refused(&error) => Delivery::Refused(format!("SMTP: {error}")),
            Ok(Err(error)) if throttled(&error) => Delivery::Throttled {
                reason: format!("SMTP: {error}"),
                after: None, // SMTP has no Retry-After: the policy's backoff applies
            },
            Ok(Err(error)) if error.is_permanent() => Delivery::Permanent(format!("SMTP: {error}")),
            Ok(Err(error)) if error.is_transient() => Delivery::Retry(format!("SMTP: {error}")),
            Ok(Err(error)) if never_connected(&error) => {
                Delivery::Retry(format!("SMTP (nothing sent): {error}"))
            }
            // Connection lost or timed out mid-conversation: the server may have the message.
            Ok(Err(error)) => Delivery::Unknown(format!("SMTP: {error}")),
        }
    }
}

/// The reply code of an SMTP error, if the server answered one.
fn reply_code(error: &lettre::transport::smtp::Error) -> Option<u16> {
    error.status().map(u16::from)
}

/// Whether the server refused our credentials or configuration, not the message: `530`
/// (authentication required), `534` (mechanism too weak), `535` (credentials invalid), `538`
/// (encryption required for the mechanism); or lettre found no authentication mechanism the
/// server offers, or the STARTTLS the URL requires. Every message would fail the same way
/// until an operator fixes it: the kind pauses ([`Delivery::Refused`]).
fn refused(error: &lettre::transport::smtp::Error) -> bool {
    if let Some(code) = reply_code(error) {
        return matches!(code, 530 | 534 | 535 | 538);
    }
    let text = error.to_string();
    error.is_client()
        && (text.contains("No compatible authentication mechanism")
            || text.contains("STARTTLS is not supported"))
}

/// Whether the server is throttling: `421` (service not available, closing: busy or rate
/// limited), `450` (mailbox busy or unavailable, greylisting), `451` (local error, the usual
/// answer of a rate limit). Decided per code: `452` (insufficient storage, too many
/// recipients) and other 4xx are plain retries, spending an attempt.
fn throttled(error: &lettre::transport::smtp::Error) -> bool {
    matches!(reply_code(error), Some(421 | 450 | 451))
}

/// Whether the send failed before the SMTP conversation began — the name lookup, the TCP
/// connection or the TLS handshake (lettre's connection kind, which it offers no predicate for
/// but names in its message; `tests/it/classification.rs` pins that), or the certificate check:
/// nothing reached the server, so the retry is a plain one, not an unknown outcome.
fn never_connected(error: &lettre::transport::smtp::Error) -> bool {
    error.is_tls() || error.to_string().starts_with("Connection error")
}

fn build_message(
    email: &Email,
    key: &str,
) -> Result<lettre::Message, Box<dyn std::error::Error + Send + Sync>> {
    Ok(lettre::Message::builder()
        .from(email.from.parse()?)
        .to(email.to.parse()?)
        .subject(email.subject.clone())
        .message_id(Some(format!("<{key}@oncely>")))
        .header(IdempotencyKeyHeader(key.to_owned()))
        .header(ContentType::TEXT_PLAIN)
        .body(email.text.clone())?)
}

impl Mailer for SmtpMailer {
    fn send<'a>(&'a self, email: &'a Email, delivery_key: &'a str) -> DeliveryFuture<'a> {
        Box::pin(self.deliver(email, delivery_key))
    }
}

/// A Resend-compatible HTTP API: `POST {url}` with `Idempotency-Key: delivery_key`.
pub struct HttpMailer {
    client: reqwest::Client,
    url: String,
    api_key: Option<SecretString>,
}

impl HttpMailer {
    /// See [`from_url`].
    pub fn new(
        url: &str,
        api_key: Option<SecretString>,
        timeout: Duration,
    ) -> Result<Self, MailerError> {
        let client = crate::http::client(timeout)?;
        Ok(Self {
            client,
            url: url.to_owned(),
            api_key,
        })
    }

    async fn deliver(&self, email: &Email, key: &str) -> Delivery {
        let body = json!({
            "from": email.from,
            "to": [email.to],
            "subject": email.subject,
            "text": email.text,
            "headers": { "Message-ID": format!("<{key}@oncely>") },
        });
        match crate::http::post_json(&self.client, &self.url, key, &body, self.api_key.as_ref())
            .await
        {
            Ok(answer) => Delivery::Sent {
                provider_message_id: answer["id"].as_str().map(str::to_owned),
            },
            Err(outcome) => outcome,
        }
    }
}

impl Mailer for HttpMailer {
    fn send<'a>(&'a self, email: &'a Email, delivery_key: &'a str) -> DeliveryFuture<'a> {
        Box::pin(self.deliver(email, delivery_key))
    }
}

/// TLS uses rustls with the ring provider; install it once per process.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A [`Handler`](crate::Handler) for jobs whose payload is an [`Email`]: sends it with the job's
/// delivery key.
pub struct EmailHandler {
    mailer: Arc<dyn Mailer>,
}

impl EmailHandler {
    /// Sends with `mailer`.
    pub fn new(mailer: Arc<dyn Mailer>) -> Self {
        Self { mailer }
    }
}

impl crate::Handler for EmailHandler {
    fn run<'a>(&'a self, job: &'a crate::Job) -> DeliveryFuture<'a> {
        Box::pin(async move {
            let email: Email = match serde_json::from_value(job.payload.clone()) {
                Ok(email) => email,
                Err(error) => {
                    return Delivery::Permanent(format!("payload is not an email: {error}"));
                }
            };
            self.mailer
                .send(&email, &job.delivery_key.to_string())
                .await
        })
    }
}
