//! The real `muster` binary: embedded Redis lifecycle, signals, bad config.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn embedded_redis_pid(data_dir: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(data_dir.join("redis/redis.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

struct Proc(std::process::Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_node(dir: &std::path::Path, port: u16) -> Proc {
    Proc(
        Command::new(muster_bin())
            .args(["--listen", &format!("127.0.0.1:{port}"), "--node-id", "bin-node"])
            .arg("--data-dir")
            .arg(dir)
            .current_dir(dir)
            .env_remove("MUSTER_CONFIG")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

async fn ready(port: u16) -> bool {
    let url = format!("http://127.0.0.1:{port}/readyz");
    wait_until(Duration::from_secs(10), || async {
        matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_mode_starts_and_stops_its_redis_on_sigterm() {
    let dir = tempfile::Builder::new().prefix("mb").tempdir().unwrap();
    let port = free_port();
    let started = Instant::now();
    let mut node = spawn_node(dir.path(), port);
    assert!(ready(port).await, "ready within 10 s");
    assert!(started.elapsed() < Duration::from_secs(5), "ready within 5 s");
    let pid = embedded_redis_pid(dir.path()).expect("the embedded Redis wrote its pid");
    assert!(process_alive(pid));
    assert!(dir.path().join("redis/redis.sock").exists());
    let summary: muster::client::RedisSummary = reqwest::get(format!("http://127.0.0.1:{port}/api/v1/redis"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(summary.mode, "embedded");
    // A second node joins through the socket.
    let second_dir = tempfile::Builder::new().prefix("mb2").tempdir().unwrap();
    let port2 = free_port();
    let mut second = Proc(
        Command::new(muster_bin())
            .args(["--listen", &format!("127.0.0.1:{port2}"), "--node-id", "bin-node-2"])
            .arg("--redis-url")
            .arg(format!("unix://{}", dir.path().join("redis/redis.sock").display()))
            .arg("--data-dir")
            .arg(second_dir.path())
            .current_dir(second_dir.path())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(ready(port2).await);
    let list: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{port}/api/v1/nodes"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["alive"], 2, "{list}");
    unsafe {
        libc::kill(second.0.id() as i32, libc::SIGTERM);
    }
    let _ = second.0.wait();
    // SIGTERM: the node leaves and stops its Redis within a few seconds.
    let t = Instant::now();
    unsafe {
        libc::kill(node.0.id() as i32, libc::SIGTERM);
    }
    let status = node.0.wait().unwrap();
    assert!(status.success(), "clean exit: {status:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "stopped in {:?}", t.elapsed());
    assert!(!process_alive(pid), "the embedded Redis is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_node_leaves_no_redis_behind() {
    let dir = tempfile::Builder::new().prefix("mk").tempdir().unwrap();
    let port = free_port();
    let mut node = spawn_node(dir.path(), port);
    assert!(ready(port).await);
    let pid = embedded_redis_pid(dir.path()).unwrap();
    node.0.kill().unwrap();
    let _ = node.0.wait();
    let gone = wait_until(Duration::from_secs(5), || async { !process_alive(pid) }).await;
    assert!(gone, "the child gets SIGTERM from the kernel when its parent dies");
    // And a new node starts on the same data directory (AOF replayed).
    let mut again = spawn_node(dir.path(), port);
    assert!(ready(port).await, "restart on the same data dir");
    let _ = again.0.kill();
}

/// `server.worker_threads` sets the node's runtime threads: tokio names its
/// workers `tokio-rt-worker` in `comm` (`tokio-runtime-w` in older
/// versions, which gave blocking-pool threads the same name). Twelve is far
/// above tokio's default on this machine (one per core) and above the few
/// blocking threads a start may spawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_sets_the_runtimes_threads() {
    let dir = tempfile::Builder::new().prefix("mw").tempdir().unwrap();
    let port = free_port();
    let mut cmd = Command::new(muster_bin());
    cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--node-id", "bin-threads"])
        .arg("--data-dir")
        .arg(dir.path())
        .current_dir(dir.path())
        .env_remove("MUSTER_CONFIG")
        .env("MUSTER_SERVER__WORKER_THREADS", "12")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let node = Proc(cmd.spawn().unwrap());
    assert!(ready(port).await);
    let workers = std::fs::read_dir(format!("/proc/{}/task", node.0.id()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| matches!(name.trim(), "tokio-rt-worker" | "tokio-runtime-w"))
        .count();
    assert!(workers >= 12, "{workers} runtime threads, 12 configured");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dying_embedded_redis_is_restarted() {
    let dir = tempfile::Builder::new().prefix("mr").tempdir().unwrap();
    let port = free_port();
    let _node = spawn_node(dir.path(), port);
    assert!(ready(port).await);
    let pid = embedded_redis_pid(dir.path()).unwrap();
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let url = format!("http://127.0.0.1:{port}/readyz");
    let unready = wait_until(Duration::from_secs(5), || async {
        matches!(reqwest::get(&url).await, Ok(r) if r.status() == 503)
    })
    .await;
    assert!(unready, "not ready while the child is down");
    assert!(ready(port).await, "ready again after the restart");
    let new_pid = embedded_redis_pid(dir.path()).unwrap();
    assert_ne!(pid, new_pid);
}

#[test]
fn bad_config_names_the_key_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(muster_bin())
        .current_dir(dir.path())
        .env("MUSTER_NODES__TTL_MS", "soon")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nodes.ttl_ms"), "{err}");

    // An unknown key from the environment is named once, not doubled.
    let out = Command::new(muster_bin())
        .current_dir(dir.path())
        .env("MUSTER_NODES__TTL_MSEC", "5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown key `nodes.ttl_msec`"), "{err}");

    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[server]\nlisten = \"127.0.0.1:0\"\nlisen = 1\n").unwrap();
    let out = Command::new(muster_bin())
        .arg("--config")
        .arg(&file)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.lisen"), "{err}");

    let out = Command::new(muster_bin())
        .args(["--node-id", "bad id"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.node_id"));
}

#[test]
fn missing_redis_server_says_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(muster_bin())
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .env("MUSTER_REDIS_SERVER_BIN", "/nonexistent/redis-server")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("apt-get install -y redis-server") && err.contains("--redis-url"),
        "{err}"
    );
}
