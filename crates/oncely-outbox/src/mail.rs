//! Email messages and the mailers that deliver them: SMTP (lettre) and a Resend-compatible HTTP
//! API (reqwest). Both forward the job's delivery key in the header their provider reads
//! ([`IdempotencyHeader`]), so a provider that deduplicates turns a retried unknown outcome into
//! one email.

use std::sync::Arc;
use std::time::Duration;

use lettre::message::MultiPart;
use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Tls, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Response as SmtpResponse;
use lettre::transport::smtp::{Error as SmtpError, SMTP_PORT, SUBMISSION_PORT, SUBMISSIONS_PORT};
use lettre::{AsyncSmtpTransport, Tokio1Executor};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use serde_json::json;
use time::OffsetDateTime;

use crate::job::{
    Delivery, DeliveryFuture, PointOfNoReturn, ReconcileFuture, Reconciled, Unrecorded,
};

/// An email to send.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Email {
    /// Sender address.
    pub from: String,
    /// Recipient address.
    pub to: String,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub text: String,
    /// HTML body, if the email has one: then it is sent as `multipart/alternative` (text and
    /// HTML) over SMTP, and as `text` + `html` over the HTTP API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// Where replies go (`Reply-To`), if not to the sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

/// Delivers email. The `delivery_key` is stable for one logical message across every attempt.
pub trait Mailer: Send + Sync + 'static {
    /// Sends once and reports what happened.
    fn send<'a>(&'a self, email: &'a Email, delivery_key: &'a str) -> DeliveryFuture<'a>;

    /// Whether [`Mailer::send_marked`] records the send's point of no return. The default: it
    /// does not (a worker then parks an abandoned attempt of it under
    /// [`OnUnknown::Reconcile`](crate::OnUnknown), as it may have reached the provider).
    fn marks_point_of_no_return(&self) -> bool {
        false
    }

    /// [`Mailer::send`], calling `point` ([`PointOfNoReturn::reached`]) just before the
    /// message's data is handed over — SMTP: once `MAIL`, `RCPT` and `DATA` were accepted,
    /// before the content; HTTP: before the request is sent — and handing nothing over if it
    /// fails ([`Delivery::Retry`] with its reason). Never sends without it. The default: sends
    /// with [`Mailer::send`], never calling `point`.
    fn send_marked<'a>(
        &'a self,
        email: &'a Email,
        delivery_key: &'a str,
        point: &'a dyn PointOfNoReturn,
    ) -> DeliveryFuture<'a> {
        let _ = point;
        self.send(email, delivery_key)
    }

    /// Whether [`Mailer::look_up`] can ask the provider about a delivery key ([`LookedUp`]).
    /// The default: it cannot (neither plain SMTP nor Resend's API can be asked by key).
    fn looks_up(&self) -> bool {
        false
    }

    /// Whether the provider accepted a message under `delivery_key`, which it can have been
    /// given at `since` at the earliest (the job's enqueue): what a reconciler asks about a job
    /// whose attempt may or may not have reached it ([`crate::Handler::reconcile`]).
    fn look_up<'a>(&'a self, delivery_key: &'a str, since: OffsetDateTime) -> ReconcileFuture<'a> {
        let _ = (delivery_key, since);
        Box::pin(std::future::ready(Reconciled::Unknown(
            "this mailer cannot look up a delivery".to_owned(),
        )))
    }
}

/// A mailer that records its point of no return on every path that can reach the provider
/// ([`Mailer::marks_point_of_no_return`]): its one send, told where to record it, is the whole
/// [`Mailer`] ([`SmtpMailer`], [`HttpMailer`]).
pub trait MarkingMailer: Send + Sync + 'static {
    /// Sends `email` under `delivery_key`, calling [`PointOfNoReturn::reached`] just before
    /// anything of it is handed over, and handing nothing over if that fails.
    fn deliver(
        &self,
        email: &Email,
        delivery_key: &str,
        point: &dyn PointOfNoReturn,
    ) -> impl Future<Output = Delivery> + Send;
}

impl<M: MarkingMailer> Mailer for M {
    fn send<'a>(&'a self, email: &'a Email, delivery_key: &'a str) -> DeliveryFuture<'a> {
        Box::pin(self.deliver(email, delivery_key, &Unrecorded))
    }

    fn marks_point_of_no_return(&self) -> bool {
        true
    }

    fn send_marked<'a>(
        &'a self,
        email: &'a Email,
        delivery_key: &'a str,
        point: &'a dyn PointOfNoReturn,
    ) -> DeliveryFuture<'a> {
        Box::pin(self.deliver(email, delivery_key, point))
    }
}

/// A mailer that can also be asked, by delivery key, whether its provider accepted a message
/// ([`Mailer::look_up`]): a `GET` of a URL made from a template by putting the key where it says
/// `{key}` (`http://127.0.0.1:8025/deliveries/{key}`: the test inbox's lookup, which the
/// `oncely` service's `ONCELY_MAILER_LOOKUP` names). The answer must be `200` with a JSON object
/// whose `accepted` is `true` or `false`, and optionally `first_id` (the provider's id of the
/// message), `deciding` (`true`: a message under the key is being decided now) and
/// `forgotten_through` (RFC 3339: keys accepted until then may have been forgotten). A `false`
/// is [`Reconciled::NotAccepted`] only when nothing is being decided under the key and nothing
/// the job can have sent (since its enqueue) may have been forgotten; anything else — another
/// status, another body, no answer within the timeout — is [`Reconciled::Unknown`]. A provider
/// whose API answers otherwise needs a lookup of its own (implement [`Mailer::look_up`]). The
/// URL may carry a credential: errors and logs show only its scheme and host.
pub struct LookedUp {
    mailer: Arc<dyn Mailer>,
    template: String,
    client: reqwest::Client,
}

impl LookedUp {
    /// `mailer`, asked about delivery keys at `template` (`http://` or `https://`, with
    /// `{key}`), each question bounded by `timeout`.
    pub fn new(
        mailer: Arc<dyn Mailer>,
        template: &str,
        timeout: Duration,
    ) -> Result<Self, MailerError> {
        Self::validate(template)?;
        crate::http::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self {
            mailer,
            template: template.to_owned(),
            client,
        })
    }

    /// Whether `template` can be used: `http://` or `https://`, with `{key}`, a URL once the
    /// key is in.
    pub fn validate(template: &str) -> Result<(), MailerError> {
        // Named by scheme and host only: the URL may carry a credential.
        let bad = |why: &str| MailerError::Lookup(Self::shown(template), why.to_owned());
        if !(template.starts_with("http://") || template.starts_with("https://")) {
            return Err(bad("it must start with http:// or https://"));
        }
        if !template.contains("{key}") {
            return Err(bad("it must say {key} where the delivery key goes"));
        }
        let example = template.replace("{key}", "00000000-0000-0000-0000-000000000000");
        reqwest::Url::parse(&example).map_err(|e| bad(&e.to_string()))?;
        Ok(())
    }

    async fn ask(&self, key: &str, since: OffsetDateTime) -> Reconciled {
        #[derive(Deserialize)]
        struct Answer {
            accepted: bool,
            #[serde(default)]
            first_id: Option<String>,
            #[serde(default)]
            deciding: bool,
            #[serde(default, with = "time::serde::rfc3339::option")]
            forgotten_through: Option<OffsetDateTime>,
        }
        // A delivery key is a UUID: nothing in it needs escaping in a path or a query.
        let url = self.template.replace("{key}", key);
        let at = Self::shown(&self.template);
        let response = match self.client.get(&url).send().await {
            Ok(response) => response,
            // Without the URL: it may carry a credential.
            Err(error) => {
                let error = error.without_url();
                return Reconciled::Unknown(format!("delivery lookup at {at}: {error}"));
            }
        };
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            return Reconciled::Unknown(format!("delivery lookup at {at} answered {status}"));
        }
        // Bounded: a verdict is a few hundred bytes; a longer answer is not read beyond that.
        let read = crate::http::read_at_most(response, crate::http::MAX_ANSWER).await;
        let body = match read.end {
            crate::http::ReadEnd::Complete => read.body,
            crate::http::ReadEnd::TooLong => {
                return Reconciled::Unknown(format!(
                    "delivery lookup at {at} answered over 64 KiB"
                ));
            }
            crate::http::ReadEnd::Failed(error) => {
                let error = error.without_url();
                return Reconciled::Unknown(format!("delivery lookup at {at}: {error}"));
            }
        };
        match serde_json::from_slice::<Answer>(&body) {
            Ok(answer) if answer.accepted => Reconciled::Accepted {
                provider_message_id: answer.first_id,
            },
            Ok(answer) if answer.deciding => Reconciled::Unknown(
                "the provider is still deciding on a message under this key".to_owned(),
            ),
            Ok(Answer {
                forgotten_through: Some(through),
                ..
            }) if through >= since => Reconciled::Unknown(format!(
                "the lookup may have forgotten this key: it forgets keys accepted through {through}"
            )),
            Ok(_) => Reconciled::NotAccepted,
            Err(error) => Reconciled::Unknown(format!(
                "delivery lookup at {at} answered no verdict: {error}"
            )),
        }
    }

    /// What errors and logs show of a lookup URL: its scheme and host, never a credential
    /// (userinfo, a path or query token).
    pub fn shown(template: &str) -> String {
        match reqwest::Url::parse(&template.replace("{key}", "k")) {
            Ok(url) => format!(
                "{}://{}{}",
                url.scheme(),
                url.host_str().unwrap_or("?"),
                url.port().map(|p| format!(":{p}")).unwrap_or_default()
            ),
            Err(_) => "an unreadable URL".to_owned(),
        }
    }
}

impl Mailer for LookedUp {
    fn send<'a>(&'a self, email: &'a Email, delivery_key: &'a str) -> DeliveryFuture<'a> {
        self.mailer.send(email, delivery_key)
    }

    fn marks_point_of_no_return(&self) -> bool {
        self.mailer.marks_point_of_no_return()
    }

    fn send_marked<'a>(
        &'a self,
        email: &'a Email,
        delivery_key: &'a str,
        point: &'a dyn PointOfNoReturn,
    ) -> DeliveryFuture<'a> {
        self.mailer.send_marked(email, delivery_key, point)
    }

    fn looks_up(&self) -> bool {
        true
    }

    fn look_up<'a>(&'a self, delivery_key: &'a str, since: OffsetDateTime) -> ReconcileFuture<'a> {
        Box::pin(self.ask(delivery_key, since))
    }
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
    /// The SMTP URL, which lettre took, could not be read into a server.
    #[error("invalid SMTP URL: {0}")]
    SmtpUrl(String),
    /// reqwest could not build a client.
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// The idempotency header's name cannot be used.
    #[error("invalid idempotency header name {0:?}: {1}")]
    IdempotencyHeader(String, &'static str),
    /// The delivery lookup's URL template cannot be used ([`LookedUp`]): named by its scheme
    /// and host only (it may carry a credential).
    #[error("invalid delivery lookup URL ({0}): {1}")]
    Lookup(String, String),
}

/// The header that carries a job's delivery key to the provider. Which one a provider reads
/// depends on the provider and the transport:
///
/// | provider | transport | header |
/// |---|---|---|
/// | Resend | HTTP API | `Idempotency-Key` ([`IdempotencyHeader::HTTP_DEFAULT`]) |
/// | Resend | SMTP | `Resend-Idempotency-Key` ([`IdempotencyHeader::SMTP_DEFAULT`]) |
/// | most HTTP APIs (Stripe-style) | HTTP | `Idempotency-Key` |
///
/// Plain SMTP relays and most other SMTP services read no such header: over them delivery stays
/// at-least-once (a lost answer can mean a second copy), whatever the header is called.
/// `Message-ID: <key@oncely>` is sent over both transports besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyHeader(String);

impl IdempotencyHeader {
    /// What an HTTP mailer sends unless told otherwise: Resend's API and most APIs read it.
    pub const HTTP_DEFAULT: &str = "Idempotency-Key";
    /// What an SMTP mailer sends unless told otherwise: Resend's SMTP service reads it.
    pub const SMTP_DEFAULT: &str = "Resend-Idempotency-Key";

    /// Headers the mailers write themselves, or that carry meaning of their own: never the
    /// idempotency header.
    const RESERVED: [&str; 60] = [
        // Written by the mailer, or HTTP's framing and connection (hop-by-hop) headers, whose
        // values change how the request is sent or read.
        "authorization",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "cookie",
        "expect",
        "host",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        // Request routing, method and conditions (a proxy or the provider may act on them).
        "forwarded",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "range",
        "via",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-http-method",
        "x-http-method-override",
        "x-method-override",
        // Email headers that address, route, authenticate or trace the message.
        "bcc",
        "cc",
        "content-disposition",
        "content-transfer-encoding",
        "arc-authentication-results",
        "arc-message-signature",
        "arc-seal",
        "authentication-results",
        "date",
        "delivered-to",
        "disposition-notification-to",
        "dkim-signature",
        "from",
        "in-reply-to",
        "message-id",
        "mime-version",
        "received",
        "references",
        "reply-to",
        "resent-bcc",
        "resent-cc",
        "resent-date",
        "resent-from",
        "resent-message-id",
        "resent-sender",
        "resent-to",
        "return-path",
        "return-receipt-to",
        "sender",
        "subject",
        "to",
    ];

    /// A header name: a token of RFC 9110 (letters, digits and ``!#$%&'*+-.^_`|~``), at most 76
    /// characters (an email header line's budget), and none of the headers the mailer writes
    /// itself (`From`, `Message-ID`, `Content-Type`, `Authorization`, …), nor one that changes
    /// how the request is sent or read (`Expect`, `Content-Encoding`, `Upgrade`, …) or how the
    /// message is addressed, routed or authenticated (`Return-Path`, `DKIM-Signature`, …).
    pub fn new(name: &str) -> Result<Self, MailerError> {
        let invalid = |why| Err(MailerError::IdempotencyHeader(name.to_owned(), why));
        if name.is_empty() {
            return invalid("empty");
        }
        if name.len() > 76 {
            return invalid("longer than 76 characters");
        }
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return invalid(
                "a header name is letters, digits and !#$%&'*+-.^_`|~ only (no spaces or colons)",
            );
        }
        if Self::RESERVED.contains(&name.to_ascii_lowercase().as_str()) {
            return invalid(
                "the mailer writes this header itself, or it changes how the message is sent or handled",
            );
        }
        Ok(Self(name.to_owned()))
    }

    /// The default for a mailer URL's transport: SMTP for `smtp://` and `smtps://`, HTTP
    /// otherwise.
    pub fn default_for(url: &str) -> Self {
        let smtp = url.starts_with("smtp://") || url.starts_with("smtps://");
        Self(
            if smtp {
                Self::SMTP_DEFAULT
            } else {
                Self::HTTP_DEFAULT
            }
            .to_owned(),
        )
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for IdempotencyHeader {
    type Err = MailerError;

    fn from_str(name: &str) -> Result<Self, MailerError> {
        Self::new(name)
    }
}

impl std::fmt::Display for IdempotencyHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Builds the mailer a URL names: `smtp://host:port` (plain; `?tls=required` for STARTTLS),
/// `smtps://host:port` (TLS), or `http(s)://host/emails` (Resend-compatible API, `api_key` as
/// bearer token). Every send is bounded by `timeout`. The delivery key goes in
/// `idempotency_header`, by default the one the transport's provider reads
/// ([`IdempotencyHeader::default_for`]).
pub fn from_url(
    url: &str,
    api_key: Option<SecretString>,
    timeout: Duration,
    idempotency_header: Option<IdempotencyHeader>,
) -> Result<Arc<dyn Mailer>, MailerError> {
    let header = idempotency_header.unwrap_or_else(|| IdempotencyHeader::default_for(url));
    if url.starts_with("smtp://") || url.starts_with("smtps://") {
        Ok(Arc::new(
            SmtpMailer::new(url, timeout)?.with_idempotency_header(header),
        ))
    } else if url.starts_with("http://") || url.starts_with("https://") {
        Ok(Arc::new(
            HttpMailer::new(url, api_key, timeout)?.with_idempotency_header(header),
        ))
    } else {
        Err(MailerError::Scheme(
            url.split("://").next().unwrap_or(url).to_owned(),
        ))
    }
}

/// SMTP with lettre: `Message-ID: <delivery_key@oncely>` and the delivery key in the
/// idempotency header (`Resend-Idempotency-Key` unless told otherwise).
///
/// It speaks SMTP with lettre's connection ([`AsyncSmtpConnection`]) step by step, as lettre's
/// `AsyncSmtpTransport` does in one call — connect (TLS or STARTTLS as the URL says), `EHLO`,
/// `AUTH`, `MAIL`, `RCPT`, `DATA`, the message, `QUIT` — so that it can record the point of no
/// return ([`Mailer::send_marked`]) between the server's `354` to `DATA` and the message's
/// content: before it, nothing of the message has reached the server.
pub struct SmtpMailer {
    server: SmtpServer,
    timeout: Duration,
    idempotency_header: IdempotencyHeader,
}

/// Where and how the SMTP mailer connects: what lettre's `AsyncSmtpTransport::from_url` makes of
/// the URL ([`SmtpServer::of`]).
struct SmtpServer {
    host: String,
    port: u16,
    tls: Tls,
    hello_name: ClientId,
    credentials: Option<Credentials>,
}

impl SmtpServer {
    /// The server a URL names, read as lettre reads it (`from_connection_url`, lettre 0.11):
    /// `smtp://` plain on port 25, `?tls=required` STARTTLS (587), `?tls=opportunistic`
    /// STARTTLS if offered (587), `smtps://` TLS (465); the path as the `EHLO` name (else the
    /// host's name); a user and password (percent-decoded) to `AUTH` with, by `PLAIN` or
    /// `LOGIN`. The URL was checked by lettre first ([`SmtpMailer::new`]), so it parses.
    fn of(url: &str) -> Result<Self, String> {
        let url = reqwest::Url::parse(url).map_err(|error| error.to_string())?;
        let host = url.host_str().ok_or("smtp host undefined")?.to_owned();
        let tls_query = url
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.to_string());
        let parameters = || TlsParameters::new(host.clone()).map_err(|e| e.to_string());
        let (port, tls) = match (url.scheme(), tls_query.as_deref()) {
            ("smtp", None) => (SMTP_PORT, Tls::None),
            ("smtp", Some("required")) => (SUBMISSION_PORT, Tls::Required(parameters()?)),
            ("smtp", Some("opportunistic")) => (SUBMISSION_PORT, Tls::Opportunistic(parameters()?)),
            ("smtps", _) => (SUBMISSIONS_PORT, Tls::Wrapper(parameters()?)),
            (scheme, tls) => return Err(format!("unknown scheme {scheme:?} or tls {tls:?}")),
        };
        let hello_name = if url.path().len() > 1 {
            ClientId::Domain(url.path().trim_matches('/').to_owned())
        } else {
            ClientId::default()
        };
        let credentials = match url.password() {
            Some(password) => Some(Credentials::new(
                percent_decoded(url.username())?,
                percent_decoded(password)?,
            )),
            None => None,
        };
        Ok(Self {
            port: url.port().unwrap_or(port),
            host,
            tls,
            hello_name,
            credentials,
        })
    }

    /// A connection, as lettre's transport opens one: TCP (TLS at once for `smtps://`), `EHLO`,
    /// STARTTLS as the URL asks, `AUTH` with the URL's credentials.
    async fn connect(&self, timeout: Duration) -> Result<AsyncSmtpConnection, SmtpError> {
        let wrapper = match &self.tls {
            Tls::Wrapper(parameters) => Some(parameters.clone()),
            _ => None,
        };
        let address = (self.host.as_str(), self.port);
        let mut conn = AsyncSmtpConnection::connect_tokio1(
            address,
            Some(timeout),
            &self.hello_name,
            wrapper,
            None,
        )
        .await?;
        match &self.tls {
            Tls::Opportunistic(parameters) if conn.can_starttls() => {
                conn.starttls(parameters.clone(), &self.hello_name).await?;
            }
            Tls::Required(parameters) => {
                conn.starttls(parameters.clone(), &self.hello_name).await?;
            }
            _ => {}
        }
        if let Some(credentials) = &self.credentials {
            conn.auth(DEFAULT_MECHANISMS, credentials).await?;
        }
        Ok(conn)
    }
}

/// `%XX` sequences decoded, as UTF-8 (a user name or password in a URL).
fn percent_decoded(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|error| error.to_string())
}

/// How a send ended short of the server's answer to the message.
enum Cut {
    /// lettre's error: classified as the transport's always were.
    Smtp(SmtpError),
    /// A check lettre's transport makes before `MAIL` failed: what it reported, as its client
    /// error says it.
    Client(&'static str),
    /// The point of no return could not be recorded: nothing of the message was sent.
    NotMarked(String),
}

impl From<SmtpError> for Cut {
    fn from(error: SmtpError) -> Self {
        Self::Smtp(error)
    }
}

impl SmtpMailer {
    /// See [`from_url`].
    pub fn new(url: &str, timeout: Duration) -> Result<Self, MailerError> {
        crate::http::install_crypto_provider();
        // lettre checks the URL (its errors, as before); the server is read from it the same way.
        AsyncSmtpTransport::<Tokio1Executor>::from_url(url)?;
        let server = SmtpServer::of(url).map_err(MailerError::SmtpUrl)?;
        Ok(Self {
            server,
            timeout,
            idempotency_header: IdempotencyHeader(IdempotencyHeader::SMTP_DEFAULT.to_owned()),
        })
    }

    /// One SMTP conversation for `message`, recording `point` once `DATA` was accepted and
    /// before the content is sent. The steps and their errors are lettre's
    /// (`AsyncSmtpConnection::send`, lettre 0.11): `MAIL` (with `SMTPUTF8` / `8BITMIME` when
    /// needed), one `RCPT` per recipient, `DATA`, the content; a failed step ends with `QUIT`;
    /// the end `QUIT`s as the transport did.
    async fn converse(
        &self,
        message: &lettre::Message,
        point: &dyn PointOfNoReturn,
    ) -> Result<SmtpResponse, Cut> {
        let envelope = message.envelope();
        let email = message.formatted();
        let mut conn = self.server.connect(self.timeout).await?;
        let mut options = Vec::new();
        let non_ascii_address = envelope
            .from()
            .into_iter()
            .chain(envelope.to())
            .any(|address| !AsRef::<str>::as_ref(address).is_ascii());
        if non_ascii_address {
            if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
                conn.abort().await;
                return Err(Cut::Client(
                    "Envelope contains non-ascii chars but server does not support SMTPUTF8",
                ));
            }
            options.push(MailParameter::SmtpUtfEight);
        }
        if !email.is_ascii() {
            if !conn.server_info().supports_feature(Extension::EightBitMime) {
                conn.abort().await;
                return Err(Cut::Client(
                    "Message contains non-ascii chars but server does not support 8BITMIME",
                ));
            }
            options.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        let mail = Mail::new(envelope.from().cloned(), options);
        let commands = async {
            conn.command(mail).await?;
            for to in envelope.to() {
                conn.command(Rcpt::new(to.clone(), Vec::new())).await?;
            }
            conn.command(Data).await
        };
        if let Err(error) = commands.await {
            conn.abort().await;
            return Err(Cut::Smtp(error));
        }
        // The point of no return: the server waits for the content. If it cannot be recorded,
        // nothing more is written — not even QUIT, which would be read as content — and the
        // connection is closed without the content's final dot, so the server discards the
        // message (RFC 5321, 4.1.1.4: a transaction ends only at the final dot).
        if let Err(why) = point.reached().await {
            drop(conn);
            return Err(Cut::NotMarked(why));
        }
        let answer = conn.message(&email).await;
        conn.abort().await;
        Ok(answer?)
    }

    /// Sends the delivery key in `header` instead.
    pub fn with_idempotency_header(mut self, header: IdempotencyHeader) -> Self {
        self.idempotency_header = header;
        self
    }
}

impl MarkingMailer for SmtpMailer {
    async fn deliver(&self, email: &Email, key: &str, point: &dyn PointOfNoReturn) -> Delivery {
        let message = match build_message(email, key, &self.idempotency_header) {
            Ok(message) => message,
            Err(error) => return Delivery::Permanent(format!("cannot build the message: {error}")),
        };
        let sent = match tokio::time::timeout(self.timeout, self.converse(&message, point)).await {
            Ok(Err(Cut::NotMarked(why))) => return Delivery::Retry(why),
            // The server cannot take this message as it is (an address that needs SMTPUTF8, a
            // body that needs 8BITMIME, which it does not offer): nothing was sent, and no retry
            // would go otherwise — it dies with the reason (re-driven once the mailer changes).
            Ok(Err(Cut::Client(why))) => {
                return Delivery::Permanent(format!("SMTP: the server cannot take it: {why}"));
            }
            Ok(Err(Cut::Smtp(error))) => Ok(Err(error)),
            Ok(Ok(response)) => Ok(Ok(response)),
            Err(elapsed) => Err(elapsed),
        };
        match sent {
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

/// The message: `text/plain` alone, or with an HTML part `multipart/alternative` (the text
/// first, then the HTML: a reader shows the last part it can), both UTF-8, lettre choosing each
/// part's transfer encoding (quoted-printable or base64 for long lines and non-ASCII);
/// `Reply-To` when the email names one. A `from`, `to` or `reply_to` that is not an address
/// is an error (the send is permanent: every retry would fail the same way).
fn build_message(
    email: &Email,
    key: &str,
    header: &IdempotencyHeader,
) -> Result<lettre::Message, Box<dyn std::error::Error + Send + Sync>> {
    let name = HeaderName::new_from_ascii(header.as_str().to_owned())?;
    let mut builder = lettre::Message::builder()
        .from(email.from.parse()?)
        .to(recipient(&email.to)?)
        .subject(email.subject.clone())
        .message_id(Some(format!("<{key}@oncely>")))
        .raw_header(HeaderValue::new(name, key.to_owned()));
    if let Some(reply_to) = &email.reply_to {
        let mailbox = reply_to
            .parse()
            .map_err(|error| format!("reply_to {reply_to:?} is not an address: {error}"))?;
        builder = builder.reply_to(mailbox);
    }
    Ok(match &email.html {
        None => builder
            .header(ContentType::TEXT_PLAIN)
            .body(email.text.clone())?,
        Some(html) => builder.multipart(MultiPart::alternative_plain_html(
            email.text.clone(),
            html.clone(),
        ))?,
    })
}

/// `to` as the SMTP mailer addresses it: a mailbox lettre accepts, or why not. An application
/// that stores addresses checks them with this at its door (a signup), so that none it accepts
/// dies in the worker as "not an address".
pub fn recipient(to: &str) -> Result<lettre::message::Mailbox, lettre::address::AddressError> {
    to.parse()
}

/// The MIME message the SMTP mailer sends for `email` under `delivery_key` (with the default
/// SMTP idempotency header): what `oncely templates preview` writes. The error says why the
/// message cannot be built (a sender or recipient that is not an address).
pub fn formatted(email: &Email, delivery_key: &str) -> Result<Vec<u8>, String> {
    let header = IdempotencyHeader(IdempotencyHeader::SMTP_DEFAULT.to_owned());
    build_message(email, delivery_key, &header)
        .map(|message| message.formatted())
        .map_err(|error| error.to_string())
}

/// A Resend-compatible HTTP API: `POST {url}` with the delivery key in the idempotency header
/// (`Idempotency-Key` unless told otherwise). A 409 `invalid_idempotent_request` (the key was
/// used with another payload) is permanent; see [`crate::http::post_json`].
pub struct HttpMailer {
    client: reqwest::Client,
    url: String,
    api_key: Option<SecretString>,
    idempotency_header: IdempotencyHeader,
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
            idempotency_header: IdempotencyHeader(IdempotencyHeader::HTTP_DEFAULT.to_owned()),
        })
    }

    /// Sends the delivery key in `header` instead.
    pub fn with_idempotency_header(mut self, header: IdempotencyHeader) -> Self {
        self.idempotency_header = header;
        self
    }
}

impl MarkingMailer for HttpMailer {
    async fn deliver(&self, email: &Email, key: &str, point: &dyn PointOfNoReturn) -> Delivery {
        let body = http_body(email, key);
        let header = self.idempotency_header.as_str();
        let api_key = self.api_key.as_ref();
        // The point of no return: reqwest connects and writes the request in one call, so the
        // mark comes before the connection too (an attempt abandoned while connecting parks,
        // as one whose request was written does).
        if let Err(why) = point.reached().await {
            return Delivery::Retry(why);
        }
        match crate::http::post_json_to_endpoint(
            &self.client,
            &self.url,
            (header, key),
            &body,
            api_key,
        )
        .await
        {
            Ok(answer) => Delivery::Sent {
                provider_message_id: answer["id"].as_str().map(str::to_owned),
            },
            Err(outcome) => outcome,
        }
    }
}

/// The JSON of a send: Resend's fields, `html` and `reply_to` only when the email has them (an
/// email without them is sent exactly as before they existed: a provider compares the payloads
/// of one idempotency key, and refuses a key whose payload changed).
fn http_body(email: &Email, key: &str) -> serde_json::Value {
    let mut body = json!({
        "from": email.from,
        "to": [email.to],
        "subject": email.subject,
        "text": email.text,
        "headers": { "Message-ID": format!("<{key}@oncely>") },
    });
    if let Some(html) = &email.html {
        body["html"] = json!(html);
    }
    if let Some(reply_to) = &email.reply_to {
        body["reply_to"] = json!(reply_to);
    }
    body
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
        self.run_marked(job, &Unrecorded)
    }

    fn run_marked<'a>(
        &'a self,
        job: &'a crate::Job,
        point: &'a dyn PointOfNoReturn,
    ) -> DeliveryFuture<'a> {
        Box::pin(async move {
            let email: Email = match serde_json::from_value(job.payload.clone()) {
                Ok(email) => email,
                Err(error) => {
                    return Delivery::Permanent(format!("payload is not an email: {error}"));
                }
            };
            self.mailer
                .send_marked(&email, &job.delivery_key.to_string(), point)
                .await
        })
    }

    fn marks_point_of_no_return(&self) -> bool {
        self.mailer.marks_point_of_no_return()
    }

    fn reconciles(&self) -> bool {
        self.mailer.looks_up()
    }

    fn reconcile<'a>(&'a self, job: &'a crate::Job) -> ReconcileFuture<'a> {
        Box::pin(async move {
            let key = job.delivery_key.to_string();
            self.mailer.look_up(&key, job.created_at).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idempotency_header_is_a_header_name_the_mailer_does_not_write_itself() {
        for good in ["Idempotency-Key", "Resend-Idempotency-Key", "X-Key_1.v2"] {
            assert_eq!(IdempotencyHeader::new(good).unwrap().as_str(), good);
        }
        for (bad, why) in [
            ("", "empty"),
            ("Idempotency Key", "no spaces"),
            ("Idempotency-Key:", "no spaces or colons"),
            ("Clé", "letters, digits"),
            ("message-ID", "writes this header itself"),
            ("Authorization", "writes this header itself"),
            // Review of issue 14: headers that change how the request or the message is sent
            // or handled were accepted.
            ("Expect", "how the message is sent"),
            ("content-encoding", "how the message is sent"),
            ("Upgrade", "how the message is sent"),
            ("TE", "how the message is sent"),
            ("Return-Path", "how the message is sent"),
            ("DKIM-Signature", "how the message is sent"),
            ("Resent-To", "how the message is sent"),
            ("To", "how the message is sent"),
            ("X-HTTP-Method-Override", "how the message is sent"),
            ("Forwarded", "how the message is sent"),
            ("If-Match", "how the message is sent"),
            ("Delivered-To", "how the message is sent"),
            ("Authentication-Results", "how the message is sent"),
            (&"X".repeat(77), "76"),
        ] {
            let error = IdempotencyHeader::new(bad).unwrap_err().to_string();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
    }

    #[test]
    fn each_transport_defaults_to_its_provider_s_header() {
        let default = |url| IdempotencyHeader::default_for(url).to_string();
        assert_eq!(default("smtp://127.0.0.1:25"), "Resend-Idempotency-Key");
        assert_eq!(
            default("smtps://smtp.resend.com:465"),
            "Resend-Idempotency-Key"
        );
        assert_eq!(default("https://api.resend.com/emails"), "Idempotency-Key");
    }

    #[test]
    fn the_smtp_message_carries_the_key_in_the_configured_header_and_the_message_id() {
        let email = Email {
            from: "a@example.com".into(),
            to: "b@example.com".into(),
            subject: "s".into(),
            text: "t".into(),
            ..Default::default()
        };
        let header = IdempotencyHeader::new("X-Provider-Key").unwrap();
        let raw =
            String::from_utf8(build_message(&email, "k-1", &header).unwrap().formatted()).unwrap();
        assert!(raw.contains("X-Provider-Key: k-1\r\n"), "{raw}");
        assert!(raw.contains("Message-ID: <k-1@oncely>\r\n"), "{raw}");
        assert!(!raw.contains("Idempotency-Key"), "{raw}");
    }

    fn email() -> Email {
        Email {
            from: "a@example.com".into(),
            to: "b@example.com".into(),
            subject: "s".into(),
            text: "t".into(),
            ..Default::default()
        }
    }

    fn formatted(email: &Email) -> String {
        let header = IdempotencyHeader::new("X-Provider-Key").unwrap();
        String::from_utf8(build_message(email, "k-1", &header).unwrap().formatted()).unwrap()
    }

    #[test]
    fn without_html_the_smtp_message_is_one_text_part_and_has_no_reply_to() {
        let raw = formatted(&email());
        assert!(
            raw.contains("Content-Type: text/plain; charset=utf-8\r\n"),
            "{raw}"
        );
        assert!(!raw.contains("multipart"), "{raw}");
        assert!(!raw.contains("Reply-To"), "{raw}");
    }

    #[test]
    fn with_html_the_smtp_message_is_text_then_html_and_keeps_its_headers() {
        let raw = formatted(&Email {
            html: Some("<p>Grüße</p>".into()),
            reply_to: Some("Support <support@example.com>".into()),
            ..email()
        });
        let head = &raw[..raw.find("\r\n\r\n").unwrap()];
        assert!(
            head.contains("Content-Type: multipart/alternative;"),
            "{raw}"
        );
        assert!(
            head.contains("Reply-To: Support <support@example.com>\r\n"),
            "{raw}"
        );
        assert!(head.contains("Message-ID: <k-1@oncely>\r\n"), "{raw}");
        assert!(head.contains("X-Provider-Key: k-1\r\n"), "{raw}");
        let text = raw.find("Content-Type: text/plain; charset=utf-8").unwrap();
        let html = raw.find("Content-Type: text/html; charset=utf-8").unwrap();
        assert!(text < html, "the text part first: {raw}");
    }

    #[test]
    fn a_reply_to_that_is_not_one_address_cannot_be_sent() {
        let header = IdempotencyHeader::new("X-Provider-Key").unwrap();
        for bad in [
            "",
            "not an address",
            "a@example.com, b@example.com",
            "a@example.com\r\nBcc: victim@example.com",
            "a@example.com>\nX-Injected: 1",
        ] {
            let email = Email {
                reply_to: Some(bad.into()),
                ..email()
            };
            let error = build_message(&email, "k-1", &header)
                .unwrap_err()
                .to_string();
            assert!(error.contains("reply_to"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn the_http_body_gains_html_and_reply_to_only_when_set() {
        // Byte for byte what the mailer sent before the fields existed: a provider refuses a
        // key whose payload changed.
        assert_eq!(
            serde_json::to_string(&http_body(&email(), "k-1")).unwrap(),
            r#"{"from":"a@example.com","headers":{"Message-ID":"<k-1@oncely>"},"subject":"s","text":"t","to":["b@example.com"]}"#
        );
        let body = http_body(
            &Email {
                html: Some("<p>h</p>".into()),
                reply_to: Some("r@example.com".into()),
                ..email()
            },
            "k-1",
        );
        assert_eq!(body["html"], "<p>h</p>");
        assert_eq!(body["reply_to"], "r@example.com");
        assert_eq!(body["text"], "t");
    }
}
