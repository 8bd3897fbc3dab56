//! Reaching Redis servers outside the shared connection: asking Sentinels for the master, probing a candidate's role and replication, and the node's small state files.

use super::{BTreeMap, Duration, Path, RedisConfig, Replica, ServerAuth, StoreError, StoreResult, Value, role_of};

pub(super) fn sentinel_url(cfg: &RedisConfig, addr: &str) -> String {
    let auth = ServerAuth {
        username: String::new(),
        password: cfg.sentinel_password.clone(),
        tls: cfg.tls,
        insecure: cfg.insecure_skip_tls_verify,
    };
    auth.url(addr)
}

/// Asks every sentinel at once for the master of `redis.master_name` and
/// takes the address most of those that answered name (ties: the one named
/// by the sentinel listed first), so one stale sentinel cannot send the node
/// to an old master, and one that hangs delays nothing. The caller confirms
/// the answer with `ROLE` before using it.
pub(crate) async fn ask_sentinels(cfg: &RedisConfig) -> StoreResult<String> {
    let timeout = Duration::from_millis(cfg.timeout_ms.min(1000));
    let asks = cfg.sentinels.iter().map(|addr| async move {
        let ask = async {
            let client = redis::Client::open(sentinel_url(cfg, addr)).map_err(|e| e.to_string())?;
            let mut c = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            let r: Option<(String, String)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&cfg.master_name)
                .query_async(&mut c)
                .await
                .map_err(|e| e.to_string())?;
            r.map(|(h, p)| format!("{h}:{p}"))
                .ok_or_else(|| format!("does not know a master named `{}`", cfg.master_name))
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(r) => r.map_err(|e| format!("{addr}: {e}")),
            Err(_) => Err(format!("{addr}: no answer within {} ms", timeout.as_millis())),
        }
    });
    let results = futures_util::future::join_all(asks).await;
    let named: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let best = named
        .iter()
        .max_by_key(|m| {
            let votes = named.iter().filter(|x| x == m).count();
            // Earlier in the list wins a tie: max_by_key keeps the last max.
            let first = named.iter().position(|x| x == *m).unwrap_or(0);
            (votes, usize::MAX - first)
        })
        .map(|m| (*m).clone());
    best.ok_or_else(|| {
        let errors: Vec<String> = results.into_iter().filter_map(|r| r.err()).collect();
        StoreError::Unavailable(format!("no sentinel named the master: {}", errors.join("; ")))
    })
}

/// Opens a fresh connection to `addr` and checks that it answers as a master.
pub(crate) async fn probe_master(auth: &ServerAuth, addr: &str, timeout: Duration) -> Result<(), String> {
    let role = probe_role(auth, addr, timeout).await?;
    if role == "master" {
        Ok(())
    } else {
        Err(format!("{addr} is a {role}, not a master"))
    }
}

/// `ROLE` of the server at `addr`, on a fresh connection with a deadline.
pub(crate) async fn probe_role(auth: &ServerAuth, addr: &str, timeout: Duration) -> Result<String, String> {
    let run = async {
        let client = redis::Client::open(auth.url(addr)).map_err(|e| e.to_string())?;
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut c = client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| e.to_string())?;
        let v: Value = redis::cmd("ROLE")
            .query_async(&mut c)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<String, String>(role_of(&v))
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| format!("{addr}: no answer within {} ms", timeout.as_millis()))?
}

/// Parses `INFO replication` of a master: its offset and its replicas.
pub(crate) fn parse_replication(text: &str) -> (Option<i64>, Vec<Replica>) {
    let mut offset: Option<i64> = None;
    let mut replicas = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("master_repl_offset:") {
            offset = v.parse().ok();
        } else if line.starts_with("slave") && line.contains(":ip=") {
            let fields: BTreeMap<&str, &str> = line
                .split_once(':')
                .map(|(_, rest)| rest)
                .unwrap_or("")
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .collect();
            replicas.push(Replica {
                addr: format!(
                    "{}:{}",
                    fields.get("ip").unwrap_or(&""),
                    fields.get("port").unwrap_or(&"")
                ),
                state: fields.get("state").unwrap_or(&"").to_string(),
                offset: fields.get("offset").and_then(|v| v.parse().ok()).unwrap_or(0),
                lag_bytes: 0,
                lag_s: fields.get("lag").and_then(|v| v.parse().ok()).unwrap_or(0),
            });
        }
    }
    if let Some(o) = offset {
        for r in &mut replicas {
            r.lag_bytes = (o - r.offset).max(0);
        }
    }
    (offset, replicas)
}

/// Writes `content` to `path` by a rename, so a reader sees the old or the
/// new content, never a torn one.
pub(crate) fn write_atomic(path: &Path, content: &str) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

/// `host:port` with a numeric port.
pub(crate) fn is_addr(s: &str) -> bool {
    s.len() <= 256
        && s.rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
}
