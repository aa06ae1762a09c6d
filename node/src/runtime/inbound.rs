//! Binary connections accepted by this node: from a peer node (its link's
//! frames, `peer::link`, acknowledged back on the same connection), from a
//! native client (requests in, replies out on the same connection), or
//! from a coordinator member (Raft RPCs).

use crate::runtime::peer::Peer;
use crate::runtime::server::Node;
use bytes::BytesMut;
use causeway_core::message::{Hello, LinkReply, Message, Welcome};
use causeway_core::wire::{put_frame, put_message, take_frame, take_message, take_sequenced};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A peer's frames are acknowledged at most this long after they arrive
/// (or at once after `ACK_BYTES`), so its unacknowledged backlog stays
/// small without an extra write per frame; a quiet link (heartbeats) is
/// acknowledged once for several frames.
const ACK_DELAY: Duration = Duration::from_millis(100);
const ACK_BYTES: usize = 64 * 1024;

/// Serves a binary connection accepted from a peer node or a native client.
pub async fn serve(node: Arc<Node>, stream: TcpStream) {
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
    if let (Hello::Node { .. } | Hello::Raft(_) | Hello::Site { .. }, Some(secret)) = (&hello, &node.config.cluster_secret) {
        if let Err(e) = crate::runtime::auth::verify(&mut rd, &mut wr, &mut buf, &hello, secret).await {
            tracing::warn!("refused a peer connection claiming to be {hello:?}: {e}");
            return;
        }
    }
    match hello {
        Hello::Node { id, stream } => serve_peer(node, Peer::Node(id), stream, rd, wr, buf).await,
        Hello::Site { site, node: id, stream } => serve_peer(node, Peer::Site(site, id), stream, rd, wr, buf).await,
        Hello::Client { id, password } => serve_client(node, id, password, rd, wr, buf).await,
        Hello::Raft(_) => {
            if let Some(c) = node.coordinator.get() {
                c.raft.clone().serve(rd, wr, buf).await;
            }
        }
    }
}

/// Takes the frames of peer `id`'s link `stream`, each once, and
/// acknowledges them (see `link`).
async fn serve_peer(node: Arc<Node>, id: Peer, stream: u64, mut rd: OwnedReadHalf, mut wr: OwnedWriteHalf, mut buf: BytesMut) {
    let inbound = node.inbound(id);
    let mut out = BytesMut::new();
    put_frame(&LinkReply::Resume { incarnation: node.incarnation(), last: inbound.open(stream) }, &mut out);
    // Another site's link goes to this site's geo leader (`site_home`):
    // told at once, and with later acknowledgements whenever the leader is
    // elsewhere than last told.
    let mut told: Option<String> = None;
    if matches!(id, Peer::Site(..)) {
        redirect(&node, &mut told, &mut out);
    }
    if wr.write_all(&out).await.is_err() {
        return;
    }
    // Whether the peer was found in the configuration (looked up until it
    // is, not for every frame after).
    let mut known = false;
    // Bytes taken since the last acknowledgement, and when it is due.
    let mut unacked = 0;
    let mut ack_due: Option<tokio::time::Instant> = None;
    loop {
        let grown = super::grown(&buf);
        loop {
            let before = buf.len();
            match take_sequenced(&mut buf) {
                Ok(Some((seq, msg))) => {
                    unacked += before - buf.len();
                    ack_due.get_or_insert_with(|| tokio::time::Instant::now() + ACK_DELAY);
                    if !inbound.take(seq) {
                        continue; // Resent after a reconnect; taken already.
                    }
                    if !accepted_from(&node, id, &msg, &mut known) {
                        tracing::debug!("dropping a message from {id:?}, which is not in this node's configuration: {msg:?}");
                        continue;
                    }
                    node.route(vec![causeway_core::message::Envelope { to: destination(&node, &msg), msg }], None);
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("closing the connection from {id:?}: it sent a bad frame: {e}");
                    return;
                }
            }
        }
        super::shrink_buffer(&mut buf, grown);
        if unacked >= ACK_BYTES || ack_due.is_some_and(|t| t <= tokio::time::Instant::now()) {
            out.clear();
            if matches!(id, Peer::Site(..)) {
                redirect(&node, &mut told, &mut out);
            }
            put_frame(&LinkReply::Ack(inbound.last()), &mut out);
            if wr.write_all(&out).await.is_err() {
                return;
            }
            (unacked, ack_due) = (0, None);
        }
        let read = match ack_due {
            Some(t) => match tokio::time::timeout_at(t, rd.read_buf(&mut buf)).await {
                Ok(r) => r,
                Err(_) => continue, // Time to acknowledge.
            },
            None => rd.read_buf(&mut buf).await,
        };
        if !matches!(read, Ok(n) if n > 0) {
            return;
        }
    }
}

/// Serves a native client: its requests in, replies to it (from any node
/// of the site) out on the same connection.
async fn serve_client(
    node: Arc<Node>,
    id: causeway_core::message::ClientId,
    password: Option<String>,
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    mut buf: BytesMut,
) {
    let mut out = BytesMut::new();
    if node.config.requirepass.is_some() && node.config.requirepass != password {
        put_frame(&Welcome::Err("NOAUTH a password is required (or it is wrong)".into()), &mut out);
        let _ = wr.write_all(&out).await;
        return;
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
    node.register(id, tx.clone());
    let noted = node.config.dr.is_some_and(|p| p.primary == node.config.site);
    put_frame(&Welcome::Ok(causeway_core::message::Greeting { noted }), &mut out);
    if wr.write_all(&out).await.is_err() {
        node.unregister(id, &tx);
        return;
    }
    out.clear();
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            put_message(&m, &mut out);
            while let Ok(m) = rx.try_recv() {
                put_message(&m, &mut out);
            }
            if wr.write_all(&out).await.is_err() {
                return;
            }
            let grown = super::grown(&out);
            out.clear();
            super::shrink_buffer(&mut out, grown);
        }
    });
    loop {
        let grown = super::grown(&buf);
        loop {
            match take_message(&mut buf) {
                Ok(Some(msg)) => {
                    node.route(vec![causeway_core::message::Envelope { to: destination(&node, &msg), msg }], None);
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("closing a native client's connection: it sent a bad frame: {e}");
                    break;
                }
            }
        }
        super::shrink_buffer(&mut buf, grown);
        // A slow peer slows the clients that feed it.
        node.wait_for_peers().await;
        if !matches!(rd.read_buf(&mut buf).await, Ok(n) if n > 0) {
            break;
        }
    }
    node.unregister(id, &tx);
}

/// Whether a message from peer node `id` is taken: from a node of this
/// node's configuration (a member, or a failed one that may return),
/// anything; from another node, only its own heartbeats (a node started
/// with `--join` heartbeats before the coordinator adds it). A heartbeat
/// must come from the node it names. `known` remembers, for the
/// connection, that the peer was found in the configuration.
///
/// From another site: only what sites send each other (`GeoMsg::
/// from_site`: shipped ids, values, acknowledgements, naming that site as
/// their sender), from a site in this node's configuration, while the
/// link to it is not cut.
fn accepted_from(node: &Node, id: Peer, msg: &Message, known: &mut bool) -> bool {
    let id = match id {
        Peer::Node(id) => id,
        Peer::Site(site, _) => {
            let between_sites = matches!(msg, Message::Geo(g) if g.from_site(site, node.config.site));
            return between_sites && node.site_link(site).is_some_and(|l| l.takes());
        }
    };
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

/// Adds to `out` a `LinkReply::Redirect` to `site_home`, unless that is
/// where `told` says the link was sent already.
fn redirect(node: &Node, told: &mut Option<String>, out: &mut BytesMut) {
    if let Some(home) = site_home(node).filter(|h| told.as_ref() != Some(h)) {
        put_frame(&LinkReply::Redirect(home.clone()), out);
        *told = Some(home);
    }
}

/// Where another site's link should land when this node is not that
/// place: the site's geo leader (another site's shipments and values go to
/// its receiver there, acknowledgements of this site's shipments to its
/// stabilizer), whose address the link was given (it ignores others).
fn site_home(node: &Node) -> Option<String> {
    let topology = node.topology();
    let leader = node.with_core(|core| core.geo().and_then(|g| g.leader_of(&topology)))?;
    (leader != node.me).then(|| topology.node(leader).map(|n| n.addr.clone())).flatten()
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
