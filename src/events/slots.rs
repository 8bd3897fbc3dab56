//! WebSocket subscriber slots: at most `events.max_clients` per node, and
//! at most `events.max_clients_per_principal` held by one principal (a
//! token, with all its sessions; in no-auth mode a client address), so one
//! reader cannot take every slot (issue 36, N11).
//!
//! Invariant: a [`Slot`] holds one node slot and one unit of its
//! principal's share; both are given back when it drops, and a principal
//! with no slot left has no entry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSlot {
    /// The principal holds its whole share.
    Share,
    /// The node holds `max_clients` subscribers.
    Node,
}

pub struct Slots {
    max: usize,
    per_principal: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_principal: HashMap<String, usize>,
}

/// One subscriber's slot; released on drop.
pub struct Slot {
    slots: Arc<Slots>,
    principal: String,
}

impl Slots {
    pub fn new(max: usize, per_principal: usize) -> Self {
        Slots {
            max,
            per_principal: per_principal.min(max),
            held: Mutex::default(),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn per_principal(&self) -> usize {
        self.per_principal
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for `principal`, if it has share left and the node has room.
    pub fn take(self: &Arc<Self>, principal: &str) -> Result<Slot, NoSlot> {
        let mut held = self.lock();
        // A full node is said first: it is true of every caller.
        if held.total >= self.max {
            return Err(NoSlot::Node);
        }
        let mine = held.by_principal.get(principal).copied().unwrap_or(0);
        if mine >= self.per_principal {
            return Err(NoSlot::Share);
        }
        held.total += 1;
        *held.by_principal.entry(principal.to_string()).or_default() += 1;
        Ok(Slot {
            slots: self.clone(),
            principal: principal.to_string(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.lock();
        held.total -= 1;
        if let Some(n) = held.by_principal.get_mut(&self.principal) {
            *n -= 1;
            if *n == 0 {
                held.by_principal.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_holds_at_most_its_share_and_gives_it_back() {
        let slots = Arc::new(Slots::new(4, 2));
        let a1 = slots.take("a").unwrap();
        let _a2 = slots.take("a").unwrap();
        assert_eq!(slots.take("a").err(), Some(NoSlot::Share));
        let _b1 = slots.take("b").unwrap();
        let _b2 = slots.take("b").unwrap();
        assert_eq!(slots.take("c").err(), Some(NoSlot::Node));
        drop(a1);
        let _a3 = slots.take("a").unwrap();
        assert_eq!(slots.lock().by_principal.len(), 2);
    }
}
