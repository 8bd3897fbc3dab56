//! The HTTP/1.1 server loop: accepts connections and serves each with hyper,
//! bounding what a slow or idle client may hold.
//!
//! Invariants:
//! - At most `server.max_connections` connections are open. Beyond that the
//!   loop stops accepting, so new connections wait in the kernel's listen
//!   backlog until one closes (a client sees a slow connect, never a reset).
//! - A connection is *idle* (before its first request, or after a response
//!   was handed to hyper), *in head* (bytes of a request head arrived, the
//!   head is not complete) or *busy* (a request is being handled). Idle with
//!   no byte moving either way for `idle_timeout_ms`, or in head for
//!   `header_read_timeout_ms` from its first byte: the connection is closed.
//!   A busy connection is never cut here: long polls wait server-side for as
//!   long as their handler says.
//! - Reading a request body is bounded by `body_read_timeout_ms` from the
//!   moment the head was complete. A handler that was reading the body when
//!   the time ran out answers 408 problem+json with `Connection: close`.
//! - Shutdown: the loop stops accepting, every connection is asked to close
//!   gracefully (idle ones close at once, a request in flight finishes), and
//!   [`serve`] returns when all are closed. If the task running `serve` is
//!   aborted instead, the connections are still asked to close.
//! - Upgraded connections (WebSockets) leave this loop at the upgrade; their
//!   own handler bounds them.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, StatusCode, header};
use futures_util::StreamExt;
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::config::ServerConfig;

/// The bounds of [`serve`], from `[server]`.
#[derive(Debug, Clone)]
pub struct Limits {
    pub header_read: Duration,
    pub body_read: Duration,
    pub idle: Duration,
    pub max_connections: usize,
    /// Kernel send buffer of each connection (0: the kernel's default).
    pub send_buffer: usize,
}

impl Limits {
    pub fn from_config(cfg: &ServerConfig) -> Self {
        Limits {
            header_read: Duration::from_millis(cfg.header_read_timeout_ms),
            body_read: Duration::from_millis(cfg.body_read_timeout_ms),
            idle: Duration::from_millis(cfg.idle_timeout_ms),
            max_connections: cfg.max_connections,
            send_buffer: cfg.socket_send_buffer_bytes,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled and every
/// connection has closed.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Cancelled on shutdown, and also when this future is dropped (the task
    // aborted), so connections never outlive the loop unasked.
    let close = CancellationToken::new();
    let _close_on_drop = close.clone().drop_guard();
    let mut http = hyper::server::conn::http1::Builder::new();
    // Our own watchdog bounds the head; hyper's timer would also cut idle
    // keep-alive connections at the head's (shorter) bound.
    http.header_read_timeout(None);
    let mut backoff = Duration::from_millis(10);
    loop {
        // Take a slot before accepting: beyond the bound, connections wait
        // in the backlog instead of being accepted and dropped.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (tcp, remote) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    // Out of file descriptors, say: wait, then try again.
                    tracing::warn!(error = %e, "accept failed; retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(10);
        let _ = tcp.set_nodelay(true);
        if limits.send_buffer > 0 {
            let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(limits.send_buffer);
        }
        let conn = Connection {
            http: http.clone(),
            router: router.clone(),
            limits: limits.clone(),
            remote,
            close: close.clone(),
        };
        tokio::spawn(async move {
            conn.run(tcp).await;
            drop(permit);
        });
    }
    close.cancel();
    // Every connection holds a slot: all slots back means all closed.
    let _ = slots.acquire_many(limits.max_connections as u32).await;
}

struct Connection {
    http: hyper::server::conn::http1::Builder,
    router: Router,
    limits: Limits,
    remote: SocketAddr,
    close: CancellationToken,
}

impl Connection {
    async fn run(self, tcp: TcpStream) {
        let watch = Arc::new(Watch::new());
        let io = TokioIo::new(Tracked {
            io: tcp,
            watch: watch.clone(),
        });
        let (router, remote, body_read) = (self.router, self.remote, self.limits.body_read);
        let w = watch.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            w.set(Phase::Busy);
            let (router, w) = (router.clone(), w.clone());
            async move {
                let resp = handle(router, req, remote, body_read).await;
                w.set(Phase::Idle);
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        let conn = self.http.serve_connection(io, svc).with_upgrades();
        tokio::pin!(conn);
        let mut closing = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%remote, error = %e, "connection ended with an error");
                    }
                    return;
                }
                why = watch.expired(&self.limits) => {
                    // Dropping the connection closes the socket.
                    tracing::debug!(%remote, "closing a connection: {why}");
                    return;
                }
                _ = self.close.cancelled(), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// One request: the peer address for `ConnectInfo`, the body read bound,
/// then the router.
async fn handle(
    mut router: Router,
    req: Request<Incoming>,
    remote: SocketAddr,
    body_read: Duration,
) -> axum::response::Response {
    let (mut parts, incoming) = req.into_parts();
    parts.extensions.insert(ConnectInfo(remote));
    let late = Arc::new(AtomicBool::new(false));
    let body = if incoming.is_end_stream() {
        Body::new(incoming)
    } else {
        with_deadline(Body::new(incoming), Instant::now() + body_read, late.clone())
    };
    let resp = match router.call(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    if !late.load(Ordering::Relaxed) {
        return resp;
    }
    // The request's id (outside the router's scope now) goes into the body
    // as well as the header, as in every other problem (issue 36, N10).
    let id = resp.headers().get(&crate::http::X_REQUEST_ID).cloned();
    let timeout = || {
        crate::error::problem(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive within server.body_read_timeout_ms",
            None,
        )
    };
    let mut out = match id.as_ref().and_then(|v| v.to_str().ok()) {
        Some(text) => crate::error::REQUEST_ID.sync_scope(text.to_string(), timeout),
        None => timeout(),
    };
    if let Some(id) = id {
        out.headers_mut().insert(crate::http::X_REQUEST_ID.clone(), id);
    }
    out.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    out
}

/// `body`, failing with a timeout error once `deadline` passes (and
/// recording that in `late`).
fn with_deadline(body: Body, deadline: Instant, late: Arc<AtomicBool>) -> Body {
    let stream = futures_util::stream::unfold(Some(body.into_data_stream()), move |s| {
        let late = late.clone();
        async move {
            let mut s = s?;
            match tokio::time::timeout_at(deadline, s.next()).await {
                Ok(Some(item)) => Some((item.map_err(io::Error::other), Some(s))),
                Ok(None) => None,
                Err(_) => {
                    late.store(true, Ordering::Relaxed);
                    let e = io::Error::new(io::ErrorKind::TimedOut, "request body read timed out");
                    Some((Err(e), None))
                }
            }
        }
    });
    Body::from_stream(stream)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Idle = 0,
    Head = 1,
    Busy = 2,
}

/// What the watchdog of one connection knows: its phase and since when
/// (milliseconds after `base`). Phase changes wake nobody: they happen up to
/// three times per request, and a wake-up per change (re-polling the
/// connection, re-arming a timer) cost a measurable share of a request. The
/// watchdog instead looks again at least every `min(header_read, idle)`, which
/// still closes a connection exactly at its bound: a head that starts just
/// after a look is seen at the next look, before its own deadline.
struct Watch {
    base: Instant,
    phase: AtomicU8,
    since_ms: AtomicU64,
}

impl Watch {
    fn new() -> Self {
        Watch {
            base: Instant::now(),
            phase: AtomicU8::new(Phase::Idle as u8),
            since_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Idle,
            1 => Phase::Head,
            _ => Phase::Busy,
        }
    }

    fn set(&self, p: Phase) {
        self.since_ms.store(self.now_ms(), Ordering::Release);
        self.phase.store(p as u8, Ordering::Release);
    }

    /// Bytes arrived: the first ones after idling start a head.
    fn read(&self) {
        if self
            .phase
            .compare_exchange(
                Phase::Idle as u8,
                Phase::Head as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.since_ms.store(self.now_ms(), Ordering::Release);
        }
    }

    /// Bytes left (a response still being written): not idle yet.
    fn wrote(&self) {
        if self.phase() == Phase::Idle {
            self.since_ms.store(self.now_ms(), Ordering::Release);
        }
    }

    /// Resolves when the connection broke a bound, with which.
    async fn expired(&self, limits: &Limits) -> &'static str {
        let look = limits.header_read.min(limits.idle).max(Duration::from_millis(1));
        let sleep = tokio::time::sleep(look);
        tokio::pin!(sleep);
        loop {
            let now = Instant::now();
            let since = self.base + Duration::from_millis(self.since_ms.load(Ordering::Acquire));
            let next = match self.phase() {
                Phase::Idle if now >= since + limits.idle => return "idle for server.idle_timeout_ms",
                Phase::Head if now >= since + limits.header_read => {
                    return "request head not complete within server.header_read_timeout_ms";
                }
                Phase::Idle => (since + limits.idle).min(now + look),
                Phase::Head => since + limits.header_read,
                Phase::Busy => now + look,
            };
            sleep.as_mut().reset(next);
            sleep.as_mut().await;
        }
    }
}

/// A TCP stream that reports its traffic to the connection's [`Watch`].
struct Tracked {
    io: TcpStream,
    watch: Arc<Watch>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.watch.read();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.watch.wrote();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.watch.wrote();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
