use super::*;
use crate::store::reply::testing::{arr, check_with_extra as check, int, s};

/// `extra`: the arguments of the variable part (n pairs after the
/// documented ones).
#[test]
fn every_call_passes_what_its_header_documents() {
    for fields in [vec![], vec![("expr", "* * * * *".to_string()), ("tz", "UTC".into())]] {
        let extra = 2 * fields.len();
        check(
            &Upsert {
                id: "s",
                mode: UpsertMode::Config,
                actor: "a",
                max_schedules: 10,
                config_hash: "h",
                fields,
            },
            include_str!("../lua/upsert.lua"),
            extra,
        );
    }
    check(
        &Delete {
            id: "s",
            actor: "a",
            force: false,
        },
        include_str!("../lua/delete.lua"),
        0,
    );
    check(
        &SetEnabled {
            id: "s",
            enabled: true,
            actor: "a",
        },
        include_str!("../lua/set_enabled.lua"),
        0,
    );
    for occurrences in [
        vec![],
        vec![
            (1000, "t1".to_string(), String::new()),
            (2000, "t2".into(), String::new()),
        ],
    ] {
        let extra = 3 * occurrences.len();
        let call = Fire {
            id: "s",
            version: 1,
            node: "n",
            grace_ms: 1,
            record_ttl_ms: 1,
            history_max: 1,
            idempotency_window_ms: 1,
            max_queues: 1,
            retention_ms: 1,
            after: None,
            occurrences,
        };
        check(&call, include_str!("../lua/fire.lua"), extra);
        // ARGV[11] is n; the triples follow from ARGV[12].
        assert_eq!(call.args()[10], (extra / 3).to_string());
    }
    check(
        &Trigger {
            id: "s",
            actor: "a",
            node: "n",
            task_id: "t",
            history_max: 1,
            idempotency_window_ms: 1,
            max_queues: 1,
            retention_ms: 1,
            key: None,
            traceparent: "",
        },
        include_str!("../lua/trigger.lua"),
        0,
    );
    let k = Keys::new("muster");
    assert_eq!(schedule_key(&k, "s"), "{muster}:schedule:s");
    assert_eq!(history_key(&k, "s"), "{muster}:schedule:s:history");
    assert_eq!(schedules_key(&k), "{muster}:schedules");
}

#[test]
fn scripts_return_no_bare_negative_codes() {
    for src in [
        include_str!("../lua/upsert.lua"),
        include_str!("../lua/delete.lua"),
        include_str!("../lua/set_enabled.lua"),
        include_str!("../lua/fire.lua"),
        include_str!("../lua/trigger.lua"),
        include_str!("../lua/lib.lua"),
    ] {
        for l in src.lines().filter(|l| l.contains("return")) {
            let after = &l[l.find("return").unwrap()..];
            assert!(!after.starts_with("return -") && !after.starts_with("return {-"), "{l}");
        }
    }
}

#[test]
fn replies_decode_by_code_name_and_strictly() {
    let u = |v| UpsertReply::from_redis_value(v);
    assert_eq!(
        u(arr(vec![int(1), int(1)])).unwrap(),
        UpsertReply::Created { version: 1 }
    );
    assert_eq!(
        u(arr(vec![int(3), int(4)])).unwrap(),
        UpsertReply::Unchanged { version: 4 }
    );
    assert_eq!(
        u(arr(vec![int(Code::Exists as i64), int(2)])).unwrap(),
        UpsertReply::Exists
    );
    assert_eq!(
        u(arr(vec![int(Code::TooMany as i64), int(0)])).unwrap(),
        UpsertReply::TooMany
    );
    assert_eq!(
        u(arr(vec![int(Code::WrongState as i64), int(2)])).unwrap(),
        UpsertReply::FromConfig
    );
    assert!(u(arr(vec![int(1)])).is_err(), "short");
    assert!(u(arr(vec![int(4), int(1)])).is_err(), "unknown outcome");
    assert!(
        u(arr(vec![int(Code::NotFound as i64), int(0)])).is_err(),
        "not upsert's code"
    );
    assert!(u(arr(vec![int(-999), int(0)])).is_err(), "unknown code");

    let d = |v| DeleteReply::from_redis_value(v);
    assert_eq!(d(int(1)).unwrap(), DeleteReply::Deleted);
    assert_eq!(d(int(Code::NotFound as i64)).unwrap(), DeleteReply::NotFound);
    assert_eq!(d(int(Code::WrongState as i64)).unwrap(), DeleteReply::FromConfig);
    assert!(d(int(0)).is_err());
    assert!(d(arr(vec![])).is_err());

    let e = |v| SetEnabledReply::from_redis_value(v);
    assert_eq!(
        e(arr(vec![int(1), int(5)])).unwrap(),
        SetEnabledReply::Changed { version: 5 }
    );
    assert_eq!(
        e(arr(vec![int(0), int(5)])).unwrap(),
        SetEnabledReply::Unchanged { version: 5 }
    );
    assert_eq!(
        e(arr(vec![int(Code::NotFound as i64), int(0)])).unwrap(),
        SetEnabledReply::NotFound
    );
    assert!(e(int(1)).is_err());

    let f = |v| FireResult::from_redis_value(v);
    let r = f(arr(vec![int(1), int(60_000), int(2), int(1), int(3), int(-1)])).unwrap();
    assert_eq!((r.outcome, r.code), (FireOutcome::Done, 1));
    assert_eq!(
        (r.cursor, r.fired, r.skipped, r.missed, r.wait_ms),
        (60_000, 2, 1, 3, -1)
    );
    let r = f(arr(vec![int(0), int(1), int(0), int(0), int(0), int(250)])).unwrap();
    assert_eq!((r.outcome, r.wait_ms), (FireOutcome::NotDue, 250));
    for (c, o) in [
        (Code::NotFound, FireOutcome::NotFound),
        (Code::Stale, FireOutcome::Changed),
        (Code::WrongState, FireOutcome::Disabled),
    ] {
        let r = f(arr(vec![int(c as i64), int(0), int(0), int(0), int(0), int(-1)])).unwrap();
        assert_eq!((r.outcome, r.code), (o, o as i64));
    }
    assert!(f(arr(vec![int(1), int(0), int(0), int(0), int(0)])).is_err(), "short");
    assert!(f(arr(vec![int(2), int(0), int(0), int(0), int(0), int(-1)])).is_err());
    assert!(
        f(arr(vec![
            int(Code::TooManyQueues as i64),
            int(0),
            int(0),
            int(0),
            int(0),
            int(-1)
        ]))
        .is_err()
    );

    let t = |v| TriggerReply::from_redis_value(v);
    assert_eq!(
        t(arr(vec![int(1), s("T1"), int(9), s("q"), s("")])).unwrap(),
        TriggerReply::Fired {
            task: "T1".into(),
            occurrence: 9,
            queue: "q".into(),
            replaced: None
        }
    );
    assert_eq!(
        t(arr(vec![int(1), s("T1"), int(9), s("q"), s("T0")])).unwrap(),
        TriggerReply::Fired {
            task: "T1".into(),
            occurrence: 9,
            queue: "q".into(),
            replaced: Some("T0".into())
        }
    );
    assert_eq!(
        t(arr(vec![int(2), s("T1"), int(9), s("q"), s("")])).unwrap(),
        TriggerReply::Replayed {
            task: "T1".into(),
            occurrence: 9,
            queue: "q".into()
        }
    );
    assert_eq!(
        t(arr(vec![int(3), s("T0"), int(9), s("q"), s("")])).unwrap(),
        TriggerReply::Skipped { live_task: "T0".into() }
    );
    assert_eq!(
        t(arr(vec![int(Code::NotFound as i64), s(""), int(0), s(""), s("")])).unwrap(),
        TriggerReply::NotFound
    );
    assert_eq!(
        t(arr(vec![int(Code::TooManyQueues as i64), s(""), int(9), s("q"), s("")])).unwrap(),
        TriggerReply::TooManyQueues
    );
    assert!(t(arr(vec![int(1), s("T1"), int(9)])).is_err(), "short");
    assert!(
        t(arr(vec![int(4), s(""), int(0), s(""), s("")])).is_err(),
        "unknown outcome"
    );
    assert!(t(arr(vec![int(Code::Stale as i64), s(""), int(0), s(""), s("")])).is_err());
}
