//! The worker's loops: its registration heartbeat, the claim loop, and one task's run with its heartbeat, cancellation and report.

use super::{
    Arc, AtomicU64, CancelReason, CancellationToken, ClaimRequest, Client, Complete, CompleteItem, Ctx, Duration, Fail,
    FinishedNext, Future, HandlerError, NextRequest, Ordering, Permanent, Result, Run, Shared, Task, TaskHeartbeat,
    Value, inc,
};

pub(super) async fn registration_loop(s: Arc<Shared>, done: CancellationToken, killed: CancellationToken) {
    tokio::select! {
        _ = registration_beats(&s, &done) => {}
        _ = killed.cancelled() => {}
    }
}

pub(super) async fn registration_beats(s: &Shared, done: &CancellationToken) {
    let every = s.ttl / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = done.cancelled() => return,
        }
        // Bounded by the ttl: a heartbeat that only lands after the ttl is
        // no use, and the next one is due anyway.
        let call = s.beat();
        tokio::select! {
            r = tokio::time::timeout(every.max(Duration::from_millis(200)), call) => match r {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(worker = %s.id, error = %e, "registration heartbeat failed"),
                Err(_) => tracing::warn!(worker = %s.id, "registration heartbeat timed out"),
            },
            _ = done.cancelled() => return,
        }
    }
}

pub(super) async fn claim_loop(s: Arc<Shared>, queue: String, run: Run) {
    let killed = run.killed.clone();
    tokio::select! {
        _ = claims(s, queue, run) => {}
        _ = killed.cancelled() => {}
    }
}

pub(super) async fn claims(s: Arc<Shared>, queue: String, run: Run) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // Nothing is claimed while the worker's own lease has lapsed.
        tokio::select! {
            _ = s.lease.held() => {}
            _ = run.stop_claiming.cancelled() => return,
        }
        let first = tokio::select! {
            p = run.slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = run.stop_claiming.cancelled() => return,
        };
        let mut permits = vec![first];
        while permits.len() < s.batch as usize {
            match run.slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let req = ClaimRequest {
            node: s.id.clone(),
            max: permits.len() as u32,
            wait_ms: s.claim_wait.as_millis() as u64,
            ack_ms: s.claim_ack_ms,
        };
        // Never abandoned half-way: a claim applied whose answer is dropped
        // would strand its tasks until their timeout.
        match s.watching(s.client.claim(&queue, &req)).await {
            Ok(tasks) => {
                backoff = Duration::from_millis(100);
                for task in tasks {
                    let permit = permits.pop().expect("no more tasks than permits");
                    if s.first_start(task.token) {
                        inc(&s.counters.claimed);
                        spawn_chain(s.clone(), run.clone(), task, permit);
                    }
                }
            }
            Err(e) => {
                drop(permits);
                if e.status().is_none_or(|s| s >= 500) {
                    // Not a refusal: the claim may have been applied (an
                    // answer that timed out, a 5xx, a body that could not
                    // be read). Its tasks are looked for, retried or not.
                    s.adopt_soon();
                }
                if e.status() == Some(409) {
                    // Not registered (expired, or removed): register again.
                    let _ = s.beat().await;
                }
                tracing::warn!(worker = %s.id, queue = %queue, error = %e, "claim failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = run.stop_claiming.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Runs `task` on its slot (`permit`), then each next task its complete
/// claimed in the same call, until one claims nothing.
pub(super) fn spawn_chain(s: Arc<Shared>, run: Run, task: Task, permit: tokio::sync::OwnedSemaphorePermit) {
    tokio::spawn(async move {
        let mut next = Some(task);
        while let Some(t) = next.take() {
            s.hold(t.token);
            next = tokio::select! {
                n = run_task(&s, t, &run) => n,
                _ = run.killed.cancelled() => None,
            };
        }
        drop(permit);
    });
}

/// When the adopter looks after it is asked: soon, to let the calls in
/// flight land first (their tasks are not lost), and once more later, for
/// a request that reached its node after the caller had given up on it
/// (held on the way longer than its timeout), applied after the first
/// look. Without the second look such a task waits for its claim lease.
const LOOKS: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(2_500)];

/// Looks for lost claims whenever asked ([`Shared::adopt_soon`]), until
/// the worker stops claiming: at each of [`LOOKS`], and a look that fails
/// (its list call did) is tried again with backoff until one succeeds.
pub(super) async fn adopter(s: Arc<Shared>, run: Run) {
    loop {
        tokio::select! {
            _ = s.adopt_wanted.notified() => {}
            _ = run.stop_claiming.cancelled() => return,
        }
        for wait in LOOKS {
            let mut backoff = Duration::from_millis(250);
            let mut wait = wait;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = run.stop_claiming.cancelled() => return,
                }
                // Only under a lease that holds: a task found now is not
                // taken from the worker while it runs (it was not started
                // under a lapsed one).
                tokio::select! {
                    _ = s.lease.held() => {}
                    _ = run.stop_claiming.cancelled() => return,
                }
                match adopt(&s, &run).await {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(worker = %s.id, error = %e, "could not look for lost claims; looking again");
                        wait = backoff;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    }
}

/// Runs the tasks of the worker's queues running under its id with a token
/// it never started (a claim or next task whose answer was lost), or hands
/// them back when no slot is free. Returns how many it started.
pub(super) async fn adopt(s: &Arc<Shared>, run: &Run) -> Result<u64> {
    let mut started = 0;
    for queue in &s.queues {
        let mut cursor: Option<String> = None;
        loop {
            let page = s.client.tasks(queue, "running", 500, cursor.as_deref()).await?;
            for t in page.tasks {
                let Some(token) = t.token else { continue };
                if t.owner.as_deref() != Some(s.id.as_str()) || s.holds(token) || !s.first_start(token) {
                    continue;
                }
                let Ok(permit) = run.slots.clone().try_acquire_owned() else {
                    // No free slot: hand it back rather than let it wait
                    // for its timeout.
                    let f = Fail {
                        token,
                        error: "the claim's answer was lost; handed back".into(),
                        retry: true,
                        next: None,
                    };
                    if s.client.fail(&t.id, &f).await.is_ok() {
                        inc(&s.counters.handed_back);
                    }
                    continue;
                };
                // Acknowledged before it starts: its claim lease has been
                // running since the claim. Refused: it went back to its
                // queue (or on) meanwhile, so it is not this worker's.
                match s.client.ack_task(&t.id, token).await {
                    Err(e) if e.is_conflict() || e.is_not_found() => continue,
                    _ => {}
                }
                tracing::warn!(worker = %s.id, task = %t.id, token, "adopting a task whose claim's answer was lost");
                inc(&s.counters.adopted);
                started += 1;
                let task = Task {
                    id: t.id,
                    queue: t.queue,
                    token,
                    attempt: t.attempts,
                    payload: t.payload,
                    max_attempts: t.max_attempts,
                    timeout_ms: t.timeout_ms,
                    group: t.group,
                    priority: t.priority,
                    created_at: t.created_at,
                    ack_ms: 0,
                    traceparent: t.traceparent,
                    tracestate: t.tracestate,
                };
                spawn_chain(s.clone(), run.clone(), task, permit);
            }
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
    }
    Ok(started)
}

pub(super) struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a task's execution ended, before it is reported.
pub(super) enum Outcome {
    Done(Result<Value, HandlerError>),
    Panicked(String),
    HandedBack,
}

/// Runs one task and reports its outcome; the next task when the complete
/// claimed one in the same call. With the task's trace context, the
/// attempt gets a span: the handler and every call (its own through the
/// client, and the reports) run with its `traceparent`.
pub(super) async fn run_task(s: &Shared, task: Task, run: &Run) -> Option<Task> {
    match s.tracer.begin(&task) {
        Some(attempt) => {
            let tp = attempt.traceparent();
            crate::with_traceparent(tp, run_attempt(s, task, run, Some(attempt))).await
        }
        None => run_attempt(s, task, run, None).await,
    }
}

async fn run_attempt(s: &Shared, task: Task, run: &Run, attempt: Option<super::trace::Attempt>) -> Option<Task> {
    let lease = s.lease.token();
    if lease.is_cancelled() {
        // Claimed (or brought by a complete) by a call answered after the
        // worker's lease lapsed: the cluster may be about to hand it to
        // another worker. Not started; once the lease is renewed the
        // adopter runs it if it is still held under this worker's id.
        tracing::warn!(worker = %s.id, task = %task.id, "claimed while the lease had lapsed: not started");
        s.release(task.token);
        s.forget(task.token);
        s.adopt_soon();
        return None;
    }
    let tp = attempt.as_ref().map(|a| a.traceparent());
    let ctx = Ctx::new(&s.id, tp.clone());
    let work = (s.handler)(task.clone(), ctx.clone());
    let mut handle = match tp {
        Some(tp) => tokio::spawn(crate::with_traceparent(tp, work)),
        None => tokio::spawn(work),
    };
    // Dropped with this future (the run was killed): the handler stops too.
    let _abort = AbortOnDrop(handle.abort_handle());
    let outcome = tokio::select! {
        r = &mut handle => match r {
            Ok(r) => Outcome::Done(r),
            Err(e) => Outcome::Panicked(e.to_string()),
        },
        _ = watch_task(s, &task, &ctx, &lease) => unreachable!("the heartbeat loop never ends"),
        _ = run.hard_stop.cancelled() => {
            ctx.cancel(CancelReason::Shutdown);
            handle.abort();
            Outcome::HandedBack
        }
    };
    if let Some(a) = &attempt {
        a.end(&s.tracer, &task, &s.id, &outcome);
    }
    if ctx.cancel_reason() == Some(CancelReason::Lost) {
        // The token is stale: someone else may be running the task. Nothing
        // this worker sends with it could change anything; send nothing.
        inc(&s.counters.dropped);
        s.release(task.token);
        return None;
    }
    let cancel_requested = ctx.cancel_reason() == Some(CancelReason::CancelRequested);
    match outcome {
        Outcome::Done(Ok(result)) => {
            // One call for two: the complete claims this slot's next task,
            // unless the worker takes batches, is stopping, or its lease
            // has lapsed.
            let chain = s.batch == 1 && !run.stop_claiming.is_cancelled() && s.lease.holds();
            let c = Complete {
                token: task.token,
                result,
                next: chain.then(|| NextRequest {
                    max: Some(1),
                    ack_ms: s.claim_ack_ms,
                    ..Default::default()
                }),
            };
            let reported = match &run.completes {
                Some(tx) => complete_together(s, &task, &ctx, tx, c.result).await,
                None => {
                    report(s, &task, &ctx, run, |client| {
                        let c = c.clone();
                        let id = task.id.clone();
                        async move { client.complete(&id, &c).await }
                    })
                    .await
                }
            };
            if !matches!(reported, Reported::GaveUp) {
                s.release(task.token);
            }
            match reported {
                Reported::Answer(f) => {
                    inc(&s.counters.completed);
                    let mut next = f.next.map(|n| n.tasks).unwrap_or_default().into_iter();
                    let first = next.next().filter(|t| s.first_start(t.token));
                    if first.is_some() {
                        inc(&s.counters.claimed);
                    }
                    // `max` 1: never more; should a node send more, they
                    // are found and handed back like any lost claim.
                    if next.len() > 0 {
                        s.adopt_soon();
                    }
                    return first;
                }
                Reported::AnswerLost => {
                    inc(&s.counters.completed);
                    // That answer may have carried a next task.
                    s.adopt_soon();
                }
                Reported::Applied => inc(&s.counters.completed),
                Reported::Refused | Reported::GaveUp => {}
            }
        }
        Outcome::Done(Err(e)) => {
            let permanent = e.downcast_ref::<Permanent>().is_some();
            let f = Fail {
                token: task.token,
                error: e.to_string(),
                retry: !(permanent || cancel_requested),
                next: None,
            };
            report_fail(s, &task, &ctx, run, f, &s.counters.failed).await;
        }
        Outcome::Panicked(why) => {
            inc(&s.counters.panicked);
            let f = Fail {
                token: task.token,
                error: format!("the handler panicked: {why}"),
                retry: !cancel_requested,
                next: None,
            };
            report_fail(s, &task, &ctx, run, f, &s.counters.failed).await;
        }
        Outcome::HandedBack => {
            let f = Fail {
                token: task.token,
                error: "the worker shut down before the task finished; handed back".into(),
                retry: true,
                next: None,
            };
            report_fail(s, &task, &ctx, run, f, &s.counters.handed_back).await;
        }
    }
    None
}

pub(super) async fn report_fail(s: &Shared, task: &Task, ctx: &Ctx, run: &Run, f: Fail, counter: &AtomicU64) {
    let ok = report(s, task, ctx, run, |client| {
        let f = f.clone();
        let id = task.id.clone();
        async move { client.fail(&id, &f).await }
    })
    .await;
    if !matches!(ok, Reported::Refused | Reported::GaveUp) {
        inc(counter);
    }
    if !matches!(ok, Reported::GaveUp) {
        s.release(task.token);
    }
}

/// How a complete or fail ended.
pub(super) enum Reported {
    /// Applied; the answer.
    Answer(FinishedNext),
    /// Applied within a batch complete (no next task).
    Applied,
    /// Applied by a try whose answer was lost (a retry got 409 and the task
    /// shows this token finished).
    AnswerLost,
    /// Refused: the token is no longer current (409, 404), so the task no
    /// longer runs under it.
    Refused,
    /// Given up (another 4xx, stopping hard, killed): the task may still
    /// run under this token on the server, so the worker keeps holding the
    /// token and never adopts it (its timeout or the worker's expiry
    /// recovers the task).
    GaveUp,
}

/// Sends a complete or fail until it is applied or refused (counted as
/// dropped). A 409 is checked against the task: if it finished
/// with this very token, an earlier try of this call was applied and only
/// its answer was lost.
pub(super) async fn report<F, Fut>(s: &Shared, task: &Task, ctx: &Ctx, run: &Run, call: F) -> Reported
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<FinishedNext>>,
{
    match until_answered(s, &run.hard_stop, &task.id, || call(s.client.clone())).await {
        Ok(f) => Reported::Answer(f),
        Err(e) if e.is_conflict() => resolve_conflict(s, task, ctx).await,
        Err(e) if e.is_not_found() => {
            // The task is gone: nothing runs under the token.
            tracing::warn!(task = %task.id, error = %e, "the task is gone; its result is dropped");
            ctx.cancel(CancelReason::Lost);
            inc(&s.counters.dropped);
            Reported::Refused
        }
        Err(e) => {
            // Refused for good (4xx), or the worker is stopping hard:
            // the task's timeout or this worker's expiry recovers it.
            tracing::error!(task = %task.id, error = %e, "cannot report the task's outcome");
            Reported::GaveUp
        }
    }
}

/// Sends a call that reports outcomes (a complete, a fail, a batch of
/// completes) until it is answered, refused (any error but a transient
/// one), or the worker stops hard; transient errors are retried with
/// backoff. `what` names it in the log.
pub(super) async fn until_answered<T, F, Fut>(
    s: &Shared,
    hard_stop: &CancellationToken,
    what: &str,
    call: F,
) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut backoff = Duration::from_millis(200);
    loop {
        match s.watching(call()).await {
            Err(e) if e.is_transient() && !hard_stop.is_cancelled() => {
                tracing::warn!(worker = %s.id, call = %what, error = %e, "reporting an outcome failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = hard_stop.cancelled() => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            answer => return answer,
        }
    }
}

/// A complete or fail got 409: applied by an earlier try whose answer was
/// lost if the task ended with this very token (then it counts), else the
/// token is stale: the handler is told and the result dropped.
pub(super) async fn resolve_conflict(s: &Shared, task: &Task, ctx: &Ctx) -> Reported {
    let ours = match s.client.task(&task.id).await {
        Ok(t) => {
            t.token == Some(task.token)
                && t.attempt_log
                    .iter()
                    .any(|a| a.token == task.token && matches!(a.outcome.as_deref(), Some("succeeded" | "failed")))
        }
        Err(_) => false,
    };
    if !ours {
        ctx.cancel(CancelReason::Lost);
        inc(&s.counters.dropped);
        return Reported::Refused;
    }
    Reported::AnswerLost
}

/// Hands a result to the batch completer and waits for its outcome.
async fn complete_together(
    s: &Shared,
    task: &Task,
    ctx: &Ctx,
    tx: &tokio::sync::mpsc::Sender<super::complete::Pending>,
    result: Value,
) -> Reported {
    use super::complete::{Batched, Pending};
    let (reply, answer) = tokio::sync::oneshot::channel();
    let item = CompleteItem {
        id: task.id.clone(),
        token: task.token,
        result,
    };
    if tx.send(Pending { item, reply }).await.is_err() {
        return Reported::GaveUp;
    }
    match answer.await {
        Ok(Batched::Completed) => Reported::Applied,
        Ok(Batched::Conflict) => resolve_conflict(s, task, ctx).await,
        Ok(Batched::Refused(why)) => {
            tracing::error!(task = %task.id, error = %why, "the task's complete was refused");
            Reported::Refused
        }
        Ok(Batched::GaveUp(why)) => {
            tracing::error!(task = %task.id, error = %why, "cannot report the task's outcome");
            Reported::GaveUp
        }
        Err(_) => Reported::GaveUp,
    }
}

/// Heartbeats the task and watches the worker's lease until dropped: when
/// the lease lapses the handler is cancelled as
/// [`CancelReason::LeaseExpired`] and heartbeats stop (its outcome, reported
/// with the token, settles whether the task was still this worker's).
async fn watch_task(s: &Shared, task: &Task, ctx: &Ctx, lease: &CancellationToken) {
    tokio::select! {
        _ = heartbeat_loop(s, task, ctx) => {}
        _ = lease.cancelled() => {
            tracing::warn!(task = %task.id, "the worker's lease lapsed: cancelling the handler");
            ctx.cancel(CancelReason::LeaseExpired);
        }
    }
    std::future::pending::<()>().await
}

/// Heartbeats the task every `task_heartbeat` until dropped, the first
/// time by a third of its claim lease at the latest (that heartbeat is the
/// claim's acknowledgement; a task finished sooner was acknowledged by its
/// complete or fail, with no call added): on 409 (the token is stale) or
/// 404 (the task is gone) the handler is cancelled as
/// [`CancelReason::Lost`] and heartbeats stop; on a cancel request it is
/// cancelled as [`CancelReason::CancelRequested`].
pub(super) async fn heartbeat_loop(s: &Shared, task: &Task, ctx: &Ctx) {
    let mut every = first_heartbeat(s.task_heartbeat, task.ack_ms);
    loop {
        tokio::time::sleep(every).await;
        every = s.task_heartbeat;
        let progress = match ctx.inner.progress.swap(u8::MAX, Ordering::Relaxed) {
            u8::MAX => None,
            p => Some(p),
        };
        let fields = ctx.inner.fields.lock().unwrap_or_else(|e| e.into_inner()).take();
        let hb = TaskHeartbeat {
            token: task.token,
            progress,
            fields,
        };
        match s.client.heartbeat_task(&task.id, &hb).await {
            Ok(a) => {
                if a.cancel_requested && !ctx.is_cancelled() {
                    inc(&s.counters.cancel_requests);
                    ctx.cancel(CancelReason::CancelRequested);
                }
            }
            Err(e) if e.is_conflict() || e.is_not_found() => {
                tracing::warn!(task = %task.id, error = %e, "the task was taken from this worker or is gone; cancelling its handler");
                ctx.cancel(CancelReason::Lost);
                std::future::pending::<()>().await;
            }
            Err(e) => tracing::warn!(task = %task.id, error = %e, "task heartbeat failed"),
        }
    }
}

/// When a task's first heartbeat is due: after `task_heartbeat`, or by a
/// third of the claim lease `ack_ms` (0: none) when that comes first, so
/// the acknowledgement lands well within the lease.
pub(super) fn first_heartbeat(task_heartbeat: Duration, ack_ms: u64) -> Duration {
    if ack_ms == 0 {
        return task_heartbeat;
    }
    task_heartbeat.min(Duration::from_millis(ack_ms / 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_heartbeat_comes_by_a_third_of_the_claim_lease() {
        let hb = Duration::from_secs(2);
        assert_eq!(first_heartbeat(hb, 0), hb);
        assert_eq!(first_heartbeat(hb, 10_000), hb);
        assert_eq!(first_heartbeat(hb, 3_000), Duration::from_millis(1000));
        assert_eq!(
            first_heartbeat(Duration::from_secs(30), 10_000),
            Duration::from_millis(3333)
        );
    }
}
