//! CW.WITH level command [args ...]
//!
//! Runs one data command (GET, SET, DEL, EXISTS, MGET) at `level`, leaving
//! the connection's level as it was; the session's causal metadata carries
//! over. Replies as the inner command does. An unknown level is
//! `ERR unknown consistency ...`; another inner command is
//! `ERR CW.WITH runs GET, SET, DEL, EXISTS or MGET, not '...'`; the inner
//! command's own arity and syntax errors come back unchanged.

use crate::cmd::{check_arity, lookup, Batch, Handler};
use bytes::Bytes;
use causeway_core::driver::Consistency;
use causeway_resp::Frame;

/// The inner command's requests, marked with `level`.
pub fn parse(args: &[Bytes]) -> Result<Batch, Frame> {
    let level = String::from_utf8_lossy(&args[1]).parse::<Consistency>().map_err(|e| Frame::error(format!("ERR {e}")))?;
    let inner = &args[2..];
    let Some(cmd) = lookup(&inner[0]).filter(|c| ["get", "set", "del", "exists", "mget"].contains(&c.name)) else {
        return Err(Frame::error(format!("ERR CW.WITH runs GET, SET, DEL, EXISTS or MGET, not '{}'", String::from_utf8_lossy(&inner[0]))));
    };
    let Handler::Queue(parse) = cmd.handler else { unreachable!("data commands are queued") };
    check_arity(cmd, inner)?;
    Ok(Batch { level: Some(level), ..parse(inner)? })
}
