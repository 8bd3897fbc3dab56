//! The chaos run's workers: claim, heartbeat and complete against whichever node answers, recording every completion.

use super::*;

/// A worker: heartbeats, claims, "works", completes. Aborted to kill it.
pub(super) fn spawn_worker(
    shared: Arc<Shared>,
    id: String,
) -> (tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>) {
    let hb = {
        let shared = shared.clone();
        let id = id.clone();
        tokio::spawn(async move {
            loop {
                shared
                    .call(
                        reqwest::Method::PUT,
                        &format!("/api/v1/nodes/{id}/heartbeat"),
                        Some(&json!({"ttl_ms": WORKER_TTL_MS})),
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(WORKER_TTL_MS / 8)).await;
            }
        })
    };
    let work = tokio::spawn(async move {
        // Registered before the first claim.
        while shared
            .call(
                reqwest::Method::PUT,
                &format!("/api/v1/nodes/{id}/heartbeat"),
                Some(&json!({"ttl_ms": WORKER_TTL_MS})),
            )
            .await
            .is_none_or(|(s, _)| s != 200)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut seed = id.bytes().fold(7u64, |a, b| a.wrapping_mul(31).wrapping_add(b as u64));
        while !shared.stop.load(Ordering::Relaxed) {
            let claimed = shared
                .call(
                    reqwest::Method::POST,
                    &format!("/api/v1/queues/{QUEUE}/claim"),
                    Some(&json!({"node": id, "max": 4, "wait_ms": 500})),
                )
                .await;
            let tasks = match claimed {
                Some((200, b)) => serde_json::from_value::<NextTasks>(b).map_or_else(|_| Vec::new(), |c| c.tasks),
                _ => continue,
            };
            {
                let mut held = shared.held.lock().await;
                let mine = held.entry(id.clone()).or_default();
                for t in &tasks {
                    mine.insert(t.id.clone(), (t.token, u64::from(t.attempt)));
                }
            }
            for t in &tasks {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                tokio::time::sleep(Duration::from_millis(5 + (seed >> 33) % 40)).await;
                let tid = t.id.clone();
                let token = t.token;
                let res = shared
                    .call(
                        reqwest::Method::POST,
                        &format!("/api/v1/tasks/{tid}/complete"),
                        Some(&json!({"token": token, "result": {"by": id}})),
                    )
                    .await;
                if let Some((200, _)) = res {
                    shared
                        .completions
                        .lock()
                        .await
                        .push((tid.clone(), u64::from(t.attempt), token));
                }
                if let Some(m) = shared.held.lock().await.get_mut(&id) {
                    m.remove(&tid);
                }
            }
        }
    });
    (hb, work)
}
