//! The emails the service sends, and the outbox handlers that render and send them.
//!
//! Payloads hold ids, never tokens: the handler derives the token again from the server secret
//! and the token record's id (see [`crate::token`]), checks the record is still live, and only
//! then sends the link. A job written for an unknown address (a decoy: no recipient) or one
//! whose send was suppressed by a rate limit ends `skipped`, with the reason, and sends nothing.
//!
//! Each email is its [`Message`]'s templates ([`crate::templates`]) rendered in the locale of
//! its link (the request's), else of its account, with its tenant's branding
//! ([`crate::branding`]). A template that fails to render ends the job dead with the reason;
//! nothing half-rendered is sent.
//!
//! One key, one payload: the first attempt of a job freezes the email as rendered then
//! ([`FrozenEmail`], through [`Handler::freeze`]) — recipient, sender, subject, text, HTML,
//! `Reply-To`, and the link's base; never the token — and every attempt sends exactly that,
//! under the same delivery key, even if the address, `ONCELY_PUBLIC_URL`, the sender, the
//! branding or the templates changed since (a provider refuses another payload under a key it
//! has seen). The checks that decide
//! *whether* to send (the link was used or superseded, the account is gone, the send was
//! suppressed) run again on every attempt.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use oncely::ServerSecret;
use oncely_outbox::mail::{Email, Mailer};
use oncely_outbox::{
    Delivery, Ended, FreezeFuture, Handler, Job, NewJob, PointOfNoReturn, ReconcileFuture,
    ThenError, ThenFuture, Unrecorded,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::accounts::{Accounts, live_token};
use crate::branding::{Sender, ServiceBrand, site_of};
use crate::templates::{Locale, Message, Templates, Vars, escape_link};
use crate::token::{Flow, Token};
use crate::webhooks::events::{Event, EventType, deliveries, deliveries_carrying, subscribed};

/// Job kind: "someone tried to sign up with your address" to an existing account.
pub const SIGNUP_NOTICE: &str = "email.signup_notice";

/// Job kind: "a change of your address was requested" to an account's address before the
/// change.
pub const EMAIL_CHANGE_NOTICE: &str = "email.email_change_notice";

/// Job kind: "someone tried to change an account's address to yours" to the account that has
/// the address already.
pub const EMAIL_TAKEN_NOTICE: &str = "email.email_taken_notice";

/// Every job kind the service's workers run.
pub const KINDS: [&str; 8] = [
    "email.verification",
    "email.password_reset",
    "email.magic_link",
    "email.invite",
    "email.email_change",
    SIGNUP_NOTICE,
    EMAIL_CHANGE_NOTICE,
    EMAIL_TAKEN_NOTICE,
];

/// What every email handler needs.
#[derive(Clone)]
pub struct MailContext {
    /// Derives tokens.
    pub secret: ServerSecret,
    /// Base of links (`https://app.example.com`).
    pub public_url: String,
    /// The service's sender, product name and support address, and the senders it allows.
    pub brand: ServiceBrand,
    /// The emails' templates (checked at start).
    pub templates: Templates,
    /// The mailer.
    pub mailer: Arc<dyn Mailer>,
}

impl MailContext {
    /// Whether the mailer can be asked whether it accepted a delivery key (a delivery lookup:
    /// `ONCELY_MAILER_LOOKUP`, or the dev inbox's own).
    fn reconciles(&self) -> bool {
        self.mailer.looks_up()
    }

    /// Asks the mailer whether it accepted `job`'s delivery key (an email handed to webhooks
    /// instead was never mailed: not accepted, so it is handed over again, as its retry would).
    fn reconcile<'a>(&'a self, job: &'a Job) -> ReconcileFuture<'a> {
        Box::pin(async move {
            let key = job.delivery_key.to_string();
            self.mailer.look_up(&key, job.created_at).await
        })
    }

    /// Hands `email` to the mailer under `job`'s delivery key, recording the attempt's point of
    /// no return at `point`.
    async fn mail(&self, email: &Email, job: &Job, point: &dyn PointOfNoReturn) -> Delivery {
        self.mailer
            .send_marked(email, &job.delivery_key.to_string(), point)
            .await
    }

    /// The sender of `tenant`'s emails now: its branding (read from the database) over the
    /// service's.
    async fn sender<A: Accounts>(&self, accounts: &A, tenant: &str) -> Result<Sender, Delivery> {
        let branding = accounts.branding(tenant).await.map_err(|error| {
            Delivery::Retry(format!("reading the tenant's branding: {error:#}"))
        })?;
        Ok(self
            .brand
            .sender(tenant, &branding, &site_of(&self.public_url)))
    }

    /// The variables every message of `tenant` to `to` has.
    fn vars(&self, tenant: &str, sender: &Sender, to: &str) -> Vars {
        Vars {
            product_name: sender.product_name.clone(),
            tenant: tenant.to_owned(),
            site: site_of(&self.public_url),
            support_email: sender.support_email.clone(),
            recipient: to.to_owned(),
            ..Vars::default()
        }
    }

    /// `message` to `to`, rendered: the job's end if a template fails.
    fn compose(
        &self,
        message: Message,
        (tenant, locale): (&str, Option<&Locale>),
        sender: &Sender,
        vars: &Vars,
    ) -> Result<FrozenEmail, Delivery> {
        let rendered = self
            .templates
            .render(message, tenant, locale, vars)
            .map_err(|problem| {
                let problem = crate::templates::Problem {
                    file: self.templates.relative(&problem.file).to_owned(),
                    ..problem
                };
                Delivery::Permanent(format!(
                    "the {} email does not render: {problem}",
                    message.name()
                ))
            })?;
        Ok(FrozenEmail {
            email: Email {
                from: sender.from.clone(),
                to: vars.recipient.clone(),
                subject: rendered.subject,
                text: rendered.text,
                html: Some(rendered.html),
                reply_to: sender.support_email.clone(),
            },
            link: None,
        })
    }
}

/// A locale as stored (validated when it was written; anything else is English).
fn stored_locale(locale: Option<&str>) -> Option<Locale> {
    locale.and_then(|l| Locale::parse(l).ok())
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

/// Where the link goes in a frozen text and HTML part: the link's base
/// ([`FrozenEmail::link`]) followed by the token, derived again at each send. The same mark as
/// every release before (a process of the previous release may retry a job this one froze);
/// no value an email shows can hold it ([`crate::templates::LINK_MARK`]).
const LINK: &str = crate::templates::LINK_MARK;

/// An email as its job's first attempt rendered it, stored on the job ([`Job::frozen`]) and
/// sent as it is by every attempt. A token email's link is frozen without its token: `text`
/// and `html` hold `{{link}}` where the link goes, and `link` the link up to the token (the
/// public URL, the flow's path, `?token=`). A job frozen by a release before templates has no
/// `html` and no `reply_to`: it is sent as it was frozen, text only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenEmail {
    /// The email as it is sent (`Reply-To`: the support address), but that its `text` and
    /// `html` hold `{{link}}` where a token email's link goes. Its fields are the frozen
    /// value's own (flattened): the stored JSON is what it was before.
    #[serde(flatten)]
    pub email: Email,
    /// A token email's link before its token.
    pub link: Option<String>,
}

impl FrozenEmail {
    /// The email of a token record of `flow` to `to` in `locale`, as the context renders it
    /// now for `sender`.
    fn token_email(
        context: &MailContext,
        (flow, tenant, locale): (Flow, &str, Option<&Locale>),
        sender: &Sender,
        to: &str,
    ) -> Result<Self, Delivery> {
        let vars = Vars {
            link: Some(LINK.to_owned()),
            link_lifetime_minutes: Some(flow.lifetime().whole_minutes()),
            ..context.vars(tenant, sender, to)
        };
        let message = Message::of_flow(flow);
        let email = context.compose(message, (tenant, locale), sender, &vars)?;
        Ok(Self {
            link: Some(format!("{}{}?token=", context.public_url, flow.path())),
            ..email
        })
    }

    /// The email that is sent: the link completed with `token`.
    fn email(self, token: Option<&Token>) -> Result<Email, Delivery> {
        let Self { email, link } = self;
        let (text, html) = match (&link, token) {
            (Some(link), Some(token)) if email.text.contains(LINK) => {
                let link = format!("{link}{}", token.expose());
                let html = email
                    .html
                    .map(|html| html.replace(LINK, &escape_link(&link)));
                (email.text.replace(LINK, &link), html)
            }
            (None, None) => (email.text, email.html),
            _ => {
                return Err(Delivery::Permanent(
                    "the frozen email's link does not fit".into(),
                ));
            }
        };
        Ok(Email {
            text,
            html,
            ..email
        })
    }

    /// The email a job's first attempt froze, if any.
    fn of(job: &Job) -> Result<Option<Self>, Delivery> {
        job.frozen
            .clone()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|error| {
                Delivery::Permanent(format!("the frozen email is unreadable: {error}"))
            })
    }

    /// The email the job's first attempt froze, else the one `compose` renders now (not run
    /// when there is a frozen one).
    async fn frozen_or(
        job: &Job,
        compose: impl Future<Output = Result<Self, Delivery>>,
    ) -> Result<Self, Delivery> {
        match Self::of(job)? {
            Some(frozen) => Ok(frozen),
            None => compose.await,
        }
    }

    /// As the job's frozen value.
    fn freeze(&self) -> Result<Option<serde_json::Value>, Delivery> {
        serde_json::to_value(self)
            .map(Some)
            .map_err(|error| Delivery::Permanent(format!("cannot freeze the email: {error}")))
    }
}

/// One kind of email, as its [`Emailing`] handler runs it: what it freezes, how it is sent and
/// its follow-ups; the mailer and its delivery lookups come from its [`MailContext`].
pub trait EmailJob: Send + Sync + 'static {
    /// Links, sender, mailer.
    fn context(&self) -> &MailContext;

    /// The email rendered now, frozen ([`Handler::freeze`]).
    fn freeze(
        &self,
        job: &Job,
    ) -> impl Future<Output = Result<Option<serde_json::Value>, Delivery>> + Send;

    /// Sends the job's email if it is still to be sent, recording the point of no return at
    /// `point` ([`Handler::run_marked`]).
    fn send(&self, job: &Job, point: &dyn PointOfNoReturn)
    -> impl Future<Output = Delivery> + Send;

    /// The follow-ups of the job, about to end as `end` says ([`Handler::then`]).
    fn then(
        &self,
        job: &Job,
        end: &Ended,
    ) -> impl Future<Output = Result<Vec<NewJob>, ThenError>> + Send;
}

/// The outbox handler of an [`EmailJob`] ([`TokenEmail`], [`NoticeEmail`]).
pub struct Emailing<E>(pub E);

impl<E: EmailJob> Handler for Emailing<E> {
    fn freeze<'a>(&'a self, job: &'a Job) -> FreezeFuture<'a> {
        Box::pin(self.0.freeze(job))
    }

    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.0.send(job, &Unrecorded))
    }

    // The mailer's point of no return (SMTP: before the content; HTTP: before the request).
    // The paths that hand nothing to the mailer (skipped, handed to the tenant's webhooks by
    // the follow-ups written with the finish) reach nothing outside before their finish.
    fn marks_point_of_no_return(&self) -> bool {
        self.0.context().mailer.marks_point_of_no_return()
    }

    fn run_marked<'a>(
        &'a self,
        job: &'a Job,
        point: &'a dyn PointOfNoReturn,
    ) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.0.send(job, point))
    }

    fn then<'a>(&'a self, job: &'a Job, end: &'a Ended) -> ThenFuture<'a> {
        Box::pin(self.0.then(job, end))
    }

    fn reconciles(&self) -> bool {
        self.0.context().reconciles()
    }

    fn reconcile<'a>(&'a self, job: &'a Job) -> ReconcileFuture<'a> {
        self.0.context().reconcile(job)
    }
}

/// Sends the email of a token record, whichever its flow.
pub struct TokenEmail<A> {
    /// Reads the token record and its recipient.
    pub accounts: A,
    /// Secret, links, sender, mailer.
    pub context: Arc<MailContext>,
}

/// What a token email is made of now: whom it goes to, its flow, its token.
struct Current {
    to: String,
    flow: Flow,
    tenant: String,
    token: Token,
    /// The link's locale, else the account's.
    locale: Option<Locale>,
}

impl<A: Accounts> TokenEmail<A> {
    /// Whether to send, and what from: checked on every attempt.
    async fn current(&self, job: &Job) -> Result<Current, Delivery> {
        let token_id = subject(job, "token_id")?;
        let (record, flow, token) =
            live_token(&self.accounts, &self.context.secret, token_id).await?;
        Ok(Current {
            to: record.recipient.unwrap_or_default(),
            flow,
            tenant: record.tenant,
            token,
            locale: stored_locale(record.locale.as_deref()),
        })
    }

    /// The email of `current`, rendered now.
    async fn compose(&self, current: &Current) -> Result<FrozenEmail, Delivery> {
        let sender = self.context.sender(&self.accounts, &current.tenant).await?;
        let about = (
            current.flow,
            current.tenant.as_str(),
            current.locale.as_ref(),
        );
        FrozenEmail::token_email(&self.context, about, &sender, &current.to)
    }
}

impl<A: Accounts> EmailJob for TokenEmail<A> {
    fn context(&self) -> &MailContext {
        &self.context
    }

    async fn freeze(&self, job: &Job) -> Result<Option<serde_json::Value>, Delivery> {
        let current = self.current(job).await?;
        self.compose(&current).await?.freeze()
    }

    async fn send(&self, job: &Job, point: &dyn PointOfNoReturn) -> Delivery {
        let current = match self.current(job).await {
            Ok(current) => current,
            Err(delivery) => return delivery,
        };
        let frozen = match FrozenEmail::frozen_or(job, self.compose(&current)).await {
            Ok(frozen) => frozen,
            Err(delivery) => return delivery,
        };
        let Current { tenant, token, .. } = current;
        if let Some(handed) = by_webhook(&self.accounts, &tenant).await {
            return handed;
        }
        let email = match frozen.email(Some(&token)) {
            Ok(email) => email,
            Err(delivery) => return delivery,
        };
        self.context.mail(&email, job, point).await
    }

    /// The follow-ups of a token email (see [`follow_ups`]): its tenant, recipient and account
    /// from the token record (none once the record is pruned: the tenant is unknown).
    async fn then(&self, job: &Job, end: &Ended) -> Result<Vec<NewJob>, ThenError> {
        if matches!(end, Ended::Skipped { .. }) || suppressed(job).is_some() {
            return Ok(Vec::new());
        }
        let Some(token_id) = job.payload["token_id"]
            .as_str()
            .and_then(|s| s.parse::<Uuid>().ok())
        else {
            return Ok(Vec::new());
        };
        let Some(record) = self.accounts.token_for_send(token_id).await? else {
            tracing::warn!(
                job = job.id,
                "an email's token record is gone: no email event"
            );
            return Ok(Vec::new());
        };
        let frozen = FrozenEmail::of(job).ok().flatten();
        let Some(to) = frozen
            .as_ref()
            .map(|f| f.email.to.clone())
            .or_else(|| record.recipient.clone())
        else {
            // A decoy: nobody's email.
            return Ok(Vec::new());
        };
        let Some(flow) = Flow::parse(&record.flow) else {
            return Ok(Vec::new());
        };
        // An email handed over by webhook carries its message: the frozen one, or (a job frozen
        // by no attempt) rendered now.
        let email = match frozen {
            Some(frozen) => Some(frozen),
            None if handed_over(end) => {
                let locale = stored_locale(record.locale.as_deref());
                let about = (flow, record.tenant.as_str(), locale.as_ref());
                let rendered = async {
                    let sender = self.context.sender(&self.accounts, &record.tenant).await?;
                    FrozenEmail::token_email(&self.context, about, &sender, &to)
                };
                Some(rendered.await.map_err(delivery_reason)?)
            }
            None => None,
        };
        let about = About {
            tenant: &record.tenant,
            to: &to,
            user_id: record.user_id,
        };
        let email = email.map(|frozen| (frozen, Some(token_id)));
        follow_ups(&self.accounts, job, end, &about, email).await
    }
}

/// Which notice: an email without a link, telling an account what someone tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// To an account whose address someone tried to sign up with ([`SIGNUP_NOTICE`]): its
    /// payload names the account (`user_id`).
    SignupAttempt,
    /// To the account's address before an email change ([`EMAIL_CHANGE_NOTICE`]): its payload
    /// names that address (`to`) — by the time the job runs the account may have the new one —
    /// and the new one masked (`new_email`).
    ChangeRequested,
    /// To the account that has the address an email change asked for already
    /// ([`EMAIL_TAKEN_NOTICE`]): its payload names the account (`user_id`).
    AddressTaken,
}

/// Sends a [`Notice`].
pub struct NoticeEmail<A> {
    /// Reads the account's address.
    pub accounts: A,
    /// Links, sender, mailer.
    pub context: Arc<MailContext>,
    /// Which notice.
    pub notice: Notice,
}

impl<A: Accounts> NoticeEmail<A> {
    /// The recipient and the locale to write in (the account's), if the notice is still to be
    /// sent: checked on every attempt.
    async fn recipient(&self, job: &Job) -> Result<(String, Option<Locale>), Delivery> {
        if let Some(skip) = suppressed(job) {
            return Err(skip);
        }
        let account = match job.payload["user_id"].as_str().and_then(|s| s.parse().ok()) {
            Some(user_id) => self
                .accounts
                .user_email_and_locale(user_id)
                .await
                .map_err(|error| Delivery::Retry(format!("reading the user: {error:#}")))?,
            None => None,
        };
        if self.notice == Notice::ChangeRequested {
            let locale = account.and_then(|(_, locale)| stored_locale(locale.as_deref()));
            return job.payload["to"]
                .as_str()
                .map(|to| (to.to_owned(), locale))
                .ok_or_else(|| Delivery::Permanent("payload has no to".into()));
        }
        subject(job, "user_id")?;
        match account {
            Some((to, locale)) => Ok((to, stored_locale(locale.as_deref()))),
            None => Err(Delivery::Permanent("the user no longer exists".into())),
        }
    }

    /// The notice to `to` in `locale`, rendered now with its tenant's branding (a notice
    /// enqueued before notices named their tenant: the default tenant's).
    async fn compose(
        &self,
        job: &Job,
        to: &str,
        locale: Option<&Locale>,
    ) -> Result<FrozenEmail, Delivery> {
        let default = oncely::TenantId::default();
        let tenant = job.payload["tenant"].as_str().unwrap_or(default.as_str());
        let sender = self.context.sender(&self.accounts, tenant).await?;
        let message = match self.notice {
            Notice::SignupAttempt => Message::SignupNotice,
            Notice::ChangeRequested => Message::EmailChangeNotice,
            Notice::AddressTaken => Message::EmailTakenNotice,
        };
        let mut vars = self.context.vars(tenant, &sender, to);
        if self.notice == Notice::ChangeRequested {
            let new = job.payload["new_email"]
                .as_str()
                .unwrap_or("another address");
            vars.new_email = Some(new.to_owned());
        }
        self.context
            .compose(message, (tenant, locale), &sender, &vars)
    }
}

impl<A: Accounts> EmailJob for NoticeEmail<A> {
    fn context(&self) -> &MailContext {
        &self.context
    }

    async fn freeze(&self, job: &Job) -> Result<Option<serde_json::Value>, Delivery> {
        let (to, locale) = self.recipient(job).await?;
        self.compose(job, &to, locale.as_ref()).await?.freeze()
    }

    async fn send(&self, job: &Job, point: &dyn PointOfNoReturn) -> Delivery {
        let (to, locale) = match self.recipient(job).await {
            Ok(recipient) => recipient,
            Err(delivery) => return delivery,
        };
        let composed = self.compose(job, &to, locale.as_ref());
        let frozen = match FrozenEmail::frozen_or(job, composed).await {
            Ok(frozen) => frozen,
            Err(delivery) => return delivery,
        };
        let email = match frozen.email(None) {
            Ok(email) => email,
            Err(delivery) => return delivery,
        };
        if let Some(tenant) = job.payload["tenant"].as_str()
            && let Some(handed) = by_webhook(&self.accounts, tenant).await
        {
            return handed;
        }
        self.context.mail(&email, job, point).await
    }

    /// The follow-ups of a notice (see [`follow_ups`]): its tenant from the payload's
    /// `tenant`. A notice enqueued by a release before 0.x (no `tenant` in its payload) has
    /// none: it is mailed as before, whatever its tenant's email delivery, and reports no event.
    async fn then(&self, job: &Job, end: &Ended) -> Result<Vec<NewJob>, ThenError> {
        if matches!(end, Ended::Skipped { .. }) || suppressed(job).is_some() {
            return Ok(Vec::new());
        }
        let Some(tenant) = job.payload["tenant"].as_str() else {
            return Ok(Vec::new());
        };
        let frozen = FrozenEmail::of(job).ok().flatten();
        let (to, locale) = match &frozen {
            Some(frozen) => (frozen.email.to.clone(), None),
            None => match self.recipient(job).await {
                Ok(recipient) => recipient,
                Err(Delivery::Retry(why)) => return Err(why.into()),
                // The account is gone: nobody to name.
                Err(_) => return Ok(Vec::new()),
            },
        };
        let user_id = job.payload["user_id"]
            .as_str()
            .and_then(|s| s.parse::<Uuid>().ok());
        let email = match frozen {
            Some(frozen) => Some(frozen),
            None if handed_over(end) => Some(
                self.compose(job, &to, locale.as_ref())
                    .await
                    .map_err(delivery_reason)?,
            ),
            None => None,
        };
        let about = About {
            tenant,
            to: &to,
            user_id,
        };
        let email = email.map(|frozen| (frozen, None));
        follow_ups(&self.accounts, job, end, &about, email).await
    }
}

/// The provider message id of an email handed to its tenant's endpoints instead of the mailer
/// (a tenant whose email delivery is `webhook`): its job ends `sent` with it, and its
/// follow-ups are `email.requested` deliveries, not `email.sent`.
pub const WEBHOOK_MESSAGE_ID: &str = "webhook";

/// `Some(outcome)` when `tenant`'s emails go out by webhook: sent ([`WEBHOOK_MESSAGE_ID`]; the
/// job's follow-ups carry the email) if an enabled endpoint of the tenant receives
/// `email.requested`, else retried (the email must not vanish: after its horizon it is dead,
/// and `email.failed` says so). `None`: mail it.
async fn by_webhook<A: Accounts>(accounts: &A, tenant: &str) -> Option<Delivery> {
    match accounts.email_delivery(tenant).await {
        Ok(mode) if mode == "webhook" => {}
        Ok(_) => return None,
        Err(error) => {
            return Some(Delivery::Retry(format!(
                "reading the tenant's email delivery: {error:#}"
            )));
        }
    }
    Some(match accounts.webhook_targets_now(tenant).await {
        Ok(targets)
            if targets
                .iter()
                .any(|(_, events)| subscribed(events, EventType::EmailRequested)) =>
        {
            Delivery::Sent {
                provider_message_id: Some(WEBHOOK_MESSAGE_ID.into()),
            }
        }
        Ok(_) => Delivery::Retry(
            "the tenant's email delivery is webhook and no enabled endpoint of it receives email.requested: not sent"
                .into(),
        ),
        Err(error) => Delivery::Retry(format!("reading the tenant's endpoints: {error:#}")),
    })
}

/// Whether a job's email was handed to its tenant's endpoints ([`WEBHOOK_MESSAGE_ID`]).
fn handed_over(end: &Ended) -> bool {
    matches!(end, Ended::Sent { provider_message_id } if provider_message_id.as_deref() == Some(WEBHOOK_MESSAGE_ID))
}

/// Why a message could not be rendered for a follow-up: asked again later.
fn delivery_reason(delivery: Delivery) -> ThenError {
    match delivery {
        Delivery::Retry(why) | Delivery::Permanent(why) | Delivery::Skipped(why) => why.into(),
        other => format!("{other:?}").into(),
    }
}

/// Whose email a job is, for its events.
struct About<'a> {
    tenant: &'a str,
    /// The recipient in full (masked in `email.sent` and `email.failed`).
    to: &'a str,
    user_id: Option<Uuid>,
}

/// An email event's id: derived from the job's delivery key and the event's type, so that
/// asking `then` again (a follow-up write that failed, a finish recorded twice) names the same
/// event and the outbox writes its deliveries once (their operation keys exist).
fn email_event_id(job: &Job, kind: EventType) -> String {
    let digest = Sha256::digest(format!(
        "oncely/email-event/v1:{}:{}",
        job.delivery_key,
        kind.as_str()
    ));
    format!("msg_{}", hex::encode(&digest[..16]))
}

/// The follow-ups of an email job that ended as `end` (never asked for `skipped`: a decoy or a
/// capped email is nobody's). Sent by the mailer: `email.sent`; dead (expired included):
/// `email.failed` with the reason; handed to the tenant's endpoints ([`WEBHOOK_MESSAGE_ID`]):
/// `email.requested`, carrying `email()`'s message. Each one delivery per enabled endpoint of
/// the tenant that receives it ([`deliveries`]), read from the local database only.
async fn follow_ups<A: Accounts>(
    accounts: &A,
    job: &Job,
    end: &Ended,
    about: &About<'_>,
    email: Option<(FrozenEmail, Option<Uuid>)>,
) -> Result<Vec<NewJob>, ThenError> {
    let template = job.kind.strip_prefix("email.").unwrap_or(&job.kind);
    let targets = accounts.webhook_targets_now(about.tenant).await?;
    let mut data = json!({
        "email_id": job.delivery_key,
        "template": template,
        "to": crate::email::masked(about.to),
    });
    if let Some(user_id) = about.user_id {
        data["user_id"] = json!(user_id);
    }
    let kind = match end {
        Ended::Skipped { .. } => return Ok(Vec::new()),
        Ended::Sent {
            provider_message_id,
        } if provider_message_id.as_deref() == Some(WEBHOOK_MESSAGE_ID) => {
            let Some((frozen, token_id)) = email else {
                return Err("the email handed over has no message".into());
            };
            let jobs = requested(job, template, frozen, token_id, &targets);
            if jobs.is_empty() {
                // Its endpoints went away since the attempt: not recorded sent, so the job is
                // tried again (and goes dead after its horizon, with `email.failed`).
                return Err("no enabled endpoint of the tenant receives email.requested any more: the email is not handed over".into());
            }
            return Ok(jobs);
        }
        Ended::Sent {
            provider_message_id,
        } => {
            data["provider_message_id"] = json!(provider_message_id);
            EventType::EmailSent
        }
        Ended::Dead { reason, .. } => {
            data["reason"] = json!(reason);
            EventType::EmailFailed
        }
    };
    let event = Event {
        id: email_event_id(job, kind),
        ..Event::new(kind, data)
    };
    Ok(deliveries(&event, &targets))
}

/// The `email.requested` deliveries of an email handed to the tenant's endpoints. Data:
/// `email_id`, `template`, `to` (in full: the application sends it), `from`, `subject`, `text`,
/// `html` (null for an email frozen before templates), `reply_to` (the support address, or
/// null), `link` (null for a notice). A token email's link is not in the job: each
/// delivery carries the body in parts around it (`body_parts`) and the token record's id
/// (`token_id`); the `webhook` handler derives the token at each attempt, checks the link is
/// still live ([`crate::accounts::live_token`]) and joins the parts with it — the same bytes on every attempt.
fn requested(
    job: &Job,
    template: &str,
    frozen: FrozenEmail,
    token_id: Option<Uuid>,
    targets: &[(Uuid, String)],
) -> Vec<NewJob> {
    // Where the token goes: a mark no one can write into the email (random, per event).
    let mark = format!("{{{{token:{}}}}}", Uuid::new_v4().simple());
    let link = frozen.link.as_ref().map(|base| format!("{base}{mark}"));
    let email = &frozen.email;
    let (text, html) = match &link {
        Some(link) => (
            email.text.replace(LINK, link),
            email
                .html
                .as_ref()
                .map(|html| html.replace(LINK, &escape_link(link))),
        ),
        None => (email.text.clone(), email.html.clone()),
    };
    let data = json!({
        "email_id": job.delivery_key,
        "template": template,
        "to": email.to,
        "from": email.from,
        "subject": email.subject,
        "text": text,
        "html": html,
        "reply_to": email.reply_to,
        "link": link,
    });
    let kind = EventType::EmailRequested;
    let event = Event {
        id: email_event_id(job, kind),
        ..Event::new(kind, data)
    };
    let body = event.body();
    let (carried, extra) = match token_id {
        Some(token_id) => {
            let parts: Vec<&str> = body.split(&mark).collect();
            let mut extra = Map::new();
            extra.insert("token_id".into(), json!(token_id));
            (json!({ "parts": parts }), extra)
        }
        None => (Value::String(body), Map::new()),
    };
    deliveries_carrying(&event, targets, &carried, &extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> MailContext {
        MailContext {
            secret: ServerSecret::new(vec![7; 32]).unwrap(),
            public_url: "https://first.example".into(),
            brand: ServiceBrand {
                from: "first@example.com".into(),
                support_email: Some("help@first.example".into()),
                ..ServiceBrand::default()
            },
            templates: Templates::embedded(),
            mailer: oncely_outbox::mail::from_url(
                "smtp://127.0.0.1:1",
                None,
                Default::default(),
                None,
            )
            .unwrap(),
        }
    }

    #[test]
    fn a_frozen_token_email_holds_its_link_without_the_token_and_sends_it_with_the_token() {
        let context = context();
        let token = Token::derive(&context.secret, Flow::Verification, Uuid::new_v4());
        let sender = context
            .brand
            .sender("default", &Default::default(), "first.example");
        let german = Locale::parse("de").unwrap();
        let about = (Flow::Verification, "default", Some(&german));
        let frozen = FrozenEmail::token_email(&context, about, &sender, "ada@example.com").unwrap();
        let stored = frozen.freeze().unwrap().unwrap().to_string();
        assert!(
            !stored.contains(token.expose()),
            "no token in the outbox: {stored}"
        );
        assert!(
            stored.contains("https://first.example/v1/verify?token="),
            "{stored}"
        );
        let email = frozen.clone().email(Some(&token)).unwrap();
        let link = format!("https://first.example/v1/verify?token={}", token.expose());
        let html = email.html.as_deref().unwrap();
        assert!(email.text.contains(&link), "{}", email.text);
        assert!(html.contains(&format!("href=\"{link}\"")), "{html}");
        assert!(!email.text.contains("{{link") && !html.contains("{{link"));
        assert_eq!(
            (
                email.to.as_str(),
                email.from.as_str(),
                email.subject.as_str(),
                email.reply_to.as_deref(),
            ),
            (
                "ada@example.com",
                "first@example.com",
                "Bestätigen Sie Ihre E-Mail-Adresse",
                Some("help@first.example"),
            )
        );
        // Exactly the email a job rendered with its token from the start would have sent.
        let vars = Vars {
            link: Some(link.clone()),
            link_lifetime_minutes: Some(24 * 60),
            ..context.vars("default", &sender, "ada@example.com")
        };
        let direct = context
            .templates
            .render(Message::Verification, "default", Some(&german), &vars)
            .unwrap();
        assert_eq!(
            (email.text.as_str(), html),
            (direct.text.as_str(), direct.html.as_str())
        );
        assert!(matches!(frozen.email(None), Err(Delivery::Permanent(_))));
    }

    /// Review of issue 18: a product name holding `{{link}}` (the mark where the link goes)
    /// showed the live link there too. No value an email shows can hold the mark.
    #[test]
    fn nothing_but_the_template_can_place_the_link() {
        let mut context = context();
        context.brand.product_name = Some("Acme {{link}}".into());
        let sender = context
            .brand
            .sender("default", &Default::default(), "first.example");
        let about = (Flow::MagicLink, "default", None);
        let frozen = FrozenEmail::token_email(&context, about, &sender, "ada@example.com").unwrap();
        let token = Token::derive(&context.secret, Flow::MagicLink, Uuid::new_v4());
        let email = frozen.email(Some(&token)).unwrap();
        assert_eq!(
            email.text.matches(token.expose()).count(),
            1,
            "{}",
            email.text
        );
        assert!(email.text.contains("Acme {{ link }}"), "{}", email.text);
        assert_eq!(
            email.html.unwrap().matches(token.expose()).count(),
            3,
            "the button, the copied link and its text"
        );
    }

    /// During a rolling deploy a process of the previous release may retry a job this one
    /// froze: it reads `from`, `to`, `subject`, `text` and `link` (ignoring the rest) and puts
    /// the link where `{{link}}` is. It still can.
    #[test]
    fn an_email_frozen_now_is_one_the_previous_release_can_send() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Previous {
            from: String,
            to: String,
            subject: String,
            text: String,
            link: Option<String>,
        }
        let context = context();
        let sender = context
            .brand
            .sender("default", &Default::default(), "first.example");
        let about = (Flow::PasswordReset, "default", None);
        let frozen = FrozenEmail::token_email(&context, about, &sender, "ada@example.com").unwrap();
        let stored = frozen.freeze().unwrap().unwrap();
        let previous: Previous = serde_json::from_value(stored).unwrap();
        assert_eq!(
            previous.text.matches("{{link}}").count(),
            1,
            "{}",
            previous.text
        );
        assert!(previous.link.unwrap().ends_with("?token="));
    }

    #[test]
    fn an_email_frozen_before_templates_is_sent_as_it_was_text_only() {
        let old = serde_json::json!({
            "from": "a@example.com", "to": "b@example.com", "subject": "Hi",
            "text": "Open {{link}}", "link": "https://x.example/v1/verify?token="
        });
        let frozen: FrozenEmail = serde_json::from_value(old).unwrap();
        let token = Token::derive(&context().secret, Flow::Verification, Uuid::new_v4());
        let email = frozen.email(Some(&token)).unwrap();
        assert_eq!(email.html, None);
        assert_eq!(email.reply_to, None);
        assert!(email.text.ends_with(token.expose()));
    }
}
