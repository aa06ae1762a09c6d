//! Binary connections: to and from the other nodes of the site, and from
//! native clients.
//!
//! Each node keeps one outbound connection per peer, fed by two queues:
//! eager (client requests, replies, eager-phase forwards, acknowledgements)
//! and lazy (lazy-phase forwards, ChainReaction §3.3.1). The writer drains
//! everything queued, eager first, into one buffer and writes it with one
//! syscall, so a busy chain batches naturally. Messages queued while the
//! peer is unreachable are dropped: the chain retransmits its own traffic and
//! client requests time out; chain repair on failure is the coordinator's
//! job (issue 3).

use crate::server::Node;
use bytes::BytesMut;
use causeway_core::message::{Hello, Message, Welcome, BINARY_MAGIC};
use causeway_core::ring::NodeId;
use causeway_core::wire::{put_frame, take_frame};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Flush at about this many bytes even if more is queued, to bound latency.
const MAX_BATCH_BYTES: usize = 256 * 1024;

/// The sending half of the connection to one peer.
pub struct Sender {
    eager: mpsc::UnboundedSender<Message>,
    lazy: mpsc::UnboundedSender<Message>,
    /// Whether the peer is unreachable right now (connect or write failed).
    down: Arc<AtomicBool>,
}

impl Sender {
    /// Starts the writer task for the peer at `addr`.
    pub fn spawn(me: NodeId, addr: String, secret: Option<Arc<str>>) -> Sender {
        let (eager, eager_rx) = mpsc::unbounded_channel();
        let (lazy, lazy_rx) = mpsc::unbounded_channel();
        let down = Arc::new(AtomicBool::new(false));
        tokio::spawn(write_loop(me, addr, secret, eager_rx, lazy_rx, down.clone()));
        Sender { eager, lazy, down }
    }

    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    pub fn send(&self, msg: Message) {
        let queue = if matches!(msg, Message::Forward { lazy: true, .. }) { &self.lazy } else { &self.eager };
        let _ = queue.send(msg);
    }
}

async fn write_loop(
    me: NodeId,
    addr: String,
    secret: Option<Arc<str>>,
    mut eager: mpsc::UnboundedReceiver<Message>,
    mut lazy: mpsc::UnboundedReceiver<Message>,
    down: Arc<AtomicBool>,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    'connect: loop {
        let mut stream = match TcpStream::connect(&addr).await {
            Ok(s) => s,
            Err(_) => {
                // Peer down or not up yet: drop what is queued, try again soon.
                down.store(true, Ordering::Relaxed);
                while eager.try_recv().is_ok() || lazy.try_recv().is_ok() {}
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        buf.clear();
        buf.extend_from_slice(&[BINARY_MAGIC]);
        put_frame(&Hello::Node(me), &mut buf);
        if let Some(secret) = &secret {
            let introduced = async {
                stream.write_all(&buf).await?;
                crate::auth::prove(&mut stream, &Hello::Node(me), secret).await
            };
            if let Err(e) = introduced.await {
                tracing::debug!("peer {addr} did not accept this node: {e}");
                down.store(true, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            buf.clear();
        }
        down.store(false, Ordering::Relaxed);
        loop {
            // Wait for anything, eager first.
            let first = tokio::select! {
                biased;
                m = eager.recv() => m,
                m = lazy.recv() => m,
            };
            let Some(first) = first else { return };
            put_frame(&first, &mut buf);
            while buf.len() < MAX_BATCH_BYTES {
                match eager.try_recv() {
                    Ok(m) => put_frame(&m, &mut buf),
                    Err(_) => match lazy.try_recv() {
                        Ok(m) => put_frame(&m, &mut buf),
                        Err(_) => break,
                    },
                }
            }
            if let Err(e) = stream.write_all(&buf).await {
                tracing::debug!("lost connection to peer {addr}: {e}");
                down.store(true, Ordering::Relaxed);
                continue 'connect;
            }
            buf.clear();
        }
    }
}

/// Serves a binary connection accepted from a peer node or a native client.
pub async fn serve_inbound(node: Arc<Node>, stream: TcpStream) {
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut magic = [0u8; 1];
    if rd.read_exact(&mut magic).await.is_err() {
        return;
    }
    let hello: Hello = loop {
        match take_frame(&mut buf) {
            Ok(Some(h)) => break h,
            Ok(None) => {
                if !matches!(rd.read_buf(&mut buf).await, Ok(n) if n > 0) {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!("bad handshake on a binary connection: {e}");
                return;
            }
        }
    };
    // Another node or coordinator member proves the cluster secret first.
    if let (Hello::Node(_) | Hello::Raft(_), Some(secret)) = (&hello, &node.config.cluster_secret) {
        if let Err(e) = crate::auth::verify(&mut rd, &mut wr, &mut buf, &hello, secret).await {
            tracing::warn!("refused a peer connection claiming to be {hello:?}: {e}");
            return;
        }
    }
    let peer = match hello {
        Hello::Node(id) => Some(id),
        _ => None,
    };
    // Whether the peer was found in the configuration (looked up until it
    // is, not for every frame after).
    let mut known = false;
    // A native client gets its replies on this same connection.
    let client = match hello {
        Hello::Client { id, password } => {
            let mut out = BytesMut::new();
            if node.config.requirepass.is_some() && node.config.requirepass != password {
                put_frame(&Welcome::Err("NOAUTH a password is required (or it is wrong)".into()), &mut out);
                let _ = wr.write_all(&out).await;
                return;
            }
            let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
            node.register(id, tx.clone());
            put_frame(&Welcome::Ok(()), &mut out);
            if wr.write_all(&out).await.is_err() {
                node.unregister(id, &tx);
                return;
            }
            out.clear();
            tokio::spawn(async move {
                while let Some(m) = rx.recv().await {
                    put_frame(&m, &mut out);
                    while let Ok(m) = rx.try_recv() {
                        put_frame(&m, &mut out);
                    }
                    if wr.write_all(&out).await.is_err() {
                        return;
                    }
                    out.clear();
                }
            });
            Some((id, tx))
        }
        Hello::Node(_) => None,
        Hello::Raft(_) => {
            if let Some(c) = node.coordinator.get() {
                c.raft.clone().serve(rd, wr, buf).await;
            }
            return;
        }
    };
    loop {
        loop {
            match take_frame::<Message>(&mut buf) {
                Ok(Some(msg)) => {
                    if let Some(id) = peer.filter(|&id| !accepted_from(&node, id, &msg, &mut known)) {
                        tracing::debug!("dropping a message from node {id}, which is not in this node's configuration");
                        continue;
                    }
                    node.route(vec![causeway_core::message::Envelope { to: destination(&node, &msg), msg }], None);
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("closing a binary connection that sent a bad frame: {e}");
                    return close(&node, client);
                }
            }
        }
        match rd.read_buf(&mut buf).await {
            Ok(n) if n > 0 => {}
            _ => return close(&node, client),
        }
    }
}

/// Whether a message from peer node `id` is taken: from a node of this
/// node's configuration (a member, or a failed one that may return),
/// anything; from another node, only its own heartbeats (a node started
/// with `--join` heartbeats before the coordinator adds it). A heartbeat
/// must come from the node it names. `known` remembers, for the
/// connection, that the peer was found in the configuration.
fn accepted_from(node: &Node, id: NodeId, msg: &Message, known: &mut bool) -> bool {
    match msg {
        Message::Heartbeat(beat) => beat.from == id,
        _ if *known => true,
        _ => {
            let t = node.topology();
            *known = t.node(id).is_some() || t.returning.iter().any(|n| n.id == id) || node.config.nodes.iter().any(|n| n.id == id);
            *known
        }
    }
}

/// Replies arriving from peers are for our sessions; everything else is
/// for this node.
fn destination(node: &Node, msg: &Message) -> causeway_core::message::Dest {
    use causeway_core::message::Dest;
    match msg.op() {
        Some(op) if msg.is_reply() => Dest::Client(op.client),
        _ => Dest::Node(node.me),
    }
}

fn close(node: &Node, client: Option<(causeway_core::message::ClientId, mpsc::UnboundedSender<Message>)>) {
    if let Some((id, tx)) = client {
        node.unregister(id, &tx);
    }
}
