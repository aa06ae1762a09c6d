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

impl RespConn {
    pub async fn connect(addr: &str) -> Result<RespConn, String> {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        Ok(RespConn {
            stream,
            out: BytesMut::new(),
            input: BytesMut::with_capacity(16 * 1024),
            decoder: FrameDecoder::new(),
            limits: Limits::default(),
        })
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
