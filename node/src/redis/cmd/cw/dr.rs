//! CW.DR STATUS | MISSING [cursor] [COUNT n] | FAILOVER [FORCE]
//!
//! Identifier-first disaster recovery (`causeway_core::geo::dr`), for
//! operators of a primary site and its backup (`--dr PRIMARY=BACKUP`):
//!
//! * STATUS: `field:value` lines: this site's role, the pair, the backlog
//!   this node keeps as a stabilizer replica of the backup (writes noted
//!   whose value has not arrived: `unfinished_keys`, `unfinished_bytes` of
//!   their keys and values, `unfinished_oldest_ms` since the oldest was
//!   written), whether it holds every note its replica acknowledged
//!   (`notes_whole`: 0 while a replica restarted without its log catches
//!   up from the others; a failover counts only whole replicas),
//!   `failing_over` (it answered a failover not over yet: it notes nothing
//!   more; a node that answered runs it again after a few seconds if its
//!   runner is gone), `asking_failover` (it serves no client until the
//!   others told it whether the site failed over), writes it noted while
//!   leading, and after a failover the keys it refuses.
//! * MISSING: after a failover, the refused keys (their last acknowledged
//!   write never arrived), as SCAN pages: the next cursor (`0` at the end)
//!   and `key`, `write` pairs, the write as `ts@site`; at most COUNT (100)
//!   keys a page. This is the manifest of what the primary's loss cost.
//!   Keys written since are left out, as far as this node's replicas tell
//!   (a key of a partition it holds no replica of stays listed).
//! * FAILOVER: at the backup, fail over from the primary: once every node
//!   of the site refuses the keys whose value never arrived (`-LOST`),
//!   replies their number. A plain SET or DEL of such a key clears it.
//!   It needs a majority of the site's stabilizer replicas whose notes are
//!   whole; FORCE fails over without (if two replicas lost their notes
//!   together, what only they held is then served older, not refused).
//!
//! Without a pair: `ERR this site is in no disaster-recovery pair`.

use crate::redis::cmd::{syntax_error, upper, Outcome};
use crate::redis::conn::{client_error, Conn};
use bytes::Bytes;
use causeway_core::driver::{Request, Response};
use causeway_resp::Frame;

pub async fn run(conn: &mut Conn, args: Vec<Bytes>) -> Outcome {
    let Some(pair) = conn.node.config().dr else {
        return Frame::error("ERR this site is in no disaster-recovery pair (start the nodes with --dr PRIMARY=BACKUP)").into();
    };
    let site = conn.node.config().site;
    match upper(&args[1]).as_str() {
        "STATUS" if args.len() == 2 => {
            let now = conn.server.clock.now_ms();
            let status = conn.node.status().geo.and_then(|g| g.dr);
            let mut lines = vec![
                format!("role:{}", if site == pair.primary { "primary" } else { "backup" }),
                format!("primary:{}", pair.primary),
                format!("backup:{}", pair.backup),
            ];
            if let Some(s) = status {
                lines.push(format!("unfinished_keys:{}", s.unfinished));
                lines.push(format!("unfinished_bytes:{}", s.unfinished_bytes));
                let oldest = s.oldest.map_or(0, |ts| now.saturating_sub(ts.physical_ms()));
                lines.push(format!("unfinished_oldest_ms:{oldest}"));
                lines.push(format!("notes_whole:{}", u8::from(s.whole)));
                lines.push(format!("failing_over:{}", u8::from(s.failing_over)));
                lines.push(format!("asking_failover:{}", u8::from(s.asking)));
                lines.push(format!("noted:{}", s.noted));
                lines.push(format!("failed_over:{}", u8::from(s.lost.is_some())));
                lines.push(format!("lost_keys:{}", s.lost.unwrap_or(0)));
            }
            let text: String = lines.into_iter().map(|l| l + "\r\n").collect();
            Frame::Bulk(Bytes::from(text)).into()
        }
        "MISSING" => {
            let (cursor, rest) = match args.get(2) {
                Some(c) if !c.eq_ignore_ascii_case(b"count") => (if c.as_ref() == b"0" { Bytes::new() } else { c.clone() }, &args[3..]),
                _ => (Bytes::new(), &args[2..]),
            };
            let count = match rest {
                [] => 100,
                [word, n] if word.eq_ignore_ascii_case(b"count") => match std::str::from_utf8(n).ok().and_then(|n| n.parse::<usize>().ok())
                {
                    Some(n) if n > 0 => n,
                    _ => return Frame::error("ERR value is not an integer or out of range").into(),
                },
                _ => return syntax_error().into(),
            };
            let (page, next) = conn.node.dr_missing(&cursor, count);
            let mut items = Vec::with_capacity(page.len() * 2);
            for (key, write) in page {
                items.push(Frame::Bulk(key));
                items.push(Frame::Bulk(Bytes::from(write.to_string())));
            }
            Frame::Array(vec![Frame::Bulk(next.unwrap_or_else(|| Bytes::from_static(b"0"))), Frame::Array(items)]).into()
        }
        "FAILOVER" if args.len() == 2 || (args.len() == 3 && args[2].eq_ignore_ascii_case(b"force")) => {
            if site != pair.backup {
                return Frame::error(format!("ERR site {site} is the primary; fail over at the backup, site {}", pair.backup)).into();
            }
            match conn.run(Request::Failover { force: args.len() == 3 }).await {
                Ok(Response::FailedOver(lost)) => Frame::Integer(lost as i64).into(),
                Ok(other) => Frame::error(format!("ERR unexpected answer {other:?}")).into(),
                Err(causeway_core::error::Error::Timeout) => Frame::error(
                    "ERR the failover has not finished: it needs every node of this site, and a majority of its stabilizer replicas \
                     holding whole notes (CW.DR STATUS on each: notes_whole:1); run FAILOVER again to wait for it, or FAILOVER FORCE \
                     to go without (keys only replicas that lost their notes knew of may then be served older)",
                )
                .into(),
                Err(e) => client_error(e).into(),
            }
        }
        _ => syntax_error().into(),
    }
}
