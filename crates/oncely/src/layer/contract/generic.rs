//! Generic mode: claim (the key's own statement), run the handler while renewing the lease,
//! store the result (retried within the lease) or release the key.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::Request;
use tokio::time::Instant;

use super::{BoundedWait, answer_from_record, cached_answer, remember};
use crate::fingerprint::Fingerprints;
use crate::layer::handler::{self, Failed, Handler};
use crate::layer::outcome::{Answer, Outcome};
use crate::layer::{Config, problems};
use crate::store::{Claim, ClaimRequest, Completion, FencingToken, KeyStore, StoreError};
use crate::{DerivedKey, Scope};

/// Claim, run, store.
pub(super) async fn run<S: Handler, K: KeyStore>(
    inner: S,
    store: &K,
    config: &Config,
    claim: &ClaimRequest<'_>,
    fingerprints: &Fingerprints,
    mut req: Request<Body>,
) -> Answer {
    if let Some(answer) = cached_answer(config, store, claim.scope, fingerprints) {
        return answer;
    }
    let mut wait = BoundedWait::new(config.wait);
    // Which secret's fingerprint the claim uses: the current one, or the previous one that
    // fingerprinted an in-progress row (so its expired lease can be taken over).
    let mut secret_index = 0;
    let token = loop {
        let attempt = ClaimRequest {
            fingerprint: fingerprints.get(secret_index),
            ..claim.clone()
        };
        match store.claim(&attempt).await {
            Ok(Claim::Acquired { token, .. }) => break token,
            Ok(Claim::Existing(record)) => {
                remember(config, store, claim.scope, &record);
                if let Some(answer) = answer_from_record(&record, fingerprints) {
                    return answer;
                }
                let matched = fingerprints.position(&record.fingerprint);
                if let Some(index) = matched.filter(|i| *i != secret_index) {
                    secret_index = index;
                    continue;
                }
            }
            Ok(Claim::Busy) => {}
            Err(error) => return problems::store_failed(&error),
        }
        if !wait.pause().await {
            return problems::in_use();
        }
    };
    // Downstream calls get the key of the secret that fingerprinted the row: stable for every
    // retry of the scope, across a rotation too.
    req.extensions_mut().insert(DerivedKey::for_scope(
        fingerprints.secret(secret_index),
        claim.scope,
    ));
    // While the handler runs, renew the lease (every lease/3): only a dead owner is taken over.
    let renewing = keep_renewed(store, claim.scope, token, config.lease);
    tokio::pin!(renewing);
    let ran = tokio::select! {
        ran = handler::run(inner, req, None, config.max_stored_body) => ran,
        never = &mut renewing => match never {},
    };
    // What to keep: the response; or, where the handler ran but its answer is lost, a tombstone
    // (a retry answers 422, never runs it twice); or nothing (the key is released).
    let (completion, response) = match ran {
        Ok(response) => match response.outcome_unknown() {
            Some(unknown) => (
                Completion::Tombstone {
                    reason: unknown.reason().to_owned(),
                },
                response.into_response(),
            ),
            None if response.releases_key() => {
                release_logged(store, claim.scope, token).await;
                return (Outcome::Released, response.into_response());
            }
            None => (
                response.completion(config.max_stored_body),
                response.into_response(),
            ),
        },
        Err(Failed::BodyFailed(answer)) => (
            Completion::Tombstone {
                reason: "its response failed before it was complete".to_owned(),
            },
            answer,
        ),
        Err(Failed::Stopped(answer)) => {
            release_logged(store, claim.scope, token).await;
            return (Outcome::Released, answer);
        }
    };
    // A failed write is retried with backoff, the lease still renewed, for at most one lease.
    let stored = tokio::select! {
        stored = complete_with_retry(store, claim.scope, token, &completion, config.lease) => stored,
        never = &mut renewing => match never {},
    };
    match stored {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            route = %claim.scope.route,
            "idempotency lease lost: another request took the key over; this result is not stored"
        ),
        Err(error) => tracing::error!(
            route = %claim.scope.route, %error,
            "could not store an idempotent result after retrying; the key frees when its lease expires"
        ),
    }
    (Outcome::Created, response)
}

/// Renews the lease of `token` every `lease / 3`, for as long as it is polled. Stops renewing
/// (and waits forever) once the claim is lost; a failed renewal is logged and tried again.
async fn keep_renewed<K: KeyStore>(
    store: &K,
    scope: &Scope,
    token: FencingToken,
    lease: Duration,
) -> Infallible {
    let period = (lease / 3).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(period).await;
        match store.renew(scope, token, lease).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(route = %scope.route, "idempotency lease lost while the handler ran");
                return std::future::pending().await;
            }
            Err(error) => {
                tracing::warn!(route = %scope.route, %error, "could not renew an idempotency lease");
            }
        }
    }
}

/// Stores a completion, retrying failed writes with backoff (10 ms doubling to 1 s) for at most
/// `within`; the last error if every try failed.
async fn complete_with_retry<K: KeyStore>(
    store: &K,
    scope: &Scope,
    token: FencingToken,
    completion: &Completion,
    within: Duration,
) -> Result<bool, StoreError> {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(10);
    loop {
        match store.complete(scope, token, completion).await {
            Err(error) if Instant::now() + pause < deadline => {
                tracing::warn!(route = %scope.route, %error, "storing an idempotent result failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            done => return done,
        }
    }
}

/// Frees the key (nothing stored); a failure is logged: the key then frees when its lease ends.
async fn release_logged<K: KeyStore>(store: &K, scope: &Scope, token: FencingToken) {
    if let Err(error) = store.release(scope, token).await {
        tracing::error!(route = %scope.route, %error, "could not release a key; it frees when its lease expires");
    }
}
