//! The Redis front end: it serves Redis clients through the runtime's
//! `Handle` (and the `Clock` it hands out) and knows nothing else of the
//! runtime.
//!
//! * `conn`: one client connection, a ChainReaction client proxy with one
//!   session. It runs the commands of the table it is handed.
//! * `cmd`: the commands, one file each (`CW.*` under `cmd/cw/`), and
//!   their table (`cmd::Commands`). A command turns into requests for the
//!   connection's session, or runs against the connection (`conn::Conn`).
//! * `server`: what the connections share: the clock, the counters, the
//!   limits.
//! * `stats`: the counters INFO shows, per command and per error.

pub mod cmd;
pub mod conn;
mod server;
pub mod stats;

pub use server::{Client, Server};

use crate::runtime::{Frontend, Handle};
use stats::Stats;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::net::TcpStream;

impl Server {
    /// The front end of the node behind `node`, and its sampler.
    pub fn start(node: &Handle) -> Arc<Server> {
        let server = Arc::new(Server {
            clock: node.clock(),
            stats: Stats::new(cmd::row_count()),
            limits: node.config().limits(),
            clients: Default::default(),
        });
        tokio::spawn(sample_loop(Arc::downgrade(&server)));
        server
    }
}

impl Frontend for Server {
    async fn serve(self: Arc<Self>, node: Handle, stream: TcpStream) {
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        self.stats.total_connections.fetch_add(1, Ordering::Relaxed);
        conn::serve::<cmd::Commands>(node, self.clone(), stream).await;
        self.stats.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Samples the command counter once a second (INFO's
/// instantaneous_ops_per_sec), while the front end lives.
async fn sample_loop(server: Weak<Server>) {
    let mut last = 0;
    loop {
        let Some(clock) = server.upgrade().map(|s| s.clock) else { return };
        clock.next_on_grid(Duration::from_secs(1)).await;
        let Some(server) = server.upgrade() else { return };
        let now = server.stats.commands.load(Ordering::Relaxed);
        // CONFIG RESETSTAT may have set the counter back since.
        server.stats.ops_per_sec.store(now.saturating_sub(last), Ordering::Relaxed);
        last = now;
    }
}
