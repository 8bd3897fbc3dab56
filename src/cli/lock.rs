//! `muster lock run <name> -- <command>`: runs a command while holding a lock.
//!
//! The command waits in line for the lock, starts the command in its own
//! process group with `MUSTER_LOCK_NAME`, `MUSTER_LOCK_OWNER` and
//! `MUSTER_LOCK_TOKEN` (the fencing token) in its environment, renews the
//! lease every third of its ttl, and releases it when the command exits.
//!
//! The lock is lost when a renew is refused (409: the lease lapsed, or an
//! admin broke the lock) or when no renew has succeeded for a whole lease,
//! measured from when the last successful renew was *sent* (the node could
//! not be reached, so the lease may have lapsed). Then the command is
//! stopped at once: SIGTERM to its process group, SIGKILL after
//! `--kill-after`. SIGINT and SIGTERM to `muster lock run` are passed on to
//! the command, and the lock is released once it has exited.
//!
//! Exit codes: the command's own (128 + signal when it was killed by one);
//! 1 an error; 5 the lock was not acquired within `--wait`; 6 the lock was
//! lost and the command stopped.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::process::Command;

use super::barrier::{Api, POLL_MS, Reply, detail};

pub const EXIT_ERROR: u8 = 1;
pub const EXIT_NOT_ACQUIRED: u8 = 5;
pub const EXIT_LOST: u8 = 6;

/// What `muster lock run` needs.
pub struct RunArgs {
    pub url: String,
    pub token: Option<String>,
    pub name: String,
    pub command: Vec<String>,
    pub ttl: Duration,
    /// None: wait as long as it takes.
    pub wait: Option<Duration>,
    pub owner: Option<String>,
    /// Tie the lease to this node's liveness.
    pub node: Option<String>,
    pub kill_after: Duration,
}

fn default_owner() -> String {
    let host = muster_api::generated_node_id();
    format!("{host}-{}", std::process::id())
}

fn signal_group(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a negative pid signals the process group the child
    // leads (it was started with process_group(0)); no memory is involved.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

/// Acquires (waiting in line), runs the command, renews, releases; returns the exit code.
pub async fn run(a: RunArgs) -> u8 {
    let prog = "muster lock run";
    if !muster_api::is_name(&a.name) {
        eprintln!("{prog}: the lock name must be 1 to 128 characters from A-Z a-z 0-9 . _ -");
        return 2;
    }
    if a.command.is_empty() {
        eprintln!("{prog}: give the command after `--`: muster lock run <name> -- <command> [args]");
        return 2;
    }
    let ttl_ms = a.ttl.as_millis() as u64;
    if ttl_ms < 300 {
        eprintln!("{prog}: --ttl must be at least 300ms");
        return 2;
    }
    let owner = a.owner.clone().unwrap_or_else(default_owner);
    let api = match Api::new(&a.url, a.token.clone()) {
        Ok(api) => api,
        Err(e) => {
            eprintln!("{prog}: {e}");
            return EXIT_ERROR;
        }
    };
    let base = format!("/api/v1/locks/{}", a.name);

    // 1. Acquire.
    let deadline = a.wait.map(|w| Instant::now() + w);
    let mut backoff = Duration::from_millis(100);
    let token = loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let wait_ms = left.map_or(POLL_MS, |l| (l.as_millis() as u64).min(POLL_MS));
        let mut body = json!({"owner": owner, "ttl_ms": ttl_ms, "wait_ms": wait_ms});
        if let Some(n) = &a.node {
            body["node"] = json!(n);
        }
        let expired = || deadline.is_some_and(|d| Instant::now() >= d);
        match api
            .post(
                &format!("{base}/acquire"),
                &body,
                Duration::from_millis(wait_ms) + Duration::from_secs(10),
            )
            .await
        {
            Reply::Answer(200, v) => match v["token"].as_u64() {
                Some(t) => break t,
                None => {
                    eprintln!("{prog}: unexpected answer: {v}");
                    return EXIT_ERROR;
                }
            },
            Reply::Answer(409, v) if v["reason"] == "busy" => {
                if expired() {
                    eprintln!("{prog}: {}", detail(&v));
                    return EXIT_NOT_ACQUIRED;
                }
            }
            Reply::Answer(status, v) if status < 500 => {
                eprintln!("{prog}: {status}: {}", detail(&v));
                return EXIT_ERROR;
            }
            other => {
                let why = match other {
                    Reply::Answer(status, v) => format!("{status}: {}", detail(&v)),
                    Reply::Unreachable(e) => format!("cannot reach {}: {e}", a.url),
                };
                if expired() {
                    eprintln!("{prog}: {why}");
                    return EXIT_NOT_ACQUIRED;
                }
                tracing::warn!("{why}; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    };
    // The lease runs from (at the latest) now.
    let mut lease_end = Instant::now() + a.ttl;

    // 2. Run the command.
    let mut child = match Command::new(&a.command[0])
        .args(&a.command[1..])
        .env("MUSTER_LOCK_NAME", &a.name)
        .env("MUSTER_LOCK_OWNER", &owner)
        .env("MUSTER_LOCK_TOKEN", token.to_string())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{prog}: cannot start `{}`: {e}", a.command[0]);
            release(&api, &base, token).await;
            return EXIT_ERROR;
        }
    };
    let pid = child.id().unwrap_or(0);

    // 3. Renew while it runs.
    let renew_every = a.ttl / 3;
    let mut next_renew = Instant::now() + renew_every;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let lost = loop {
        tokio::select! {
            status = child.wait() => {
                release(&api, &base, token).await;
                return match status {
                    Ok(s) => exit_code(s),
                    Err(e) => {
                        eprintln!("{prog}: waiting for the command failed: {e}");
                        EXIT_ERROR
                    }
                };
            }
            _ = tokio::time::sleep_until(next_renew.min(lease_end).into()) => {
                if Instant::now() >= lease_end {
                    break "no renew succeeded within the lease; it may have lapsed".to_string();
                }
                let sent = Instant::now();
                let body = json!({"token": token, "ttl_ms": ttl_ms});
                let left = lease_end.saturating_duration_since(sent);
                match api.post(&format!("{base}/renew"), &body, left.max(Duration::from_millis(50))).await {
                    Reply::Answer(200, _) => {
                        lease_end = sent + a.ttl;
                        next_renew = sent + renew_every;
                    }
                    Reply::Answer(409, v) => break detail(&v),
                    Reply::Answer(status, v) if status < 500 => break format!("{status}: {}", detail(&v)),
                    Reply::Answer(status, v) => {
                        tracing::warn!("renew failed: {status}: {}; retrying", detail(&v));
                        next_renew = Instant::now() + (renew_every / 4).max(Duration::from_millis(50));
                    }
                    Reply::Unreachable(e) => {
                        tracing::warn!("renew failed: {e}; retrying");
                        next_renew = Instant::now() + (renew_every / 4).max(Duration::from_millis(50));
                    }
                }
            }
            _ = recv(&mut term) => signal_group(pid, libc::SIGTERM),
            _ = recv(&mut int) => signal_group(pid, libc::SIGINT),
        }
    };

    // 4. Lost: stop the command now.
    eprintln!("{prog}: lock `{}` lost ({lost}); stopping the command", a.name);
    signal_group(pid, libc::SIGTERM);
    if tokio::time::timeout(a.kill_after, child.wait()).await.is_err() {
        signal_group(pid, libc::SIGKILL);
        let _ = child.wait().await;
    }
    release(&api, &base, token).await;
    EXIT_LOST
}

async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// Best effort: a refused release (the lock was already lost) changes nothing.
async fn release(api: &Api, base: &str, token: u64) {
    let _ = api
        .post(
            &format!("{base}/release"),
            &json!({"token": token}),
            Duration::from_secs(5),
        )
        .await;
}

fn exit_code(s: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        _ => EXIT_ERROR,
    }
}
