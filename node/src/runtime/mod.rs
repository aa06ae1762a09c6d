//! The runtime: the node itself, with no idea of Redis.
//!
//! * `server`: the node's shared state (the node state machine,
//!   `causeway_core::node`, behind one lock), its ticker and flusher, and
//!   routing of the messages the state machine produces.
//! * `peer`: links to the other nodes of the site and to other sites.
//! * `inbound`: binary connections accepted: from peers (their links),
//!   native clients and coordinator members.
//! * `wal`: the write-ahead log and recovery.
//! * `tier`: the disk tier (`--disk-tier`): redb, and the thread that runs
//!   the node's jobs on it.
//! * `coordinator`: the coordinator member on the first three nodes.
//! * `clock`, `memory`, `auth`: the node's clocks, the counting allocator
//!   behind INFO's `used_memory`, inter-node authentication.
//! * `handle`: all a front end may use of the above.
//!
//! One port serves everyone (`run`). A connection whose first byte is
//! `BINARY_MAGIC` is a peer node or a native client (`inbound`); anything
//! else goes to the front end, with a `Handle`.

pub mod auth;
mod clock;
mod coordinator;
mod handle;
mod inbound;
pub mod memory;
mod peer;
mod server;
pub mod tier;
mod wal;

pub use clock::Clock;
pub use handle::{CoordinatorStatus, GeoStatus, Handle, LinkState, SiteStatus, Status, TierStatus, WalStatus};
pub use server::saved_topology;

/// What a connection's buffer keeps between uses.
const BUFFER_BYTES: usize = 64 * 1024;

/// Whether a connection's buffer grew for a large message (a 100 MB
/// value). Asked while the buffer holds it: once messages are split off,
/// `capacity` no longer tells the size of the allocation.
pub fn grown(buf: &BytesMut) -> bool {
    buf.capacity() > 16 * BUFFER_BYTES
}

/// Moves what `buf` holds to a new buffer of the usual size, if it had
/// `grown` and what is left in it is small: a `BytesMut` otherwise keeps
/// its largest allocation for the connection's life (it reclaims it whole
/// once the bytes split off it are dropped). A large message still
/// arriving stays where it is (copying it at every read would be
/// quadratic).
pub fn shrink_buffer(buf: &mut BytesMut, grown: bool) {
    if grown && buf.len() <= BUFFER_BYTES {
        let mut fresh = BytesMut::with_capacity(BUFFER_BYTES.max(buf.len()));
        fresh.extend_from_slice(buf);
        *buf = fresh;
    }
}

use crate::config::NodeConfig;
use bytes::BytesMut;
use causeway_core::message::BINARY_MAGIC;
use server::Node;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// What serves the clients that are not binary: the Redis front end
/// (`crate::redis`). The runtime hands it each such connection with the
/// node's handle.
pub trait Frontend: Send + Sync + 'static {
    /// Serves one client until it leaves.
    fn serve(self: Arc<Self>, node: Handle, stream: TcpStream) -> impl Future<Output = ()> + Send;
}

/// Starts a node, with the front end `frontend` makes (given the node's
/// handle), and serves until `shutdown` resolves.
pub async fn run<F: Frontend>(
    config: NodeConfig,
    frontend: impl FnOnce(&Handle) -> Arc<F>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let (node, listener, loops) = server::start(config).await?;
    let me = node.me;
    coordinate(&node).await?;
    let frontend = frontend(&Handle::new(node.clone()));
    tokio::select! {
        _ = accept_loop(node.clone(), frontend, listener) => {}
        _ = shutdown => tracing::info!("node {me} shutting down"),
    }
    for task in loops {
        task.abort();
    }
    if let Some(c) = node.coordinator.get() {
        c.shutdown().await;
    }
    Ok(())
}

/// Starts this node's coordinator member, if it is a coordinator node:
/// what the member sends goes through the node's routing.
async fn coordinate(node: &Arc<Node>) -> Result<(), String> {
    let Some(c) = coordinator::start(&node.config, node.me, (*node.topology()).clone(), node.secret()).await? else {
        return Ok(());
    };
    let _ = node.coordinator.set(c.clone());
    let to = node.clone();
    coordinator::spawn(
        &c,
        node.me,
        Arc::new(move |out| {
            to.route(out, None);
        }),
    );
    Ok(())
}

async fn accept_loop<F: Frontend>(node: Arc<Node>, frontend: Arc<F>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve(node.clone(), frontend.clone(), stream));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve<F: Frontend>(node: Arc<Node>, frontend: Arc<F>, stream: TcpStream) {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) if first[0] == BINARY_MAGIC => inbound::serve(node, stream).await,
        Ok(1) => frontend.serve(Handle::new(node), stream).await,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_gives_its_room_back_only_once_its_large_message_is_taken() {
        let mut buf = BytesMut::with_capacity(BUFFER_BYTES);
        // Part of a large message: grown, and left where it is (copying it
        // at every read while it arrives would be quadratic).
        buf.extend_from_slice(&vec![7u8; 4 << 20]);
        let was = grown(&buf);
        assert!(was);
        let at = buf.as_ptr();
        shrink_buffer(&mut buf, was);
        assert_eq!(buf.as_ptr(), at);
        // Taken but for the start of the next message: moved to a small buffer.
        let message = buf.split_to((4 << 20) - 10).freeze();
        shrink_buffer(&mut buf, was);
        assert_eq!((buf.len(), buf.capacity()), (10, BUFFER_BYTES));
        assert_eq!(&buf[..], &[7u8; 10]);
        drop(message);
    }
}
