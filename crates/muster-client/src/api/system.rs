//! The node itself: its failover status, live view, probes, API document.

use super::{CallOptions, Client, Method, NONE, Result, Retry, StatsSeries, Value, enc, idem};
use muster_api::system::{FailoverStatus, RedisSummary};

impl Client {
    /// The failover status of the node answering.
    pub async fn failover_status(&self) -> Result<FailoverStatus> {
        self.call_json(Method::GET, "/api/v1/failover", NONE, &idem()).await
    }

    /// The answering node's cached live view (as sent).
    pub async fn live(&self) -> Result<Value> {
        self.call_json(Method::GET, "/api/v1/live", NONE, &idem()).await
    }

    /// The node's Redis summary: how it reaches Redis, and how Redis is doing.
    pub async fn redis_summary(&self) -> Result<RedisSummary> {
        self.call_json(Method::GET, "/api/v1/redis", NONE, &idem()).await
    }

    /// The outcome history behind the dashboard's charts: `range` is
    /// `"hour"` (60 minutes) or `"month"` (30 days); one queue or all.
    pub async fn stats(&self, range: &str, queue: Option<&str>) -> Result<StatsSeries> {
        let mut path = format!("/api/v1/stats?range={}", enc(range));
        if let Some(q) = queue {
            path.push_str(&format!("&queue={}", enc(q)));
        }
        self.call_json(Method::GET, &path, NONE, &idem()).await
    }

    /// The OpenAPI document (public).
    pub async fn openapi(&self) -> Result<Value> {
        self.call_json(Method::GET, "/api/v1/openapi.json", NONE, &idem()).await
    }

    /// `/healthz`: whether the process answers (public).
    pub async fn healthz(&self) -> Result<bool> {
        Ok(self.send(Method::GET, "/healthz", None, &idem()).await?.status == 200)
    }

    /// `/readyz` of the current URL's node (no failover: the answer is
    /// about that node): whether it takes work (public); false while it
    /// cannot reach Redis, drains or stops.
    pub async fn readyz(&self) -> Result<bool> {
        match self
            .send(Method::GET, "/readyz", None, &CallOptions::new(Retry::Never))
            .await
        {
            Ok(a) => Ok(a.status == 200),
            Err(e) if e.status() == Some(503) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
