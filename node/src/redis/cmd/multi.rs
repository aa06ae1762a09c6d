//! MULTI, EXEC, DISCARD, WATCH key [key ...], UNWATCH
//!
//! MULTI starts queueing the connection's data commands (each answers
//! `+QUEUED`; one whose arguments are wrong is queued too and its error
//! comes back in EXEC's array, as in Redis); EXEC runs them all, in order,
//! on the connection's session, and answers an array of their replies;
//! DISCARD drops them. An unknown command or a wrong arity while queueing
//! is answered at once and makes EXEC refuse the whole transaction
//! (`EXECABORT Transaction discarded because of previous errors.`).
//!
//! Not as in Redis: the commands are not isolated from other clients'
//! (each key is its own write, as MSET's: a reader may see some of them
//! before the others, and a node lost midway may leave some done), and
//! only data commands may be queued (`ERR ... inside MULTI is not
//! supported`, which also aborts). Clients that use MULTI to send
//! commands together (redis-py's default pipeline) get what they expect:
//! nothing runs before EXEC, and each reply in its place. WATCH is refused
//! (no optimistic transactions yet); UNWATCH has nothing to undo.
//! Errors as Redis's: `ERR MULTI calls can not be nested`, `ERR EXEC
//! without MULTI`, `ERR DISCARD without MULTI`, `ERR WATCH inside MULTI is
//! not allowed`.

use super::{Batch, Outcome};
use crate::redis::conn::{Answer, Conn, Multi};
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn multi(conn: &mut Conn, _: Vec<Bytes>) -> Outcome {
    if conn.multi.is_some() {
        return Frame::error("ERR MULTI calls can not be nested").into();
    }
    conn.multi = Some(Multi::default());
    Frame::ok().into()
}

pub async fn exec(conn: &mut Conn, _: Vec<Bytes>) -> Outcome {
    let Some(multi) = conn.multi.take() else {
        return Frame::error("ERR EXEC without MULTI").into();
    };
    if multi.failed {
        return Frame::error("EXECABORT Transaction discarded because of previous errors.").into();
    }
    let mut requests = smallvec::SmallVec::new();
    let mut parts = Vec::with_capacity(multi.queued.len());
    for queued in multi.queued {
        match queued {
            Ok(batch) => {
                parts.push((batch.requests.len(), Ok(batch.answer)));
                requests.extend(batch.requests);
            }
            Err(error) => parts.push((0, Err(error))),
        }
    }
    Outcome::Queue(Batch { requests, level: None, answer: Answer::Exec(parts) })
}

pub async fn discard(conn: &mut Conn, _: Vec<Bytes>) -> Outcome {
    match conn.multi.take() {
        Some(_) => Frame::ok(),
        None => Frame::error("ERR DISCARD without MULTI"),
    }
    .into()
}

pub async fn watch(conn: &mut Conn, _: Vec<Bytes>) -> Outcome {
    match conn.multi {
        Some(_) => Frame::error("ERR WATCH inside MULTI is not allowed"),
        None => Frame::error("ERR WATCH is not supported: Causeway has no optimistic transactions yet"),
    }
    .into()
}

/// Nothing to undo; queued inside MULTI, as in Redis.
pub fn unwatch(_: &[Bytes], _: crate::runtime::Clock) -> Result<Batch, Frame> {
    Batch::new(smallvec::SmallVec::new(), |_, _| Frame::ok())
}
