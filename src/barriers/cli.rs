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
    client: crate::client::Client,
}

/// What a call returned: an HTTP answer, or no answer at all.
pub enum Reply {
    Answer(u16, Value),
    /// The node could not be reached (or the request timed out): retry.
    Unreachable(String),
}

impl Api {
    pub fn new(base: &str, token: Option<String>) -> Result<Api, String> {
        let client = crate::client::Client::builder()
            .url(base)
            .token_opt(token)
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(Api { client })
    }

    /// POSTs JSON; `timeout` bounds the whole call.
    pub async fn post(&self, path: &str, body: &Value, timeout: Duration) -> Reply {
        let mut opts = crate::client::CallOptions::new(crate::client::Retry::Never);
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

/// `60s`, `500ms`, `2m`, `1h`, `1h30m`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Duration::from_secs(n));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("invalid duration `{s}`: expected e.g. 500ms, 60s, 2m, 1h"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| format!("invalid duration `{s}`"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let d = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" | "min" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            u => return Err(format!("invalid duration unit `{u}` in `{s}`: use ms, s, m or h")),
        };
        total += d;
        rest = &rest[unit_len..];
    }
    Ok(total)
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
        if !crate::validate::is_name(v) {
            eprintln!("muster barrier arrive: {field} must be 1 to 128 characters from A-Z a-z 0-9 . _ -");
            return 2;
        }
    }
    if !crate::validate::is_node_id(&a.node) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("60").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5x").is_err());
    }
}
