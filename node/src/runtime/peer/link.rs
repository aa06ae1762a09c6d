//! The outbound link to one peer node: ordered, resent across reconnects,
//! bounded.
//!
//! Messages queue in three lanes: eager (client requests, replies,
//! eager-phase forwards, acknowledgements), lazy (lazy-phase forwards,
//! ChainReaction §3.3.1) and bulk (state transfers and the values streamed
//! after them, to a node joining a chain). The writer drains everything
//! queued, eager first, bulk last, into one buffer and writes it with one
//! syscall, so all a node owes a neighbour at a moment leaves in one
//! write.
//!
//! TCP alone loses what sat in a connection that broke (the write
//! succeeded into the kernel, the peer never read it). So each frame
//! carries a sequence number of this link's *stream* (one per sending
//! process and peer); the peer acknowledges what it took, every few
//! milliseconds, and on a new connection says where it stands
//! (`LinkReply::Resume`); the writer keeps what is not yet acknowledged and
//! resends it after a reconnect, and the peer drops frames it already has.
//! Only when the peer is a new process (another incarnation) are the
//! unacknowledged frames dropped: they were for a process that is gone, and
//! the protocols above treat that as the crash it is. A link to another
//! site keeps them for whichever node of the site it reaches next, and goes
//! where that site says what it carries is taken (`LinkReply::Redirect`:
//! its geo leader), so nothing is relayed inside the site.
//!
//! Bounds: what is queued plus what is unacknowledged is the link's
//! *backlog*. Past `SOFT_LIMIT` (not counting bulk still queued: a joining
//! node's transfers are paced by the join itself, and have no clients to
//! slow down) the node stops reading new client requests for a while
//! (`Node::wait_for_peers`), so a slow peer slows its clients instead of
//! growing memory; past `HARD_LIMIT` (a peer that is down or
//! stuck) new messages are dropped, counted (`dropped`) and logged, never
//! silently (small ones only past a reserve above it). The chain retransmits its own traffic and the coordinator
//! removes a node that stays away.

use bytes::{BufMut, Bytes, BytesMut};
use causeway_core::message::{Hello, LinkReply, Message, BINARY_MAGIC};
use causeway_core::ring::NodeId;
use causeway_core::version::SiteId;
use causeway_core::wire::{encode_message, put_frame, put_sequenced, take_frame};
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Flush at about this many bytes even if more is queued, to bound latency.
const MAX_BATCH_BYTES: usize = 256 * 1024;
/// Past this backlog, clients of this node wait before sending more.
pub const SOFT_LIMIT: usize = 32 << 20;
/// Past this backlog, new messages to the peer are dropped (and counted).
const HARD_LIMIT: usize = 256 << 20;
/// Small messages (heartbeats, leases, acknowledgements) still go past
/// `HARD_LIMIT`, up to `RESERVE` more: a peer that is alive but slow to
/// take a few large values must keep hearing this node, or the
/// coordinator removes a node that never failed.
const SMALL: usize = 64 << 10;
const RESERVE: usize = 16 << 20;
/// How long to wait before dialing a peer that could not be reached.
const REDIAL: Duration = Duration::from_millis(100);
/// A link follows at most one `LinkReply::Redirect` this often: two nodes
/// of a site that disagree for a moment about its leader (during a change)
/// would otherwise bounce it between them as fast as it can dial. One it
/// does not follow costs a relay inside the site, nothing more.
const REDIRECT_EVERY: Duration = Duration::from_millis(250);

/// The sending half of the link to one peer (the writer task has the rest).
#[derive(Clone)]
pub struct Link {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// The writer waits on it for something to send.
    wake: Notify,
    /// Clients waiting for the backlog to fall wait on it.
    room: Notify,
    /// Whether the peer is unreachable right now (connect or write failed).
    down: AtomicBool,
    /// Messages dropped because the backlog was over `HARD_LIMIT`.
    dropped: AtomicU64,
}

#[derive(Default)]
struct Queue {
    eager: VecDeque<Bytes>,
    lazy: VecDeque<Bytes>,
    bulk: VecDeque<Bytes>,
    /// Bytes in the three lanes, and in `bulk`.
    queued: usize,
    bulk_queued: usize,
    /// Bytes written but not yet acknowledged (the writer keeps them).
    unacked: usize,
    /// What was queued so far (`Link::sent`).
    sent: Sent,
}

/// Messages queued for peers, by kind (`Message::kind`), and their bytes
/// (INFO: what a replication mode costs in messages, steadier than CPU
/// time on a shared machine).
#[derive(Clone, Default)]
pub struct Sent {
    pub kinds: BTreeMap<&'static str, u64>,
    pub bytes: u64,
}

impl Sent {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Sent) {
        for (&kind, n) in &other.kinds {
            *self.kinds.entry(kind).or_default() += n;
        }
        self.bytes += other.bytes;
    }

    pub fn messages(&self) -> u64 {
        self.kinds.values().sum()
    }
}

impl Queue {
    fn backlog(&self) -> usize {
        self.queued + self.unacked
    }

    /// The backlog that holds clients back (`SOFT_LIMIT`).
    fn pressing(&self) -> usize {
        self.backlog() - self.bulk_queued
    }
}

impl Link {
    /// Starts the writer task for the peer at `addr`. `me` and the
    /// cluster secret introduce this node to the peer.
    pub fn spawn(me: NodeId, addr: String, secret: Option<Arc<str>>) -> Link {
        Link::start(|stream| Hello::Node { id: me, stream }, vec![addr], secret)
    }

    /// Starts the writer task to another site, reached at any of `addrs`
    /// (the next one when one cannot be reached); `from` is this node's site.
    pub fn to_site(from: SiteId, me: NodeId, addrs: Vec<String>, secret: Option<Arc<str>>) -> Link {
        Link::start(|stream| Hello::Site { site: from, node: me, stream }, addrs, secret)
    }

    fn start(hello: impl FnOnce(u64) -> Hello, addrs: Vec<String>, secret: Option<Arc<str>>) -> Link {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            room: Notify::new(),
            down: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
        });
        let stream = rand::random();
        let hello = hello(stream);
        let writer = Writer {
            hello,
            addrs,
            at: 0,
            secret,
            shared: shared.clone(),
            next: 1,
            unacked: VecDeque::new(),
            peer: None,
            redirect: None,
            redirected: None,
        };
        tokio::spawn(writer.run());
        Link { shared }
    }

    pub fn is_down(&self) -> bool {
        self.shared.down.load(Ordering::Relaxed)
    }

    /// Bytes queued or not yet acknowledged by the peer, but for bulk
    /// still queued: what `SOFT_LIMIT` bounds.
    pub fn backlog(&self) -> usize {
        self.shared.queue.lock().pressing()
    }

    /// Messages dropped because the peer's backlog was over the limit.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// What was queued for the peer so far.
    pub fn sent(&self) -> Sent {
        self.shared.queue.lock().sent.clone()
    }

    /// Queues `msg` for the peer. Never waits: it is called while routing
    /// a state machine's output.
    pub fn send(&self, msg: &Message) {
        let frame = Bytes::from(encode_message(msg));
        let mut q = self.shared.queue.lock();
        let limit = if frame.len() <= SMALL { HARD_LIMIT + RESERVE } else { HARD_LIMIT };
        if q.backlog() + frame.len() > limit {
            drop(q);
            if self.shared.dropped.fetch_add(1, Ordering::Relaxed).is_multiple_of(10_000) {
                tracing::warn!("a peer link is over its backlog limit ({HARD_LIMIT} bytes): dropping messages to it");
            }
            return;
        }
        q.queued += frame.len();
        *q.sent.kinds.entry(msg.kind()).or_default() += 1;
        q.sent.bytes += frame.len() as u64;
        match msg {
            Message::Forward { lazy: true, .. } => q.lazy.push_back(frame),
            Message::Transfer { .. } | Message::Values { .. } => {
                q.bulk_queued += frame.len();
                q.bulk.push_back(frame);
            }
            _ => q.eager.push_back(frame),
        }
        drop(q);
        self.shared.wake.notify_one();
    }

    /// Resolves once the backlog is at most `SOFT_LIMIT` (at once if it is).
    pub async fn room(&self) {
        loop {
            let notified = self.shared.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.backlog() <= SOFT_LIMIT {
                return;
            }
            notified.await;
        }
    }
}

/// The writer task's state, kept across connections.
struct Writer {
    /// How this node introduces itself, with this link's stream id (the
    /// peer keeps its position per stream).
    hello: Hello,
    /// Where the peer is (several: any node of another site), and which
    /// one is dialed.
    addrs: Vec<String>,
    at: usize,
    secret: Option<Arc<str>>,
    shared: Arc<Shared>,
    /// The sequence number of the next frame.
    next: u64,
    /// Written frames not yet acknowledged, ready to be written again.
    unacked: VecDeque<Batch>,
    /// The incarnation of the peer process the unacknowledged frames went to.
    peer: Option<u64>,
    /// Which of `addrs` the peer said to dial instead (`LinkReply::Redirect`),
    /// and when the link last followed such a word.
    redirect: Option<usize>,
    redirected: Option<tokio::time::Instant>,
}

impl Writer {
    async fn run(mut self) {
        loop {
            let (stream, replies) = match self.connect().await {
                Ok(s) => s,
                Err(e) => {
                    if !self.shared.down.swap(true, Ordering::Relaxed) {
                        tracing::debug!("cannot reach peer {}: {e}", self.addrs[self.at]);
                    }
                    self.at = (self.at + 1) % self.addrs.len();
                    tokio::time::sleep(REDIAL).await;
                    continue;
                }
            };
            self.shared.down.store(false, Ordering::Relaxed);
            if let Err(e) = self.serve(stream, replies).await {
                self.shared.down.store(true, Ordering::Relaxed);
                tracing::debug!("lost connection to peer {}: {e}", self.addrs[self.at]);
                self.at = self.redirect.take().unwrap_or((self.at + 1) % self.addrs.len());
            }
            if Arc::strong_count(&self.shared) == 1 {
                return; // The link was dropped.
            }
        }
    }

    /// Dials the peer, introduces this node, and learns where the peer
    /// stands; the unacknowledged frames it lacks are then written first.
    /// Also returns what the peer sent after its `Resume`.
    async fn connect(&mut self) -> std::io::Result<(TcpStream, BytesMut)> {
        let mut stream = TcpStream::connect(&self.addrs[self.at]).await?;
        stream.set_nodelay(true)?;
        let hello = self.hello.clone();
        let mut buf = BytesMut::new();
        buf.put_u8(BINARY_MAGIC);
        put_frame(&hello, &mut buf);
        stream.write_all(&buf).await?;
        if let Some(secret) = &self.secret {
            crate::runtime::auth::prove(&mut stream, &hello, secret).await?;
        }
        buf.clear();
        let resume = tokio::time::timeout(Duration::from_secs(5), read_reply(&mut stream, &mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer to the hello"))??;
        let LinkReply::Resume { incarnation, last } = resume else {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "expected Resume"));
        };
        // Another site's link is to the site, not to one process: any of
        // its nodes takes what another did not (geo-replication is resent
        // and deduplicated by stream positions above this).
        let to_site = matches!(self.hello, Hello::Site { .. });
        if self.peer.is_some_and(|p| p != incarnation) && !to_site {
            // A new process: what the old one did not take is moot.
            let lost: usize = self.unacked.drain(..).map(|b| b.bytes.len()).sum();
            self.shared.queue.lock().unacked -= lost;
        }
        self.peer = Some(incarnation);
        self.acked(last);
        for batch in &self.unacked {
            stream.write_all(&batch.bytes).await?;
        }
        Ok((stream, buf))
    }

    /// Sends what is queued and takes acknowledgements until the
    /// connection breaks.
    async fn serve(&mut self, stream: TcpStream, mut replies: BytesMut) -> std::io::Result<()> {
        self.take_replies(&mut replies)?;
        let (mut rd, mut wr) = stream.into_split();
        let mut batch = BytesMut::with_capacity(64 * 1024);
        loop {
            let first = self.next;
            if self.fill(&mut batch) {
                wr.write_all(&batch).await?;
                let grown = crate::runtime::grown(&batch);
                let bytes = batch.split().freeze();
                // Kept until acknowledged: the next batch must not reclaim
                // a large one's allocation whole once it is.
                crate::runtime::shrink_buffer(&mut batch, grown);
                self.shared.queue.lock().unacked += bytes.len();
                self.unacked.push_back(Batch { first, count: self.next - first, bytes });
                continue;
            }
            tokio::select! {
                biased;
                n = rd.read_buf(&mut replies) => {
                    if n? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    self.take_replies(&mut replies)?;
                }
                _ = self.shared.wake.notified() => {}
            }
        }
    }

    /// Acts on the peer's replies in `replies`; an error ends the
    /// connection.
    fn take_replies(&mut self, replies: &mut BytesMut) -> std::io::Result<()> {
        while let Some(reply) = take_frame::<LinkReply>(replies).map_err(invalid)? {
            match reply {
                LinkReply::Ack(last) => self.acked(last),
                LinkReply::Resume { .. } => return Err(invalid("a second Resume")),
                // Only to an address it was given: one the peer knows by
                // another name may not be reachable from here.
                LinkReply::Redirect(addr) => match self.addrs.iter().position(|a| *a == addr) {
                    Some(i) if i != self.at && self.redirected.is_none_or(|t| t.elapsed() >= REDIRECT_EVERY) => {
                        self.redirect = Some(i);
                        self.redirected = Some(tokio::time::Instant::now());
                        return Err(std::io::Error::other(format!("redirected to {addr}")));
                    }
                    _ => {}
                },
            }
        }
        Ok(())
    }

    /// Moves what is queued, eager first, bulk last, into `batch` as
    /// sequenced frames (up to about `MAX_BATCH_BYTES`). Whether there was
    /// anything.
    fn fill(&mut self, batch: &mut BytesMut) -> bool {
        let mut q = self.shared.queue.lock();
        while batch.len() < MAX_BATCH_BYTES {
            let frame = match q.eager.pop_front().or_else(|| q.lazy.pop_front()) {
                Some(frame) => frame,
                None => match q.bulk.pop_front() {
                    Some(frame) => {
                        q.bulk_queued -= frame.len();
                        frame
                    }
                    None => break,
                },
            };
            q.queued -= frame.len();
            put_sequenced(self.next, &frame, batch);
            self.next += 1;
        }
        !batch.is_empty()
    }

    /// The peer has every frame up to `last`: forget them.
    fn acked(&mut self, last: u64) {
        let mut freed = 0;
        while let Some(batch) = self.unacked.front_mut() {
            if batch.first + batch.count - 1 <= last {
                freed += self.unacked.pop_front().expect("front exists").bytes.len();
            } else {
                freed += batch.skip(last);
                break;
            }
        }
        if freed > 0 {
            let mut q = self.shared.queue.lock();
            q.unacked -= freed;
            if q.pressing() <= SOFT_LIMIT {
                self.shared.room.notify_waiters();
            }
        }
    }
}

/// Consecutive frames written in one go.
struct Batch {
    /// The sequence number of the first frame.
    first: u64,
    count: u64,
    bytes: Bytes,
}

impl Batch {
    /// Drops the frames up to `last` from the front; the bytes freed.
    fn skip(&mut self, last: u64) -> usize {
        let mut at = 0;
        while self.first <= last {
            let len = u32::from_le_bytes(self.bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            at += 4 + len;
            self.first += 1;
            self.count -= 1;
        }
        self.bytes = self.bytes.slice(at..);
        at
    }
}

async fn read_reply(stream: &mut TcpStream, buf: &mut BytesMut) -> std::io::Result<LinkReply> {
    loop {
        if let Some(r) = take_frame::<LinkReply>(buf).map_err(invalid)? {
            return Ok(r);
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

fn invalid(e: impl ToString) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

/// The receiving side of one peer's stream: which frames it has taken.
/// Shared by the connections that stream arrives on (a new one may open
/// before the old one is seen to break).
#[derive(Default)]
pub struct Inbound {
    stream: AtomicU64,
    last: AtomicU64,
}

impl Inbound {
    /// The position for `stream`, restarting from zero when the peer opened
    /// a new stream (it is a new process).
    pub fn open(&self, stream: u64) -> u64 {
        if self.stream.swap(stream, Ordering::AcqRel) != stream {
            self.last.store(0, Ordering::Release);
        }
        self.last.load(Ordering::Acquire)
    }

    /// Whether frame `seq` is new (and is now taken); a resent frame that
    /// was taken already is not.
    pub fn take(&self, seq: u64) -> bool {
        self.last.fetch_max(seq, Ordering::AcqRel) < seq
    }

    pub fn last(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use causeway_core::message::OpId;
    use tokio::net::TcpListener;

    fn msg(i: u64) -> Message {
        Message::Stable { op: OpId { client: 1, seq: i } }
    }

    /// Reads a hello, answers `Resume`, then returns the sequence numbers
    /// and messages that arrive, until `n` have arrived.
    async fn accept(listener: &TcpListener, incarnation: u64, last: u64, n: usize) -> (TcpStream, Vec<(u64, Message)>) {
        accept_then(listener, incarnation, last, None, n).await
    }

    /// `accept`, with `then` in the same write as the `Resume`.
    async fn accept_then(
        listener: &TcpListener,
        incarnation: u64,
        last: u64,
        then: Option<LinkReply>,
        n: usize,
    ) -> (TcpStream, Vec<(u64, Message)>) {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = BytesMut::new();
        let mut magic = [0u8];
        s.read_exact(&mut magic).await.unwrap();
        let hello: Hello = loop {
            if let Some(h) = take_frame(&mut buf).unwrap() {
                break h;
            }
            s.read_buf(&mut buf).await.unwrap();
        };
        assert!(matches!(hello, Hello::Node { id: 7, .. } | Hello::Site { node: 7, .. }));
        let mut out = BytesMut::new();
        put_frame(&LinkReply::Resume { incarnation, last }, &mut out);
        if let Some(then) = then {
            put_frame(&then, &mut out);
        }
        s.write_all(&out).await.unwrap();
        let mut got = Vec::new();
        while got.len() < n {
            while let Some(f) = causeway_core::wire::take_sequenced(&mut buf).unwrap() {
                got.push(f);
            }
            if got.len() < n {
                assert!(s.read_buf(&mut buf).await.unwrap() > 0);
            }
        }
        (s, got)
    }

    #[tokio::test]
    async fn frames_a_broken_connection_lost_are_resent_and_acked_ones_are_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let link = Link::spawn(7, listener.local_addr().unwrap().to_string(), None);
        for i in 1..=5 {
            link.send(&msg(i));
        }
        let (mut first, got) = accept(&listener, 42, 0, 5).await;
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        // Acknowledge two, then the connection breaks with three unread.
        let mut out = BytesMut::new();
        put_frame(&LinkReply::Ack(2), &mut out);
        first.write_all(&out).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        link.send(&msg(6));
        // The same process took frame 3 before the break: it says so.
        let (_second, got) = accept(&listener, 42, 3, 3).await;
        assert_eq!(got, vec![(4, msg(4)), (5, msg(5)), (6, msg(6))], "resent from where the peer stands, then new frames");
    }

    #[tokio::test]
    async fn a_new_peer_process_does_not_get_frames_meant_for_the_old_one() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let link = Link::spawn(7, listener.local_addr().unwrap().to_string(), None);
        link.send(&msg(1));
        let (first, _) = accept(&listener, 42, 0, 1).await;
        drop(first);
        // Wait until the writer has seen the break, so the next message
        // goes on the next connection.
        while !link.is_down() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        link.send(&msg(2));
        let (_second, got) = accept(&listener, 43, 0, 1).await;
        assert_eq!(got, vec![(2, msg(2))]);
        assert_eq!(link.backlog(), link.shared.queue.lock().unacked, "nothing queued");
    }

    /// The next frame on `s`.
    async fn next_frame(s: &mut TcpStream) -> (u64, Message) {
        let mut buf = BytesMut::new();
        loop {
            if let Some(f) = causeway_core::wire::take_sequenced(&mut buf).unwrap() {
                return f;
            }
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "still connected");
        }
    }

    #[tokio::test]
    async fn a_site_link_goes_where_the_site_redirects_it_and_keeps_what_was_not_taken() {
        let (a, b) = (TcpListener::bind("127.0.0.1:0").await.unwrap(), TcpListener::bind("127.0.0.1:0").await.unwrap());
        let addr = |l: &TcpListener| l.local_addr().unwrap().to_string();
        let (addr_a, addr_b) = (addr(&a), addr(&b));
        let link = Link::to_site(1, 7, vec![addr_a.clone(), addr_b.clone()], None);
        let redirect = |to: &str| {
            let mut out = BytesMut::new();
            put_frame(&LinkReply::Redirect(to.to_string()), &mut out);
            out
        };
        for i in 1..=3 {
            link.send(&msg(i));
        }
        // The first node of the site takes the frames, acknowledges none,
        // and says where the site takes them.
        let (mut at_a, got) = accept(&a, 42, 0, 3).await;
        assert_eq!(got.len(), 3);
        at_a.write_all(&redirect(&addr_b)).await.unwrap();
        // Another process of the site gets what the first did not take.
        let (mut at_b, got) = tokio::time::timeout(Duration::from_secs(5), accept(&b, 43, 0, 3)).await.expect("redirected");
        assert_eq!(got, vec![(1, msg(1)), (2, msg(2)), (3, msg(3))]);
        // An address the link was not given is not dialed.
        at_b.write_all(&redirect("192.0.2.1:7000")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        link.send(&msg(4));
        assert_eq!(next_frame(&mut at_b).await, (4, msg(4)));
        // Sent back to the first node once the last redirect is old enough
        // to follow; that node at once sends it back (in the same write as
        // its Resume), too soon: the link stays.
        tokio::time::sleep(REDIRECT_EVERY).await;
        let mut out = BytesMut::new();
        put_frame(&LinkReply::Ack(4), &mut out);
        out.extend_from_slice(&redirect(&addr_a));
        at_b.write_all(&out).await.unwrap();
        let (mut at_a, got) = accept_then(&a, 42, 0, Some(LinkReply::Redirect(addr_b.clone())), 0).await;
        assert!(got.is_empty());
        link.send(&msg(5));
        assert_eq!(next_frame(&mut at_a).await, (5, msg(5)), "no bouncing between two nodes that disagree");
    }

    #[tokio::test]
    async fn a_peer_that_does_not_acknowledge_holds_clients_back_until_it_does() {
        use causeway_core::message::{Change, Put};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let link = Link::spawn(7, listener.local_addr().unwrap().to_string(), None);
        let big = |i| {
            Message::Put(Box::new(Put {
                op: OpId { client: 1, seq: i },
                epoch: 1,
                partition: 0,
                key: Bytes::from_static(b"k"),
                change: Change::set(Bytes::from(vec![0u8; 1 << 20])),
                past: Default::default(),
                ack_at: 1,
                write: i,
                deps: Vec::new(),
                done_below: i,
            }))
        };
        let n = (SOFT_LIMIT >> 20) as u64 + 4;
        for i in 1..=n {
            link.send(&big(i));
        }
        // The peer reads everything but acknowledges nothing yet.
        let (mut peer, _) = accept(&listener, 42, 0, n as usize).await;
        assert!(link.backlog() > SOFT_LIMIT);
        assert!(tokio::time::timeout(Duration::from_millis(100), link.room()).await.is_err(), "room while over the limit");
        let mut out = BytesMut::new();
        put_frame(&LinkReply::Ack(n), &mut out);
        peer.write_all(&out).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), link.room()).await.expect("room once acknowledged");
        assert_eq!(link.backlog(), 0);
    }

    #[tokio::test]
    async fn values_streamed_to_a_joining_node_do_not_hold_clients_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        // The peer never answers: everything stays queued.
        let link = Link::spawn(7, listener.local_addr().unwrap().to_string(), None);
        let chunk = |i: u64| Message::Values {
            partition: 3,
            values: vec![(
                (Bytes::from(format!("k{i}")), causeway_core::hlc::Timestamp::new(i, 0), 0),
                Some(Bytes::from(vec![0u8; 1 << 20])),
            )],
        };
        for i in 1..=(SOFT_LIMIT >> 20) as u64 + 4 {
            link.send(&chunk(i));
        }
        assert!(link.shared.queue.lock().backlog() > SOFT_LIMIT, "all of it queued");
        assert!(link.backlog() <= SOFT_LIMIT);
        tokio::time::timeout(Duration::from_millis(100), link.room()).await.expect("clients go on");
    }

    #[tokio::test]
    async fn a_full_link_still_takes_small_messages() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        // The peer never answers: everything stays queued.
        let link = Link::spawn(7, listener.local_addr().unwrap().to_string(), None);
        let big = |i: u64| Message::Values {
            partition: 3,
            values: vec![(
                (Bytes::from(format!("k{i}")), causeway_core::hlc::Timestamp::new(i, 0), 0),
                Some(Bytes::from(vec![0u8; 32 << 20])),
            )],
        };
        for i in 0..(HARD_LIMIT >> 25) as u64 + 1 {
            link.send(&big(i));
        }
        let dropped = link.dropped();
        assert!(dropped >= 1, "large messages past the limit are dropped");
        // As a heartbeat or an acknowledgement would.
        let small = Message::Flush { op: OpId { client: 1, seq: 1 } };
        link.send(&small);
        assert_eq!(link.dropped(), dropped, "a small message goes on");
        assert_eq!(link.sent().kinds.get("Flush"), Some(&1));
    }

    #[test]
    fn the_inbound_side_takes_each_frame_once_per_stream() {
        let inbound = Inbound::default();
        assert_eq!(inbound.open(9), 0);
        assert!(inbound.take(1) && inbound.take(2));
        assert_eq!(inbound.open(9), 2, "a reconnect of the same stream resumes");
        assert!(!inbound.take(2), "a resent frame is dropped");
        assert!(inbound.take(3));
        assert_eq!(inbound.open(10), 0, "a new stream (a restarted peer) starts over");
        assert!(inbound.take(1));
    }

    #[test]
    fn sequenced_frames_decode_as_pairs() {
        let mut out = BytesMut::new();
        put_sequenced(300, &encode_message(&msg(4)), &mut out);
        assert_eq!(causeway_core::wire::take_sequenced(&mut out).unwrap(), Some((300, msg(4))));
    }
}
