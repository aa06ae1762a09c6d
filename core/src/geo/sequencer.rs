//! A site sequencer: the baseline Eunomia is measured against (Eunomia §2's
//! S-Seq, §6/§7.1 and Figure 2).
//!
//! Sequencer-based designs (SwiftCloud, ChainReaction) order a site's
//! updates by asking one service for a site-wide sequence number on every
//! write, before the write is acknowledged: the number is the update's
//! place in the stream shipped to other sites, so dependency checks there
//! are trivial. The price is that the sequencer sits in the critical path
//! of every update of the site, and its throughput bounds the site's.
//! Eunomia keeps the trivial dependency checks but orders updates in the
//! background (`geo::stabilizer`), off the critical path, from batches the
//! partitions send once per tick.
//!
//! Causeway orders writes without it; it exists to measure the stabilizer
//! against what it replaces: the `stabilizer_against_sequencer` benchmark,
//! and a write path with the sequencer in it (`geo::Replication::
//! Sequenced`, where every head waits for a number from the sequencer on
//! its site's stabilizer leader before ordering a write; the stream shipped
//! stays the stabilizer's). Like the other protocol pieces it is a sans-I/O
//! state machine: the caller carries the
//! `SeqRequest`s and `SeqReply`s. It is not fault tolerant (the paper's
//! chain-replicated sequencer, Figure 3, is not modelled).

pub use crate::message::geo::{SeqReply, SeqRequest};

/// One site's sequencer.
#[derive(Debug, Default)]
pub struct Sequencer {
    /// The last number handed out (0: none yet).
    next: u64,
    served: u64,
}

impl Sequencer {
    pub fn new() -> Sequencer {
        Sequencer::default()
    }

    /// Numbers the request: consecutive from 1, one per request.
    pub fn step(&mut self, req: SeqRequest) -> SeqReply {
        self.next += 1;
        self.served += 1;
        SeqReply { partition: req.partition, tag: req.tag, seq: self.next }
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.served
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_consecutive_from_one_across_partitions() {
        let mut s = Sequencer::new();
        let seqs: Vec<u64> = (0..10).map(|i| s.step(SeqRequest { partition: i % 3, tag: 100 + i as u64 }).seq).collect();
        assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
        assert_eq!(s.served(), 10);
    }

    #[test]
    fn a_repeated_request_gets_a_new_number() {
        // The sequencer keeps no memory of requests: asking again (say,
        // after a lost reply) yields another number, never a repeated one.
        let mut s = Sequencer::new();
        let req = SeqRequest { partition: 4, tag: 9 };
        let (a, b) = (s.step(req), s.step(req));
        assert_eq!((a.partition, a.tag), (4, 9));
        assert_eq!((b.partition, b.tag), (4, 9));
        assert_ne!(a.seq, b.seq);
        assert_eq!(s.served(), 2);
    }
}
