//! Raft RPCs over the node's binary port.
//!
//! A member opens one TCP connection per peer member, introduces itself like
//! any binary connection (`BINARY_MAGIC`, then a `Hello::Raft(me)` frame),
//! and from then on writes one `RaftRequest` frame and reads one
//! `RaftResponse` frame at a time (`core::wire` framing, bincode). The
//! connection sits behind a tokio mutex shared by every openraft client for
//! that peer (the replication stream and the election's vote requests), so
//! requests on it never interleave.
//!
//! Failures map onto openraft's retry policy: a peer we cannot connect to is
//! `Unreachable` (openraft backs off before retrying), a connection that
//! breaks or times out mid-request is a `Network` error (retried at once, on a
//! fresh connection). A connection is only kept after a complete exchange, so
//! one abandoned half-way (timeout, or openraft dropping the request) is never
//! reused with a stale response in flight.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use causeway_core::message::{Hello, BINARY_MAGIC};
use causeway_core::ring::NodeId;
use causeway_core::wire::{put_frame, take_frame};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::TypeConfig;

type RaftNodeId = <TypeConfig as openraft::RaftTypeConfig>::NodeId;

/// How long opening a connection to a peer may take: well under an election
/// timeout, so a dead peer does not hold up the next request for long.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);

/// One Raft RPC, as sent on a `Hello::Raft` connection.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<RaftNodeId>),
    /// One chunk of a snapshot (openraft 0.9's chunked transfer).
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

/// The answer to a `RaftRequest`, variant for variant.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftResponse {
    AppendEntries(Result<AppendEntriesResponse<RaftNodeId>, RaftError<RaftNodeId>>),
    Vote(Result<VoteResponse<RaftNodeId>, RaftError<RaftNodeId>>),
    InstallSnapshot(Result<InstallSnapshotResponse<RaftNodeId>, RaftError<RaftNodeId, InstallSnapshotError>>),
}

/// Hands openraft a client per peer; clients for the same peer share one
/// connection.
pub struct Network {
    me: NodeId,
    /// The cluster secret this member proves to the others (`auth`).
    secret: Option<Arc<str>>,
    connections: BTreeMap<RaftNodeId, Arc<Mutex<Option<Connection>>>>,
}

impl Network {
    pub fn new(me: NodeId, secret: Option<Arc<str>>) -> Self {
        Network { me, secret, connections: BTreeMap::new() }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: RaftNodeId, node: &BasicNode) -> PeerClient {
        let connection = self.connections.entry(target).or_default().clone();
        PeerClient { me: self.me, secret: self.secret.clone(), target, addr: node.addr.clone(), connection }
    }
}

/// Sends Raft RPCs to one peer member.
pub struct PeerClient {
    me: NodeId,
    secret: Option<Arc<str>>,
    target: RaftNodeId,
    addr: String,
    connection: Arc<Mutex<Option<Connection>>>,
}

/// Why an RPC got no answer.
enum Failure {
    Unreachable(io::Error),
    Network(io::Error),
}

impl Failure {
    fn into_rpc<E: std::error::Error>(self) -> RPCError<RaftNodeId, BasicNode, E> {
        match self {
            Failure::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
            Failure::Network(e) => RPCError::Network(NetworkError::new(&e)),
        }
    }
}

impl PeerClient {
    /// Sends `request` and waits for its response, all within `ttl`.
    async fn call(&self, request: RaftRequest, ttl: Duration) -> Result<RaftResponse, Failure> {
        let exchange = async {
            let mut slot = self.connection.lock().await;
            // Taken out for the exchange: if this future is dropped half-way,
            // the connection goes with it.
            let mut connection = match slot.take() {
                Some(connection) => connection,
                None => Connection::open(&self.addr, self.me, self.secret.as_deref()).await.map_err(Failure::Unreachable)?,
            };
            let response = connection.exchange(&request).await.map_err(Failure::Network)?;
            *slot = Some(connection);
            Ok(response)
        };
        tokio::time::timeout(ttl, exchange).await.unwrap_or_else(|_| {
            Err(Failure::Network(io::Error::new(io::ErrorKind::TimedOut, format!("no answer from {} within {ttl:?}", self.addr))))
        })
    }

    fn mismatched<E: std::error::Error>(&self, response: RaftResponse) -> RPCError<RaftNodeId, BasicNode, E> {
        let e = io::Error::new(io::ErrorKind::InvalidData, format!("{} answered with the wrong response: {response:?}", self.addr));
        Failure::Network(e).into_rpc()
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<RaftNodeId>, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId>>> {
        match self.call(RaftRequest::AppendEntries(rpc), option.hard_ttl()).await.map_err(Failure::into_rpc)? {
            RaftResponse::AppendEntries(result) => result.map_err(|e| RemoteError::new(self.target, e).into()),
            other => Err(self.mismatched(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<RaftNodeId>, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, InstallSnapshotError>>> {
        match self.call(RaftRequest::InstallSnapshot(rpc), option.hard_ttl()).await.map_err(Failure::into_rpc)? {
            RaftResponse::InstallSnapshot(result) => result.map_err(|e| RemoteError::new(self.target, e).into()),
            other => Err(self.mismatched(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<RaftNodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<RaftNodeId>, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId>>> {
        match self.call(RaftRequest::Vote(rpc), option.hard_ttl()).await.map_err(Failure::into_rpc)? {
            RaftResponse::Vote(result) => result.map_err(|e| RemoteError::new(self.target, e).into()),
            other => Err(self.mismatched(other)),
        }
    }
}

/// An open `Hello::Raft` connection to a peer.
struct Connection {
    stream: TcpStream,
    buf: BytesMut,
}

impl Connection {
    async fn open(addr: &str, me: NodeId, secret: Option<&str>) -> io::Result<Connection> {
        let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr} took over {CONNECT_TIMEOUT:?}")))??;
        stream.set_nodelay(true)?;
        let mut hello = BytesMut::new();
        hello.extend_from_slice(&[BINARY_MAGIC]);
        put_frame(&Hello::Raft(me), &mut hello);
        stream.write_all(&hello).await?;
        if let Some(secret) = secret {
            crate::runtime::auth::prove(&mut stream, &Hello::Raft(me), secret).await?;
        }
        Ok(Connection { stream, buf: BytesMut::new() })
    }

    async fn exchange(&mut self, request: &RaftRequest) -> io::Result<RaftResponse> {
        let mut out = BytesMut::new();
        put_frame(request, &mut out);
        self.stream.write_all(&out).await?;
        loop {
            if let Some(response) = take_frame(&mut self.buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
                return Ok(response);
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

/// Hands one request to the local member and returns its response, or `None`
/// once the member has stopped (the caller then closes the connection, so the
/// peer treats this member as unreachable rather than as an answering one).
pub async fn answer(raft: &Raft<TypeConfig>, request: RaftRequest) -> Option<RaftResponse> {
    let response = match request {
        RaftRequest::AppendEntries(rpc) => RaftResponse::AppendEntries(raft.append_entries(rpc).await),
        RaftRequest::Vote(rpc) => RaftResponse::Vote(raft.vote(rpc).await),
        RaftRequest::InstallSnapshot(rpc) => RaftResponse::InstallSnapshot(raft.install_snapshot(rpc).await),
    };
    let stopped = matches!(
        response,
        RaftResponse::AppendEntries(Err(RaftError::Fatal(_)))
            | RaftResponse::Vote(Err(RaftError::Fatal(_)))
            | RaftResponse::InstallSnapshot(Err(RaftError::Fatal(_)))
    );
    (!stopped).then_some(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::error::{Fatal, SnapshotMismatch};
    use openraft::raft::InstallSnapshotRequest;
    use openraft::{CommittedLeaderId, LogId, SnapshotMeta, SnapshotSegmentId, Vote};

    /// Every message shape survives the wire's bincode framing, including the
    /// error and snapshot types the happy-path cluster tests never send.
    #[test]
    fn requests_and_responses_round_trip_on_the_wire() {
        let log_id = LogId::new(CommittedLeaderId::new(3, 1), 7);
        let snapshot = InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            meta: SnapshotMeta { last_log_id: Some(log_id), last_membership: Default::default(), snapshot_id: "3-1-7-1".into() },
            offset: 0,
            data: vec![1, 2, 3],
            done: true,
        };
        let segment = |offset| SnapshotSegmentId { id: "3-1-7-1".into(), offset };
        let mismatch = SnapshotMismatch { expect: segment(0), got: segment(3) };
        let mut wire = BytesMut::new();
        put_frame(&RaftRequest::InstallSnapshot(snapshot), &mut wire);
        put_frame(&RaftResponse::Vote(Err(RaftError::Fatal(Fatal::Stopped))), &mut wire);
        put_frame(&RaftResponse::InstallSnapshot(Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(mismatch)))), &mut wire);

        match take_frame::<RaftRequest>(&mut wire).unwrap().unwrap() {
            RaftRequest::InstallSnapshot(rpc) => {
                assert_eq!((rpc.meta.last_log_id, rpc.data, rpc.done), (Some(log_id), vec![1, 2, 3], true))
            }
            other => panic!("decoded {other:?}"),
        }
        assert!(matches!(
            take_frame::<RaftResponse>(&mut wire).unwrap().unwrap(),
            RaftResponse::Vote(Err(RaftError::Fatal(Fatal::Stopped)))
        ));
        assert!(matches!(
            take_frame::<RaftResponse>(&mut wire).unwrap().unwrap(),
            RaftResponse::InstallSnapshot(Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(_))))
        ));
        assert!(wire.is_empty());
    }
}
