//! A bounded fuzz campaign for the RESP parsers, run with the tests: inputs
//! are real traffic (requests of every shape a client sends, replies of
//! every RESP2/RESP3 type) mutated at random (bytes flipped, inserted,
//! deleted, lengths rewritten, inputs cut and spliced), fed whole and in
//! pieces. Neither decoder may panic, loop, or claim more bytes than it
//! was given; what they accept must be what they were given when the input
//! is unmutated. `FUZZ_ITERATIONS=n` runs a longer campaign.

use bytes::BytesMut;
use causeway_resp::{encode_request, Frame, FrameDecoder, Limits, Protocol, RequestDecoder};
use causeway_sim::Rng;

/// The simulator's seeded generator (the same inputs on every machine),
/// taking lengths.
struct Lengths(Rng);

impl Lengths {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.below(n.max(1) as u64) as usize
    }
}

fn iterations(default: usize) -> usize {
    std::env::var("FUZZ_ITERATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Real traffic: what clients send, and what servers answer.
fn corpus() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let requests: [&[&[u8]]; 7] = [
        &[b"PING"],
        &[b"SET", b"greeting", b"hello world", b"EX", b"10"],
        &[b"GET", b"greeting"],
        &[b"MGET", b"a", b"b", b"c"],
        &[b"HELLO", b"3", b"AUTH", b"default", b"secret"],
        &[b"CW.WITH", b"linearizable", b"SET", b"k", b"\x00\xff\r\n"],
        &[b"SET", b"", b""],
    ];
    for r in requests {
        let mut b = BytesMut::new();
        encode_request(r, &mut b);
        out.push(b.to_vec());
    }
    out.push(b"PING\r\nSET k \"a b\\x00\"\r\nGET k\r\n".to_vec());
    out.push(b"*0\r\n*-1\r\n*-10\r\n".to_vec());
    let frames = vec![
        Frame::ok(),
        Frame::error("ERR something"),
        Frame::Integer(-42),
        Frame::bulk("value"),
        Frame::Null,
        Frame::Array(vec![Frame::bulk("a"), Frame::Integer(1), Frame::Array(vec![Frame::Null])]),
        Frame::Map(vec![(Frame::bulk("k"), Frame::bulk("v")), (Frame::bulk("n"), Frame::Integer(3))]),
        Frame::Boolean(true),
    ];
    for f in frames {
        for proto in [Protocol::Resp2, Protocol::Resp3] {
            let mut b = BytesMut::new();
            f.encode(proto, &mut b);
            out.push(b.to_vec());
        }
    }
    out.push(b"=15\r\ntxt:Some string\r\n(3492890328409238509324850943850943825024385\r\n%1\r\n+a\r\n_\r\n~1\r\n>1\r\n:1\r\n".to_vec());
    out
}

fn mutate(rng: &mut Lengths, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut input = corpus[rng.below(corpus.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(input.len() + 1);
        match rng.below(8) {
            0 if !input.is_empty() => {
                let i = at.min(input.len() - 1);
                input[i] ^= 1 << rng.below(8);
            }
            1 => input.insert(at, rng.next() as u8),
            2 if at < input.len() => {
                input.remove(at);
            }
            3 => input.truncate(at),
            4 => {
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len());
                input.splice(at..at, other[from..].iter().copied());
            }
            5 => {
                // Lengths and counts are where parsers break.
                let n = ["-1", "-2", "0", "99999999999", "18446744073709551616", "4294967295", "2"][rng.below(7)];
                input.splice(at..at, n.bytes());
            }
            6 => {
                input.splice(at..at, [b'\r', b'\n', b'*', b'$', b'%', b'>', b'|'][rng.below(7)..].iter().copied().take(2));
            }
            _ => {}
        }
    }
    input
}

/// Feeds `input` in pieces of `chunk` bytes to `decode` (one step of a
/// decoder: a message taken, more needed, or an error), taking every
/// complete message after each piece.
fn feed<T, E>(input: &[u8], chunk: usize, mut decode: impl FnMut(&mut BytesMut) -> Result<Option<T>, E>) {
    let mut buf = BytesMut::new();
    for piece in input.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        for _ in 0..=input.len() {
            let before = buf.len();
            match decode(&mut buf) {
                Ok(Some(_)) => assert!(buf.len() < before || before == 0, "a message consumed nothing"),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

#[test]
fn the_parsers_survive_mutated_traffic() {
    let corpus = corpus();
    let limits = Limits { max_bulk_len: 1 << 20, max_array_len: 1 << 10, ..Limits::default() };
    // Unmutated traffic parses whole.
    for input in &corpus[..7] {
        let mut buf = BytesMut::from(&input[..]);
        assert!(RequestDecoder::new().decode(&mut buf, &limits).unwrap().is_some());
        assert!(buf.is_empty());
    }
    let mut rng = Lengths(Rng::new(0xF022));
    let n = iterations(200_000);
    for i in 0..n {
        let input = mutate(&mut rng, &corpus);
        let chunk = if i % 4 == 0 { 1 + rng.below(8) } else { input.len() };
        let mut requests = RequestDecoder::new();
        feed(&input, chunk, |buf| requests.decode(buf, &limits));
        let mut frames = FrameDecoder::new();
        feed(&input, chunk, |buf| frames.decode(buf, &limits));
    }
    eprintln!("resp fuzz: {n} mutated inputs, each through both decoders, 0 crashes");
}
