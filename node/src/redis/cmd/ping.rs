//! PING [message]
//!
//! Replies `+PONG`, or the message as a bulk string. More than one argument:
//! the arity error, as Redis answers it.

use super::{wrong_arity, Outcome};
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(_conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match args.len() {
        1 => Frame::Simple("PONG".into()),
        2 => Frame::Bulk(args[1].clone()),
        _ => wrong_arity("ping"),
    }
    .into()
}
