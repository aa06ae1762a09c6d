//! A minimal RESP client for the binary's own tools (bench, cluster): one
//! request at a time, parsed with `causeway-resp`.

use bytes::BytesMut;
use causeway_resp::{encode_request, Frame, FrameDecoder, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A minimal RESP client: one request at a time, no allocation per call
/// beyond the reply. The same code measures every RESP server.
pub struct RespConn {
    stream: TcpStream,
    out: BytesMut,
    input: BytesMut,
    decoder: FrameDecoder,
    limits: Limits,
}

/// The password the binary's tools send (AUTH, or the native client's
/// proof) to sites started with `--requirepass`, as redis-cli takes
/// `REDISCLI_AUTH`.
pub const PASSWORD_ENV: &str = "CAUSEWAY_PASSWORD";

/// `PASSWORD_ENV`, if set.
pub fn password() -> Option<String> {
    std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty())
}

impl RespConn {
    /// Connects, and authenticates with `password()` if it is set.
    pub async fn connect(addr: &str) -> Result<RespConn, String> {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let mut c = RespConn {
            stream,
            out: BytesMut::new(),
            input: BytesMut::with_capacity(16 * 1024),
            decoder: FrameDecoder::new(),
            limits: Limits::default(),
        };
        if let Some(password) = password() {
            c.call(&[b"AUTH", password.as_bytes()]).await.map_err(|e| format!("{addr}: AUTH with ${PASSWORD_ENV}: {e}"))?;
        }
        Ok(c)
    }

    pub async fn call(&mut self, args: &[&[u8]]) -> Result<Frame, String> {
        self.out.clear();
        encode_request(args, &mut self.out);
        self.stream.write_all(&self.out).await.map_err(|e| e.to_string())?;
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.input, &self.limits).map_err(|e| e.to_string())? {
                return match frame {
                    Frame::Error(e) => Err(e),
                    f => Ok(f),
                };
            }
            if self.stream.read_buf(&mut self.input).await.map_err(|e| e.to_string())? == 0 {
                return Err("server closed the connection".into());
            }
        }
    }
}
