//! CW.SESSION EXPORT | RESUME token | RESET | INFO
//!
//! Carries a session's causal metadata to another connection or node:
//! EXPORT replies with a hex token, RESUME takes one (`ERR invalid session
//! token: ...` if it is not one), RESET starts afresh, INFO shows how much
//! the session tracks. Another subcommand or argument count:
//! `ERR syntax error`.

use crate::redis::cmd::{syntax_error, upper, Outcome};
use crate::redis::conn::client_error;
use crate::redis::conn::Conn;
use bytes::Bytes;
use causeway_core::driver::Request;
use causeway_core::session::Session;
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    match (upper(&args[1]).as_str(), args.len()) {
        ("EXPORT", 2) => Frame::Bulk(Bytes::from(hex(&conn.driver.session().export()))),
        ("RESUME", 3) => match unhex(&args[2])
            .ok_or(causeway_core::error::Error::InvalidInput("invalid session token: not hex".into()))
            .and_then(|b| Session::import(&b, conn.server.clock.now_ms()))
        {
            // From another site: waits until this one has what the session
            // saw there (ChainReaction §3.4.2's remote read), in the driver.
            Ok(s) => match conn.run(Request::Resume(Box::new(s))).await {
                Ok(_) => Frame::ok(),
                Err(e) => client_error(e),
            },
            Err(e) => Frame::error(format!("ERR {e}")),
        },
        ("RESET", 2) => {
            conn.driver.set_session(Session::default());
            Frame::ok()
        }
        ("INFO", 2) => {
            let s = conn.driver.session();
            Frame::Bulk(Bytes::from(format!("tracked_keys:{}\r\nmax_ts:{}\r\n", s.tracked_keys(), s.max_ts())))
        }
        _ => syntax_error(),
    }
    .into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2).map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::{hex, unhex};

    #[test]
    fn a_token_is_lowercase_hex_and_reads_back() {
        let bytes = [0x00, 0x7f, 0xab, 0xff];
        assert_eq!(hex(&bytes), "007fabff");
        assert_eq!(unhex(b"007fabff").as_deref(), Some(&bytes[..]));
        assert_eq!(unhex(b"007FABFF").as_deref(), Some(&bytes[..]));
    }

    #[test]
    fn odd_length_or_non_hex_is_not_a_token() {
        assert_eq!(unhex(b"abc"), None);
        assert_eq!(unhex(b"zz"), None);
    }
}
