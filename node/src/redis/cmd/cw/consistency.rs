//! CW.CONSISTENCY [causal | eventual | linearizable]
//!
//! Without an argument, replies with this connection's consistency level;
//! with one, sets it and replies `+OK`. An unknown level is
//! `ERR unknown consistency '...' (expected ...)`; more arguments,
//! `ERR syntax error`.

use crate::redis::cmd::{syntax_error, Outcome};
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_core::driver::Consistency;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match args.len() {
        1 => Frame::Simple(conn.driver.consistency().to_string().into()),
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
