//! CLIENT SETNAME name | GETNAME | ID | SETINFO attribute value | INFO |
//! LIST [TYPE type] [ID id ...] | KILL ip:port | KILL filter value ...
//!
//! What client libraries send on connect. SETNAME takes a name of
//! printable characters without spaces (else Redis's error), and an empty
//! one clears it. SETINFO is accepted and forgotten. INFO and LIST show
//! this node's connections in Redis 7's format (what Causeway does not
//! track, such as buffer sizes, is 0; `multi` is -1 but for the asking
//! connection; every client is `normal`). KILL closes connections of this
//! node, by the old form (`ip:port`, `+OK` or `ERR No such client`) or by
//! filters (ID, ADDR, LADDR, TYPE, USER, SKIPME yes|no; the number
//! killed); a killed
//! connection closes when it next waits for input. Another subcommand is `ERR unknown subcommand '...' for
//! 'client'`, and the wrong number of arguments for one is
//! `ERR wrong number of arguments for 'client|setname' command`, as Redis 7
//! names it (both answered in `mod.rs` before this runs).

use super::{upper, Outcome, Subcommand};
use crate::redis::conn::Conn;
use crate::redis::Client;
use bytes::Bytes;
use causeway_resp::Frame;
use std::sync::Arc;

/// Arities as Redis 7 states them, counting CLIENT.
pub const SUBCOMMANDS: &[Subcommand] = &[
    Subcommand { name: "setname", arity: 3 },
    Subcommand { name: "getname", arity: 2 },
    Subcommand { name: "id", arity: 2 },
    Subcommand { name: "setinfo", arity: 4 },
    Subcommand { name: "info", arity: 2 },
    Subcommand { name: "list", arity: -2 },
    Subcommand { name: "kill", arity: -3 },
];

/// Names the connection (CLIENT SETNAME, HELLO SETNAME), as Redis checks
/// the name: no spaces, newlines or other characters outside `!`..=`~`;
/// an empty name clears it.
pub fn set_name(conn: &mut Conn, name: &[u8]) -> Result<(), Frame> {
    if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return Err(Frame::error("ERR Client names cannot contain spaces, newlines or special characters."));
    }
    *conn.client.name.lock() = (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned());
    Ok(())
}

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match upper(&args[1]).as_str() {
        "SETNAME" => match set_name(conn, &args[2]) {
            Ok(()) => Frame::ok(),
            Err(e) => e,
        },
        "GETNAME" => conn.client.name.lock().clone().map_or(Frame::Null, |n| Frame::Bulk(n.into())),
        "ID" => Frame::Integer((conn.id() & 0xFFFF_FFFF_FFFF) as i64),
        "SETINFO" => Frame::ok(),
        "INFO" => Frame::Bulk(Bytes::from(line(&conn.client, Some((conn, "client|info"))))),
        "LIST" => list(conn, &args[2..]),
        "KILL" => kill(conn, &args[2..]),
        other => unreachable!("CLIENT {other} is not in SUBCOMMANDS"),
    }
    .into()
}

/// A connection's line in CLIENT LIST (`me`: the asking connection, whose
/// transaction is known, running `current`).
fn line(c: &Client, me: Option<(&Conn, &str)>) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let age = c.since.elapsed();
    let idle = age.as_millis().saturating_sub(c.last_ms.load(Relaxed) as u128) / 1000;
    let cmd = match c.cmd.load(Relaxed) {
        _ if me.is_some() => me.map_or_else(String::new, |(_, current)| current.to_string()),
        0 => "NULL".to_string(),
        row => super::rows().find(|(r, _)| r.0 == row - 1).map_or_else(|| "NULL".into(), |(_, name)| name),
    };
    let multi = me.and_then(|(m, _)| m.multi.as_ref()).map_or(-1, |m| m.queued.len() as i64);
    format!(
        "id={} addr={} laddr={} fd={} name={} age={} idle={idle} flags={} db=0 sub=0 psub=0 ssub=0 multi={multi} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={cmd} user=default redir=-1 resp={}\n",
        c.id,
        c.addr,
        c.laddr,
        c.fd,
        c.name.lock().as_deref().unwrap_or(""),
        age.as_secs(),
        if multi >= 0 { "x" } else { "N" },
        c.resp.load(Relaxed),
    )
}

fn list(conn: &Conn, args: &[Bytes]) -> Frame {
    let mut ids: Option<Vec<u64>> = None;
    let mut normal = true;
    match args.first().map(|a| a.to_ascii_uppercase()).as_deref() {
        None => {}
        Some(b"TYPE") if args.len() == 2 => match args[1].to_ascii_lowercase().as_slice() {
            b"normal" => {}
            b"master" | b"replica" | b"slave" | b"pubsub" => normal = false,
            other => return Frame::error(format!("ERR Unknown client type '{}'", String::from_utf8_lossy(other))),
        },
        Some(b"ID") if args.len() >= 2 => {
            let parsed: Option<Vec<u64>> =
                args[1..].iter().map(|a| std::str::from_utf8(a).ok()?.parse().ok().filter(|&id| id > 0)).collect();
            match parsed {
                Some(p) => ids = Some(p),
                None => return Frame::error("ERR Invalid client ID"),
            }
        }
        _ => return Frame::error("ERR syntax error"),
    }
    let clients: Vec<Arc<Client>> = conn.server.clients.lock().values().cloned().collect();
    let text: String = clients
        .iter()
        .filter(|c| normal && ids.as_ref().is_none_or(|ids| ids.contains(&c.id)))
        .map(|c| line(c, (c.id == conn.client.id).then_some((conn, "client|list"))))
        .collect();
    Frame::Bulk(Bytes::from(text))
}

fn kill(conn: &Conn, args: &[Bytes]) -> Frame {
    let text = |a: &Bytes| String::from_utf8_lossy(a).into_owned();
    let clients: Vec<Arc<Client>> = conn.server.clients.lock().values().cloned().collect();
    if args.len() == 1 {
        // The old form: one address, +OK or an error.
        let addr = text(&args[0]);
        return match clients.iter().find(|c| c.addr == addr) {
            Some(c) => {
                c.kill.notify_one();
                Frame::ok()
            }
            None => Frame::error("ERR No such client"),
        };
    }
    if !args.len().is_multiple_of(2) {
        return Frame::error("ERR syntax error");
    }
    let (mut id, mut addr, mut laddr, mut skip_me, mut none) = (None, None, None, true, false);
    for filter in args.chunks(2) {
        match filter[0].to_ascii_uppercase().as_slice() {
            b"ID" => match text(&filter[1]).parse::<u64>() {
                Ok(n) if n > 0 => id = Some(n),
                _ => return Frame::error("ERR client-id should be greater than 0"),
            },
            b"ADDR" => addr = Some(text(&filter[1])),
            b"LADDR" => laddr = Some(text(&filter[1])),
            // Every connection is a normal one of the default user.
            b"TYPE" => match filter[1].to_ascii_lowercase().as_slice() {
                b"normal" => {}
                b"master" | b"replica" | b"slave" | b"pubsub" => none = true,
                other => return Frame::error(format!("ERR Unknown client type '{}'", String::from_utf8_lossy(other))),
            },
            b"USER" => none |= filter[1].as_ref() != b"default",
            b"SKIPME" => match filter[1].to_ascii_lowercase().as_slice() {
                b"yes" => skip_me = true,
                b"no" => skip_me = false,
                _ => return Frame::error("ERR syntax error"),
            },
            _ => return Frame::error("ERR syntax error"),
        }
    }
    let mut killed = 0;
    for c in &clients {
        let chosen = !none
            && id.is_none_or(|id| c.id == id)
            && addr.as_ref().is_none_or(|a| &c.addr == a)
            && laddr.as_ref().is_none_or(|a| &c.laddr == a)
            && !(skip_me && c.id == conn.client.id);
        if chosen {
            c.kill.notify_one();
            killed += 1;
        }
    }
    Frame::Integer(killed)
}
