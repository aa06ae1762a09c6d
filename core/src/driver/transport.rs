//! The one loop every shell runs around its `Driver`: what a step asks for
//! (messages to send, a recheck of the site) is done through the shell's
//! `Transport`, and what that gives back (replies a node had at once, nodes
//! that could not be reached, a newer partition map) goes to the driver in
//! turn, until nothing is left. The Redis front end, the native client and
//! the simulator each implement `Transport`, so the paths a failure takes
//! (recheck, unreachable, undeliverable) are the same code everywhere.

use super::{Driver, Progress, Response, Sends};
use crate::error::Error;
use crate::message::Message;
use crate::ring::{NodeId, Topology};
use std::sync::Arc;

/// What a shell does for its driver.
pub trait Transport {
    /// Sends each message to its node, in order. A node the shell cannot
    /// send to now (no connection) goes to `undeliverable`; a reply the
    /// shell has at once (a node serving its own connections in place)
    /// goes to `replies`.
    fn send(&mut self, batch: Sends, replies: &mut Vec<Message>, undeliverable: &mut Vec<NodeId>);

    /// A recheck (`Progress::recheck`): the freshest partition map the
    /// shell has at hand, if any (a shell that must ask a node asks here,
    /// and the answer comes back as a reply), and the nodes it knows are
    /// down.
    fn recheck(&mut self) -> (Option<Arc<Topology>>, Vec<NodeId>);
}

impl Driver {
    /// Does what `p` asks through `transport`, and what that brings, until
    /// nothing is left; the responses go to `done` in the order their
    /// requests were started. A node found undeliverable is reported once
    /// per call.
    pub fn pump(&mut self, p: Progress, now_ms: u64, transport: &mut impl Transport, done: &mut impl Extend<Result<Response, Error>>) {
        let mut p = p;
        let mut reported: Vec<NodeId> = Vec::new();
        // Kept between calls: a reply in place is the common case.
        let (mut replies, mut undeliverable) = (std::mem::take(&mut self.replies), Vec::new());
        loop {
            done.extend(p.done.drain(..));
            let mut next = Progress::default();
            if p.recheck {
                let (topology, down) = transport.recheck();
                if let Some(topology) = topology {
                    merge(&mut next, self.reconfigured(topology, now_ms));
                }
                for node in down {
                    merge(&mut next, self.unreachable(node, now_ms));
                }
            }
            if !p.send.is_empty() {
                transport.send(std::mem::take(&mut p.send), &mut replies, &mut undeliverable);
                for node in undeliverable.drain(..) {
                    if !reported.contains(&node) {
                        reported.push(node);
                        merge(&mut next, self.undeliverable(node, now_ms));
                    }
                }
                for msg in replies.drain(..) {
                    merge(&mut next, self.on_message(msg, now_ms));
                }
            }
            if next.send.is_empty() && next.done.is_empty() && !next.recheck {
                self.replies = replies;
                return;
            }
            p = next;
        }
    }
}

/// Adds `p` to `into`, keeping the order of the responses (the driver's
/// calls were made in that order).
fn merge(into: &mut Progress, p: Progress) {
    if into.send.is_empty() {
        into.send = p.send;
    } else {
        into.send.extend(p.send);
    }
    if into.done.is_empty() {
        into.done = p.done;
    } else {
        into.done.extend(p.done);
    }
    into.recheck |= p.recheck;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{Request, RECHECK_MS};
    use crate::message::Item;
    use crate::ring::{NodeInfo, Shape};
    use bytes::Bytes;

    /// A site of three nodes: `refused` cannot be reached; the others
    /// answer reads in place if `answering`, else take messages and say
    /// nothing; a recheck reports `down`.
    struct Scripted {
        refused: Option<NodeId>,
        answering: bool,
        down: Vec<NodeId>,
        sent: Vec<NodeId>,
        rechecks: usize,
    }

    impl Transport for Scripted {
        fn send(&mut self, batch: Sends, replies: &mut Vec<Message>, undeliverable: &mut Vec<NodeId>) {
            for (node, msg) in batch {
                if Some(node) == self.refused {
                    undeliverable.push(node);
                    continue;
                }
                self.sent.push(node);
                if let (true, Message::Get { op, .. }) = (self.answering, msg) {
                    let item = Item { value: Some(Bytes::from("v")), version: None, seq: 0, stable: true, expires_at_ms: None };
                    replies.push(Message::Value { op, item: Box::new(item), chain_index: 2, stable_through: 0 });
                }
            }
        }

        fn recheck(&mut self) -> (Option<Arc<Topology>>, Vec<NodeId>) {
            self.rechecks += 1;
            (None, self.down.clone())
        }
    }

    fn site() -> Arc<Topology> {
        let nodes = (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect();
        Arc::new(Topology::new(1, Shape { partitions: 4, replicas: 3, k: 2, coding: None }, nodes).unwrap())
    }

    /// A read sent to a node that cannot be reached goes to another
    /// replica in the same call, and a reply given in place completes it.
    #[test]
    fn an_undeliverable_read_goes_elsewhere_and_a_reply_in_place_completes_it() {
        let mut d = Driver::new(7, site(), None, 5_000);
        let p = d.start(Request::Get(Bytes::from("k")), 0);
        let first = p.send[0].0;
        let mut t = Scripted { refused: Some(first), answering: true, down: Vec::new(), sent: Vec::new(), rechecks: 0 };
        let mut done = Vec::new();
        d.pump(p, 0, &mut t, &mut done);
        assert_eq!(t.sent.len(), 1, "sent once, elsewhere: {:?}", t.sent);
        assert_ne!(t.sent[0], first);
        assert_eq!(done.len(), 1, "answered in place: {done:?}");
        assert!(matches!(done[0], Ok(Response::Read { .. })));
    }

    /// A read left waiting on a node that says nothing: after `RECHECK_MS`
    /// the tick asks for a recheck, the shell reports the node down, and
    /// the read moves to another replica.
    #[test]
    fn a_recheck_reports_down_nodes_and_the_read_moves() {
        let mut d = Driver::new(7, site(), None, 5_000);
        let mut t = Scripted { refused: None, answering: false, down: Vec::new(), sent: Vec::new(), rechecks: 0 };
        let mut done = Vec::new();
        let p = d.start(Request::Get(Bytes::from("k")), 0);
        d.pump(p, 0, &mut t, &mut done);
        let first = t.sent[0];
        t.down = vec![first];
        let p = d.tick(RECHECK_MS);
        assert!(p.recheck);
        d.pump(p, RECHECK_MS, &mut t, &mut done);
        assert_eq!(t.rechecks, 1);
        assert_eq!(t.sent.len(), 2, "sent again: {:?}", t.sent);
        assert_ne!(t.sent[1], first, "to another replica");
        assert!(done.is_empty());
    }
}
