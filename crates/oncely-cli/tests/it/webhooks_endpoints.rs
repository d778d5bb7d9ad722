//! Webhook endpoints (`oncely tenant webhook …`) and their signed delivery by the outbox worker:
//! secrets printed once and stored sealed, the URL rules (SSRF) at `add` and at every delivery,
//! Standard Webhooks headers verified by us and by the reference Python package, retries with
//! the same id, rotation, 410, redirects, body cap, timeouts.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use oncely::ServerSecret;
use oncely_outbox::{
    JobRecord, JobStatus, JobStore, KindOptions, RetryPolicy, Worker, WorkerConfig,
};
use oncely_server::accounts::{Accounts, NewEndpoint};
use oncely_server::backend::{Backend, Sqlite};
use oncely_server::secret::signing::{SigningSecret, seal};
use oncely_server::webhooks::{
    EndpointRef, Event, EventType, UrlPolicy, WebhookDelivery, WebhookSettings, emit,
    signing_secrets,
};
use oncely_server::workers::with_webhooks;
use oncely_testdb::TestDb;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{
    SECRET, both_databases, dump, on_backend, oncely_binary, open_migrated, run_to_end, secret,
};

// ---------------------------------------------------------------------------------------------
// The CLI

async fn oncely(url: &str, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let mut command = oncely_binary(args);
    command
        .args(["--database-url", url])
        .env_remove("ONCELY_SECRET")
        .env_remove("ONCELY_SECRET_PREVIOUS")
        .env_remove("ONCELY_ENV")
        .env_remove("ONCELY_WEBHOOK_ALLOW_PRIVATE")
        .envs(env.iter().copied());
    run_to_end(&mut command).await
}

/// `oncely tenant webhook ARGS…` on the database, as [`oncely`] runs it.
async fn webhook(url: &str, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    oncely(url, env, &[&["tenant", "webhook"], args].concat()).await
}

const PRODUCTION: &[(&str, &str)] = &[("ONCELY_ENV", "production"), ("ONCELY_SECRET", SECRET)];

both_databases!(
    webhook_endpoints_are_added_listed_disabled_enabled_rotated_and_removed_and_the_secret_shows_once,
    private_addresses_are_refused_at_add_in_production
);

async fn webhook_endpoints_are_added_listed_disabled_enabled_rotated_and_removed_and_the_secret_shows_once(
    url: String,
    _db: TestDb,
) {
    crate::support::migrate(&url).await;
    let (code, ..) = oncely(&url, &[], &["tenant", "create", "acme"]).await;
    assert_eq!(code, 0);
    // An unknown tenant, an unknown event type: refused.
    let (code, _, err) = webhook(&url, &[], &["add", "nope", "http://127.0.0.1:9/h"]).await;
    assert_eq!(code, 3, "{err}");
    let add = ["add", "acme", "http://127.0.0.1:9/h", "--events"];
    let (code, _, err) = webhook(&url, &[], &[&add[..], &["user.deleted"]].concat()).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("user.verified") && err.contains("email.failed"),
        "{err}"
    );

    let verified_and_failed = ["user.verified,email.failed", "--json"];
    let (code, out, err) = webhook(&url, &[], &[&add[..], &verified_and_failed].concat()).await;
    assert_eq!(code, 0, "{err}");
    let added: Value = serde_json::from_str(&out).unwrap();
    let id = added["id"].as_str().unwrap().to_owned();
    let first = added["secret"].as_str().unwrap().to_owned();
    assert!(SigningSecret::parse(&first).is_some(), "{first}");
    assert_eq!(added["events"], json!(["user.verified", "email.failed"]));
    let (code, out, _) = webhook(&url, &[], &["add", "default", "http://localhost:9/d"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("whsec_"), "{out}");

    // Rotate: a new secret, printed once; the previous one signs until the grace ends.
    let (code, out, err) = webhook(&url, &[], &["rotate", &id, "--grace", "1h", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let rotated: Value = serde_json::from_str(&out).unwrap();
    let second = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(first, second);
    assert!(rotated["previous_secret_valid_until"].is_string());

    // Both sign now (what the dev inbox reads).
    on_backend!(url, both_sign_now(&url, &id, [&second, &first]));

    // Disable, list, enable.
    let (code, ..) = webhook(&url, &[], &["disable", &id]).await;
    assert_eq!(code, 0);
    let (code, out, _) = webhook(&url, &[], &["list", "acme", "--json"]).await;
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["enabled"], false);
    assert_eq!(listed[0]["disabled_reason"], "disabled by an operator");
    assert!(listed[0]["previous_secret_valid_until"].is_string());
    let (_, human, _) = webhook(&url, &[], &["list"]).await;
    assert!(
        human.contains("disabled by an operator") && human.contains("all"),
        "{human}"
    );
    let (code, ..) = webhook(&url, &[], &["enable", &id]).await;
    assert_eq!(code, 0);
    let (_, out, _) = webhook(&url, &[], &["list", "--json"]).await;
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["enabled"] == true)
    );

    // No secret in any listing, nor anywhere in the database, in any form.
    for shown in [&out, &human] {
        assert!(!shown.contains("whsec_"), "{shown}");
    }
    let everything = dump(&url).await;
    for s in [&first, &second] {
        assert!(!everything.contains(s.as_str()));
        assert!(!everything.contains(s.trim_start_matches("whsec_")));
        let key = base64_decode(s.trim_start_matches("whsec_"));
        assert!(!everything.contains(&hex(&key)));
    }

    // Remove; unknown and malformed ids: exit 3, in JSON too.
    let (code, ..) = webhook(&url, &[], &["remove", &id]).await;
    assert_eq!(code, 0);
    for args in [
        &["tenant", "webhook", "remove", id.as_str()][..],
        &["tenant", "webhook", "disable", id.as_str()],
        &["tenant", "webhook", "enable", "not-an-id"],
        &["tenant", "webhook", "rotate", &Uuid::new_v4().to_string()],
    ] {
        let mut args = args.to_vec();
        args.push("--json");
        let (code, _, err) = oncely(&url, &[], &args).await;
        assert_eq!(code, 3, "{args:?}: {err}");
        let error: Value = serde_json::from_str(err.trim()).unwrap();
        assert_eq!(error["error"], "not_found");
    }
}

/// The endpoint's signing secrets, unsealed with the database's development secret (the CLI
/// was given no ONCELY_SECRET), are `expected`; the test secret opens nothing.
async fn both_sign_now<B: Accounts>(url: &str, id: &str, expected: [&String; 2]) {
    let backend: B = open_migrated(url).await;
    let by_url = EndpointRef::Url("http://127.0.0.1:9/h");
    assert!(
        signing_secrets(&backend, &secret(SECRET), by_url)
            .await
            .is_err(),
        "the test secret does not open what the CLI sealed"
    );
    let stored = crate::support::scalar::<String>(
        url,
        "SELECT secret FROM oncely_shared_development_secret",
    )
    .await;
    let development = ServerSecret::new(stored.into_bytes()).unwrap();
    for which in [EndpointRef::Id(id.parse().unwrap()), by_url] {
        let secrets = signing_secrets(&backend, &development, which)
            .await
            .unwrap();
        assert_eq!(secrets.len(), 1);
        let exposed: Vec<&str> = secrets[0].1.iter().map(SigningSecret::expose).collect();
        assert_eq!(exposed, [expected[0].as_str(), expected[1].as_str()]);
    }
}

async fn private_addresses_are_refused_at_add_in_production(url: String, _db: TestDb) {
    crate::support::migrate(&url).await;
    for target in [
        "https://localhost/h",
        "https://127.0.0.1/h",
        "https://10.0.0.1/h",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/h",
        "https://[::ffff:127.0.0.1]/h",
        "http://hooks.example.com/h",
        "https://user:pw@hooks.example.com/h",
        "https://hooks.example.com/h#x",
    ] {
        let (code, out, err) = webhook(&url, PRODUCTION, &["add", "default", target]).await;
        assert_eq!(code, 1, "{target}: {out}{err}");
        assert!(err.contains("refused webhook URL"), "{target}: {err}");
    }
    // With the setting, a private https address is accepted in production.
    let mut allow = PRODUCTION.to_vec();
    allow.push(("ONCELY_WEBHOOK_ALLOW_PRIVATE", "true"));
    let (code, _, err) = oncely(
        &url,
        &allow,
        &["tenant", "webhook", "add", "default", "https://10.0.0.1/h"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    // Development: loopback http is accepted, a private address is not.
    let (code, _, err) = webhook(&url, &[], &["add", "default", "http://localhost:1/h"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, ..) = webhook(&url, &[], &["add", "default", "http://192.168.1.1/h"]).await;
    assert_eq!(code, 1);
    assert_eq!(count_endpoints(&url).await, 2);
}

// ---------------------------------------------------------------------------------------------
// Delivery

/// What the receiver answers next (then 200).
#[derive(Clone)]
enum Answer {
    Status(u16),
    Slow(Duration),
    Huge,
    Redirect(String),
}

#[derive(Clone, Debug)]
struct Captured {
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Receiver {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    captured: Arc<Mutex<Vec<Captured>>>,
    /// Bytes of the huge answer handed to the connection so far.
    streamed: Arc<AtomicUsize>,
}

impl Receiver {
    async fn start(answers: Vec<Answer>) -> (Self, String) {
        let receiver = Self {
            answers: Arc::new(Mutex::new(answers.into())),
            ..Self::default()
        };
        let app = axum::Router::new()
            .fallback(receive)
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{addr}/hook"))
    }

    fn captured(&self) -> Vec<Captured> {
        self.captured.lock().unwrap().clone()
    }
}

async fn receive(
    axum::extract::State(receiver): axum::extract::State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    receiver
        .captured
        .lock()
        .unwrap()
        .push(Captured { headers, body });
    let answer = receiver.answers.lock().unwrap().pop_front();
    match answer {
        None => StatusCode::OK.into_response(),
        Some(Answer::Status(status)) => (
            StatusCode::from_u16(status).unwrap(),
            format!("answer {status}"),
        )
            .into_response(),
        Some(Answer::Slow(wait)) => {
            tokio::time::sleep(wait).await;
            StatusCode::OK.into_response()
        }
        Some(Answer::Huge) => {
            // 10 MB, then more for as long as it is read: only a reader that stops stops it.
            let streamed = receiver.streamed.clone();
            let chunks = futures::stream::repeat_with(move || {
                streamed.fetch_add(64 * 1024, SeqCst);
                Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 64 * 1024]))
            });
            Response::builder()
                .status(500)
                .body(Body::from_stream(chunks))
                .unwrap()
        }
        Some(Answer::Redirect(to)) => Response::builder()
            .status(302)
            .header("location", to)
            .body(Body::empty())
            .unwrap(),
    }
}

/// A TCP listener on loopback that counts the connections it gets (and answers nothing).
async fn counting_listener() -> (Arc<AtomicUsize>, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, SeqCst);
            drop(socket);
        }
    });
    (connections, addr)
}

/// An endpoint of tenant `acme` at `url` (stored directly: production's checks at `add` are
/// what the forced-in rows bypass), sealed with the test secret; returns its id and secret.
async fn endpoint<B: Accounts>(backend: &B, url: &str) -> (Uuid, SigningSecret) {
    let id = Uuid::new_v4();
    let signing = SigningSecret::generate();
    let sealed = seal(&secret(SECRET), id, &signing);
    backend
        .insert_webhook_endpoint(NewEndpoint {
            id,
            tenant: "acme",
            url,
            events: "[]",
            secret_sealed: &sealed,
        })
        .await
        .unwrap();
    (id, signing)
}

/// Emits a `user.verified` event for tenant `acme`; returns it.
async fn emit_event<B: Accounts>(backend: &B) -> Event {
    let event = Event::new(
        EventType::UserVerified,
        json!({ "user_id": Uuid::new_v4() }),
    );
    let mut conn = backend.pool().acquire().await.unwrap();
    let written = emit::<B>(&mut *conn, &backend.jobs(true), "acme", &event)
        .await
        .unwrap();
    assert!(written >= 1);
    event
}

fn worker<B: Accounts>(backend: &B, settings: WebhookSettings) -> Worker<B::Jobs> {
    worker_with(backend, settings, secret(SECRET))
}

/// [`worker`] with another server secret.
fn worker_with<B: Accounts>(
    backend: &B,
    settings: WebhookSettings,
    server: ServerSecret,
) -> Worker<B::Jobs> {
    let delivery = WebhookDelivery::new(backend.clone(), server, settings).unwrap();
    let options = KindOptions {
        policy: RetryPolicy {
            base: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
            ..RetryPolicy::DEFAULT
        },
        ..KindOptions::default()
    };
    with_webhooks(
        Worker::new(backend.jobs(true), WorkerConfig::default()),
        delivery,
        options,
    )
}

fn development(timeout: Duration) -> WebhookSettings {
    WebhookSettings {
        policy: UrlPolicy {
            production: false,
            allow_private: false,
        },
        timeout,
    }
}

/// Runs the worker until the job of `event` at `endpoint` is no longer pending (bounded).
/// An endpoint of a receiver answering `answers`, one event for it, and a worker (development
/// settings, `timeout`) run until the event's job is done: the backend, the receiver, the
/// endpoint's signing secret, the event and the job.
async fn delivered<B: Accounts>(
    url: &str,
    answers: Vec<Answer>,
    timeout: Duration,
) -> (B, Receiver, SigningSecret, Event, JobRecord) {
    let backend: B = open_migrated(url).await;
    let (receiver, target) = Receiver::start(answers).await;
    let (endpoint_id, signing) = endpoint(&backend, &target).await;
    let event = emit_event(&backend).await;
    let worker = worker(&backend, development(timeout));
    let job = run_until_done(&backend, &worker, &event, endpoint_id).await;
    (backend, receiver, signing, event, job)
}

async fn run_until_done<B: Accounts>(
    backend: &B,
    worker: &Worker<B::Jobs>,
    event: &Event,
    endpoint: Uuid,
) -> JobRecord {
    let key = format!("webhook:{}:{endpoint}", event.id);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        worker.run_once().await.unwrap();
        let job = backend
            .jobs(true)
            .job(&key)
            .await
            .unwrap()
            .expect("the job");
        if job.status != JobStatus::Pending || Instant::now() > deadline {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn attempt_results<B: Accounts>(backend: &B, job: &JobRecord) -> Vec<String> {
    backend
        .jobs(true)
        .attempts(job.id)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|a| a.result)
        .collect()
}

both_databases!(
    a_delivery_is_signed_verifiable_by_the_reference_package_and_a_retry_keeps_its_id,
    during_a_rotation_both_secrets_sign,
    gone_disables_the_endpoint_and_list_shows_it,
    a_huge_answer_is_read_up_to_the_cap,
    a_timeout_is_unknown_and_retried_with_the_same_id,
    a_redirect_is_not_followed,
    in_production_forced_private_endpoints_die_without_a_connection,
    a_removed_or_disabled_endpoint_ends_its_deliveries_dead,
    a_server_secret_rotation_keeps_every_endpoint_signing
);

async fn a_delivery_is_signed_verifiable_by_the_reference_package_and_a_retry_keeps_its_id(
    url: String,
    _db: TestDb,
) {
    on_backend!(url, signed_and_retried(&url));
}

async fn signed_and_retried<B: Accounts>(url: &str) {
    let (backend, receiver, signing, event, job) =
        delivered::<B>(url, vec![Answer::Status(500)], Duration::from_secs(10)).await;
    assert_eq!(job.status, JobStatus::Sent, "{:?}", job.last_error);
    assert_eq!(attempt_results(&backend, &job).await, ["retry", "sent"]);
    let captured = receiver.captured();
    assert_eq!(captured.len(), 2);
    for request in &captured {
        let h = |name: &str| request.headers[name].to_str().unwrap().to_owned();
        assert_eq!(h("webhook-id"), event.id, "the same id on every attempt");
        assert_eq!(h("idempotency-key"), event.id);
        assert_eq!(h("content-type"), "application/json");
        assert!(h("user-agent").contains("oncely"));
        assert_eq!(
            request.body,
            event.body().as_bytes(),
            "the stored body, byte for byte"
        );
        let timestamp: i64 = h("webhook-timestamp").parse().unwrap();
        assert!((time::OffsetDateTime::now_utc().unix_timestamp() - timestamp).abs() < 300);
        // Computed here, independently: HMAC-SHA256 over id.timestamp.body with the key.
        assert_eq!(
            h("webhook-signature"),
            independent_signature(signing.expose(), &event.id, timestamp, &request.body)
        );
        python_verifies(signing.expose(), request, true);
        // Tampered: the reference package rejects it.
        let mut tampered = request.clone();
        tampered.body =
            Bytes::from(String::from_utf8_lossy(&request.body).replace("verified", "created"));
        python_verifies(signing.expose(), &tampered, false);
    }
}

async fn during_a_rotation_both_secrets_sign(url: String, _db: TestDb) {
    on_backend!(url, rotation(&url));
}

async fn rotation<B: Accounts>(url: &str) {
    let backend: B = open_migrated(url).await;
    let (receiver, target) = Receiver::start(vec![]).await;
    let (endpoint_id, old) = endpoint(&backend, &target).await;
    let new = SigningSecret::generate();
    backend
        .rotate_webhook_secret(
            endpoint_id,
            &seal(&secret(SECRET), endpoint_id, &new),
            Duration::from_secs(3600),
        )
        .await
        .unwrap()
        .unwrap();
    let event = emit_event(&backend).await;
    let worker = worker(&backend, development(Duration::from_secs(10)));
    let job = run_until_done(&backend, &worker, &event, endpoint_id).await;
    assert_eq!(job.status, JobStatus::Sent);
    let request = &receiver.captured()[0];
    let header = request.headers["webhook-signature"].to_str().unwrap();
    let timestamp: i64 = request.headers["webhook-timestamp"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let signatures: Vec<&str> = header.split(' ').collect();
    assert_eq!(
        signatures,
        [
            independent_signature(new.expose(), &event.id, timestamp, &request.body),
            independent_signature(old.expose(), &event.id, timestamp, &request.body),
        ]
    );
    python_verifies(new.expose(), request, true);
    python_verifies(old.expose(), request, true);
    python_verifies(SigningSecret::generate().expose(), request, false);
}

/// Regression (review of issue 17): signing secrets stayed sealed under the server secret they
/// were added with; once a server-secret rotation ended (`ONCELY_SECRET_PREVIOUS` removed, as
/// operations.md says), no endpoint could sign again, and `rotate` did not help (its previous
/// secret still did not open). Now a process started with the previous secret seals them again
/// under the new one, and a previous signing secret that does not open is left out.
async fn a_server_secret_rotation_keeps_every_endpoint_signing(url: String, _db: TestDb) {
    on_backend!(url, server_secret_rotation(&url));
}

async fn server_secret_rotation<B: Accounts>(url: &str) {
    use oncely_server::webhooks::delivery::reseal_endpoints;
    let backend: B = open_migrated(url).await;
    let (receiver, target) = Receiver::start(vec![]).await;
    let old = secret(SECRET);
    let new = secret("a-new-server-secret-after-the-rotation-0123456789");
    let rotating = secret("a-new-server-secret-after-the-rotation-0123456789")
        .with_previous(vec![secret(SECRET)]);
    // Endpoint A: its current and previous signing secrets sealed under the old server secret.
    let (a, first) = endpoint(&backend, &target).await;
    let second = SigningSecret::generate();
    backend
        .rotate_webhook_secret(a, &seal(&old, a, &second), Duration::from_secs(3600))
        .await
        .unwrap()
        .unwrap();
    // Step 1 of the rotation: processes start with the new secret and the old as previous.
    assert_eq!(reseal_endpoints(&backend, &rotating).await.unwrap(), 2);
    assert_eq!(
        reseal_endpoints(&backend, &rotating).await.unwrap(),
        0,
        "sealed once"
    );
    // Step 3: the previous secret is gone. Both signing secrets still sign.
    let event = emit_event(&backend).await;
    let worker = worker_with(&backend, development(Duration::from_secs(10)), new.clone());
    let job = run_until_done(&backend, &worker, &event, a).await;
    assert_eq!(job.status, JobStatus::Sent, "{:?}", job.last_error);
    let request = receiver.captured().pop().unwrap();
    python_verifies(second.expose(), &request, true);
    python_verifies(first.expose(), &request, true);
    assert_eq!(
        request.headers["webhook-signature"]
            .to_str()
            .unwrap()
            .split(' ')
            .count(),
        2
    );

    // Endpoint B: its previous signing secret sealed under a server secret no process has any
    // more (rotated after the server secret changed): the current one signs alone.
    let (receiver, target) = Receiver::start(vec![]).await;
    let (b, _) = endpoint(&backend, &target).await;
    let third = SigningSecret::generate();
    backend
        .rotate_webhook_secret(b, &seal(&new, b, &third), Duration::from_secs(3600))
        .await
        .unwrap()
        .unwrap();
    let event = emit_event(&backend).await;
    let job = run_until_done(&backend, &worker, &event, b).await;
    assert_eq!(job.status, JobStatus::Sent, "{:?}", job.last_error);
    let [request] = receiver.captured().try_into().expect("one delivery to B");
    python_verifies(third.expose(), &request, true);
}

async fn gone_disables_the_endpoint_and_list_shows_it(url: String, _db: TestDb) {
    on_backend!(url, gone(&url));
}

async fn gone<B: Accounts>(url: &str) {
    let (backend, receiver, _, _, job) =
        delivered::<B>(url, vec![Answer::Status(410)], Duration::from_secs(10)).await;
    assert_eq!(job.status, JobStatus::Dead);
    assert!(
        job.last_error.as_deref().unwrap().contains("410"),
        "{:?}",
        job.last_error
    );
    assert_eq!(receiver.captured().len(), 1);
    let (code, out, _) = webhook(url, &[], &["list", "--json"]).await;
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[0]["enabled"], false);
    assert!(
        listed[0]["disabled_reason"]
            .as_str()
            .unwrap()
            .starts_with("410 Gone at "),
        "{listed}"
    );
    // A disabled endpoint gets no new events.
    let event = Event::new(EventType::UserCreated, json!({}));
    let mut conn = backend.pool().acquire().await.unwrap();
    assert_eq!(
        emit::<B>(&mut *conn, &backend.jobs(true), "acme", &event)
            .await
            .unwrap(),
        0
    );
}

async fn a_huge_answer_is_read_up_to_the_cap(url: String, _db: TestDb) {
    on_backend!(url, huge(&url));
}

async fn huge<B: Accounts>(url: &str) {
    let (backend, receiver, _, _, job) =
        delivered::<B>(url, vec![Answer::Huge], Duration::from_secs(10)).await;
    assert_eq!(job.status, JobStatus::Sent);
    let attempts = backend.jobs(true).attempts(job.id).await.unwrap();
    let reason = attempts[0].error.clone().unwrap();
    assert!(reason.starts_with("HTTP 500"), "{reason}");
    assert!(
        reason.len() < 300,
        "the reason is short: {} bytes",
        reason.len()
    );
    // The reader stopped at its cap: the endless answer went no further than what the socket
    // buffers hold (a reader without a cap pulls it until the timeout: gigabytes on loopback).
    let streamed = receiver.streamed.load(SeqCst);
    assert!(streamed < 64 * 1024 * 1024, "{streamed} bytes were pulled");
}

async fn a_timeout_is_unknown_and_retried_with_the_same_id(url: String, _db: TestDb) {
    on_backend!(url, timeout(&url));
}

async fn timeout<B: Accounts>(url: &str) {
    let (backend, receiver, _, event, job) = delivered::<B>(
        url,
        vec![Answer::Slow(Duration::from_secs(5))],
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(job.status, JobStatus::Sent);
    assert_eq!(attempt_results(&backend, &job).await, ["unknown", "sent"]);
    let ids: Vec<String> = receiver
        .captured()
        .iter()
        .map(|c| c.headers["webhook-id"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, [event.id.clone(), event.id.clone()]);
}

async fn a_redirect_is_not_followed(url: String, _db: TestDb) {
    on_backend!(url, redirect(&url));
}

async fn redirect<B: Accounts>(url: &str) {
    let (elsewhere, addr) = counting_listener().await;
    let (backend, receiver, _, _, job) = delivered::<B>(
        url,
        vec![Answer::Redirect(format!("http://{addr}/internal"))],
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(job.status, JobStatus::Sent, "retried at the same URL");
    let attempts = backend.jobs(true).attempts(job.id).await.unwrap();
    assert!(attempts[0].error.as_deref().unwrap().contains("302"));
    assert_eq!(receiver.captured().len(), 2);
    assert_eq!(elsewhere.load(SeqCst), 0, "the Location was never fetched");
}

async fn in_production_forced_private_endpoints_die_without_a_connection(url: String, _db: TestDb) {
    on_backend!(url, forced_private(&url));
}

async fn forced_private<B: Accounts>(url: &str) {
    let backend: B = open_migrated(url).await;
    let (connections, addr) = counting_listener().await;
    let port = addr.port();
    let production = WebhookSettings {
        policy: UrlPolicy {
            production: true,
            allow_private: false,
        },
        timeout: Duration::from_secs(5),
    };
    let worker = worker(&backend, production);
    for target in [
        format!("https://localhost:{port}/h"),
        format!("https://127.0.0.1:{port}/h"),
        format!("https://[::1]:{port}/h"),
        format!("https://[::ffff:127.0.0.1]:{port}/h"),
        "https://10.0.0.1/h".to_owned(),
        "https://169.254.169.254/latest/meta-data".to_owned(),
        format!("http://127.0.0.1:{port}/h"),
    ] {
        let (endpoint_id, _) = endpoint(&backend, &target).await;
        let event = emit_event(&backend).await;
        let job = run_until_done(&backend, &worker, &event, endpoint_id).await;
        assert_eq!(job.status, JobStatus::Dead, "{target}");
        let reason = job.last_error.unwrap_or_default();
        assert!(reason.contains("refused"), "{target}: {reason}");
        backend.remove_webhook_endpoint(endpoint_id).await.unwrap();
    }
    assert_eq!(connections.load(SeqCst), 0, "no connection was made");
}

async fn a_removed_or_disabled_endpoint_ends_its_deliveries_dead(url: String, _db: TestDb) {
    on_backend!(url, removed_or_disabled(&url));
}

async fn removed_or_disabled<B: Accounts>(url: &str) {
    let backend: B = open_migrated(url).await;
    let (receiver, target) = Receiver::start(vec![]).await;
    let worker = worker(&backend, development(Duration::from_secs(10)));
    let (removed, _) = endpoint(&backend, &target).await;
    let event = emit_event(&backend).await;
    backend.remove_webhook_endpoint(removed).await.unwrap();
    let job = run_until_done(&backend, &worker, &event, removed).await;
    assert_eq!(job.status, JobStatus::Dead);
    assert_eq!(job.last_error.as_deref(), Some("the endpoint was removed"));
    let (disabled, _) = endpoint(&backend, &target).await;
    let event = emit_event(&backend).await;
    backend
        .set_webhook_disabled(disabled, Some("disabled by an operator"))
        .await
        .unwrap();
    let job = run_until_done(&backend, &worker, &event, disabled).await;
    assert_eq!(job.status, JobStatus::Dead);
    assert_eq!(job.last_error.as_deref(), Some("the endpoint is disabled"));
    assert!(receiver.captured().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Standard Webhooks signature, written here from the specification (not our code).
fn independent_signature(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> String {
    use base64::Engine;
    use hmac::{KeyInit, Mac};
    let key = base64_decode(secret.strip_prefix("whsec_").unwrap());
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// Runs the reference `standardwebhooks` Python package on a captured request: it must verify
/// (or, `expected` false, reject). Skipped visibly when the package is not installed.
fn python_verifies(secret: &str, request: &Captured, expected: bool) {
    let import = std::process::Command::new("python3")
        .args(["-c", "import standardwebhooks"])
        .output();
    if !import.is_ok_and(|o| o.status.success()) {
        println!(
            "SKIPPED: the reference standardwebhooks package is not installed (python3 -c 'import standardwebhooks' failed)"
        );
        return;
    }
    let headers: serde_json::Map<String, Value> =
        ["webhook-id", "webhook-timestamp", "webhook-signature"]
            .iter()
            .map(|&name| {
                (
                    name.to_owned(),
                    json!(request.headers[name].to_str().unwrap()),
                )
            })
            .collect();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("body"), &request.body).unwrap();
    std::fs::write(
        dir.path().join("headers"),
        Value::Object(headers).to_string(),
    )
    .unwrap();
    let script = "import json, sys, standardwebhooks\n\
        d = sys.argv[2]\n\
        body = open(d + '/body', 'rb').read()\n\
        headers = json.load(open(d + '/headers'))\n\
        try:\n    standardwebhooks.Webhook(sys.argv[1]).verify(body, headers)\n    print('verified')\n\
        except standardwebhooks.WebhookVerificationError as e:\n    print('rejected', e)\n";
    let output = std::process::Command::new("python3")
        .args(["-c", script, secret, dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        said.trim() == "verified",
        expected,
        "the reference package said {said}"
    );
}

async fn count_endpoints(url: &str) -> i64 {
    crate::support::count(url, "SELECT COUNT(*) FROM oncely_webhook_endpoints").await
}

/// One thread (the default test runtime): the worker's tasks log to this test's subscriber and
/// count in its recorder. The log names the endpoint, the event and the status — never the
/// signing secret, never the body (an `email.requested` body carries a login link).
#[tokio::test]
async fn a_delivery_logs_and_counts_ids_and_outcomes_never_the_secret_or_the_body() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let (logs, _logging) = crate::support::capture_logs();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let (url, _db) = crate::support::sqlite_db().await;
    let backend: Sqlite = open_migrated(&url).await;
    let (_receiver, target) = Receiver::start(vec![Answer::Status(503)]).await;
    let (endpoint_id, signing) = endpoint(&backend, &target).await;
    let link = "https://app.example.com/v1/magic-link/consume?token=MARKER-OF-A-LINK";
    let event = Event::new(EventType::EmailRequested, json!({ "link": link }));
    let mut conn = backend.pool().acquire().await.unwrap();
    emit::<Sqlite>(&mut *conn, &backend.jobs(true), "acme", &event)
        .await
        .unwrap();
    drop(conn);
    let worker = worker(&backend, development(Duration::from_secs(10)));
    let job = run_until_done(&backend, &worker, &event, endpoint_id).await;
    assert_eq!(job.status, JobStatus::Sent);

    let logged = logs.text();
    assert!(
        logged.contains(&event.id) && logged.contains(&endpoint_id.to_string()),
        "{logged}"
    );
    assert!(
        logged.contains("503") && logged.contains("email.requested"),
        "{logged}"
    );
    for secret in [
        signing.expose(),
        signing.expose().trim_start_matches("whsec_"),
        "MARKER-OF-A-LINK",
    ] {
        assert!(!logged.contains(secret), "{secret} in the log:\n{logged}");
    }
    let counted: Vec<(String, DebugValue)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "oncely_webhook_deliveries_total")
        .map(|(key, .., value)| {
            let outcome = key.key().labels().find(|l| l.key() == "outcome").unwrap();
            (outcome.value().to_owned(), value)
        })
        .collect();
    let mut counted = counted;
    counted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        counted,
        [
            ("retry".to_owned(), DebugValue::Counter(1)),
            ("sent".to_owned(), DebugValue::Counter(1)),
        ]
    );
}
