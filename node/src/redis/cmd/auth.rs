//! AUTH [username] password
//!
//! Only the `default` user exists. Replies `+OK`, `WRONGPASS ...` for a
//! wrong password or another user, an error when no password is configured
//! (as Redis), and `ERR syntax error` for more arguments.

use super::{syntax_error, Outcome};
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let password = match args.len() {
        2 => &args[1],
        // Without requirepass the default user has no password and any
        // password logs in, as in Redis.
        3 if args[1].as_ref() == b"default" && conn.node.config().requirepass.is_none() => return Frame::ok().into(),
        3 if args[1].as_ref() == b"default" => &args[2],
        3 => return Frame::error("WRONGPASS invalid username-password pair or user is disabled.").into(),
        _ => return syntax_error().into(),
    };
    check_password(conn, password).unwrap_or_else(Frame::ok).into()
}

/// Logs the connection in if `password` is the configured one, else the
/// error to reply (AUTH and HELLO ... AUTH share it).
pub fn check_password(conn: &mut Conn, password: &[u8]) -> Option<Frame> {
    match &conn.node.config().requirepass {
        None => Some(Frame::error(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        )),
        Some(p) if p.as_bytes() == password => {
            conn.authed = true;
            None
        }
        Some(_) => Some(Frame::error("WRONGPASS invalid username-password pair or user is disabled.")),
    }
}
