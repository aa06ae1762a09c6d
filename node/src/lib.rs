//! A Causeway data node: the I/O shell around `causeway-core`.
//!
//! * `runtime`: the node itself: shared state (one lock per partition
//!   replica), the accept loop, the ticker and message routing (`server`),
//!   peer links (`peer`), the write-ahead log (`wal`), the coordinator
//!   member (`coordinator`), inter-node authentication (`auth`) and the
//!   counting allocator (`memory`).
//! * `redis`: the Redis front end: one connection, a ChainReaction client
//!   proxy (`conn`), the commands, one file each (`cmd`, `CW.*` under
//!   `cmd/cw/`), and the counters INFO shows (`stats`).
//! * `config`: flags and TOML.

pub mod config;
pub mod redis;
pub mod runtime;

pub use config::NodeConfig;

/// Starts a node serving Redis clients, until `shutdown` resolves.
pub async fn run(config: NodeConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<(), String> {
    runtime::run(config, redis::Server::start, shutdown).await
}
