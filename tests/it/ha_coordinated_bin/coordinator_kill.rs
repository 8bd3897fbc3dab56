//! The coordinator killed in each phase of a failover, watched tick by tick from every node: never two masters (G10).

use super::*;
use crate::common::skip_on_cluster;

/// One node's answer to one `GET /api/v1/failover` of the watcher.
#[derive(Debug, Clone)]
struct Probe {
    node: String,
    sent: Instant,
    took: Duration,
    /// `master` as the node reported it ("" while invalidated).
    master: String,
    /// The coordinator's `coordinator.round` as `"<id> <phase>"`.
    round: Option<String>,
}

impl Probe {
    fn answered(&self) -> Instant {
        self.sent + self.took
    }
}

/// One tick of the watcher: one request to every live node, sent at once.
#[derive(Debug)]
struct Tick {
    n: u64,
    sent: Instant,
    probes: Vec<Probe>,
    /// `(node, error)` of the requests that failed.
    errors: Vec<(String, String)>,
    /// `ROLE` of the replica, asked once the answers are in, when one of
    /// them named it as the master.
    new_role: Option<String>,
}

/// Asks every live node for its master every 50 ms, each tick's requests
/// sent at once and without waiting for the previous ticks (with the master
/// down a status call can take a few hundred ms).
struct Watcher {
    live: Arc<Mutex<Vec<(String, String)>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Tick>>,
}

impl Watcher {
    fn start(http: &reqwest::Client, nodes: &[&NodeProc], new: &str, new_port: u16) -> Watcher {
        let live = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let w = Watcher {
            live: live.clone(),
            stop: stop.clone(),
            task: tokio::spawn(watch(http.clone(), live, stop, new.to_string(), new_port)),
        };
        w.set_live(nodes);
        w
    }

    /// The nodes to ask from the next tick on.
    fn set_live(&self, nodes: &[&NodeProc]) {
        *self.live.lock().unwrap() = nodes.iter().map(|n| (n.id.clone(), n.url.clone())).collect();
    }

    /// Stops ticking and returns every tick, oldest first, once all answered.
    async fn finish(self) -> Vec<Tick> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

async fn watch(
    http: reqwest::Client,
    live: Arc<Mutex<Vec<(String, String)>>>,
    stop: Arc<AtomicBool>,
    new: String,
    new_port: u16,
) -> Vec<Tick> {
    let mut running = tokio::task::JoinSet::new();
    let mut ticks = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let targets = live.lock().unwrap().clone();
        running.spawn(probe_tick(http.clone(), n, targets, new.clone(), new_port));
        while let Some(t) = running.try_join_next() {
            ticks.push(t.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while let Some(t) = running.join_next().await {
        ticks.push(t.unwrap());
    }
    ticks.sort_by_key(|t| t.n);
    ticks
}

async fn probe_tick(http: reqwest::Client, n: u64, targets: Vec<(String, String)>, new: String, new_port: u16) -> Tick {
    let sent = Instant::now();
    let calls = targets.into_iter().map(|(id, url)| {
        let http = http.clone();
        async move {
            let r = status(&http, &url).await;
            (id, r, sent.elapsed())
        }
    });
    let mut tick = Tick {
        n,
        sent,
        probes: Vec::new(),
        errors: Vec::new(),
        new_role: None,
    };
    for (node, r, took) in futures_util::future::join_all(calls).await {
        match r {
            Ok(st) => {
                let round = st.coordinator.and_then(|c| c.round);
                tick.probes.push(Probe {
                    node,
                    sent,
                    took,
                    master: st.master,
                    round: round.map(|r| format!("{} {:?}", r.id, r.phase)),
                });
            }
            Err(e) => tick.errors.push((node, e)),
        }
    }
    if tick.probes.iter().any(|p| p.master == new) {
        tick.new_role = Some(tokio::task::spawn_blocking(move || redis_role(new_port)).await.unwrap());
    }
    tick
}

/// `t - base` in ms, negative when `t` is earlier.
fn rel_ms(t: Instant, base: Instant) -> i64 {
    if t >= base {
        (t - base).as_millis() as i64
    } else {
        -((base - t).as_millis() as i64)
    }
}

/// What the watcher saw during one iteration.
#[derive(Debug, Default)]
struct Verdict {
    ticks: usize,
    answers: usize,
    /// Answers naming the dead old master, sent after its kill (allowed).
    dead_master_answers: usize,
    coordinator_errors: usize,
    slowest: Duration,
    violations: Vec<String>,
}

/// Checks the watcher's answers:
/// - G10, the hard invariant: in no tick do two live nodes report two
///   different (non-empty) masters;
/// - and, across ticks (each answer is the node's master at some instant
///   between the request and the answer): no request sent after an answer
///   naming the promoted replica came back finds a node on the old master;
/// - a node names no server but the two, and the replica only while its
///   `ROLE` is master; a node may name the dead old master until it is
///   invalidated;
/// - the clients always answer (the coordinator may not: it is killed).
fn judge(ticks: &[Tick], old: &str, new: &str, coordinator: &str, redis_killed: Instant) -> Verdict {
    let mut v = Verdict {
        ticks: ticks.len(),
        ..Verdict::default()
    };
    let describe = |p: &Probe| {
        format!(
            "{}={:?} (asked {} ms, answered {} ms after the Redis kill)",
            p.node,
            p.master,
            rel_ms(p.sent, redis_killed),
            rel_ms(p.answered(), redis_killed)
        )
    };
    for t in ticks {
        v.answers += t.probes.len();
        let masters: BTreeSet<&str> = t
            .probes
            .iter()
            .map(|p| p.master.as_str())
            .filter(|m| !m.is_empty())
            .collect();
        if masters.len() > 1 {
            let all: Vec<String> = t.probes.iter().map(describe).collect();
            v.violations.push(format!("SPLIT in tick {}: {}", t.n, all.join("; ")));
        }
        for p in &t.probes {
            v.slowest = v.slowest.max(p.took);
            if p.master == old && p.sent > redis_killed {
                v.dead_master_answers += 1;
            }
            if !p.master.is_empty() && p.master != old && p.master != new {
                v.violations
                    .push(format!("unknown master in tick {}: {}", t.n, describe(p)));
            }
        }
        if let Some(role) = &t.new_role
            && role != "master"
        {
            v.violations.push(format!(
                "tick {}: a node names {new} as its master, whose ROLE is {role:?}",
                t.n
            ));
        }
        for (node, e) in &t.errors {
            if node == coordinator {
                v.coordinator_errors += 1;
            } else {
                v.violations.push(format!(
                    "tick {} ({} ms after the Redis kill): {node} did not answer: {e}",
                    t.n,
                    rel_ms(t.sent, redis_killed)
                ));
            }
        }
    }
    let first_new = ticks
        .iter()
        .flat_map(|t| &t.probes)
        .filter(|p| p.master == new)
        .min_by_key(|p| p.answered());
    if let Some(first) = first_new {
        for p in ticks.iter().flat_map(|t| &t.probes) {
            if p.master == old && p.sent > first.answered() {
                v.violations
                    .push(format!("SPLIT across ticks: {} after {}", describe(p), describe(first)));
            }
        }
    }
    v
}

/// When the test kills the coordinator, counted from the master's kill.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// A fixed delay.
    Delay(u64),
    /// As soon as the coordinator logs that it starts a round (it does so
    /// just before it sends `ping`).
    RoundStarted,
    /// As soon as client A's master file is empty: `invalidate` reached it.
    Invalidated,
    /// As soon as the replica reports role master: it was promoted.
    Promoted,
    /// As soon as one node's master file names the replica: `reconfigure`
    /// reached it (the three finish within a few ms of each other, so the
    /// files are polled without sleeping once the replica is promoted).
    Reconfigured,
}

/// How far the coordinator got before it died, from what survives it: the
/// clients' state, its own files (what it reads when it restarts) and the
/// replica's role. `floor`: round ids above it began after the master died.
async fn phase_reached(
    http: &reqwest::Client,
    clients: [&NodeProc; 2],
    coordinator: &NodeProc,
    new: &str,
    new_port: u16,
    floor: u64,
) -> (String, String) {
    // Per node: the master it uses, and its master file.
    let mut masters = Vec::new();
    let mut evidence = Vec::new();
    let mut round_started = false;
    for n in clients {
        let st = status(http, &n.url).await.unwrap_or_else(|e| panic!("{}: {e}", n.id));
        let m = st.master;
        let file = n.data_file("redis-master").unwrap_or_default();
        let last = st.last_message;
        let round = last.as_ref().map_or(0, |l| l.round);
        round_started |= round > floor;
        let when = if round > floor { "this round" } else { "before the kill" };
        evidence.push(format!(
            "{}: master {m:?}, master file {file:?}, last message {} ({when})",
            n.id,
            last.as_ref().map_or("none", |l| l.kind.as_str())
        ));
        masters.push((m, file));
    }
    let file = coordinator.data_file("redis-master").unwrap_or_default();
    let round_file: u64 = coordinator
        .data_file("failover-round")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    round_started |= round_file > floor;
    evidence.push(format!(
        "{}: master file {file:?}, round file {}",
        coordinator.id,
        if round_file > floor {
            "this round"
        } else {
            "before the kill"
        }
    ));
    // The coordinator is dead: its file is all there is.
    masters.push((file.clone(), file));
    let role = redis_role(new_port);
    evidence.push(format!("replica ROLE {role}"));
    // Reconfigured: uses the replica and wrote it to its master file. Cut
    // off: uses it, but its `reconfigure` was dropped before the file was
    // written (the coordinator's connection died with it).
    let reconfigured = masters.iter().filter(|(m, f)| m == new && f == new).count();
    let cut_off = masters.iter().filter(|(m, f)| m == new && f != new).count();
    let invalidated = masters.iter().filter(|(m, _)| m.is_empty()).count();
    let phase = if role == "master" {
        match (reconfigured, cut_off) {
            (3, _) => "done (the round completed)".to_string(),
            (0, 0) => "promote (replica promoted, nobody reconfigured)".to_string(),
            (k, 0) => format!("reconfigure ({k}/3 reconfigured)"),
            (k, j) => format!(
                "reconfigure ({k}/3 reconfigured, {j} more switched but cut off before writing the master file)"
            ),
        }
    } else if invalidated > 0 {
        format!("invalidate ({invalidated}/3 invalidated, nothing promoted)")
    } else if round_started {
        "ping (round begun, nobody invalidated)".to_string()
    } else if coordinator.log().contains("starting a failover round") {
        "ping (round begun, no message delivered yet)".to_string()
    } else {
        "detection (no round begun yet)".to_string()
    };
    (phase, evidence.join("; "))
}

/// One iteration's figures, for the summary.
struct Outcome {
    trigger: Trigger,
    fired: bool,
    killed_after: Duration,
    round_before_kill: String,
    phase: String,
    evidence: String,
    file_at_restart: String,
    started_after: Duration,
    converged_after: Duration,
    resolved_by: String,
    verdict: Verdict,
}

/// The coordinator process is SIGKILLed while it handles the master's death:
/// still detecting it, and at each phase of the round (triggered by what
/// the round leaves behind, since a round takes only tens of ms and starts
/// 1-2 intervals after the death at a phase the test cannot choose). While
/// it is down and after it restarts no two nodes use different masters; the
/// restarted coordinator (same id, data dir, config) brings every node to
/// the promoted replica within 15 s, and A and B take writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_during_failover_never_splits() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let t0 = Instant::now();
    let triggers = [
        Trigger::Delay(1800),
        Trigger::RoundStarted,
        Trigger::Invalidated,
        Trigger::Promoted,
        Trigger::Reconfigured,
        Trigger::Delay(4500),
    ];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let mut outcomes = Vec::new();
    for (i, &trigger) in triggers.iter().enumerate() {
        let o = kill_coordinator_once(&http, i, trigger).await;
        eprintln!(
            "iteration {i}: {:?}{} -> coordinator killed {} ms after the master; its last status: {}; \
             phase reached: {} [{}]; restarted with master file {:?}: up after {} ms, all nodes on the \
             replica {} ms after the restart ({}); watched {} ticks, {} answers (slowest {} ms, {} naming \
             the dead master, {} coordinator errors)",
            o.trigger,
            if o.fired {
                ""
            } else {
                " (did not fire: killed at the fallback)"
            },
            o.killed_after.as_millis(),
            o.round_before_kill,
            o.phase,
            o.evidence,
            o.file_at_restart,
            o.started_after.as_millis(),
            o.converged_after.as_millis(),
            o.resolved_by,
            o.verdict.ticks,
            o.verdict.answers,
            o.verdict.slowest.as_millis(),
            o.verdict.dead_master_answers,
            o.verdict.coordinator_errors,
        );
        outcomes.push(o);
    }
    eprintln!("summary (test took {} ms):", t0.elapsed().as_millis());
    eprintln!("| # | trigger | killed after | phase reached | master file | up | converged |");
    for (i, o) in outcomes.iter().enumerate() {
        eprintln!(
            "| {i} | {:?} | {} ms | {} | {:?} | {} ms | {} ms |",
            o.trigger,
            o.killed_after.as_millis(),
            o.phase,
            o.file_at_restart,
            o.started_after.as_millis(),
            o.converged_after.as_millis()
        );
    }
    assert!(
        outcomes
            .iter()
            .any(|o| !o.phase.starts_with("detection") && !o.phase.starts_with("done")),
        "no iteration killed the coordinator mid-round"
    );
}

/// Waits until the coordinator has re-published the healthy master and
/// every client confirmed it: the steady state before a failure.
async fn wait_published(http: &reqwest::Client, nc: &NodeProc, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let st = status(http, &nc.url).await;
        if let Ok(st) = &st
            && let Some(round) = st.coordinator.as_ref().and_then(|c| c.round.as_ref())
            && round.phase == "publish"
            && round.result == "every client confirmed"
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the coordinator did not publish the master within {within:?}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One iteration: fresh replica set and processes, master killed, then the
/// coordinator at `trigger`, then the coordinator restarted.
async fn kill_coordinator_once(http: &reqwest::Client, i: usize, trigger: Trigger) -> Outcome {
    let mut set = TestReplicaSet::start(1);
    let p = std::process::id();
    let (c, a, b) = (format!("kcoord{i}-{p}"), format!("kcla{i}-{p}"), format!("kclb{i}-{p}"));
    let (mut pa, mut pb, mut pc) = (free_port(), free_port(), free_port());
    let mut nodes = Nodes(Vec::new());
    nodes.0.push(spawn_node(http, &a, "client", &set, &[], &mut pa).await);
    nodes.0.push(spawn_node(http, &b, "client", &set, &[], &mut pb).await);
    let clients = vec![
        format!("{a}=http://127.0.0.1:{pa}"),
        format!("{b}=http://127.0.0.1:{pb}"),
    ];
    nodes
        .0
        .push(spawn_node(http, &c, "coordinator", &set, &clients, &mut pc).await);
    let (old, new, new_port) = (set.addr(0), set.addr(1), set.port(1));
    {
        let [na, nb, nc] = &nodes.0[..] else { unreachable!() };
        wait_all_master(http, &[na, nb, nc], &old, Duration::from_secs(10)).await;
        wait_published(http, nc, Duration::from_secs(10)).await;
    }

    let [na, nb, nc] = &mut nodes.0[..] else { unreachable!() };
    let (na, nb) = (&*na, &*nb);
    let watcher = Watcher::start(http, &[na, nb, &*nc], &new, new_port);
    // Let the watcher see the healthy state first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut replica = redis::Client::open(set.url(1)).unwrap().get_connection().unwrap();
    set.kill(0);
    let redis_killed = Instant::now();
    // Round ids are the coordinator's clock in ms; a round needs two failed
    // checks a second apart, so its id is above this.
    let floor = now_ms() + 500;

    let fallback = redis_killed + Duration::from_secs(8);
    let mut promoted = false;
    let fired = loop {
        let fired = match trigger {
            Trigger::Delay(ms) => redis_killed.elapsed() >= Duration::from_millis(ms),
            Trigger::RoundStarted => nc.log().contains("starting a failover round"),
            Trigger::Invalidated => na.data_file("redis-master").is_some_and(|m| m.is_empty()),
            Trigger::Promoted => redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut replica)
                .is_ok_and(|s| s.contains("role:master")),
            Trigger::Reconfigured => [na, nb, &*nc]
                .iter()
                .any(|n| n.data_file("redis-master").is_some_and(|m| m == new)),
        };
        if fired || Instant::now() > fallback {
            break fired;
        }
        let spin = matches!(trigger, Trigger::Reconfigured)
            && (promoted
                || redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut replica)
                    .is_ok_and(|s| s.contains("role:master")));
        if spin {
            promoted = true;
            std::hint::spin_loop();
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    watcher.set_live(&[na, nb]);
    nc.kill();
    let c_killed = Instant::now();
    let killed_after = c_killed - redis_killed;

    let (phase, evidence) = phase_reached(http, [na, nb], nc, &new, new_port, floor).await;
    let file_at_restart = nc.data_file("redis-master").unwrap_or_default();
    // The coordinator stays down for a second: nothing may change meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let restarted = Instant::now();
    restart_node(http, nc).await;
    let started_after = restarted.elapsed();
    watcher.set_live(&[na, nb, &*nc]);
    let deadline = restarted + Duration::from_secs(15);
    let converged: Result<(Duration, String), String> = loop {
        let sts = futures_util::future::join_all([na, nb, &*nc].map(|n| status(http, &n.url))).await;
        let masters: Vec<String> = sts
            .iter()
            .map(|r| match r {
                Ok(st) => st.master.clone(),
                Err(e) => format!("(error: {e})"),
            })
            .collect();
        let port = if masters[0] == new { Some(new_port) } else { None };
        if masters.iter().all(|m| *m == masters[0]) && port.is_some_and(|p| redis_role(p) == "master") {
            let round = sts[2]
                .as_ref()
                .unwrap()
                .coordinator
                .as_ref()
                .and_then(|c| c.round.as_ref());
            let by = match round {
                None => "they already agreed: nothing to do".to_string(),
                Some(round) => format!(
                    "by the restarted coordinator's {:?} {}: {:?}",
                    round.phase, round.id, round.result
                ),
            };
            break Ok((restarted.elapsed(), by));
        }
        if Instant::now() > deadline {
            break Err(format!(
                "the nodes did not agree on a master within 15 s of the coordinator's restart: {masters:?} \
                 (replica ROLE {}); coordinator status: {:?}",
                redis_role(new_port),
                sts[2]
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut writes = Vec::new();
    if converged.is_ok() {
        for n in [na, nb] {
            writes.push((n.id.clone(), enqueue(http, &n.url, "q").await));
        }
    }

    // The hard invariant first, then convergence, then the writes.
    let ticks = watcher.finish().await;
    let verdict = judge(&ticks, &old, &new, &c, redis_killed);
    let context = format!(
        "iteration {i} ({trigger:?}, coordinator killed {} ms after the master, phase {phase} [{evidence}])",
        killed_after.as_millis()
    );
    assert!(
        verdict.violations.is_empty(),
        "{context}: {} violation(s):\n{}",
        verdict.violations.len(),
        verdict.violations.join("\n")
    );
    let (converged_after, resolved_by) = converged.unwrap_or_else(|e| panic!("{context}: {e}"));
    for (id, w) in writes {
        assert_eq!(w, Ok(201), "{context}: enqueue through {id} after the nodes agreed");
    }
    let round_before_kill = ticks
        .iter()
        .flat_map(|t| &t.probes)
        .filter(|p| p.node == c && p.answered() < c_killed)
        .max_by_key(|p| p.answered())
        .map_or("(none)".to_string(), |p| {
            format!(
                "round {} ({} ms before the kill)",
                p.round.as_deref().unwrap_or("none"),
                (c_killed - p.answered()).as_millis()
            )
        });
    Outcome {
        trigger,
        fired,
        killed_after,
        round_before_kill,
        phase,
        evidence,
        file_at_restart,
        started_after,
        converged_after,
        resolved_by,
        verdict,
    }
}
