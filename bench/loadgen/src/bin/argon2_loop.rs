//! `argon2_loop [SECONDS]`: the password baseline of `bench/run`. Hashes with oncely's Argon2id
//! parameters (`crates/oncely-server/src/password.rs`: m = 19 MiB, t = 2, p = 1, a 16-byte
//! random salt, a 32-byte output) on one thread per core (`available_parallelism`), each thread
//! reusing one working memory as the server's hashing threads do, in a tight loop for SECONDS
//! (default 10). Prints one JSON line: threads, hashes, seconds, rate (hashes/s).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use argon2::{Algorithm, Argon2, Block, Params, Version};
use serde_json::json;

/// oncely's parameters: OWASP's minimum (19 MiB, 2 passes, 1 lane).
fn params() -> Params {
    Params::new(19 * 1024, 2, 1, None).expect("valid Argon2 parameters")
}

fn main() -> anyhow::Result<()> {
    let seconds: f64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 10.0,
    };
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let stop = Arc::new(AtomicBool::new(false));
    let hashes = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, hashes) = (stop.clone(), hashes.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let hasher = Argon2::new(Algorithm::Argon2id, Version::V0x13, params());
                let mut memory = vec![Block::default(); params().block_count()];
                let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let salt: [u8; 16] = rand::random();
                    let password = format!("bench password {t}-{n}");
                    hasher
                        .hash_password_into_with_memory(
                            password.as_bytes(),
                            &salt,
                            &mut out,
                            &mut memory[..],
                        )
                        .map_err(|e| anyhow::anyhow!("hashing: {e}"))?;
                    n += 1;
                    hashes.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    // Hashes finished within the time count; the ones in progress when it ends do not.
    let done = hashes.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("a hashing thread panicked"))??;
    }
    println!(
        "{}",
        json!({ "threads": threads, "hashes": done, "seconds": elapsed, "rate": done as f64 / elapsed })
    );
    Ok(())
}
