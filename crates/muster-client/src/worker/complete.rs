//! Completes that finish together go out together: with `batch` above 1,
//! each handler's result joins a queue that one loop sends as
//! `POST /api/v1/tasks/complete` (up to `batch` items per call), so a
//! worker claiming 100 tasks at a time also completes them in a few calls.

use tokio::sync::{mpsc, oneshot};

use super::{Arc, CancellationToken, CompleteItem, CompleteOutcome, Future, Shared};

/// One result waiting to be sent, and where its outcome goes.
pub(super) struct Pending {
    pub item: CompleteItem,
    pub reply: oneshot::Sender<Batched>,
}

/// A batch item's outcome as the completer saw it.
pub(super) enum Batched {
    /// Applied.
    Completed,
    /// Refused with 409 (a stale token, or this very complete applied by an
    /// earlier try whose answer was lost): the task decides which.
    Conflict,
    /// Refused for good: the task is gone (404).
    Refused(String),
    /// Given up (an invalid item, a 4xx for the whole batch, stopping
    /// hard): the task may still run under this token.
    GaveUp(String),
}

/// The sending side the run's tasks use, and the loop that sends.
pub(super) fn channel(
    s: Arc<Shared>,
    hard_stop: CancellationToken,
) -> (mpsc::Sender<Pending>, impl Future<Output = ()>) {
    let (tx, rx) = mpsc::channel(s.concurrency.max(1));
    (tx, completer(s, rx, hard_stop))
}

async fn completer(s: Arc<Shared>, mut rx: mpsc::Receiver<Pending>, hard_stop: CancellationToken) {
    let max = s.batch.max(1) as usize;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < max {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let items: Vec<CompleteItem> = batch.iter().map(|p| p.item.clone()).collect();
        let outcomes = send(&s, &items, &hard_stop).await;
        for (i, p) in batch.into_iter().enumerate() {
            let outcome = match &outcomes {
                Ok(all) => match all.get(i) {
                    Some(o) if o.status == "completed" => Batched::Completed,
                    Some(o) if o.status == "conflict" => Batched::Conflict,
                    Some(o) => {
                        let why = format!("{}: {}", o.status, o.error.clone().unwrap_or_default());
                        // Gone: nothing runs under the token. Otherwise
                        // (an invalid item) it still does.
                        if o.status == "not_found" {
                            Batched::Refused(why)
                        } else {
                            Batched::GaveUp(why)
                        }
                    }
                    None => Batched::GaveUp("the batch answer lacks this item".into()),
                },
                Err(e) => Batched::GaveUp(e.clone()),
            };
            let _ = p.reply.send(outcome);
        }
    }
}

/// Sends one batch until it is answered, refused for good, or the worker
/// stops hard. A batch complete changes only tasks still running under
/// their tokens, so sending it again is safe: an item applied by a lost
/// try comes back as a conflict, which its task resolves by reading itself.
async fn send(
    s: &Shared,
    items: &[CompleteItem],
    hard_stop: &CancellationToken,
) -> std::result::Result<Vec<CompleteOutcome>, String> {
    let what = format!("a batch complete of {} items", items.len());
    super::run::until_answered(s, hard_stop, &what, || s.client.complete_batch(items))
        .await
        .map_err(|e| {
            tracing::error!(worker = %s.id, items = items.len(), error = %e, "cannot send a batch complete");
            e.to_string()
        })
}
