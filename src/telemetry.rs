//! The catalogue of Prometheus metrics: one line per metric with its type,
//! labels and help text, so that `/metrics` carries `# HELP` and `# TYPE`
//! for every metric from the first scrape, and every metric that can exist
//! before its first event is exported as zero.
//!
//! Metrics without labels, and metrics whose labels take a fixed set of
//! values (`action`, `result`, `verdict`, `state`), are registered at zero
//! when the recorder is installed, so dashboards and alerts
//! (`rate(...)`, `absent(...)`) can tell "zero" from "not exported". Metrics
//! labelled by `queue` get a zero `queue="other"` series (the bucket of the
//! queues beyond the label limit, empty at start) and
//! `muster_redis_errors_total` one `op="none"` series per kind
//! ([`Metric::start`]). The HTTP families and the Redis call durations
//! (`method`/`path`, `op`) have no series until the first request or call;
//! [`render`] still writes their `# HELP` and `# TYPE` lines, which the text
//! format allows for a family without samples.
//!
//! The metrics table in `docs/operations.md` lists the same names; a test
//! keeps the two in step.

use std::fmt::Write as _;

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric of the catalogue.
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// The one label whose every value is known up front, with those values
    /// (each registered at zero); `None` for no label. Metrics with an open
    /// label set are marked by `open: true` and registered on first use.
    pub fixed: Option<(&'static str, &'static [&'static str])>,
    pub open: bool,
    /// The zero series an open-labelled metric gets at start, so that
    /// `absent(...)` is false on a healthy node: the `queue="other"` bucket
    /// (queues beyond the label limit, none at start) or `op="none"`.
    /// Empty: none until the first event.
    pub start: &'static [&'static [(&'static str, &'static str)]],
}

const fn m(name: &'static str, kind: Kind, help: &'static str) -> Metric {
    Metric {
        name,
        kind,
        help,
        fixed: None,
        open: false,
        start: &[],
    }
}

const fn open(name: &'static str, kind: Kind, help: &'static str) -> Metric {
    Metric {
        name,
        kind,
        help,
        fixed: None,
        open: true,
        start: &[],
    }
}

const fn open_at_start(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    start: &'static [&'static [(&'static str, &'static str)]],
) -> Metric {
    Metric {
        name,
        kind,
        help,
        fixed: None,
        open: true,
        start,
    }
}

/// `queue="other"`: the bucket of the queues beyond the label limit.
const OTHER_QUEUE: &[&[(&str, &str)]] = &[&[("queue", "other")]];
const OTHER_QUEUE_DEPTH: &[&[(&str, &str)]] = &[
    &[("queue", "other"), ("state", "queued")],
    &[("queue", "other"), ("state", "delayed")],
    &[("queue", "other"), ("state", "running")],
    &[("queue", "other"), ("state", "dead")],
];
/// `op="none"`, one per kind: a Redis error names its op, never `none`.
const NO_REDIS_ERRORS: &[&[(&str, &str)]] = &[
    &[("op", "none"), ("kind", "unavailable")],
    &[("op", "none"), ("kind", "server")],
    &[("op", "none"), ("kind", "decode")],
    &[("op", "none"), ("kind", "timeout")],
    &[("op", "none"), ("kind", "cut")],
];

const fn fixed(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    label: &'static str,
    values: &'static [&'static str],
) -> Metric {
    Metric {
        name,
        kind,
        help,
        fixed: Some((label, values)),
        open: false,
        start: &[],
    }
}

use Kind::{Counter, Gauge, Histogram};

/// Every metric muster exports.
pub const METRICS: &[Metric] = &[
    open(
        "muster_http_requests_total",
        Counter,
        "HTTP requests by method, matched route and status",
    ),
    open(
        "muster_http_request_duration_seconds",
        Histogram,
        "HTTP request duration by method and matched route",
    ),
    m(
        "muster_http_connections",
        Gauge,
        "HTTP connections open (WebSockets leave the count at the upgrade)",
    ),
    fixed(
        "muster_http_connections_shed_total",
        Counter,
        "HTTP connections closed or refused at server.max_connections or server.max_connections_per_address, by reason",
        "reason",
        crate::serve::Shed::ALL,
    ),
    open(
        "muster_redis_call_duration_seconds",
        Histogram,
        "Redis call duration by operation (script or command)",
    ),
    open_at_start(
        "muster_redis_errors_total",
        Counter,
        "Failed Redis calls by operation and kind (unavailable, server, decode, timeout, cut)",
        NO_REDIS_ERRORS,
    ),
    fixed(
        "muster_group_commit_calls_total",
        Counter,
        "Script calls that carried single calls grouped while another was in flight (group commit), by operation",
        "op",
        &["submit", "complete"],
    ),
    fixed(
        "muster_group_commit_items_total",
        Counter,
        "Single calls carried by those grouped script calls, by operation (divided by the calls: the mean group)",
        "op",
        &["submit", "complete"],
    ),
    m(
        "muster_trace_spans_exported_total",
        Counter,
        "Spans the OTLP receiver accepted (telemetry.otlp_endpoint; zero with tracing off)",
    ),
    m(
        "muster_trace_spans_dropped_total",
        Counter,
        "Spans dropped: the export queue was full (telemetry.queue), or their export request failed",
    ),
    m(
        "muster_redis_reconnects_total",
        Counter,
        "Shared Redis connections cut after a call timed out, and reopened",
    ),
    m(
        "muster_redis_clock_resets_total",
        Counter,
        "Times a Redis connection's time went back (a new master or a clock set back) and its deadline clock restarted",
    ),
    m(
        "muster_redis_clock_skew_seconds",
        Gauge,
        "Spread of the Redis clocks of the masters this node reaches (split namespaces on a Cluster)",
    ),
    open(
        "muster_shard_pass_failures_total",
        Counter,
        "Failed background passes and heartbeats, by pass and shard (each shard is retried on its own)",
    ),
    m(
        "muster_shards_failing",
        Gauge,
        "Shards this node cannot serve now (its heartbeats there fail)",
    ),
    m(
        "muster_node_heartbeats_partial_total",
        Counter,
        "Worker heartbeats applied in some shards only (the others' masters failed)",
    ),
    m(
        "muster_claims_partial_total",
        Counter,
        "Claims answered without trying every shard of the queue (a master failed or stalls)",
    ),
    m(
        "muster_pause_deferred_total",
        Counter,
        "Pauses and resumes that could not reach every shard at once (the janitors converge them)",
    ),
    m(
        "muster_redis_master_changes_total",
        Counter,
        "Times this node switched to a new Redis master",
    ),
    fixed(
        "muster_redis_ack_waits_total",
        Counter,
        "Replicated acknowledgements (WAIT) by outcome: replicated, short (fewer replicas within the timeout), unknown (the wait failed)",
        "outcome",
        &["replicated", "short", "unknown"],
    ),
    m(
        "muster_redis_ack_wait_seconds",
        Histogram,
        "Duration of replicated acknowledgements (the mark and WAIT)",
    ),
    m(
        "muster_redis_ack_shortfalls_total",
        Counter,
        "Changes answered 503 with replicated: false (short or unknown)",
    ),
    m(
        "muster_redis_ack_connections_opened_total",
        Counter,
        "Dedicated connections opened for replicated writes",
    ),
    m(
        "muster_failover_switches_total",
        Counter,
        "Times this node raised the fencing epoch for a new master",
    ),
    fixed(
        "muster_failover_rounds_total",
        Counter,
        "Coordinated failover rounds run by this node as coordinator, by result",
        "result",
        &["promoted", "cancelled"],
    ),
    fixed(
        "muster_nodes",
        Gauge,
        "Registered nodes at this node's last liveness pass, by state",
        "state",
        &["alive", "expired"],
    ),
    open_at_start(
        "muster_tasks_enqueued_total",
        Counter,
        "Tasks created by the submit endpoints, by queue",
        OTHER_QUEUE,
    ),
    open_at_start(
        "muster_tasks_claimed_total",
        Counter,
        "Tasks claimed, by queue",
        OTHER_QUEUE,
    ),
    open_at_start(
        "muster_tasks_succeeded_total",
        Counter,
        "Tasks completed, by queue",
        OTHER_QUEUE,
    ),
    open_at_start(
        "muster_tasks_failed_total",
        Counter,
        "Failed executions (fail calls accepted and timeouts), by queue",
        OTHER_QUEUE,
    ),
    open_at_start(
        "muster_tasks_dead_total",
        Counter,
        "Tasks dead-lettered, by queue",
        OTHER_QUEUE,
    ),
    open_at_start(
        "muster_tasks_not_acknowledged_total",
        Counter,
        "Claimed tasks put back in their queue because their worker did not acknowledge them within ack_ms, by queue",
        OTHER_QUEUE,
    ),
    open_at_start(
        "muster_queue_depth",
        Gauge,
        "Tasks per queue and state (queued, delayed, running, dead)",
        OTHER_QUEUE_DEPTH,
    ),
    open_at_start(
        "muster_queue_latency_seconds",
        Gauge,
        "How long the longest-waiting head of each queue has been claimable",
        OTHER_QUEUE,
    ),
    m(
        "muster_claim_duration_seconds",
        Histogram,
        "One claim call to Redis, long-poll waiting excluded",
    ),
    m(
        "muster_claims_empty_total",
        Counter,
        "Claim scripts that found nothing to claim",
    ),
    m(
        "muster_claim_wakeups_saved_total",
        Counter,
        "Wake-ups of waiting claims left out: the task was claimed later in the same read of the events",
    ),
    m(
        "muster_claim_rechecks_empty_total",
        Counter,
        "Claims after a wake-up answered at once: nothing ready or due in the shard",
    ),
    m(
        "muster_claim_waiting_queues",
        Gauge,
        "Queues with at least one long-polling claim waiting on this node",
    ),
    open(
        "muster_limit_running",
        Gauge,
        "Tasks holding a slot of each flow-control limit (named limits, not template keys)",
    ),
    open(
        "muster_limit_tokens",
        Gauge,
        "Whole tokens in each rate limit's bucket (named limits, not template keys)",
    ),
    open(
        "muster_limit_waiting",
        Gauge,
        "Queued tasks waiting on each flow-control limit (named limits, not template keys)",
    ),
    fixed(
        "muster_orphans_recovered_total",
        Counter,
        "Orphaned tasks recovered, by action",
        "action",
        &["requeued", "dead", "cancelled"],
    ),
    m(
        "muster_task_timeouts_total",
        Counter,
        "Running tasks failed by their timeout_ms",
    ),
    fixed(
        "muster_schedule_fires_total",
        Counter,
        "Schedule occurrences by outcome",
        "result",
        &["fired", "skipped_overlap", "missed"],
    ),
    fixed(
        "muster_barrier_rounds_total",
        Counter,
        "Barrier rounds decided by this node, by verdict",
        "verdict",
        &["released", "aborted"],
    ),
    m(
        "muster_barrier_wait_seconds",
        Histogram,
        "Barrier arrival to verdict, per participant",
    ),
    m("muster_locks_acquired_total", Counter, "Locks acquired"),
    m("muster_locks_released_total", Counter, "Locks released"),
    m(
        "muster_locks_expired_total",
        Counter,
        "Lock leases ended by the periodic expiry pass",
    ),
    m("muster_elections_won_total", Counter, "Elections won"),
    m(
        "muster_events_read_total",
        Counter,
        "Events this node's tailer read from the stream",
    ),
    m(
        "muster_events_relayed_total",
        Counter,
        "Events sent to WebSocket clients",
    ),
    m(
        "muster_event_relay_lag_seconds",
        Histogram,
        "Event time to the moment it is handed to a client's socket",
    ),
    m("muster_ws_clients", Gauge, "Connected WebSocket subscribers"),
    m(
        "muster_ws_lagged_total",
        Counter,
        "WebSocket subscribers closed with lagged",
    ),
];

/// Describes every metric to the installed recorder and registers at zero
/// those that can be (see the module docs). Called once, right after the
/// recorder is installed.
pub(crate) fn register() {
    for metric in METRICS {
        let name = metric.name;
        match metric.kind {
            Counter => metrics::describe_counter!(name, metric.help),
            Gauge => metrics::describe_gauge!(name, metric.help),
            Histogram => metrics::describe_histogram!(name, metric.help),
        }
        if metric.open {
            for labels in metric.start {
                zero(metric.kind, name, labels);
            }
            continue;
        }
        match metric.fixed {
            None => zero(metric.kind, name, &[]),
            Some((label, values)) => {
                for v in values {
                    zero(metric.kind, name, &[(label, v)]);
                }
            }
        }
    }
}

fn zero(kind: Kind, name: &'static str, labels: &[(&'static str, &'static str)]) {
    let labels: Vec<metrics::Label> = labels.iter().map(|(k, v)| metrics::Label::new(*k, *v)).collect();
    match kind {
        Counter => metrics::counter!(name, labels).increment(0),
        // Registers the gauge; a gauge only ever set by a pass (`muster_nodes`)
        // reads 0 until that pass runs.
        Gauge => metrics::gauge!(name, labels).increment(0.0),
        Histogram => {
            let _ = metrics::histogram!(name, labels);
        }
    }
}

/// The exporter's text with `# HELP`/`# TYPE` added for families that have
/// no series yet.
pub(crate) fn render(exported: String) -> String {
    let mut out = exported;
    for metric in METRICS {
        let marker = format!("# TYPE {} ", metric.name);
        if out.contains(&marker) {
            continue;
        }
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let _ = writeln!(out, "# HELP {} {}", metric.name, metric.help);
        let _ = writeln!(out, "# TYPE {} {}", metric.name, metric.kind.as_str());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for m in METRICS {
            assert!(seen.insert(m.name), "{} listed twice", m.name);
            assert!(m.name.starts_with("muster_"), "{}", m.name);
            assert_eq!(
                m.kind == Counter,
                m.name.ends_with("_total"),
                "{}: counters end in _total",
                m.name
            );
            if m.kind == Histogram {
                assert!(m.name.ends_with("_seconds"), "{}: durations in seconds", m.name);
            }
            assert!(!m.help.is_empty() && !m.help.contains('\n'));
        }
    }

    #[test]
    fn render_adds_help_and_type_for_families_without_series() {
        let text = render("# TYPE muster_nodes gauge\nmuster_nodes{state=\"alive\"} 1\n".into());
        assert!(text.contains("# HELP muster_tasks_claimed_total Tasks claimed, by queue\n"));
        assert!(text.contains("# TYPE muster_tasks_claimed_total counter\n"));
        assert_eq!(
            text.matches("# TYPE muster_nodes ").count(),
            1,
            "present families are left alone"
        );
    }
}
