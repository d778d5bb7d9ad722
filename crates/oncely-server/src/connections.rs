//! The HTTP server's connections, bounded against slow and hostile clients: a client never
//! holds the service, only its own connection, and that only for a while.
//!
//! - **Headers** must arrive within `header_read_timeout` of the connection opening or of the
//!   previous response (hyper's header read timeout, on a Tokio timer): a slowloris client
//!   trickling header bytes, or one that connects and sends nothing, is closed then; so is an
//!   idle keep-alive connection.
//! - **Bodies** must arrive whole within `body_read_timeout` of their request
//!   ([`oncely::body::Deadline`]): a trickle is answered `408 request-body-timeout`.
//! - **Responses** must make progress: a write that the client does not read for
//!   `write_timeout` (it stopped reading, its window is full) closes the connection
//!   ([`WriteTimeout`]).
//! - **Connections** are at most `max_connections` at once; past it the server stops accepting
//!   until one closes (the kernel's backlog holds the newcomers). At start the process raises
//!   its open-file limit to the hard limit when that is needed for them.
//!
//! Accept errors (a full file table, a reset during the handshake) are logged and retried after
//! a short pause: they never stop the server.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// How long and how many: see the module's docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once (`ONCELY_MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// Time for a request's headers (`ONCELY_HEADER_READ_TIMEOUT`).
    pub header_read_timeout: Duration,
    /// Time for a request's whole body (`ONCELY_BODY_READ_TIMEOUT`).
    pub body_read_timeout: Duration,
    /// Time a response write may wait for the client to read (`ONCELY_WRITE_TIMEOUT`).
    pub write_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 16_384,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes; then stops
/// accepting and returns once every connection's in-flight requests are answered (idle
/// connections are closed at once). Handlers see the peer as `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(connections_that_fit(
        limits.max_connections.max(1),
    )));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            () = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    accept_failed(&error).await;
                    continue;
                }
            },
        };
        // One connection: HTTP/1.1 with the header timeout, each request's body under its
        // deadline and the peer's address in its extensions, writes under the write timeout.
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let mut request = request.map(|body| {
                axum::body::Body::new(oncely::body::Deadline::new(body, limits.body_read_timeout))
            });
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(request)
        });
        let io = TokioIo::new(WriteTimeout::new(stream, limits.write_timeout));
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(io, service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    // Bounded, below the 30 s most orchestrators wait before a SIGKILL: a client still sending
    // its headers or a trickled body does not hold the exit (nor the workers' own shutdown).
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace = ?SHUTDOWN_GRACE,
            "shutting down: connections still open after the grace are dropped"
        );
    }
    Ok(())
}

/// How long a shutdown waits for the open connections' requests to be answered.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// An accept that failed: a connection reset before it was accepted is nothing; a full file
/// table (or any other error) is logged and waited out briefly, so the loop never spins.
async fn accept_failed(error: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed (at the open-file limit?); retrying in 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Open files kept for the process's own work beside client connections: its database pool,
/// its outbox workers' SMTP and HTTP connections, the dev inbox, listeners, logs.
const OWN_FILES: u64 = 256;

/// Raises the process's soft open-file limit towards its hard limit when `connections` (and
/// [`OWN_FILES`] for the process's own work) need more than the soft limit allows, as servers
/// usually do; returns how many connections fit then — fewer than asked when even the hard
/// limit is too low (then it says so): idle clients must never take the files the process needs
/// for its own database and mail connections.
fn connections_that_fit(connections: usize) -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let asked = u64::try_from(connections).unwrap_or(u64::MAX);
    let wanted = asked.saturating_add(OWN_FILES);
    let limit = getrlimit(Resource::Nofile);
    let mut soft = limit.current.unwrap_or(u64::MAX);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if soft < wanted {
        let raised = wanted.min(hard);
        let new = Rlimit {
            current: Some(raised),
            maximum: limit.maximum,
        };
        if raised > soft && setrlimit(Resource::Nofile, new).is_ok() {
            soft = raised;
        }
    }
    let fit = soft.saturating_sub(OWN_FILES).max(1).min(asked);
    if fit < asked {
        tracing::warn!(
            soft,
            hard,
            asked,
            serving = fit,
            "the open-file limit leaves room for fewer connections than ONCELY_MAX_CONNECTIONS: serving at most that many at once, keeping the rest of the files for the process's own database and mail connections (raise `ulimit -n`, or LimitNOFILE in systemd)"
        );
    }
    usize::try_from(fit).unwrap_or(usize::MAX)
}

/// A stream whose writes fail with `TimedOut` when one cannot make progress for `within` (the
/// peer stopped reading): the connection closes instead of holding its task, its buffers and
/// its slot for ever. Reads are as they are (hyper bounds the wait for headers).
pub struct WriteTimeout<T> {
    inner: T,
    within: Duration,
    /// Armed while a write waits; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteTimeout<T> {
    /// `inner`, its writes bounded by `within`.
    pub fn new(inner: T, within: Duration) -> Self {
        Self {
            inner,
            within,
            stalled: None,
        }
    }

    /// After a write returned `Pending`: `Ready(Err)` once it has waited `within`.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let within = self.within;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + within)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer read nothing of the response for {within:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Maps a write's poll: progress disarms the timer, waiting arms it.
    fn bounded<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match polled {
            Poll::Ready(ready) => {
                self.stalled = None;
                Poll::Ready(ready)
            }
            Poll::Pending => match self.poll_stalled(cx) {
                Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
                _ => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.bounded(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.bounded(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.bounded(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.bounded(cx, polled)
    }
}
