//! Tables for people: columns padded to their widest cell, times as ages.

use muster_client::{NodeInfo, QueueStats, Schedule, TaskInfo};
use serde_json::Value;

/// Left-aligned columns, two spaces apart, a header row first.
pub(super) fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = width.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(c);
                out.push_str(&" ".repeat(width[i] - c.chars().count() + 2));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A duration in ms the way people read it: 850ms, 12s, 5m, 3h, 2d.
fn ms(v: u64) -> String {
    match v {
        0..1_000 => format!("{v}ms"),
        1_000..120_000 => format!("{}s", v / 1_000),
        120_000..7_200_000 => format!("{}m", v / 60_000),
        7_200_000..172_800_000 => format!("{}h", v / 3_600_000),
        _ => format!("{}d", v / 86_400_000),
    }
}

pub(super) fn queues(queues: &[QueueStats]) -> String {
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            let state = if q.pause_state.is_empty() {
                if q.paused { "paused" } else { "active" }.to_string()
            } else {
                q.pause_state.clone()
            };
            vec![
                q.name.clone(),
                state,
                q.queued.to_string(),
                q.delayed.to_string(),
                q.running.to_string(),
                q.dead.to_string(),
                q.succeeded.to_string(),
                ms(q.latency_ms),
            ]
        })
        .collect();
    render(
        &[
            "QUEUE",
            "STATE",
            "QUEUED",
            "DELAYED",
            "RUNNING",
            "DEAD",
            "SUCCEEDED",
            "LATENCY",
        ],
        &rows,
    )
}

pub(super) fn nodes(nodes: &[NodeInfo]) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.id.clone(),
                n.kind.clone(),
                n.state.to_string(),
                n.heartbeat_age_ms.map_or("-".into(), |a| ms(a.max(0) as u64)),
                if n.addr.is_empty() { "-".into() } else { n.addr.clone() },
            ]
        })
        .collect();
    render(&["ID", "KIND", "STATE", "LAST BEAT", "ADDR"], &rows)
}

pub(super) fn tasks(tasks: &[TaskInfo], total: u64) -> String {
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.queue.clone(),
                t.state.clone(),
                format!("{}/{}", t.attempts, t.max_attempts),
                t.error.clone().unwrap_or_default().chars().take(60).collect(),
            ]
        })
        .collect();
    let mut out = render(&["ID", "QUEUE", "STATE", "ATTEMPTS", "ERROR"], &rows);
    out.push_str(&format!("{} of {total}\n", tasks.len()));
    out
}

pub(super) fn task(t: &TaskInfo) -> String {
    let mut rows = vec![
        ("id", t.id.clone()),
        ("queue", t.queue.clone()),
        ("state", t.state.clone()),
        ("attempts", format!("{} of {}", t.attempts, t.max_attempts)),
        ("priority", t.priority.to_string()),
        ("payload", t.payload.to_string()),
    ];
    let mut opt = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            rows.push((k, v));
        }
    };
    opt("group", t.group.clone());
    opt("alias", t.alias.clone());
    opt("owner", t.owner.clone());
    opt("result", t.result.as_ref().map(Value::to_string));
    opt("error", t.error.clone().filter(|e| !e.is_empty()));
    if t.cancel_requested {
        rows.push(("cancel", "requested".into()));
    }
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter().map(|(k, v)| format!("{k:<w$}  {v}\n")).collect()
}

pub(super) fn schedules(schedules: &[Schedule]) -> String {
    let rows: Vec<Vec<String>> = schedules
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.expression.clone(),
                s.timezone.clone(),
                s.queue.clone(),
                if s.enabled { "yes" } else { "no" }.into(),
                s.next.first().map_or("-".into(), |n| n.to_string()),
            ]
        })
        .collect();
    render(
        &["ID", "EXPRESSION", "TIMEZONE", "QUEUE", "ENABLED", "NEXT (UNIX MS)"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::{ms, render};

    #[test]
    fn columns_are_padded_to_their_widest_cell() {
        let out = render(
            &["A", "BB"],
            &[vec!["long-name".into(), "1".into()], vec!["x".into(), "22".into()]],
        );
        assert_eq!(out, "A          BB\nlong-name  1\nx          22\n");
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(ms(850), "850ms");
        assert_eq!(ms(12_000), "12s");
        assert_eq!(ms(300_000), "5m");
        assert_eq!(ms(3 * 3_600_000), "3h");
        assert_eq!(ms(3 * 86_400_000), "3d");
    }
}
