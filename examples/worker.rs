//! A complete muster worker: `cargo run --example worker -- http://127.0.0.1:7700`
//! (several URLs fail over; `MUSTER_TOKEN` is a worker token). It sends
//! emails from the `emails` queue, four at a time, until SIGTERM or ctrl-c.

use muster_client::{Client, Worker};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), muster_client::Error> {
    let client = Client::builder()
        .urls(std::env::args().skip(1))
        .token_opt(std::env::var("MUSTER_TOKEN").ok())
        .build()?;
    let worker = Worker::builder(client)
        .queue("emails")
        .concurrency(4)
        .handler(|task, ctx| async move {
            ctx.progress(50);
            Ok(json!({"sent_to": task.payload["to"]}))
        })
        .build()?;
    let stats = worker.run().await?; // until SIGTERM or ctrl-c; finishes what it holds
    println!("{stats:?}");
    Ok(())
}
