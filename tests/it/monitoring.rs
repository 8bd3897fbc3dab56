//! The monitoring kit under `docs/monitoring/`: Prometheus alerting rules
//! (with promtool unit tests) and a Grafana dashboard. Every metric they name
//! is one muster exports (`muster::testing::METRICS`, the list `/metrics`
//! registers), so a renamed metric cannot silently break an alert. promtool
//! (Debian's `prometheus` package) checks and tests the rules; without it the
//! promtool part prints SKIP, unless `MUSTER_REQUIRE_PROMTOOL=1` (set by
//! `.ci/run`, which installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

use muster::testing::{Kind, METRICS};

fn kit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/monitoring")
}

/// The `muster_*` names in a text, each once.
fn metric_names(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("muster_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let before = rest[..at].chars().next_back();
        let name = &tail[..len];
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
        rest = &tail[len..];
    }
    out
}

/// The exported metric a series name belongs to: itself, or a histogram's
/// `_bucket`, `_sum` or `_count`. None for a name muster does not export.
fn exported(series: &str) -> Option<&'static str> {
    if let Some(m) = METRICS.iter().find(|m| m.name == series) {
        return Some(m.name);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = series.strip_suffix(suffix)?;
        METRICS
            .iter()
            .find(|m| m.name == base && matches!(m.kind, Kind::Histogram))
            .map(|m| m.name)
    })
}

#[test]
fn the_rules_and_the_dashboard_name_only_exported_metrics() {
    let rules = std::fs::read_to_string(kit().join("alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(kit().join("grafana-dashboard.json")).unwrap();
    for (file, text, least) in [("alerts.yml", &rules, 8), ("grafana-dashboard.json", &dashboard, 25)] {
        let names = metric_names(text);
        assert!(names.len() >= least, "{file} names only {names:?}");
        for name in &names {
            assert!(
                exported(name).is_some(),
                "{file} uses `{name}`, which muster does not export (src/telemetry.rs)"
            );
        }
    }
    // The rules cover what the issue asks an operator to be told about.
    for alert in [
        "MusterNodeDown",
        "MusterNodesExpired",
        "MusterDeadLettersRising",
        "MusterQueueBacklog",
        "MusterOrphanRecoveries",
        "MusterRedisErrors",
        "MusterRedisFailover",
    ] {
        assert!(rules.contains(&format!("alert: {alert}\n")), "no {alert}");
    }
    // The dashboard is valid JSON with unique panel ids, a query per panel,
    // every panel inside Grafana's 24-column grid.
    let doc: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let panels = doc["panels"].as_array().unwrap();
    let mut ids: Vec<i64> = panels.iter().map(|p| p["id"].as_i64().unwrap()).collect();
    ids.dedup();
    assert_eq!(ids.len(), panels.len());
    for p in panels {
        let targets = p["targets"].as_array().unwrap();
        assert!(
            !targets.is_empty() && targets.iter().all(|t| t["expr"].is_string()),
            "{p}"
        );
        let g = &p["gridPos"];
        assert!(g["x"].as_i64().unwrap() + g["w"].as_i64().unwrap() <= 24, "{p}");
    }
}

#[test]
fn the_metric_name_check_catches_a_renamed_metric() {
    assert_eq!(exported("muster_tasks_dead_total"), Some("muster_tasks_dead_total"));
    assert_eq!(
        exported("muster_claim_duration_seconds_bucket"),
        Some("muster_claim_duration_seconds")
    );
    assert_eq!(exported("muster_task_dead_total"), None);
    assert_eq!(
        exported("muster_tasks_dead_total_bucket"),
        None,
        "a counter has no buckets"
    );
    assert_eq!(
        metric_names("rate(muster_a_total[5m]) / xmuster_b + muster_a_total"),
        ["muster_a_total"]
    );
}

#[test]
fn promtool_checks_and_tests_the_rules() {
    if Command::new("promtool").arg("--version").output().is_err() {
        if std::env::var("MUSTER_REQUIRE_PROMTOOL").as_deref() == Ok("1") {
            panic!("promtool is required (MUSTER_REQUIRE_PROMTOOL=1) but not installed: apt-get install -y prometheus");
        }
        eprintln!("SKIP promtool_checks_and_tests_the_rules: no promtool (apt-get install -y prometheus)");
        return;
    }
    for args in [["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"]] {
        let out = Command::new("promtool").args(args).current_dir(kit()).output().unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
