//! Group commit (issue 41): concurrent single calls of one kind for the same
//! shard ride together in one script call.
//!
//! No timer: a call that finds fewer than `in_flight` calls in flight for
//! its key goes at once, alone, so at low load nothing waits and nothing is
//! added to its latency. Calls that arrive while that many are in flight
//! queue; when one returns, everything queued (up to `max`) goes as one
//! script call in its place, and so on until the queue is empty. (One in
//! flight groups soonest, but serialises what the connection would have
//! pipelined: at a handful of callers it cost more than it saved; see
//! BENCHMARKS.md.) Under load the calls ride together, and the
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
//! Who sends what: the first call of a burst sends its own item in its
//! caller's task. When a call returns, what queued behind it goes next: a
//! lone member is handed the lead and sends its item itself, in its own
//! task (no spawn: at moderate load most "groups" are one call); a group of
//! several is sent by a task of its own, which answers every member, so a
//! caller that goes away (its request dropped) never leaves the others
//! answered "unknown" by a call still in flight. A caller dropped while it
//! leads passes the queue on all the same.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::store::StoreError;

/// What a queued member is told.
enum Msg<I, O> {
    /// Its outcome.
    Done(Result<O, StoreError>),
    /// Its turn: send its own item now (it was the only one queued), with
    /// its deadline, and pass the queue on after (the guard does it even
    /// if the member is gone before it reads this: the slot is never lost).
    Lead(I, i64, PassOn),
}

/// One queued call: its item, the Redis-time deadline it arrived with, and
/// where its outcome (or its turn) goes.
pub(super) struct Member<I, O> {
    item: I,
    deadline: i64,
    tx: oneshot::Sender<Msg<I, O>>,
}

/// What a call found when it joined its key.
enum Turn<I, O> {
    /// Nothing in flight: send the item now, alone.
    Lead(I),
    /// Queued behind the call in flight.
    Wait(oneshot::Receiver<Msg<I, O>>),
}

/// The queues of one kind of call, by key.
pub(super) struct Group<K, I, O> {
    /// A key is present while calls for it are in flight: how many, and
    /// what queued behind them.
    open: Mutex<HashMap<K, Open<I, O>>>,
    /// Calls in flight per key before the next ones queue (at least 1).
    in_flight: usize,
    /// Most members sent in one call.
    max: usize,
}

struct Open<I, O> {
    calls: usize,
    queue: Vec<Member<I, O>>,
}

impl<K: Hash + Eq + Clone, I, O> Group<K, I, O> {
    /// `in_flight` calls per key go alone before the next ones queue;
    /// groups of at most `max`.
    pub(super) fn new(in_flight: usize, max: usize) -> Self {
        Group {
            open: Mutex::new(HashMap::new()),
            in_flight: in_flight.max(1),
            max: max.max(1),
        }
    }

    fn join(&self, key: &K, item: I, deadline: i64) -> Turn<I, O> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        match open.get_mut(key) {
            Some(o) if o.calls >= self.in_flight => {
                let (tx, rx) = oneshot::channel();
                o.queue.push(Member { item, deadline, tx });
                Turn::Wait(rx)
            }
            Some(o) => {
                o.calls += 1;
                Turn::Lead(item)
            }
            None => {
                open.insert(
                    key.clone(),
                    Open {
                        calls: 1,
                        queue: Vec::new(),
                    },
                );
                Turn::Lead(item)
            }
        }
    }

    /// After a call for `key` returned: the members queued (at most `max`,
    /// oldest first), to go next as one call in its place; None, and one
    /// call fewer is in flight (the key closes at none), when nobody queued.
    fn next(&self, key: &K) -> Option<Vec<Member<I, O>>> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let o = open.get_mut(key)?;
        if o.queue.is_empty() {
            o.calls -= 1;
            if o.calls == 0 {
                open.remove(key);
            }
            return None;
        }
        let rest = o.queue.split_off(o.queue.len().min(self.max));
        Some(std::mem::replace(&mut o.queue, rest))
    }
}

/// How a kind of call is sent: `now` reads the shard's Redis time estimate,
/// `send` makes one script call of items (with the deadline given, or one
/// from now) and answers an outcome per item, in order.
pub(super) struct Sender<N, S> {
    pub(super) now: N,
    pub(super) send: S,
}

impl<N: Clone, S: Clone> Clone for Sender<N, S> {
    fn clone(&self) -> Self {
        Sender {
            now: self.now.clone(),
            send: self.send.clone(),
        }
    }
}

/// Runs one call of `item` through the group for `key` (deadline in Redis
/// ms, taken now): its outcome, exactly as if it had gone alone.
pub(super) async fn call<K, I, O, N, S, F>(
    group: &Arc<Group<K, I, O>>,
    key: K,
    item: I,
    deadline: i64,
    how: Sender<N, S>,
) -> Result<O, StoreError>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    I: Send + 'static,
    O: Send + 'static,
    N: Fn() -> Option<i64> + Clone + Send + Sync + 'static,
    S: Fn(Vec<I>, Option<i64>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Vec<O>, StoreError>> + Send + 'static,
{
    // Once this call leads, the queue goes on when it returns, or when its
    // caller goes away (the guard).
    let (item, until, _pass) = match group.join(&key, item, deadline) {
        Turn::Lead(item) => (item, None, pass_on(group.clone(), key, how.clone())),
        Turn::Wait(rx) => match rx.await {
            Ok(Msg::Done(out)) => return out,
            Ok(Msg::Lead(item, deadline, pass)) => (item, Some(deadline), pass),
            Err(_) => return Err(StoreError::Unavailable("the grouped call was lost".into())),
        },
    };
    if let (Some(d), Some(now)) = (until, (how.now)())
        && now >= d
    {
        return Err(late());
    }
    let mut out = (how.send)(vec![item], until).await?;
    out.pop()
        .ok_or_else(|| StoreError::Decode("the script answered no outcome".into()))
}

fn late() -> StoreError {
    StoreError::Unavailable(
        "the call waited for a grouped write past its deadline and was not applied; retry it".into(),
    )
}

/// Passes a key's queue on when the call that led it ends (or is dropped).
struct PassOn(Option<Box<dyn FnOnce() + Send>>);

impl PassOn {
    /// Does nothing when dropped (its slot went to someone else).
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for PassOn {
    fn drop(&mut self) {
        if let Some(pass) = self.0.take() {
            pass();
        }
    }
}

/// The guard of one in-flight slot of `key`: when dropped, the queue goes
/// on (a lone member is handed the slot, a group gets a task of its own),
/// or the slot is given back.
fn pass_on<K, I, O, N, S, F>(group: Arc<Group<K, I, O>>, key: K, how: Sender<N, S>) -> PassOn
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    I: Send + 'static,
    O: Send + 'static,
    N: Fn() -> Option<i64> + Clone + Send + Sync + 'static,
    S: Fn(Vec<I>, Option<i64>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Vec<O>, StoreError>> + Send + 'static,
{
    PassOn(Some(Box::new(move || {
        let make = || pass_on(group.clone(), key.clone(), how.clone());
        if let Some(members) = hand_on(&group, &key, &make) {
            tokio::spawn(drive(group, key, members, how));
        }
    })))
}

/// The next of `key`'s queue: a lone member is handed the lead with a
/// guard from `make` (None); a group of several is returned, for a task of
/// its own to send; None when the queue is empty (the slot is given back).
fn hand_on<K: Hash + Eq + Clone, I, O>(
    group: &Group<K, I, O>,
    key: &K,
    make: &dyn Fn() -> PassOn,
) -> Option<Vec<Member<I, O>>> {
    loop {
        let mut members = group.next(key)?;
        if members.len() > 1 {
            return Some(members);
        }
        let m = members.pop()?;
        match m.tx.send(Msg::Lead(m.item, m.deadline, make())) {
            Ok(()) => return None,
            // Its caller went away: its item is not sent, and the slot is
            // still ours; look again.
            Err(Msg::Lead(_, _, pass)) => pass.disarm(),
            Err(Msg::Done(_)) => {}
        }
    }
}

/// Sends groups of several for `key` until what is queued is a lone member
/// (handed the lead) or nothing (a task of its own: see the module header).
async fn drive<K, I, O, N, S, F>(group: Arc<Group<K, I, O>>, key: K, mut members: Vec<Member<I, O>>, how: Sender<N, S>)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    I: Send + 'static,
    O: Send + 'static,
    N: Fn() -> Option<i64> + Clone + Send + Sync + 'static,
    S: Fn(Vec<I>, Option<i64>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Vec<O>, StoreError>> + Send + 'static,
{
    loop {
        let (items, tickets, deadline) = in_time(members, (how.now)());
        if !items.is_empty() {
            answer_all(tickets, (how.send)(items, Some(deadline)).await);
        }
        let make = || pass_on(group.clone(), key.clone(), how.clone());
        match hand_on(&group, &key, &make) {
            Some(next) => members = next,
            None => return,
        }
    }
}

/// Where one member's outcome goes.
struct Ticket<I, O>(oneshot::Sender<Msg<I, O>>);

impl<I, O> Ticket<I, O> {
    fn answer(self, out: Result<O, StoreError>) {
        // A caller that went away has nobody to tell.
        let _ = self.0.send(Msg::Done(out));
    }
}

/// Splits `members` into those still within their deadline at Redis time
/// `now`: their items, their tickets, and the earliest of their deadlines;
/// the others are answered "not applied" (they are never sent).
fn in_time<I, O>(members: Vec<Member<I, O>>, now: Option<i64>) -> (Vec<I>, Vec<Ticket<I, O>>, i64) {
    let mut items = Vec::with_capacity(members.len());
    let mut tickets = Vec::with_capacity(members.len());
    let mut earliest = i64::MAX;
    for m in members {
        match now {
            Some(now) if now >= m.deadline => Ticket(m.tx).answer(Err(late())),
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
fn answer_all<I, O>(tickets: Vec<Ticket<I, O>>, out: Result<Vec<O>, StoreError>) {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Each call's size and deadline.
    type Calls = Arc<Mutex<Vec<(usize, Option<i64>)>>>;
    type Script = std::pin::Pin<Box<dyn Future<Output = Result<Vec<u32>, StoreError>> + Send>>;

    /// A "script" that takes `ms` and answers each item doubled, counting
    /// the calls and recording each call's size and deadline.
    #[derive(Clone, Default)]
    struct Fake {
        calls: Calls,
    }

    impl Fake {
        #[allow(clippy::type_complexity)]
        fn how(
            &self,
            ms: u64,
            now: Option<i64>,
        ) -> Sender<
            impl Fn() -> Option<i64> + Clone + Send + Sync + 'static,
            impl Fn(Vec<u32>, Option<i64>) -> Script + Clone + Send + Sync + 'static,
        > {
            let calls = self.calls.clone();
            Sender {
                now: move || now,
                send: move |items: Vec<u32>, d: Option<i64>| {
                    let calls = calls.clone();
                    Box::pin(async move {
                        calls.lock().unwrap().push((items.len(), d));
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        if items.contains(&13) {
                            return Err(StoreError::Unavailable("unlucky".into()));
                        }
                        Ok(items.iter().map(|i| i * 2).collect())
                    }) as Script
                },
            }
        }
    }

    #[tokio::test]
    async fn one_call_goes_alone_and_calls_behind_it_ride_together_with_their_own_outcomes() {
        let g = Arc::new(Group::<&str, u32, u32>::new(1, 100));
        let fake = Fake::default();
        // Alone: sent at once, in the caller's task, with no deadline given.
        assert_eq!(call(&g, "k", 1, 1_000, fake.how(5, Some(0))).await.unwrap(), 2);
        assert_eq!(*fake.calls.lock().unwrap(), [(1, None)]);
        fake.calls.lock().unwrap().clear();
        // Eight at once: the first alone, the seven behind it as one group
        // with the earliest deadline.
        let outs = futures_util::future::join_all(
            (1..=8u32).map(|i| call(&g, "k", i, 1_000 + i as i64, fake.how(20, Some(0)))),
        )
        .await;
        let outs: Vec<u32> = outs.into_iter().map(Result::unwrap).collect();
        assert_eq!(outs, [2, 4, 6, 8, 10, 12, 14, 16]);
        assert_eq!(*fake.calls.lock().unwrap(), [(1, None), (7, Some(1_002))]);
        assert!(g.open.lock().unwrap().is_empty(), "the key closed");
    }

    #[tokio::test]
    async fn up_to_in_flight_calls_go_alone_before_the_next_ones_queue() {
        let g = Arc::new(Group::<u8, u32, u32>::new(3, 100));
        let fake = Fake::default();
        let outs =
            futures_util::future::join_all((1..=8u32).map(|i| call(&g, 0, i, 1_000, fake.how(20, Some(0))))).await;
        assert!(outs.into_iter().all(|o| o.is_ok()));
        let calls = fake.calls.lock().unwrap().clone();
        // Three alone at once; the five behind them as one group in the
        // place of the first to return.
        assert_eq!(calls[..3], [(1, None), (1, None), (1, None)]);
        assert_eq!(calls[3..], [(5, Some(1_000))]);
        assert!(g.open.lock().unwrap().is_empty(), "every slot given back");
    }

    #[tokio::test]
    async fn a_lone_member_behind_a_call_leads_its_own_call_and_a_late_one_is_not_sent() {
        let g = Arc::new(Group::<u8, u32, u32>::new(1, 100));
        let fake = Fake::default();
        let (a, b) = tokio::join!(call(&g, 0, 1, 50, fake.how(10, Some(0))), async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            call(&g, 0, 2, 70, fake.how(10, Some(0))).await
        });
        assert_eq!((a.unwrap(), b.unwrap()), (2, 4));
        // The second led its own call, with its own deadline.
        assert_eq!(*fake.calls.lock().unwrap(), [(1, None), (1, Some(70))]);
        fake.calls.lock().unwrap().clear();
        // Past its deadline by the time it leads: answered, never sent.
        let (a, b) = tokio::join!(call(&g, 0, 1, 50, fake.how(10, Some(60))), async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            call(&g, 0, 2, 55, fake.how(10, Some(60))).await
        });
        assert_eq!(a.unwrap(), 2);
        assert!(matches!(b, Err(StoreError::Unavailable(_))));
        assert_eq!(*fake.calls.lock().unwrap(), [(1, None)]);
    }

    #[tokio::test]
    async fn a_member_gone_after_it_was_handed_the_lead_loses_no_slot() {
        let g = Arc::new(Group::<u8, u32, u32>::new(1, 100));
        let fake = Fake::default();
        let a = call(&g, 0, 1, 50, fake.how(20, None));
        let mut b = Box::pin(call(&g, 0, 2, 50, fake.how(5, None)));
        let mut a = Box::pin(a);
        // A leads; B queues behind it (polled once, then left alone).
        assert!(futures_util::poll!(&mut a).is_pending());
        assert!(futures_util::poll!(&mut b).is_pending());
        // A returns and hands B the lead; B's caller goes away before B
        // reads it.
        assert_eq!(a.await.unwrap(), 2);
        drop(b);
        assert!(g.open.lock().unwrap().is_empty(), "the slot came back");
        // The next call goes at once.
        let c = tokio::time::timeout(Duration::from_secs(1), call(&g, 0, 3, 50, fake.how(5, None))).await;
        assert_eq!(c.unwrap().unwrap(), 6);
    }

    #[tokio::test]
    async fn a_group_error_reaches_every_member_and_a_dropped_leader_passes_the_queue_on() {
        let g = Arc::new(Group::<u8, u32, u32>::new(1, 100));
        let fake = Fake::default();
        let (a, b, c) = tokio::join!(
            call(&g, 0, 1, 50, fake.how(10, None)),
            async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                call(&g, 0, 13, 50, fake.how(10, None)).await
            },
            async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                call(&g, 0, 3, 50, fake.how(10, None)).await
            }
        );
        assert_eq!(a.unwrap(), 2);
        assert!(b.is_err() && c.is_err(), "one group, one error for all");
        // A leader whose caller goes away mid-call: the one queued behind it
        // still gets its turn.
        let leader = tokio::spawn({
            let (g, how) = (g.clone(), fake.how(200, None));
            async move { call(&g, 0, 5, 50, how).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let behind = tokio::spawn({
            let (g, how) = (g.clone(), fake.how(5, None));
            async move { call(&g, 0, 6, 50, how).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        leader.abort();
        let out = tokio::time::timeout(Duration::from_secs(2), behind)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.unwrap(), 12);
    }
}
