//! The OpenAPI 3 description served at `/openapi.json`: request schemas derive from the
//! request types; each route's answers are declared next to it here; what every `POST` shares
//! (the `Idempotency-Key` header, the tenant's API key, the idempotency problems) is added once.
//! The problem types come from [`crate::routes::problem`]: the `type` of the `Problem` schema
//! enumerates them, and the problems every `POST` may answer are listed by status.

use std::collections::BTreeMap;

use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::Schema;
use utoipa::openapi::{ContentBuilder, ObjectBuilder, RefOr, Required, ResponseBuilder, Type};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::identity::{Identity, Proof};
use crate::routes::email_change::EmailChangeRequest;
use crate::routes::exchange::ExchangeRequest;
use crate::routes::login::LoginRequest;
use crate::routes::problem;
use crate::routes::send_link::EmailRequest;
use crate::routes::signup::SignupRequest;
use crate::routes::use_link::TokenRequest;

/// `{"status": …, "detail": …}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Accepted {
    /// `accepted`.
    #[schema(example = "accepted")]
    status: String,
    /// The same sentence for every address.
    detail: String,
}

/// `{"status": …}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Done {
    /// `verified`, `password_changed`, `signed_in`, `joined` or `email_changed`.
    status: String,
    /// `POST /v1/verify` only: whether the signup's password was re-entered and adopted.
    password_set: Option<bool>,
    /// When the link's request chose a return URL: that URL with `code=<one-time code>` added
    /// to its query (exchange it with `POST /v1/exchange` within 60 s).
    #[schema(example = "https://app.example.com/auth/callback?code=…")]
    redirect: Option<String>,
}

/// RFC 9457 problem details (`application/problem+json`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Problem {
    /// `https://oncely.dev/problems/<slug>`, one of the problem types:
    #[schema(rename = "type")]
    type_uri: String,
    /// A short summary.
    title: String,
    /// The HTTP status.
    status: u16,
    /// This occurrence, for people.
    detail: Option<String>,
}

macro_rules! post_route {
    ($name:ident, $path:tt, $body:ident, $ok:tt, $ok_body:ident, $summary:literal $(, ($status:tt, $desc:tt))*) => {
        #[doc = $summary]
        #[utoipa::path(
            post,
            path = $path,
            request_body(content = $body, content_type = "application/json"),
            responses(
                (status = $ok, description = "Done (or replayed: `Idempotent-Replayed: true`)", body = $ok_body),
                $((status = $status, description = $desc, body = Problem, content_type = "application/problem+json"),)*
            )
        )]
        #[allow(dead_code)]
        fn $name() {}
    };
}

post_route!(
    signup,
    "/v1/signup",
    SignupRequest,
    202,
    Accepted,
    "Sign up: one account per address and tenant, one email per request; the same answer for new, pending and registered addresses.",
    (
        400,
        "`return-url-not-allowed` (`return_to` is not one of the tenant's return URLs), or `invalid-request`"
    )
);
post_route!(
    resend,
    "/v1/verification/resend",
    EmailRequest,
    202,
    Accepted,
    "A new verification link for an unverified account; the same answer for every address.",
    (
        400,
        "`return-url-not-allowed` (`return_to` is not one of the tenant's return URLs), or `invalid-request`"
    )
);
post_route!(
    password_reset,
    "/v1/password-reset",
    EmailRequest,
    202,
    Accepted,
    "A password reset link (1 h) if the address has an account; the same answer for every address.",
    (
        400,
        "`return-url-not-allowed` (`return_to` is not one of the tenant's return URLs), or `invalid-request`"
    )
);
post_route!(
    magic_link,
    "/v1/magic-link",
    EmailRequest,
    202,
    Accepted,
    "A sign-in link (15 min) if the address has an account; the same answer for every address.",
    (
        400,
        "`return-url-not-allowed` (`return_to` is not one of the tenant's return URLs), or `invalid-request`"
    )
);
post_route!(
    invite,
    "/v1/invites",
    EmailRequest,
    202,
    Accepted,
    "An invitation (7 days) to any address; needs the tenant's API key.",
    (
        400,
        "`return-url-not-allowed` (`return_to` is not one of the tenant's return URLs), or `invalid-request`"
    )
);
post_route!(
    verify,
    "/v1/verify",
    TokenRequest,
    200,
    Done,
    "Uses a verification link once; marks the address verified and, if the signup's password is re-entered, sets it.",
    (
        400,
        "`token-invalid`, `password-mismatch`, or `invalid-request`"
    )
);
post_route!(
    reset_confirm,
    "/v1/password-reset/confirm",
    TokenRequest,
    200,
    Done,
    "Uses a reset link once; sets the new password.",
    (400, "`token-invalid`, or an invalid password")
);
post_route!(
    magic_consume,
    "/v1/magic-link/consume",
    TokenRequest,
    200,
    Done,
    "Uses a sign-in link once.",
    (400, "`token-invalid`")
);
post_route!(
    invite_accept,
    "/v1/invites/accept",
    TokenRequest,
    200,
    Done,
    "Uses an invitation once: creates or joins the account, one membership.",
    (400, "`token-invalid`")
);

post_route!(
    exchange,
    "/v1/exchange",
    ExchangeRequest,
    200,
    Identity,
    "Uses a one-time code from a return URL once (within 60 s, with the API key of the link's tenant): who signed in, and how.",
    (
        400,
        "`code-invalid` (unknown, used, expired or another tenant's), or `invalid-request`"
    )
);

post_route!(
    login,
    "/v1/login",
    LoginRequest,
    200,
    Identity,
    "Checks a password (tenant API key required; Idempotency-Key optional): the identity of the verified account. Every failure is the same 401; too many failures are 429 before any check.",
    (
        401,
        "`login-failed` (any failure: unknown address, wrong password, no password, not verified), or `unauthorized` (no or a bad API key)"
    ),
    (429, "`login-throttled` (with `Retry-After`)"),
    (503, "`busy` (with `Retry-After`)")
);

/// A new address for an account: a confirmation link to it and a notice to the current one (or, if another account has it, a notice to that account only); the same answer either way; needs the tenant's API key.
#[utoipa::path(
    post,
    path = "/v1/users/{id}/email-change",
    params(("id" = String, Path, description = "The user's id (a UUID)")),
    request_body(content = EmailChangeRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Done (or replayed: `Idempotent-Replayed: true`)", body = Accepted),
        (status = 404, description = "`user-not-found`: no such user in the key's tenant", body = Problem, content_type = "application/problem+json"),
    )
)]
#[allow(dead_code)]
fn email_change() {}

post_route!(
    email_change_confirm,
    "/v1/email-change/confirm",
    TokenRequest,
    200,
    Done,
    "Uses an email change link once: the account gets the new address, verified; its other live links stop working.",
    (
        400,
        "`token-invalid` (also when another account took the address meanwhile)"
    )
);

macro_rules! get_route {
    ($name:ident, $path:tt, $ct:tt, $summary:tt $(, $param:tt)?) => {
        #[doc = $summary]
        #[utoipa::path(
            get,
            path = $path,
            $(params(($param = Option<String>, Query, description = "The token from the link")),)?
            responses((status = 200, description = $summary, content_type = $ct))
        )]
        #[allow(dead_code)]
        fn $name() {}
    };
}

get_route!(
    verify_page,
    "/v1/verify",
    "text/html",
    "The page a verification link opens; consumes nothing.",
    "token"
);
get_route!(
    reset_page,
    "/v1/password-reset/confirm",
    "text/html",
    "The page a reset link opens; consumes nothing.",
    "token"
);
get_route!(
    magic_page,
    "/v1/magic-link/consume",
    "text/html",
    "The page a sign-in link opens; consumes nothing.",
    "token"
);
get_route!(
    invite_page,
    "/v1/invites/accept",
    "text/html",
    "The page an invitation opens; consumes nothing.",
    "token"
);
get_route!(
    email_change_page,
    "/v1/email-change/confirm",
    "text/html",
    "The page an email change link opens; consumes nothing.",
    "token"
);
get_route!(
    healthz,
    "/healthz",
    "text/plain",
    "Liveness: 200 while the process runs."
);
get_route!(
    readyz,
    "/readyz",
    "text/plain",
    "Readiness: 200 when the database answers and migrations are current; else 503."
);
get_route!(metrics, "/metrics", "text/plain", "Prometheus metrics.");

/// The description.
#[derive(OpenApi)]
#[openapi(
    info(title = "oncely", description = "Signup, verification and account links; retried requests are harmless."),
    paths(
        signup, resend, password_reset, magic_link, invite, verify, reset_confirm, magic_consume,
        invite_accept, exchange, login, verify_page, reset_page, magic_page, invite_page, healthz, readyz, metrics,
        email_change, email_change_confirm, email_change_page
    ),
    components(schemas(Accepted, Done, Problem, Identity, Proof)),
    modifiers(&Shared)
)]
pub struct ApiDoc;

/// What every `POST` shares.
struct Shared;

impl Modify for Shared {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            list_problem_types(&mut components.schemas);
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            if let Some(post) = item.post.as_mut() {
                // Login takes the Idempotency-Key optionally.
                let login = path == "/v1/login";
                let needs_api_key = matches!(
                    path.as_str(),
                    "/v1/invites" | "/v1/exchange" | "/v1/login" | "/v1/users/{id}/email-change"
                );
                add_shared(post, needs_api_key, !login);
            }
            for operation in [&mut item.get, &mut item.post].into_iter().flatten() {
                add_response_headers(operation);
            }
        }
    }
}

fn response_header(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::header::Header> {
    let mut header =
        utoipa::openapi::header::Header::new(ObjectBuilder::new().schema_type(Type::String));
    header.description = Some(description.to_owned());
    header.into()
}

/// Headers answers carry: the request id on every one, the replay marker on stored answers,
/// `Retry-After` where a retry is invited.
fn add_response_headers(operation: &mut Operation) {
    let post = operation
        .parameters
        .iter()
        .flatten()
        .any(|p| matches!(p, utoipa::openapi::RefOr::T(p) if p.name == "Idempotency-Key"));
    for (status, response) in operation.responses.responses.iter_mut() {
        let utoipa::openapi::RefOr::T(response) = response else {
            continue;
        };
        let headers = &mut response.headers;
        headers.insert(
            "X-Request-Id".into(),
            response_header("The caller's x-request-id, or a generated UUID; also in every log line of the request."),
        );
        if post && status.starts_with('2') {
            headers.insert(
                "Idempotent-Replayed".into(),
                response_header("`true` when this is the stored answer of an earlier request with the same key."),
            );
        }
        if status == "409" || status == "429" || status == "503" {
            headers.insert(
                "Retry-After".into(),
                response_header("Seconds to wait before retrying with the same key."),
            );
        }
    }
}

fn header(
    name: &str,
    required: bool,
    description: &str,
    schema: ObjectBuilder,
) -> utoipa::openapi::RefOr<Parameter> {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(if required {
            Required::True
        } else {
            Required::False
        })
        .description(Some(description))
        .schema(Some(schema))
        .build()
        .into()
}

fn add_shared(operation: &mut Operation, needs_api_key: bool, needs_key: bool) {
    let parameters = operation.parameters.get_or_insert_with(Vec::new);
    parameters.push(header(
        "Idempotency-Key",
        needs_key,
        "One value per logical operation, reused on every retry: an RFC 8941 string or a bare token, 1-255 visible ASCII characters (a bare token has no comma).",
        // The bare form, which every client can send; the server also takes an RFC 8941 string.
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(255))
            .pattern(Some(format!("^{}+$", oncely::key::BARE_KEY_CLASS))),
    ));
    parameters.push(header(
        "Authorization",
        needs_api_key,
        "`Bearer <tenant API key>`; without it, the default tenant. An invalid key is 401, never the default tenant.",
        ObjectBuilder::new().schema_type(Type::String),
    ));
    parameters.push(header(
        "Oncely-Client-IP",
        false,
        "With the tenant's API key: the IP address of the person the application's backend acts for, as it saw it — the client of the per-client caps and of the hashing pool's shares (without it, unknown: never the backend). Ignored without an API key (the client is then the peer).",
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::Custom("ip".into()))),
    ));
    let problem = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(utoipa::openapi::Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    // Every problem any `POST` may answer, by status (the layer's and the server's).
    let mut shared: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for listed in problem::all().filter(|p| p.on_every_post) {
        let slugs = shared.entry(listed.status.as_u16()).or_default();
        slugs.push(format!("`{}`", listed.slug));
    }
    for (status, slugs) in shared {
        let mut description = slugs.join(", ");
        if status == 409 || status == 503 {
            description.push_str(" (with `Retry-After`)");
        }
        operation
            .responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| problem(&description).into());
    }
}

/// The `type` of the `Problem` schema: one of the listed URIs, each described.
fn list_problem_types(schemas: &mut BTreeMap<String, RefOr<Schema>>) {
    let Some(RefOr::T(Schema::Object(problem_schema))) = schemas.get_mut("Problem") else {
        return;
    };
    let Some(RefOr::T(Schema::Object(type_uri))) = problem_schema.properties.get_mut("type") else {
        return;
    };
    let mut description = type_uri.description.take().unwrap_or_default();
    let mut uris = Vec::new();
    for listed in problem::all() {
        description.push_str(&format!(
            "\n- `{}` ({}): {}",
            listed.slug,
            listed.status.as_u16(),
            listed.title
        ));
        uris.push(format!("{}{}", oncely::problem::PROBLEM_BASE, listed.slug).into());
    }
    type_uri.description = Some(description);
    type_uri.enum_values = Some(uris);
}
