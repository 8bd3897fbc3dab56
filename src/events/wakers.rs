//! Wake-ups of long-poll claims: one notifier per queue some claim on this
//! node waits on, woken by the events that make a task of it claimable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::Event;

/// Wakes long-polling claimers of a queue when its state changes anywhere
/// in the cluster (the tailer calls [`Wakers::on_event`]).
#[derive(Default)]
pub struct Wakers {
    map: Mutex<HashMap<String, Arc<Notify>>>,
}

/// One claim's registration on its queue's notifier. Dropping it, when the
/// claim answers or when its client goes away and the request future is
/// dropped mid-wait, forgets the queue once nobody else waits on it, so
/// claims on made-up queue names cannot grow the map.
pub struct QueueWaiter<'a> {
    wakers: &'a Wakers,
    queue: String,
    notify: Arc<Notify>,
}

impl QueueWaiter<'_> {
    /// Completes at the next wake-up of this queue. Create and enable it
    /// (`tokio::pin!`, then `.as_mut().enable()`) before claiming.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// The queue waited on.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Passes a wake-up on to another waiter of this queue: a claim that
    /// took its `max` tasks may have left more behind.
    pub fn wake_another(&self) {
        self.notify.notify_one();
    }
}

impl Drop for QueueWaiter<'_> {
    fn drop(&mut self) {
        let mut map = self.wakers.map.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference and ours: nobody else waits on this queue.
        if map.get(&self.queue).is_some_and(|n| Arc::strong_count(n) <= 2) {
            map.remove(&self.queue);
            Wakers::gauge(&map);
        }
    }
}

impl Wakers {
    /// Registers a claim waiting on `queue`; hold the waiter while waiting.
    pub fn wait(&self, queue: &str) -> QueueWaiter<'_> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let notify = map.entry(queue.to_string()).or_default().clone();
        Wakers::gauge(&map);
        QueueWaiter {
            wakers: self,
            queue: queue.to_string(),
            notify,
        }
    }

    /// Queues with at least one claim waiting on this node.
    pub fn waiting_queues(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn gauge(map: &HashMap<String, Arc<Notify>>) {
        metrics::gauge!("muster_claim_waiting_queues").set(map.len() as f64);
    }

    /// Wakes the waiters an event may concern, as few as can be served (no
    /// herd): one waiter of its queue per task that became claimable
    /// (enqueued or requeued), every waiter of the queue when it is resumed,
    /// and everyone when a group slot freed or a group limit, a flow-control
    /// limit or a node changed (a slot freed by a task of one queue may let a task of
    /// another queue start). Other events wake nobody. `claimed_later`: the
    /// same read of the stream shows the event's task claimed after it, so
    /// the task it made claimable wakes nobody (`Bus::publish_read`).
    pub fn on_event(&self, ev: &Event, claimed_later: bool) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.is_empty() {
            return;
        }
        let kind = ev.kind.as_str();
        // `@<limit>` is the line of tasks with limits of their own, not a
        // group: its end frees no group slot, and a claim waiting on a
        // limit looks again by itself (its `next_due`), so waking every
        // waiter on each such end would only make a herd.
        let slot_freed = ev.subject("group").is_some_and(|g| !g.starts_with('@'))
            && matches!(
                kind,
                "task.succeeded"
                    | "task.failed"
                    | "task.dead"
                    | "task.cancelled"
                    | "task.requeued"
                    | "orphan.recovered"
            );
        let limit_changed = matches!(kind, "limit.updated" | "limit.deleted" | "queue.limits");
        if slot_freed || kind == "group.updated" || limit_changed || kind.starts_with("node.") {
            for n in map.values() {
                n.notify_waiters();
            }
            return;
        }
        let Some(n) = ev.subject("queue").and_then(|q| map.get(q)) else {
            return;
        };
        let claimable = match kind {
            "task.enqueued" => !ev.data.contains("\"delayed\""),
            "orphan.recovered" => ev.data.contains("\"requeued\""),
            "task.requeued" => true,
            "queue.resumed" => {
                n.notify_waiters();
                false
            }
            _ => false,
        };
        if claimable && claimed_later {
            metrics::counter!("muster_claim_wakeups_saved_total").increment(1);
        } else if claimable {
            n.notify_one();
        }
    }

    /// Wakes every waiter (the tailer lost events and cannot tell whom).
    pub fn wake_all(&self) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for n in map.values() {
            n.notify_waiters();
        }
    }
}
