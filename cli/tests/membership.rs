//! Growing and shrinking a running site: a node joins (it receives the
//! state of the partitions it takes while new writes keep flowing) and a
//! node is drained out; nothing written is lost and every chain ends at R.

mod common;

use common::{eventually, Cluster, Opts};
use redis::Commands;
use std::collections::HashMap;
use std::time::Duration;

fn status(c: &Cluster, via: usize) -> Option<HashMap<String, String>> {
    let mut con = c.client(via).get_connection_with_timeout(Duration::from_secs(1)).ok()?;
    let text: String = redis::cmd("CW.CLUSTER").arg("STATUS").query(&mut con).ok()?;
    Some(text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// Sends a membership change to whichever node leads the coordinator.
fn change(c: &Cluster, args: &[String]) {
    eventually(Duration::from_secs(10), "the coordinator leader to accept the change", || {
        (0..3).find(|&i| {
            let Ok(mut con) = c.client(i).get_connection_with_timeout(Duration::from_secs(1)) else { return false };
            redis::cmd("CW.CLUSTER").arg(args).query::<String>(&mut con).is_ok()
        })
    });
}

fn write_keys(c: &Cluster, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut con = c.conn(0);
    (0..n)
        .map(|i| {
            let (k, v) = (format!("{prefix}{i}"), format!("v{i}"));
            let _: () = con.set(&k, &v).unwrap();
            (k, v)
        })
        .collect()
}

fn readable_everywhere(c: &Cluster, nodes: &[usize], keys: &[(String, String)]) {
    for &node in nodes {
        for level in ["linearizable", "causal"] {
            let mut con = c.conn(node);
            let _: () = redis::cmd("CW.CONSISTENCY").arg(level).query(&mut con).unwrap();
            for (k, v) in keys {
                let got: Option<String> = con.get(k).unwrap();
                assert_eq!(got.as_deref(), Some(v.as_str()), "{level} read of {k} via node {node}\n{}", c.logs());
            }
        }
    }
}

#[test]
fn a_node_joins_and_takes_its_share_with_the_data() {
    let mut c = Cluster::start_with(Opts::new(3, 3, 2));
    let before = write_keys(&c, "before:", 300);
    let new = c.start_joiner();
    change(&c, &["ADD".into(), new.to_string(), c.addr(new)]);
    let s = eventually(Duration::from_secs(20), "the new node to be placed and filled", || {
        let s = status(&c, new)?;
        let placed = s.get(&format!("node{new}")).is_some_and(|r| !r.contains("head=0,middle=0,tail=0"));
        (placed && s.get("short_chains")? == "0" && s.get("joining_replicas_here")? == "0").then_some(s)
    });
    eprintln!("after the join: {s:?}");
    let after = write_keys(&c, "after:", 50);
    // Linearizable reads go to the tails, the new node among them.
    readable_everywhere(&c, &[0, 1, 2, new], &before);
    readable_everywhere(&c, &[new], &after);
}

#[test]
fn a_drained_node_leaves_every_chain_without_losing_data() {
    let c = Cluster::start_with(Opts::new(4, 3, 2));
    let keys = write_keys(&c, "k:", 300);
    change(&c, &["REMOVE".into(), "3".into()]);
    eventually(Duration::from_secs(20), "node 3 to leave and the chains to grow back", || {
        let s = status(&c, 0)?;
        (!s.contains_key("node3") && s.get("short_chains")? == "0").then_some(())
    });
    // Joining replicas finish their transfers on the nodes that took over.
    eventually(Duration::from_secs(20), "state transfers to finish", || {
        (0..3).all(|i| status(&c, i).is_some_and(|s| s.get("joining_replicas_here").is_some_and(|j| j == "0"))).then_some(())
    });
    readable_everywhere(&c, &[0, 1, 2], &keys);
}
