//! The workflow janitor: forgets finished workflows past retention. It runs
//! per shard of a split namespace, each on its own cadence: a stalled master
//! holds up its own shards only.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Workflows;
use crate::store::PassLog;

pub(crate) fn spawn(workflows: Arc<Workflows>, every: Duration, cancel: CancellationToken) -> JoinHandle<()> {
    let store = workflows.store().clone();
    store.spawn_each_shard(move |shard| {
        let (workflows, cancel) = (workflows.clone(), cancel.clone());
        async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut log = PassLog::new("workflow_janitor", &shard);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = cancel.cancelled() => return,
                }
                log.outcome(workflows.janitor_in(&shard).await);
            }
        }
    })
}
