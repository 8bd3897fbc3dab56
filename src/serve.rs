//! The HTTP/1.1 server loop: accepts connections and serves each with hyper,
//! bounding what a slow or idle client may hold.
//!
//! Invariants:
//! - At most `server.max_connections` connections are open, and at most
//!   `server.max_connections_per_address` from one client address (an IPv4
//!   address, or an IPv6 /64). [`Registry`] counts them and knows each one's
//!   phase, so that at a bound the *idle* connection that has been idle
//!   longest is closed to make room (closing an idle keep-alive connection
//!   is always allowed in HTTP/1.1; clients reopen). A flood of idle
//!   connections therefore never keeps a probe or a worker out (issue 36,
//!   N5).
//! - At the total bound with nothing idle, the loop holds the connection it
//!   just accepted (unread) and accepts no more: new connections wait in the
//!   kernel's listen backlog until one closes or turns idle (looked at every
//!   [`IDLE_LOOK`]). At the per-address bound
//!   with nothing idle from that address, the new connection is closed at
//!   once (after a best-effort 503), so one address cannot queue in front of
//!   the others. Each closing and refusal is counted in
//!   `muster_http_connections_shed_total{reason}`.
//! - A connection is *idle* (before its first request, or after a response
//!   was handed to hyper), *in head* (bytes of a request head arrived, the
//!   head is not complete) or *busy* (a request is being handled). Idle with
//!   no byte moving either way for `idle_timeout_ms`, or in head for
//!   `header_read_timeout_ms` from its first byte: the connection is closed.
//!   A busy connection is never cut here, nor closed to make room: long
//!   polls wait server-side for as long as their handler says.
//! - Reading a request body is bounded by `body_read_timeout_ms` from the
//!   moment the head was complete. A handler that was reading the body when
//!   the time ran out answers 408 problem+json with `Connection: close`.
//! - Shutdown: the loop stops accepting, every connection is asked to close
//!   gracefully (idle ones close at once, a request in flight finishes), and
//!   [`serve`] returns when all are closed. If the task running `serve` is
//!   aborted instead, the connections are still asked to close.
//! - Upgraded connections (WebSockets) leave this loop, and its counts, at
//!   the upgrade; their own handler and `events.max_clients` bound them.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, StatusCode, header};
use futures_util::StreamExt;
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;

mod watch;
use watch::{Phase, Tracked, Watch};

/// How often the accept loop, at the total bound with every connection
/// busy, looks again for one that turned idle.
pub(crate) const IDLE_LOOK: Duration = Duration::from_millis(10);

/// The bounds of [`serve`], from `[server]`.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub header_read: Duration,
    pub body_read: Duration,
    pub idle: Duration,
    pub max_connections: usize,
    /// At most `max_connections`.
    pub max_per_address: usize,
    /// Kernel send buffer of each connection (0: the kernel's default).
    pub send_buffer: usize,
}

impl Limits {
    pub(crate) fn from_config(cfg: &ServerConfig) -> Self {
        Limits {
            header_read: Duration::from_millis(cfg.header_read_timeout_ms),
            body_read: Duration::from_millis(cfg.body_read_timeout_ms),
            idle: Duration::from_millis(cfg.idle_timeout_ms),
            max_connections: cfg.max_connections,
            max_per_address: cfg.max_connections_per_address.min(cfg.max_connections),
            send_buffer: cfg.socket_send_buffer_bytes,
        }
    }
}

/// Why a connection was shed: the `reason` label of
/// `muster_http_connections_shed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shed {
    /// An idle keep-alive connection closed to make room for a new one.
    IdleClosed,
    /// A new connection refused: its address holds
    /// `max_connections_per_address` connections and none is idle.
    AddressFull,
}

impl Shed {
    pub(crate) const ALL: &'static [&'static str] = &["idle_closed", "address_full"];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Shed::IdleClosed => "idle_closed",
            Shed::AddressFull => "address_full",
        }
    }

    fn count(self) {
        metrics::counter!("muster_http_connections_shed_total", "reason" => self.as_str()).increment(1);
    }
}

/// Why [`Registry::admit`] found no room.
#[derive(Debug)]
enum NoRoom {
    /// The address's bound, none of its connections idle: refuse.
    Refused,
    /// The total bound, none idle: wait.
    Full,
}
use NoRoom::{Full, Refused};

/// The address a client's connections are counted under: an IPv4 address
/// (also when it arrives IPv4-mapped), or the /64 of an IPv6 address (one
/// host usually holds a whole /64).
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Every open connection, by client address, with what it takes to close
/// one that idles: its [`Watch`] and its close handle.
///
/// One mutex: it is taken once when a connection opens and once when it
/// ends, never per request; the phase of a connection lives in its
/// `Watch`'s atomics, read only when a bound is reached. Choosing the
/// longest-idle connection scans the candidates (one address's, at most
/// `max_connections_per_address`, or all at the total bound): microseconds
/// for thousands, and only at a bound.
#[derive(Default)]
struct Registry {
    inner: Mutex<Held>,
    /// Notified when a connection leaves the loop (a slot is free).
    freed: Notify,
    /// Connection tasks still running, evicted ones included: shutdown waits
    /// for zero.
    live: AtomicUsize,
}

#[derive(Default)]
struct Held {
    next_id: u64,
    total: usize,
    by_addr: HashMap<IpAddr, HashMap<u64, Handle>>,
}

struct Handle {
    watch: Arc<Watch>,
    evict: CancellationToken,
}

/// A connection's place in the [`Registry`], released on drop.
struct Slot {
    registry: Arc<Registry>,
    addr: IpAddr,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.registry.remove(self.addr, self.id);
        self.registry.live.fetch_sub(1, Ordering::AcqRel);
        self.registry.freed.notify_waiters();
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remove(&self, addr: IpAddr, id: u64) {
        let mut held = self.lock();
        if held.take(addr, id).is_some() {
            metrics::gauge!("muster_http_connections").set(held.total as f64);
        }
    }

    /// Takes a slot for a connection from `addr`, closing the longest-idle
    /// connection of that address, or of all, where a bound is reached.
    fn admit(self: &Arc<Self>, addr: IpAddr, limits: &Limits) -> Result<(Slot, Arc<Watch>, CancellationToken), NoRoom> {
        let mut held = self.lock();
        let here = held.by_addr.get(&addr).map_or(0, |m| m.len());
        if here >= limits.max_per_address && !held.close_idle(Some(addr)) {
            return Err(Refused);
        }
        if held.total >= limits.max_connections && !held.close_idle(None) {
            return Err(Full);
        }
        let id = held.next_id;
        held.next_id += 1;
        let watch = Arc::new(Watch::new());
        let evict = CancellationToken::new();
        let handle = Handle {
            watch: watch.clone(),
            evict: evict.clone(),
        };
        held.by_addr.entry(addr).or_default().insert(id, handle);
        held.total += 1;
        metrics::gauge!("muster_http_connections").set(held.total as f64);
        self.live.fetch_add(1, Ordering::AcqRel);
        let slot = Slot {
            registry: self.clone(),
            addr,
            id,
        };
        Ok((slot, watch, evict))
    }

    /// Closes the longest-idle connection of any address (the process is
    /// out of file descriptors). True if there was one.
    fn close_any_idle(&self) -> bool {
        self.lock().close_idle(None)
    }
}

impl Held {
    fn take(&mut self, addr: IpAddr, id: u64) -> Option<Handle> {
        let m = self.by_addr.get_mut(&addr)?;
        let h = m.remove(&id)?;
        if m.is_empty() {
            self.by_addr.remove(&addr);
        }
        self.total -= 1;
        Some(h)
    }

    /// The connection (of `addr`, or of any address) idle for longest.
    fn longest_idle(&self, addr: Option<IpAddr>) -> Option<(IpAddr, u64, Instant)> {
        let mut best: Option<(IpAddr, u64, Instant)> = None;
        let mut look = |a: IpAddr, m: &HashMap<u64, Handle>| {
            for (id, h) in m {
                if let Some(since) = h.watch.idle_since()
                    && best.is_none_or(|(_, _, b)| since < b)
                {
                    best = Some((a, *id, since));
                }
            }
        };
        match addr {
            Some(a) => {
                if let Some(m) = self.by_addr.get(&a) {
                    look(a, m)
                }
            }
            None => self.by_addr.iter().for_each(|(a, m)| look(*a, m)),
        }
        best
    }

    /// Closes the longest-idle connection (of `addr`, or of any): it leaves
    /// the counts at once, its task drops the socket. True if one was.
    fn close_idle(&mut self, addr: Option<IpAddr>) -> bool {
        // A connection whose first bytes arrive between the look and the
        // claim is in head, no longer idle: look again.
        while let Some((a, id, _)) = self.longest_idle(addr) {
            let claimed = self.by_addr[&a][&id].watch.claim_idle();
            if !claimed {
                continue;
            }
            let h = self.take(a, id).expect("it was just seen");
            h.evict.cancel();
            metrics::gauge!("muster_http_connections").set(self.total as f64);
            Shed::IdleClosed.count();
            return true;
        }
        false
    }
}

/// What a refused connection is told, if it is listening yet: it was never
/// read, so the answer may be lost to a reset; the close is what counts.
static REFUSED: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "this client address already holds server.max_connections_per_address connections, none of them idle",
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// Length of the listen backlog asked for (the kernel caps it at
/// `net.core.somaxconn`). The standard library's 128 overflowed under a
/// connection flood: a SYN beyond it is dropped and retried after a second,
/// which no probe bound survives.
pub(crate) const LISTEN_BACKLOG: u32 = 4096;

/// Binds `addr` for [`serve`], with [`LISTEN_BACKLOG`].
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Raises the process's soft limit of open files to its hard limit (each
/// connection is a file; the soft limit is often 1024), and returns the
/// limit now in force.
pub fn raise_open_files_limit() -> io::Result<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a struct owned here.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return Err(io::Error::last_os_error());
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r = raised;
            }
        }
    }
    Ok(r.rlim_cur)
}

/// What answers each request: the node's surface (`app::Surface`). A trait
/// so that this loop needs nothing of the app, and a request costs no boxed
/// future.
pub(crate) trait Answer: Clone + Send + Sync + 'static {
    fn answer(self, req: Request<Body>) -> impl std::future::Future<Output = axum::response::Response> + Send;
}

/// Serves `surface` on `listener` until `shutdown` is cancelled and every
/// connection has closed.
pub(crate) async fn serve<A: Answer>(listener: TcpListener, surface: A, limits: Limits, shutdown: CancellationToken) {
    let registry = Arc::new(Registry::default());
    // Cancelled on shutdown, and also when this future is dropped (the task
    // aborted), so connections never outlive the loop unasked.
    let close = CancellationToken::new();
    let _close_on_drop = close.clone().drop_guard();
    let mut http = hyper::server::conn::http1::Builder::new();
    // Our own watchdog bounds the head; hyper's timer would also cut idle
    // keep-alive connections at the head's (shorter) bound.
    http.header_read_timeout(None);
    let mut backoff = Duration::from_millis(10);
    'accept: loop {
        let (tcp, remote) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    // Out of file descriptors, say: an idle connection
                    // gives one back; else wait, then try again.
                    if !registry.close_any_idle() {
                        tracing::warn!(error = %e, "accept failed; retrying in {backoff:?}");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(10);
        // At the total bound with nothing idle, this connection waits (not
        // served, not read) and the next ones wait in the listen backlog,
        // until one leaves or turns idle.
        let key = client_key(remote.ip());
        let (slot, watch, evict) = loop {
            let freed = registry.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match registry.admit(key, &limits) {
                Ok(v) => break v,
                Err(Full) => {}
                Err(Refused) => {
                    Shed::AddressFull.count();
                    tracing::debug!(%remote, "connection refused: its address holds server.max_connections_per_address");
                    let _ = tcp.try_write(&REFUSED);
                    continue 'accept;
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break 'accept,
                _ = freed => {}
                _ = tokio::time::sleep(IDLE_LOOK) => {}
            }
        };
        let _ = tcp.set_nodelay(true);
        if limits.send_buffer > 0 {
            let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(limits.send_buffer);
        }
        let conn = Connection {
            http: http.clone(),
            surface: surface.clone(),
            limits: limits.clone(),
            remote,
            close: close.clone(),
            evict,
        };
        tokio::spawn(async move {
            conn.run(tcp, watch).await;
            drop(slot);
        });
    }
    close.cancel();
    loop {
        let freed = registry.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        if registry.live.load(Ordering::Acquire) == 0 {
            break;
        }
        freed.await;
    }
}

struct Connection<A> {
    http: hyper::server::conn::http1::Builder,
    surface: A,
    limits: Limits,
    remote: SocketAddr,
    /// Shutdown: close gracefully.
    close: CancellationToken,
    /// Closed to make room while idle: drop at once.
    evict: CancellationToken,
}

impl<A: Answer> Connection<A> {
    async fn run(self, tcp: TcpStream, watch: Arc<Watch>) {
        let io = TokioIo::new(Tracked {
            io: tcp,
            watch: watch.clone(),
        });
        let (surface, remote, body_read) = (self.surface, self.remote, self.limits.body_read);
        let w = watch.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            w.set(Phase::Busy);
            let (surface, w) = (surface.clone(), w.clone());
            async move {
                let resp = handle(surface, req, remote, body_read).await;
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
                _ = self.evict.cancelled() => {
                    tracing::debug!(%remote, "closing an idle connection to make room");
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
/// then the node's surface.
async fn handle<A: Answer>(
    surface: A,
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
    let resp = surface.answer(Request::from_parts(parts, body)).await;
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
