//! A Causeway data node: the I/O shell around `causeway-core`.
//!
//! * `server`: shared state (one lock per partition replica), the accept
//!   loop, the ticker, and message routing.
//! * `peer`: binary connections to peers and from native clients.
//! * `conn`: one Redis connection, a ChainReaction client proxy.
//! * `cmd`: the Redis commands, one file each (`CW.*` under `cmd/cw/`).
//! * `stats`: the counters INFO shows, per command and per error.
//! * `memory`: the counting allocator behind INFO's `used_memory`.
//! * `wal`: the write-ahead log and recovery.
//! * `config`: flags and TOML.

pub mod auth;
pub mod cmd;
pub mod config;
pub mod conn;
pub mod coordinator;
pub mod memory;
pub mod peer;
pub mod server;
pub mod stats;
pub mod wal;

pub use config::NodeConfig;
pub use server::run;
