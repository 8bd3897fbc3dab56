//! The `queue` label of the task metrics, bounded.

use std::collections::HashSet;
use std::sync::Mutex;

/// Bounds the `queue` label of metrics: the first 100 queues seen get their
/// own series, the rest share `other`.
#[derive(Default)]
pub struct QueueLabels {
    seen: Mutex<HashSet<String>>,
}

const MAX_QUEUE_LABELS: usize = 100;

impl QueueLabels {
    pub fn label(&self, queue: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(queue) {
            return queue.to_string();
        }
        if seen.len() < MAX_QUEUE_LABELS {
            seen.insert(queue.to_string());
            return queue.to_string();
        }
        "other".into()
    }
}
