//! Smoke tests of the HA fixtures in `common::ha`: a Sentinel failover and a
//! three-master cluster, without muster, so a harness problem shows up here
//! and not as a mysterious failure elsewhere.

use std::time::{Duration, Instant};

use crate::common::ha::{TestCluster, TestReplicaSet, TestSentinels};
use crate::common::skip_on_cluster;

#[test]
fn replica_set_and_sentinels_start() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let mut set = TestReplicaSet::start(1);
    assert_eq!(set.role(set.ports()[0]), "master");
    assert_eq!(set.role(set.ports()[1]), "slave");
    assert_eq!(set.master_port(), Some(set.ports()[0]));

    let t = Instant::now();
    let sentinels = TestSentinels::start(&set, 3, "muster");
    eprintln!("sentinels ready in {:?}", t.elapsed());
    assert_eq!(sentinels.addrs().len(), 3);
    assert_eq!(sentinels.master_addr(), Some(set.addr(0)));

    set.kill(0);
    assert!(!set.is_alive(0));
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(15);
    let want = set.addr(1);
    loop {
        let all = (0..3).all(|i| sentinels.master_addr_at(i).as_deref() == Some(want.as_str()));
        if all && set.role(set.ports()[1]) == "master" {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "no failover within 15 s: sentinels say {:?}, replica role {:?}\nsentinel 0 log:\n{}",
                (0..3).map(|i| sentinels.master_addr_at(i)).collect::<Vec<_>>(),
                set.role(set.ports()[1]),
                sentinels.log(0)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "failover: kill -> all sentinels name the new master in {:?}",
        killed.elapsed()
    );
    assert_eq!(sentinels.master_addr(), Some(want));
    assert_eq!(set.master_port(), Some(set.ports()[1]));
    assert_eq!(set.role(set.ports()[0]), "");
}

#[test]
fn cluster_starts() {
    if skip_on_cluster("builds its own Redis topology (not the shared cluster)") {
        return;
    }
    let t = Instant::now();
    let cluster = TestCluster::start(3);
    eprintln!("cluster ready in {:?}", t.elapsed());
    assert_eq!(cluster.seeds().len(), 3);
    assert_eq!(cluster.ports().len(), 3);

    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let _: () = redis::cmd("SET").arg("{muster}:x").arg("42").query(&mut conn).unwrap();
    let got: String = redis::cmd("GET").arg("{muster}:x").query(&mut conn).unwrap();
    assert_eq!(got, "42");

    // Also through the "host:port" seeds, as a user would configure them.
    let urls: Vec<String> = cluster.seeds().iter().map(|s| format!("redis://{s}")).collect();
    let client = redis::cluster::ClusterClient::new(urls).unwrap();
    let mut conn = client.get_connection().unwrap();
    let got: String = redis::cmd("GET").arg("{muster}:x").query(&mut conn).unwrap();
    assert_eq!(got, "42");
}
