//! `muster events tail`: prints the cluster's events as JSON lines, resuming
//! after a disconnect from the last id it printed (nothing missed while the
//! stream retains it, nothing printed twice). The following, resuming and
//! failing over are the client's ([`muster_client::Client::events`]).

use std::io::Write;

use futures_util::StreamExt;
use muster_client::{Client, EventFrame, EventsOptions};

pub struct TailOptions {
    pub url: String,
    pub token: Option<String>,
    pub topics: Option<String>,
    pub queue: Option<String>,
    pub since: Option<String>,
    /// Stop after this many events (for scripts and tests).
    pub limit: Option<u64>,
}

/// Runs until interrupted (or `limit` events were printed); fails when the
/// node refuses the subscription (a bad topic, a `since` it never issued).
pub async fn run(opts: TailOptions) -> anyhow::Result<()> {
    let client = Client::builder().url(&opts.url).token_opt(opts.token).build()?;
    let mut events = client.events(EventsOptions {
        topics: opts.topics,
        queue: opts.queue,
        since: opts.since,
    });
    let mut printed: u64 = 0;
    while let Some(frame) = events.next().await {
        match frame {
            Ok(EventFrame::Event(e)) => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", serde_json::to_string(&e)?)?;
                out.flush()?;
                printed += 1;
                if opts.limit.is_some_and(|l| printed >= l) {
                    return Ok(());
                }
            }
            Ok(EventFrame::Gap { since, oldest }) => {
                eprintln!("muster events tail: events after {since} were trimmed; the stream now starts at {oldest}");
            }
            Err(e) => anyhow::bail!("the node refused the subscription ({e})"),
        }
    }
    Ok(())
}
