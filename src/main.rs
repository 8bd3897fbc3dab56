//! The `muster` command line. It and the commands under `src/cli/` are the
//! only code that uses anyhow; the library returns typed errors.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use muster::config::Config;

/// mimalloc instead of glibc's malloc: allocation was about a quarter of the
/// node's instructions per request (`scripts/node-callgrind.sh`,
/// BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "muster",
    version,
    about = "High-availability coordination server for worker clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node (the default).
    Serve(ServeArgs),
    /// Print the effective configuration (defaults, file, environment, flags) as TOML.
    Config(ServeArgs),
    /// Measure end-to-end task throughput through a running node.
    Bench(BenchArgs),
    /// Follow the cluster's events.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Measure event relay latency with many WebSocket clients on one node.
    BenchWs {
        #[arg(long, default_value = "http://127.0.0.1:7700")]
        url: String,
        #[arg(long, env = "MUSTER_TOKEN")]
        token: Option<String>,
        /// WebSocket clients to open.
        #[arg(long, default_value_t = 1000)]
        clients: usize,
        /// Tasks submitted per second while they listen.
        #[arg(long, default_value_t = 100)]
        rate: usize,
        /// How long to submit.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long)]
        json: bool,
    },
    /// Barrier rounds for cron-started scripts, and the release-latency benchmark.
    #[command(subcommand)]
    Barrier(BarrierCommand),
    /// Locks for scripts.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Tasks: submit, get, wait, cancel, retry.
    Task(AdminArgs<muster::cli::admin::TaskCommand>),
    /// Queues: list, pause, resume.
    Queue(AdminArgs<muster::cli::admin::QueueCommand>),
    /// Dead tasks: list, retry, discard.
    Dead(AdminArgs<muster::cli::admin::DeadCommand>),
    /// Nodes and workers: list, drain.
    Node(AdminArgs<muster::cli::admin::NodeCommand>),
    /// Schedules: list, trigger.
    Schedule(AdminArgs<muster::cli::admin::ScheduleCommand>),
}

/// An admin command with how to reach the cluster. Exit codes: 0 done,
/// 1 refused (4xx), 2 usage, 3 unavailable (unreachable, 5xx).
#[derive(Args)]
struct AdminArgs<C: clap::Subcommand> {
    #[command(subcommand)]
    command: C,
    #[command(flatten)]
    conn: muster::cli::admin::Conn,
}

#[derive(Subcommand)]
enum EventsCommand {
    /// Print events as JSON lines, resuming after disconnects.
    Tail {
        /// A node's URL.
        #[arg(long, default_value = "http://127.0.0.1:7700")]
        url: String,
        /// Bearer token (or MUSTER_TOKEN).
        #[arg(long, env = "MUSTER_TOKEN")]
        token: Option<String>,
        /// Event types or prefixes, comma-separated: `task.*,node.dead`.
        #[arg(long)]
        topics: Option<String>,
        /// Only events of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Start after this event id (replays what the stream retains); default: new events only.
        #[arg(long)]
        since: Option<String>,
        /// Exit after this many events.
        #[arg(long)]
        limit: Option<u64>,
    },
}

#[derive(Subcommand)]
enum BarrierCommand {
    /// Arrive at a round and wait for its verdict; print it as JSON. Exit 0:
    /// this node may run; 3: aborted; 4: late; 5: no verdict within --wait; 1: error.
    Arrive(ArriveArgs),
    /// Measure the release latency after the last arrival through running nodes.
    Bench(BarrierBenchArgs),
}

#[derive(Args, Clone)]
struct ApiArgs {
    /// The node to call (or MUSTER_URL).
    #[arg(long, env = "MUSTER_URL", default_value = "http://127.0.0.1:7700")]
    url: String,
    /// Bearer token (or MUSTER_TOKEN).
    #[arg(long, env = "MUSTER_TOKEN")]
    token: Option<String>,
}

#[derive(Args, Clone)]
struct ArriveArgs {
    /// The barrier (configured with PUT /api/v1/barriers/{name}).
    barrier: String,
    /// The round id, the same for every participant of this cycle (its date, say).
    round: String,
    /// This participant's node id.
    #[arg(long)]
    node: String,
    /// How long to wait for the verdict (500ms, 60s, 5m, ...).
    #[arg(long, default_value = "60s", value_parser = muster::cli::duration::parse_duration)]
    wait: std::time::Duration,
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(Args, Clone)]
struct BarrierBenchArgs {
    /// Nodes to spread the participants over (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:7700")]
    url: Vec<String>,
    /// Bearer token (or MUSTER_TOKEN).
    #[arg(long, env = "MUSTER_TOKEN")]
    token: Option<String>,
    #[arg(long, default_value_t = 50)]
    participants: usize,
    /// Measured rounds.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Rounds run first and not measured.
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum LockCommand {
    /// Run a command while holding a lock: wait in line, renew the lease while
    /// it runs, stop it if the lock is lost (exit 6), release it when it exits.
    /// Exit: the command's code; 5 not acquired within --wait; 1 error.
    Run(LockRunArgs),
}

#[derive(Args, Clone)]
struct LockRunArgs {
    /// The lock name.
    name: String,
    /// Lease length; renewed every third of it.
    #[arg(long, default_value = "30s", value_parser = muster::cli::duration::parse_duration)]
    ttl: std::time::Duration,
    /// Give up after waiting this long in line (exit 5). Default: wait as long as it takes.
    #[arg(long, value_parser = muster::cli::duration::parse_duration)]
    wait: Option<std::time::Duration>,
    /// Owner id shown to others. Default: <host>-<random>-<pid>.
    #[arg(long)]
    owner: Option<String>,
    /// Tie the lease to this node's liveness as well.
    #[arg(long)]
    node: Option<String>,
    /// After SIGTERM, how long the command gets before SIGKILL when the lock is lost.
    #[arg(long, default_value = "10s", value_parser = muster::cli::duration::parse_duration)]
    kill_after: std::time::Duration,
    #[command(flatten)]
    api: ApiArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Args, Clone)]
struct BenchArgs {
    /// The node to drive.
    #[arg(long, default_value = "http://127.0.0.1:7700")]
    url: String,
    /// Bearer token (or MUSTER_TOKEN).
    #[arg(long, env = "MUSTER_TOKEN")]
    token: Option<String>,
    /// Tasks in the peak phase.
    #[arg(long, default_value_t = 50_000)]
    tasks: usize,
    /// Concurrent REST workers: long-polling claims; with --batch 1 each
    /// completes a task and claims its next one in the same call.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Tasks per submit, claim and complete request (1: one at a time, as
    /// most workers run).
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Concurrent submitters.
    #[arg(long, default_value_t = 2)]
    producers: usize,
    /// Queue to use (a -warm and a -half queue are used too).
    #[arg(long, default_value = "bench")]
    queue: String,
    /// Spread the tasks over this many queues (`<queue>-0` …), as a
    /// namespace split into shards needs (redis.shards).
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// Redis for INFO and redis-benchmark; default: the node's own.
    #[arg(long)]
    redis_url: Option<String>,
    /// Skip the half-load latency phase.
    #[arg(long)]
    no_half_load: bool,
    /// Run the latency phase at this many tasks/s instead of half the
    /// measured peak (claim latency at low load: `--latency-rate 50
    /// --producers 1 --workers 1 --batch 1`).
    #[arg(long)]
    latency_rate: Option<f64>,
    /// Skip the redis-benchmark baseline.
    #[arg(long)]
    no_baseline: bool,
    /// With --batch 1: claim with a separate call after each complete, as
    /// workers without `next` do (the before-and-after comparison).
    #[arg(long)]
    no_next: bool,
    /// How the tasks are drained: `http` (raw REST calls) or `worker` (the
    /// `muster::client::Worker` library, each worker running --batch
    /// handlers at once), to see what the library costs.
    #[arg(long, default_value = "http", value_parser = ["http", "worker"])]
    via: String,
    /// Queue every task before the clock starts, so the peak rate is the
    /// drain's alone (no submits share the node meanwhile): for comparing
    /// worker libraries against raw calls.
    #[arg(long)]
    prefill: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone, Default)]
struct ServeArgs {
    /// Configuration file. Default: ./config.toml when it exists.
    #[arg(long, env = "MUSTER_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Address to listen on (server.listen).
    #[arg(long, global = true)]
    listen: Option<String>,
    /// This node's id (server.node_id).
    #[arg(long, global = true)]
    node_id: Option<String>,
    /// Redis URL: redis://, rediss:// or unix:// (redis.url). Empty: embedded.
    #[arg(long, global = true)]
    redis_url: Option<String>,
    /// Data directory (server.data_dir).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
}

fn load_config(args: &ServeArgs) -> Result<Config, String> {
    let file = args.config.clone().or_else(|| {
        let default = PathBuf::from("config.toml");
        default.exists().then_some(default)
    });
    // The flags go in before the checks: a check that needs a flag's value
    // (coordinated failover needs the node id) must see it.
    Config::load_then(file.as_deref(), |cfg| {
        if let Some(v) = &args.listen {
            cfg.server.listen = v.clone();
        }
        if let Some(v) = &args.node_id {
            cfg.server.node_id = v.clone();
        }
        if let Some(v) = &args.redis_url {
            cfg.redis.url = v.clone();
        }
        if let Some(v) = &args.data_dir {
            cfg.server.data_dir = v.clone();
        }
    })
    .map_err(|e| e.0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,muster=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let command = cli.command.unwrap_or(Command::Serve(cli.serve.clone()));
    // A node's configuration is read before its runtime starts: it sets the
    // runtime's threads (`server.worker_threads`). The other commands are
    // clients and take tokio's default.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    let mut node_cfg = None;
    if let Command::Serve(args) = &command {
        let cfg = match load_config(&merge(&cli.serve, args.clone())) {
            Ok(c) => c,
            Err(e) => return config_error(&e),
        };
        builder.worker_threads(cfg.server.runtime_threads());
        node_cfg = Some(cfg);
    }
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("muster: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match command {
        Command::Serve(_) => match node_cfg {
            Some(cfg) => runtime.block_on(serve(cfg)),
            None => ExitCode::from(1),
        },
        Command::Bench(args) => runtime.block_on(bench(args)),
        Command::BenchWs {
            url,
            token,
            clients,
            rate,
            seconds,
            json,
        } => {
            let opts = muster::cli::bench::ws::WsBenchOptions {
                url,
                token,
                clients,
                rate,
                seconds,
            };
            match runtime.block_on(muster::cli::bench::ws::run_ws(opts)) {
                Ok(r) if json => {
                    println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Ok(r) => {
                    print!("{}", muster::cli::bench::ws::render_ws(&r));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("muster bench-ws: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Events(EventsCommand::Tail {
            url,
            token,
            topics,
            queue,
            since,
            limit,
        }) => {
            let opts = muster::cli::events_tail::TailOptions {
                url,
                token,
                topics,
                queue,
                since,
                limit,
            };
            match runtime.block_on(muster::cli::events_tail::run(opts)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("muster events tail: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Barrier(BarrierCommand::Arrive(a)) => ExitCode::from(runtime.block_on(muster::cli::barrier::arrive(
            muster::cli::barrier::ArriveArgs {
                url: a.api.url,
                token: a.api.token,
                barrier: a.barrier,
                round: a.round,
                node: a.node,
                wait: a.wait,
            },
        ))),
        Command::Barrier(BarrierCommand::Bench(a)) => runtime.block_on(barrier_bench(a)),
        Command::Lock(LockCommand::Run(a)) => {
            ExitCode::from(runtime.block_on(muster::cli::lock::run(muster::cli::lock::RunArgs {
                url: a.api.url,
                token: a.api.token,
                name: a.name,
                command: a.command,
                ttl: a.ttl,
                wait: a.wait,
                owner: a.owner,
                node: a.node,
                kill_after: a.kill_after,
            })))
        }
        Command::Task(a) => admin(&runtime, muster::cli::admin::Admin::Task(a.command), a.conn),
        Command::Queue(a) => admin(&runtime, muster::cli::admin::Admin::Queue(a.command), a.conn),
        Command::Dead(a) => admin(&runtime, muster::cli::admin::Admin::Dead(a.command), a.conn),
        Command::Node(a) => admin(&runtime, muster::cli::admin::Admin::Node(a.command), a.conn),
        Command::Schedule(a) => admin(&runtime, muster::cli::admin::Admin::Schedule(a.command), a.conn),
        Command::Config(args) => match load_config(&merge(&cli.serve, args)) {
            Ok(cfg) => {
                match toml_string(&cfg) {
                    Ok(s) => print!("{s}"),
                    Err(e) => eprintln!("muster: {e}"),
                }
                ExitCode::SUCCESS
            }
            Err(e) => config_error(&e),
        },
    }
}

fn admin(
    runtime: &tokio::runtime::Runtime,
    cmd: muster::cli::admin::Admin,
    conn: muster::cli::admin::Conn,
) -> ExitCode {
    ExitCode::from(runtime.block_on(muster::cli::admin::run(cmd, conn)))
}

/// Flags given before the subcommand count as well as those after it.
fn merge(top: &ServeArgs, sub: ServeArgs) -> ServeArgs {
    ServeArgs {
        config: sub.config.or_else(|| top.config.clone()),
        listen: sub.listen.or_else(|| top.listen.clone()),
        node_id: sub.node_id.or_else(|| top.node_id.clone()),
        redis_url: sub.redis_url.or_else(|| top.redis_url.clone()),
        data_dir: sub.data_dir.or_else(|| top.data_dir.clone()),
    }
}

/// The effective configuration with every secret masked.
fn toml_string(cfg: &Config) -> anyhow::Result<String> {
    let mut cfg = cfg.clone();
    let mask = |s: &mut String| {
        if !s.is_empty() {
            *s = "***".into();
        }
    };
    mask(&mut cfg.redis.password);
    mask(&mut cfg.redis.sentinel_password);
    mask(&mut cfg.failover.secret);
    cfg.redis.url = muster::redact(&cfg.redis.url);
    Ok(toml::to_string_pretty(&cfg)?)
}

fn config_error(msg: &str) -> ExitCode {
    eprintln!("muster: configuration error: {msg}");
    ExitCode::from(2)
}

async fn serve(cfg: Config) -> ExitCode {
    tracing::info!(threads = cfg.server.runtime_threads(), "runtime started");
    let addr: SocketAddr = match cfg.server.listen.parse() {
        Ok(a) => a,
        Err(_) => return config_error("invalid value for key `server.listen`"),
    };
    match muster::raise_open_files_limit() {
        Ok(limit) if limit < cfg.server.max_connections as u64 + 256 => tracing::warn!(
            "the open-files limit ({limit}) is below server.max_connections ({}) plus 256: \
             raise it (ulimit -n, systemd's LimitNOFILE); out of files, idle connections are closed to accept new ones",
            cfg.server.max_connections
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read the open-files limit"),
    }
    let listener = match muster::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("muster: cannot listen on {addr}: {e} (is another node using this port? set --listen)");
            return ExitCode::from(1);
        }
    };
    let running = match muster::start(cfg, listener).await {
        Ok(r) => r,
        Err(muster::StartError::Config(msg)) => return config_error(&msg),
        Err(e) => {
            eprintln!("muster: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "muster node {} is ready: dashboard at {}/",
        running.node_id, running.state.advertise
    );
    // SIGTERM or ctrl-c, as a worker stops.
    muster_client::worker::shutdown_signal().await;
    running.shutdown().await;
    ExitCode::SUCCESS
}

async fn bench(a: BenchArgs) -> ExitCode {
    if a.tasks == 0 || a.workers == 0 || !(1..=1000).contains(&a.batch) || !(1..=1000).contains(&a.queues) {
        eprintln!("muster bench: --tasks and --workers must be positive, --batch and --queues between 1 and 1000");
        return ExitCode::from(2);
    }
    let opts = muster::cli::bench::tasks::BenchOptions {
        url: a.url,
        token: a.token,
        tasks: a.tasks,
        workers: a.workers,
        batch: a.batch,
        producers: a.producers,
        queue: a.queue,
        queues: a.queues,
        redis_url: a.redis_url,
        skip_half_load: a.no_half_load,
        latency_rate: a.latency_rate,
        skip_baseline: a.no_baseline,
        claim_next: !a.no_next,
        via_worker: a.via == "worker",
        prefill: a.prefill,
    };
    match muster::cli::bench::tasks::run(opts).await {
        Ok(report) => {
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            } else {
                print!("{}", muster::cli::bench::tasks::render(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("muster bench: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn barrier_bench(a: BarrierBenchArgs) -> ExitCode {
    let opts = muster::cli::bench::barriers::BenchOptions {
        urls: a.url,
        token: a.token,
        participants: a.participants,
        rounds: a.rounds,
        warmup: a.warmup,
    };
    match muster::cli::bench::barriers::run(opts).await {
        Ok(report) => {
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            } else {
                print!("{}", muster::cli::bench::barriers::render(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("muster barrier bench: {e}");
            ExitCode::from(1)
        }
    }
}
