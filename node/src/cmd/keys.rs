//! Data commands. Each becomes one or more `Request`s on the connection's
//! session, so every one of them keeps the session causal+; the connection
//! queues them (pipelining) and calls the command's answer with the
//! responses, in order.

use super::{syntax_error, upper, Batch, Responses};
use crate::conn::client_error;
use crate::server::now_ms;
use bytes::Bytes;
use causeway_core::driver::{ClientError, Request, Response};
use causeway_core::message::Condition;
use causeway_resp::Frame;
use std::sync::atomic::Ordering::Relaxed;

/// Keys and values are kept in their own allocation: arguments are slices
/// of the connection's read buffer, and keeping one would keep the buffer.
fn own(b: &Bytes) -> Bytes {
    Bytes::copy_from_slice(b)
}

/// The one response of a single-request command.
fn only(mut responses: Responses) -> Result<Response, ClientError> {
    responses.next().expect("one request, one response")
}

/// GET key
pub fn get(args: &[Bytes]) -> Result<Batch, Frame> {
    Batch::new(vec![Request::Get(own(&args[1]))], |node, responses| match only(responses) {
        Ok(Response::Read { value: Some(v), .. }) => {
            node.stats.keyspace_hits.fetch_add(1, Relaxed);
            Frame::Bulk(v)
        }
        Ok(_) => {
            node.stats.keyspace_misses.fetch_add(1, Relaxed);
            Frame::Null
        }
        Err(e) => client_error(e),
    })
}

/// SET key value [NX | XX] [EX seconds | PX milliseconds]
pub fn set(args: &[Bytes]) -> Result<Batch, Frame> {
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
                    return Err(Frame::error("ERR value is not an integer or out of range"));
                };
                // The expiry instant must fit, as in Redis.
                let ms = if opt == "EX" { n.checked_mul(1000) } else { Some(n) };
                match ms.filter(|&ms| ms > 0 && ms.checked_add(now_ms() as i64).is_some()) {
                    Some(ms) => ttl_ms = Some(ms as u64),
                    None => return Err(Frame::error("ERR invalid expire time in 'set' command")),
                }
                unit = Some(opt);
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    let request = Request::Put { key: own(&args[1]), value: Some(own(&args[2])), ttl_ms, condition };
    Batch::new(vec![request], |_, responses| match only(responses) {
        Ok(Response::Written(true)) => Frame::ok(),
        Ok(_) => Frame::Null,
        Err(e) => client_error(e),
    })
}

/// DEL key [key ...]: deletes each key that exists (a tombstone written only
/// if the head finds a live value), answering how many did, or the first
/// error (the other keys are still tried).
pub fn del(args: &[Bytes]) -> Result<Batch, Frame> {
    let requests = args[1..].iter().map(|key| Request::Put { key: own(key), value: None, ttl_ms: None, condition: Condition::IfPresent });
    Batch::new(requests.collect(), |_, responses| count(responses, |r| matches!(r, Response::Written(true))))
}

/// EXISTS key [key ...]: how many of the keys exist (repeats count again).
pub fn exists(args: &[Bytes]) -> Result<Batch, Frame> {
    let requests = args[1..].iter().map(|key| Request::Get(own(key)));
    Batch::new(requests.collect(), |_, responses| count(responses, |r| matches!(r, Response::Read { value: Some(_), .. })))
}

/// How many responses `hit`, or the first error.
fn count(responses: Responses, hit: fn(&Response) -> bool) -> Frame {
    let mut n = 0;
    for response in responses {
        match response {
            Ok(r) if hit(&r) => n += 1,
            Ok(_) => {}
            Err(e) => return client_error(e),
        }
    }
    Frame::Integer(n)
}

/// MGET key [key ...]: a get-transaction, so the values form a causally
/// consistent snapshot (ChainReaction §3.5).
pub fn mget(args: &[Bytes]) -> Result<Batch, Frame> {
    let keys = args[1..].iter().map(own).collect();
    Batch::new(vec![Request::MultiGet(keys)], |_, responses| match only(responses) {
        Ok(Response::Values(values)) => Frame::Array(values.into_iter().map(|v| v.map_or(Frame::Null, Frame::Bulk)).collect()),
        Ok(other) => unreachable!("MGET answered {other:?}"),
        Err(e) => client_error(e),
    })
}

/// DBSIZE: live keys in the whole site (counted at each partition's head).
pub fn dbsize(_args: &[Bytes]) -> Result<Batch, Frame> {
    Batch::new(vec![Request::Count], |_, responses| match only(responses) {
        Ok(Response::Count(k)) => Frame::Integer(k.keys as i64),
        Ok(other) => unreachable!("DBSIZE answered {other:?}"),
        Err(e) => client_error(e),
    })
}

/// FLUSHALL [ASYNC | SYNC] (and FLUSHDB): drops every key on every node.
/// Meant for tests: it is not ordered with concurrent writes.
pub fn flushall(args: &[Bytes]) -> Result<Batch, Frame> {
    if args.len() > 2 || args.get(1).is_some_and(|a| !matches!(upper(a).as_str(), "ASYNC" | "SYNC")) {
        return Err(syntax_error());
    }
    Batch::new(vec![Request::Flush], |_, responses| match only(responses) {
        Ok(_) => Frame::ok(),
        Err(e) => client_error(e),
    })
}
