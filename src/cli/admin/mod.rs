//! The admin commands: what operators script today with curl, on the typed
//! client. `muster task submit | get | wait | cancel | retry`,
//! `muster queue list | pause | resume`, `muster dead list | retry |
//! discard`, `muster node list | drain`, `muster schedule list | trigger`.
//!
//! Every command takes `--url` (several, comma-separated: failover; or
//! `MUSTER_URL`), `--token` (or `MUSTER_TOKEN`) and `--json`; it prints a
//! table for people, or with `--json` the answer as JSON for scripts. The
//! exit code says what happened ([`exit`]).

mod table;

use std::time::Duration;

use clap::{Args, Subcommand};
use muster_client::{Client, Error, ScheduleList, TaskSpec};
use serde::Serialize;

use crate::cli::duration::parse_duration;

/// What an admin command's exit code means.
pub mod exit {
    /// Done as asked (for `task wait`: the task succeeded).
    pub const DONE: u8 = 0;
    /// The node refused (a 4xx: not found, wrong state, no permission), or
    /// for `task wait` the task ended dead or cancelled.
    pub const REFUSED: u8 = 1;
    /// The command line was wrong (clap's own code for bad flags, too).
    pub const USAGE: u8 = 2;
    /// No node answered in time, or it failed (5xx): try again later.
    pub const UNAVAILABLE: u8 = 3;
}

/// How to reach the cluster, shared by every admin command.
#[derive(Args, Clone, Debug)]
pub struct Conn {
    /// Node URLs, comma-separated: the client fails over between them (or MUSTER_URL).
    #[arg(
        long,
        env = "MUSTER_URL",
        default_value = "http://127.0.0.1:7700",
        value_delimiter = ',',
        global = true
    )]
    pub url: Vec<String>,
    /// Bearer token (or MUSTER_TOKEN).
    #[arg(long, env = "MUSTER_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print the answer as JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// How long to keep trying unreachable nodes before giving up (exit 3).
    #[arg(long, default_value = "10s", value_parser = parse_duration, global = true)]
    pub retry_for: Duration,
}

/// `muster task ...`
#[derive(Subcommand, Clone, Debug)]
pub enum TaskCommand {
    /// Submit a task; prints its id and state.
    Submit {
        queue: String,
        /// The payload, JSON (`'{"to":"a@b"}'`); default null.
        #[arg(long, default_value = "null")]
        payload: String,
        /// -1000 to 1000; higher first.
        #[arg(long)]
        priority: Option<i32>,
        /// Claimable after this long (500ms, 60s, 2h, ...).
        #[arg(long, value_parser = parse_duration)]
        delay: Option<Duration>,
        /// Concurrency group.
        #[arg(long)]
        group: Option<String>,
        /// The same key within the window gives the same task, never a second.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Executions before the task is dead.
        #[arg(long)]
        max_attempts: Option<u32>,
    },
    /// Show a task.
    Get { id: String },
    /// Wait until a task is succeeded, dead or cancelled; exit 0 when it
    /// succeeded, 1 when it ended otherwise, 3 when --timeout ran out.
    Wait {
        id: String,
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Cancel a queued or delayed task, or ask a running one's worker to stop.
    Cancel { id: String },
    /// Queue a dead task again with a fresh set of attempts.
    Retry { id: String },
}

/// `muster queue ...`
#[derive(Subcommand, Clone, Debug)]
pub enum QueueCommand {
    /// Every queue with its counts.
    List,
    /// Stop handing out the queue's tasks (running ones go on).
    Pause { queue: String },
    /// Hand out the queue's tasks again.
    Resume { queue: String },
}

/// `muster dead ...`
#[derive(Subcommand, Clone, Debug)]
pub enum DeadCommand {
    /// Dead tasks, newest first: of one queue, or of all.
    List {
        #[arg(long)]
        queue: Option<String>,
        /// 1 to 500.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Queue dead tasks again, oldest first: a queue's (`*`: every queue's).
    Retry {
        queue: String,
        /// At most this many; default all.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Delete dead tasks now, oldest first: a queue's (`*`: every queue's).
    Discard {
        queue: String,
        /// At most this many; default all.
        #[arg(long)]
        limit: Option<u64>,
    },
}

/// `muster node ...`
#[derive(Subcommand, Clone, Debug)]
pub enum NodeCommand {
    /// Nodes and workers in the registry.
    List,
    /// Stop a node or worker taking new tasks; it finishes what it runs.
    Drain { id: String },
}

/// `muster schedule ...`
#[derive(Subcommand, Clone, Debug)]
pub enum ScheduleCommand {
    /// Every schedule with its next fire time.
    List,
    /// Fire a schedule now (once per --key: a repeated key fires nothing more).
    Trigger {
        id: String,
        #[arg(long)]
        key: Option<String>,
    },
}

/// One admin command.
#[derive(Clone, Debug)]
pub enum Admin {
    Task(TaskCommand),
    Queue(QueueCommand),
    Dead(DeadCommand),
    Node(NodeCommand),
    Schedule(ScheduleCommand),
}

/// Why a command stopped early: the code and what to print.
struct Stop(u8, String);

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        let code = match &e {
            Error::Api(p) if p.status < 500 => exit::REFUSED,
            Error::Api(_) | Error::Unreachable { .. } | Error::Timeout(_) => exit::UNAVAILABLE,
            Error::Decode { .. } => exit::UNAVAILABLE,
            Error::Invalid(_) => exit::USAGE,
        };
        Stop(code, e.to_string())
    }
}

fn usage(msg: impl Into<String>) -> Stop {
    Stop(exit::USAGE, msg.into())
}

/// Runs one admin command; returns the exit code ([`exit`]).
pub async fn run(cmd: Admin, conn: Conn) -> u8 {
    match dispatch(cmd, &conn).await {
        Ok(code) => code,
        Err(Stop(code, msg)) => {
            eprintln!("muster: {msg}");
            code
        }
    }
}

/// Prints `value` as JSON, or through `human` as a table.
fn show<T: Serialize>(conn: &Conn, value: &T, human: impl FnOnce(&T) -> String) -> Result<u8, Stop> {
    if conn.json {
        let s = serde_json::to_string_pretty(value).map_err(|e| Stop(exit::UNAVAILABLE, e.to_string()))?;
        println!("{s}");
    } else {
        print!("{}", human(value));
    }
    Ok(exit::DONE)
}

fn name(what: &str, v: &str) -> Result<(), Stop> {
    if muster_api::is_name(v) {
        Ok(())
    } else {
        Err(usage(format!(
            "`{v}` is not a {what} name: 1 to 128 characters from A-Z a-z 0-9 . _ -"
        )))
    }
}

/// The queue of a bulk dead-letter action: a name, or `*` for every queue.
fn queue_or_all(v: &str) -> Result<(), Stop> {
    if v == "*" { Ok(()) } else { name("queue", v) }
}

async fn dispatch(cmd: Admin, conn: &Conn) -> Result<u8, Stop> {
    let c = Client::builder()
        .urls(conn.url.iter().cloned())
        .token_opt(conn.token.clone())
        .retry_for(conn.retry_for)
        .build()?;
    match cmd {
        Admin::Task(t) => task(&c, conn, t).await,
        Admin::Queue(QueueCommand::List) => {
            let queues = c.queues().await?;
            show(conn, &queues, |q| table::queues(q))
        }
        Admin::Queue(QueueCommand::Pause { queue }) => {
            name("queue", &queue)?;
            c.pause_queue(&queue).await?;
            show(conn, &(), |_| format!("paused {queue}\n"))
        }
        Admin::Queue(QueueCommand::Resume { queue }) => {
            name("queue", &queue)?;
            c.resume_queue(&queue).await?;
            show(conn, &(), |_| format!("resumed {queue}\n"))
        }
        Admin::Dead(d) => dead(&c, conn, d).await,
        Admin::Node(NodeCommand::List) => {
            let nodes = c.nodes().await?;
            show(conn, &nodes, |n| table::nodes(n))
        }
        Admin::Node(NodeCommand::Drain { id }) => {
            if !muster_api::is_node_id(&id) {
                return Err(usage(format!(
                    "`{id}` is not a node id: 1 to 64 characters from A-Z a-z 0-9 . _ -"
                )));
            }
            c.drain_node(&id).await?;
            show(conn, &(), |_| format!("draining {id}\n"))
        }
        Admin::Schedule(ScheduleCommand::List) => {
            let schedules = c.schedules().await?;
            show(conn, &ScheduleList { schedules }, |l| table::schedules(&l.schedules))
        }
        Admin::Schedule(ScheduleCommand::Trigger { id, key }) => {
            name("schedule", &id)?;
            let t = c.trigger_schedule(&id, key.as_deref()).await?;
            show(conn, &t, |t| {
                format!("triggered {id}: task {} in {}\n", t.task, t.queue)
            })
        }
    }
}

async fn task(c: &Client, conn: &Conn, t: TaskCommand) -> Result<u8, Stop> {
    match t {
        TaskCommand::Submit {
            queue,
            payload,
            priority,
            delay,
            group,
            idempotency_key,
            max_attempts,
        } => {
            name("queue", &queue)?;
            let payload: serde_json::Value = serde_json::from_str(&payload).map_err(|e| {
                usage(format!(
                    "--payload is not JSON ({e}): quote it, e.g. '{{\"to\":\"a@b\"}}'"
                ))
            })?;
            let spec = TaskSpec {
                payload,
                priority,
                delay_ms: delay.map(|d| d.as_millis() as u64),
                group,
                idempotency_key,
                max_attempts,
                ..TaskSpec::default()
            };
            let s = c.submit(&queue, &spec).await?;
            show(conn, &s, |s| {
                table::render(
                    &["ID", "QUEUE", "STATE", "REPLAYED"],
                    &[vec![
                        s.id.clone(),
                        s.queue.clone(),
                        s.state.clone(),
                        s.replayed.to_string(),
                    ]],
                )
            })
        }
        TaskCommand::Get { id } => {
            let t = c.task(&id).await?;
            show(conn, &t, table::task)
        }
        TaskCommand::Wait { id, timeout } => {
            let t = c.wait_for_result(&id, timeout).await?;
            show(conn, &t, table::task)?;
            Ok(if t.state == "succeeded" {
                exit::DONE
            } else {
                exit::REFUSED
            })
        }
        TaskCommand::Cancel { id } => {
            let r = c.cancel(&id).await?;
            show(conn, &r, |r| {
                if r.cancel_requested && r.state == "running" {
                    format!("{id}: running; its worker was asked to stop\n")
                } else {
                    format!("{id}: {}\n", r.state)
                }
            })
        }
        TaskCommand::Retry { id } => {
            c.retry_task(&id).await?;
            let v = serde_json::json!({"id": id, "state": "queued"});
            show(conn, &v, |_| format!("{id}: queued\n"))
        }
    }
}

async fn dead(c: &Client, conn: &Conn, d: DeadCommand) -> Result<u8, Stop> {
    match d {
        DeadCommand::List { queue, limit } => {
            if !muster_api::bounds::TASK_PAGE_LIMIT.contains(&limit) {
                return Err(usage("--limit must be between 1 and 500"));
            }
            let page = match queue {
                Some(q) => {
                    name("queue", &q)?;
                    c.tasks(&q, "dead", limit, None).await?
                }
                None => c.dead_page(limit, None).await?,
            };
            show(conn, &page, |p| table::tasks(&p.tasks, p.total))
        }
        DeadCommand::Retry { queue, limit } => {
            queue_or_all(&queue)?;
            let r = c.retry_dead(&queue, limit).await?;
            show(conn, &r, |r| {
                format!(
                    "retried {} dead tasks of {queue}; {} left dead ({} refused: their queue could not be registered again)\n",
                    r.done, r.left, r.refused
                )
            })
        }
        DeadCommand::Discard { queue, limit } => {
            queue_or_all(&queue)?;
            let r = c.discard_dead(&queue, limit).await?;
            show(conn, &r, |r| {
                format!("discarded {} dead tasks of {queue}; {} left dead\n", r.done, r.left)
            })
        }
    }
}
