//! Passwords: Argon2id with OWASP's minimum parameters (19 MiB, 2 passes, 1 lane).
//!
//! Each hash needs 19 MiB. Hashing runs on a small dedicated set of threads — one per core, at
//! most [`MAX_THREADS`] — with a short bounded queue in front: memory stays bounded however
//! many signups arrive at once (the allocator keeps freed memory per thread, so the number of
//! hashing threads bounds it too; each thread also reuses one working memory). When every thread is busy and the queue is full, [`hash`]
//! fails at once with [`HashError::Overloaded`]; the route answers 503 with `Retry-After`, the
//! idempotency key is released, and the client retries. Once the pool is half full, each
//! client (its rate-limit bucket: the address, an IPv6 /64) may hold at most a quarter of it,
//! so one client flooding password requests cannot take the pool from everyone else.

use std::collections::HashMap;
use std::future::Future;
use std::sync::mpsc::{self, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};

use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use secrecy::{ExposeSecret, SecretString};

/// Shortest and longest accepted password, in characters.
pub const LENGTH: std::ops::RangeInclusive<usize> = 8..=128;

/// Most hashing threads of the process-wide pool, whatever the core count (× 19 MiB).
pub const MAX_THREADS: usize = 8;

/// Hashes waiting per hashing thread before new ones are refused.
pub const QUEUE_PER_THREAD: usize = 4;

/// The `Retry-After` (seconds) of a refused hash.
pub const RETRY_AFTER_SECONDS: u64 = 1;

fn params() -> Params {
    Params::new(19 * 1024, 2, 1, None).expect("valid Argon2 parameters")
}

fn hasher() -> Argon2<'static> {
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params())
}

thread_local! {
    /// This thread's Argon2 working memory (19 MiB), allocated once and reused by every hash
    /// on the thread: allocating and freeing it per hash fragments the allocator's arenas
    /// (measured: ~160 MiB retained per hashing thread).
    static MEMORY: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Argon2id (our parameters) of `password` with `salt`, `len` bytes, in this thread's memory.
fn argon2_in_thread_memory(password: &[u8], salt: &[u8], len: usize) -> anyhow::Result<Output> {
    let params = params();
    let output = MEMORY.with(|memory| {
        let mut memory = memory.borrow_mut();
        if memory.len() != params.block_count() {
            *memory = vec![Block::default(); params.block_count()];
        }
        Output::init_with(len, |out| {
            hasher()
                .hash_password_into_with_memory(password, salt, out, &mut memory[..])
                .map_err(|_| argon2::password_hash::Error::Crypto)
        })
    });
    output.map_err(|e| anyhow::anyhow!("hashing a password: {e}"))
}

/// Whether `password` matches the PHC string `phc`, in this thread's memory when `phc` has our
/// parameters (any other Argon2 hash is verified the ordinary way).
fn verify_in_thread_memory(phc: &str, password: &[u8]) -> anyhow::Result<bool> {
    use argon2::PasswordVerifier;
    let parsed =
        PasswordHash::new(phc).map_err(|e| anyhow::anyhow!("a stored hash is invalid: {e}"))?;
    let (Some(salt), Some(expected), true) = (parsed.salt, parsed.hash, is_current(&parsed)) else {
        return Ok(hasher().verify_password(password, &parsed).is_ok());
    };
    let mut salt_bytes = [0u8; 64];
    let salt_bytes = salt
        .decode_b64(&mut salt_bytes)
        .map_err(|e| anyhow::anyhow!("decoding a salt: {e}"))?;
    // `Output`'s equality is constant-time.
    Ok(argon2_in_thread_memory(password, salt_bytes, expected.len())? == expected)
}

/// Whether a hash was made with our algorithm, version and parameters.
fn is_current(parsed: &PasswordHash) -> bool {
    let ours = params();
    parsed.algorithm == argon2::ARGON2ID_IDENT
        && parsed.version == Some(Version::V0x13.into())
        && Params::try_from(parsed).is_ok_and(|p| {
            (p.m_cost(), p.t_cost(), p.p_cost()) == (ours.m_cost(), ours.t_cost(), ours.p_cost())
        })
}

/// Whether the stored hash `phc` was made with another algorithm, version or parameters than
/// ours (so a successful login re-hashes the password). An unreadable one needs it too.
pub fn needs_rehash(phc: &str) -> bool {
    PasswordHash::new(phc).map_or(true, |parsed| !is_current(&parsed))
}

/// A PHC string with our parameters, a random salt and a random output, made once per process:
/// checking a password against it costs what checking a real hash costs, and never matches
/// (2⁻²⁵⁶). A login for an address without a usable password checks it, so that every failure
/// costs one Argon2 computation.
pub fn decoy() -> &'static str {
    static DECOY: OnceLock<String> = OnceLock::new();
    DECOY.get_or_init(|| {
        let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>()).expect("16 bytes encode");
        let output = Output::new(&rand::random::<[u8; Params::DEFAULT_OUTPUT_LEN]>())
            .expect("a 32-byte output");
        PasswordHash {
            algorithm: argon2::ARGON2ID_IDENT,
            version: Some(Version::V0x13.into()),
            params: ParamsString::try_from(&params()).expect("our parameters encode"),
            salt: Some(salt.as_salt()),
            hash: Some(output),
        }
        .to_string()
    })
}

/// Argon2id of `password` with a fresh salt, as a PHC string, in this thread's memory.
fn hash_in_thread_memory(password: &[u8]) -> anyhow::Result<String> {
    let params = params();
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())
        .map_err(|e| anyhow::anyhow!("encoding a salt: {e}"))?;
    let mut salt_bytes = [0u8; 64];
    let salt_bytes = salt
        .as_salt()
        .decode_b64(&mut salt_bytes)
        .map_err(|e| anyhow::anyhow!("decoding a salt: {e}"))?;
    let output = argon2_in_thread_memory(password, salt_bytes, Params::DEFAULT_OUTPUT_LEN)?;
    let phc = PasswordHash {
        algorithm: argon2::ARGON2ID_IDENT,
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(&params)
            .map_err(|e| anyhow::anyhow!("encoding Argon2 parameters: {e}"))?,
        salt: Some(salt.as_salt()),
        hash: Some(output),
    };
    Ok(phc.to_string())
}

/// Why a password was not hashed.
#[derive(Debug, thiserror::Error)]
pub enum HashError {
    /// Every hashing thread is busy and the queue is full: retry later.
    #[error("every password hasher is busy and the queue is full")]
    Overloaded,
    /// Hashing itself failed.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads with a bounded queue in front.
pub struct HashPool {
    queue: mpsc::SyncSender<Job>,
    /// Slots (running + queued) one client may hold once the pool is half full: a quarter of
    /// the pool, at least 1. Below half, a client's burst is served whole.
    per_client: usize,
    /// Half the pool's slots: from here on, each client is held to its share.
    contended: usize,
    /// Slots each client holds now; an entry leaves the map when its count drops to 0, so the
    /// map is bounded by the requests in flight.
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// One client's slot in the pool, given back when dropped (the hash finished, failed or its
/// request went away).
struct Share {
    client: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

impl HashPool {
    /// `threads` hashing threads (at least 1) and room for `queue` waiting jobs.
    pub fn new(threads: usize, queue: usize) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::sync_channel::<Job>(queue);
        let receiver = Arc::new(Mutex::new(receiver));
        for i in 0..threads.max(1) {
            let receiver = Arc::clone(&receiver);
            std::thread::Builder::new()
                .name(format!("oncely-hash-{i}"))
                .spawn(move || {
                    loop {
                        let job = match receiver.lock() {
                            Ok(receiver) => receiver.recv(),
                            Err(_) => return,
                        };
                        let Ok(job) = job else { return };
                        // A panicking job must not take its thread with it.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })?;
        }
        let capacity = threads.max(1) + queue;
        Ok(Self {
            queue: sender,
            per_client: (capacity / 4).max(1),
            contended: (capacity / 2).max(1),
            held: Arc::default(),
        })
    }

    /// Takes one of `client`'s slots, or refuses when the pool is at least half full and the
    /// client already holds its share: one client flooding password requests gets at most half
    /// the pool, and every other client still finds its share free.
    fn share(&self, client: &str) -> Result<Share, HashError> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let total: usize = held.values().sum();
        let count = held.entry(client.to_owned()).or_insert(0);
        if *count >= self.per_client && total >= self.contended {
            metrics::counter!("oncely_password_hashes_refused_total").increment(1);
            return Err(HashError::Overloaded);
        }
        *count += 1;
        Ok(Share {
            client: client.to_owned(),
            held: Arc::clone(&self.held),
        })
    }

    /// [`try_run`](Self::try_run) within `client`'s share of the pool (`None`: a caller whose
    /// address is unknown shares the pool without a per-client bound).
    pub fn try_run_for<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(
        &self,
        client: Option<&str>,
        f: F,
    ) -> Result<impl Future<Output = Result<T, HashError>> + use<T, F>, HashError> {
        let share = client.map(|c| self.share(c)).transpose()?;
        let running = self.try_run(f)?;
        Ok(async move {
            let result = running.await;
            drop(share);
            result
        })
    }

    /// Queues `f`, or refuses at once when the queue is full; the future is its result.
    pub fn try_run<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(
        &self,
        f: F,
    ) -> Result<impl Future<Output = Result<T, HashError>> + use<T, F>, HashError> {
        let (done, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = done.send(f());
        });
        match self.queue.try_send(job) {
            Ok(()) => Ok(async move {
                result
                    .await
                    .map_err(|_| HashError::Failed(anyhow::anyhow!("the hashing job panicked")))
            }),
            Err(TrySendError::Full(_)) => {
                metrics::counter!("oncely_password_hashes_refused_total").increment(1);
                Err(HashError::Overloaded)
            }
            Err(TrySendError::Disconnected(_)) => Err(HashError::Failed(anyhow::anyhow!(
                "the password hashing threads are gone"
            ))),
        }
    }

    /// Queues the hashing of a password now (or refuses at once); the future is the PHC
    /// string (`$argon2id$v=19$m=19456,t=2,p=1$…`).
    pub fn start_hash(
        &self,
        password: SecretString,
    ) -> Result<impl Future<Output = Result<String, HashError>> + use<>, HashError> {
        let hashed =
            self.try_run(move || hash_in_thread_memory(password.expose_secret().as_bytes()))?;
        Ok(async move { Ok(hashed.await??) })
    }

    /// Hashes a password into a PHC string; [`HashError::Overloaded`] when saturated.
    pub async fn hash(&self, password: SecretString) -> Result<String, HashError> {
        self.start_hash(password)?.await
    }
}

/// The process-wide pool: one thread per core (at most [`MAX_THREADS`]),
/// [`QUEUE_PER_THREAD`] waiting hashes per thread.
pub fn pool() -> &'static HashPool {
    static POOL: OnceLock<HashPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_THREADS);
        HashPool::new(threads, threads * QUEUE_PER_THREAD)
            .expect("starting the password hashing threads")
    })
}

/// Hashes a password on the process-wide pool; [`HashError::Overloaded`] when it is saturated.
pub async fn hash(password: SecretString) -> Result<String, HashError> {
    pool().hash(password).await
}

/// [`hash`] within the share of the pool of `client` (a rate-limit bucket of the caller's
/// address): [`HashError::Overloaded`] when the pool is saturated or this client holds its
/// share already.
pub async fn hash_for(client: Option<&str>, password: SecretString) -> Result<String, HashError> {
    let hashed = pool().try_run_for(client, move || {
        hash_in_thread_memory(password.expose_secret().as_bytes())
    })?;
    Ok(hashed.await??)
}

/// Whether `password` matches the PHC string `phc`, on the process-wide pool (a check costs
/// what a hash costs) within `client`'s share of it; [`HashError::Overloaded`] as with
/// [`hash_for`].
pub async fn verify(
    client: Option<&str>,
    phc: &str,
    password: SecretString,
) -> Result<bool, HashError> {
    let phc = phc.to_owned();
    let checked = pool().try_run_for(client, move || {
        verify_in_thread_memory(&phc, password.expose_secret().as_bytes())
    })?;
    Ok(checked.await??)
}

/// What [`verify_and_rehash`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// Not the password.
    Mismatch,
    /// The password; `rehashed` is its hash with our parameters when the stored one
    /// [`needs_rehash`].
    Match {
        /// The new PHC string to store in place of the old one.
        rehashed: Option<String>,
    },
}

/// [`verify`], and when the password matches a hash of other parameters, its new hash — in one
/// job of the pool, within `client`'s share.
pub async fn verify_and_rehash(
    client: Option<&str>,
    phc: &str,
    password: SecretString,
) -> Result<Verified, HashError> {
    let phc = phc.to_owned();
    let checked = pool().try_run_for(client, move || {
        let password = password.expose_secret().as_bytes();
        if !verify_in_thread_memory(&phc, password)? {
            return Ok(Verified::Mismatch);
        }
        let rehashed = match needs_rehash(&phc) {
            true => Some(hash_in_thread_memory(password)?),
            false => None,
        };
        anyhow::Ok(Verified::Match { rehashed })
    })?;
    Ok(checked.await??)
}

#[cfg(test)]
mod tests {
    use argon2::{PasswordHash, PasswordVerifier};

    use super::*;

    fn verifies(phc: &str, password: &str) -> bool {
        let parsed = PasswordHash::new(phc).unwrap();
        super::hasher()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    }

    /// The hash of the password the tests use.
    async fn hashed() -> String {
        super::hash("correct horse battery".to_owned().into())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn verify_checks_our_hashes_in_thread_memory_and_others_too() {
        let ours = hashed().await;
        let checks = async |hash: &str, password: &str| {
            verify(None, hash, password.to_owned().into())
                .await
                .unwrap()
        };
        assert!(checks(&ours, "correct horse battery").await);
        assert!(!checks(&ours, "correct horse batterY").await);
        // A hash with other parameters (an older deployment's) still verifies.
        use argon2::PasswordHasher;
        let salt = SaltString::encode_b64(&[7; 16]).unwrap();
        let other = Argon2::new(
            Algorithm::Argon2id,
            Version::V0x13,
            Params::new(8 * 1024, 3, 1, None).unwrap(),
        )
        .hash_password(b"another one", &salt)
        .unwrap()
        .to_string();
        assert!(checks(&other, "another one").await);
        assert!(!checks(&other, "not it").await);
        assert!(
            verify(None, "not a phc string", "x".to_owned().into())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn hashes_are_argon2id_with_owasp_parameters_and_verify() {
        let phc = hashed().await;
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{phc}");
        assert!(verifies(&phc, "correct horse battery"));
        assert!(!verifies(&phc, "wrong"));
    }

    /// One thread's reused working memory gives correct, independent hashes.
    #[tokio::test]
    async fn hashes_in_reused_thread_memory_verify() {
        let pool = HashPool::new(1, 4).unwrap();
        let mut hashes = Vec::new();
        for password in ["first password", "second password", "first password"] {
            hashes.push((
                password,
                pool.hash(password.to_owned().into()).await.unwrap(),
            ));
        }
        assert_ne!(hashes[0].1, hashes[2].1, "fresh salts");
        for (password, phc) in &hashes {
            assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{phc}");
            assert!(verifies(phc, password));
            assert!(!verifies(phc, "second password") || *password == "second password");
        }
    }

    /// Regression: hashing ran on tokio's unbounded blocking pool (64 concurrent signups:
    /// 3.4 GiB). Beyond its threads and queue, the pool refuses at once.
    #[tokio::test]
    async fn a_saturated_pool_refuses_and_recovers() {
        let pool = HashPool::new(1, 1).unwrap();
        let (started, is_started) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let blocker = {
            let released = Arc::clone(&released);
            pool.try_run(move || {
                started.send(()).unwrap();
                released.lock().unwrap().recv().unwrap();
            })
            .unwrap()
        };
        is_started.recv().unwrap(); // the only thread is busy
        let queued = pool
            .start_hash("queued password 1".to_owned().into())
            .unwrap(); // the queue's one place
        assert!(
            matches!(
                pool.start_hash("refused password".to_owned().into()),
                Err(HashError::Overloaded)
            ),
            "a full queue refuses at once"
        );
        release.send(()).unwrap();
        blocker.await.unwrap();
        let phc = queued.await.unwrap();
        assert!(verifies(&phc, "queued password 1"));
        // Free again: hashes are accepted and verify.
        let phc = pool.hash("afterwards 123".to_owned().into()).await.unwrap();
        assert!(verifies(&phc, "afterwards 123"));
    }

    #[tokio::test]
    async fn the_decoy_never_matches_and_a_weaker_hash_is_upgraded() {
        assert!(!needs_rehash(decoy()), "the decoy has our parameters");
        assert_eq!(decoy(), decoy(), "one per process");
        let wrong = verify_and_rehash(None, decoy(), "any password".to_owned().into());
        assert_eq!(wrong.await.unwrap(), Verified::Mismatch);
        let current = pool()
            .hash("a current one".to_owned().into())
            .await
            .unwrap();
        assert!(!needs_rehash(&current));
        let right = verify_and_rehash(None, &current, "a current one".to_owned().into());
        assert_eq!(right.await.unwrap(), Verified::Match { rehashed: None });
        use argon2::PasswordHasher;
        let weak = Argon2::new(
            Algorithm::Argon2id,
            Version::V0x13,
            Params::new(8 * 1024, 1, 1, None).unwrap(),
        )
        .hash_password(b"an old one", &SaltString::encode_b64(&[7; 16]).unwrap())
        .unwrap()
        .to_string();
        assert!(needs_rehash(&weak));
        let wrong = verify_and_rehash(None, &weak, "not it".to_owned().into())
            .await
            .unwrap();
        assert_eq!(wrong, Verified::Mismatch, "a mismatch is never re-hashed");
        let Verified::Match {
            rehashed: Some(new),
        } = verify_and_rehash(None, &weak, "an old one".to_owned().into())
            .await
            .unwrap()
        else {
            panic!("a weaker hash that matches is re-hashed");
        };
        assert!(!needs_rehash(&new) && verifies(&new, "an old one"));
    }

    #[tokio::test]
    async fn one_client_holds_at_most_its_share_and_others_still_get_in() {
        // 1 thread + 7 queued = 8 slots; from 4 held on, a client may hold 2.
        let pool = HashPool::new(1, 7).unwrap();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let block = |pool: &HashPool, client: &str| {
            let released = Arc::clone(&released);
            pool.try_run_for(Some(client), move || {
                released.lock().unwrap().recv().unwrap();
            })
        };
        let mut jobs = Vec::new();
        while let Ok(job) = block(&pool, "flooder") {
            jobs.push(job);
        }
        assert_eq!(
            jobs.len(),
            4,
            "a burst of one client gets half the pool, no more"
        );
        for _ in 0..2 {
            jobs.push(block(&pool, "someone else").expect("another client still gets its share"));
        }
        assert!(matches!(
            block(&pool, "someone else"),
            Err(HashError::Overloaded)
        ));
        jobs.push(block(&pool, "a third client").unwrap());
        for _ in 0..jobs.len() {
            release.send(()).unwrap();
        }
        for job in jobs {
            job.await.unwrap();
        }
        assert!(
            pool.held.lock().unwrap().is_empty(),
            "shares are given back"
        );
        let again = block(&pool, "flooder").unwrap();
        release.send(()).unwrap();
        again.await.unwrap();
    }
}
