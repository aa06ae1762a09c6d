//! Connection and server commands: enough of Redis for common clients,
//! redis-cli and redis-benchmark to work unchanged.

use super::{syntax_error, upper, wrong_arity, Outcome, COMMANDS};
use crate::conn::Conn;
use crate::server::now_ms;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::{Frame, Protocol};
use std::sync::atomic::Ordering;

/// PING [message]
pub async fn ping(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match args.len() {
        1 => Frame::Simple("PONG".into()),
        2 => Frame::Bulk(args[1].clone()),
        _ => wrong_arity("ping"),
    }
    .into()
}

/// ECHO message
pub async fn echo(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    Frame::Bulk(args[1].clone()).into()
}

fn check_password(conn: &mut Conn, password: &[u8]) -> Option<Frame> {
    match &conn.node.config.requirepass {
        None => Some(Frame::error(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        )),
        Some(p) if p.as_bytes() == password => {
            conn.authed = true;
            None
        }
        Some(_) => Some(Frame::error("WRONGPASS invalid username-password pair or user is disabled.")),
    }
}

/// AUTH [username] password (only the `default` user exists).
pub async fn auth(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let password = match args.len() {
        2 => &args[1],
        // Without requirepass the default user has no password and any
        // password logs in, as in Redis.
        3 if args[1].as_ref() == b"default" && conn.node.config.requirepass.is_none() => return Frame::ok().into(),
        3 if args[1].as_ref() == b"default" => &args[2],
        3 => return Frame::error("WRONGPASS invalid username-password pair or user is disabled.").into(),
        _ => return syntax_error().into(),
    };
    check_password(conn, password).unwrap_or_else(Frame::ok).into()
}

/// HELLO [protover [AUTH username password] [SETNAME clientname]]
pub async fn hello(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let mut proto = conn.proto;
    if let Some(v) = args.get(1) {
        proto = match v.as_ref() {
            b"2" => Protocol::Resp2,
            b"3" => Protocol::Resp3,
            _ => return Frame::error("NOPROTO unsupported protocol version").into(),
        };
    }
    let mut i = 2;
    while i < args.len() {
        match upper(&args[i]).as_str() {
            "AUTH" if i + 2 < args.len() => {
                if args[i + 1].as_ref() != b"default" {
                    return Frame::error("WRONGPASS invalid username-password pair or user is disabled.").into();
                }
                if conn.node.config.requirepass.is_some() {
                    if let Some(err) = check_password(conn, &args[i + 2]) {
                        return err.into();
                    }
                }
                i += 3;
            }
            "SETNAME" if i + 1 < args.len() => {
                conn.name = Some(String::from_utf8_lossy(&args[i + 1]).into_owned());
                i += 2;
            }
            _ => return syntax_error().into(),
        }
    }
    if !conn.authed {
        return Frame::error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time").into();
    }
    conn.proto = proto;
    let s = |x: &str| Frame::Bulk(Bytes::from(x.to_string()));
    Frame::Map(vec![
        (s("server"), s("causeway")),
        (s("version"), s(env!("CARGO_PKG_VERSION"))),
        (s("proto"), Frame::Integer(if proto == Protocol::Resp3 { 3 } else { 2 })),
        (s("id"), Frame::Integer((conn.id() & 0xFFFF_FFFF_FFFF) as i64)),
        (s("mode"), s("cluster")),
        (s("role"), s("master")),
        (s("modules"), Frame::Array(Vec::new())),
    ])
    .into()
}

/// SELECT index: only database 0 exists.
pub async fn select(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match args[1].as_ref() {
        b"0" => Frame::ok(),
        _ => Frame::error("ERR DB index is out of range"),
    }
    .into()
}

/// QUIT
pub async fn quit(_conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    Outcome::Close(Frame::ok())
}

/// CLIENT SETNAME name | GETNAME | ID | SETINFO ...: what client libraries
/// send on connect.
pub async fn client(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match (upper(&args[1]).as_str(), args.len()) {
        ("SETNAME", 3) => {
            conn.name = Some(String::from_utf8_lossy(&args[2]).into_owned());
            Frame::ok()
        }
        ("GETNAME", 2) => conn.name.clone().map_or(Frame::Null, |n| Frame::Bulk(n.into())),
        ("ID", 2) => Frame::Integer((conn.id() & 0xFFFF_FFFF_FFFF) as i64),
        ("SETINFO", 4) => Frame::ok(),
        _ => Frame::error(format!("ERR unknown subcommand or wrong number of arguments for '{}'", String::from_utf8_lossy(&args[1]))),
    }
    .into()
}

/// COMMAND [COUNT | DOCS | INFO ...]: the command table, as far as clients
/// use it.
pub async fn command(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let entry = |c: &super::Command| {
        Frame::Array(vec![
            Frame::Bulk(Bytes::from_static(c.name.as_bytes())),
            Frame::Integer(c.arity),
            Frame::Array(Vec::new()),
            Frame::Integer(if c.name.starts_with("cw.") || c.arity == 1 { 0 } else { 1 }),
            Frame::Integer(if c.arity == 1 { 0 } else { -1 }),
            Frame::Integer(1),
        ])
    };
    match args.get(1).map(|a| upper(a)).as_deref() {
        None => Frame::Array(COMMANDS.iter().map(entry).collect()),
        Some("COUNT") => Frame::Integer(COMMANDS.len() as i64),
        Some("DOCS") => Frame::Map(Vec::new()),
        Some("INFO") => Frame::Array(
            args[2..]
                .iter()
                .map(|n| COMMANDS.iter().find(|c| c.name.as_bytes().eq_ignore_ascii_case(n)).map_or(Frame::Null, entry))
                .collect(),
        ),
        Some(_) => Frame::error("ERR unknown subcommand for 'command'"),
    }
    .into()
}

/// The sections INFO knows, in the order it prints them.
const INFO_SECTIONS: [&str; 8] = ["server", "clients", "memory", "cpu", "stats", "persistence", "replication", "keyspace"];

/// INFO [section ...]: the sections Redis tools read (server, clients,
/// memory, cpu, stats, persistence, replication, keyspace) plus Causeway's
/// own fields in replication. No argument, `default`, `all` or
/// `everything`: every section; otherwise the named ones (unknown names
/// are skipped, as Redis does).
pub async fn info(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let asked: Vec<String> = args[1..].iter().map(|a| String::from_utf8_lossy(a).to_lowercase()).collect();
    let all = asked.is_empty() || asked.iter().any(|a| matches!(a.as_str(), "all" | "everything" | "default"));
    let mut text = String::new();
    for section in INFO_SECTIONS.into_iter().filter(|s| all || asked.iter().any(|a| a == s)) {
        if !text.is_empty() {
            text.push_str("\r\n");
        }
        let mut title = section.to_string();
        title[..1].make_ascii_uppercase();
        text.push_str(&format!("# {title}\r\n"));
        for (k, v) in info_section(conn, section).await {
            text.push_str(&format!("{k}:{v}\r\n"));
        }
    }
    Frame::Bulk(Bytes::from(text)).into()
}

async fn info_section(conn: &mut Conn, section: &str) -> Vec<(&'static str, String)> {
    let node = conn.node.clone();
    let stat = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed).to_string();
    match section {
        "server" => vec![
            ("redis_version", "7.0.0".into()),
            ("causeway_version", env!("CARGO_PKG_VERSION").into()),
            ("process_id", std::process::id().to_string()),
            ("node_id", node.me.to_string()),
            ("tcp_port", node.config.listen.rsplit(':').next().unwrap_or("").into()),
            ("uptime_in_seconds", node.started.elapsed().as_secs().to_string()),
        ],
        "clients" => vec![("connected_clients", stat(&node.stats.connections))],
        "memory" => {
            // No allocator statistics yet: used_memory is the resident set.
            let rss = proc_self::rss_bytes().unwrap_or(0);
            vec![("used_memory", rss.to_string()), ("used_memory_rss", rss.to_string()), ("maxmemory", "0".into())]
        }
        "cpu" => {
            let (user, sys) = proc_self::cpu_seconds().unwrap_or_default();
            vec![("used_cpu_sys", format!("{sys:.6}")), ("used_cpu_user", format!("{user:.6}"))]
        }
        "stats" => vec![
            ("total_connections_received", stat(&node.stats.total_connections)),
            ("total_commands_processed", stat(&node.stats.commands)),
            ("instantaneous_ops_per_sec", stat(&node.stats.ops_per_sec)),
            ("keyspace_hits", stat(&node.stats.keyspace_hits)),
            ("keyspace_misses", stat(&node.stats.keyspace_misses)),
        ],
        "persistence" => match node.wal() {
            Some(wal) => vec![
                ("aof_enabled", "1".into()),
                ("aof_fsync", wal.policy().into()),
                ("aof_current_size", wal.size().to_string()),
                ("aof_last_fsync_ms_ago", now_ms().saturating_sub(wal.last_sync_ms()).to_string()),
            ],
            None => vec![("aof_enabled", "0".into())],
        },
        "replication" => {
            let topology = node.topology();
            let causeway_core::ring::Roles { head, middle, tail } = topology.roles(node.me);
            vec![
                ("role", "master".into()),
                ("serving", if node.is_admitted() { "yes" } else { "no" }.into()),
                ("lease", if node.has_lease() { "held" } else { "none" }.into()),
                ("epoch", topology.epoch.to_string()),
                ("partitions", topology.shape.partitions.to_string()),
                ("replicas", topology.shape.replicas.to_string()),
                ("k", topology.shape.k.to_string()),
                ("head_of", head.to_string()),
                ("middle_of", middle.to_string()),
                ("tail_of", tail.to_string()),
                ("consistency", conn.driver.consistency().to_string()),
                ("peer_backlog_bytes", node.peer_backlog().to_string()),
                ("peer_dropped_messages", node.dropped_peer_messages().to_string()),
            ]
        }
        "keyspace" => match conn.run(Request::Count).await {
            // The whole site's keys, counted at the heads (like DBSIZE).
            Ok(Response::Count(k)) if k.keys > 0 => vec![("db0", format!("keys={},expires={},avg_ttl=0", k.keys, k.expires))],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// What Linux says about this process (INFO memory and cpu).
mod proc_self {
    /// The resident set, in bytes.
    pub fn rss_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }

    /// CPU time used, user and system, in seconds (Linux counts in ticks of
    /// 1/100 s).
    pub fn cpu_seconds() -> Option<(f64, f64)> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces), which ends
        // at the last ')'.
        let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = |i: usize| rest.get(i)?.parse::<f64>().ok().map(|t| t / 100.0);
        Some((ticks(11)?, ticks(12)?))
    }
}

/// CONFIG GET pattern: answers with no parameters (Causeway is configured
/// by flags, not at run time), which is what tools such as redis-benchmark
/// need; CONFIG SET is refused.
pub async fn config(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match (upper(&args[1]).as_str(), args.len()) {
        ("GET", n) if n >= 3 => Frame::Map(Vec::new()),
        ("SET", _) => Frame::error("ERR CONFIG SET is not supported: Causeway is configured by flags or its TOML file"),
        _ => Frame::error(format!("ERR unknown subcommand or wrong number of arguments for '{}'", String::from_utf8_lossy(&args[1]))),
    }
    .into()
}
