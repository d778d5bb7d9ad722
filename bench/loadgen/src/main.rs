//! `oncely-loadgen`: drives an Idempotency-Key API over HTTP for a fixed time and prints one
//! JSON line: requests, successes, rate, latency percentiles, statuses.
//!
//! Modes:
//! - `signup`: every logical request a fresh key and a fresh address; with `--duplicates p`, a
//!   share p of requests repeat an earlier request (same key, same body) instead;
//! - `replay`: first makes `--keys` requests, then only repeats them (every answer a replay);
//! - `plain`: a fresh key per request to any URL with a fixed body (layer overhead).
//!
//! With `--password`, signup bodies carry a password (Argon2id on the server: the memory
//! scenario, `bench/password-rss`, and the password scenario of `bench/run`).
//!
//! Client addresses: by default every request comes from 127.0.0.1. With `--source-addrs N`,
//! requests go round-robin over N HTTP clients, each binding its connections to its own
//! loopback address (127.1.0.1, 127.1.0.2, … — Linux routes all of 127.0.0.0/8 to `lo`
//! without configuration): the server sees N peers. With `--forwarded-for N`, every request
//! comes from 127.0.0.1 and names one of N client addresses (198.18.0.1, … — the benchmarking
//! range 198.18.0.0/15) in `X-Forwarded-For`, round-robin: a server that trusts 127.0.0.1 as a
//! proxy sees N clients.
//!
//! Requests go through `oncely-client` with one attempt each ([`RetryPolicy::NONE`]): the
//! figures count first answers, and an error is counted as status 0.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use oncely_client::{Client, Operation, RetryPolicy};
use rand::Rng;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::json;
use tokio::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Signup,
    Replay,
    Plain,
}

#[derive(Debug, Parser)]
struct Args {
    /// The URL to POST to.
    #[arg(long)]
    url: reqwest::Url,
    #[arg(long, value_enum, default_value = "signup")]
    mode: Mode,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Share of requests that repeat an earlier one (signup mode).
    #[arg(long, default_value_t = 0.0)]
    duplicates: f64,
    /// Keys to create first and then replay (replay mode).
    #[arg(long, default_value_t = 200)]
    keys: usize,
    /// Signups carry a password.
    #[arg(long)]
    password: bool,
    /// Spread requests round-robin over N loopback source addresses (127.1.0.1, …), one HTTP
    /// client per address.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=MAX_ADDRS))]
    source_addrs: u32,
    /// Send every request from 127.0.0.1 with `X-Forwarded-For: <one of N addresses>`
    /// (198.18.0.1, …), round-robin: for a server that trusts 127.0.0.1 as a proxy.
    #[arg(long, value_name = "N", conflicts_with = "source_addrs",
          value_parser = clap::value_parser!(u32).range(1..=MAX_ADDRS))]
    forwarded_for: Option<u32>,
}

/// Most distinct client addresses either flag spreads over (254 × 254).
const MAX_ADDRS: i64 = 254 * 254;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The `i`-th client address of the range `a.b.0.0/16`: `a.b.0.1` … `a.b.0.254`, `a.b.1.1` …
/// (no `.0` or `.255` host part).
fn client_addr(a: u8, b: u8, i: u32) -> IpAddr {
    let hi = u8::try_from(i / 254).expect("at most MAX_ADDRS addresses");
    let lo = u8::try_from(i % 254 + 1).expect("1..=254");
    IpAddr::V4(Ipv4Addr::new(a, b, hi, lo))
}

/// Where request `n` goes and whom it names: its client (source address) and its
/// `X-Forwarded-For` value, each round-robin over the configured addresses.
struct Senders {
    clients: Vec<Client>,
    forwarded: Vec<HeaderValue>,
    path: String,
}

impl Senders {
    fn new(args: &Args) -> anyhow::Result<Self> {
        // One HTTP client (and connection pool) per source address; by default one, unbound.
        let sources: Vec<Option<IpAddr>> = if args.source_addrs > 1 {
            (0..args.source_addrs)
                .map(|i| Some(client_addr(127, 1, i)))
                .collect()
        } else {
            vec![None]
        };
        let idle_per_client = args.concurrency.div_ceil(sources.len()).max(1);
        let clients = sources
            .into_iter()
            .map(|source| {
                let http = reqwest::Client::builder()
                    .pool_max_idle_per_host(idle_per_client)
                    .local_address(source)
                    .build()?;
                Ok(Client::new(args.url.clone())
                    .http_client(http)
                    .policy(RetryPolicy::NONE))
            })
            .collect::<anyhow::Result<_>>()?;
        let forwarded = (0..args.forwarded_for.unwrap_or(0))
            .map(|i| HeaderValue::from_str(&client_addr(198, 18, i).to_string()))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            clients,
            forwarded,
            path: args.url.path().to_owned(),
        })
    }

    /// Sends request `n` (one attempt); its status, 0 for a transport error.
    async fn send(&self, n: u64, key: String, payload: &serde_json::Value) -> u16 {
        let mut operation = Operation::post(&self.path)
            .with_key(key)
            .json(payload)
            .expect("a JSON value serializes");
        if !self.forwarded.is_empty() {
            let addr = &self.forwarded[(n % self.forwarded.len() as u64) as usize];
            operation = operation.header(X_FORWARDED_FOR, addr.clone());
        }
        let client = &self.clients[(n % self.clients.len() as u64) as usize];
        match client.send(&operation).await {
            Ok(answer) => answer.status.as_u16(),
            Err(oncely_client::Error::GaveUp { status, .. }) => status.map_or(0, |s| s.as_u16()),
            Err(_) => 0,
        }
    }
}

#[derive(Default)]
struct Totals {
    latencies: Vec<Duration>,
    statuses: BTreeMap<u16, u64>,
}

fn body(n: u64, password: bool) -> serde_json::Value {
    if password {
        json!({ "email": format!("bench-{n}@example.com"), "password": format!("bench password {n}") })
    } else {
        json!({ "email": format!("bench-{n}@example.com") })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let senders = Arc::new(Senders::new(&args)?);
    let run_id: u64 = rand::random::<u32>().into();
    let counter = Arc::new(AtomicU64::new(0));

    if args.mode == Mode::Replay {
        for n in 0..args.keys as u64 {
            let key = format!("r-{run_id}-{n}");
            let status = senders
                .send(n, key, &body(run_id * 1_000_000 + n, args.password))
                .await;
            anyhow::ensure!(
                (200..300).contains(&status),
                "warm-up request failed: {status}"
            );
        }
    }

    let totals = Arc::new(Mutex::new(Totals::default()));
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (senders, totals, counter) = (senders.clone(), totals.clone(), counter.clone());
        let (mode, duplicates, keys, password) =
            (args.mode, args.duplicates, args.keys as u64, args.password);
        tasks.push(tokio::spawn(async move {
            let mut local = Totals::default();
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let (key, payload) = match mode {
                    Mode::Replay => {
                        let k = rand::rng().random_range(0..keys);
                        (
                            format!("r-{run_id}-{k}"),
                            body(run_id * 1_000_000 + k, password),
                        )
                    }
                    Mode::Signup
                        if n > 0 && rand::rng().random_bool(duplicates.clamp(0.0, 1.0)) =>
                    {
                        let k = rand::rng().random_range(0..n);
                        (
                            format!("s-{run_id}-{k}"),
                            body(run_id * 1_000_000_000 + k, password),
                        )
                    }
                    Mode::Signup => (
                        format!("s-{run_id}-{n}"),
                        body(run_id * 1_000_000_000 + n, password),
                    ),
                    Mode::Plain => (format!("p-{run_id}-{n}"), json!({ "amount": 1 })),
                };
                let sent = Instant::now();
                let status = senders.send(n, key, &payload).await;
                local.latencies.push(sent.elapsed());
                *local.statuses.entry(status).or_default() += 1;
            }
            let mut totals = totals.lock().await;
            totals.latencies.extend(local.latencies);
            for (s, c) in local.statuses {
                *totals.statuses.entry(s).or_default() += c;
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut totals = Arc::try_unwrap(totals)
        .map_err(|_| anyhow::anyhow!("tasks still running"))?
        .into_inner();
    totals.latencies.sort();
    let pct = |p: f64| {
        let i = ((totals.latencies.len() as f64 * p) as usize)
            .min(totals.latencies.len().saturating_sub(1));
        totals
            .latencies
            .get(i)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let requests = totals.latencies.len();
    let ok: u64 = totals
        .statuses
        .iter()
        .filter(|(s, _)| (200..300).contains(*s))
        .map(|(_, c)| c)
        .sum();
    println!(
        "{}",
        json!({
            "requests": requests,
            "ok": ok,
            "seconds": elapsed,
            "rate": ok as f64 / elapsed,
            "p50_ms": pct(0.50),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
            "statuses": totals.statuses,
        })
    );
    Ok(())
}
