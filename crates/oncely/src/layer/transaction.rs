//! The transaction a transactional layer hands to its handler.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use axum::extract::FromRequestParts;
use http::StatusCode;
use http::request::Parts;
use sqlx::{Database, Transaction};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use crate::{DerivedKey, Problem};

type Slot<DB> = Arc<Mutex<Option<Transaction<'static, DB>>>>;

/// The open transaction of a transactional [`IdempotencyLayer`](super::IdempotencyLayer): an
/// axum extractor. Write the business rows through it; the layer stores the response in the
/// same transaction and commits. Do not commit it yourself, and do not keep it past the handler.
///
/// ```no_run
/// use oncely::IdempotentTx;
/// use sqlx::Sqlite;
///
/// async fn create_payment(tx: IdempotentTx<Sqlite>) -> &'static str {
///     let mut conn = tx.lock().await;
///     sqlx::query("INSERT INTO payments (amount) VALUES (10)")
///         .execute(&mut *conn)
///         .await
///         .unwrap();
///     "paid"
/// }
/// ```
pub struct IdempotentTx<DB: Database> {
    slot: Slot<DB>,
    derived_key: DerivedKey,
}

impl<DB: Database> Clone for IdempotentTx<DB> {
    fn clone(&self) -> Self {
        Self {
            slot: self.slot.clone(),
            derived_key: self.derived_key.clone(),
        }
    }
}

impl<DB: Database> IdempotentTx<DB> {
    pub(crate) fn new(tx: Transaction<'static, DB>, derived_key: DerivedKey) -> Self {
        Self {
            slot: Arc::new(Mutex::new(Some(tx))),
            derived_key,
        }
    }

    /// Locks the transaction for use; the guard dereferences to the database connection.
    pub async fn lock(&self) -> TxGuard<'_, DB> {
        let guard = self.slot.lock().await;
        TxGuard(MutexGuard::map(guard, |tx| {
            tx.as_mut()
                .expect("the transaction is used after its request finished")
        }))
    }

    /// The key to forward to downstream systems for this request's scope.
    pub fn derived_key(&self) -> &DerivedKey {
        &self.derived_key
    }

    /// Takes the transaction back once the handler is done; `None` if the handler still holds it.
    pub(crate) fn take(&self) -> Option<Transaction<'static, DB>> {
        self.slot.try_lock().ok()?.take()
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
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal-error",
                "Server misconfigured",
            )
            .with_detail("this route is not behind a transactional IdempotencyLayer")
        })
    }
}
