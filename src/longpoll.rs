//! Long polls woken by cluster events.
//!
//! A waiting request subscribes to the node's event bus *before* it reads or
//! changes the state it waits on, so an event emitted in between is not
//! missed; it then sleeps until a matching event, a timer, or shutdown. The
//! caller re-reads the state after every wake-up: events only say "look
//! again", never what to answer. A lagging receiver (the bus dropped events
//! for it) counts as a wake-up. [`RECHECK`] bounds the wait after a lost
//! event (for example while the node's tailer reconnects).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::events::Event;

/// The longest a waiter sleeps without re-reading the state.
pub const RECHECK: Duration = Duration::from_secs(1);

/// Why [`wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A matching event arrived, or events were lost: re-read the state.
    Event,
    /// `until` passed.
    Timer,
    /// The node is shutting down: answer with what is known.
    Shutdown,
}

/// Sleeps until an event for which `matches` holds, `until`, or `shutdown`.
pub async fn wait(
    rx: &mut Receiver<Arc<Event>>,
    until: Instant,
    shutdown: &CancellationToken,
    matches: impl Fn(&Event) -> bool,
) -> Wake {
    let sleep = tokio::time::sleep_until(until.into());
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Ok(ev) if matches(&ev) => return Wake::Event,
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => return Wake::Event,
                Err(RecvError::Closed) => {
                    tokio::select! {
                        _ = &mut sleep => return Wake::Timer,
                        _ = shutdown.cancelled() => return Wake::Shutdown,
                    }
                }
            },
            _ = &mut sleep => return Wake::Timer,
            _ = shutdown.cancelled() => return Wake::Shutdown,
        }
    }
}

/// The instant `ms` milliseconds from now (negative: now).
pub fn after_ms(ms: i64) -> Instant {
    Instant::now() + Duration::from_millis(ms.max(0) as u64)
}
