//! Connection and server commands: enough of Redis for common clients,
//! redis-cli and redis-benchmark to work unchanged.

use super::{syntax_error, upper, wrong_arity, Outcome, COMMANDS};
use crate::conn::Conn;
use bytes::Bytes;
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

/// INFO [section]: server, clients, stats, replication (the chain roles) and
/// keyspace (this node's replicas).
pub async fn info(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let node = &conn.node;
    let causeway_core::ring::Roles { head, middle, tail } = node.topology().roles(node.me);
    let topology = node.topology();
    let shape = topology.shape;
    let text = format!(
        "# Server\r\nredis_version:7.0.0\r\ncauseway_version:{}\r\nnode_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n\r\n\
         # Clients\r\nconnected_clients:{}\r\n\r\n\
         # Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\r\n\
         # Replication\r\nrole:master\r\nserving:{}\r\nepoch:{}\r\npartitions:{}\r\nreplicas:{}\r\nk:{}\r\nhead_of:{head}\r\nmiddle_of:{middle}\r\ntail_of:{tail}\r\nconsistency:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        node.me,
        node.config.listen.rsplit(':').next().unwrap_or(""),
        node.started.elapsed().as_secs(),
        node.stats.connections.load(Ordering::Relaxed),
        node.stats.total_connections.load(Ordering::Relaxed),
        node.stats.commands.load(Ordering::Relaxed),
        if node.is_admitted() { "yes" } else { "no" },
        topology.epoch,
        shape.partitions,
        shape.replicas,
        shape.k,
        conn.driver.consistency(),
    );
    Frame::Bulk(Bytes::from(text)).into()
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
