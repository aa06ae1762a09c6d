//! CW.CLUSTER STATUS | ADD id host:port | REMOVE id
//!
//! The site's configuration and membership changes. STATUS replies with
//! `field:value` lines; ADD and REMOVE go to the coordinator leader and
//! reply `+OK`, or `ERR ...` saying which node leads when this one does not,
//! or `ERR invalid node id`. Another subcommand or argument count:
//! `ERR syntax error`.

use crate::config::NodeConfig;
use crate::redis::cmd::{syntax_error, upper, Outcome};
use crate::redis::conn::Conn;
use crate::runtime::Status;
use bytes::Bytes;
use causeway_core::ring::NodeInfo;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let node = conn.node.clone();
    let arg = |i: usize| String::from_utf8_lossy(&args[i]).into_owned();
    match (upper(&args[1]).as_str(), args.len()) {
        ("STATUS", 2) => Frame::Bulk(Bytes::from(status(node.config(), &node.status()))),
        ("ADD", 4) => {
            let Ok(id) = arg(2).parse() else { return Frame::error("ERR invalid node id").into() };
            match node.add_node(NodeInfo { id, addr: arg(3) }).unwrap_or_else(|| Err(not_coordinator())) {
                Ok(()) => Frame::ok(),
                Err(e) => Frame::error(format!("ERR {e}")),
            }
        }
        ("REMOVE", 3) => {
            let Ok(id) = arg(2).parse() else { return Frame::error("ERR invalid node id").into() };
            match node.remove_node(id).unwrap_or_else(|| Err(not_coordinator())) {
                Ok(()) => Frame::ok(),
                Err(e) => Frame::error(format!("ERR {e}")),
            }
        }
        _ => syntax_error(),
    }
    .into()
}

fn not_coordinator() -> String {
    "this node does not run the coordinator; send this to the coordinator leader (see CW.CLUSTER STATUS)".into()
}

fn heard(r: &causeway_core::supervisor::NodeReport) -> String {
    let state = if r.alive { "up" } else { "silent" };
    let mut s = format!(
        ",state={state},heartbeat_ms_ago={},epoch={},joining={},catching_up={},failures={}",
        r.silent_ms, r.epoch, r.joining, r.catching_up, r.failures
    );
    if let Some(ms) = r.held_out_ms {
        s.push_str(&format!(",returning_in_ms={ms}"));
    }
    s
}

fn status(config: &NodeConfig, status: &Status) -> String {
    let t = &status.topology;
    let mut s = format!("epoch:{}\r\npartitions:{}\r\nreplicas:{}\r\nk:{}\r\n", t.epoch, t.shape.partitions, t.shape.replicas, t.shape.k);
    let coordinators: Vec<String> = config.coordinators().iter().map(|c| c.to_string()).collect();
    s.push_str(&format!("coordinators:{}\r\n", coordinators.join(",")));
    // Coordinator members hear every node's heartbeats: they know the
    // site's in-flight state transfers and which nodes are silent.
    let reports = status.coordinator.as_ref().map_or(&[][..], |c| &c.reports);
    if let Some(c) = &status.coordinator {
        s.push_str(&format!("coordinator_leader:{}\r\n", c.leader.map_or("unknown".into(), |l| l.to_string())));
        s.push_str(&format!("transfers_in_flight:{}\r\n", reports.iter().filter(|r| r.alive).map(|r| r.joining).sum::<u32>()));
    }
    let lengths: Vec<usize> = t.chains.iter().map(|c| c.len()).collect();
    let short = lengths.iter().filter(|&&l| l < t.shape.replicas).count();
    s.push_str(&format!(
        "chain_length_min:{}\r\nchain_length_max:{}\r\nshort_chains:{short}\r\njoining_replicas_here:{}\r\ncatching_up_replicas_here:{}\r\n",
        lengths.iter().min().unwrap_or(&0),
        lengths.iter().max().unwrap_or(&0),
        status.joining_replicas,
        status.catching_up_replicas
    ));
    for n in &t.nodes {
        let causeway_core::ring::Roles { head, middle, tail } = t.roles(n.id);
        s.push_str(&format!("node{}:addr={},head={head},middle={middle},tail={tail}", n.id, n.addr));
        if let Some(r) = reports.iter().find(|r| r.node == n.id) {
            s.push_str(&heard(r));
        }
        s.push_str("\r\n");
    }
    // Heard from but not in the configuration: added and not placed yet,
    // or removed and still running.
    for r in reports.iter().filter(|r| t.node(r.node).is_none()) {
        s.push_str(&format!("node{}:member=no{}\r\n", r.node, heard(r)));
    }
    s
}
