//! Data commands. Each becomes one or more `Request`s on the connection's
//! session, so every one of them keeps the session causal+.

use super::{syntax_error, upper, Outcome};
use crate::conn::{client_error, Conn};
use crate::server::now_ms;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_core::message::Condition;
use causeway_resp::Frame;

/// Keys and values are kept in their own allocation: arguments are slices
/// of the connection's read buffer, and keeping one would keep the buffer.
fn own(b: &Bytes) -> Bytes {
    Bytes::copy_from_slice(b)
}

/// GET key
pub async fn get(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let node = conn.node.clone();
    let stats = &node.stats;
    let frame = match conn.run(Request::Get(own(&args[1]))).await {
        Ok(Response::Read { value: Some(v), .. }) => {
            stats.keyspace_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Frame::Bulk(v)
        }
        Ok(_) => {
            stats.keyspace_misses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Frame::Null
        }
        Err(e) => client_error(e),
    };
    frame.into()
}

/// SET key value [NX | XX] [EX seconds | PX milliseconds]
pub async fn set(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let mut condition = Condition::Always;
    let mut ttl_ms = None;
    let mut unit = None;
    let mut i = 3;
    // Like Redis: a flag may repeat, conflicting flags (NX with XX, EX with
    // PX) are a syntax error.
    while i < args.len() {
        let opt = upper(&args[i]);
        match opt.as_str() {
            "NX" if condition != Condition::IfPresent => condition = Condition::IfAbsent,
            "XX" if condition != Condition::IfAbsent => condition = Condition::IfPresent,
            "EX" | "PX" if unit.as_ref().is_none_or(|u| *u == opt) && i + 1 < args.len() => {
                let Some(n) = std::str::from_utf8(&args[i + 1]).ok().and_then(|s| s.parse::<i64>().ok()) else {
                    return Frame::error("ERR value is not an integer or out of range").into();
                };
                // The expiry instant must fit, as in Redis.
                let ms = if opt == "EX" { n.checked_mul(1000) } else { Some(n) };
                match ms.filter(|&ms| ms > 0 && ms.checked_add(now_ms() as i64).is_some()) {
                    Some(ms) => ttl_ms = Some(ms as u64),
                    None => return Frame::error("ERR invalid expire time in 'set' command").into(),
                }
                unit = Some(opt);
                i += 1;
            }
            _ => return syntax_error().into(),
        }
        i += 1;
    }
    let request = Request::Put { key: own(&args[1]), value: Some(own(&args[2])), ttl_ms, condition };
    let frame = match conn.run(request).await {
        Ok(Response::Written(true)) => Frame::ok(),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    };
    frame.into()
}

/// DEL key [key ...]: deletes each key that exists (a tombstone written only
/// if the head finds a live value), answering how many did.
pub async fn del(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let mut deleted = 0;
    for key in &args[1..] {
        let request = Request::Put { key: own(key), value: None, ttl_ms: None, condition: Condition::IfPresent };
        match conn.run(request).await {
            Ok(Response::Written(true)) => deleted += 1,
            Ok(_) => {}
            Err(e) => return client_error(e).into(),
        }
    }
    Frame::Integer(deleted).into()
}

/// EXISTS key [key ...]: how many of the keys exist (repeats count again).
pub async fn exists(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let mut found = 0;
    for key in &args[1..] {
        match conn.run(Request::Get(own(key))).await {
            Ok(Response::Read { value: Some(_), .. }) => found += 1,
            Ok(_) => {}
            Err(e) => return client_error(e).into(),
        }
    }
    Frame::Integer(found).into()
}

/// MGET key [key ...]: a get-transaction, so the values form a causally
/// consistent snapshot (ChainReaction §3.5).
pub async fn mget(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let keys = args[1..].iter().map(own).collect();
    let frame = match conn.run(Request::MultiGet(keys)).await {
        Ok(Response::Values(values)) => Frame::Array(values.into_iter().map(|v| v.map_or(Frame::Null, Frame::Bulk)).collect()),
        Ok(other) => unreachable!("MGET answered {other:?}"),
        Err(e) => client_error(e),
    };
    frame.into()
}

/// DBSIZE: live keys in the whole site (counted at each partition's tail).
pub async fn dbsize(conn: &mut Conn, _args: Vec<Bytes>) -> Outcome {
    let frame = match conn.run(Request::Count).await {
        Ok(Response::Count(k)) => Frame::Integer(k.keys as i64),
        Ok(other) => unreachable!("DBSIZE answered {other:?}"),
        Err(e) => client_error(e),
    };
    frame.into()
}

/// FLUSHALL [ASYNC | SYNC] (and FLUSHDB): drops every key on every node.
/// Meant for tests: it is not ordered with concurrent writes.
pub async fn flushall(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    if args.len() > 2 || args.get(1).is_some_and(|a| !matches!(upper(a).as_str(), "ASYNC" | "SYNC")) {
        return syntax_error().into();
    }
    let frame = match conn.run(Request::Flush).await {
        Ok(_) => Frame::ok(),
        Err(e) => client_error(e),
    };
    frame.into()
}
