//! One Redis client connection: read what the client sent, answer every
//! complete command in the buffer, flush once (pipelining), repeat.
//!
//! The connection is a ChainReaction client proxy with one session: its
//! `Driver` keeps the causal metadata a native client would keep itself, so
//! an unmodified Redis client gets causal+ consistency per connection.

use crate::cmd::{self, Outcome};
use crate::server::{now_ms, Node};
use bytes::BytesMut;
use causeway_core::driver::{ClientError, Consistency, Driver, Request, Response};
use causeway_core::message::{ClientId, Message};
use causeway_resp::{Frame, Protocol, RequestDecoder};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Replies are written out once this much is buffered, even mid-pipeline,
/// so one client cannot make the node buffer without bound.
const MAX_PENDING_OUTPUT: usize = 1 << 20;
/// How often a waiting request checks for a new configuration or an
/// unreachable peer.
const RECHECK: Duration = Duration::from_millis(100);

/// A connection's state, as commands see it.
pub struct Conn {
    pub node: Arc<Node>,
    pub driver: Driver,
    pub proto: Protocol,
    pub authed: bool,
    pub name: Option<String>,
    /// The level of the command being run, if `CW.WITH` gave one.
    pub level: Option<Consistency>,
    replies: mpsc::UnboundedReceiver<Message>,
}

impl Conn {
    pub fn id(&self) -> ClientId {
        self.driver.id()
    }

    /// Runs one request through the session's driver: sends what it says
    /// (messages for this node are handled in place), feeds it the replies,
    /// until it answers or gives up.
    pub async fn run(&mut self, request: Request) -> Result<Response, ClientError> {
        let id = self.id();
        // The session follows the node's configuration.
        self.driver.reconfigured(self.node.topology(), now_ms());
        // Replies to an earlier, abandoned request may still be queued.
        while self.replies.try_recv().is_ok() {}
        let level = self.level.unwrap_or(self.driver.consistency());
        let mut progress = self.driver.start_at(request, level, now_ms());
        let mut inbox: VecDeque<Message> = VecDeque::new();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.node.config.request_timeout_ms);
        loop {
            // Send what the driver asked for; tell it about nodes that could
            // not be reached, and send what that produces, until it settles.
            loop {
                if let Some(done) = progress.done.take() {
                    return done;
                }
                let (mine, undelivered) = self.node.route_sends(std::mem::take(&mut progress.send), id);
                inbox.extend(mine);
                for n in undelivered {
                    let more = self.driver.undeliverable(n, now_ms());
                    progress.send.extend(more.send);
                    progress.done = progress.done.or(more.done);
                }
                if let Some(msg) = inbox.pop_front() {
                    let more = self.driver.on_message(msg, now_ms());
                    progress.send.extend(more.send);
                    progress.done = progress.done.or(more.done);
                } else if progress.send.is_empty() && progress.done.is_none() {
                    break;
                }
            }
            let wake = deadline.min(tokio::time::Instant::now() + RECHECK);
            match tokio::time::timeout_at(wake, self.replies.recv()).await {
                Ok(Some(msg)) => progress = self.driver.on_message(msg, now_ms()),
                Ok(None) => unreachable!("the node holds the sender while the connection is registered"),
                Err(_) if tokio::time::Instant::now() >= deadline => {
                    // Past the deadline: the driver gives up (its clock agrees).
                    let progress = self.driver.tick(now_ms() + self.node.config.request_timeout_ms);
                    return progress.done.unwrap_or(Err(ClientError::Timeout));
                }
                Err(_) => {
                    // Still waiting: route around what changed meanwhile (a
                    // new configuration, a peer that went away), and let the
                    // driver retry what is due.
                    progress = self.driver.reconfigured(self.node.topology(), now_ms());
                    for peer in self.node.down_peers() {
                        progress.send.extend(self.driver.unreachable(peer, now_ms()).send);
                    }
                    let more = self.driver.tick(now_ms());
                    progress.send.extend(more.send);
                    progress.done = more.done;
                }
            }
        }
    }
}

/// Serves one Redis client until it quits or disconnects.
pub async fn serve(node: Arc<Node>, mut stream: TcpStream) {
    let id = node.new_session();
    let (tx, replies) = mpsc::unbounded_channel();
    node.register(id, tx.clone());
    let driver = Driver::new(id, node.topology(), Some(node.me), node.config.request_timeout_ms);
    let authed = node.config.requirepass.is_none();
    let mut conn = Conn { node: node.clone(), driver, proto: Protocol::Resp2, authed, name: None, level: None, replies };
    let limits = node.limits.clone();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut output = BytesMut::with_capacity(16 * 1024);
    let mut decoder = RequestDecoder::new();
    'serve: loop {
        loop {
            match decoder.decode(&mut input, &limits) {
                Ok(Some(args)) if args.is_empty() => {}
                Ok(Some(args)) => {
                    node.stats.commands.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match cmd::execute(&mut conn, args).await {
                        Outcome::Reply(frame) => frame.encode(conn.proto, &mut output),
                        Outcome::Close(frame) => {
                            frame.encode(conn.proto, &mut output);
                            let _ = stream.write_all(&output).await;
                            break 'serve;
                        }
                    }
                    if output.len() >= MAX_PENDING_OUTPUT {
                        if stream.write_all(&output).await.is_err() {
                            break 'serve;
                        }
                        output.clear();
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // Like Redis: report the protocol error and close.
                    e.to_frame().encode(conn.proto, &mut output);
                    let _ = stream.write_all(&output).await;
                    break 'serve;
                }
            }
        }
        if !output.is_empty() {
            if stream.write_all(&output).await.is_err() {
                break;
            }
            output.clear();
        }
        // A slow peer slows the clients that feed it.
        node.wait_for_peers().await;
        match stream.read_buf(&mut input).await {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    node.unregister(id, &tx);
}

/// The Redis error for a request the replicas did not complete.
pub fn client_error(e: ClientError) -> Frame {
    Frame::error(format!("ERR {e}"))
}
