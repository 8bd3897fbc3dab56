//! The `muster` command line. The only place that uses anyhow.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use muster::config::Config;

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
    let mut cfg = Config::load(file.as_deref()).map_err(|e| e.0)?;
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
    cfg.validate().map_err(|e| e.0)?;
    Ok(cfg)
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
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("muster: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match command {
        Command::Serve(args) => runtime.block_on(serve(merge(&cli.serve, args))),
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

fn toml_string(cfg: &Config) -> anyhow::Result<String> {
    Ok(toml::to_string_pretty(cfg)?)
}

fn config_error(msg: &str) -> ExitCode {
    eprintln!("muster: configuration error: {msg}");
    ExitCode::from(2)
}

async fn serve(args: ServeArgs) -> ExitCode {
    let cfg = match load_config(&args) {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    let addr: SocketAddr = match cfg.server.listen.parse() {
        Ok(a) => a,
        Err(_) => return config_error("invalid value for key `server.listen`"),
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
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
    shutdown_signal().await;
    running.shutdown().await;
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
