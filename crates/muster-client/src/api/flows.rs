//! Workflows and schedules: the work that starts other work.

use muster_api::schedules::{Schedule, ScheduleList, Triggered};
use muster_api::workflows::{Workflow, WorkflowList};

use super::{
    Client, CreatedWorkflow, Method, NONE, NewWorkflow, Result, ScheduleDef, Value, enc, idem, random_key, unkeyed,
};

impl Client {
    // ---- workflows --------------------------------------------------------

    /// Starts a workflow (a random idempotency key unless `w` has one, so
    /// the call is retried safely).
    pub async fn start_workflow(&self, w: &NewWorkflow) -> Result<CreatedWorkflow> {
        let keyed;
        let w = match w.idempotency_key {
            Some(_) => w,
            None => {
                keyed = NewWorkflow {
                    idempotency_key: Some(random_key()),
                    ..w.clone()
                };
                &keyed
            }
        };
        self.call_json(Method::POST, "/api/v1/workflows", Some(w), &idem())
            .await
    }

    /// A page of workflows, newest first, optionally in one `state`
    /// (running, succeeded, failed, cancelled), with the cursor of the
    /// next page.
    pub async fn workflows(&self, state: Option<&str>, limit: usize) -> Result<WorkflowList> {
        let mut path = format!("/api/v1/workflows?limit={limit}");
        if let Some(st) = state {
            path.push_str(&format!("&state={}", enc(st)));
        }
        self.call_json(Method::GET, &path, NONE, &idem()).await
    }

    /// A workflow's state and each task's.
    pub async fn workflow(&self, id: &str) -> Result<Workflow> {
        self.call_json(Method::GET, &format!("/api/v1/workflows/{}", enc(id)), NONE, &idem())
            .await
    }

    /// Cancels a workflow (admin): what has not started is cancelled,
    /// running tasks are asked to stop. 409 when it already finished.
    pub async fn cancel_workflow(&self, id: &str) -> Result<()> {
        self.call::<Value, Value>(
            Method::POST,
            &format!("/api/v1/workflows/{}/cancel", enc(id)),
            None,
            &idem(),
        )
        .await
        .map(drop)
    }

    // ---- schedules --------------------------------------------------------

    /// Every schedule with its next fire times and totals (no history).
    pub async fn schedules(&self) -> Result<Vec<Schedule>> {
        let l: ScheduleList = self.call_json(Method::GET, "/api/v1/schedules", NONE, &idem()).await?;
        Ok(l.schedules)
    }

    /// One schedule with its 50 newest history entries.
    pub async fn schedule(&self, id: &str) -> Result<Schedule> {
        self.call_json(Method::GET, &format!("/api/v1/schedules/{}", enc(id)), NONE, &idem())
            .await
    }

    /// One schedule with its `history` newest history entries (0 to 1000).
    pub async fn schedule_with_history(&self, id: &str, history: usize) -> Result<Schedule> {
        self.call_json(
            Method::GET,
            &format!("/api/v1/schedules/{}?history={history}", enc(id)),
            NONE,
            &idem(),
        )
        .await
    }

    /// Creates or replaces a schedule (admin); the schedule as written.
    pub async fn put_schedule(&self, def: &ScheduleDef) -> Result<Schedule> {
        self.call_json(
            Method::PUT,
            &format!("/api/v1/schedules/{}", enc(&def.id)),
            Some(def),
            &idem(),
        )
        .await
    }

    /// Creates a schedule (admin); 409 when its id exists. Retried only if
    /// the request never left ([`Client::put_schedule`] is the idempotent
    /// create-or-replace).
    pub async fn create_schedule(&self, def: &ScheduleDef) -> Result<Schedule> {
        self.call_json(Method::POST, "/api/v1/schedules", Some(def), &unkeyed())
            .await
    }

    /// Enables (`true`) or disables a schedule (admin): enabled, it fires
    /// the occurrences after now.
    pub async fn set_schedule_enabled(&self, id: &str, enabled: bool) -> Result<()> {
        let verb = if enabled { "enable" } else { "disable" };
        self.call::<Value, Value>(
            Method::POST,
            &format!("/api/v1/schedules/{}/{verb}", enc(id)),
            None,
            &idem(),
        )
        .await
        .map(drop)
    }

    /// Deletes a schedule (admin).
    pub async fn delete_schedule(&self, id: &str) -> Result<()> {
        self.call::<Value, Value>(Method::DELETE, &format!("/api/v1/schedules/{}", enc(id)), None, &idem())
            .await
            .map(drop)
    }

    /// Fires a schedule now (admin); with `key`, a retry fires nothing more
    /// and answers the first call's task (`replayed`). 409 when the overlap
    /// policy forbids it (the live task in the problem's `task`).
    pub async fn trigger_schedule(&self, id: &str, key: Option<&str>) -> Result<Triggered> {
        let mut opts = if key.is_some() { idem() } else { unkeyed() };
        if let Some(k) = key {
            opts.headers.push(("idempotency-key", k.to_string()));
        }
        self.call_json(
            Method::POST,
            &format!("/api/v1/schedules/{}/trigger", enc(id)),
            NONE,
            &opts,
        )
        .await
    }
}
