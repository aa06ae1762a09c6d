//! `causeway-resp`: RESP2/RESP3 frames, an incremental zero-copy parser that
//! enforces limits, and an encoder. No I/O.
//!
//! * Servers read bytes into a [`bytes::BytesMut`] and call [`parse_request`]
//!   (or, for long pipelines of huge requests, a [`RequestDecoder`]) until it
//!   returns `Ok(None)`; each request is a `Vec<Bytes>` of arguments that are
//!   slices of the read buffer (no copy).
//! * Replies are built with [`Frame::encode`] or the `encode_*` helpers,
//!   which append the wire bytes for the connection's [`Protocol`].
//! * Clients encode commands with [`encode_request`] and read replies with
//!   [`parse_frame`] / [`FrameDecoder`].
//!
//! ```
//! use bytes::BytesMut;
//! use causeway_resp::{encode_request, parse_frame, parse_request, Frame, Limits, Protocol};
//!
//! let limits = Limits::default();
//! // Server side: two pipelined requests, the second one incomplete.
//! let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPI"[..]);
//! let args = parse_request(&mut buf, &limits).unwrap().unwrap();
//! assert_eq!(args, [&b"GET"[..], &b"k"[..]]);
//! assert_eq!(parse_request(&mut buf, &limits).unwrap(), None);
//! buf.extend_from_slice(b"NG\r\n");
//! assert_eq!(parse_request(&mut buf, &limits).unwrap().unwrap(), [&b"PING"[..]]);
//!
//! // Replies.
//! let mut out = BytesMut::new();
//! Frame::Null.encode(Protocol::Resp2, &mut out);
//! Frame::Null.encode(Protocol::Resp3, &mut out);
//! assert_eq!(&out[..], b"$-1\r\n_\r\n");
//!
//! // Client side.
//! let mut req = BytesMut::new();
//! encode_request(&[b"PING"], &mut req);
//! assert_eq!(&req[..], b"*1\r\n$4\r\nPING\r\n");
//! let mut reply = BytesMut::from(&b"+PONG\r\n"[..]);
//! assert_eq!(parse_frame(&mut reply, &limits).unwrap(), Some(Frame::Simple("PONG".into())));
//! ```

pub mod frame;

pub use frame::*;
