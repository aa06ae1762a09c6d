//! The coordinator's Raft state on disk (`--data-dir`): a whole site killed
//! with kill -9 comes back with the configuration it had committed last,
//! not the one it booted with, and a coordinator member restarted alone
//! rejoins the group as a working voter.
//!
//! A long failure timeout keeps the coordinator from removing nodes while
//! they restart one after the other, so every configuration change here is
//! one the test asked for and the expected configurations are exact.

mod common;

use common::{assert_readable, cluster_status, eventually, write_keys, Cluster, Opts};
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// The nodes that run the coordinator in these sites.
const COORDINATORS: [usize; 3] = [0, 1, 2];

/// A configuration as `CW.CLUSTER STATUS` shows it: the epoch, and every
/// member's address and chain roles (without the liveness a coordinator
/// member adds to each line).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Configuration {
    epoch: u64,
    members: BTreeMap<String, String>,
}

/// What node `via` reports: its configuration, the coordinator leader it
/// knows of (coordinator members only), and whether it is done moving data
/// (no short chain, no state transfer into it, no replica catching up).
fn configuration(c: &Cluster, via: usize) -> Option<(Configuration, Option<String>, bool)> {
    let s = cluster_status(c, via)?;
    let members = s
        .iter()
        .filter(|(k, v)| k.starts_with("node") && !v.starts_with("member=no"))
        .map(|(k, v)| (k.clone(), v.split_once(",state=").map_or(v.as_str(), |(roles, _)| roles).to_string()))
        .collect();
    let settled = s.get("short_chains")? == "0" && s.get("joining_replicas_here")? == "0" && s.get("catching_up_replicas_here")? == "0";
    Some((Configuration { epoch: s.get("epoch")?.parse().ok()?, members }, s.get("coordinator_leader").cloned(), settled))
}

/// Waits until every node of `nodes` shows the same configuration with no
/// data moving, and the coordinator members among them agree on a leader;
/// returns the configuration and the leader.
fn settled(c: &Cluster, nodes: &[usize]) -> (Configuration, usize) {
    c.eventually(WAIT, "every node to show the same settled configuration and leader", || {
        let reports: Vec<_> = nodes.iter().map(|&n| configuration(c, n).map(|r| (n, r))).collect::<Option<_>>()?;
        if std::env::var_os("DEBUG_STATUS").is_some() {
            eprintln!("{:?}", nodes.iter().map(|&n| cluster_status(c, n)).collect::<Vec<_>>());
        }
        let (first, _, _) = &reports[0].1;
        if !reports.iter().all(|(_, (config, _, settled))| config == first && *settled) {
            return None;
        }
        let leaders: Vec<&String> =
            reports.iter().filter(|(n, _)| COORDINATORS.contains(n)).filter_map(|(_, (_, l, _))| l.as_ref()).collect();
        let leader: usize = leaders.first()?.parse().ok()?;
        leaders.iter().all(|l| l.parse() == Ok(leader)).then(|| (first.clone(), leader))
    })
}

/// Sends `CW.CLUSTER REMOVE node` to whichever node leads the coordinator.
fn remove(c: &Cluster, node: usize) {
    eventually(WAIT, "the coordinator leader to accept the change", || {
        COORDINATORS.into_iter().find(|&i| {
            let Ok(mut con) = c.client(i).get_connection_with_timeout(Duration::from_secs(1)) else { return false };
            redis::cmd("CW.CLUSTER").arg("REMOVE").arg(node).query::<String>(&mut con).is_ok()
        })
    });
}

/// The same members in the same chain roles; the epoch is later, as every
/// restarted node is admitted again in a new epoch.
fn assert_same_chains(after: &Configuration, before: &Configuration, c: &Cluster) {
    assert!(after.epoch > before.epoch, "restarted nodes were admitted in a new epoch: {after:?}");
    assert_eq!(after.members, before.members, "the configuration after the restart\n{}", c.logs());
}

fn kill_all(c: &mut Cluster) {
    for i in 0..c.len() {
        c.kill(i);
    }
}

#[test]
fn a_whole_site_restart_comes_back_with_the_latest_configuration() {
    let mut c = Cluster::start_with(Opts::new(4, 3, 2).durable().flag("--fsync", "always").flag("--failure-timeout-ms", 60_000));
    let keys = write_keys(&c, "k:", 50);
    remove(&c, 3);
    let before = eventually(WAIT, "node 3 to be drained", || {
        let (config, _) = settled(&c, &COORDINATORS);
        (!config.members.contains_key("node3")).then_some(config)
    });
    assert!(before.epoch > 1, "the drain committed new epochs: {before:?}");

    kill_all(&mut c);
    for i in COORDINATORS {
        c.restart(i);
    }
    c.wait_serving(&COORDINATORS);
    let (after, _) = settled(&c, &COORDINATORS);
    assert_same_chains(&after, &before, &c);
    assert_readable(&c, &COORDINATORS, &keys);
}

#[test]
fn the_coordinators_log_alone_brings_the_configuration_back_and_a_restarted_member_rejoins() {
    let mut c = Cluster::start_with(Opts::new(5, 3, 2).durable().flag("--failure-timeout-ms", 60_000));
    remove(&c, 4);
    let before = eventually(WAIT, "node 4 to be drained", || {
        let (config, _) = settled(&c, &[0, 1, 2, 3]);
        (!config.members.contains_key("node4")).then_some(config)
    });

    // Every node also keeps the last configuration it installed
    // (topology.bin); without it a node starts from the boot configuration
    // (epoch 1, node 4 a member), so only the coordinator's Raft log can
    // bring the drain back.
    kill_all(&mut c);
    let data = c.opts.data_dir.clone().unwrap();
    for i in 0..4 {
        std::fs::remove_file(data.join(format!("node{i}")).join("topology.bin")).unwrap();
        assert_eq!(data.join(format!("node{i}")).join("raft").is_dir(), COORDINATORS.contains(&i));
    }
    for i in 0..4 {
        c.restart(i);
    }
    c.wait_serving(&[0, 1, 2, 3]);
    let (after, leader) = settled(&c, &[0, 1, 2, 3]);
    assert_same_chains(&after, &before, &c);

    // The leader alone is killed and restarted: it comes back with its log
    // and its vote, as the leader again if the others have not elected
    // another one meanwhile (openraft resumes a leader whose committed vote
    // survived), else as a follower of the new one.
    // Its data log is not whole (fsync=everysec), so it leaves its chains
    // and returns through state transfers: the same members, maybe other
    // roles.
    c.kill(leader);
    c.restart(leader);
    c.wait_serving(&[leader]);
    let again = eventually(WAIT, "the restarted leader to be a member again", || {
        let (again, _) = settled(&c, &[0, 1, 2, 3]);
        (again.members.keys().eq(before.members.keys())).then_some(again)
    });
    assert!(again.epoch > before.epoch);

    // It is a working voter: with another member down, the group needs it
    // to commit the next change: the first step of draining node 3 (its
    // chains extended past it). The drain cannot finish while the member
    // is down (it is in every chain of a three-node ring and cannot fetch),
    // and the long failure timeout keeps it from being removed.
    let down = COORDINATORS.into_iter().find(|&i| i != leader).unwrap();
    c.kill(down);
    remove(&c, 3);
    let up: Vec<usize> = COORDINATORS.into_iter().filter(|&i| i != down).collect();
    let step = eventually(WAIT, "the remaining members to commit a step of node 3's drain", || {
        let configs: Vec<Configuration> = up.iter().map(|&i| configuration(&c, i).map(|(config, _, _)| config)).collect::<Option<_>>()?;
        configs.iter().all(|config| config == &configs[0] && config.epoch > again.epoch).then(|| configs[0].clone())
    });
    assert!(step.members.contains_key("node3"), "node 3 leaves only once its chains hold the data elsewhere: {step:?}");

    // The member that was down catches up, and the drain completes.
    c.restart(down);
    c.wait_serving(&[down]);
    let last = eventually(WAIT, "node 3's drain to complete", || {
        let (last, _) = settled(&c, &COORDINATORS);
        (!last.members.contains_key("node3")).then_some(last)
    });
    assert!(last.epoch > step.epoch, "{last:?}");
}
