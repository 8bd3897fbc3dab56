//! `muster barrier arrive`: a cron-started script asks whether it may run
//! this cycle.
//!
//! The command arrives at the round and waits for its verdict (calling again
//! while the wait lasts: arriving is idempotent, so a retry after a lost
//! response or a restarted node is safe), prints the participant's view of
//! the round as JSON on stdout, and exits with:
//!
//! - 0: this node may run (it arrived before a `released` verdict),
//! - 3: the round was aborted (nobody runs),
//! - 4: late (the round was released without this node),
//! - 5: no verdict within `--wait`,
//! - 1: an error (printed on stderr), 2: bad usage.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const EXIT_MAY_RUN: u8 = 0;
pub const EXIT_ERROR: u8 = 1;
pub const EXIT_ABORTED: u8 = 3;
pub const EXIT_LATE: u8 = 4;
pub const EXIT_PENDING: u8 = 5;

/// The longest single long poll the CLI asks for (the server default of
/// `barriers.max_wait_ms` and `locks.max_wait_ms`).
pub const POLL_MS: u64 = 30_000;

/// The CLI commands' REST calls: the typed client's one HTTP path, one
/// attempt per call (the commands retry by their own rules).
pub struct Api {
    client: muster_client::Client,
}

/// What a call returned: an HTTP answer, or no answer at all.
pub enum Reply {
    Answer(u16, Value),
    /// The node could not be reached (or the request timed out): retry.
    Unreachable(String),
}

impl Api {
    pub fn new(base: &str, token: Option<String>) -> Result<Api, String> {
        let client = muster_client::Client::builder()
            .url(base)
            .token_opt(token)
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(Api { client })
    }

    /// POSTs JSON; `timeout` bounds the whole call.
    pub async fn post(&self, path: &str, body: &Value, timeout: Duration) -> Reply {
        let mut opts = muster_client::CallOptions::new(muster_client::Retry::Never);
        opts.timeout = Some(timeout);
        match self.client.raw(reqwest::Method::POST, path, Some(body), &opts).await {
            Ok(a) => Reply::Answer(a.status, a.json()),
            Err(e) => Reply::Unreachable(e.to_string()),
        }
    }
}

/// The `detail` of a problem+json body, or the body.
pub fn detail(v: &Value) -> String {
    v["detail"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// What `muster barrier arrive` needs.
pub struct ArriveArgs {
    pub url: String,
    pub token: Option<String>,
    pub barrier: String,
    pub round: String,
    pub node: String,
    pub wait: Duration,
}

/// Arrives, waits for the verdict, prints it, and returns the exit code.
pub async fn arrive(a: ArriveArgs) -> u8 {
    for (field, v) in [("barrier", &a.barrier), ("round", &a.round)] {
        if !muster_api::is_name(v) {
            eprintln!("muster barrier arrive: {field} must be 1 to 128 characters from A-Z a-z 0-9 . _ -");
            return 2;
        }
    }
    if !muster_api::is_node_id(&a.node) {
        eprintln!("muster barrier arrive: --node must be 1 to 64 characters from A-Z a-z 0-9 . _ -");
        return 2;
    }
    let api = match Api::new(&a.url, a.token.clone()) {
        Ok(api) => api,
        Err(e) => {
            eprintln!("muster barrier arrive: {e}");
            return EXIT_ERROR;
        }
    };
    let path = format!("/api/v1/barriers/{}/rounds/{}/arrive", a.barrier, a.round);
    let deadline = Instant::now() + a.wait;
    let mut backoff = Duration::from_millis(100);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let wait_ms = (left.as_millis() as u64).min(POLL_MS);
        let body = json!({"node": a.node, "wait_ms": wait_ms});
        match api
            .post(&path, &body, Duration::from_millis(wait_ms) + Duration::from_secs(10))
            .await
        {
            Reply::Answer(200, v) => {
                let verdict = v["verdict"].as_str().unwrap_or("pending").to_string();
                if verdict != "pending" || Instant::now() >= deadline {
                    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                    return match verdict.as_str() {
                        "aborted" => EXIT_ABORTED,
                        "released" if v["may_run"] == true => EXIT_MAY_RUN,
                        "released" => EXIT_LATE,
                        _ => EXIT_PENDING,
                    };
                }
                backoff = Duration::from_millis(100);
            }
            Reply::Answer(status, v) if status >= 500 => {
                if Instant::now() + backoff >= deadline {
                    eprintln!("muster barrier arrive: {status}: {}", detail(&v));
                    return EXIT_ERROR;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Reply::Answer(status, v) => {
                eprintln!("muster barrier arrive: {status}: {}", detail(&v));
                return EXIT_ERROR;
            }
            Reply::Unreachable(e) => {
                if Instant::now() + backoff >= deadline {
                    eprintln!("muster barrier arrive: cannot reach {}: {e}", a.url);
                    return EXIT_ERROR;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
