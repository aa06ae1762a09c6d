//! Causeway's own commands, under the `CW.` prefix.

use super::{syntax_error, upper, Batch, Handler, Outcome};
use crate::conn::Conn;
use bytes::Bytes;
use causeway_core::driver::Consistency;
use causeway_core::ring::NodeInfo;
use causeway_core::session::Session;
use causeway_resp::Frame;

/// CW.CONSISTENCY [causal | eventual | linearizable]: shows or sets this
/// connection's consistency level.
pub async fn consistency(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match args.len() {
        1 => Frame::Simple(conn.driver.consistency().to_string()),
        2 => match String::from_utf8_lossy(&args[1]).parse::<Consistency>() {
            Ok(c) => {
                conn.driver.set_consistency(c);
                Frame::ok()
            }
            Err(e) => Frame::error(format!("ERR {e}")),
        },
        _ => syntax_error(),
    }
    .into()
}

/// CW.WITH level command [args ...]: runs one data command (GET, SET, DEL,
/// EXISTS, MGET) at `level`, leaving the connection's level as it was; the
/// session's causal metadata carries over.
pub fn with(args: &[Bytes]) -> Result<Batch, Frame> {
    let level = String::from_utf8_lossy(&args[1]).parse::<Consistency>().map_err(|e| Frame::error(format!("ERR {e}")))?;
    let inner = &args[2..];
    let Some(cmd) = super::lookup(&inner[0]).filter(|c| ["get", "set", "del", "exists", "mget"].contains(&c.name)) else {
        return Err(Frame::error(format!("ERR CW.WITH runs GET, SET, DEL, EXISTS or MGET, not '{}'", String::from_utf8_lossy(&inner[0]))));
    };
    let Handler::Queue(parse) = cmd.handler else { unreachable!("data commands are queued") };
    super::check_arity(cmd, inner)?;
    Ok(Batch { level: Some(level), ..parse(inner)? })
}

/// CW.KEYRANGE: the partition map, as the p2p store's `keyrange`: one entry
/// per partition, `[partition, [[node id, address, role], ...]]`, head first.
pub async fn keyrange(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let t = conn.node.topology();
    let entries = t
        .chains
        .iter()
        .enumerate()
        .map(|(p, chain)| {
            let members = chain
                .nodes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let role = if i == 0 {
                        "head"
                    } else if i + 1 == chain.len() {
                        "tail"
                    } else {
                        "middle"
                    };
                    let addr = t.node(n).map(|n| n.addr.clone()).unwrap_or_default();
                    Frame::Array(vec![Frame::Integer(n as i64), Frame::Bulk(addr.into()), Frame::Simple(role.into())])
                })
                .collect();
            Frame::Array(vec![Frame::Integer(p as i64), Frame::Array(members)])
        })
        .collect();
    Frame::Array(entries).into()
}

/// CW.SESSION EXPORT | RESUME token | RESET | INFO: carry a session's
/// causal metadata to another connection or node.
pub async fn session(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match (upper(&args[1]).as_str(), args.len()) {
        ("EXPORT", 2) => Frame::Bulk(Bytes::from(hex(&conn.driver.session().export()))),
        ("RESUME", 3) => match unhex(&args[2])
            .ok_or("invalid session token: not hex".to_string())
            .and_then(|b| Session::import(&b, crate::server::now_ms()))
        {
            Ok(s) => {
                conn.driver.set_session(s);
                Frame::ok()
            }
            Err(e) => Frame::error(format!("ERR {e}")),
        },
        ("RESET", 2) => {
            conn.driver.set_session(Session::default());
            Frame::ok()
        }
        ("INFO", 2) => {
            let s = conn.driver.session();
            Frame::Bulk(Bytes::from(format!("tracked_keys:{}\r\nmax_ts:{}\r\n", s.tracked_keys(), s.max_ts())))
        }
        _ => syntax_error(),
    }
    .into()
}

/// CW.CHAIN key: the partition of `key` and its chain, head first, as
/// `[partition, [[node id, address], ...]]`.
pub async fn chain(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let t = conn.node.topology();
    let p = t.partition_of(&args[1]);
    let members = t
        .chain(p)
        .nodes
        .iter()
        .map(|&n| Frame::Array(vec![Frame::Integer(n as i64), Frame::Bulk(t.node(n).map(|i| i.addr.clone()).unwrap_or_default().into())]))
        .collect();
    Frame::Array(vec![Frame::Integer(p as i64), Frame::Array(members)]).into()
}

/// CW.DIGEST: each replica this node holds in brief, one line per
/// partition: `partition:applied:stable:hash` (the hash covers every key's
/// latest version and value). Replicas of one chain that hold the same data
/// show the same line: tests and operators compare them across nodes.
pub async fn digest(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let mut text = String::new();
    for (p, d) in conn.node.digests() {
        text.push_str(&format!("{p}:{}:{}:{:016x}\r\n", d.applied, d.stable, d.fingerprint()));
    }
    Frame::Bulk(Bytes::from(text)).into()
}

/// CW.STATUS: this node at a glance.
pub async fn status(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let node = &conn.node;
    let causeway_core::ring::Roles { head, middle, tail } = node.topology().roles(node.me);
    let t = node.topology();
    let text = format!(
        "node:{}\r\nserving:{}\r\nlease:{}\r\nincarnation:{:x}\r\nepoch:{}\r\nnodes:{}\r\npartitions:{}\r\nreplicas:{}\r\nk:{}\r\nhead_of:{head}\r\nmiddle_of:{middle}\r\ntail_of:{tail}\r\n",
        node.me,
        if node.is_admitted() { "yes" } else { "no" },
        if node.has_lease() { "held" } else { "none" },
        node.incarnation(),
        t.epoch,
        t.nodes.len(),
        t.shape.partitions,
        t.shape.replicas,
        t.shape.k
    );
    Frame::Bulk(Bytes::from(text)).into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2).map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok()).collect()
}

/// CW.CLUSTER STATUS | ADD id host:port | REMOVE id: the site's
/// configuration and membership changes (ADD and REMOVE go to the
/// coordinator leader; other nodes say which node leads).
pub async fn cluster(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let node = conn.node.clone();
    let arg = |i: usize| String::from_utf8_lossy(&args[i]).into_owned();
    match (upper(&args[1]).as_str(), args.len()) {
        ("STATUS", 2) => Frame::Bulk(Bytes::from(cluster_status(&node))),
        ("ADD", 4) => {
            let Ok(id) = arg(2).parse() else { return Frame::error("ERR invalid node id").into() };
            match node.coordinator.get().ok_or_else(not_coordinator).and_then(|c| c.add(NodeInfo { id, addr: arg(3) })) {
                Ok(()) => Frame::ok(),
                Err(e) => Frame::error(format!("ERR {e}")),
            }
        }
        ("REMOVE", 3) => {
            let Ok(id) = arg(2).parse() else { return Frame::error("ERR invalid node id").into() };
            match node.coordinator.get().ok_or_else(not_coordinator).and_then(|c| c.drain(id)) {
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
    let mut s = format!(",state={state},heartbeat_ms_ago={},epoch={},joining={},failures={}", r.silent_ms, r.epoch, r.joining, r.failures);
    if let Some(ms) = r.held_out_ms {
        s.push_str(&format!(",returning_in_ms={ms}"));
    }
    s
}

fn cluster_status(node: &crate::server::Node) -> String {
    let t = node.topology();
    let mut s = format!("epoch:{}\r\npartitions:{}\r\nreplicas:{}\r\nk:{}\r\n", t.epoch, t.shape.partitions, t.shape.replicas, t.shape.k);
    let coordinators: Vec<String> = node.config.coordinators().iter().map(|c| c.to_string()).collect();
    s.push_str(&format!("coordinators:{}\r\n", coordinators.join(",")));
    // Coordinator members hear every node's heartbeats: they know the
    // site's in-flight state transfers and which nodes are silent.
    let reports = node.coordinator.get().map(|c| c.reports(&t)).unwrap_or_default();
    if let Some(c) = node.coordinator.get() {
        s.push_str(&format!("coordinator_leader:{}\r\n", c.leader().map_or("unknown".into(), |l| l.to_string())));
        s.push_str(&format!("transfers_in_flight:{}\r\n", reports.iter().filter(|r| r.alive).map(|r| r.joining).sum::<u32>()));
    }
    let lengths: Vec<usize> = t.chains.iter().map(|c| c.len()).collect();
    let short = lengths.iter().filter(|&&l| l < t.shape.replicas).count();
    s.push_str(&format!(
        "chain_length_min:{}\r\nchain_length_max:{}\r\nshort_chains:{short}\r\njoining_replicas_here:{}\r\n",
        lengths.iter().min().unwrap_or(&0),
        lengths.iter().max().unwrap_or(&0),
        node.joining_replicas()
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
