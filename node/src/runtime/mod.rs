//! The node: its shared state and loops (`server`), peer links (`peer`),
//! the write-ahead log (`wal`), the coordinator member (`coordinator`),
//! inter-node authentication (`auth`), and the counting allocator behind
//! INFO's `used_memory` (`memory`).

pub mod auth;
pub mod coordinator;
pub mod memory;
pub mod peer;
pub mod server;
pub mod wal;
