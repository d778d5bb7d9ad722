//! A second flow on the same machinery, not email: `POST /v1/subscriptions` creates a
//! subscription and a `charge` job in one transaction (the idempotency layer's); a worker runs
//! the job by calling a payment API with the job's stable key as `Idempotency-Key`.
//!
//! - [`app`]: the route, behind the transactional idempotency layer.
//! - [`ChargeHandler`]: the job: charge, then mark the subscription active.
//! - [`FakeProvider`]: a payment API that counts requests and deduplicates by key, as real
//!   ones (Stripe, Adyen) do; the demo and the tests use it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use oncely::store::KeyStore;
use oncely::store::sqlite::SqliteKeyStore;
use oncely::{IdempotencyLayer, IdempotentTx, Problem, ServerSecret};
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::{Delivery, Handler, Job, JobStore, NewJob};
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::{Sqlite, SqlitePool};
use uuid::Uuid;

/// The job kind.
pub const CHARGE: &str = "charge";

/// Creates the tables: idempotency keys, outbox, subscriptions.
pub async fn migrate(keys: &SqliteKeyStore, jobs: &SqliteJobStore) -> anyhow::Result<()> {
    keys.migrate().await?;
    jobs.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS subscriptions (
             id TEXT PRIMARY KEY, customer TEXT NOT NULL, plan TEXT NOT NULL,
             amount_cents INTEGER NOT NULL, status TEXT NOT NULL DEFAULT 'pending_charge', charge_id TEXT)",
    )
    .execute(keys.pool())
    .await?;
    Ok(())
}

/// `POST /v1/subscriptions` behind the transactional idempotency layer. `jobs` is the store the
/// worker runs on: an enqueue through it wakes the worker.
pub fn app(keys: SqliteKeyStore, jobs: SqliteJobStore, secret: ServerSecret) -> Router {
    Router::new()
        .route("/v1/subscriptions", post(create))
        .route_layer(IdempotencyLayer::transactional(keys, secret))
        .with_state(jobs)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSubscription {
    customer: String,
    plan: String,
    amount_cents: i64,
}

fn invalid(detail: &str) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "invalid-request",
        "Invalid request",
    )
    .with_detail(detail)
}

/// The subscription row and its charge job, in the layer's transaction: both commit with the
/// stored response, once, however often the request is retried.
async fn create(
    State(jobs): State<SqliteJobStore>,
    tx: IdempotentTx<Sqlite>,
    Json(request): Json<NewSubscription>,
) -> Result<Response, Problem> {
    if request.customer.is_empty() || request.plan.is_empty() || request.amount_cents <= 0 {
        return Err(invalid(
            "customer and plan are required, amount_cents must be positive",
        ));
    }
    let id = Uuid::new_v4().to_string();
    let failed = |e: &dyn std::fmt::Display| {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal-error",
            "Internal error",
        )
        .with_detail(e.to_string())
    };
    let mut conn = tx.lock().await?;
    sqlx::query(
        "INSERT INTO subscriptions (id, customer, plan, amount_cents) VALUES (?1, ?2, ?3, ?4)",
    )
    .bind(&id)
    .bind(&request.customer)
    .bind(&request.plan)
    .bind(request.amount_cents)
    .execute(&mut *conn)
    .await
    .map_err(|e| failed(&e))?;
    // The key names the business intent: the first charge of this subscription.
    let job = NewJob::new(
        format!("charge:subscription:{id}:initial"),
        CHARGE,
        json!({ "subscription_id": id, "customer": request.customer, "amount_cents": request.amount_cents }),
    );
    jobs.enqueue(&mut conn, &job)
        .await
        .map_err(|e| failed(&e))?;
    let body = Json(json!({ "id": id, "status": "pending_charge" }));
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, format!("/v1/subscriptions/{id}"))],
        body,
    )
        .into_response())
}

/// Charges a subscription through the payment API, then marks it active.
pub struct ChargeHandler {
    /// The HTTP client (its timeout bounds a charge).
    pub client: reqwest::Client,
    /// `POST` target, e.g. `https://payments.example.com/charges`.
    pub url: String,
    /// Where the subscriptions live.
    pub pool: SqlitePool,
}

impl ChargeHandler {
    async fn charge(&self, job: &Job) -> Delivery {
        let body = json!({
            "amount": job.payload["amount_cents"],
            "customer": job.payload["customer"],
            "reference": job.payload["subscription_id"],
        });
        // The job's delivery key is stable across every attempt: a retry after an unknown
        // outcome is recognized by the provider, which answers with the first charge.
        let key = job.delivery_key.to_string();
        let answer = match oncely_outbox::http::post_json(
            &self.client,
            &self.url,
            &key,
            &body,
            None,
        )
        .await
        {
            Ok(answer) => answer,
            Err(outcome) => return outcome,
        };
        let charge_id = answer["id"].as_str().map(str::to_owned);
        let activated =
            sqlx::query("UPDATE subscriptions SET status = 'active', charge_id = ?2 WHERE id = ?1")
                .bind(job.payload["subscription_id"].as_str())
                .bind(&charge_id)
                .execute(&self.pool)
                .await;
        match activated {
            Ok(_) => Delivery::Sent {
                provider_message_id: charge_id,
            },
            // Charged but not recorded: retrying is safe (same key, same charge).
            Err(error) => Delivery::Retry(format!("charged, but recording it failed: {error}")),
        }
    }
}

impl Handler for ChargeHandler {
    fn run<'a>(&'a self, job: &'a Job) -> Pin<Box<dyn Future<Output = Delivery> + Send + 'a>> {
        Box::pin(self.charge(job))
    }
}

/// A payment API that deduplicates by `Idempotency-Key` within its memory, like a real one.
#[derive(Clone, Default)]
pub struct FakeProvider {
    charges: Arc<Mutex<HashMap<String, Value>>>,
    requests: Arc<AtomicUsize>,
    stall_after_accept: Arc<AtomicU32>,
}

impl FakeProvider {
    /// Serves `POST /charges` on a free loopback port; returns the URL of `/charges`.
    pub async fn start(&self) -> std::io::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/charges", listener.local_addr()?);
        let router = Router::new()
            .route("/charges", post(charge))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Ok(url)
    }

    /// Charges made (distinct keys).
    pub fn charges(&self) -> usize {
        self.charges.lock().expect("lock").len()
    }

    /// Requests received (retries included).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// The next `n` new charges are made, and then their answer never comes (the caller times
    /// out, or dies waiting): the unknown outcome.
    pub fn stall_after_accept(&self, n: u32) {
        self.stall_after_accept.store(n, Ordering::SeqCst);
    }
}

async fn charge(
    State(provider): State<FakeProvider>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    provider.requests.fetch_add(1, Ordering::SeqCst);
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return (StatusCode::BAD_REQUEST, "Idempotency-Key required").into_response();
    };
    let (answer, new) = {
        let mut charges = provider.charges.lock().expect("lock");
        match charges.get(&key) {
            Some(answer) => (answer.clone(), false),
            None => {
                let answer = json!({ "id": format!("ch_{}", Uuid::new_v4().simple()), "amount": body["amount"] });
                charges.insert(key, answer.clone());
                (answer, true)
            }
        }
    };
    if new
        && provider
            .stall_after_accept
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    Json(answer).into_response()
}
