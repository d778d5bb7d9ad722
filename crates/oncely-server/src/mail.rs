//! The emails the service sends, and the outbox handlers that render and send them.
//!
//! Payloads hold ids, never tokens: the verification handler derives the token again from the
//! server secret and the token record's id (see [`crate::token`]), checks the record is still
//! live, and only then sends the link.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use oncely::ServerSecret;
use oncely_outbox::mail::{Email, Mailer};
use oncely_outbox::{Delivery, Handler, Job};
use uuid::Uuid;

use crate::accounts::Accounts;
use crate::token::{Flow, Token};

/// Job kind: the verification email after a signup.
pub const VERIFICATION: &str = "email.verification";
/// Job kind: "someone tried to sign up with your address" to an existing account.
pub const SIGNUP_NOTICE: &str = "email.signup_notice";

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

fn uuid_field(job: &Job, field: &str) -> Result<Uuid, Delivery> {
    job.payload[field]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Delivery::Permanent(format!("payload has no {field}")))
}

/// Sends the verification email of a token record.
pub struct VerificationEmail<A> {
    /// Reads the token record and its user.
    pub accounts: A,
    /// Secret, links, sender, mailer.
    pub context: Arc<MailContext>,
}

impl<A: Accounts> VerificationEmail<A> {
    async fn send(&self, job: &Job) -> Delivery {
        let token_id = match uuid_field(job, "token_id") {
            Ok(id) => id,
            Err(delivery) => return delivery,
        };
        let record = match self.accounts.token_for_send(token_id).await {
            Ok(Some(record)) => record,
            Ok(None) => return Delivery::Permanent("the token record no longer exists".into()),
            Err(error) => return Delivery::Retry(format!("reading the token record: {error:#}")),
        };
        if !record.live {
            return Delivery::Permanent(
                "not sent: the link was superseded, used or expired before delivery".into(),
            );
        }
        let token = Token::derive(&self.context.secret, Flow::Verification, token_id);
        let link = format!(
            "{}/v1/verify?token={}",
            self.context.public_url,
            token.expose()
        );
        let email = Email {
            from: self.context.from.clone(),
            to: record.email,
            subject: "Confirm your email address".into(),
            text: format!(
                "Welcome!\n\nConfirm your email address by opening this link:\n\n{link}\n\n\
                 The link works once and expires in 24 hours. If you did not sign up, ignore this message.\n"
            ),
        };
        self.context
            .mailer
            .send(&email, &job.delivery_key.to_string())
            .await
    }
}

impl<A: Accounts> Handler for VerificationEmail<A> {
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
        let user_id = match uuid_field(job, "user_id") {
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
                 Sign in at {0}, or reset your password at {0}/v1/password-reset if you forgot it.\n\
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
