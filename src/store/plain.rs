//! The few plain commands outside the scripts: what the operator page shows
//! about the server, and dashboard sessions (one key each, with a TTL).

use super::{Store, StoreResult};

/// What `ROLE`, `INFO memory` and `DBSIZE` say about the server.
#[derive(Debug, Clone)]
pub struct ServerState {
    /// master, slave, sentinel (the first element of `ROLE`).
    pub role: String,
    pub used_memory: Option<u64>,
    pub dbsize: u64,
}

impl Store {
    /// One pipelined read of the server's role, memory and key count.
    pub async fn server_state(&self) -> StoreResult<ServerState> {
        let mut p = redis::pipe();
        p.cmd("ROLE").cmd("INFO").arg("memory").cmd("DBSIZE");
        let (role, mem, dbsize): (redis::Value, String, u64) = self.pipe("redis_summary", &p).await?;
        let role = match role {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(redis::Value::SimpleString(s)) => s.clone(),
                _ => "unknown".into(),
            },
            _ => "unknown".into(),
        };
        let used_memory = mem
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok());
        Ok(ServerState {
            role,
            used_memory,
            dbsize,
        })
    }

    /// Stores a dashboard session under the hash of its id: `value` (the
    /// hash of its token) for `ttl_ms`.
    pub async fn session_put(&self, id_hash: &str, value: &str, ttl_ms: u64) -> StoreResult<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.keys().session(id_hash)).arg(value).arg("PX").arg(ttl_ms);
        self.exec("session_create", &cmd).await
    }

    /// The value of a session, None when it ended or expired.
    pub async fn session_get(&self, id_hash: &str) -> StoreResult<Option<String>> {
        self.query("session_get", redis::cmd("GET").arg(self.keys().session(id_hash)))
            .await
    }

    /// Ends a session on every node.
    pub async fn session_del(&self, id_hash: &str) -> StoreResult<()> {
        self.exec("session_end", redis::cmd("DEL").arg(self.keys().session(id_hash)))
            .await
    }
}
