//! HELLO [protover [AUTH username password] [SETNAME clientname]]
//!
//! Switches the connection to RESP2 or RESP3 and replies with a map about
//! the server. A version other than 2 or 3 is `NOPROTO ...`; an unknown
//! option or one missing its arguments is `ERR syntax error`; an
//! unauthenticated connection without AUTH gets `NOAUTH ...`.

use super::auth::check_password;
use super::{syntax_error, upper, Outcome};
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::{Frame, Protocol};

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let mut proto = conn.proto;
    if let Some(v) = args.get(1) {
        proto = match v.as_ref() {
            b"2" => Protocol::Resp2,
            b"3" => Protocol::Resp3,
            v if std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()).is_none() => {
                return Frame::error("ERR Protocol version is not an integer or out of range").into()
            }
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
                if conn.node.config().requirepass.is_some() {
                    if let Some(err) = check_password(conn, &args[i + 2]) {
                        return err.into();
                    }
                }
                i += 3;
            }
            "SETNAME" if i + 1 < args.len() => {
                if let Err(e) = super::client::set_name(conn, &args[i + 1]) {
                    return e.into();
                }
                i += 2;
            }
            _ => return syntax_error().into(),
        }
    }
    if !conn.authed {
        return Frame::error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time").into();
    }
    conn.proto = proto;
    conn.client.resp.store(if proto == causeway_resp::Protocol::Resp3 { 3 } else { 2 }, std::sync::atomic::Ordering::Relaxed);
    let s = |x: &str| Frame::Bulk(Bytes::from(x.to_string()));
    Frame::Map(vec![
        (s("server"), s("causeway")),
        (s("version"), s(env!("CARGO_PKG_VERSION"))),
        (s("proto"), Frame::Integer(if proto == Protocol::Resp3 { 3 } else { 2 })),
        (s("id"), Frame::Integer((conn.id() & 0xFFFF_FFFF_FFFF) as i64)),
        // Every node serves every key (it passes requests on inside the
        // site): to a Redis client this is one server, not a Redis Cluster
        // (whose clients would ask for CLUSTER SLOTS, which is not spoken).
        (s("mode"), s("standalone")),
        (s("role"), s("master")),
        (s("modules"), Frame::Array(Vec::new())),
    ])
    .into()
}
