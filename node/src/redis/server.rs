//! What the Redis connections of a node share, as Redis keeps it in its
//! `server` struct: the clock commands read, the counters INFO shows, the
//! limits on what a client may send, and the open connections (CLIENT
//! LIST, CLIENT KILL).

use super::stats::Stats;
use crate::runtime::Clock;
use causeway_resp::Limits;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Notify;

pub struct Server {
    /// The node's wall clock (`runtime::Clock`): commands read the time
    /// through it.
    pub clock: Clock,
    pub stats: Stats,
    /// What a request may hold (`NodeConfig::limits`).
    pub limits: Limits,
    /// The open connections, by CLIENT ID.
    pub clients: Mutex<BTreeMap<u64, Arc<Client>>>,
}

/// One open connection, as CLIENT LIST shows it.
pub struct Client {
    pub id: u64,
    pub addr: String,
    pub laddr: String,
    pub fd: i32,
    pub since: Instant,
    pub name: Mutex<Option<String>>,
    /// Milliseconds from `since` to the start of its last command.
    pub last_ms: AtomicU64,
    /// Its last command's row in the command stats, plus one (0: none).
    pub cmd: AtomicUsize,
    /// The protocol version it speaks (2 or 3).
    pub resp: AtomicU8,
    /// CLIENT KILL: the connection closes when it next waits for input.
    pub kill: Notify,
}

impl Server {
    /// Lists a new connection; it is taken off when the returned guard
    /// drops.
    pub fn open(self: &Arc<Self>, client: Arc<Client>) -> Listed {
        self.clients.lock().insert(client.id, client.clone());
        Listed { server: self.clone(), id: client.id }
    }
}

/// A connection's place in `Server::clients`, for as long as it lives.
pub struct Listed {
    server: Arc<Server>,
    id: u64,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.server.clients.lock().remove(&self.id);
    }
}
