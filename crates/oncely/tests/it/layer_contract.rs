//! Every row of the Idempotency-Key contract, through the layer, on both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt;
use oncely::{DerivedKey, IdempotencyLayer, IdempotentTx, Outcome, TenantId, TxAborted};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::support::{Backend, Db, both_stores, new_key, postgres, postgres_again, secret};

/// Counts how often handlers with an effect outside the database ran.
#[derive(Clone, Default)]
pub(crate) struct Effects(Arc<AtomicUsize>);

impl Effects {
    fn bump(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

async fn pay(
    Extension(effects): Extension<Effects>,
    key: Option<Extension<DerivedKey>>,
) -> Response {
    tokio::time::sleep(Duration::from_millis(50)).await;
    let n = effects.bump();
    let mut headers = HeaderMap::new();
    headers.insert(header::LOCATION, format!("/payments/{n}").parse().unwrap());
    headers.insert(header::SET_COOKIE, "session=s3cr3t".parse().unwrap());
    headers.insert("x-request-cost", "7".parse().unwrap());
    (
        StatusCode::CREATED,
        headers,
        Json(json!({"payment": n, "derived_key": key.map(|k| k.0.to_string())})),
    )
        .into_response()
}

async fn slow(Extension(effects): Extension<Effects>) -> Json<Value> {
    tokio::time::sleep(Duration::from_millis(400)).await;
    Json(json!({"payment": effects.bump()}))
}

async fn fail(Extension(effects): Extension<Effects>) -> StatusCode {
    effects.bump();
    StatusCode::SERVICE_UNAVAILABLE
}

async fn reject(Extension(effects): Extension<Effects>) -> StatusCode {
    effects.bump();
    StatusCode::BAD_REQUEST
}

async fn big(Extension(effects): Extension<Effects>) -> String {
    effects.bump();
    "x".repeat(2000)
}

async fn panics(Extension(effects): Extension<Effects>) -> StatusCode {
    effects.bump();
    panic!("handler bug")
}

async fn tx_pay<S: Backend>(
    tx: IdempotentTx<S::Database>,
) -> Result<(StatusCode, Json<Value>), TxAborted> {
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut conn = tx.lock().await?;
    S::insert_effect(&mut conn, "pay").await;
    Ok((
        StatusCode::CREATED,
        Json(json!({"paid": true, "derived_key": tx.derived_key().as_str()})),
    ))
}

async fn tx_slow<S: Backend>(tx: IdempotentTx<S::Database>) -> Result<Json<Value>, TxAborted> {
    S::insert_effect(&mut *tx.lock().await?, "slow").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    Ok(Json(json!({"paid": true})))
}

async fn tx_fail<S: Backend>(tx: IdempotentTx<S::Database>) -> Result<StatusCode, TxAborted> {
    S::insert_effect(&mut *tx.lock().await?, "fail").await;
    Ok(StatusCode::INTERNAL_SERVER_ERROR)
}

async fn tx_hang<S: Backend>(tx: IdempotentTx<S::Database>) -> Result<StatusCode, TxAborted> {
    S::insert_effect(&mut *tx.lock().await?, "hang").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(StatusCode::CREATED)
}

/// A test-only tenant resolver: `x-tenant` picks the tenant.
async fn tenant_from_header(mut req: Request, next: Next) -> Response {
    let tenant = req
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(|t| TenantId::parse(t).unwrap());
    if let Some(tenant) = tenant {
        req.extensions_mut().insert(tenant);
    }
    next.run(req).await
}

/// The app under test: generic routes, transactional routes under `/tx`, a GET.
pub(crate) fn app<S: Backend>(
    store: S,
    effects: Effects,
    tune: impl Fn(IdempotencyLayer<S>) -> IdempotencyLayer<S>,
) -> Router {
    let generic = Router::new()
        .route("/payments", post(pay))
        .route("/payments/{id}/refund", post(pay))
        .route("/slow", post(slow))
        .route("/fail", post(fail))
        .route("/reject", post(reject))
        .route("/big", post(big))
        .route("/panic", post(panics))
        .route_layer(tune(
            IdempotencyLayer::generic(store.clone(), secret()).max_stored_body(1000),
        ));
    let transactional = Router::new()
        .route("/tx/payments", post(tx_pay::<S>))
        .route("/tx/slow", post(tx_slow::<S>))
        .route("/tx/fail", post(tx_fail::<S>))
        .route("/tx/hang", post(tx_hang::<S>))
        .route_layer(tune(
            IdempotencyLayer::transactional(store, secret()).lease(Duration::from_secs(2)),
        ));
    generic
        .merge(transactional)
        .route("/health", get(|| async { "ok" }))
        .layer(Extension(effects))
        .layer(middleware::from_fn(tenant_from_header))
}

fn plain<S: Backend>(store: S, effects: Effects) -> Router {
    app(store, effects, |l| l)
}

/// The app with the default layers, and the count of its handlers' effects.
fn counted<S: Backend>(store: S) -> (Router, Effects) {
    let effects = Effects::default();
    (plain(store, effects.clone()), effects)
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) outcome: Option<Outcome>,
}

use bytes::Bytes;

impl Answer {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
    /// Asserts that the answer is a problem with this status and type
    /// (`https://oncely.dev/problems/<slug>`).
    #[track_caller]
    pub(crate) fn assert_problem(&self, status: StatusCode, slug: &str) {
        assert_eq!(self.status, status, "{:?}", self.json());
        assert_eq!(
            self.problem_type(),
            format!("https://oncely.dev/problems/{slug}")
        );
    }
    fn problem_type(&self) -> String {
        assert_eq!(
            self.headers[header::CONTENT_TYPE],
            "application/problem+json"
        );
        self.json()["type"].as_str().unwrap().to_owned()
    }
}

pub(crate) async fn send(
    app: &Router,
    path: &str,
    key: Option<&str>,
    body: &str,
    extra: &[(&str, &str)],
) -> Answer {
    let mut req = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    for (name, value) in extra {
        req = req.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let outcome = response.extensions().get::<Outcome>().copied();
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
        outcome,
    }
}

/// The scope of `key` on `POST route` in the default tenant, and the fingerprint of an empty
/// JSON body there under `secret`: what a test needs to claim a key through the store directly.
fn direct(
    secret: &oncely::ServerSecret,
    route: &str,
    key: &str,
) -> (oncely::Scope, oncely::Fingerprint) {
    let scope = oncely::Scope::new(
        TenantId::default(),
        "POST",
        route,
        oncely::IdempotencyKey::parse(key).unwrap(),
    );
    let fingerprint = oncely::Fingerprint::of_request(
        secret,
        &oncely::fingerprint::RequestTarget::route("POST", route),
        Some("application/json"),
        b"{}",
        None,
    );
    (scope, fingerprint)
}

fn quoted(key: &str) -> String {
    format!("\"{key}\"")
}

both_stores!(
    fifty_concurrent_identical_requests_run_the_generic_handler_once,
    fifty_concurrent_identical_requests_commit_one_transaction,
    a_retry_replays_status_body_and_allow_listed_headers_only,
    same_key_with_a_different_body_is_422_and_runs_nothing,
    same_key_with_reordered_json_keys_replays,
    a_missing_key_is_400_and_runs_nothing,
    malformed_keys_are_400_and_run_nothing,
    tenant_a_key_never_replays_for_tenant_b,
    the_same_key_on_another_route_is_another_scope,
    the_query_is_part_of_the_request,
    numbers_that_differ_past_f64_precision_are_different_requests,
    a_5xx_releases_the_key_and_a_retry_runs_again,
    a_rolled_back_transaction_releases_the_key,
    a_validation_rejection_is_not_stored,
    a_panicking_handler_releases_the_key,
    an_oversized_response_tombstones_the_key,
    a_streamed_oversized_response_reaches_the_client_and_tombstones_the_key,
    the_layer_never_buffers_past_the_stored_limit,
    an_oversized_request_is_413_and_not_stored,
    a_request_still_running_after_the_wait_gets_409_with_retry_after,
    a_concurrent_retry_within_the_wait_gets_the_replay,
    a_slow_live_owner_keeps_its_key_and_runs_once,
    transactional_pre_work_before_lock_runs_concurrently,
    a_transactional_handler_that_never_locks_is_stored_and_replayed,
    after_a_refused_lock_the_layer_answers_not_the_handler,
    a_dead_owner_is_taken_over_and_its_token_can_no_longer_complete,
    a_failed_completion_is_retried,
    a_transactional_handler_past_its_lease_is_rolled_back,
    a_client_that_gives_up_after_commit_gets_the_replay_on_retry,
    safe_methods_and_optional_keys_pass_through,
    without_a_matched_route_the_scope_is_fixed_and_the_path_is_fingerprinted,
    the_derived_key_is_stable_per_scope,
    a_rotated_secret_still_replays_with_the_previous_one_in_its_ring,
    a_row_the_previous_release_stored_still_replays_after_the_upgrade,
    a_dead_owner_under_a_previous_secret_is_taken_over_with_its_derived_key,
    a_body_that_fails_after_the_generic_handler_ran_keeps_the_key,
    an_answer_marked_outcome_unknown_keeps_the_key,
    a_route_template_extension_is_the_scope_outside_a_router,
);

async fn fifty_concurrent_identical_requests_run_the_generic_handler_once<S: Backend>(
    store: S,
    _db: Db,
) {
    let (app, effects) = counted(store);
    let key = quoted(&new_key());
    let answers = futures_join(50, |_| {
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, "/payments", Some(&key), r#"{"amount":10}"#, &[]).await }
    })
    .await;
    assert_eq!(effects.count(), 1);
    for a in &answers {
        assert_eq!(a.status, StatusCode::CREATED);
        assert_eq!(a.json()["payment"], 1);
    }
    assert_eq!(answers.iter().filter(|a| a.replayed()).count(), 49);
}

async fn fifty_concurrent_identical_requests_commit_one_transaction<S: Backend>(store: S, _db: Db) {
    let app = plain(store.clone(), Effects::default());
    let key = quoted(&new_key());
    let answers = futures_join(50, |_| {
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, "/tx/payments", Some(&key), r#"{"amount":10}"#, &[]).await }
    })
    .await;
    assert_eq!(store.count_effects().await, 1);
    let first = &answers[0];
    for a in &answers {
        assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.json());
        assert_eq!(a.body, first.body);
    }
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.outcome == Some(Outcome::Created))
            .count(),
        1
    );
    assert_eq!(answers.iter().filter(|a| a.replayed()).count(), 49);
}

async fn a_retry_replays_status_body_and_allow_listed_headers_only<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    let first = send(&app, "/payments", Some(&key), r#"{"amount":10}"#, &[]).await;
    assert_eq!(first.outcome, Some(Outcome::Created));
    assert!(
        first.headers.contains_key(header::SET_COOKIE),
        "the first caller gets every header"
    );
    assert!(!first.replayed());
    let retry = send(&app, "/payments", Some(&key), r#"{"amount":10}"#, &[]).await;
    assert_eq!(effects.count(), 1);
    assert_eq!(retry.outcome, Some(Outcome::Replayed));
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.body, first.body);
    assert!(retry.replayed());
    assert_eq!(retry.headers[header::LOCATION], "/payments/1");
    assert_eq!(retry.headers[header::CONTENT_TYPE], "application/json");
    assert!(
        !retry.headers.contains_key(header::SET_COOKIE),
        "Set-Cookie must never be replayed"
    );
    assert!(
        !retry.headers.contains_key("x-request-cost"),
        "only allow-listed headers are replayed"
    );
}

async fn same_key_with_a_different_body_is_422_and_runs_nothing<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store.clone());
    for path in ["/payments", "/tx/payments"] {
        let key = new_key();
        send(&app, path, Some(&key), r#"{"amount":10}"#, &[]).await;
        let other = send(&app, path, Some(&key), r#"{"amount":11}"#, &[]).await;
        other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused");
        assert_eq!(other.outcome, Some(Outcome::Mismatch));
    }
    assert_eq!(effects.count(), 1);
    assert_eq!(store.count_effects().await, 1);
}

async fn same_key_with_reordered_json_keys_replays<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    send(
        &app,
        "/payments",
        Some(&key),
        r#"{"amount":10,"currency":"EUR"}"#,
        &[],
    )
    .await;
    let retry = send(
        &app,
        "/payments",
        Some(&key),
        "{ \"currency\": \"EUR\",\n \"amount\": 10 }",
        &[],
    )
    .await;
    assert!(retry.replayed());
    assert_eq!(effects.count(), 1);
}

async fn a_missing_key_is_400_and_runs_nothing<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store.clone());
    for path in ["/payments", "/tx/payments"] {
        let a = send(&app, path, None, "{}", &[]).await;
        a.assert_problem(StatusCode::BAD_REQUEST, "idempotency-key-missing");
        assert_eq!(a.outcome, Some(Outcome::Invalid));
    }
    assert_eq!(effects.count(), 0);
    assert_eq!(store.count_effects().await, 0);
}

async fn malformed_keys_are_400_and_run_nothing<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let long = "k".repeat(256);
    for key in ["", "\"\"", long.as_str(), "a b", "\"unterminated", "a,b"] {
        let a = send(&app, "/payments", Some(key), "{}", &[]).await;
        a.assert_problem(StatusCode::BAD_REQUEST, "idempotency-key-invalid");
    }
    let req = Request::post("/payments")
        .header("idempotency-key", "one")
        .header("idempotency-key", "two")
        .body(Body::empty())
        .unwrap();
    let a = app.clone().oneshot(req).await.unwrap();
    assert_eq!(a.status(), StatusCode::BAD_REQUEST);
    assert_eq!(effects.count(), 0);
}

async fn tenant_a_key_never_replays_for_tenant_b<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    let a = send(&app, "/payments", Some(&key), "{}", &[("x-tenant", "a")]).await;
    let b = send(&app, "/payments", Some(&key), "{}", &[("x-tenant", "b")]).await;
    assert!(!b.replayed());
    assert_eq!(b.outcome, Some(Outcome::Created));
    assert_ne!(a.json()["payment"], b.json()["payment"]);
    assert_ne!(a.json()["derived_key"], b.json()["derived_key"]);
    assert_eq!(effects.count(), 2);
}

async fn the_same_key_on_another_route_is_another_scope<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    send(&app, "/payments", Some(&key), "{}", &[]).await;
    let other = send(&app, "/payments/1/refund", Some(&key), "{}", &[]).await;
    assert_eq!(other.outcome, Some(Outcome::Created));
    // The route template is the scope, but the concrete path is in the fingerprint: payment 1's
    // key on payment 2 is a reused key, never refund 1's answer.
    let same_template = send(&app, "/payments/2/refund", Some(&key), "{}", &[]).await;
    same_template.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused");
    assert_eq!(same_template.outcome, Some(Outcome::Mismatch));
    assert_eq!(effects.count(), 2);
}

async fn the_query_is_part_of_the_request<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    let first = send(&app, "/payments?a=1&b=x%20y", Some(&key), "{}", &[]).await;
    assert_eq!(first.outcome, Some(Outcome::Created));
    let reordered = send(&app, "/payments?b=x+y&a=1", Some(&key), "{}", &[]).await;
    assert!(reordered.replayed(), "same pairs in another order");
    let other = send(&app, "/payments?a=2&b=x%20y", Some(&key), "{}", &[]).await;
    assert_eq!(other.outcome, Some(Outcome::Mismatch));
    let none = send(&app, "/payments", Some(&key), "{}", &[]).await;
    assert_eq!(none.outcome, Some(Outcome::Mismatch));
    assert_eq!(effects.count(), 1);
}

async fn numbers_that_differ_past_f64_precision_are_different_requests<S: Backend>(
    store: S,
    _db: Db,
) {
    let (app, effects) = counted(store);
    let key = new_key();
    send(&app, "/payments", Some(&key), r#"{"amount":0.1}"#, &[]).await;
    let other = send(
        &app,
        "/payments",
        Some(&key),
        r#"{"amount":0.10000000000000001}"#,
        &[],
    )
    .await;
    assert_eq!(other.outcome, Some(Outcome::Mismatch));
    let same = send(&app, "/payments", Some(&key), r#"{"amount":1.0e-1}"#, &[]).await;
    assert!(same.replayed());
    let key = new_key();
    send(
        &app,
        "/payments",
        Some(&key),
        r#"{"id":18446744073709551616}"#,
        &[],
    )
    .await;
    let other = send(
        &app,
        "/payments",
        Some(&key),
        r#"{"id":18446744073709551617}"#,
        &[],
    )
    .await;
    assert_eq!(other.outcome, Some(Outcome::Mismatch));
    assert_eq!(effects.count(), 2);
}

async fn a_5xx_releases_the_key_and_a_retry_runs_again<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    let first = send(&app, "/fail", Some(&key), "{}", &[]).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(first.outcome, Some(Outcome::Released));
    let retry = send(&app, "/fail", Some(&key), "{}", &[]).await;
    assert_eq!(retry.outcome, Some(Outcome::Released));
    assert_eq!(effects.count(), 2);
}

async fn a_rolled_back_transaction_releases_the_key<S: Backend>(store: S, _db: Db) {
    let app = plain(store.clone(), Effects::default());
    let key = new_key();
    let first = send(&app, "/tx/fail", Some(&key), "{}", &[]).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(first.outcome, Some(Outcome::Released));
    assert_eq!(
        store.count_effects().await,
        0,
        "the failed handler's rows were rolled back"
    );
    let retry = send(&app, "/tx/fail", Some(&key), "{}", &[]).await;
    assert_eq!(
        retry.outcome,
        Some(Outcome::Released),
        "the retry ran again"
    );
}

async fn a_validation_rejection_is_not_stored<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    assert_eq!(
        send(&app, "/reject", Some(&key), "{}", &[]).await.status,
        StatusCode::BAD_REQUEST
    );
    let retry = send(&app, "/reject", Some(&key), "{}", &[]).await;
    assert!(!retry.replayed());
    assert_eq!(effects.count(), 2);
}

async fn a_panicking_handler_releases_the_key<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    let first = send(&app, "/panic", Some(&key), "{}", &[]).await;
    first.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "internal-error");
    send(&app, "/panic", Some(&key), "{}", &[]).await;
    assert_eq!(effects.count(), 2, "the key was released, so the retry ran");
}

async fn an_oversized_response_tombstones_the_key<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    let first = send(&app, "/big", Some(&key), "{}", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body.len(),
        2000,
        "the first caller gets the whole body"
    );
    let retry = send(&app, "/big", Some(&key), "{}", &[]).await;
    retry.assert_problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-unreplayable",
    );
    assert_eq!(effects.count(), 1, "a tombstoned key never runs again");
}

/// A response body of `chunks` chunks of 100 bytes (endless if `None`) that counts how many
/// chunks were produced.
struct Chunks {
    produced: Arc<AtomicUsize>,
    left: Option<usize>,
    yielded: bool,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        // Yield between chunks, as a real stream would: a reader that never stops must not
        // starve the runtime (the test's timeout has to fire).
        self.yielded = !self.yielded;
        if self.yielded {
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        if let Some(left) = &mut self.left {
            if *left == 0 {
                return std::task::Poll::Ready(None);
            }
            *left -= 1;
        }
        self.produced.fetch_add(1, Ordering::SeqCst);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(vec![
            b'x';
            100
        ])))))
    }
}

#[derive(Clone)]
struct Streamed {
    produced: Arc<AtomicUsize>,
    chunks: Option<usize>,
}

async fn stream_generic(
    Extension(streamed): Extension<Streamed>,
    Extension(effects): Extension<Effects>,
) -> Response {
    effects.bump();
    Response::new(Body::new(Chunks {
        produced: streamed.produced,
        left: streamed.chunks,
        yielded: false,
    }))
}

async fn stream_tx<S: Backend>(
    Extension(streamed): Extension<Streamed>,
    tx: IdempotentTx<S::Database>,
) -> Result<Response, TxAborted> {
    S::insert_effect(&mut *tx.lock().await?, "stream").await;
    Ok(Response::new(Body::new(Chunks {
        produced: streamed.produced,
        left: streamed.chunks,
        yielded: false,
    })))
}

fn streaming_app<S: Backend>(
    store: S,
    effects: Effects,
    chunks: Option<usize>,
) -> (Router, Arc<AtomicUsize>) {
    let produced = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/stream", post(stream_generic))
        .route_layer(IdempotencyLayer::generic(store.clone(), secret()).max_stored_body(1000))
        .merge(
            Router::new()
                .route("/tx/stream", post(stream_tx::<S>))
                .route_layer(
                    IdempotencyLayer::transactional(store, secret()).max_stored_body(1000),
                ),
        )
        .layer(Extension(Streamed {
            produced: produced.clone(),
            chunks,
        }))
        .layer(Extension(effects));
    (app, produced)
}

async fn a_streamed_oversized_response_reaches_the_client_and_tombstones_the_key<S: Backend>(
    store: S,
    _db: Db,
) {
    let effects = Effects::default();
    let (app, _) = streaming_app(store.clone(), effects.clone(), Some(100));
    for path in ["/stream", "/tx/stream"] {
        let key = new_key();
        let first = send(&app, path, Some(&key), "{}", &[]).await;
        assert_eq!(first.status, StatusCode::OK, "{path}");
        assert_eq!(first.outcome, Some(Outcome::Created), "{path}");
        assert_eq!(
            first.body.len(),
            100 * 100,
            "{path}: the client gets the whole body"
        );
        assert!(first.body.iter().all(|b| *b == b'x'));
        let retry = send(&app, path, Some(&key), "{}", &[]).await;
        retry.assert_problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-unreplayable",
        );
    }
    assert_eq!(effects.count(), 1);
    assert_eq!(
        store.count_effects().await,
        1,
        "committed before the body streamed"
    );
}

/// An endless body: the response head reaches the client after about the stored limit (1000
/// bytes, 10 chunks) was read, and the body keeps flowing after it.
async fn the_layer_never_buffers_past_the_stored_limit<S: Backend>(store: S, _db: Db) {
    for path in ["/stream", "/tx/stream"] {
        let (app, produced) = streaming_app(store.clone(), Effects::default(), None);
        let key = new_key();
        let req = Request::post(path)
            .header("idempotency-key", &key)
            .body(Body::from("{}"))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(3), app.clone().oneshot(req))
            .await
            .expect("the layer buffered the endless body instead of answering")
            .unwrap();
        let at_head = produced.load(Ordering::SeqCst);
        assert!(
            at_head <= 11,
            "{path}: {at_head} chunks read before the head"
        );
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body();
        let mut received = 0;
        while received < 50 * 100 {
            let frame = body.frame().await.unwrap().unwrap();
            received += frame.into_data().unwrap().len();
        }
        assert!(produced.load(Ordering::SeqCst) >= 50);
        drop(body);
        let retry = send(&app, path, Some(&key), "{}", &[]).await;
        assert_eq!(retry.status, StatusCode::UNPROCESSABLE_ENTITY, "{path}");
    }
}

async fn an_oversized_request_is_413_and_not_stored<S: Backend>(store: S, _db: Db) {
    let effects = Effects::default();
    let app = app(store, effects.clone(), |l| l.max_request_body(100));
    let key = new_key();
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(200));
    let a = send(&app, "/payments", Some(&key), &big, &[]).await;
    a.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "request-too-large");
    let small = send(&app, "/payments", Some(&key), "{}", &[]).await;
    assert_eq!(small.outcome, Some(Outcome::Created), "the key stayed free");
    assert_eq!(effects.count(), 1);
}

async fn a_request_still_running_after_the_wait_gets_409_with_retry_after<S: Backend>(
    store: S,
    _db: Db,
) {
    let effects = Effects::default();
    let app = app(store, effects.clone(), |l| {
        l.wait(Duration::from_millis(100))
    });
    for path in ["/slow", "/tx/slow"] {
        let key = new_key();
        let first = tokio::spawn({
            let (app, key) = (app.clone(), key.clone());
            async move { send(&app, path, Some(&key), "{}", &[]).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = send(&app, path, Some(&key), "{}", &[]).await;
        if path == "/tx/slow" && second.status != StatusCode::CONFLICT {
            // SQLite has one writer: the second request waits for the write lock (its busy
            // timeout), which the first holds until it commits, and then replays.
            assert!(second.replayed(), "{path}: {:?}", second.json());
        } else {
            second.assert_problem(StatusCode::CONFLICT, "idempotency-key-in-use");
            assert_eq!(second.outcome, Some(Outcome::InProgress));
            assert_eq!(second.headers[header::RETRY_AFTER], "1");
        }
        assert_eq!(first.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(effects.count(), 1);
}

async fn a_concurrent_retry_within_the_wait_gets_the_replay<S: Backend>(store: S, _db: Db) {
    let (app, effects) = counted(store);
    let key = new_key();
    let first = tokio::spawn({
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, "/slow", Some(&key), "{}", &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = send(&app, "/slow", Some(&key), "{}", &[]).await;
    assert!(second.replayed());
    assert_eq!(second.body, first.await.unwrap().body);
    assert_eq!(effects.count(), 1);
}

async fn a_slow_live_owner_keeps_its_key_and_runs_once<S: Backend>(store: S, _db: Db) {
    let effects = Effects::default();
    let app = app(store, effects.clone(), |l| {
        l.lease(Duration::from_millis(150))
            .wait(Duration::from_millis(50))
    });
    let key = new_key();
    let first = tokio::spawn({
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, "/slow", Some(&key), "{}", &[]).await }
    });
    // The first owner is still running (400 ms), past its 150 ms lease, but alive: it renews its
    // lease, so a retry must not take the key over and run the payment a second time.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let second = send(&app, "/slow", Some(&key), "{}", &[]).await;
    assert_eq!(second.status, StatusCode::CONFLICT, "{:?}", second.json());
    assert_eq!(second.outcome, Some(Outcome::InProgress));
    assert_eq!(first.await.unwrap().json()["payment"], 1);
    let third = send(&app, "/slow", Some(&key), "{}", &[]).await;
    assert!(third.replayed());
    assert_eq!(third.json()["payment"], 1);
    assert_eq!(effects.count(), 1);
}

/// A claim whose owner died (claimed through the store, never renewed nor completed) is taken
/// over after its lease, and the dead owner's token can no longer complete the key.
async fn a_dead_owner_is_taken_over_and_its_token_can_no_longer_complete<S: Backend>(
    store: S,
    _db: Db,
) {
    use oncely::store::{Claim, ClaimRequest, Completion, ManualClock};
    let clock = ManualClock::starting_now();
    let store = store.with_clock(clock.clone());
    let (app, effects) = counted(store.clone());
    let key = new_key();
    let (scope, fingerprint) = direct(&secret(), "/slow", &key);
    let claim = ClaimRequest {
        scope: &scope,
        fingerprint: &fingerprint,
        lease: Duration::from_millis(100),
        retention: Duration::from_secs(3600),
    };
    let Claim::Acquired { token: dead, .. } = store.claim(&claim).await.unwrap() else {
        panic!("the key was free")
    };
    clock.advance(Duration::from_millis(200));
    let retry = send(&app, "/slow", Some(&key), "{}", &[]).await;
    assert_eq!(retry.outcome, Some(Outcome::Created), "{:?}", retry.json());
    let late = Completion::Tombstone {
        reason: "the dead owner".into(),
    };
    assert!(!store.complete(&scope, dead, &late).await.unwrap());
    let again = send(&app, "/slow", Some(&key), "{}", &[]).await;
    assert!(again.replayed());
    assert_eq!(again.json(), retry.json());
    assert_eq!(effects.count(), 1);
}

async fn a_transactional_handler_past_its_lease_is_rolled_back<S: Backend>(store: S, _db: Db) {
    let app = app(store.clone(), Effects::default(), |l| {
        l.lease(Duration::from_millis(200))
    });
    let key = new_key();
    let a = send(&app, "/tx/hang", Some(&key), "{}", &[]).await;
    a.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "request-timeout");
    assert_eq!(store.count_effects().await, 0);
    assert_eq!(a.outcome, Some(Outcome::Released));
}

/// Over a real socket: the client times out while the handler runs; the server still commits;
/// the retry gets the stored result.
async fn a_client_that_gives_up_after_commit_gets_the_replay_on_retry<S: Backend>(
    store: S,
    _db: Db,
) {
    let effects = Effects::default();
    let base = serve(plain(store.clone(), effects.clone())).await;
    let client = oncely_testdb::http();
    for path in ["/slow", "/tx/slow"] {
        let key = new_key();
        let gave_up = client
            .post(format!("{base}{path}"))
            .header("idempotency-key", &key)
            .timeout(Duration::from_millis(100))
            .send()
            .await;
        assert!(gave_up.is_err(), "the client should have timed out");
        tokio::time::sleep(Duration::from_millis(600)).await;
        let retry = client
            .post(format!("{base}{path}"))
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(retry.status(), 200);
        assert_eq!(retry.headers()["idempotent-replayed"], "true", "{path}");
    }
    assert_eq!(effects.count(), 1);
    assert_eq!(store.count_effects().await, 1);
}

async fn safe_methods_and_optional_keys_pass_through<S: Backend>(store: S, _db: Db) {
    let app = plain(store.clone(), Effects::default());
    let a = app
        .clone()
        .oneshot(Request::get("/health").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    let effects = Effects::default();
    let optional = app_optional(store, effects.clone());
    let a = send(&optional, "/payments", None, "{}", &[]).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(a.outcome, None);
}

fn app_optional<S: Backend>(store: S, effects: Effects) -> Router {
    app(store, effects, |l| l.optional())
}

async fn the_derived_key_is_stable_per_scope<S: Backend>(store: S, _db: Db) {
    let app = plain(store, Effects::default());
    let key = new_key();
    let first = send(&app, "/tx/payments", Some(&key), "{}", &[]).await;
    let retry = send(&app, "/tx/payments", Some(&key), "{}", &[]).await;
    let other = send(&app, "/tx/payments", Some(&new_key()), "{}", &[]).await;
    let derived = first.json()["derived_key"].as_str().unwrap().to_owned();
    assert_eq!(derived.len(), 40);
    assert_eq!(retry.json()["derived_key"], derived.as_str());
    assert_ne!(other.json()["derived_key"], derived.as_str());
    assert!(
        !derived.contains(&key),
        "the derived key does not reveal the client's key"
    );
}

/// Transactional handlers whose slow pre-work (password hashing) comes before `lock()` run that
/// pre-work concurrently: no transaction, no SQLite write lock, is held before `lock()`. Each
/// of `N` requests waits at a barrier of `N` before locking, which only all of them can reach
/// if none holds the database meanwhile.
async fn transactional_pre_work_before_lock_runs_concurrently<S: Backend>(store: S, _db: Db) {
    const N: usize = 6;
    async fn handler<S: Backend>(
        Extension(barrier): Extension<Arc<tokio::sync::Barrier>>,
        tx: IdempotentTx<S::Database>,
    ) -> Result<StatusCode, TxAborted> {
        barrier.wait().await;
        S::insert_effect(&mut *tx.lock().await?, "pre-work").await;
        Ok(StatusCode::CREATED)
    }
    let app = Router::new()
        .route("/tx/pre-work", post(handler::<S>))
        .route_layer(IdempotencyLayer::transactional(store.clone(), secret()))
        .layer(Extension(Arc::new(tokio::sync::Barrier::new(N))));
    let all = futures_join(N, |_| {
        let app = app.clone();
        async move {
            send(&app, "/tx/pre-work", Some(&new_key()), "{}", &[])
                .await
                .status
        }
    });
    let statuses = tokio::time::timeout(Duration::from_secs(15), all)
        .await
        .expect("the handlers' pre-work did not overlap: a transaction was held before lock()");
    assert!(
        statuses.iter().all(|s| *s == StatusCode::CREATED),
        "{statuses:?}"
    );
    assert_eq!(store.count_effects().await, N as i64);
}

async fn a_transactional_handler_that_never_locks_is_stored_and_replayed<S: Backend>(
    store: S,
    _db: Db,
) {
    async fn handler(Extension(effects): Extension<Effects>) -> (StatusCode, Json<Value>) {
        (StatusCode::CREATED, Json(json!({"n": effects.bump()})))
    }
    let effects = Effects::default();
    let app = Router::new()
        .route("/tx/no-lock", post(handler))
        .route_layer(IdempotencyLayer::transactional(store, secret()))
        .layer(Extension(effects.clone()));
    let key = new_key();
    let first = send(&app, "/tx/no-lock", Some(&key), "{}", &[]).await;
    assert_eq!(first.outcome, Some(Outcome::Created));
    let retry = send(&app, "/tx/no-lock", Some(&key), "{}", &[]).await;
    assert!(retry.replayed());
    assert_eq!(retry.json()["n"], 1);
    let other = send(&app, "/tx/no-lock", Some(&key), r#"{"x":1}"#, &[]).await;
    assert_eq!(other.outcome, Some(Outcome::Mismatch));
    assert_eq!(effects.count(), 1);
}

/// A handler that swallows a refused `lock()` and answers something else: the client gets what
/// the key's state says (here a replay), never the handler's answer.
async fn after_a_refused_lock_the_layer_answers_not_the_handler<S: Backend>(store: S, _db: Db) {
    async fn handler<S: Backend>(
        Extension(gate): Extension<Arc<tokio::sync::Notify>>,
        tx: IdempotentTx<S::Database>,
    ) -> (StatusCode, &'static str) {
        gate.notified().await;
        match tx.lock().await {
            Ok(mut conn) => {
                S::insert_effect(&mut conn, "refused").await;
                (StatusCode::CREATED, "stored")
            }
            Err(_) => (StatusCode::OK, "the handler's own answer"),
        }
    }
    let gate = Arc::new(tokio::sync::Notify::new());
    let app = Router::new()
        .route("/tx/refused", post(handler::<S>))
        .route_layer(IdempotencyLayer::transactional(store.clone(), secret()))
        .layer(Extension(gate.clone()));
    let key = new_key();
    // Both requests pass the fast path (no row yet), then lock one after the other.
    let first = tokio::spawn({
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, "/tx/refused", Some(&key), "{}", &[]).await }
    });
    let second = tokio::spawn({
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, "/tx/refused", Some(&key), "{}", &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.notify_one();
    let a = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if first.is_finished() || second.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(a.is_ok());
    gate.notify_one();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    for answer in [&first, &second] {
        assert_eq!(answer.status, StatusCode::CREATED);
        assert_eq!(&answer.body[..], b"stored");
    }
    assert_eq!(
        [first.replayed(), second.replayed()]
            .iter()
            .filter(|r| **r)
            .count(),
        1
    );
    assert_eq!(store.count_effects().await, 1);
}

/// SQLite: when the database's write lock stays busy past the wait, a brand-new key gets 503
/// `storage-busy` (nobody holds that key), while a key held by a concurrent request of this
/// process still gets 409 `idempotency-key-in-use`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_busy_write_lock_is_503_for_a_new_key_and_409_for_a_held_one() {
    use std::str::FromStr;
    let (_store, db) = crate::support::sqlite().await;
    let Db::Sqlite(file) = &db else {
        unreachable!()
    };
    // A pool whose busy timeout (SQLite's wait for the write lock) is short.
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(file.url())
        .unwrap()
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_millis(200));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap();
    let store = oncely::store::sqlite::SqliteKeyStore::new(pool);
    let app = Router::new()
        .route(
            "/tx/payments",
            post(tx_pay::<oncely::store::sqlite::SqliteKeyStore>),
        )
        .route(
            "/tx/slow",
            post(tx_slow::<oncely::store::sqlite::SqliteKeyStore>),
        )
        .route_layer(IdempotencyLayer::transactional(store.clone(), secret()));

    // Another writer (not a request of this layer) holds the write lock.
    let mut other = store.pool().acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *other)
        .await
        .unwrap();
    let key = new_key();
    let busy = send(&app, "/tx/payments", Some(&key), "{}", &[]).await;
    busy.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "storage-busy");
    assert_eq!(busy.headers[header::RETRY_AFTER], "1");
    assert_eq!(busy.outcome, Some(Outcome::Error));
    sqlx::query("ROLLBACK").execute(&mut *other).await.unwrap();
    drop(other);
    let retry = send(&app, "/tx/payments", Some(&key), "{}", &[]).await;
    assert_eq!(retry.outcome, Some(Outcome::Created), "the key stayed free");

    // A request with the same key holds the lock (400 ms in its transaction): 409.
    let key = new_key();
    let first = tokio::spawn({
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, "/tx/slow", Some(&key), "{}", &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = send(&app, "/tx/slow", Some(&key), "{}", &[]).await;
    second.assert_problem(StatusCode::CONFLICT, "idempotency-key-in-use");
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
}

/// A store whose first `n` completions fail, as a database blip would.
#[derive(Clone)]
struct FlakyCompletes<S> {
    inner: S,
    failures_left: Arc<AtomicUsize>,
}

impl<S: oncely::store::KeyStore> oncely::store::KeyStore for FlakyCompletes<S> {
    type Database = S::Database;

    async fn migrate(&self) -> Result<(), oncely::store::StoreError> {
        self.inner.migrate().await
    }
    async fn claim(
        &self,
        req: &oncely::store::ClaimRequest<'_>,
    ) -> Result<oncely::store::Claim, oncely::store::StoreError> {
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        scope: &oncely::Scope,
        token: oncely::store::FencingToken,
        completion: &oncely::store::Completion,
    ) -> Result<bool, oncely::store::StoreError> {
        let failing = self
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(oncely::store::StoreError::Corrupt(
                "injected completion failure",
            ));
        }
        self.inner.complete(scope, token, completion).await
    }
    async fn renew(
        &self,
        scope: &oncely::Scope,
        token: oncely::store::FencingToken,
        lease: Duration,
    ) -> Result<bool, oncely::store::StoreError> {
        self.inner.renew(scope, token, lease).await
    }
    async fn release(
        &self,
        scope: &oncely::Scope,
        token: oncely::store::FencingToken,
    ) -> Result<bool, oncely::store::StoreError> {
        self.inner.release(scope, token).await
    }
    async fn get(
        &self,
        scope: &oncely::Scope,
    ) -> Result<Option<oncely::store::Record>, oncely::store::StoreError> {
        self.inner.get(scope).await
    }
    fn now(&self) -> std::time::SystemTime {
        self.inner.now()
    }
    async fn prune(&self, limit: u32) -> Result<u64, oncely::store::StoreError> {
        self.inner.prune(limit).await
    }
    async fn claim_in_transaction(
        &self,
        req: &oncely::store::ClaimRequest<'_>,
        wait: Duration,
    ) -> Result<
        oncely::store::Claim<oncely::store::KeyTransaction<Self::Database>>,
        oncely::store::StoreError,
    > {
        self.inner.claim_in_transaction(req, wait).await
    }
    async fn complete_in_transaction(
        &self,
        tx: &mut sqlx::Transaction<'static, Self::Database>,
        scope: &oncely::Scope,
        token: oncely::store::FencingToken,
        completion: &oncely::store::Completion,
    ) -> Result<bool, oncely::store::StoreError> {
        self.inner
            .complete_in_transaction(tx, scope, token, completion)
            .await
    }
}

async fn a_failed_completion_is_retried<S: Backend>(store: S, _db: Db) {
    let effects = Effects::default();
    let flaky = FlakyCompletes {
        inner: store,
        failures_left: Arc::new(AtomicUsize::new(3)),
    };
    let app = Router::new()
        .route("/payments", post(pay))
        .route_layer(
            IdempotencyLayer::generic(flaky.clone(), secret()).wait(Duration::from_millis(100)),
        )
        .layer(Extension(effects.clone()));
    let key = new_key();
    let first = send(&app, "/payments", Some(&key), "{}", &[]).await;
    assert_eq!(first.outcome, Some(Outcome::Created));
    assert_eq!(flaky.failures_left.load(Ordering::SeqCst), 0);
    // The result was stored despite the failed writes: the retry replays it at once.
    let retry = send(&app, "/payments", Some(&key), "{}", &[]).await;
    assert!(retry.replayed(), "{:?}", retry.json());
    assert_eq!(retry.body, first.body);
    assert_eq!(effects.count(), 1);
}

/// Keys completed under secret A replay on a layer whose secret is B with A as previous;
/// with B alone they are another request (422).
async fn a_rotated_secret_still_replays_with_the_previous_one_in_its_ring<S: Backend>(
    store: S,
    _db: Db,
) {
    let a = secret();
    let b = oncely::ServerSecret::new(b"the-next-secret-the-next-secret-!".to_vec()).unwrap();
    let layer_app = |secret: oncely::ServerSecret, effects: Effects| {
        Router::new()
            .route("/payments", post(pay))
            .route("/tx/payments", post(tx_pay::<S>))
            .route_layer(IdempotencyLayer::generic(store.clone(), secret.clone()))
            .layer(Extension(effects))
    };
    let tx_app = |secret: oncely::ServerSecret| {
        Router::new()
            .route("/tx/payments", post(tx_pay::<S>))
            .route_layer(IdempotencyLayer::transactional(store.clone(), secret))
    };
    let effects = Effects::default();
    let key = new_key();
    let tx_key = new_key();
    let before = send(
        &layer_app(a.clone(), effects.clone()),
        "/payments",
        Some(&key),
        "{}",
        &[],
    )
    .await;
    let tx_before = send(&tx_app(a.clone()), "/tx/payments", Some(&tx_key), "{}", &[]).await;
    assert_eq!(before.outcome, Some(Outcome::Created));
    assert_eq!(tx_before.outcome, Some(Outcome::Created));

    let rotated = b.clone().with_previous(vec![a.clone()]);
    let after = send(
        &layer_app(rotated.clone(), effects.clone()),
        "/payments",
        Some(&key),
        "{}",
        &[],
    )
    .await;
    assert!(after.replayed(), "{:?}", after.json());
    assert_eq!(after.body, before.body);
    let tx_after = send(&tx_app(rotated), "/tx/payments", Some(&tx_key), "{}", &[]).await;
    assert!(tx_after.replayed(), "{:?}", tx_after.json());

    let without = send(
        &layer_app(b.clone(), effects.clone()),
        "/payments",
        Some(&key),
        "{}",
        &[],
    )
    .await;
    assert_eq!(without.outcome, Some(Outcome::Mismatch));
    let tx_without = send(&tx_app(b), "/tx/payments", Some(&tx_key), "{}", &[]).await;
    assert_eq!(tx_without.outcome, Some(Outcome::Mismatch));
    assert_eq!(effects.count(), 1);
    assert_eq!(store.count_effects().await, 1);
}

/// A claim made under secret A whose owner died is taken over after rotation to B (A kept as
/// previous), and the handler gets the same derived key it had under A.
async fn a_dead_owner_under_a_previous_secret_is_taken_over_with_its_derived_key<S: Backend>(
    store: S,
    _db: Db,
) {
    use oncely::store::{Claim, ClaimRequest, ManualClock};
    let clock = ManualClock::starting_now();
    let store = store.with_clock(clock.clone());
    let a = secret();
    let b = oncely::ServerSecret::new(b"the-next-secret-the-next-secret-!".to_vec()).unwrap();
    let key = new_key();
    let (scope, fingerprint) = direct(&a, "/payments", &key);
    let claim = ClaimRequest {
        scope: &scope,
        fingerprint: &fingerprint,
        lease: Duration::from_millis(100),
        retention: Duration::from_secs(3600),
    };
    let Claim::Acquired { .. } = store.claim(&claim).await.unwrap() else {
        panic!("the key was free")
    };
    clock.advance(Duration::from_millis(200));
    let effects = Effects::default();
    let app = Router::new()
        .route("/payments", post(pay))
        .route_layer(
            IdempotencyLayer::generic(store.clone(), b.with_previous(vec![a.clone()]))
                .wait(Duration::from_millis(300)),
        )
        .layer(Extension(effects.clone()));
    let retry = send(&app, "/payments", Some(&key), "{}", &[]).await;
    assert_eq!(retry.outcome, Some(Outcome::Created), "{:?}", retry.json());
    assert_eq!(
        retry.json()["derived_key"],
        DerivedKey::for_scope(&a, &scope).as_str()
    );
    assert_eq!(effects.count(), 1);
}

/// Two app instances, each with its own pool, share one PostgreSQL database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_requests_over_two_app_instances_commit_once() {
    let (store_a, db) = postgres().await;
    let store_b = postgres_again(&db).await;
    let generic_effects = Effects::default();
    let a = serve(plain(store_a.clone(), generic_effects.clone())).await;
    let b = serve(plain(store_b, generic_effects.clone())).await;
    let client = oncely_testdb::http();
    for path in ["/tx/payments", "/payments"] {
        let key = new_key();
        let answers = futures_join(50, |i| {
            let url = format!("{}{path}", if i % 2 == 0 { &a } else { &b });
            let (client, key) = (client.clone(), key.clone());
            async move {
                let r = client
                    .post(url)
                    .header("idempotency-key", key)
                    .json(&json!({"n": 1}))
                    .send()
                    .await
                    .unwrap();
                (r.status(), r.bytes().await.unwrap())
            }
        })
        .await;
        for (status, body) in &answers {
            assert_eq!(*status, StatusCode::CREATED);
            assert_eq!(body, &answers[0].1);
        }
    }
    assert_eq!(store_a.count_effects().await, 1);
    assert_eq!(generic_effects.count(), 1);
}

/// The outcome is counted in metrics with its route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_counted_per_route() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only global recorder in this test binary");
    let (store, _db) = crate::support::sqlite().await;
    // A route no other test uses: the recorder is global and tests run in parallel.
    let app = Router::new()
        .route("/metrics-probe", post(pay))
        .route_layer(IdempotencyLayer::generic(store, secret()))
        .layer(Extension(Effects::default()));
    let key = new_key();
    send(&app, "/metrics-probe", Some(&key), "{}", &[]).await;
    send(&app, "/metrics-probe", Some(&key), "{}", &[]).await;
    send(&app, "/metrics-probe", Some(&key), "{\"other\":1}", &[]).await;
    send(&app, "/metrics-probe", None, "{}", &[]).await;
    let counts: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "oncely_idempotency_requests_total")
        .filter(|(k, ..)| {
            k.key()
                .labels()
                .any(|l| l.key() == "route" && l.value() == "/metrics-probe")
        })
        .filter_map(|(k, _, _, v)| match v {
            DebugValue::Counter(n) => Some((
                k.key()
                    .labels()
                    .find(|l| l.key() == "outcome")
                    .unwrap()
                    .value()
                    .to_owned(),
                n,
            )),
            _ => None,
        })
        .collect();
    for outcome in ["created", "replayed", "mismatch", "invalid"] {
        assert!(
            counts.contains(&(outcome.to_owned(), 1)),
            "{outcome} in {counts:?}"
        );
    }
    // Without a matched route the label is fixed, never the raw path.
    let (store, _db) = crate::support::sqlite().await;
    let unmatched = unmatched_service(store);
    for id in 0..3 {
        let path = format!("/metrics-probe-unmatched/{id}");
        send_to(&unmatched, &path, &new_key()).await;
    }
    let routes: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "oncely_idempotency_requests_total")
        .flat_map(|(k, ..)| {
            k.key()
                .labels()
                .filter(|l| l.key() == "route")
                .map(|l| l.value().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        routes.iter().any(|r| r == oncely::layer::UNMATCHED_ROUTE),
        "{routes:?}"
    );
    assert!(
        !routes
            .iter()
            .any(|r| r.starts_with("/metrics-probe-unmatched")),
        "{routes:?}"
    );
}

/// The layer around a bare service: no router, so no `MatchedPath`.
fn unmatched_service<S: Backend>(
    store: S,
) -> oncely::layer::IdempotencyService<
    tower::util::BoxCloneService<Request, Response, std::convert::Infallible>,
    S,
> {
    use tower::Layer;
    let counter = Arc::new(AtomicUsize::new(0));
    let inner = tower::service_fn(move |req: Request| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok::<_, std::convert::Infallible>(
                Json(json!({"n": n, "path": req.uri().path()})).into_response(),
            )
        }
    });
    IdempotencyLayer::generic(store, secret()).layer(tower::util::BoxCloneService::new(inner))
}

async fn send_to<Svc>(service: &Svc, path: &str, key: &str) -> (StatusCode, Value)
where
    Svc: tower::Service<Request, Response = Response, Error = std::convert::Infallible> + Clone,
{
    let req = Request::post(path)
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{}"))
        .unwrap();
    let response = service.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Outside a router, one key on two paths is one scope: the second path is a 422, not a new
/// scope per raw path (and not the first path's answer).
async fn without_a_matched_route_the_scope_is_fixed_and_the_path_is_fingerprinted<S: Backend>(
    store: S,
    _db: Db,
) {
    let service = unmatched_service(store.clone());
    let key = new_key();
    let (status, first) = send_to(&service, "/things/1", &key).await;
    assert_eq!(status, StatusCode::OK);
    let (status, retry) = send_to(&service, "/things/1", &key).await;
    assert_eq!((status, &retry), (StatusCode::OK, &first));
    let (status, other) = send_to(&service, "/things/2", &key).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    assert_eq!(
        other["type"],
        "https://oncely.dev/problems/idempotency-key-reused"
    );
    let scope = oncely::Scope::new(
        TenantId::default(),
        "POST",
        oncely::layer::UNMATCHED_ROUTE,
        oncely::IdempotencyKey::parse(&key).unwrap(),
    );
    assert!(
        oncely::store::KeyStore::get(&store, &scope)
            .await
            .unwrap()
            .is_some(),
        "the key is stored under the fixed route"
    );
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Runs `n` futures at once on the runtime's threads and collects their answers in order.
async fn futures_join<F, Fut, T>(n: usize, make: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = (0..n).map(|i| tokio::spawn(make(i))).collect();
    let mut out = Vec::with_capacity(n);
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// Rows stored before the fingerprint covered the concrete path and the query (v1: method,
/// route template, body with serde_json's numbers) still replay their retries after an
/// upgrade, instead of answering 422 to requests that were in flight during the deploy.
async fn a_row_the_previous_release_stored_still_replays_after_the_upgrade<S: Backend>(
    store: S,
    _db: Db,
) {
    use oncely::store::{Claim, ClaimRequest, Completion, StoredResponse};
    let secret = secret();
    let key = new_key();
    let scope = oncely::Scope::new(
        TenantId::default(),
        "POST",
        "/payments",
        oncely::IdempotencyKey::parse(&key).unwrap(),
    );
    // What the previous release computed and stored, written out by hand.
    let v1 = oncely::Fingerprint::from_bytes(&secret.mac(
        "oncely/fingerprint/v1",
        &[b"POST", b"/payments", br#"{"amount":10,"note":"x"}"#],
    ))
    .unwrap();
    let claim = ClaimRequest {
        scope: &scope,
        fingerprint: &v1,
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
    };
    let Claim::Acquired { token, .. } = store.claim(&claim).await.unwrap() else {
        panic!("the key was free")
    };
    let stored = StoredResponse::new(
        201,
        &HeaderMap::new(),
        bytes::Bytes::from_static(br#"{"payment":"from-v1"}"#),
    );
    assert!(
        store
            .complete(&scope, token, &Completion::Response(stored))
            .await
            .unwrap()
    );
    let (app, effects) = counted(store);
    let retry = send(
        &app,
        "/payments",
        Some(&key),
        r#"{ "note": "x", "amount": 10 }"#,
        &[],
    )
    .await;
    assert!(retry.replayed(), "{:?}", retry.json());
    assert_eq!(retry.json()["payment"], "from-v1");
    let other = send(
        &app,
        "/payments",
        Some(&key),
        r#"{"amount":11,"note":"x"}"#,
        &[],
    )
    .await;
    assert_eq!(other.outcome, Some(Outcome::Mismatch));
    assert_eq!(effects.count(), 0);
}

/// A body that yields one chunk, then fails.
struct FailingBody {
    sent: bool,
}

impl http_body::Body for FailingBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.sent {
            return std::task::Poll::Ready(Some(Err(std::io::Error::other("cut"))));
        }
        self.sent = true;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            b"{\"paid\":",
        )))))
    }
}

/// A handler that ran (its effect happened) and whose body then failed has no answer to
/// store, but must not run again: generic mode tombstones the key (a retry gets 422). In
/// transactional mode the failure rolls the transaction back, so the key is free again.
async fn a_body_that_fails_after_the_generic_handler_ran_keeps_the_key<S: Backend>(
    store: S,
    _db: Db,
) {
    async fn generic(Extension(effects): Extension<Effects>) -> Response {
        effects.bump();
        Response::new(Body::new(FailingBody { sent: false }))
    }
    async fn transactional<S: Backend>(
        tx: IdempotentTx<S::Database>,
    ) -> Result<Response, TxAborted> {
        S::insert_effect(&mut *tx.lock().await?, "cut").await;
        Ok(Response::new(Body::new(FailingBody { sent: false })))
    }
    let effects = Effects::default();
    let app = Router::new()
        .route("/cut", post(generic))
        .route_layer(IdempotencyLayer::generic(store.clone(), secret()))
        .merge(
            Router::new()
                .route("/tx/cut", post(transactional::<S>))
                .route_layer(IdempotencyLayer::transactional(store.clone(), secret())),
        )
        .layer(Extension(effects.clone()));
    let key = new_key();
    let first = send(&app, "/cut", Some(&key), "{}", &[]).await;
    first.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "internal-error");
    assert!(
        first.json()["detail"]
            .as_str()
            .unwrap()
            .contains("not run again"),
        "{:?}",
        first.json()
    );
    let retry = send(&app, "/cut", Some(&key), "{}", &[]).await;
    retry.assert_problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-unreplayable",
    );
    assert_eq!(effects.count(), 1, "the handler ran once");

    let key = new_key();
    for _ in 0..2 {
        let answer = send(&app, "/tx/cut", Some(&key), "{}", &[]).await;
        answer.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "internal-error");
    }
    assert_eq!(
        store.count_effects().await,
        0,
        "both transactions rolled back: the key was free for the retry"
    );
}

/// A handler that cannot tell whether its effect happened (a gateway whose upstream timed out
/// after the request was sent) marks its answer `OutcomeUnknown`: the key is kept, and retries
/// get 422 with the reason, never a second run.
async fn an_answer_marked_outcome_unknown_keeps_the_key<S: Backend>(store: S, _db: Db) {
    async fn lost(Extension(effects): Extension<Effects>) -> Response {
        effects.bump();
        let mut response = StatusCode::BAD_GATEWAY.into_response();
        response
            .extensions_mut()
            .insert(oncely::OutcomeUnknown::new(
                "the upstream timed out after 1 s",
            ));
        response
    }
    let effects = Effects::default();
    let app = Router::new()
        .route("/lost", post(lost))
        .route("/fail", post(fail))
        .route_layer(IdempotencyLayer::generic(store, secret()))
        .layer(Extension(effects.clone()));
    let key = new_key();
    let first = send(&app, "/lost", Some(&key), "{}", &[]).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    for _ in 0..2 {
        let retry = send(&app, "/lost", Some(&key), "{}", &[]).await;
        retry.assert_problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-unreplayable",
        );
        assert!(
            retry.json()["detail"]
                .as_str()
                .unwrap()
                .contains("the upstream timed out after 1 s"),
            "{:?}",
            retry.json()
        );
    }
    assert_eq!(effects.count(), 1);
    // Unmarked, the same 5xx releases the key: a retry runs.
    let key = new_key();
    send(&app, "/fail", Some(&key), "{}", &[]).await;
    send(&app, "/fail", Some(&key), "{}", &[]).await;
    assert_eq!(effects.count(), 3);
}

/// Outside a router, a `RouteTemplate` extension names the route: paths of one template share
/// its scope (another path with the key is a 422), and the row is stored under the template.
async fn a_route_template_extension_is_the_scope_outside_a_router<S: Backend>(store: S, _db: Db) {
    let service = tower::ServiceBuilder::new()
        .map_request(|mut req: Request| {
            req.extensions_mut()
                .insert(oncely::layer::RouteTemplate::new("/orders/{id}/pay"));
            req
        })
        .service(unmatched_service(store.clone()));
    let key = new_key();
    let (status, first) = send_to(&service, "/orders/1/pay", &key).await;
    assert_eq!(status, StatusCode::OK);
    let (status, again) = send_to(&service, "/orders/1/pay", &key).await;
    assert_eq!((status, &again), (StatusCode::OK, &first));
    let (status, other) = send_to(&service, "/orders/2/pay", &key).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    let at = |route: &str| {
        oncely::Scope::new(
            TenantId::default(),
            "POST",
            route,
            oncely::IdempotencyKey::parse(&key).unwrap(),
        )
    };
    let stored = |route: &'static str| {
        let (store, scope) = (store.clone(), at(route));
        async move { oncely::store::KeyStore::get(&store, &scope).await.unwrap() }
    };
    assert!(stored("/orders/{id}/pay").await.is_some());
    assert!(stored(oncely::layer::UNMATCHED_ROUTE).await.is_none());
}
