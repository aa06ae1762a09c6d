//! FLUSHALL [ASYNC | SYNC] (and FLUSHDB, the same: there is one database)
//!
//! Drops every key on every node and replies `+OK`. Meant for tests: it is
//! not ordered with concurrent writes. Any other option, or more than one:
//! `ERR syntax error`.

use super::{only, syntax_error, upper, Batch};
use crate::redis::conn::client_error;
use crate::runtime::Clock;
use bytes::Bytes;
use causeway_core::driver::Request;
use causeway_resp::Frame;

/// ASYNC and SYNC are accepted, as clients send them, and do the same.
pub fn parse(args: &[Bytes], _: Clock) -> Result<Batch, Frame> {
    if args.len() > 2 || args.get(1).is_some_and(|a| !matches!(upper(a).as_str(), "ASYNC" | "SYNC")) {
        return Err(syntax_error());
    }
    Batch::new(smallvec::smallvec![Request::Flush], |_, responses| match only(responses) {
        Ok(_) => Frame::ok(),
        Err(e) => client_error(e),
    })
}

#[cfg(test)]
mod tests {
    use crate::redis::cmd::{requests, syntax_error};
    use causeway_core::driver::Request;

    #[test]
    fn async_and_sync_are_the_only_options() {
        for words in [&["FLUSHALL"][..], &["FLUSHALL", "async"], &["FLUSHDB", "SYNC"]] {
            assert_eq!(requests(words), Ok(vec![Request::Flush]), "{words:?}");
        }
        assert_eq!(requests(&["FLUSHALL", "LAZY"]), Err(syntax_error()));
        assert_eq!(requests(&["FLUSHALL", "ASYNC", "SYNC"]), Err(syntax_error()));
    }
}
