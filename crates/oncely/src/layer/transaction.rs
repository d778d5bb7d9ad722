//! The transaction a transactional layer hands to its handler.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use sqlx::{Database, Transaction};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use super::outcome::Answer;
use crate::problem::ProblemType;
use crate::store::{FencingToken, KeyTransaction};
use crate::{DerivedKey, Problem};

/// A claim made in a transaction: its fencing token and the open transaction.
pub(crate) struct Claimed<DB: Database> {
    pub(crate) token: FencingToken,
    pub(crate) tx: KeyTransaction<DB>,
}

type ClaimFuture<DB> = Pin<Box<dyn Future<Output = Result<Claimed<DB>, Answer>> + Send>>;

/// Opens the transaction and claims the key in it (with the bounded wait).
pub(crate) type ClaimFn<DB> = Box<dyn Fn() -> ClaimFuture<DB> + Send + Sync>;

/// Where the handler's transaction stands.
pub(crate) enum TxState<DB: Database> {
    /// `lock()` was never called: no transaction, no claim.
    Unclaimed,
    /// The key is claimed in this open transaction.
    Held(Claimed<DB>),
    /// The claim did not acquire the key; this is what the layer answers instead (replay, 422,
    /// 409, 503).
    Refused(Answer),
    /// The layer took the state back.
    Taken,
}

struct Shared<DB: Database> {
    state: Mutex<TxState<DB>>,
    claim: ClaimFn<DB>,
    derived_key: DerivedKey,
}

/// The transaction of a transactional [`IdempotencyLayer`](super::IdempotencyLayer): an axum
/// extractor. The key is claimed lazily, by the first [`lock`](Self::lock): do slow work that
/// needs no database (hashing a password, calling a validator) *before* it, and no transaction
/// (on SQLite: no write lock) is held meanwhile. Write the business rows through the guard; the
/// layer stores the response in the same transaction and commits. Do not commit it yourself,
/// and do not keep it past the handler.
///
/// If `lock` fails, the key was not acquired (a finished request with this key is replayed, a
/// different request with it is a 422, a concurrent one a 409, the store is unavailable): return
/// the error (`tx.lock().await?`); the layer ignores the handler's response and answers what the
/// claim found.
///
/// ```no_run
/// use oncely::{IdempotentTx, TxAborted};
/// use sqlx::Sqlite;
///
/// async fn create_payment(tx: IdempotentTx<Sqlite>) -> Result<&'static str, TxAborted> {
///     // … validation and slow pre-work here, before the key is claimed …
///     let mut conn = tx.lock().await?;
///     sqlx::query("INSERT INTO payments (amount) VALUES (10)")
///         .execute(&mut *conn)
///         .await
///         .unwrap();
///     Ok("paid")
/// }
/// ```
pub struct IdempotentTx<DB: Database> {
    shared: Arc<Shared<DB>>,
}

impl<DB: Database> Clone for IdempotentTx<DB> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

/// [`IdempotentTx::lock`] did not acquire the key: the request is answered by the layer (a
/// replay, 422, 409 or 503), whatever the handler returns. Return it (`?`) from the handler.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the idempotency key was not acquired; the layer answers this request")]
pub struct TxAborted;

/// Under the layer this response never reaches a client (the layer answers from the key's
/// state instead); it is a 409 in case a handler's answer is used elsewhere.
impl From<TxAborted> for Problem {
    fn from(_: TxAborted) -> Self {
        ProblemType::KeyInUse
            .problem()
            .with_detail("the key was not acquired; the idempotency layer answers this request from the key's state")
        .with_retry_after(1)
    }
}

impl IntoResponse for TxAborted {
    fn into_response(self) -> Response {
        Problem::from(self).into_response()
    }
}

impl<DB: Database> IdempotentTx<DB> {
    pub(crate) fn new(claim: ClaimFn<DB>, derived_key: DerivedKey) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(TxState::Unclaimed),
                claim,
                derived_key,
            }),
        }
    }

    /// Locks the transaction for use; the guard dereferences to the database connection. The
    /// first call opens the transaction and claims the key in it (waiting a bounded time for a
    /// concurrent request with the same key); [`TxAborted`] if the key was not acquired.
    pub async fn lock(&self) -> Result<TxGuard<'_, DB>, TxAborted> {
        let mut state = self.shared.state.lock().await;
        if matches!(*state, TxState::Unclaimed) {
            *state = match (self.shared.claim)().await {
                Ok(claimed) => TxState::Held(claimed),
                Err(refusal) => TxState::Refused(refusal),
            };
        }
        MutexGuard::try_map(state, |state| match state {
            TxState::Held(claimed) => Some(&mut *claimed.tx),
            _ => None,
        })
        .map(TxGuard)
        .map_err(|_| TxAborted)
    }

    /// The key to forward to downstream systems for this request's scope.
    pub fn derived_key(&self) -> &DerivedKey {
        &self.shared.derived_key
    }

    /// Takes the state back once the handler is done; `None` if the handler still holds it.
    pub(crate) fn take(&self) -> Option<TxState<DB>> {
        let mut state = self.shared.state.try_lock().ok()?;
        Some(std::mem::replace(&mut *state, TxState::Taken))
    }
}

/// A locked [`IdempotentTx`]: dereferences to the connection, so `execute(&mut *guard)` works.
pub struct TxGuard<'a, DB: Database>(MappedMutexGuard<'a, Transaction<'static, DB>>);

impl<DB: Database> Deref for TxGuard<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<DB: Database> DerefMut for TxGuard<'_, DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<DB: Database, S: Send + Sync> FromRequestParts<S> for IdempotentTx<DB> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Self>().cloned().ok_or_else(|| {
            ProblemType::InternalError
                .problem()
                .with_detail("this route is not behind a transactional IdempotencyLayer")
        })
    }
}
