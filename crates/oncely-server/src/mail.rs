//! The emails the service sends, and the outbox handlers that render and send them.
//!
//! Payloads hold ids, never tokens: the handler derives the token again from the server secret
//! and the token record's id (see [`crate::token`]), checks the record is still live, and only
//! then sends the link. A job written for an unknown address (a decoy: no recipient) or one
//! whose send was suppressed by a rate limit ends `skipped`, with the reason, and sends nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use oncely::ServerSecret;
use oncely_outbox::mail::{Email, Mailer};
use oncely_outbox::{Delivery, Handler, Job};
use uuid::Uuid;

use crate::accounts::Accounts;
use crate::token::{Flow, Token};

/// Job kind: "someone tried to sign up with your address" to an existing account.
pub const SIGNUP_NOTICE: &str = "email.signup_notice";

/// Every job kind the service's workers run.
pub const KINDS: [&str; 5] = [
    "email.verification",
    "email.password_reset",
    "email.magic_link",
    "email.invite",
    SIGNUP_NOTICE,
];

/// What every email handler needs.
#[derive(Clone)]
pub struct MailContext {
    /// Derives tokens.
    pub secret: ServerSecret,
    /// Base of links (`https://app.example.com`).
    pub public_url: String,
    /// Sender address.
    pub from: String,
    /// The mailer.
    pub mailer: Arc<dyn Mailer>,
}

/// The id in the payload's `field`, unless the request suppressed the job's email or the payload
/// has no such id: then the outcome to record.
fn subject(job: &Job, field: &str) -> Result<Uuid, Delivery> {
    if let Some(skip) = suppressed(job) {
        return Err(skip);
    }
    job.payload[field]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Delivery::Permanent(format!("payload has no {field}")))
}

/// The rate-limit verdict the request recorded, if its email is suppressed.
fn suppressed(job: &Job) -> Option<Delivery> {
    job.payload["suppressed"]
        .as_str()
        .map(|reason| Delivery::Skipped(reason.to_owned()))
}

/// Subject and body of a flow's email, around its link.
fn render(flow: Flow, link: &str) -> (&'static str, String) {
    match flow {
        Flow::Verification => (
            "Confirm your email address",
            format!(
                "Welcome!\n\nConfirm your email address by opening this link:\n\n{link}\n\n\
                 The link works once and expires in 24 hours. If you did not sign up, ignore this message.\n"
            ),
        ),
        Flow::PasswordReset => (
            "Reset your password",
            format!(
                "Someone asked to reset the password of your account. To choose a new one, open:\n\n{link}\n\n\
                 The link works once and expires in 1 hour. If it was not you, ignore this message.\n"
            ),
        ),
        Flow::MagicLink => (
            "Your sign-in link",
            format!(
                "Open this link to sign in:\n\n{link}\n\nIt works once and expires in 15 minutes.\n"
            ),
        ),
        Flow::Invite => (
            "You are invited",
            format!(
                "You have been invited to join. Accept the invitation here:\n\n{link}\n\nIt expires in 7 days.\n"
            ),
        ),
    }
}

/// Sends the email of a token record, whichever its flow.
pub struct TokenEmail<A> {
    /// Reads the token record and its recipient.
    pub accounts: A,
    /// Secret, links, sender, mailer.
    pub context: Arc<MailContext>,
}

impl<A: Accounts> TokenEmail<A> {
    async fn send(&self, job: &Job) -> Delivery {
        let token_id = match subject(job, "token_id") {
            Ok(id) => id,
            Err(delivery) => return delivery,
        };
        let record = match self.accounts.token_for_send(token_id).await {
            Ok(Some(record)) => record,
            Ok(None) => return Delivery::Permanent("the token record no longer exists".into()),
            Err(error) => return Delivery::Retry(format!("reading the token record: {error:#}")),
        };
        let Some(to) = record.recipient else {
            return Delivery::Skipped("no account for this address: nothing to send".into());
        };
        if !record.live {
            return Delivery::Skipped(
                "the link was superseded or used before delivery: not sent".into(),
            );
        }
        let Some(flow) = Flow::parse(&record.flow) else {
            return Delivery::Permanent(format!("unknown token flow {:?}", record.flow));
        };
        // The secret that derived the stored hash: the current one, or a previous one when the
        // job was written before a rotation (the link must be the one whose hash is stored).
        let Some(token) = self
            .context
            .secret
            .all()
            .map(|secret| Token::derive(secret, flow, token_id))
            .find(|token| token.hash() == record.hash)
        else {
            return Delivery::Permanent(
                "no configured server secret derives this link (rotated out of ONCELY_SECRET_PREVIOUS?): not sent"
                    .into(),
            );
        };
        let link = format!(
            "{}{}?token={}",
            self.context.public_url,
            flow.path(),
            token.expose()
        );
        let (subject, text) = render(flow, &link);
        let email = Email {
            from: self.context.from.clone(),
            to,
            subject: subject.into(),
            text,
        };
        self.context
            .mailer
            .send(&email, &job.delivery_key.to_string())
            .await
    }
}

impl<A: Accounts> Handler for TokenEmail<A> {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.send(job))
    }
}

/// Tells an existing account that someone tried to sign up with its address.
pub struct SignupNotice<A> {
    /// Reads the user's address.
    pub accounts: A,
    /// Links, sender, mailer.
    pub context: Arc<MailContext>,
}

impl<A: Accounts> SignupNotice<A> {
    async fn send(&self, job: &Job) -> Delivery {
        let user_id = match subject(job, "user_id") {
            Ok(id) => id,
            Err(delivery) => return delivery,
        };
        let to = match self.accounts.user_email(user_id).await {
            Ok(Some(to)) => to,
            Ok(None) => return Delivery::Permanent("the user no longer exists".into()),
            Err(error) => return Delivery::Retry(format!("reading the user: {error:#}")),
        };
        let email = Email {
            from: self.context.from.clone(),
            to,
            subject: "Someone tried to sign up with your address".into(),
            text: format!(
                "Someone (maybe you) tried to create an account with this address, but you already have one.\n\n\
                 Sign in at {0}, or ask for a password reset there if you forgot your password.\n\
                 If it was not you, you can ignore this message.\n",
                self.context.public_url
            ),
        };
        self.context
            .mailer
            .send(&email, &job.delivery_key.to_string())
            .await
    }
}

impl<A: Accounts> Handler for SignupNotice<A> {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.send(job))
    }
}
