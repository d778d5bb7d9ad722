//! Using a link — what the flows that consume a token share (verification, password reset,
//! magic link, invite, email change). Opening a link (GET) shows its flow's page ([`page`]: templates beside
//! the flows' modules) and consumes nothing: link scanners open links; only the page's button
//! POSTs. The POST uses the token once ([`LinkUse::use_token`]), in its own flow and tenant,
//! before it expires; every failure is the same 400 `token-invalid`.

use std::sync::LazyLock;

use axum::Json;
use axum::extract::RawQuery;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use minijinja::{Environment, context};
use oncely::TenantId;
use oncely::layer::TxGuard;
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use super::post::IdempotentPost;
use super::problem::{ListedProblem, ServerProblem};
use crate::accounts::{Accounts, ConsumedToken, NewCode};
use crate::code::{self, Code};
use crate::token::{self, Flow};

/// `?token=` of a link: the one `token` parameter of the query (none if it is missing or given
/// more than once: the page then shows, and its button answers that the link is invalid).
pub struct PageQuery {
    token: Option<String>,
}

impl PageQuery {
    /// Reads `token` from a raw query string; any other parameter is ignored, a query that is
    /// not `application/x-www-form-urlencoded` has no token.
    pub fn parse(query: Option<&str>) -> Self {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(query.unwrap_or_default()).unwrap_or_default();
        let mut tokens = pairs.into_iter().filter(|(name, _)| name == "token");
        let token = match (tokens.next(), tokens.next()) {
            (Some((_, token)), None) => Some(token),
            _ => None,
        };
        Self { token }
    }
}

/// The pages a link opens: each flow's (`<module>.html` beside its module: the words) extends
/// `link_page.html` (the page). Values are HTML-escaped, `tojson` where they land in script.
static PAGES: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut pages = Environment::new();
    let templates = [
        ("link_page.html", include_str!("link_page.html")),
        ("verification.html", include_str!("verification.html")),
        ("password_reset.html", include_str!("password_reset.html")),
        ("magic_link.html", include_str!("magic_link.html")),
        ("invites.html", include_str!("invites.html")),
        ("email_change.html", include_str!("email_change.html")),
    ];
    for (name, source) in templates {
        pages
            .add_template(name, source)
            .unwrap_or_else(|error| panic!("{name} is not a valid template: {error}"));
    }
    pages
});

/// The template of the page `flow`'s link opens.
fn template(flow: Flow) -> &'static str {
    match flow {
        Flow::Verification => "verification.html",
        Flow::PasswordReset => "password_reset.html",
        Flow::MagicLink => "magic_link.html",
        Flow::Invite => "invites.html",
        Flow::EmailChange => "email_change.html",
    }
}

/// The page `flow`'s link opens for its `?token=` (only the token's base64url characters are
/// kept): a button that POSTs the token (and a password, where the flow takes one) with an
/// Idempotency-Key, so that a double click is harmless, to the path the page was opened at —
/// [`Flow::path`] behind however a proxy prefixes it (`ONCELY_PUBLIC_URL`'s path) — and that
/// calls the link invalid only on the 400 `token-invalid` problem. It reads and writes nothing.
pub fn render(flow: Flow, query: PageQuery) -> Response {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let page = html(flow, query, &nonce);
    // The page holds a live token: never cached, never sent on as a Referer, and its one
    // script (by nonce) may only talk to this origin.
    let policy = format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; connect-src 'self'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    );
    (
        [
            (header::CACHE_CONTROL, "no-store".to_owned()),
            (header::REFERRER_POLICY, "no-referrer".to_owned()),
            (header::CONTENT_SECURITY_POLICY, policy),
        ],
        Html(page),
    )
        .into_response()
}

/// The HTML of `flow`'s page for `query`, its script marked with `nonce`.
fn html(flow: Flow, query: PageQuery, nonce: &str) -> String {
    let token: String = query
        .token
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    let invalid_type = ListedProblem::from(ServerProblem::TokenInvalid).problem();
    let context = context! {
        token => token,
        nonce => nonce,
        invalid_type => invalid_type.type_uri(),
    };
    let page = PAGES
        .get_template(template(flow))
        .and_then(|page| page.render(context));
    // The templates are compiled in, and a test renders each page.
    page.expect("a link page renders")
}

/// `GET` of `flow`'s link path: its page.
pub fn page<S: Clone + Send + Sync + 'static>(flow: Flow) -> MethodRouter<S> {
    get(
        move |RawQuery(query): RawQuery| async move { render(flow, PageQuery::parse(query.as_deref())) },
    )
}

/// `{ "token": … }` (and a password where the flow takes one).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The token from the link.
    pub token: String,
    /// Password reset: the new password (required). Invite: the account's password (optional).
    /// Verification: the password chosen at signup, re-entered to adopt it (optional). Magic
    /// link: none.
    pub password: Option<String>,
}

/// The field of a used link's stored answer that holds its code's id (never sent: the redirect
/// replaces it).
pub const CODE_ID: &str = "code_id";
/// The field of a used link's stored answer that holds its return URL (never sent either).
pub const RETURN_TO: &str = "return_to";
/// The field of a stored answer that names the tenant of the code (the link's, which an
/// anonymous request does not name): its return URLs are checked again on every replay.
pub const CODE_TENANT: &str = "code_tenant";

/// A request that uses a link's token.
pub type LinkUse<A> = IdempotentPost<A, TokenRequest>;

/// What a route that uses a link answers: `{"status": …}`, or a problem.
pub type LinkUsed = Result<Json<Value>, ApiError>;

impl<A: Accounts> LinkUse<A> {
    /// Opens the transaction (claiming the key) and uses the token once in `flow`. The token
    /// names its tenant; a request that proved a tenant with an API key can only use that
    /// tenant's tokens.
    pub async fn use_token(
        &self,
        flow: Flow,
    ) -> Result<(TxGuard<'_, A::Database>, ConsumedToken), ApiError> {
        let mut conn = self.tx.lock().await?;
        let token = A::consume_token(
            &mut conn,
            self.tenant.proven().map(TenantId::as_str),
            flow.as_str(),
            &token::hash(&self.body.token),
        )
        .await?
        .ok_or(ApiError::InvalidToken)?;
        Ok((conn, token))
    }

    /// What a used link answers: `body` (`{"status": …}`), and, when the link's request chose a
    /// return URL that is still one of its tenant's, a code minted for `user` in the transaction: the answer then carries the
    /// code's id and the URL ([`CODE_ID`], [`RETURN_TO`]), which
    /// [`super::exchange::redirect`] turns into `"redirect"` for this answer and every replay
    /// of it (so the idempotency layer stores the id, never the code).
    pub async fn answer(
        &self,
        conn: &mut TxGuard<'_, A::Database>,
        token: &ConsumedToken,
        user: uuid::Uuid,
        mut body: Value,
    ) -> LinkUsed {
        if let Some(return_to) = &token.return_to {
            let id = uuid::Uuid::new_v4();
            let hash = Code::derive(&self.state.secret, id).hash();
            let code = NewCode {
                hash: &hash,
                token_hash: &token::hash(&self.body.token),
                user_id: user,
                lifetime: code::LIFETIME,
            };
            if A::insert_code(conn, &code).await? {
                body[CODE_ID] = Value::from(id.to_string());
                body[RETURN_TO] = Value::from(return_to.as_str());
                body[CODE_TENANT] = Value::from(token.tenant.as_str());
            } else {
                tracing::warn!(
                    tenant = %token.tenant,
                    "a used link's return URL is no longer its tenant's: no code, no redirect"
                );
            }
        }
        Ok(Json(body))
    }

    /// Uses the token once in `flow`, for the account it names.
    pub async fn use_account_token(
        &self,
        flow: Flow,
    ) -> Result<(TxGuard<'_, A::Database>, uuid::Uuid, ConsumedToken), ApiError> {
        let (conn, token) = self.use_token(flow).await?;
        let user = token.user_id.ok_or(ApiError::InvalidToken)?;
        Ok((conn, user, token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOWS: [Flow; 5] = [
        Flow::Verification,
        Flow::PasswordReset,
        Flow::MagicLink,
        Flow::Invite,
        Flow::EmailChange,
    ];

    fn page(flow: Flow, token: &str) -> String {
        let query = PageQuery {
            token: Some(token.to_owned()),
        };
        html(flow, query, "n0nce")
    }

    /// Issue 15, item 6: `?token=a&token=b` got a text/plain 400 instead of the page; the page
    /// takes the one `token` parameter, and none when it is given twice.
    #[test]
    fn the_page_reads_one_token_parameter_and_none_when_it_is_repeated() {
        let token = |query: &str| PageQuery::parse(Some(query)).token;
        assert_eq!(token("token=abc&utm=x"), Some("abc".into()));
        assert_eq!(token("token=a&token=b"), None);
        assert_eq!(token("utm=x"), None);
        assert_eq!(
            token("%zz=&token"),
            Some(String::new()),
            "empty: an invalid link"
        );
        assert_eq!(PageQuery::parse(None).token, None);
    }

    /// Issue 15, item 6: the page's key came from `crypto.randomUUID()`, which browsers offer
    /// only on HTTPS and localhost (the button did nothing over plain HTTP elsewhere); a 503 read
    /// as "invalid or expired". Its script carries the response's nonce.
    #[test]
    fn the_page_works_over_plain_http_and_tells_an_outage_from_a_bad_link() {
        let html = page(Flow::Verification, "abc");
        assert!(!html.contains("randomUUID()"), "{html}");
        assert!(html.contains("crypto.getRandomValues"), "{html}");
        assert!(html.contains("<script nonce=\"n0nce\">"), "{html}");
        assert!(html.contains("r.status >= 500"), "{html}");
        assert!(html.contains("try again"), "{html}");
    }

    /// Issue 15, item 6: the page POSTed to the absolute `/v1/verify`, which behind a proxy that
    /// serves the service under a path prefix is another service's path (a 404), and read any
    /// 4xx as "invalid or expired". It POSTs to the path it was opened at (each flow's link
    /// path takes GET and POST), and only the `token-invalid` problem means a dead link.
    #[test]
    fn the_page_posts_where_it_was_opened_and_only_token_invalid_means_a_dead_link() {
        for flow in FLOWS {
            let html = page(flow, "abc");
            assert!(!html.contains(flow.path()), "{html}");
            assert!(
                html.contains(
                    "r.status === 400 && type === \"https://oncely.dev/problems/token-invalid\" \
                     ? \"This link is invalid or has expired.\""
                ),
                "{html}"
            );
            assert!(html.contains("Something went wrong (status "), "{html}");
        }
    }

    #[test]
    fn every_page_posts_its_token_to_its_flow_and_asks_for_a_password_only_where_it_takes_one() {
        for flow in FLOWS {
            let html = page(flow, "abc-_DEF");
            assert!(html.starts_with("<!doctype html>"), "{html}");
            assert!(
                html.contains("fetch(location.origin + location.pathname, "),
                "{html}"
            );
            assert!(html.contains("{token: \"abc-_DEF\"}"), "{html}");
            let title = between(&html, "<title>", "</title>");
            assert!(!title.is_empty() && html.contains(&format!("<h1>{title}</h1>")));
            assert_eq!(
                html.contains("id=\"password\""),
                !matches!(flow, Flow::MagicLink | Flow::EmailChange),
                "{html}"
            );
            assert!(html.ends_with("</script>"), "{html}");
        }
    }

    fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
        let from = text.find(start).unwrap() + start.len();
        &text[from..from + text[from..].find(end).unwrap()]
    }

    #[test]
    fn nothing_from_the_link_or_the_words_escapes_into_markup_or_script() {
        let html = page(Flow::MagicLink, "a\"b<c>'d&e</script>");
        assert!(html.contains("{token: \"abcdescript\"}"), "{html}");
        // The page escapes whatever it is given.
        let context = context! {
            title => "<b>\"&'",
            password_label => "</label><script>",
            invalid_type => "</script>",
            token => "'<x>",
        };
        let html = PAGES
            .get_template("link_page.html")
            .and_then(|page| page.render(context))
            .unwrap();
        assert!(
            !html.contains("<b>") && !html.contains("</label><script>"),
            "{html}"
        );
        assert!(html.contains("&lt;b&gt;&quot;&amp;&#x27;"), "{html}");
        assert_eq!(html.matches("</script>").count(), 1, "{html}");
        assert!(
            html.contains("{token: \"\\u0027\\u003cx\\u003e\"}"),
            "{html}"
        );
    }
}
