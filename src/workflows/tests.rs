use super::*;

fn spec(key: &str, deps: &[&str]) -> WorkflowTaskSpec {
    WorkflowTaskSpec {
        key: key.into(),
        queue: "q".into(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        payload: serde_json::Value::Null,
        group: None,
        priority: None,
        delay_ms: None,
        max_attempts: None,
        timeout_ms: None,
        backoff_base_ms: None,
        backoff_cap_ms: None,
        limits: Vec::new(),
    }
}

fn check(tasks: Vec<WorkflowTaskSpec>) -> Result<Plan, Invalid> {
    plan(
        &NewWorkflow {
            tasks,
            idempotency_key: None,
            failure_policy: FailurePolicy::FailFast,
        },
        &TasksConfig::default(),
        &ShardMap::new("muster", 1),
        None,
    )
}

#[test]
fn diamond_plans() {
    let p = check(vec![
        spec("a", &[]),
        spec("b", &["a"]),
        spec("c", &["a"]),
        spec("d", &["b", "c"]),
    ])
    .unwrap();
    let a = &p.keys[0];
    assert_eq!((a.2, a.3.as_str()), (0, "b,c"));
    assert_eq!(p.keys[3].2, 2);
}

#[test]
fn cycles_are_named() {
    let e = check(vec![spec("a", &["c"]), spec("b", &["a"]), spec("c", &["b"])])
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(msg.starts_with("cycle: "), "{msg}");
    for k in ["a", "b", "c"] {
        assert!(msg.contains(k), "{msg}");
    }
    let e = check(vec![spec("a", &["a"])]).err().unwrap();
    assert!(e.to_string().contains("a -> a"));
}

#[test]
fn bad_graphs_are_refused() {
    assert!(
        check(vec![spec("a", &["zz"])])
            .err()
            .unwrap()
            .to_string()
            .contains("zz")
    );
    assert!(
        check(vec![spec("a", &[]), spec("a", &[])])
            .err()
            .unwrap()
            .to_string()
            .contains("twice")
    );
    assert!(check(vec![]).is_err());
}
