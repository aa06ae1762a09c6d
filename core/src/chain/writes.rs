//! Each session's writes a replica applied and the session may still ask
//! about: to apply a resent write once, and for a pipelined write's head to
//! know when the session's previous write is in (`Node`'s parked puts).
//!
//! A write is remembered from when it is applied until its session says it
//! is finished: every write carries `done_below` (`message::Ack`), below
//! which the session waits for nothing more, so a late copy of such a write
//! is dropped and its memory freed. A session that stops writing is
//! forgotten `WRITE_MEMORY_MS` after its last write. So the memory is the
//! writes in flight per session (a pipeline's depth), not one per write.

use crate::message::{ClientId, LastWrite};
use ahash::AHashMap;
use std::collections::VecDeque;

/// How long a replica remembers a session's writes after its last one, to
/// recognise a resend after a failure (well past any request timeout).
pub const WRITE_MEMORY_MS: u64 = 60_000;

/// One session's remembered writes.
#[derive(Debug, Default)]
struct Session {
    /// Writes with smaller ids are finished (the largest `done_below` seen).
    done_below: u64,
    /// By write id, ascending.
    writes: VecDeque<LastWrite>,
}

/// Every session's writes at one replica.
#[derive(Debug, Default)]
pub struct Writes {
    sessions: AHashMap<ClientId, Session>,
    /// When sessions were last pruned by age.
    pruned_ms: u64,
    /// Writes not applied yet that a write parked at this node waits for
    /// (`watch`), with when the watch began.
    watched: AHashMap<(ClientId, u64), u64>,
    /// Watched writes applied since `take_seen`.
    seen: Vec<(ClientId, u64)>,
}

impl Writes {
    /// Whether write `write` of `client` is finished for its session (a
    /// late copy: drop it).
    pub fn finished(&self, client: ClientId, write: u64) -> bool {
        self.sessions.get(&client).is_some_and(|s| write < s.done_below)
    }

    /// Write `write` of `client`, if this replica applied it.
    pub fn get(&self, client: ClientId, write: u64) -> Option<&LastWrite> {
        let s = self.sessions.get(&client)?;
        let i = s.writes.binary_search_by_key(&write, |w| w.write).ok()?;
        Some(&s.writes[i])
    }

    /// Records an applied write; its session finished every write below
    /// `done_below`. Those are forgotten once stable (up to `stable`): a
    /// pipelined write that waits on one looks it up until then.
    pub fn applied(&mut self, client: ClientId, w: LastWrite, done_below: u64, stable: u64) {
        let s = self.sessions.entry(client).or_default();
        s.done_below = s.done_below.max(done_below);
        while s.writes.front().is_some_and(|f| f.write < s.done_below && f.seq <= stable) {
            s.writes.pop_front();
        }
        if !self.watched.is_empty() && self.watched.remove(&(client, w.write)).is_some() {
            self.seen.push((client, w.write));
        }
        // Nearly always the session's newest write: it goes last.
        if s.writes.back().is_none_or(|last| last.write < w.write) {
            return s.writes.push_back(w);
        }
        match s.writes.binary_search_by_key(&w.write, |x| x.write) {
            Ok(i) => s.writes[i] = w,
            Err(i) => s.writes.insert(i, w),
        }
    }

    /// Notes write `write` of `client` once it is applied here (`take_seen`).
    pub fn watch(&mut self, client: ClientId, write: u64, now_ms: u64) {
        self.watched.entry((client, write)).or_insert(now_ms);
    }

    /// The watched writes applied since the last call (drained: the list
    /// keeps its capacity for the next ones).
    pub fn take_seen(&mut self) -> std::vec::Drain<'_, (ClientId, u64)> {
        self.seen.drain(..)
    }

    /// Forgets sessions that wrote nothing for `WRITE_MEMORY_MS` (checked
    /// a few times per period).
    pub fn prune(&mut self, now_ms: u64) {
        if now_ms.saturating_sub(self.pruned_ms) < WRITE_MEMORY_MS / 4 {
            return;
        }
        self.pruned_ms = now_ms;
        // A watch whose write never came (its waiter was dropped).
        self.watched.retain(|_, since| now_ms.saturating_sub(*since) < WRITE_MEMORY_MS);
        self.sessions.retain(|_, s| s.writes.back().is_some_and(|w| now_ms.saturating_sub(w.at_ms) < WRITE_MEMORY_MS));
    }

    /// Everything remembered, for a state transfer or a checkpoint.
    pub fn export(&self) -> Vec<(ClientId, LastWrite)> {
        self.sessions.iter().flat_map(|(&c, s)| s.writes.iter().map(move |w| (c, w.clone()))).collect()
    }

    /// Takes what `export` gave (elsewhere, or before a restart), as if
    /// each write had just been applied.
    pub fn import(&mut self, writes: Vec<(ClientId, LastWrite)>, now_ms: u64) {
        for (client, mut w) in writes {
            w.at_ms = now_ms;
            self.applied(client, w, 0, 0);
        }
    }

    /// Writes remembered, all sessions together.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.sessions.values().map(|s| s.writes.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Timestamp;
    use crate::version::Version;
    use bytes::Bytes;

    fn w(write: u64, at_ms: u64) -> LastWrite {
        LastWrite { key: Bytes::from("k"), write, seq: write, version: Version::local(0, Timestamp::new(write, 0)), at_ms, old: None }
    }

    #[test]
    fn a_session_is_remembered_for_its_writes_in_flight_only() {
        let mut m = Writes::default();
        for i in 1..=4 {
            m.applied(7, w(i, 10), 1, 0);
        }
        assert_eq!(m.len(), 4, "a pipeline of four, none finished");
        m.applied(7, w(5, 10), 4, 2);
        assert_eq!(m.len(), 3, "the session finished 1..=3, and 3 is not stable yet");
        assert!(m.get(7, 3).is_some());
        m.applied(7, w(6, 10), 4, 3);
        assert_eq!(m.len(), 3, "4, 5 and 6 are in flight");
        assert!(m.finished(7, 3) && !m.finished(7, 4));
        assert!(m.get(7, 3).is_none());
        assert_eq!(m.get(7, 4).map(|x| x.seq), Some(4));
        assert!(!m.finished(8, 1), "another session");
    }

    #[test]
    fn a_watched_write_is_seen_once_applied() {
        let mut m = Writes::default();
        m.watch(7, 2, 0);
        m.applied(7, w(1, 0), 0, 0);
        assert_eq!(m.take_seen().count(), 0);
        m.applied(7, w(2, 0), 0, 0);
        assert_eq!(m.take_seen().collect::<Vec<_>>(), vec![(7, 2)]);
        m.applied(7, w(2, 0), 0, 0);
        assert_eq!(m.take_seen().count(), 0, "seen once");
        m.watch(8, 1, 0);
        m.prune(WRITE_MEMORY_MS);
        assert!(m.watched.is_empty(), "a watch whose write never came is forgotten");
    }

    #[test]
    fn a_quiet_session_is_forgotten_and_an_export_comes_back_whole() {
        let mut m = Writes::default();
        m.applied(7, w(1, 0), 0, 0);
        m.applied(8, w(1, WRITE_MEMORY_MS), 0, 0);
        let mut back = Writes::default();
        back.import(m.export(), 5);
        assert_eq!(back.len(), 2);
        m.prune(WRITE_MEMORY_MS + 1);
        assert!(m.get(7, 1).is_none() && m.get(8, 1).is_some());
    }
}
