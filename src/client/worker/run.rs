//! The worker's loops: its registration heartbeat, the claim loop, and one task's run with its heartbeat, cancellation and report.

use super::*;

pub(super) async fn registration_loop(s: Arc<Shared>, done: CancellationToken, killed: CancellationToken) {
    tokio::select! {
        _ = registration_beats(&s, &done) => {}
        _ = killed.cancelled() => {}
    }
}

pub(super) async fn registration_beats(s: &Shared, done: &CancellationToken) {
    let every = s.ttl / 3;
    let hb = registration_of(s);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = done.cancelled() => return,
        }
        // Bounded by the ttl: a heartbeat that only lands after the ttl is
        // no use, and the next one is due anyway.
        let call = s.client.heartbeat_node(&s.id, &hb);
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
        };
        // Never abandoned half-way: a claim applied whose answer is dropped
        // would strand its tasks until their timeout.
        match s.client.claim(&queue, &req).await {
            Ok(tasks) => {
                backoff = Duration::from_millis(100);
                for task in tasks {
                    let permit = permits.pop().expect("no more tasks than permits");
                    inc(&s.counters.claimed);
                    let (s, run) = (s.clone(), run.clone());
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = run_task(&s, task, &run) => {}
                            _ = run.killed.cancelled() => {}
                        }
                        drop(permit);
                    });
                }
            }
            Err(e) => {
                drop(permits);
                if e.status() == Some(409) {
                    // Not registered (expired, or removed): register again.
                    let _ = s.client.heartbeat_node(&s.id, &registration_of(&s)).await;
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

pub(super) async fn run_task(s: &Shared, task: Task, run: &Run) {
    let ctx = Ctx::new(&s.id);
    let mut handle = tokio::spawn((s.handler)(task.clone(), ctx.clone()));
    // Dropped with this future (the run was killed): the handler stops too.
    let _abort = AbortOnDrop(handle.abort_handle());
    let outcome = tokio::select! {
        r = &mut handle => match r {
            Ok(r) => Outcome::Done(r),
            Err(e) => Outcome::Panicked(e.to_string()),
        },
        _ = heartbeat_loop(s, &task, &ctx) => unreachable!("the heartbeat loop never ends"),
        _ = run.hard_stop.cancelled() => {
            ctx.cancel(CancelReason::Shutdown);
            handle.abort();
            Outcome::HandedBack
        }
    };
    if ctx.cancel_reason() == Some(CancelReason::Lost) {
        // The token is stale: someone else may be running the task. Nothing
        // this worker sends with it could change anything; send nothing.
        inc(&s.counters.dropped);
        return;
    }
    let cancel_requested = ctx.cancel_reason() == Some(CancelReason::CancelRequested);
    match outcome {
        Outcome::Done(Ok(result)) => {
            let c = Complete {
                token: task.token,
                result,
                next: None,
            };
            let done = report(s, &task, &ctx, run, |client| {
                let c = c.clone();
                let id = task.id.clone();
                async move { client.complete(&id, &c).await }
            })
            .await;
            if done {
                inc(&s.counters.completed);
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
}

pub(super) async fn report_fail(s: &Shared, task: &Task, ctx: &Ctx, run: &Run, f: Fail, counter: &AtomicU64) {
    let ok = report(s, task, ctx, run, |client| {
        let f = f.clone();
        let id = task.id.clone();
        async move { client.fail(&id, &f).await }
    })
    .await;
    if ok {
        inc(counter);
    }
}

/// Sends a complete or fail until it is applied (true) or refused (false,
/// counted as dropped). A 409 is checked against the task: if it finished
/// with this very token, an earlier try of this call was applied and only
/// its answer was lost.
pub(super) async fn report<F, Fut>(s: &Shared, task: &Task, ctx: &Ctx, run: &Run, call: F) -> bool
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<Finished>>,
{
    let mut backoff = Duration::from_millis(200);
    loop {
        match call(s.client.clone()).await {
            Ok(_) => return true,
            Err(e) if e.is_conflict() => {
                let ours = match s.client.task(&task.id).await {
                    Ok(t) => {
                        t.token == Some(task.token)
                            && t.attempt_log.iter().any(|a| {
                                a.token == task.token && matches!(a.outcome.as_deref(), Some("succeeded" | "failed"))
                            })
                    }
                    Err(_) => false,
                };
                if !ours {
                    ctx.cancel(CancelReason::Lost);
                    inc(&s.counters.dropped);
                }
                return ours;
            }
            Err(e) if e.is_transient() && !run.hard_stop.is_cancelled() => {
                tracing::warn!(task = %task.id, error = %e, "reporting the outcome failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = run.hard_stop.cancelled() => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                // Refused for good (4xx), or the worker is stopping hard:
                // the task's timeout or this worker's expiry recovers it.
                tracing::error!(task = %task.id, error = %e, "cannot report the task's outcome");
                return false;
            }
        }
    }
}

/// Heartbeats the task every `task_heartbeat` until dropped: on 409 the
/// handler is cancelled as [`CancelReason::Lost`] and heartbeats stop; on a
/// cancel request it is cancelled as [`CancelReason::CancelRequested`].
pub(super) async fn heartbeat_loop(s: &Shared, task: &Task, ctx: &Ctx) {
    loop {
        tokio::time::sleep(s.task_heartbeat).await;
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
            Err(e) if e.is_conflict() => {
                tracing::warn!(task = %task.id, "the task was taken from this worker (409); cancelling its handler");
                ctx.cancel(CancelReason::Lost);
                std::future::pending::<()>().await;
            }
            Err(e) => tracing::warn!(task = %task.id, error = %e, "task heartbeat failed"),
        }
    }
}
