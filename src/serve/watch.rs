//! What the server loop knows of one connection: its phase and since when
//! ([`Watch`]), kept up to date by the stream itself ([`Tracked`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::Limits;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Phase {
    Idle = 0,
    Head = 1,
    Busy = 2,
    /// Claimed by the [`Registry`] to be closed while idle.
    Closed = 3,
}

/// What the watchdog of one connection knows: its phase and since when
/// (milliseconds after `base`). Phase changes wake nobody: they happen up to
/// three times per request, and a wake-up per change (re-polling the
/// connection, re-arming a timer) cost a measurable share of a request. The
/// watchdog instead looks again at least every `min(header_read, idle)`, which
/// still closes a connection exactly at its bound: a head that starts just
/// after a look is seen at the next look, before its own deadline.
pub(super) struct Watch {
    base: Instant,
    phase: AtomicU8,
    since_ms: AtomicU64,
}

impl Watch {
    pub(super) fn new() -> Self {
        Watch {
            base: Instant::now(),
            phase: AtomicU8::new(Phase::Idle as u8),
            since_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    pub(super) fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Idle,
            1 => Phase::Head,
            2 => Phase::Busy,
            _ => Phase::Closed,
        }
    }

    pub(super) fn set(&self, p: Phase) {
        self.since_ms.store(self.now_ms(), Ordering::Release);
        self.phase.store(p as u8, Ordering::Release);
    }

    /// Since when the connection idles, if it does.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        (self.phase() == Phase::Idle).then(|| self.base + Duration::from_millis(self.since_ms.load(Ordering::Acquire)))
    }

    /// Marks an idle connection as closed, so that bytes arriving now do not
    /// start a head on it. False if it is no longer idle.
    pub(super) fn claim_idle(&self) -> bool {
        self.phase
            .compare_exchange(
                Phase::Idle as u8,
                Phase::Closed as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Bytes arrived: the first ones after idling start a head.
    pub(super) fn read(&self) {
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
    pub(super) fn wrote(&self) {
        if self.phase() == Phase::Idle {
            self.since_ms.store(self.now_ms(), Ordering::Release);
        }
    }

    /// Resolves when the connection broke a bound, with which.
    pub(super) async fn expired(&self, limits: &Limits) -> &'static str {
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
                Phase::Busy | Phase::Closed => now + look,
            };
            sleep.as_mut().reset(next);
            sleep.as_mut().await;
        }
    }
}

/// A TCP stream that reports its traffic to the connection's [`Watch`].
pub(super) struct Tracked {
    pub(super) io: TcpStream,
    pub(super) watch: Arc<Watch>,
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
