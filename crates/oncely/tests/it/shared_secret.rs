//! The shared secret check and the development secret, on both stores: every process of one
//! database uses one server secret, and a rotation rolls out without a refusal.

use oncely::ServerSecret;
use oncely::store::shared_secret::{
    SharedSecretError, SharedSecretStore, development_secret, require_shared_secret,
};
use secrecy::SecretString;

use crate::support::{Backend, Db, both_stores};

both_stores!(
    a_process_with_another_secret_is_refused_and_a_rotation_rolls_out,
    a_development_database_keeps_the_first_secret_it_was_given,
);

fn secret(s: &str) -> ServerSecret {
    ServerSecret::new(format!("{s}-0123456789-0123456789-abcdef").into_bytes()).unwrap()
}

/// Regression (review of issue 19): two processes of one database with different secrets each
/// answered 422 to the other's retries — and two gateways scoping by credential ran them again.
async fn a_process_with_another_secret_is_refused_and_a_rotation_rolls_out<
    S: Backend + SharedSecretStore,
>(
    store: S,
    _db: Db,
) {
    let (a, b, c) = (secret("a"), secret("b"), secret("c"));
    require_shared_secret(&store, &a)
        .await
        .expect("the first process sets it");
    require_shared_secret(&store, &a)
        .await
        .expect("the same secret");
    let error = require_shared_secret(&store, &b)
        .await
        .expect_err("another secret");
    assert!(matches!(error, SharedSecretError::Different), "{error}");
    assert!(
        error
            .to_string()
            .contains("ONCELY_SECRET is not the secret the other processes"),
        "{error}"
    );
    // A rotation from a to b. Step 1: every process accepts b (as previous) and still uses a.
    let accepting = secret("a").with_previous(vec![secret("b")]);
    require_shared_secret(&store, &accepting)
        .await
        .expect("step 1");
    require_shared_secret(&store, &a)
        .await
        .expect("a process not yet at step 1");
    // Step 2: processes switch to b, a as previous; a step-1 process restarting meanwhile is
    // fine (it verifies b), one that knows only a is not (it would run b's keys again).
    let switched = secret("b").with_previous(vec![secret("a")]);
    require_shared_secret(&store, &switched)
        .await
        .expect("step 2");
    require_shared_secret(&store, &accepting)
        .await
        .expect("a step-1 process during step 2");
    let error = require_shared_secret(&store, &a)
        .await
        .expect_err("a process that knows only a");
    assert!(error.to_string().contains("newer server secret"), "{error}");
    // Step 3: a is dropped; from then on a is refused, even with b beside it (a stale
    // replica of step 1 would make keys the others cannot find).
    require_shared_secret(&store, &b)
        .await
        .expect("the rotation ended");
    require_shared_secret(&store, &switched)
        .await
        .expect("a step-2 process still running");
    let error = require_shared_secret(&store, &accepting)
        .await
        .expect_err("a step-1 process after the rotation ended");
    assert!(error.to_string().contains("retired"), "{error}");
    require_shared_secret(&store, &c)
        .await
        .expect_err("another secret, again");
    // The next rotation: a is now two secrets ago.
    let next = secret("c").with_previous(vec![secret("b")]);
    require_shared_secret(&store, &next)
        .await
        .expect("the next rotation");
    require_shared_secret(&store, &a)
        .await
        .expect_err("a secret two rotations old");
    // Never the secret itself: the check holds keyed hashes.
    let stored = store.secret_check().await.unwrap().unwrap();
    for mac in [&stored.current]
        .into_iter()
        .chain(stored.previous.as_ref())
        .chain(&stored.retired)
    {
        assert_eq!(mac.len(), 64, "a hex HMAC-SHA256: {mac}");
        assert!(!mac.contains("0123456789"), "{mac}");
    }
}

/// The first development process stores the secret it generated; every later one, whatever it
/// generated, signs with that one (and keeps its own previous secrets).
async fn a_development_database_keeps_the_first_secret_it_was_given<
    S: Backend + SharedSecretStore,
>(
    store: S,
    _db: Db,
) {
    let first: SecretString = "first-generated-0123456789-0123456789".into();
    let second: SecretString = "second-generated-0123456789-0123456789".into();
    let mine = secret("mine").with_previous(vec![secret("old")]);
    let a = development_secret(&store, &first, &mine).await.unwrap();
    let b = development_secret(&store, &second, &mine).await.unwrap();
    let expected = ServerSecret::new(b"first-generated-0123456789-0123456789".to_vec()).unwrap();
    for got in [&a, &b] {
        assert_eq!(got.mac("t", &[]), expected.mac("t", &[]));
        assert_eq!(
            got.previous().len(),
            1,
            "the process's previous secrets are kept"
        );
        assert_eq!(got.previous()[0].mac("t", &[]), secret("old").mac("t", &[]));
    }
}
