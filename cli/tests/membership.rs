//! Growing and shrinking a running site: a node joins (it receives the
//! state of the partitions it takes while new writes keep flowing) and a
//! node is drained out; nothing written is lost and every chain ends at R.

mod common;

use common::{assert_readable, cluster_status, eventually, write_keys, Cluster, Opts};
use std::time::Duration;

/// Sends a membership change to whichever node leads the coordinator.
fn change(c: &Cluster, args: &[String]) {
    eventually(Duration::from_secs(10), "the coordinator leader to accept the change", || {
        (0..3).find(|&i| {
            let Ok(mut con) = c.client(i).get_connection_with_timeout(Duration::from_secs(1)) else { return false };
            redis::cmd("CW.CLUSTER").arg(args).query::<String>(&mut con).is_ok()
        })
    });
}

#[test]
fn a_node_joins_and_takes_its_share_with_the_data() {
    let mut c = Cluster::start_with(Opts::new(3, 3, 2));
    let before = write_keys(&c, "before:", 300);
    let new = c.start_joiner();
    change(&c, &["ADD".into(), new.to_string(), c.addr(new)]);
    let s = eventually(Duration::from_secs(20), "the new node to be placed and filled", || {
        let s = cluster_status(&c, new)?;
        let placed = s.get(&format!("node{new}")).is_some_and(|r| !r.contains("head=0,middle=0,tail=0"));
        (placed && s.get("short_chains")? == "0" && s.get("joining_replicas_here")? == "0").then_some(s)
    });
    eprintln!("after the join: {s:?}");
    let after = write_keys(&c, "after:", 50);
    // Linearizable reads go to the tails, the new node among them.
    assert_readable(&c, &[0, 1, 2, new], &before);
    assert_readable(&c, &[new], &after);
}

#[test]
fn a_drained_node_leaves_every_chain_without_losing_data() {
    let c = Cluster::start_with(Opts::new(4, 3, 2));
    let keys = write_keys(&c, "k:", 300);
    // A node that is not in the site: every member refuses, the leader
    // saying which nodes there are.
    let errors: Vec<String> =
        (0..3).map(|i| redis::cmd("CW.CLUSTER").arg("REMOVE").arg(9).query::<String>(&mut c.conn(i)).unwrap_err().to_string()).collect();
    assert!(errors.iter().any(|e| e.contains("no node 9 in this site (its nodes: 0,1,2,3)")), "{errors:?}");
    change(&c, &["REMOVE".into(), "3".into()]);
    eventually(Duration::from_secs(20), "node 3 to leave and the chains to grow back", || {
        let s = cluster_status(&c, 0)?;
        (!common::is_member(&s, 3) && s.get("short_chains")? == "0").then_some(())
    });
    // Joining replicas finish their transfers on the nodes that took over:
    // the coordinator sees it site-wide, from heartbeats sent at the
    // current epoch.
    let s = eventually(Duration::from_secs(20), "state transfers to finish", || {
        let s = cluster_status(&c, 0)?;
        let epoch = format!("epoch={}", s.get("epoch")?);
        let current = (0..3).all(|n| s.get(&format!("node{n}")).is_some_and(|l| l.contains(&epoch) && l.contains("state=up")));
        (current && s.get("transfers_in_flight")? == "0").then_some(s)
    });
    assert!(s.get("node3").is_some_and(|l| l.starts_with("member=no")), "the drained node is still running, outside the site: {s:?}");
    assert_eq!(s.get("coordinators").map(String::as_str), Some("0,1,2"));
    assert_readable(&c, &[0, 1, 2], &keys);
}
