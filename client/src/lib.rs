//! The native Causeway client library.
//!
//! ChainReaction §3.2.2's client library: it keeps the session metadata
//! (per-key version and chain index, the accessed-objects list) itself, picks
//! the replica each request may go to, and talks to that node directly over
//! the binary protocol, so there is no proxy hop. It connects to every node
//! of the site (replies to a write come from chain position k-1, not from the
//! head it was sent to) and refreshes the partition map when a node answers
//! "not responsible".
//!
//! ```no_run
//! # async fn demo() -> Result<(), causeway_client::Error> {
//! let mut c = causeway_client::Client::connect("127.0.0.1:6380").await?;
//! c.put(b"k", b"v").await?;
//! assert_eq!(c.get(b"k").await?.as_deref(), Some(&b"v"[..]));
//! # Ok(()) }
//! ```

use ahash::AHashMap;
use bytes::{Bytes, BytesMut};
use causeway_core::driver::{Consistency, Driver, Progress, Request, Response, Sends, Transport};
use causeway_core::error::Error as CoreError;
use causeway_core::message::{Change, ClientId, Greeting, Hello, Message, OpId, Welcome, BINARY_MAGIC};
use causeway_core::ring::{NodeId, Topology};
use causeway_core::session::Session;
use causeway_core::wire::{put_frame, put_message, take_frame, take_message};
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// What can go wrong.
#[derive(Debug)]
pub enum Error {
    /// Could not reach a node.
    Connect(String),
    /// The site did not complete the request.
    Request(CoreError),
    /// A node answered something this client does not understand.
    Protocol(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connect(e) => write!(f, "cannot connect: {e}"),
            Error::Request(e) => write!(f, "{e}"),
            Error::Protocol(e) => write!(f, "protocol error: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        Error::Request(e)
    }
}

/// The op sequence number of the partition map requests the client sends
/// when the driver asks for a recheck (the driver's own never get this
/// high).
const PROBE: u64 = u64::MAX;

/// How long a request may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// What the connections' reader tasks report.
enum Incoming {
    Reply(Message),
    /// The connection to this node closed.
    Closed(Option<NodeId>),
}

/// A session with one Causeway site.
pub struct Client {
    driver: Driver,
    writers: AHashMap<NodeId, OwnedWriteHalf>,
    password: Option<String>,
    replies: mpsc::UnboundedReceiver<Incoming>,
    tx: mpsc::UnboundedSender<Incoming>,
    /// The driver's responses, in request order.
    responses: VecDeque<Result<Response, CoreError>>,
    /// Requests started whose responses were not taken: a call dropped
    /// before it finished (a timeout around it) leaves its request running,
    /// and the next call skips its response.
    unanswered: usize,
    out: BytesMut,
}

impl Client {
    /// Connects to the site that the node at `addr` belongs to.
    pub async fn connect(addr: &str) -> Result<Client, Error> {
        Client::connect_with_password(addr, None).await
    }

    /// `connect`, for sites started with `--requirepass`.
    pub async fn connect_with_password(addr: &str, password: Option<&str>) -> Result<Client, Error> {
        let id: ClientId = (rand::random::<u64>() & ((1 << 48) - 1)).max(1);
        let (tx, replies) = mpsc::unbounded_channel();
        let (mut seed, greeting) = open(addr, None, id, password, tx.clone()).await?;
        let mut out = BytesMut::new();
        put_message(&Message::GetTopology { op: OpId { client: id, seq: 0 } }, &mut out);
        seed.write_all(&out).await.map_err(|e| Error::Connect(format!("{addr}: {e}")))?;
        out.clear();
        let mut driver = Driver::new(id, Arc::new(placeholder()), None, DEFAULT_TIMEOUT.as_millis() as u64);
        driver.set_noted(greeting.noted);
        let mut client = Client {
            driver,
            writers: AHashMap::new(),
            password: password.map(str::to_string),
            replies,
            tx,
            responses: VecDeque::new(),
            unanswered: 0,
            out,
        };
        let topology = match tokio::time::timeout(DEFAULT_TIMEOUT, client.replies.recv()).await {
            Ok(Some(Incoming::Reply(Message::TopologyIs { topology, .. }))) => topology,
            Ok(_) => return Err(Error::Protocol(format!("{addr} did not send the topology"))),
            Err(_) => return Err(Error::Connect(format!("{addr} did not answer"))),
        };
        // The seed's connection was opened before its node id was known, so
        // its close would not say which node went: it served only the map,
        // and every node (the seed too) gets a connection of its own.
        drop(seed);
        client.driver.set_topology(Arc::new(*topology));
        client.connect_all().await?;
        Ok(client)
    }

    async fn connect_all(&mut self) -> Result<(), Error> {
        let nodes = self.driver.topology().nodes.clone();
        for n in nodes {
            if !self.writers.contains_key(&n.id) {
                // A node that is down is skipped; requests that need it time out.
                if let Ok((w, _)) = open(&n.addr, Some(n.id), self.driver.id(), self.password.as_deref(), self.tx.clone()).await {
                    self.writers.insert(n.id, w);
                }
            }
        }
        if self.writers.is_empty() {
            return Err(Error::Connect("no node of the site is reachable".into()));
        }
        Ok(())
    }

    pub fn topology(&self) -> &Arc<Topology> {
        self.driver.topology()
    }

    pub fn set_consistency(&mut self, c: Consistency) {
        self.driver.set_consistency(c);
    }

    /// The session's consistency level.
    pub fn consistency(&self) -> Consistency {
        self.driver.consistency()
    }

    pub fn set_timeout(&mut self, t: Duration) {
        self.driver.set_timeout(t.as_millis() as u64);
    }

    /// The session's causal metadata, to resume elsewhere.
    pub fn session(&self) -> &Session {
        self.driver.session()
    }

    /// Takes over session `s` at once (exported in this site: nothing to
    /// wait for).
    pub fn set_session(&mut self, s: Session) {
        self.driver.set_session(s);
    }

    /// Takes over session `s`, exported maybe in another site, once this
    /// site has applied the other sites' writes it saw (as `CW.SESSION
    /// RESUME` does); `Error::Behind` if it has not within the timeout.
    pub async fn resume(&mut self, s: Session) -> Result<(), Error> {
        self.run(Request::Resume(Box::new(s))).await.map(|_| ())
    }

    /// Runs one request to completion at the session's consistency level.
    pub async fn run(&mut self, request: Request) -> Result<Response, Error> {
        let level = self.driver.consistency();
        self.run_at(request, level).await
    }

    /// Runs one request to completion at `level`, for this request only.
    /// The driver decides deadlines, retries and when to look for a new
    /// map; this only moves messages.
    pub async fn run_at(&mut self, request: Request, level: Consistency) -> Result<Response, Error> {
        let epoch = self.driver.topology().epoch;
        let mut earlier = self.unanswered;
        self.unanswered += 1;
        let progress = self.driver.start_at(request, level, now_ms());
        self.apply(progress).await;
        let result = loop {
            match self.responses.pop_front() {
                Some(response) => {
                    self.unanswered -= 1;
                    if earlier == 0 {
                        break response;
                    }
                    earlier -= 1;
                }
                None => self.wait().await,
            }
        };
        if self.driver.topology().epoch != epoch {
            self.connect_all().await?;
        }
        Ok(result?)
    }

    /// Waits for a reply, a closed connection or the driver's next
    /// wake-up, and hands it to the driver.
    async fn wait(&mut self) {
        let Some(wake_ms) = self.driver.next_wake() else { return };
        let sleep = Duration::from_millis(wake_ms.saturating_sub(now_ms()));
        if let Ok(incoming) = tokio::time::timeout(sleep, self.replies.recv()).await {
            let progress = match incoming.expect("the client holds a sender") {
                Incoming::Reply(msg) => self.driver.on_message(msg, now_ms()),
                Incoming::Closed(Some(node)) => {
                    // Reconnect next time; reads waiting on it go elsewhere now.
                    self.writers.remove(&node);
                    self.driver.unreachable(node, now_ms())
                }
                Incoming::Closed(None) => Progress::default(),
            };
            self.apply(progress).await;
        }
        if self.driver.next_wake().is_some_and(|at| now_ms() >= at) {
            let progress = self.driver.tick(now_ms());
            self.apply(progress).await;
        }
    }

    /// Does what the driver asked (`Driver::pump`, through `Later`): sends
    /// its messages, connecting first where needed (a node that cannot be
    /// reached is reported, once per call, and what that produces is done
    /// too), asks a node for the current map on a recheck (its answer
    /// reaches the driver as a reply), and keeps the responses in order.
    async fn apply(&mut self, progress: Progress) {
        let mut work = VecDeque::from([progress]);
        let mut failed: Vec<NodeId> = Vec::new();
        while let Some(p) = work.pop_front() {
            let mut later = Later { sends: Vec::new(), probe: false, failed: &failed };
            self.driver.pump(p, now_ms(), &mut later, &mut self.responses);
            let Later { sends, probe, .. } = later;
            if probe {
                self.probe().await;
            }
            for (node, msg) in sends {
                if !self.deliver(node, &msg).await && !failed.contains(&node) {
                    failed.push(node);
                    work.push_back(self.driver.undeliverable(node, now_ms()));
                }
            }
        }
    }

    /// Asks one connected node for the current partition map.
    async fn probe(&mut self) {
        let id = self.driver.id();
        let Some((&node, w)) = self.writers.iter_mut().next() else { return };
        self.out.clear();
        put_message(&Message::GetTopology { op: OpId { client: id, seq: PROBE } }, &mut self.out);
        if w.write_all(&self.out).await.is_err() {
            self.writers.remove(&node);
        }
    }

    /// Sends `msg` to `node`, connecting first if needed; false if it could
    /// not be sent.
    async fn deliver(&mut self, node: NodeId, msg: &Message) -> bool {
        if !self.writers.contains_key(&node) {
            if let Some(addr) = self.driver.topology().node(node).map(|n| n.addr.clone()) {
                if let Ok((w, _)) = open(&addr, Some(node), self.driver.id(), self.password.as_deref(), self.tx.clone()).await {
                    self.writers.insert(node, w);
                }
            }
        }
        self.out.clear();
        put_message(msg, &mut self.out);
        let ok = match self.writers.get_mut(&node) {
            Some(w) => w.write_all(&self.out).await.is_ok(),
            None => false,
        };
        if !ok {
            self.writers.remove(&node);
        }
        ok
    }

    /// GET: the value, if any.
    pub async fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, Error> {
        Ok(self.get_at(key).await?.0)
    }

    /// GET, also saying which chain position served it.
    pub async fn get_at(&mut self, key: &[u8]) -> Result<(Option<Bytes>, u8), Error> {
        match self.run(Request::Get(Bytes::copy_from_slice(key))).await? {
            Response::Read { value, chain_index, .. } => Ok((value, chain_index)),
            other => Err(Error::Protocol(format!("GET answered {other:?}"))),
        }
    }

    /// PUT (SET without options).
    pub async fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let request = Request::Put { key: Bytes::copy_from_slice(key), change: Change::set(Bytes::copy_from_slice(value)) };
        self.run(request).await.map(|_| ())
    }

    /// DELETE: whether the key existed.
    pub async fn delete(&mut self, key: &[u8]) -> Result<bool, Error> {
        let request = Request::Put { key: Bytes::copy_from_slice(key), change: Change::delete() };
        Ok(matches!(self.run(request).await?, Response::Written(true)))
    }

    /// A get-transaction: a causally consistent snapshot of `keys`.
    pub async fn get_transaction(&mut self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>, Error> {
        match self.run(Request::MultiGet(keys.iter().map(|k| Bytes::copy_from_slice(k)).collect())).await? {
            Response::Values(v) => Ok(v),
            other => Err(Error::Protocol(format!("get-transaction answered {other:?}"))),
        }
    }

    /// Live keys in the site.
    pub async fn count(&mut self) -> Result<u64, Error> {
        match self.run(Request::Count).await? {
            Response::Count(k) => Ok(k.keys),
            other => Err(Error::Protocol(format!("count answered {other:?}"))),
        }
    }

    /// Fetches the current partition map.
    pub async fn refresh_topology(&mut self) -> Result<Arc<Topology>, Error> {
        match self.run(Request::Topology).await? {
            Response::Topology(t) => Ok(t),
            other => Err(Error::Protocol(format!("topology answered {other:?}"))),
        }
    }
}

/// The client's `Transport`: connecting and writing are asynchronous, so
/// what the driver sends is kept for `Client::apply` to send once the
/// driver is done (a node that fails then is reported to the driver
/// afterwards); a node that already failed in this call is undeliverable
/// at once.
struct Later<'a> {
    sends: Vec<(NodeId, Message)>,
    probe: bool,
    failed: &'a [NodeId],
}

impl Transport for Later<'_> {
    fn send(&mut self, batch: Sends, _replies: &mut Vec<Message>, undeliverable: &mut Vec<NodeId>) {
        for (node, msg) in batch {
            if self.failed.contains(&node) {
                undeliverable.push(node);
            } else {
                self.sends.push((node, msg));
            }
        }
    }

    fn recheck(&mut self) -> (Option<Arc<Topology>>, Vec<NodeId>) {
        self.probe = true;
        (None, Vec::new())
    }
}

/// An empty map used only until the seed node answers.
fn placeholder() -> Topology {
    Topology {
        epoch: 0,
        shape: causeway_core::ring::Shape { partitions: 1, replicas: 1, k: 1, coding: None },
        nodes: Vec::new(),
        chains: Vec::new(),
        admitted: Default::default(),
        returning: Vec::new(),
    }
}

/// Opens a binary connection to a node and starts reading its replies.
async fn open(
    addr: &str,
    node: Option<NodeId>,
    id: ClientId,
    password: Option<&str>,
    tx: mpsc::UnboundedSender<Incoming>,
) -> Result<(OwnedWriteHalf, Greeting), Error> {
    let stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .map_err(|_| Error::Connect(format!("{addr}: timed out")))?
        .map_err(|e| Error::Connect(format!("{addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut hello = BytesMut::new();
    hello.extend_from_slice(&[BINARY_MAGIC]);
    put_frame(&Hello::Client { id, password: password.map(str::to_string) }, &mut hello);
    wr.write_all(&hello).await.map_err(|e| Error::Connect(format!("{addr}: {e}")))?;
    // Wait for the node to register us: replies to our requests may come
    // from it as soon as we send anything anywhere.
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let welcome = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            if let Some(w) = take_frame::<Welcome>(&mut buf).map_err(|e| Error::Protocol(e.to_string()))? {
                return Ok(w);
            }
            match rd.read_buf(&mut buf).await {
                Ok(n) if n > 0 => {}
                _ => return Err(Error::Connect(format!("{addr} closed the connection"))),
            }
        }
    })
    .await
    .map_err(|_| Error::Connect(format!("{addr}: no answer to the handshake")))??;
    let greeting = welcome.map_err(|e| Error::Connect(format!("{addr}: {e}")))?;
    tokio::spawn(async move {
        loop {
            loop {
                match take_message(&mut buf) {
                    Ok(Some(m)) => {
                        if tx.send(Incoming::Reply(m)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => {
                        let _ = tx.send(Incoming::Closed(node));
                        return;
                    }
                }
            }
            match rd.read_buf(&mut buf).await {
                Ok(n) if n > 0 => {}
                _ => {
                    let _ = tx.send(Incoming::Closed(node));
                    return;
                }
            }
        }
    });
    Ok((wr, greeting))
}
