//! WAIT numreplicas timeout
//!
//! Redis counts the replicas that have the connection's writes. Every
//! acknowledged write of a chain is on k of its R nodes already: WAIT
//! waits until the session's writes (and the unstable versions it read)
//! are stable, on all R, and answers R - 1; if that takes longer than the
//! request timeout (a replica down until the chain is repaired), k - 1.
//! The timeout argument is checked as Redis checks it but not waited on
//! apart (the wait is that of any request). A coded site's committed
//! writes are on M + 1 nodes: it answers M at once.

use super::Outcome;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let (Ok(_), Ok(timeout)) = (super::integer(&args[1]), super::integer(&args[2])) else {
        return Frame::error("ERR value is not an integer or out of range").into();
    };
    if timeout < 0 {
        return Frame::error("ERR timeout is negative").into();
    }
    let shape = conn.node.topology().shape;
    if let Some(coding) = shape.coding {
        return Frame::Integer(coding.parity as i64).into();
    }
    match conn.run(Request::Stabilize).await {
        Ok(Response::Stabilized) => Frame::Integer(shape.replicas as i64 - 1),
        _ => Frame::Integer(shape.k as i64 - 1),
    }
    .into()
}
