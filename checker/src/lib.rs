//! The checkers Causeway's runs are judged by, apart from the simulator so
//! that the `causeway` binary (`causeway torture`) can judge real runs
//! without linking it:
//!
//! * `lincheck`: linearizability of a recorded history, by porcupine
//!   through the small Go program in tools/lincheck. `Op` is the history
//!   format every checker here reads.
//! * `causal`: causal+ of a recorded history from the values read alone
//!   (read-your-writes, monotonic reads, writes-follow-reads across keys,
//!   sessions and sites; no fractured get-transactions).
//! * `replicas`: once a run has settled, every chain's replicas identical
//!   and stable, and every acknowledged write still there.
//!
//! Each checker has a unit test that feeds it a known-bad history. The
//! simulator's own checker, which sees every read's version, stays with the
//! simulator (`causeway_sim::check`).

pub mod causal;
pub mod lincheck;
pub mod replicas;
