//! Inter-node authentication: a node (or coordinator member) that opens a
//! binary connection as `Hello::Node` or `Hello::Raft` proves it knows the
//! cluster secret (`--cluster-secret`) before any of its frames is
//! accepted. The acceptor sends a random challenge; the dialer answers with
//! HMAC-SHA256(secret, "causeway-peer-v1" | its hello | the challenge). The
//! secret never crosses the wire, and a recorded answer is worth nothing
//! for another challenge. Without a secret (a node started without one
//! warns at start) peer connections are accepted as before.
//!
//! Native clients prove `--requirepass` in their own hello (see `peer`);
//! TLS would wrap the stream below all of this.

use bytes::BytesMut;
use causeway_core::message::Hello;
use causeway_core::wire::{encode, put_frame, take_frame};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long the handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The handshake's frames.
#[derive(Debug, Serialize, Deserialize)]
enum Auth {
    Challenge([u8; 32]),
    Proof([u8; 32]),
}

fn proof(secret: &str, hello: &Hello, nonce: &[u8; 32]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(b"causeway-peer-v1");
    mac.update(&encode(hello));
    mac.update(nonce);
    mac
}

/// Reads one frame of type `T` into `buf` from `rd`.
async fn read_frame<T: serde::de::DeserializeOwned>(rd: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) -> io::Result<T> {
    loop {
        if let Some(frame) = take_frame(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
            return Ok(frame);
        }
        if rd.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// The dialer's side, after it sent `hello`: answers the challenge.
pub async fn prove(stream: &mut (impl AsyncRead + AsyncWrite + Unpin), hello: &Hello, secret: &str) -> io::Result<()> {
    let exchange = async {
        let mut buf = BytesMut::new();
        let Auth::Challenge(nonce) = read_frame(stream, &mut buf).await? else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "expected a challenge"));
        };
        let mac: [u8; 32] = proof(secret, hello, &nonce).finalize().into_bytes().into();
        let mut out = BytesMut::new();
        put_frame(&Auth::Proof(mac), &mut out);
        stream.write_all(&out).await
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange).await.map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// The acceptor's side, after it read `hello`: challenges the dialer and
/// checks its proof. `buf` holds what was read past the hello (and keeps
/// what is read past the proof).
pub async fn verify(
    rd: &mut (impl AsyncRead + Unpin),
    wr: &mut (impl AsyncWrite + Unpin),
    buf: &mut BytesMut,
    hello: &Hello,
    secret: &str,
) -> Result<(), String> {
    let nonce: [u8; 32] = rand::random();
    let exchange = async {
        let mut out = BytesMut::new();
        put_frame(&Auth::Challenge(nonce), &mut out);
        wr.write_all(&out).await.map_err(|e| e.to_string())?;
        match read_frame(rd, buf).await.map_err(|e| e.to_string())? {
            Auth::Proof(mac) => proof(secret, hello, &nonce).verify_slice(&mac).map_err(|_| "wrong cluster secret".to_string()),
            Auth::Challenge(_) => Err("expected a proof".into()),
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange).await.map_err(|_| "no proof in time".to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn handshake(dialer_secret: &'static str, acceptor_secret: &str) -> Result<(), String> {
        let (mut a, b) = tokio::io::duplex(1024);
        let hello = Hello::Node { id: 3, stream: 1 };
        let dial = tokio::spawn(async move { prove(&mut a, &Hello::Node { id: 3, stream: 1 }, dialer_secret).await });
        let (mut rd, mut wr) = tokio::io::split(b);
        let mut buf = BytesMut::new();
        let verdict = verify(&mut rd, &mut wr, &mut buf, &hello, acceptor_secret).await;
        let _ = dial.await;
        verdict
    }

    #[tokio::test]
    async fn the_right_secret_passes_and_a_wrong_one_does_not() {
        assert_eq!(handshake("s3cret", "s3cret").await, Ok(()));
        assert_eq!(handshake("guess", "s3cret").await, Err("wrong cluster secret".into()));
    }

    #[test]
    fn a_proof_is_bound_to_the_hello_and_the_challenge() {
        let n1 = [1u8; 32];
        let p = |hello: &Hello, nonce: &[u8; 32]| -> Vec<u8> { proof("k", hello, nonce).finalize().into_bytes().to_vec() };
        assert_ne!(p(&Hello::Node { id: 1, stream: 1 }, &n1), p(&Hello::Node { id: 2, stream: 1 }, &n1), "another node id");
        assert_ne!(p(&Hello::Node { id: 1, stream: 1 }, &n1), p(&Hello::Raft(1), &n1), "another role");
        assert_ne!(p(&Hello::Node { id: 1, stream: 1 }, &n1), p(&Hello::Node { id: 1, stream: 1 }, &[2u8; 32]), "another challenge");
    }
}
