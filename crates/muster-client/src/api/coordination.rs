//! Barriers (rounds, etcd-style holds, DoubleBarriers), locks and elections
//! beyond the calls a worker makes on its hot path.

use muster_api::barriers::{BarrierList, DoubleBarrierList, Released, Round, RoundList};
use muster_api::locks::{ElectionList, Leadership, LockInfo, LockList};

use super::{Client, DoubleBarrier, Entrant, Hold, Method, NONE, Result, Retry, Value, enc, idem, json, polling};

impl Client {
    // ---- barriers ---------------------------------------------------------

    /// Every configured barrier, and every etcd-style hold.
    pub async fn barriers(&self) -> Result<BarrierList> {
        self.call_json(Method::GET, "/api/v1/barriers", NONE, &idem()).await
    }

    /// Deletes a barrier's configuration, rounds and hold (admin).
    pub async fn delete_barrier(&self, name: &str) -> Result<()> {
        self.call::<Value, Value>(
            Method::DELETE,
            &format!("/api/v1/barriers/{}", enc(name)),
            None,
            &idem(),
        )
        .await
        .map(drop)
    }

    /// A barrier's stored rounds, newest first, up to `limit`.
    pub async fn rounds(&self, name: &str, limit: usize) -> Result<Vec<Round>> {
        let l: RoundList = self
            .call_json(
                Method::GET,
                &format!("/api/v1/barriers/{}/rounds?limit={limit}", enc(name)),
                NONE,
                &idem(),
            )
            .await?;
        Ok(l.rounds)
    }

    /// One round as any caller sees it (404 when unknown).
    pub async fn round(&self, name: &str, round: &str) -> Result<Round> {
        self.call_json(
            Method::GET,
            &format!("/api/v1/barriers/{}/rounds/{}", enc(name), enc(round)),
            NONE,
            &idem(),
        )
        .await
    }

    /// Raises the etcd-style barrier `name` (held by `holder`, default the
    /// token's name) for `ttl_ms` (default `barriers.idle_ttl_ms`); holding
    /// again with the same holder refreshes it. 409 when another holds it.
    pub async fn hold_barrier(&self, name: &str, holder: Option<&str>, ttl_ms: Option<u64>) -> Result<Hold> {
        let mut body = json!({});
        if let Some(h) = holder {
            body["holder"] = json!(h);
        }
        if let Some(t) = ttl_ms {
            body["ttl_ms"] = json!(t);
        }
        self.call_json(
            Method::POST,
            &format!("/api/v1/barriers/{}/hold", enc(name)),
            Some(&body),
            &idem(),
        )
        .await
    }

    /// Lifts the barrier; whether it was held.
    pub async fn release_barrier(&self, name: &str) -> Result<bool> {
        let r: Released = self
            .call_json(
                Method::POST,
                &format!("/api/v1/barriers/{}/release", enc(name)),
                NONE,
                &idem(),
            )
            .await?;
        Ok(r.released)
    }

    /// etcd-style Barrier.Wait: returns once the barrier is not held
    /// (`held: false`) or when `wait_ms` runs out (`held: true`).
    pub async fn wait_barrier(&self, name: &str, wait_ms: u64) -> Result<Hold> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/barriers/{}/wait", enc(name)),
            Some(&json!({ "wait_ms": wait_ms })),
            &polling(Retry::Idempotent, wait_ms),
        )
        .await
    }

    /// Every DoubleBarrier with entrants.
    pub async fn double_barriers(&self) -> Result<Vec<DoubleBarrier>> {
        let l: DoubleBarrierList = self
            .call_json(Method::GET, "/api/v1/double-barriers", NONE, &idem())
            .await?;
        Ok(l.double_barriers)
    }

    /// One DoubleBarrier.
    pub async fn double_barrier(&self, name: &str) -> Result<DoubleBarrier> {
        self.call_json(
            Method::GET,
            &format!("/api/v1/double-barriers/{}", enc(name)),
            NONE,
            &idem(),
        )
        .await
    }

    /// DoubleBarrier.Enter: `node` joins and waits up to `wait_ms` until
    /// `count` entrants are in (`done`). Entering again is harmless, so it is
    /// retried.
    pub async fn enter_double_barrier(&self, name: &str, node: &str, count: u32, wait_ms: u64) -> Result<Entrant> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/double-barriers/{}/enter", enc(name)),
            Some(&json!({ "node": node, "count": count, "wait_ms": wait_ms })),
            &polling(Retry::Idempotent, wait_ms),
        )
        .await
    }

    /// DoubleBarrier.Leave: `node` leaves and waits up to `wait_ms` until
    /// every entrant of the cycle has left (`done`).
    pub async fn leave_double_barrier(&self, name: &str, node: &str, wait_ms: u64) -> Result<Entrant> {
        self.call_json(
            Method::POST,
            &format!("/api/v1/double-barriers/{}/leave", enc(name)),
            Some(&json!({ "node": node, "wait_ms": wait_ms })),
            &polling(Retry::Idempotent, wait_ms),
        )
        .await
    }

    // ---- locks and elections ----------------------------------------------

    /// Every lock held or waited for.
    pub async fn locks(&self) -> Result<Vec<LockInfo>> {
        let l: LockList = self.call_json(Method::GET, "/api/v1/locks", NONE, &idem()).await?;
        Ok(l.locks)
    }

    /// Breaks a lock whatever its holder (admin); its token goes stale.
    pub async fn break_lock(&self, name: &str) -> Result<()> {
        self.call::<Value, Value>(Method::DELETE, &format!("/api/v1/locks/{}", enc(name)), None, &idem())
            .await
            .map(drop)
    }

    /// Every election with a leader.
    pub async fn elections(&self) -> Result<Vec<Leadership>> {
        let l: ElectionList = self.call_json(Method::GET, "/api/v1/elections", NONE, &idem()).await?;
        Ok(l.elections)
    }

    /// An election's leader (None when nobody leads), epoch and value.
    pub async fn leader(&self, name: &str) -> Result<Leadership> {
        self.call_json(Method::GET, &format!("/api/v1/elections/{}", enc(name)), NONE, &idem())
            .await
    }
}
