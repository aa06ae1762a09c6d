//! The Redis front end: one client connection (`conn`), the commands
//! (`cmd`), and the counters INFO shows (`stats`).

pub mod cmd;
pub mod conn;
pub mod stats;
