//! Requests are written as raw HTTP/1.1 on kept-alive connections (one pool of idle
//! connections per source address), with one attempt each: the figures count first answers,
//! and a transport error is counted as status 0. A generator this lean (no HTTP client stack)
//! leaves the server and the database the cores that pgbench's client leaves them in the
//! baselines; a reused connection the server had closed is reopened once before the request
//! counts as failed, as any HTTP client does.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use rand::Rng;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
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

/// The `i`-th client address of the range `a.b.0.0/16`: `a.b.0.1` … `a.b.0.254`, `a.b.1.1` …
/// (no `.0` or `.255` host part).
fn client_addr(a: u8, b: u8, i: u32) -> IpAddr {
    let hi = u8::try_from(i / 254).expect("at most MAX_ADDRS addresses");
    let lo = u8::try_from(i % 254 + 1).expect("1..=254");
    IpAddr::V4(Ipv4Addr::new(a, b, hi, lo))
}

/// One kept-alive connection and what was read past the last answer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// Where request `n` goes and whom it names: its source address and its `X-Forwarded-For`
/// value, each round-robin over the configured addresses; idle connections per source address.
struct Senders {
    target: SocketAddr,
    /// `Host` and the path, as the request line and header carry them.
    host: String,
    path: String,
    sources: Vec<Option<IpAddr>>,
    idle: Vec<std::sync::Mutex<Vec<Conn>>>,
    forwarded: Vec<String>,
}

/// Why an exchange failed, and whether the request may have reached the server's handler.
enum Failed {
    /// A reused connection closed before any byte of an answer: reopen and send once more.
    Stale,
    Other,
}

impl Senders {
    fn new(args: &Args) -> anyhow::Result<Self> {
        let url = &args.url;
        anyhow::ensure!(url.scheme() == "http", "only http:// URLs");
        let target = url
            .socket_addrs(|| Some(80))?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("{url} resolves to no address"))?;
        let host = match url.port() {
            Some(port) => format!("{}:{port}", url.host_str().unwrap_or("localhost")),
            None => url.host_str().unwrap_or("localhost").to_owned(),
        };
        let path = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        let sources: Vec<Option<IpAddr>> = if args.source_addrs > 1 {
            (0..args.source_addrs)
                .map(|i| Some(client_addr(127, 1, i)))
                .collect()
        } else {
            vec![None]
        };
        let idle = sources.iter().map(|_| Default::default()).collect();
        let forwarded = (0..args.forwarded_for.unwrap_or(0))
            .map(|i| client_addr(198, 18, i).to_string())
            .collect();
        Ok(Self {
            target,
            host,
            path,
            sources,
            idle,
            forwarded,
        })
    }

    async fn connect(&self, source: Option<IpAddr>) -> std::io::Result<Conn> {
        let socket = TcpSocket::new_v4()?;
        if let Some(source) = source {
            socket.bind(SocketAddr::new(source, 0))?;
        }
        let stream = socket.connect(self.target).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// Sends request `n` (one attempt); its status, 0 for a transport error.
    async fn send(&self, n: u64, key: &str, payload: &serde_json::Value) -> u16 {
        let slot = (n % self.sources.len() as u64) as usize;
        let body = payload.to_string();
        let mut request = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n",
            self.path,
            self.host,
            body.len()
        );
        if !self.forwarded.is_empty() {
            let addr = &self.forwarded[(n % self.forwarded.len() as u64) as usize];
            request.push_str(&format!("X-Forwarded-For: {addr}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(&body);
        let pooled = self.idle[slot]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let (mut conn, reused) = match pooled {
            Some(conn) => (conn, true),
            None => match self.connect(self.sources[slot]).await {
                Ok(conn) => (conn, false),
                Err(_) => return 0,
            },
        };
        let mut answer = exchange(&mut conn, request.as_bytes(), reused).await;
        if matches!(answer, Err(Failed::Stale)) {
            answer = match self.connect(self.sources[slot]).await {
                Ok(fresh) => {
                    conn = fresh;
                    exchange(&mut conn, request.as_bytes(), false).await
                }
                Err(_) => Err(Failed::Other),
            };
        }
        match answer {
            Ok((status, keep_alive)) => {
                if keep_alive {
                    self.idle[slot]
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(conn);
                }
                status
            }
            Err(_) => 0,
        }
    }
}

/// Writes `request` and reads one answer (`Content-Length` or chunked body): its status and
/// whether the connection stays open.
async fn exchange(conn: &mut Conn, request: &[u8], reused: bool) -> Result<(u16, bool), Failed> {
    let stale = |read_any: bool| {
        if reused && !read_any {
            Failed::Stale
        } else {
            Failed::Other
        }
    };
    conn.buf.clear();
    if conn.stream.write_all(request).await.is_err() {
        return Err(stale(false));
    }
    let (status, keep_alive, head, length, chunked) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&conn.buf) {
            Ok(httparse::Status::Complete(head)) => {
                let (mut length, mut chunked, mut keep_alive) = (0usize, false, true);
                for header in response.headers.iter() {
                    let value = std::str::from_utf8(header.value).unwrap_or("");
                    if header.name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().map_err(|_| Failed::Other)?;
                    } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                        chunked = value.to_ascii_lowercase().contains("chunked");
                    } else if header.name.eq_ignore_ascii_case("connection") {
                        keep_alive = !value.eq_ignore_ascii_case("close");
                    }
                }
                break (
                    response.code.unwrap_or(0),
                    keep_alive,
                    head,
                    length,
                    chunked,
                );
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return Err(Failed::Other),
        }
        let read_any = !conn.buf.is_empty();
        if !read_more(conn).await {
            return Err(stale(read_any));
        }
    };
    // The body is read, never used: to its length, or to the last chunk and the empty trailer.
    let complete = |buf: &[u8]| {
        if chunked {
            buf[head..].ends_with(b"0\r\n\r\n")
        } else {
            buf.len() >= head + length
        }
    };
    while !complete(&conn.buf) {
        if !read_more(conn).await {
            return Err(Failed::Other);
        }
    }
    Ok((status, keep_alive))
}

/// Reads what the server sent next into the connection's buffer; false when it closed or failed.
async fn read_more(conn: &mut Conn) -> bool {
    matches!(conn.stream.read_buf(&mut conn.buf).await, Ok(n) if n > 0)
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
    let senders = Arc::new(Senders::new(&args)?);
    let run_id: u64 = rand::random::<u32>().into();
    let counter = Arc::new(AtomicU64::new(0));

    if args.mode == Mode::Replay {
        for n in 0..args.keys as u64 {
            let key = format!("r-{run_id}-{n}");
            let status = senders
                .send(n, &key, &body(run_id * 1_000_000 + n, args.password))
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
                let status = senders.send(n, &key, &payload).await;
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
