//! What the task bench reads from Redis: calls and CPU from `INFO`, and
//! the `redis-benchmark` baseline of the same server.

/// Sums `calls=` of every command in `INFO commandstats`, of the ones a
/// client sends itself (scripts and the plain commands muster uses), and of
/// scripts alone.
pub(super) fn command_calls(info: &str) -> (u64, u64, u64) {
    let mut all = 0;
    let mut sent = 0;
    let mut scripts = 0;
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, stats)) = rest.split_once(':') else {
            continue;
        };
        let calls: u64 = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        all += calls;
        if matches!(name, "fcall" | "evalsha") {
            scripts += calls;
        }
        if matches!(
            name,
            "fcall"
                | "evalsha"
                | "eval"
                | "xread"
                | "time"
                | "ping"
                | "smembers"
                | "zrange"
                | "hgetall"
                | "zcard"
                | "get"
        ) {
            sent += calls;
        }
    }
    (all, sent, scripts)
}

pub(super) fn cpu_seconds(info: &str) -> f64 {
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

pub(super) async fn info(conn: &mut redis::aio::MultiplexedConnection, section: &str) -> anyhow::Result<String> {
    Ok(redis::cmd("INFO").arg(section).query_async(conn).await?)
}

/// `redis-benchmark` EVALSHA of `return 1`, unpipelined, 50 clients.
pub(super) async fn redis_benchmark(conn: &mut redis::aio::MultiplexedConnection, url: &str) -> anyhow::Result<f64> {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(conn)
        .await?;
    let mut cmd = tokio::process::Command::new("redis-benchmark");
    if let Some(path) = url.strip_prefix("unix://") {
        cmd.args(["-s", path]);
    } else {
        let info = redis::IntoConnectionInfo::into_connection_info(url)?;
        let addr = info.addr().to_string();
        let (host, port) = addr.rsplit_once(':').unwrap_or((&addr, "6379"));
        cmd.args(["-h", host, "-p", port]);
    }
    cmd.args(["-n", "200000", "-c", "50", "-P", "1", "--csv", "EVALSHA", &sha, "0"]);
    let out = cmd.output().await?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps",...
    for line in text.lines() {
        let cols: Vec<&str> = line.split(',').map(|c| c.trim_matches('"')).collect();
        if cols.len() >= 2 && cols[0].starts_with("EVALSHA") {
            return Ok(cols[1].parse()?);
        }
    }
    anyhow::bail!("could not read redis-benchmark's output: {text}")
}
