//! Transactional mode: the handler's first `IdempotentTx::lock` claims the key in a
//! transaction; the handler writes its rows in it; the layer stores the result in it and
//! commits once. A rollback (or a crash) leaves the key free.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::Request;

use super::{BoundedWait, answer_from_record, cached_answer, remember};
use crate::fingerprint::Fingerprints;
use crate::layer::handler::{self, Handler};
use crate::layer::outcome::{Answer, Outcome};
use crate::layer::transaction::{ClaimFn, Claimed, TxState};
use crate::layer::{Config, IdempotentTx, problems};
use crate::store::{Claim, ClaimRequest, KeyStore, StoreError};
use crate::{DerivedKey, Scope};

/// Run the handler; its first `IdempotentTx::lock` claims the key in a transaction; store the
/// result in it, commit once. A handler that never locked is claimed for after it returns.
pub(super) async fn run<S: Handler, K: KeyStore>(
    inner: S,
    store: &K,
    config: &Config,
    claim: &ClaimRequest<'_>,
    fingerprints: &Arc<Fingerprints>,
    mut req: Request<Body>,
) -> Answer {
    // Most repeats of a key are retries of a finished request: answer those from one read,
    // without opening a transaction. Anything else (no row, in progress, expired) takes the
    // claim, which decides under the database's locks.
    if let Some(answer) = cached_answer(config, store, claim.scope, fingerprints) {
        return answer;
    }
    let finished = match store.get(claim.scope).await {
        Ok(record) => record.and_then(|record| {
            remember(config, store, claim.scope, &record);
            answer_from_record(&record, fingerprints)
        }),
        Err(error) => return problems::store_failed(&error),
    };
    if let Some(answer) = finished {
        return answer;
    }
    let tx_claim = TxClaim {
        scope: Arc::new(claim.scope.clone()),
        fingerprints: fingerprints.clone(),
        lease: claim.lease,
        retention: claim.retention,
        wait: config.wait,
    };
    let claim_fn: ClaimFn<K::Database> = {
        let (store, tx_claim) = (store.clone(), tx_claim.clone());
        Box::new(move || {
            let (store, tx_claim) = (store.clone(), tx_claim.clone());
            Box::pin(async move { tx_claim.claim(&store).await })
        })
    };
    let derived_key = DerivedKey::for_scope(&config.secret, claim.scope);
    req.extensions_mut().insert(derived_key.clone());
    let handle = IdempotentTx::<K::Database>::new(claim_fn, derived_key);
    req.extensions_mut().insert(handle.clone());
    let ran = handler::run(inner, req, Some(config.lease), config.max_stored_body).await;
    // The handler is done (or was stopped): its transaction comes back to us. Dropping it, on
    // any path below that does not commit, rolls it back and so frees the key.
    let Some(state) = handle.take() else {
        return (
            Outcome::Released,
            problems::internal_error("the handler kept its transaction"),
        );
    };
    let claimed = match state {
        // The key was not acquired: answer what the claim found, whatever the handler said.
        TxState::Refused(answer) => return answer,
        TxState::Taken => {
            return (
                Outcome::Released,
                problems::internal_error("the transaction was taken twice"),
            );
        }
        TxState::Held(claimed) => Some(claimed),
        TxState::Unclaimed => None,
    };
    let response = match ran {
        Ok(response) if !response.releases_key() => response,
        Ok(response) => return (Outcome::Released, response.into_response()),
        // Its transaction rolls back (dropped below): nothing it wrote stays, the key is free.
        Err(failed) => return (Outcome::Released, failed.into_response()),
    };
    // A handler that never locked wrote nothing: claim now, in a transaction, to store its
    // result (or answer from the row a concurrent request committed meanwhile).
    let Claimed { token, mut tx } = match claimed {
        Some(claimed) => claimed,
        None => match tx_claim.claim(store).await {
            Ok(claimed) => claimed,
            Err(answer) => return answer,
        },
    };
    let completion = response.completion(config.max_stored_body);
    match store
        .complete_in_transaction(&mut tx, claim.scope, token, &completion)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            return (
                Outcome::Released,
                problems::internal_error("the key's claim was lost"),
            );
        }
        Err(error) => return problems::store_failed(&error),
    }
    if let Err(error) = tx.commit().await {
        tracing::error!(route = %claim.scope.route, %error, "commit of an idempotent request failed");
        // The commit may or may not have happened: a retry with the same key finds out.
        return problems::commit_failed();
    }
    (Outcome::Created, response.into_response())
}

/// What a transactional claim needs, owned: it runs inside the handler's `lock()`.
#[derive(Clone)]
struct TxClaim {
    scope: Arc<Scope>,
    fingerprints: Arc<Fingerprints>,
    lease: Duration,
    retention: Duration,
    wait: Duration,
}

impl TxClaim {
    /// Opens a transaction and claims the key in it, waiting a bounded time for a concurrent
    /// owner; or the answer the key's state gives (replay, 422, 409, 503).
    async fn claim<K: KeyStore>(&self, store: &K) -> Result<Claimed<K::Database>, Answer> {
        let claim = ClaimRequest {
            scope: &self.scope,
            fingerprint: self.fingerprints.current(),
            lease: self.lease,
            retention: self.retention,
        };
        let mut wait = BoundedWait::new(self.wait);
        loop {
            match store.claim_in_transaction(&claim, wait.remaining()).await {
                Ok(Claim::Acquired { token, tx }) => return Ok(Claimed { token, tx }),
                Ok(Claim::Existing(record)) => {
                    if let Some(answer) = answer_from_record(&record, &self.fingerprints) {
                        return Err(answer);
                    }
                }
                Ok(Claim::Busy) => return Err(problems::in_use()),
                // The database as a whole is busy (SQLite's write lock, held by another
                // writer): the key's committed row answers for itself; else 503.
                Err(StoreError::Busy) => {
                    return Err(match store.get(&self.scope).await {
                        Ok(Some(record)) => answer_from_record(&record, &self.fingerprints)
                            .unwrap_or_else(problems::in_use),
                        Ok(None) | Err(_) => problems::store_failed(&StoreError::Busy),
                    });
                }
                Err(error) => return Err(problems::store_failed(&error)),
            }
            if !wait.pause().await {
                return Err(problems::in_use());
            }
        }
    }
}
