//! Group commit (issue 41): concurrent single calls of one kind for the same
//! shard ride together in one script call.
//!
//! No timer: a call that finds nothing in flight for its key goes at once,
//! alone, so at low load nothing waits and nothing is added to its latency.
//! Calls that arrive while one is in flight queue behind it; when it
//! returns, everything queued (up to `max`) goes as one script call, and so
//! on until the queue is empty. Under load the calls ride together, and the
//! script, the round trip and the event-stream write are paid once per group.
//!
//! Each member keeps its own outcome: the scripts already answer per item
//! (a refused item is refused alone, an idempotency key replays per item),
//! and the caller gets exactly what it would have got alone. A member's
//! deadline (G12) is taken when it arrives; a group goes with the earliest
//! of its members' deadlines, and a member that waited past its own is
//! answered "not applied" without being sent, so a group never carries a
//! write its caller has given up on.
//!
//! The first call of a burst runs in its caller's task (no spawn at low
//! load); what queued behind it is driven by a task of its own, so a caller
//! that goes away (its request dropped) strands nobody.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::store::StoreError;

/// One queued call: its item, the Redis-time deadline it arrived with, and
/// where its outcome goes.
pub(super) struct Member<I, O> {
    pub(super) item: I,
    pub(super) deadline: i64,
    tx: oneshot::Sender<Result<O, StoreError>>,
}

impl<I, O> Member<I, O> {
    /// Answers this member.
    pub(super) fn answer(self, out: Result<O, StoreError>) {
        // A caller that went away has nobody to tell.
        let _ = self.tx.send(out);
    }
}

/// What a call found when it joined its key.
pub(super) enum Turn<I, O> {
    /// Nothing in flight: run the item now, alone, then call
    /// [`Group::next`] (through a [`Lead`] guard).
    Lead(I),
    /// Queued behind the call in flight: the outcome comes here.
    Wait(oneshot::Receiver<Result<O, StoreError>>),
}

/// The queues of one kind of call, by key.
pub(super) struct Group<K, I, O> {
    /// A key is present while a call for it is in flight; its value is what
    /// queued behind that call.
    open: Mutex<HashMap<K, Vec<Member<I, O>>>>,
    /// Most members sent in one call.
    max: usize,
}

impl<K: Hash + Eq + Clone, I, O> Group<K, I, O> {
    pub(super) fn new(max: usize) -> Self {
        Group {
            open: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    /// Joins `key` with `item` (deadline in Redis ms).
    pub(super) fn join(&self, key: &K, item: I, deadline: i64) -> Turn<I, O> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        match open.get_mut(key) {
            Some(queue) => {
                let (tx, rx) = oneshot::channel();
                queue.push(Member { item, deadline, tx });
                Turn::Wait(rx)
            }
            None => {
                open.insert(key.clone(), Vec::new());
                Turn::Lead(item)
            }
        }
    }

    /// After a call for `key` returned: the members queued behind it (at
    /// most `max`, oldest first), to go next as one call; None, and the key
    /// is closed (the next call goes alone), when nobody queued.
    pub(super) fn next(&self, key: &K) -> Option<Vec<Member<I, O>>> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let queue = open.get_mut(key)?;
        if queue.is_empty() {
            open.remove(key);
            return None;
        }
        let rest = queue.split_off(queue.len().min(self.max));
        Some(std::mem::replace(queue, rest))
    }

    /// Members waiting now, over every key (for tests and metrics).
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.open.lock().unwrap().values().map(Vec::len).sum()
    }
}

/// Where one member's outcome goes.
pub(super) struct Ticket<O>(oneshot::Sender<Result<O, StoreError>>);

impl<O> Ticket<O> {
    fn answer(self, out: Result<O, StoreError>) {
        let _ = self.0.send(out);
    }
}

/// Splits `members` into those still within their deadline at Redis time
/// `now`: their items, their tickets, and the earliest of their deadlines;
/// the others are answered "not applied" (they are never sent).
pub(super) fn in_time<I, O>(members: Vec<Member<I, O>>, now: Option<i64>) -> (Vec<I>, Vec<Ticket<O>>, i64) {
    let mut items = Vec::with_capacity(members.len());
    let mut tickets = Vec::with_capacity(members.len());
    let mut earliest = i64::MAX;
    for m in members {
        match now {
            Some(now) if now >= m.deadline => m.answer(Err(StoreError::Unavailable(
                "the call waited for a grouped write past its deadline and was not applied; retry it".into(),
            ))),
            _ => {
                earliest = earliest.min(m.deadline);
                items.push(m.item);
                tickets.push(Ticket(m.tx));
            }
        }
    }
    (items, tickets, earliest)
}

/// Answers each member from its group's outcome: its own item's, or the
/// group's error.
pub(super) fn answer_all<O>(tickets: Vec<Ticket<O>>, out: Result<Vec<O>, StoreError>) {
    match out {
        Ok(outs) => {
            let mut outs = outs.into_iter();
            for t in tickets {
                match outs.next() {
                    Some(o) => t.answer(Ok(o)),
                    None => t.answer(Err(StoreError::Decode(
                        "the grouped call answered fewer items than sent".into(),
                    ))),
                }
            }
        }
        Err(e) => {
            for t in tickets {
                t.answer(Err(e.clone()));
            }
        }
    }
}

/// Sends what queued behind a call for `key`, group by group, until nothing
/// is left: `run` makes one call of a group's items with its deadline and
/// answers an outcome per item, in order. (Run in a task of its own.)
pub(super) async fn drive<K, I, O, Fut>(
    group: &Group<K, I, O>,
    key: K,
    mut members: Vec<Member<I, O>>,
    now: impl Fn() -> Option<i64>,
    mut run: impl FnMut(Vec<I>, i64) -> Fut,
) where
    K: Hash + Eq + Clone,
    Fut: std::future::Future<Output = Result<Vec<O>, StoreError>>,
{
    loop {
        let (items, tickets, deadline) = in_time(members, now());
        if !items.is_empty() {
            answer_all(tickets, run(items, deadline).await);
        }
        match group.next(&key) {
            Some(next) => members = next,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_call_leads_later_ones_queue_and_the_key_closes_when_empty() {
        let g: Group<&str, u32, u32> = Group::new(2);
        assert!(matches!(g.join(&"a", 1, 100), Turn::Lead(1)));
        // Another key is independent.
        assert!(matches!(g.join(&"b", 9, 100), Turn::Lead(9)));
        let mut rx = Vec::new();
        for i in 2..=4 {
            match g.join(&"a", i, 100 + i as i64) {
                Turn::Wait(r) => rx.push(r),
                Turn::Lead(_) => panic!("a call is in flight"),
            }
        }
        assert_eq!(g.waiting(), 3);
        // At most `max` per call, oldest first.
        let (items, tickets, _) = in_time(g.next(&"a").unwrap(), None);
        assert_eq!(items, [2, 3]);
        answer_all(tickets, Ok(vec![20, 30]));
        let (items, tickets, _) = in_time(g.next(&"a").unwrap(), None);
        assert_eq!(items, [4]);
        answer_all(tickets, Err(StoreError::Unavailable("down".into())));
        assert!(g.next(&"a").is_none(), "empty: the key closes");
        assert!(
            matches!(g.join(&"a", 5, 100), Turn::Lead(5)),
            "the next call goes alone"
        );
        let got: Vec<_> = rx.into_iter().map(|mut r| r.try_recv().unwrap()).collect();
        assert_eq!(got[0].as_ref().unwrap(), &20);
        assert_eq!(got[1].as_ref().unwrap(), &30);
        assert!(matches!(got[2], Err(StoreError::Unavailable(_))));
    }

    #[test]
    fn a_member_past_its_deadline_is_answered_and_not_sent() {
        let g: Group<u8, u32, u32> = Group::new(10);
        let _lead = g.join(&0, 0, 0);
        let mut late = match g.join(&0, 1, 50) {
            Turn::Wait(r) => r,
            Turn::Lead(_) => unreachable!(),
        };
        let _on_time = g.join(&0, 2, 80);
        let (items, _tickets, deadline) = in_time(g.next(&0).unwrap(), Some(60));
        assert_eq!(items, [2]);
        assert_eq!(deadline, 80, "the group's deadline is its earliest member's");
        assert!(matches!(late.try_recv().unwrap(), Err(StoreError::Unavailable(_))));
        // With no clock sample, nobody is dropped.
        let _lead = g.join(&1, 0, 0);
        let _queued = g.join(&1, 3, 10);
        let (items, _, _) = in_time(g.next(&1).unwrap(), None);
        assert_eq!(items, [3]);
    }

    #[test]
    fn fewer_outcomes_than_members_is_an_error_for_the_rest() {
        let g: Group<u8, u32, u32> = Group::new(10);
        let _lead = g.join(&0, 0, 0);
        let mut a = match g.join(&0, 1, 9) {
            Turn::Wait(r) => r,
            Turn::Lead(_) => unreachable!(),
        };
        let mut b = match g.join(&0, 2, 9) {
            Turn::Wait(r) => r,
            Turn::Lead(_) => unreachable!(),
        };
        let (_, tickets, _) = in_time(g.next(&0).unwrap(), None);
        answer_all(tickets, Ok(vec![7]));
        assert_eq!(a.try_recv().unwrap().unwrap(), 7);
        assert!(b.try_recv().unwrap().is_err());
    }
}
