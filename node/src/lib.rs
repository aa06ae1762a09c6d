//! A Causeway data node: the I/O shell around `causeway-core`, in two
//! layers. The front end uses the runtime through its `Handle`; the runtime
//! knows no front end.
//!
//! * `runtime`: the node itself. Shared state and routing (`server`), peer
//!   links (`peer`) and the connections peers open (`inbound`), the
//!   write-ahead log (`wal`), the coordinator member (`coordinator`), the
//!   clocks, the counting allocator, inter-node authentication. It serves
//!   the port, and hands every Redis connection to the front end with a
//!   `Handle`: register a session, submit its requests, read the node's
//!   `Status`, and a few operator actions; and a `Clock`.
//! * `redis`: the Redis front end: one connection, a ChainReaction client
//!   proxy (`conn`), the commands, one file each (`cmd`, `CW.*` under
//!   `cmd/cw/`), what the connections share (`Server`: the clock, the
//!   counters INFO shows (`stats`), the limits).
//! * `config`: flags and TOML, read by both.

pub mod config;
pub mod redis;
pub mod runtime;

pub use config::NodeConfig;

/// Starts a node serving Redis clients, until `shutdown` resolves.
pub async fn run(config: NodeConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<(), String> {
    runtime::run(config, redis::Server::start, shutdown).await
}
