//! The emails' templates: for each [`Message`] a subject, a text part and an HTML part, rendered
//! with MiniJinja (HTML auto-escaped; an unknown variable is an error, never an empty string).
//!
//! Defaults are embedded in the binary (`crates/oncely-server/templates/<locale>/`, English and
//! German). A directory (`ONCELY_TEMPLATES`) overrides any file:
//! `<dir>/<tenant or _default>/<locale>/<message>.{subject,txt,html}`, plus `layout.{txt,html}`
//! that message templates extend and partials (`_name.html`) they include. Each file is looked up
//! in this order ([`Templates::origin`]): the tenant's folder for the locale, then for its
//! language; `_default` (then the embedded defaults) for the locale, then for its language; and
//! English last — the tenant's, then `_default`'s, then the embedded one.
//!
//! Everything is read and checked once, at start ([`Templates::load`], [`Templates::check`]):
//! what is checked is what is sent. A template that still fails at send time (data no sample
//! had) fails its job with the reason; nothing half-rendered is sent.

mod html;
pub mod locale;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};

pub use locale::{ENGLISH, Locale};

use crate::token::Flow;

/// Where a message's link goes in its rendered parts: the outbox stores the email without its
/// token and puts the link in at each send. No value a template shows can
/// hold it ([`Vars`]): only the template places the link.
pub const LINK_MARK: &str = "{{link}}";

/// A value as a template shows it: the link's mark, should it hold it, written apart (`{{ link
/// }}`), so that a product name or an address cannot place the link.
fn inert(value: &str) -> String {
    value.replace(LINK_MARK, "{{ link }}")
}

/// The folder of templates every tenant falls back to.
pub const DEFAULT_SCOPE: &str = "_default";

/// The largest template file read.
const MAX_FILE: u64 = 256 * 1024;

/// One email the service sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Message {
    /// The link that verifies a new account's address.
    Verification,
    /// The link that sets a new password.
    PasswordReset,
    /// The link that signs in.
    MagicLink,
    /// The link that accepts an invitation.
    Invite,
    /// The link that confirms a new address of an account.
    EmailChange,
    /// To an account someone tried to sign up again with.
    SignupNotice,
    /// To an account's address when a change of it is requested.
    EmailChangeNotice,
    /// To the account whose address another account asked to move to.
    EmailTakenNotice,
}

/// The variables of every message: what [`Vars`] always defines.
pub const COMMON_VARIABLES: [&str; 6] = [
    "product_name",
    "tenant",
    "site",
    "support_email",
    "recipient",
    "locale",
];

/// The variables of messages with a link.
const LINK_VARIABLES: [&str; 3] = ["link", "link_lifetime", "link_lifetime_minutes"];

/// Names a template may use besides its variables: MiniJinja's global functions and `self`.
const BUILTIN_NAMES: [&str; 9] = [
    "range",
    "dict",
    "namespace",
    "debug",
    "lipsum",
    "cycler",
    "joiner",
    "self",
    "super",
];

impl Message {
    /// Every message.
    pub const ALL: [Self; 8] = [
        Self::Verification,
        Self::PasswordReset,
        Self::MagicLink,
        Self::Invite,
        Self::EmailChange,
        Self::SignupNotice,
        Self::EmailChangeNotice,
        Self::EmailTakenNotice,
    ];

    /// Its name: its templates' file names, and its outbox job kind after `email.` (a link's
    /// message is named as its flow).
    pub fn name(self) -> &'static str {
        match (self, self.flow()) {
            (_, Some(flow)) => flow.as_str(),
            (Self::SignupNotice, _) => "signup_notice",
            (Self::EmailChangeNotice, _) => "email_change_notice",
            _ => "email_taken_notice",
        }
    }

    /// The message named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The message of a link's flow.
    pub fn of_flow(flow: Flow) -> Self {
        match flow {
            Flow::Verification => Self::Verification,
            Flow::PasswordReset => Self::PasswordReset,
            Flow::MagicLink => Self::MagicLink,
            Flow::Invite => Self::Invite,
            Flow::EmailChange => Self::EmailChange,
        }
    }

    /// The flow of its link, if it has one.
    pub fn flow(self) -> Option<Flow> {
        Some(match self {
            Self::Verification => Flow::Verification,
            Self::PasswordReset => Flow::PasswordReset,
            Self::MagicLink => Flow::MagicLink,
            Self::Invite => Flow::Invite,
            Self::EmailChange => Flow::EmailChange,
            _ => return None,
        })
    }

    /// The variables only this message has.
    pub fn own_variables(self) -> &'static [&'static str] {
        match self {
            _ if self.flow().is_some() => &LINK_VARIABLES,
            Self::EmailChangeNotice => &["new_email"],
            _ => &[],
        }
    }
}

/// The three files of a message, in the order they are rendered.
const PARTS: [&str; 3] = ["subject", "txt", "html"];

/// What a message is rendered with. Every field is a template variable of the same name (see
/// docs/emails.md); `link`, `link_lifetime_minutes` and `new_email` only for the messages that
/// have them ([`Message::own_variables`]), `link_lifetime` derived in the message's language.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars {
    /// The tenant's product name (`tenant set --product-name`), else the service's.
    pub product_name: String,
    /// The tenant's id.
    pub tenant: String,
    /// The host (and port) of the public URL the links start with.
    pub site: String,
    /// Where to write with questions, if the tenant or the service has an address for it.
    pub support_email: Option<String>,
    /// The recipient's address (the email goes to it: shown in full).
    pub recipient: String,
    /// The link (messages with a link).
    pub link: Option<String>,
    /// How long the link works, in minutes (messages with a link).
    pub link_lifetime_minutes: Option<i64>,
    /// The new address, masked (the email-change notice to the old address).
    pub new_email: Option<String>,
}

impl Vars {
    /// The context of `message` in `locale`: the common variables and the message's own. In
    /// the HTML part (`html`) the link is escaped for an attribute and marked safe, so that it
    /// reads the same as in the text part (MiniJinja's escaping would write every `/` as
    /// `&#x2f;`).
    fn context(&self, message: Message, locale: &str, html: bool) -> Value {
        let mut pairs: Vec<(&str, Value)> = vec![
            ("product_name", Value::from(inert(&self.product_name))),
            ("tenant", Value::from(inert(&self.tenant))),
            ("site", Value::from(inert(&self.site))),
            (
                "support_email",
                self.support_email
                    .as_deref()
                    .map_or(Value::from(()), |s| Value::from(inert(s))),
            ),
            ("recipient", Value::from(inert(&self.recipient))),
            ("locale", Value::from(locale)),
        ];
        if message.flow().is_some() {
            let minutes = self.link_lifetime_minutes.unwrap_or_default();
            let link = self.link.clone().unwrap_or_default();
            pairs.push((
                "link",
                match html {
                    true => Value::from_safe_string(escape_link(&link)),
                    false => Value::from(link),
                },
            ));
            pairs.push(("link_lifetime_minutes", Value::from(minutes)));
            pairs.push(("link_lifetime", Value::from(lifetime_text(minutes, locale))));
        }
        if message == Message::EmailChangeNotice {
            let new_email = inert(self.new_email.as_deref().unwrap_or_default());
            pairs.push(("new_email", Value::from(new_email)));
        }
        Value::from_pairs(pairs)
    }

    /// What `oncely templates check` and `preview` render with, for `tenant`: every variable
    /// set (`support_email` only `with_support`), the link `link`.
    pub fn sample(tenant: &str, link: &str, with_support: bool) -> Self {
        Self {
            product_name: "Sample Product".into(),
            tenant: tenant.into(),
            site: "accounts.example.com".into(),
            support_email: with_support.then(|| "support@example.com".into()),
            recipient: "ada@example.com".into(),
            link: Some(link.into()),
            link_lifetime_minutes: Some(24 * 60),
            new_email: Some("a***@example.net".into()),
        }
    }
}

/// A link as it is written in HTML (in an attribute or as text): `&`, `<`, `>`, `"` and `'`
/// escaped, nothing else (as the inbox's page escapes text).
pub fn escape_link(link: &str) -> String {
    oncely_inbox::page::escape(link)
}

/// How long a link works, in words of the locale's language (German or English).
fn lifetime_text(minutes: i64, locale: &str) -> String {
    let german = locale == "de" || locale.starts_with("de-");
    let (n, unit) = match minutes {
        m if m >= 2 * 24 * 60 && m % (24 * 60) == 0 => (m / (24 * 60), 0),
        m if m > 0 && m % 60 == 0 => (m / 60, 1),
        m => (m, 2),
    };
    let one = n == 1;
    let word = match (german, unit, one) {
        (false, 0, true) => "day",
        (false, 0, false) => "days",
        (false, 1, true) => "hour",
        (false, 1, false) => "hours",
        (false, _, true) => "minute",
        (false, _, false) => "minutes",
        (true, 0, true) => "Tag",
        (true, 0, false) => "Tage",
        (true, 1, true) => "Stunde",
        (true, 1, false) => "Stunden",
        (true, _, true) => "Minute",
        (true, _, false) => "Minuten",
    };
    format!("{n} {word}")
}

/// A rendered message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// One line.
    pub subject: String,
    /// The text part, ending with a newline.
    pub text: String,
    /// The HTML part.
    pub html: String,
    /// The locale whose templates were looked up first.
    pub locale: String,
}

/// What is wrong with a template: its file (a path of the directory, or `embedded:…`), the line
/// when known, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    /// The file.
    pub file: String,
    /// The line in it.
    pub line: Option<usize>,
    /// Why.
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.reason),
            None => write!(f, "{}: {}", self.file, self.reason),
        }
    }
}

/// Problems, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// One embedded file: (locale, file, text).
macro_rules! embedded_file {
    ($locale:literal, $file:literal) => {
        (
            $locale,
            $file,
            include_str!(concat!("../../templates/", $locale, "/", $file)),
        )
    };
}

/// Embedded files: `[locales], [files]` gives each locale's files, `@one locale, [files]` one
/// locale's.
macro_rules! embedded {
    ([$($locale:literal),*], $files:tt) => {
        [$(embedded!(@one $locale, $files)),*]
    };
    (@one $locale:literal, [$($file:literal),* $(,)?]) => {
        &[$(embedded_file!($locale, $file)),*]
    };
}

/// The embedded defaults: (locale, file, text). One layout for every language (English's);
/// each language's own words of it are its `_footer` partials.
const EMBEDDED_LAYOUT: &[(&str, &str, &str)] = embedded!(@one "en", ["layout.txt", "layout.html"]);

/// Each shipped language's messages and footer.
const EMBEDDED: [&[(&str, &str, &str)]; 2] = embedded!(
    ["en", "de"],
    [
        "_footer.txt",
        "_footer.html",
        "verification.subject",
        "verification.txt",
        "verification.html",
        "password_reset.subject",
        "password_reset.txt",
        "password_reset.html",
        "magic_link.subject",
        "magic_link.txt",
        "magic_link.html",
        "invite.subject",
        "invite.txt",
        "invite.html",
        "email_change.subject",
        "email_change.txt",
        "email_change.html",
        "signup_notice.subject",
        "signup_notice.txt",
        "signup_notice.html",
        "email_change_notice.subject",
        "email_change_notice.txt",
        "email_change_notice.html",
        "email_taken_notice.subject",
        "email_taken_notice.txt",
        "email_taken_notice.html",
    ]
);

/// A template file and where it came from.
#[derive(Debug, Clone)]
struct Source {
    text: String,
    origin: String,
}

/// The directory's files by (scope, locale, file).
type Overrides = BTreeMap<(String, String, String), Source>;

/// Every template file: the directory's (scope, locale, file) and the embedded (locale, file).
#[derive(Debug, Default)]
struct Sources {
    /// The directory the overrides were read from.
    root: Option<PathBuf>,
    overrides: Overrides,
    embedded: BTreeMap<(String, String), Source>,
}

impl Sources {
    fn get(&self, scope: &str, locale: &str, file: &str) -> Option<&Source> {
        let key = (scope.to_owned(), locale.to_owned(), file.to_owned());
        self.overrides.get(&key)
    }

    /// The file `file` of `scope` in `locale`, by the fallback order (module docs).
    fn resolve(&self, scope: &str, locale: &str, file: &str) -> Option<&Source> {
        let tag = Locale::parse(locale).ok();
        let locales = tag.as_ref().map_or_else(|| vec![locale], Locale::fallbacks);
        let own = scope != DEFAULT_SCOPE;
        let embedded = |l: &str| self.embedded.get(&(l.to_owned(), file.to_owned()));
        let by_locale = locales
            .iter()
            .find_map(|l| own.then(|| self.get(scope, l, file)).flatten());
        by_locale
            .or_else(|| {
                locales
                    .iter()
                    .find_map(|l| self.get(DEFAULT_SCOPE, l, file).or_else(|| embedded(l)))
            })
            .or_else(|| own.then(|| self.get(scope, ENGLISH, file)).flatten())
            .or_else(|| self.get(DEFAULT_SCOPE, ENGLISH, file))
            .or_else(|| embedded(ENGLISH))
    }

    /// Whether any file of `scope` (or of the defaults) is in `locale`.
    fn has_locale(&self, scope: &str, locale: &str) -> bool {
        self.embedded.keys().any(|(l, _)| l == locale)
            || self
                .overrides
                .keys()
                .any(|(s, l, _)| l == locale && (s == scope || s == DEFAULT_SCOPE))
    }

    /// The scopes with a folder (besides `_default`).
    fn tenant_scopes(&self) -> BTreeSet<&str> {
        self.overrides
            .keys()
            .map(|(s, _, _)| s.as_str())
            .filter(|s| *s != DEFAULT_SCOPE)
            .collect()
    }

    /// Every locale `scope` renders in.
    fn locales(&self, scope: &str) -> BTreeSet<&str> {
        self.embedded
            .keys()
            .map(|(l, _)| l.as_str())
            .chain(
                self.overrides
                    .keys()
                    .filter(|(s, _, _)| s == scope || s == DEFAULT_SCOPE)
                    .map(|(_, l, _)| l.as_str()),
            )
            .collect()
    }
}

/// The templates of a process: the embedded defaults and the directory's overrides, read once.
#[derive(Clone)]
pub struct Templates {
    env: Arc<Environment<'static>>,
    sources: Arc<Sources>,
}

impl fmt::Debug for Templates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Templates")
            .field("overrides", &self.sources.overrides.len())
            .finish_non_exhaustive()
    }
}

/// A template's name in the environment: `scope/locale/file`.
fn template_name(scope: &str, locale: &str, file: &str) -> String {
    format!("{scope}/{locale}/{file}")
}

impl Templates {
    /// How many files of `ONCELY_TEMPLATES` override an embedded template.
    pub fn override_count(&self) -> usize {
        self.sources.overrides.len()
    }

    /// How many tenant folders `ONCELY_TEMPLATES` has.
    pub fn tenant_folder_count(&self) -> usize {
        self.sources.tenant_scopes().len()
    }

    /// The embedded defaults alone.
    pub fn embedded() -> Self {
        Self::new(Sources {
            root: None,
            overrides: BTreeMap::new(),
            embedded: embedded_sources(),
        })
    }

    /// The embedded defaults and, if given, the overrides in `dir`, checked
    /// ([`Templates::check`]): every problem found, or templates that render.
    pub fn load(dir: Option<&Path>) -> Result<Self, Problems> {
        let (overrides, mut problems) = match dir {
            Some(dir) => read_dir(dir),
            None => (BTreeMap::new(), Vec::new()),
        };
        let templates = Self::new(Sources {
            root: dir.map(Path::to_path_buf),
            overrides,
            embedded: embedded_sources(),
        });
        if let Err(Problems(found)) = templates.validate() {
            problems.extend(found);
        }
        match problems.is_empty() {
            true => Ok(templates),
            false => Err(Problems(problems)),
        }
    }

    /// The templates `serve` and `worker` start with: [`Templates::load`] of `ONCELY_TEMPLATES`,
    /// or an error of one line (the first problem, and how many more `oncely templates check`
    /// lists).
    pub fn for_start(dir: Option<&Path>) -> anyhow::Result<Self> {
        Self::load(dir).map_err(|Problems(problems)| {
            let more = match problems.len() {
                1 => String::new(),
                n => format!(" (and {} more: `oncely templates check` lists them)", n - 1),
            };
            anyhow::anyhow!(
                "ONCELY_TEMPLATES: a template is broken, not starting: {}{more}",
                problems[0]
            )
        })
    }

    fn new(sources: Sources) -> Self {
        let sources = Arc::new(sources);
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // A block tag on a line of its own leaves no line behind (Jinja's trim and lstrip).
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("the default delimiters"),
        );
        env.set_auto_escape_callback(|name| match name.ends_with(".html") {
            true => AutoEscape::Html,
            false => AutoEscape::None,
        });
        // `{% extends "layout.html" %}` in `acme/de/verification.html` is `acme/de/layout.html`,
        // found by the same fallbacks.
        env.set_path_join_callback(|name, parent| match parent.rsplit_once('/') {
            Some((dir, _)) if !name.contains('/') => Cow::Owned(format!("{dir}/{name}")),
            _ => Cow::Borrowed(name),
        });
        let loader = Arc::clone(&sources);
        env.set_loader(move |name| {
            let mut parts = name.splitn(3, '/');
            let (Some(scope), Some(locale), Some(file)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Ok(None);
            };
            if file.contains('/') {
                return Ok(None);
            }
            Ok(loader
                .resolve(scope, locale, file)
                .map(|source| source.text.clone()))
        });
        Self {
            env: Arc::new(env),
            sources,
        }
    }

    /// The tenant folders of the directory that name none of `tenants` (besides `default`, the
    /// default tenant's): a typo (`acmee`, `Acme` for `acme`) would fall back in silence. One
    /// line, or `Ok`.
    pub fn validate_tenants(&self, tenants: &[String]) -> Result<(), String> {
        let default = oncely::TenantId::default();
        let unknown: Vec<&str> = self
            .sources
            .tenant_scopes()
            .into_iter()
            .filter(|scope| *scope != default.as_str() && !tenants.iter().any(|t| t == scope))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        Err(format!(
            "ONCELY_TEMPLATES: the folder(s) {} name no tenant (tenant ids are case-sensitive; `_default` is every tenant's): create the tenant first (`oncely tenant create`), or rename the folder",
            unknown.join(", ")
        ))
    }

    /// `file` as a job's reason names it: relative to the templates' directory (the operator's
    /// paths are not the tenant's business: a reason reaches it in `email.failed`).
    pub fn relative<'a>(&self, file: &'a str) -> &'a str {
        match &self.sources.root {
            Some(root) => {
                let root = root.display().to_string();
                file.strip_prefix(&root)
                    .map_or(file, |rest| rest.trim_start_matches('/'))
            }
            None => file,
        }
    }

    /// The folder `tenant`'s templates come from: its own, if the directory has one, else
    /// `_default`.
    fn scope<'a>(&'a self, tenant: &'a str) -> &'a str {
        // On every render and every flow request: a look, not a collected set.
        let own = tenant != DEFAULT_SCOPE
            && self
                .sources
                .overrides
                .keys()
                .any(|(scope, _, _)| scope == tenant);
        match own {
            true => tenant,
            false => DEFAULT_SCOPE,
        }
    }

    /// The locale whose templates `scope` looks up first for `requested`: the tag if some
    /// template is in it, else its language if some is, else English.
    fn effective_locale(&self, scope: &str, requested: Option<&Locale>) -> String {
        let Some(requested) = requested else {
            return ENGLISH.to_owned();
        };
        requested
            .fallbacks()
            .into_iter()
            .find(|l| self.sources.has_locale(scope, l))
            .unwrap_or(ENGLISH)
            .to_owned()
    }

    /// The best of `accepted` (an `Accept-Language`, best first) that `tenant` has templates
    /// in (the tag or its language), else the first; `None` if `accepted` is empty.
    pub fn negotiate(&self, tenant: &str, accepted: Vec<Locale>) -> Option<Locale> {
        let scope = self.scope(tenant);
        let found = accepted.iter().find(|l| {
            l.fallbacks()
                .into_iter()
                .any(|tag| self.sources.has_locale(scope, tag))
        });
        found.cloned().or_else(|| accepted.into_iter().next())
    }

    /// Where the file `file` of `tenant` in `locale` comes from (a path, or `embedded:…`).
    pub fn origin(&self, tenant: &str, locale: Option<&Locale>, file: &str) -> Option<String> {
        let scope = self.scope(tenant);
        let locale = self.effective_locale(scope, locale);
        self.sources
            .resolve(scope, &locale, file)
            .map(|source| source.origin.clone())
    }

    /// Renders `message` for `tenant` in `locale` (or English) with `vars`.
    pub fn render(
        &self,
        message: Message,
        tenant: &str,
        locale: Option<&Locale>,
        vars: &Vars,
    ) -> Result<Rendered, Problem> {
        let scope = self.scope(tenant);
        let locale = self.effective_locale(scope, locale);
        self.render_in(message, scope, &locale, vars)
    }

    fn render_in(
        &self,
        message: Message,
        scope: &str,
        locale: &str,
        vars: &Vars,
    ) -> Result<Rendered, Problem> {
        let [subject, text, html] = PARTS.map(|part| {
            let name = template_name(scope, locale, &format!("{}.{part}", message.name()));
            let context = vars.context(message, locale, part == "html");
            self.env
                .get_template(&name)
                .and_then(|template| template.render(&context))
                .map_err(|error| self.problem(&error, &name))
        });
        let (subject, mut text, html) = (subject?, text?, html?);
        let subject = subject.split_whitespace().collect::<Vec<_>>().join(" ");
        if subject.is_empty() {
            return Err(self.problem_in(
                &template_name(scope, locale, &format!("{}.subject", message.name())),
                None,
                "the subject renders empty".into(),
            ));
        }
        if !text.ends_with('\n') {
            text.push('\n');
        }
        Ok(Rendered {
            subject,
            text,
            html,
            locale: locale.to_owned(),
        })
    }

    /// A MiniJinja error as a problem of the file it is in (a layout's, a partial's, or the
    /// message's own `name`).
    fn problem(&self, error: &minijinja::Error, name: &str) -> Problem {
        let mut reason = error.kind().to_string();
        if let Some(detail) = error.detail() {
            reason = format!("{reason}: {detail}");
        }
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            reason = format!("{reason}: {cause}");
            source = cause.source();
        }
        self.problem_in(error.name().unwrap_or(name), error.line(), reason)
    }

    fn problem_in(&self, name: &str, line: Option<usize>, reason: String) -> Problem {
        let mut parts = name.splitn(3, '/');
        let origin = match (parts.next(), parts.next(), parts.next()) {
            (Some(scope), Some(locale), Some(file)) => self
                .sources
                .resolve(scope, locale, file)
                .map(|s| s.origin.clone()),
            _ => None,
        };
        Problem {
            file: origin.unwrap_or_else(|| name.to_owned()),
            line,
            reason,
        }
    }

    /// Renders every message of every tenant folder and locale with sample data (with and
    /// without a support address) and checks each file: its syntax, that it uses only the
    /// variables its message has, that its HTML is well formed (the file alone, and the
    /// message as rendered), that a message with a link has it in both parts, and that the
    /// subject is one line.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut problems = BTreeSet::new();
        self.validate_files(&mut problems);
        let sample_link = "https://accounts.example.com/v1/verify?token=SAMPLE-TOKEN";
        let scopes: Vec<&str> = std::iter::once(DEFAULT_SCOPE)
            .chain(self.sources.tenant_scopes())
            .collect();
        for scope in scopes {
            let tenant = match scope {
                DEFAULT_SCOPE => oncely::TenantId::default().as_str().to_owned(),
                tenant => tenant.to_owned(),
            };
            for locale in self.sources.locales(scope) {
                for message in Message::ALL {
                    for with_support in [true, false] {
                        let vars = Vars::sample(&tenant, sample_link, with_support);
                        let rendered = match self.render_in(message, scope, locale, &vars) {
                            Ok(rendered) => rendered,
                            Err(problem) => {
                                problems.insert(problem);
                                continue;
                            }
                        };
                        let file = |part: &str| {
                            let name = format!("{}.{part}", message.name());
                            self.problem_in(
                                &template_name(scope, locale, &name),
                                None,
                                String::new(),
                            )
                            .file
                        };
                        if let Err(malformed) = html::well_formed(&rendered.html) {
                            problems.insert(Problem {
                                file: file("html"),
                                line: None,
                                reason: format!(
                                    "as rendered (for {scope}, {locale}), line {} of the HTML: {}",
                                    malformed.line, malformed.reason
                                ),
                            });
                        }
                        if message.flow().is_some() && rendered.subject.contains(sample_link) {
                            problems.insert(Problem {
                                file: file("subject"),
                                line: None,
                                reason: "the subject shows the link (through a partial?): a subject is sent as rendered, the link cannot be put in it".into(),
                            });
                        }
                        if message.flow().is_some() {
                            let in_html = escape_link(sample_link);
                            for (part, body, link) in [
                                ("txt", &rendered.text, sample_link),
                                ("html", &rendered.html, in_html.as_str()),
                            ] {
                                if !body.contains(link) {
                                    problems.insert(Problem {
                                        file: file(part),
                                        line: None,
                                        reason: "the message's link is missing: print {{ link }} as it is (no filter), in the text and in the HTML part".into(),
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(Problems(problems.into_iter().collect())),
        }
    }

    /// Checks each file on its own: it compiles, it uses only its message's variables, and an
    /// HTML file's own tags balance (its template code blanked out).
    fn validate_files(&self, problems: &mut BTreeSet<Problem>) {
        let files = self
            .sources
            .overrides
            .iter()
            .map(|((s, l, f), source)| (template_name(s, l, f), f.as_str(), source))
            .chain(
                self.sources
                    .embedded
                    .iter()
                    // An embedded file overridden by `_default` is never used.
                    .filter(|((l, f), _)| self.sources.get(DEFAULT_SCOPE, l, f).is_none())
                    .map(|((l, f), source)| {
                        (template_name(DEFAULT_SCOPE, l, f), f.as_str(), source)
                    }),
            );
        for (name, file, source) in files {
            let template = match self.env.get_template(&name) {
                Ok(template) => template,
                Err(error) => {
                    problems.insert(self.problem(&error, &name));
                    continue;
                }
            };
            let allowed = allowed_variables(file);
            let mut unknown: Vec<String> = template
                .undeclared_variables(false)
                .into_iter()
                .filter(|v| !allowed.contains(&v.as_str()) && !BUILTIN_NAMES.contains(&v.as_str()))
                .collect();
            unknown.sort();
            for variable in unknown {
                problems.insert(Problem {
                    file: source.origin.clone(),
                    line: line_of_word(&source.text, &variable),
                    reason: format!(
                        "unknown variable `{variable}` (this template has: {})",
                        allowed.join(", ")
                    ),
                });
            }
            if file.ends_with(".html")
                && let Err(malformed) = html::well_formed(&blank_template_code(&source.text))
            {
                problems.insert(Problem {
                    file: source.origin.clone(),
                    line: usize::try_from(malformed.line).ok(),
                    reason: malformed.reason,
                });
            }
        }
    }
}

/// The variables a file may use: its message's (a subject not the link: it is sent as
/// rendered, the link is put in after); a layout the common ones; a partial any.
fn allowed_variables(file: &str) -> Vec<&'static str> {
    let stem = file.split('.').next().unwrap_or(file);
    let mut allowed = COMMON_VARIABLES.to_vec();
    match Message::parse(stem) {
        Some(message) if file.ends_with(".subject") => {
            allowed.extend(message.own_variables().iter().filter(|v| **v != "link"))
        }
        Some(message) => allowed.extend(message.own_variables()),
        None if stem.starts_with('_') => {
            allowed.extend(LINK_VARIABLES);
            allowed.push("new_email");
        }
        None => {}
    }
    allowed
}

/// The line of the first place `word` stands as a whole word in the template's code (`{{ … }}`,
/// `{% … %}`), not in its text.
fn line_of_word(text: &str, word: &str) -> Option<usize> {
    let blanked = blank_template_code(text);
    for (i, (line, text_line)) in text.split('\n').zip(blanked.split('\n')).enumerate() {
        let found = line.match_indices(word).any(|(at, _)| {
            // Blanked out here: inside template code.
            let in_code = text_line
                .get(at..at + word.len())
                .is_some_and(|s| s.trim().is_empty());
            let before = line[..at].chars().next_back();
            let after = line[at + word.len()..].chars().next();
            let part = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            in_code && !part(before) && !part(after)
        });
        if found {
            return Some(i + 1);
        }
    }
    None
}

/// `text` with its `{{ … }}`, `{% … %}` and `{# … #}` replaced by spaces (newlines kept, each
/// byte a byte): the HTML a file writes itself, for its own line numbers.
fn blank_template_code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let next = ["{{", "{%", "{#"]
            .iter()
            .filter_map(|open| rest.find(open).map(|i| (i, *open)))
            .min();
        let Some((start, open)) = next else {
            out.push_str(rest);
            return out;
        };
        let close = match open {
            "{{" => "}}",
            "{%" => "%}",
            _ => "#}",
        };
        out.push_str(&rest[..start]);
        let end = rest[start + 2..]
            .find(close)
            .map_or(rest.len(), |i| start + 2 + i + 2);
        // Byte for byte: a position in the text is the same position here.
        for c in rest[start..end].chars() {
            match c {
                '\n' => out.push('\n'),
                c => out.extend(std::iter::repeat_n(' ', c.len_utf8())),
            }
        }
        rest = &rest[end..];
    }
}

fn embedded_sources() -> BTreeMap<(String, String), Source> {
    EMBEDDED
        .iter()
        .copied()
        .chain([EMBEDDED_LAYOUT])
        .flatten()
        .map(|(locale, file, text)| {
            (
                ((*locale).to_owned(), (*file).to_owned()),
                Source {
                    text: (*text).to_owned(),
                    origin: format!("embedded:{locale}/{file}"),
                },
            )
        })
        .collect()
}

/// Whether `file` may be in a locale folder: a message's part, a layout, or a partial.
fn known_file(file: &str) -> bool {
    let Some((stem, extension)) = file.rsplit_once('.') else {
        return false;
    };
    match Message::parse(stem) {
        Some(_) => PARTS.contains(&extension),
        None => {
            matches!(extension, "txt" | "html")
                && (stem == "layout"
                    || (stem.len() > 1
                        && stem.starts_with('_')
                        && stem[1..]
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')))
        }
    }
}

/// Reads the overrides of `dir` (hidden entries skipped); every entry that is not a template
/// where one is expected is a problem, so a typo is found before it silently falls back.
fn read_dir(dir: &Path) -> (Overrides, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut found = BTreeMap::new();
    let problem = |path: &Path, reason: String| Problem {
        file: path.display().to_string(),
        line: None,
        reason,
    };
    let entries = |path: &Path| -> Result<Vec<(String, PathBuf)>, Problem> {
        let mut entries: Vec<(String, PathBuf)> = std::fs::read_dir(path)
            .map_err(|e| problem(path, format!("cannot read the templates directory: {e}")))?
            .filter_map(Result::ok)
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .filter(|(name, _)| !name.starts_with('.'))
            .collect();
        entries.sort();
        Ok(entries)
    };
    let scopes = match entries(dir) {
        Ok(scopes) => scopes,
        Err(p) => return (found, vec![p]),
    };
    for (scope, scope_path) in scopes {
        if !scope_path.is_dir() {
            problems.push(problem(
                &scope_path,
                "expected a folder per tenant (its id) or `_default`".into(),
            ));
            continue;
        }
        if scope != DEFAULT_SCOPE && oncely::TenantId::parse(scope.clone()).is_err() {
            problems.push(problem(
                &scope_path,
                "not a tenant id (1-128 of A-Z a-z 0-9 - _ . :) nor `_default`".into(),
            ));
            continue;
        }
        let locales = match entries(&scope_path) {
            Ok(locales) => locales,
            Err(p) => {
                problems.push(p);
                continue;
            }
        };
        for (locale, locale_path) in locales {
            match Locale::parse(&locale) {
                Ok(tag) if tag.as_str() == locale && locale_path.is_dir() => {}
                Ok(tag) if locale_path.is_dir() => {
                    problems.push(problem(
                        &locale_path,
                        format!("write the locale folder as `{tag}`"),
                    ));
                    continue;
                }
                _ => {
                    problems.push(problem(
                        &locale_path,
                        "expected a folder per locale, named by its BCP 47 tag (en, de, de-AT, pt-BR)".into(),
                    ));
                    continue;
                }
            }
            let files = match entries(&locale_path) {
                Ok(files) => files,
                Err(p) => {
                    problems.push(p);
                    continue;
                }
            };
            for (file, path) in files {
                if !known_file(&file) {
                    problems.push(problem(
                        &path,
                        "not a template file: expected <message>.subject|txt|html (messages: verification, password_reset, magic_link, invite, email_change, signup_notice, email_change_notice, email_taken_notice), layout.txt|html, or a partial _name.txt|html".into(),
                    ));
                    continue;
                }
                match read_template(&path) {
                    Ok(text) => {
                        found.insert(
                            (scope.clone(), locale.clone(), file),
                            Source {
                                text,
                                origin: path.display().to_string(),
                            },
                        );
                    }
                    Err(reason) => problems.push(problem(&path, reason)),
                }
            }
        }
    }
    (found, problems)
}

/// A template file's text: a regular file (a symbolic link to one is followed; a FIFO or a
/// device is refused, it could block or never end), at most [`MAX_FILE`] bytes read, UTF-8.
fn read_template(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let metadata = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if !metadata.is_file() {
        return Err("not a regular file (a FIFO, a device or a folder)".into());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("a template is at most {MAX_FILE} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: &str = "https://accounts.example.com/v1/verify?token=T0KEN";

    fn write(dir: &Path, path: &str, text: &str) {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn locale(tag: &str) -> Locale {
        Locale::parse(tag).unwrap()
    }

    #[test]
    fn the_embedded_defaults_pass_their_own_check_in_both_languages() {
        let templates = Templates::embedded();
        templates.validate().unwrap();
        for message in Message::ALL {
            for (tag, word) in [("en", "This email was sent"), ("de", "Diese E-Mail wurde")] {
                let vars = Vars::sample("default", LINK, true);
                let rendered = templates
                    .render(message, "default", Some(&locale(tag)), &vars)
                    .unwrap();
                assert_eq!(rendered.locale, tag);
                assert!(rendered.html.contains(word), "{message:?} {tag}");
                assert!(rendered.html.contains(&format!("lang=\"{tag}\"")));
                if message.flow().is_some() {
                    assert!(rendered.text.contains(LINK), "{message:?} {tag}");
                    assert!(rendered.html.contains(LINK), "{message:?} {tag}");
                }
            }
        }
    }

    #[test]
    fn files_fall_back_tenant_locale_then_language_then_default_then_english() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "acme/de-AT/verification.subject", "acme de-AT\n");
        write(d, "acme/de/verification.subject", "acme de\n");
        write(d, "acme/de/magic_link.subject", "acme de magic\n");
        write(d, "_default/de-AT/verification.subject", "default de-AT\n");
        write(
            d,
            "_default/de-AT/password_reset.subject",
            "default de-AT reset\n",
        );
        write(d, "_default/fr/verification.subject", "default fr\n");
        write(d, "acme/en/invite.subject", "acme en invite\n");
        let templates = Templates::load(Some(d)).unwrap();
        let subject = |tenant: &str, tag: Option<&str>, message: Message| {
            let vars = Vars::sample(tenant, LINK, false);
            let locale = tag.map(locale);
            templates
                .render(message, tenant, locale.as_ref(), &vars)
                .unwrap()
                .subject
        };
        use Message::*;
        // 1. tenant + locale
        assert_eq!(subject("acme", Some("de-AT"), Verification), "acme de-AT");
        // 2. tenant + language
        assert_eq!(subject("acme", Some("de-CH"), Verification), "acme de");
        assert_eq!(subject("acme", Some("de-AT"), MagicLink), "acme de magic");
        // 3. default + locale (the tenant has nothing for it)
        assert_eq!(
            subject("acme", Some("de-AT"), PasswordReset),
            "default de-AT reset"
        );
        assert_eq!(
            subject("other", Some("de-AT"), Verification),
            "default de-AT"
        );
        // 4. default + language: the embedded German
        assert_eq!(
            subject("acme", Some("de-CH"), PasswordReset),
            "Passwort zurücksetzen"
        );
        assert_eq!(subject("other", Some("fr-CA"), Verification), "default fr");
        // 5. English: the tenant's, then the default's
        assert_eq!(subject("acme", Some("ja"), Invite), "acme en invite");
        assert_eq!(subject("acme", None, Invite), "acme en invite");
        assert_eq!(
            subject("other", Some("ja"), Invite),
            "You are invited to join Sample Product"
        );
        assert_eq!(
            subject("other", Some("fr"), PasswordReset),
            "Reset your password"
        );
    }

    #[test]
    fn auto_escaping_makes_a_hostile_product_name_or_address_inert_in_html_only() {
        let templates = Templates::embedded();
        let vars = Vars {
            product_name: "<script>alert(1)</script>".into(),
            recipient: "\"<img src=x onerror=alert(1)>\"@example.com".into(),
            ..Vars::sample("default", LINK, true)
        };
        for message in Message::ALL {
            let rendered = templates.render(message, "default", None, &vars).unwrap();
            assert!(!rendered.html.contains("<script>"), "{message:?}");
            assert!(!rendered.html.contains("<img src=x"), "{message:?}");
            assert!(rendered.html.contains("&lt;script&gt;"), "{message:?}");
            assert_eq!(html::well_formed(&rendered.html), Ok(()), "{message:?}");
        }
        let rendered = templates
            .render(Message::Verification, "default", None, &vars)
            .unwrap();
        assert!(
            rendered
                .text
                .contains("Welcome to <script>alert(1)</script>!")
        );
    }

    #[test]
    fn a_broken_override_is_reported_with_its_file_line_and_reason() {
        let cases = [
            (
                "_default/en/verification.txt",
                "{% extends \"layout.txt\" %}\n{% block body %}\n{{ link }\n{% endblock %}",
                2..=3,
                "syntax error",
            ),
            (
                "acme/de/magic_link.txt",
                "{% extends \"layout.txt\" %}{% block body %}\n{{ link }}\n{{ passwrod }}{% endblock %}",
                3..=3,
                "unknown variable `passwrod`",
            ),
            (
                "acme/en/signup_notice.html",
                "{% extends \"layout.html\" %}{% block body %}\n<p>Hi\n<b>there</p>{% endblock %}",
                3..=3,
                "</p> while <b>",
            ),
            (
                "acme/en/signup_notice.txt",
                "{% extends \"layout.txt\" %}{% block body %}{{ link }}{% endblock %}",
                1..=1,
                "unknown variable `link`",
            ),
        ];
        for (path, text, lines, reason) in cases {
            let dir = tempfile::tempdir().unwrap();
            write(dir.path(), path, text);
            let problems = Templates::load(Some(dir.path())).unwrap_err();
            let found = problems
                .0
                .iter()
                .find(|p| {
                    p.file.ends_with(path)
                        && p.reason.contains(reason)
                        && p.line.is_some_and(|l| lines.contains(&l))
                })
                .unwrap_or_else(|| panic!("{path}: {problems}"));
            assert!(found.to_string().contains(path), "{found}");
        }
    }

    #[test]
    fn a_message_without_its_link_and_misnamed_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "_default/en/password_reset.html",
            "{% extends \"layout.html\" %}{% block body %}<p>{{ link|upper }}</p>{% endblock %}",
        );
        write(dir.path(), "_default/en/verifcation.txt", "typo");
        write(dir.path(), "_default/de_AT/verification.txt", "bad locale");
        write(dir.path(), "_default/de-at/verification.txt", "bad case");
        let problems = Templates::load(Some(dir.path())).unwrap_err().to_string();
        for expected in [
            "password_reset.html: the message's link is missing",
            "verifcation.txt: not a template file",
            "de_AT: expected a folder per locale",
            "de-at: write the locale folder as `de-AT`",
        ] {
            assert!(problems.contains(expected), "{expected}: {problems}");
        }
    }

    #[test]
    fn a_subject_is_one_line_and_a_send_time_failure_is_a_problem_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "_default/en/magic_link.subject",
            "Sign in\nto {{ product_name }}",
        );
        write(
            dir.path(),
            "_default/en/invite.subject",
            "{{ product_name.split('x')[5] }}",
        );
        let problems = Templates::load(Some(dir.path())).unwrap_err().to_string();
        assert!(problems.contains("invite.subject:1:"), "{problems}");
        // Without the invitation's broken subject, the two-line one renders as one line.
        std::fs::remove_file(dir.path().join("_default/en/invite.subject")).unwrap();
        let templates = Templates::load(Some(dir.path())).unwrap();
        let vars = Vars::sample("default", LINK, false);
        let rendered = templates
            .render(Message::MagicLink, "default", None, &vars)
            .unwrap();
        assert_eq!(rendered.subject, "Sign in to Sample Product");
    }

    /// Review of issue 18: the link in a subject (sent as rendered, without its token), an
    /// unknown variable named at its line in the code (not where the word is first text), a
    /// FIFO as a template file (it blocked the check), and tenant folders naming no tenant.
    #[test]
    fn what_the_review_found_is_refused_with_its_place() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "_default/en/magic_link.subject",
            "Sign in: {{ link }}\n",
        );
        write(
            dir.path(),
            "_default/en/invite.txt",
            "{% extends \"layout.txt\" %}{% block body %}\nYour account name:\n{{ link }}\n\n{{ account }}\n{% endblock %}",
        );
        let problems = Templates::load(Some(dir.path())).unwrap_err().to_string();
        assert!(
            problems.contains("magic_link.subject:1: unknown variable `link`"),
            "{problems}"
        );
        assert!(
            problems.contains("invite.txt:5: unknown variable `account`"),
            "{problems}"
        );

        #[cfg(unix)]
        {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("_default/en")).unwrap();
            let fifo = dir.path().join("_default/en/verification.txt");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status();
            if made.is_ok_and(|s| s.success()) {
                let problems = Templates::load(Some(dir.path())).unwrap_err().to_string();
                assert!(problems.contains("not a regular file"), "{problems}");
            }
        }

        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "Acme/en/verification.subject", "Hi\n");
        write(dir.path(), "default/en/verification.subject", "Hi\n");
        let templates = Templates::load(Some(dir.path())).unwrap();
        // The link in a subject through a partial (second review).
        let through = tempfile::tempdir().unwrap();
        write(through.path(), "_default/en/_l.txt", "{{ link }}");
        write(
            through.path(),
            "_default/en/magic_link.subject",
            "Sign in {% include \"_l.txt\" %}\n",
        );
        let problems = Templates::load(Some(through.path()))
            .unwrap_err()
            .to_string();
        assert!(
            problems.contains("magic_link.subject: the subject shows the link"),
            "{problems}"
        );

        let refused = templates
            .validate_tenants(&["acme".to_owned()])
            .unwrap_err();
        assert!(
            refused.contains("Acme") && !refused.contains("default,"),
            "{refused}"
        );
        templates.validate_tenants(&["Acme".to_owned()]).unwrap();
        let path = format!("{}/Acme/en/verification.subject", dir.path().display());
        assert_eq!(templates.relative(&path), "Acme/en/verification.subject");
    }

    #[test]
    fn a_regional_or_scripted_tag_falls_back_step_by_step() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "_default/zh-Hant/verification.subject",
            "zh-Hant\n",
        );
        let templates = Templates::load(Some(dir.path())).unwrap();
        let vars = Vars::sample("default", LINK, false);
        let subject = |tag: &str| {
            templates
                .render(Message::Verification, "default", Some(&locale(tag)), &vars)
                .unwrap()
                .subject
        };
        assert_eq!(subject("zh-Hant-TW"), "zh-Hant");
        assert_eq!(subject("zh-Hant"), "zh-Hant");
        assert_eq!(subject("zh-TW"), "Confirm your email address");
    }

    #[test]
    fn negotiation_takes_the_first_accepted_language_with_templates() {
        let templates = Templates::embedded();
        let accepted = Locale::accepted("fr-CH, fr;q=0.9, de-AT;q=0.8, en;q=0.5");
        assert_eq!(
            templates.negotiate("acme", accepted).unwrap().as_str(),
            "de-AT"
        );
        let accepted = Locale::accepted("ja, ko;q=0.5");
        assert_eq!(
            templates.negotiate("acme", accepted).unwrap().as_str(),
            "ja"
        );
        assert_eq!(templates.negotiate("acme", Vec::new()), None);
    }

    #[test]
    fn link_lifetimes_read_in_the_message_language() {
        assert_eq!(lifetime_text(24 * 60, "en"), "24 hours");
        assert_eq!(lifetime_text(2 * 24 * 60, "en"), "2 days");
        assert_eq!(lifetime_text(7 * 24 * 60, "de"), "7 Tage");
        assert_eq!(lifetime_text(60, "de-AT"), "1 Stunde");
        assert_eq!(lifetime_text(15, "en"), "15 minutes");
        assert_eq!(lifetime_text(120, "fr"), "2 hours");
    }
}
