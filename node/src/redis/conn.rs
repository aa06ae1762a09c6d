//! One Redis client connection: read what the client sent, queue every
//! complete command in the buffer on the session, answer them all in order,
//! flush once (pipelining), repeat.
//!
//! The connection is a ChainReaction client proxy with one session: its
//! `Driver` keeps the causal metadata a native client would keep itself, so
//! an unmodified Redis client gets causal+ consistency per connection. The
//! driver decides which of the queued requests may run together, deadlines,
//! retries and when to look at the site again (`core/src/driver/mod.rs`);
//! this file only moves messages: to peers, to this node's own state
//! machine (handled in place, no hop) and back.

use super::server::Server;
use super::stats::Call;
use crate::runtime::Handle;
use bytes::Bytes;
use bytes::BytesMut;
use causeway_core::driver::{Consistency, Driver, Progress, Request, Response, Sends, Transport};
use causeway_core::error::Error;
use causeway_core::message::{ClientId, Message};
use causeway_core::ring::{NodeId, Topology};
use causeway_resp::{Frame, Protocol, RequestDecoder};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Replies are written out once this much is buffered, even mid-pipeline,
/// so one client cannot make the node buffer without bound.
const MAX_PENDING_OUTPUT: usize = 1 << 20;
/// At most this many commands of a pipeline are queued on the session at
/// once; the rest are read after these are answered.
const MAX_QUEUED: usize = 1024;

/// How a connection runs a command: the command table (`cmd::Commands`),
/// handed to `serve`. Every command uses the connection (`Conn`); the
/// connection knows the commands only through this.
pub trait Dispatch {
    /// Runs one command (a data command is only parsed into its
    /// requests), and says what its reply counts toward in INFO.
    fn execute(conn: &mut Conn, args: Vec<Bytes>) -> impl Future<Output = (Call, Outcome)> + Send;
}

/// What the connection does after a command.
pub enum Outcome {
    Reply(Frame),
    /// Send this, then close the connection (QUIT).
    Close(Frame),
    /// Run these requests on the session, then answer.
    Queue(Batch),
}

impl From<Frame> for Outcome {
    fn from(f: Frame) -> Self {
        Outcome::Reply(f)
    }
}

/// A data command's requests, in order, and how to answer from their
/// responses.
pub struct Batch {
    /// Inline: most commands make one.
    pub requests: smallvec::SmallVec<[Request; 1]>,
    /// The level of these requests alone (CW.WITH), else the session's.
    pub level: Option<Consistency>,
    pub answer: Answer,
}

/// The responses to a data command's requests, in order.
pub type Responses<'a> = std::collections::vec_deque::Drain<'a, Result<Response, Error>>;

/// How a data command answers once its responses are in: from them
/// alone, or with two numbers its arguments gave (GETRANGE's range).
pub enum Answer {
    Plain(fn(&Server, Responses) -> Frame),
    With(fn(&Server, Responses, [i64; 2]) -> Frame, [i64; 2]),
    /// EXEC: each queued command's answer over its share of the responses
    /// (or the error its arguments got, with no share), in an array.
    Exec(Vec<(usize, Result<Answer, Frame>)>),
}

impl Answer {
    /// The reply from the first `n` of `responses` (taken).
    fn give(self, server: &Server, responses: &mut VecDeque<Result<Response, Error>>, n: usize) -> Frame {
        match self {
            Answer::Plain(f) => f(server, responses.drain(..n)),
            Answer::With(f, numbers) => f(server, responses.drain(..n), numbers),
            Answer::Exec(parts) => Frame::Array(
                parts
                    .into_iter()
                    .map(|(n, answer)| match answer {
                        Ok(answer) => answer.give(server, responses, n),
                        Err(error) => error,
                    })
                    .collect(),
            ),
        }
    }
}

/// The commands a connection queued since MULTI (`cmd/multi.rs`): their
/// batches, or the error their arguments got; `failed` once one was
/// refused outright (unknown, wrong arity): EXEC then runs none.
#[derive(Default)]
pub struct Multi {
    pub queued: Vec<Result<Batch, Frame>>,
    pub failed: bool,
}

/// A reply owed to the client, in command order, and what it counts toward
/// in INFO once encoded.
enum Owed {
    Frame(Frame, Call),
    /// A data command's reply, once the responses to its `requests` are in.
    Answer {
        requests: usize,
        answer: Answer,
        call: Call,
    },
}

/// A connection's state, as commands see it.
pub struct Conn {
    pub node: Handle,
    pub server: Arc<Server>,
    pub driver: Driver,
    pub proto: Protocol,
    pub authed: bool,
    /// What CLIENT LIST shows of it (its name too).
    pub client: Arc<super::server::Client>,
    /// Since MULTI, until EXEC or DISCARD.
    pub multi: Option<Multi>,
    replies: mpsc::UnboundedReceiver<Message>,
    /// The driver's responses, in request order, not yet in a reply.
    responses: VecDeque<Result<Response, Error>>,
    /// Requests not started yet: at most `MAX_QUEUED` run at once (an
    /// EXEC may bring any number).
    backlog: VecDeque<(Request, Consistency)>,
    owed: VecDeque<Owed>,
    /// Encoded replies not yet written.
    output: BytesMut,
}

impl Conn {
    pub fn id(&self) -> ClientId {
        self.driver.id()
    }

    /// Runs one request to completion, for commands that need a response
    /// before they answer (INFO). Only after `settle`.
    pub async fn run(&mut self, request: Request) -> Result<Response, Error> {
        debug_assert!(self.owed.is_empty(), "run() after settle()");
        let level = self.driver.consistency();
        let now = self.server.clock.now_ms();
        let progress = self.driver.start_at(request, level, now);
        self.apply(progress, now);
        loop {
            if let Some(response) = self.responses.pop_front() {
                return response;
            }
            self.wait().await;
        }
    }

    /// Waits until every queued command is answered; their replies are then
    /// in the output buffer, and the session is as they left it.
    pub async fn settle(&mut self) {
        self.encode_ready();
        while !self.owed.is_empty() {
            self.wait().await;
            self.encode_ready();
        }
    }

    /// Queues a data command's requests on the session.
    fn queue(&mut self, batch: Batch, call: Call) {
        let level = batch.level.unwrap_or(self.driver.consistency());
        if batch.requests.iter().any(|r| matches!(r, Request::MultiGet(_))) {
            if let Some((site_time, _)) = self.node.geo_view() {
                self.driver.observe_site_time(&site_time);
            }
        }
        self.owed.push_back(Owed::Answer { requests: batch.requests.len(), answer: batch.answer, call });
        let now = self.server.clock.now_ms();
        for request in batch.requests {
            if !self.backlog.is_empty() || self.driver.in_flight() >= MAX_QUEUED {
                // An EXEC of many commands: they start as earlier ones end.
                self.backlog.push_back((request, level));
                continue;
            }
            self.start(request, level, now);
        }
    }

    fn start(&mut self, request: Request, level: Consistency, now: u64) {
        if let Request::Get(key) = &request {
            if let Some(response) = self.read_here(key, level, now) {
                self.responses.push_back(Ok(response));
                return;
            }
        }
        let progress = self.driver.start_at(request, level, now);
        self.apply(progress, now);
    }

    /// Starts requests held back (`backlog`) while the session has room.
    fn top_up(&mut self) {
        let now = self.server.clock.now_ms();
        while self.driver.in_flight() < MAX_QUEUED {
            let Some((request, level)) = self.backlog.pop_front() else { return };
            self.start(request, level, now);
        }
    }

    /// A GET answered by this node in place, when the session allows it
    /// (`Driver::read_here`): no message, no request state machine.
    fn read_here(&mut self, key: &Bytes, level: Consistency, now: u64) -> Option<Response> {
        let here = self.driver.read_here(key, level)?;
        let (item, chain_index, stable_through) = self.node.read_now(&here, key, now)?;
        Some(self.driver.read_answered(key, level, here, item, chain_index, stable_through))
    }

    /// Encodes the replies at the front whose responses are all in, and
    /// counts them (their commands end now: one clock reading for them all).
    fn encode_ready(&mut self) {
        let mut now = None;
        loop {
            let (frame, call) = match self.owed.front() {
                Some(Owed::Frame(..)) => match self.owed.pop_front() {
                    Some(Owed::Frame(frame, call)) => (frame, call),
                    _ => unreachable!("matched above"),
                },
                Some(Owed::Answer { requests, .. }) if self.responses.len() >= *requests => {
                    let Some(Owed::Answer { requests, answer, call }) = self.owed.pop_front() else { unreachable!("matched above") };
                    (answer.give(&self.server, &mut self.responses, requests), call)
                }
                _ => return,
            };
            self.server.stats.replied(call, &frame, *now.get_or_insert_with(Instant::now));
            frame.encode(self.proto, &mut self.output);
        }
    }

    /// The session follows the node's configuration (a cheap local look).
    fn follow_site(&mut self) {
        let now = self.server.clock.now_ms();
        let progress = self.driver.reconfigured(self.node.topology(), now);
        self.apply(progress, now);
    }

    /// Does what the driver asked, through this node (`Link`), and keeps
    /// the responses in the order the driver gave them. Everything in place
    /// takes no time worth reading the clock for again.
    fn apply(&mut self, p: Progress, now: u64) {
        let mut link = Link { node: &self.node, client: self.driver.id() };
        self.driver.pump(p, now, &mut link, &mut self.responses);
    }

    /// Waits for a reply or for the driver's next wake-up, and hands either
    /// to the driver.
    async fn wait(&mut self) {
        self.top_up();
        let Some(wake_ms) = self.driver.next_wake() else { return };
        let sleep = Duration::from_millis(wake_ms.saturating_sub(self.server.clock.now_ms()));
        match tokio::time::timeout(sleep, self.replies.recv()).await {
            Ok(Some(msg)) => {
                let now = self.server.clock.now_ms();
                let progress = self.driver.on_message(msg, now);
                self.apply(progress, now);
                // Take what else arrived meanwhile without another wait.
                while let Ok(msg) = self.replies.try_recv() {
                    let progress = self.driver.on_message(msg, now);
                    self.apply(progress, now);
                }
            }
            Ok(None) => unreachable!("the node holds the sender while the connection is registered"),
            Err(_) => {}
        }
        let now = self.server.clock.now_ms();
        if self.driver.next_wake().is_some_and(|at| now >= at) {
            let progress = self.driver.tick(now);
            self.apply(progress, now);
        }
        self.top_up();
    }
}

/// A connection's way to the site: this node. Messages for this node are
/// handled here and now (their answers come back at once), those for peers
/// go on its links; a recheck looks at the node's own configuration and
/// the peers it cannot reach.
struct Link<'a> {
    node: &'a Handle,
    client: ClientId,
}

impl Transport for Link<'_> {
    fn send(&mut self, batch: Sends, replies: &mut Vec<Message>, undeliverable: &mut Vec<NodeId>) {
        self.node.submit(batch, self.client, replies, undeliverable);
    }

    fn recheck(&mut self) -> (Option<Arc<Topology>>, Vec<NodeId>) {
        (Some(self.node.topology()), self.node.down_peers())
    }
}

/// Serves one Redis client until it quits or disconnects.
pub async fn serve<D: Dispatch>(node: Handle, server: Arc<Server>, mut stream: TcpStream) {
    let id = node.new_session();
    let (tx, replies) = mpsc::unbounded_channel();
    node.register(id, tx.clone());
    let mut driver = Driver::new(id, node.topology(), Some(node.me()), node.config().request_timeout_ms);
    // The primary of a disaster-recovery pair acknowledges a write once its
    // backup has noted it (`geo::dr`).
    driver.set_noted(node.config().dr.is_some_and(|p| p.primary == node.config().site));
    let authed = node.config().requirepass.is_none();
    let client = Arc::new(super::server::Client {
        id: id & 0xFFFF_FFFF_FFFF,
        addr: stream.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
        laddr: stream.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
        fd: std::os::fd::AsRawFd::as_raw_fd(&stream),
        since: Instant::now(),
        name: Default::default(),
        last_ms: Default::default(),
        cmd: Default::default(),
        resp: std::sync::atomic::AtomicU8::new(2),
        kill: Default::default(),
    });
    let _listed = server.open(client.clone());
    let mut conn = Conn {
        node: node.clone(),
        server: server.clone(),
        driver,
        proto: Protocol::Resp2,
        authed,
        client: client.clone(),
        multi: None,
        replies,
        responses: VecDeque::new(),
        backlog: VecDeque::new(),
        owed: VecDeque::new(),
        output: BytesMut::with_capacity(16 * 1024),
    };
    let limits = server.limits.clone();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut decoder = RequestDecoder::new();
    'serve: loop {
        conn.follow_site();
        let input_grown = crate::runtime::grown(&input);
        loop {
            match decoder.decode(&mut input, &limits) {
                Ok(Some(args)) if args.is_empty() => {}
                Ok(Some(args)) => {
                    server.stats.commands.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    client.last_ms.store(client.since.elapsed().as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
                    let executed = D::execute(&mut conn, args).await;
                    if let Call::Ran(row, _) | Call::Rejected(row) = executed.0 {
                        client.cmd.store(row.0 + 1, std::sync::atomic::Ordering::Relaxed);
                    }
                    match executed {
                        (call, Outcome::Queue(batch)) => conn.queue(batch, call),
                        (call, Outcome::Reply(frame)) => conn.owed.push_back(Owed::Frame(frame, call)),
                        (call, Outcome::Close(frame)) => {
                            // QUIT runs after every earlier command is answered.
                            server.stats.replied(call, &frame, Instant::now());
                            frame.encode(conn.proto, &mut conn.output);
                            let _ = stream.write_all(&conn.output).await;
                            break 'serve;
                        }
                    }
                    conn.encode_ready();
                    if conn.owed.len() >= MAX_QUEUED {
                        conn.settle().await;
                    }
                    // What is read meanwhile is decoded next, in this loop.
                    if conn.output.len() >= MAX_PENDING_OUTPUT && write_reading(&mut stream, &mut conn.output, &mut input).await.is_err() {
                        break 'serve;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // Like Redis: answer what came before, report the
                    // protocol error and close.
                    conn.settle().await;
                    let frame = e.to_frame();
                    server.stats.replied(Call::Unknown, &frame, Instant::now());
                    frame.encode(conn.proto, &mut conn.output);
                    let _ = stream.write_all(&conn.output).await;
                    break 'serve;
                }
            }
        }
        conn.settle().await;
        let mut read_ahead = false;
        if !conn.output.is_empty() {
            let before = input.len();
            if write_reading(&mut stream, &mut conn.output, &mut input).await.is_err() {
                break;
            }
            read_ahead = input.len() > before;
            let grown = crate::runtime::grown(&conn.output);
            conn.output.clear();
            crate::runtime::shrink_buffer(&mut conn.output, grown);
        }
        crate::runtime::shrink_buffer(&mut input, input_grown);
        // A slow peer slows the clients that feed it.
        node.wait_for_peers().await;
        if read_ahead {
            // Read while the replies were written: decoded first (the
            // client may wait for their replies before it sends more).
            continue;
        }
        tokio::select! {
            read = stream.read_buf(&mut input) => match read {
                Ok(n) if n > 0 => {}
                _ => break,
            },
            // CLIENT KILL.
            () = client.kill.notified() => break,
        }
    }
    node.unregister(id, &tx);
}

/// Writes `output` whole, reading on meanwhile what the client sends into
/// `input` (up to `MAX_INPUT`): a client that sends its whole pipeline
/// before it reads a reply (redis-py does) would otherwise block its send
/// on this node's full receive buffer while this node blocks its write on
/// the client's, for good.
async fn write_reading(stream: &mut TcpStream, output: &mut BytesMut, input: &mut BytesMut) -> std::io::Result<()> {
    use bytes::Buf;
    let (mut rd, mut wr) = stream.split();
    // A client that closed its side still gets its replies (the next read
    // finds the end).
    let mut ended = false;
    while !output.is_empty() {
        tokio::select! {
            written = wr.write(output) => match written? {
                0 => return Err(std::io::ErrorKind::WriteZero.into()),
                n => output.advance(n),
            },
            read = rd.read_buf(input), if !ended && input.len() < MAX_INPUT => ended = read? == 0,
        }
    }
    Ok(())
}

/// The most input read ahead while replies wait to be written (Redis's
/// default `client-query-buffer-limit`).
const MAX_INPUT: usize = 1 << 30;

/// The Redis error for a request the replicas did not complete.
pub fn client_error(e: Error) -> Frame {
    match e {
        // Redis's own prefix: clients tell it from other errors.
        Error::OutOfMemory => Frame::error(format!("OOM {e}")),
        // After a failover: the key's last acknowledged write never
        // arrived; never served older (`CW.DR MISSING` lists such keys).
        Error::Lost { .. } => Frame::error(format!("LOST {e}")),
        e => Frame::error(format!("ERR {e}")),
    }
}
