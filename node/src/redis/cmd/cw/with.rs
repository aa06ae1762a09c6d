//! CW.WITH level command [args ...]
//!
//! Runs one data command (GET, SET, DEL, EXISTS, MGET) at `level`, leaving
//! the connection's level as it was; the session's causal metadata carries
//! over. Replies as the inner command does. An unknown level is
//! `ERR unknown consistency ...`; another inner command is
//! `ERR CW.WITH runs GET, SET, DEL, EXISTS or MGET, not '...'`; the inner
//! command's own arity and syntax errors come back unchanged.

use crate::redis::cmd::{check_arity, lookup, Batch, Handler};
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::Consistency;
use causeway_resp::Frame;

/// The inner command's requests, marked with `level`.
pub fn parse(args: &[Bytes], clock: Clock) -> Result<Batch, Frame> {
    let level = String::from_utf8_lossy(&args[1]).parse::<Consistency>().map_err(|e| Frame::error(format!("ERR {e}")))?;
    let inner = &args[2..];
    let Some(cmd) = lookup(&inner[0]).filter(|c| ["get", "set", "del", "exists", "mget"].contains(&c.name)) else {
        return Err(Frame::error(format!("ERR CW.WITH runs GET, SET, DEL, EXISTS or MGET, not '{}'", String::from_utf8_lossy(&inner[0]))));
    };
    let Handler::Queue(parse) = cmd.handler else { unreachable!("data commands are queued") };
    check_arity(cmd, inner)?;
    Ok(Batch { level: Some(level), ..parse(inner, clock)? })
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{queue, requests, syntax_error, wrong_arity};
    use bytes::Bytes;
    use causeway_core::driver::{Consistency, Request};
    use causeway_resp::Frame;

    #[test]
    fn runs_the_inner_command_at_the_level() {
        let batch = queue(&["CW.WITH", "Eventual", "GET", "k"]).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(batch.level, Some(Consistency::Eventual));
        assert_eq!(batch.requests[..], [Request::Get(Bytes::from("k"))]);
    }

    #[test]
    fn needs_a_level_and_a_command() {
        assert_eq!(requests(&["CW.WITH", "causal"]), Err(wrong_arity("cw.with")));
    }

    #[test]
    fn an_unknown_level_is_refused() {
        let error = "ERR unknown consistency 'strong' (expected causal, eventual or linearizable)";
        assert_eq!(requests(&["CW.WITH", "strong", "GET", "k"]), Err(Frame::error(error)));
    }

    #[test]
    fn only_data_commands_run_inside() {
        let error = "ERR CW.WITH runs GET, SET, DEL, EXISTS or MGET, not 'ping'";
        assert_eq!(requests(&["CW.WITH", "causal", "ping"]), Err(Frame::error(error)));
        // DBSIZE is a data command too, but not one CW.WITH runs.
        let error = "ERR CW.WITH runs GET, SET, DEL, EXISTS or MGET, not 'DBSIZE'";
        assert_eq!(requests(&["CW.WITH", "causal", "DBSIZE"]), Err(Frame::error(error)));
    }

    #[test]
    fn the_inner_commands_errors_come_back_unchanged() {
        assert_eq!(requests(&["CW.WITH", "linearizable", "GET"]), Err(wrong_arity("get")));
        assert_eq!(requests(&["CW.WITH", "linearizable", "SET", "k", "v", "NX", "XX"]), Err(syntax_error()));
    }
}
