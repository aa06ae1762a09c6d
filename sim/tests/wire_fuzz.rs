//! A bounded fuzz campaign for the binary frame decoders that peer and
//! native-client connections run (`core::wire::take_frame` for handshakes,
//! `take_message` and `take_sequenced` for messages, the hot ones encoded
//! by hand): real frames
//! (handshakes, chain traffic, state transfers, configurations) mutated at
//! random and fed whole and in pieces. The decoder may refuse a frame, never
//! panic or claim bytes it was not given. `FUZZ_ITERATIONS=n` runs longer.

use bytes::{Bytes, BytesMut};
use causeway_core::chain::PartitionState;
use causeway_core::hlc::Timestamp;
use causeway_core::message::{Ack, Change, Condition, DepOn, Expiry, Hello, Message, NewValue, OnDiskEntry, OpId, Put, Update, WriteDep};
use causeway_core::ring::{NodeInfo, Shape, Topology};
use causeway_core::version::{Version, VersionVector};
use causeway_core::wire::{encode_message, put_frame, put_message, put_sequenced, take_frame, take_message, take_sequenced};
use causeway_sim::Rng;

fn corpus() -> Vec<Vec<u8>> {
    let op = OpId { client: 1 << 48, seq: 7 };
    let update = Update {
        seq: 3,
        key: Bytes::from("k"),
        version: Version::local(0, Timestamp::new(1_000, 2)),
        value: Some(Bytes::from("v")),
        expires_at_ms: Some(5),
        ack: Some(Ack { op, at: 1, done_below: 5, old: Some(Bytes::from("was")) }),
        local_dep: Timestamp::new(990, 0),
        expired: false,
    };
    let topology = Topology::new(
        4,
        Shape { partitions: 4, replicas: 2, k: 1, coding: None },
        (0..3).map(|id| NodeInfo { id, addr: format!("n{id}") }).collect(),
    )
    .expect("valid");
    let messages = vec![
        Message::Put(Box::new(Put {
            op,
            epoch: 4,
            partition: 1,
            key: Bytes::from("key"),
            change: Change {
                value: NewValue::Set(Bytes::from("value")),
                expiry: Expiry::At(1_700_000_000_000),
                condition: Condition::IfExpiryAndSooner,
                get: true,
            },
            past: {
                let mut v = VersionVector::default();
                v.set(1, Timestamp::new(9, 1));
                v
            },
            ack_at: 1,
            write: 7,
            deps: vec![
                WriteDep { partition: 2, on: DepOn::Write(6), same_key: false },
                WriteDep { partition: 1, on: DepOn::Seq(40), same_key: true },
            ],
            done_below: 6,
        })),
        Message::Get { op, epoch: 4, partition: 1, key: Bytes::from("key"), min: None, leased: true },
        Message::Forward { epoch: 4, partition: 2, updates: vec![update.clone(), update.clone()], lazy: false },
        Message::PutDone {
            op,
            version: Some(Version::local(1, Timestamp::new(1_000, 2))),
            seq: 3,
            chain_index: 1,
            stable: false,
            stable_through: 2,
            old: Some(Box::new(Bytes::from("was"))),
        },
        Message::Transfer {
            epoch: 4,
            partition: 2,
            state: Some(Box::new(PartitionState {
                applied: 3,
                stable: 2,
                entries: Vec::new(),
                sessions: Vec::new(),
                history: 17,
                unreported: Vec::new(),
            })),
            updates: Vec::new(),
            history_before: 17,
            clock: Timestamp::new(9, 0),
            on_disk: vec![OnDiskEntry { key: Bytes::from("cold"), version: update.version.clone(), seq: 2, expires_at_ms: None, len: 5 }],
        },
        Message::Transfer {
            epoch: 4,
            partition: 2,
            state: None,
            updates: vec![update.clone()],
            history_before: 17,
            clock: Timestamp::ZERO,
            on_disk: Vec::new(),
        },
        Message::Fetch { epoch: 4, partition: 2, from: 1, have: Some((3, 17)) },
        Message::FetchValues { partition: 2, from: 1, ids: vec![(Bytes::from("cold"), Timestamp::new(9, 0), 1)], done: false },
        Message::Values {
            partition: 2,
            values: vec![
                ((Bytes::from("cold"), Timestamp::new(9, 0), 1), Some(Bytes::from("value"))),
                ((Bytes::from("gone"), Timestamp::ZERO, 0), None),
            ],
        },
        Message::Reconfigure { topology: Box::new(topology) },
        Message::StableUpTo { epoch: 4, partition: 0, seq: 9, reported: 3, durable: 9 },
    ];
    let mut out = Vec::new();
    for m in &messages {
        let mut b = BytesMut::new();
        put_message(m, &mut b);
        out.push(b.to_vec());
        let mut b = BytesMut::new();
        put_sequenced(300, &encode_message(m), &mut b);
        out.push(b.to_vec());
    }
    for h in [Hello::Node { id: 2, stream: 1 }, Hello::Raft(1), Hello::Client { id: 5, password: Some("secret".into()) }] {
        let mut b = BytesMut::new();
        put_frame(&h, &mut b);
        out.push(b.to_vec());
    }
    out
}

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut input = corpus[rng.below(corpus.len() as u64) as usize].clone();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(input.len() as u64 + 1) as usize;
        match rng.below(6) {
            0 if !input.is_empty() => {
                let i = at.min(input.len() - 1);
                input[i] ^= 1 << rng.below(8);
            }
            1 => input.insert(at, rng.next_u64() as u8),
            2 if at < input.len() => {
                input.remove(at);
            }
            3 => input.truncate(at),
            4 => {
                // Rewrite a length prefix or a varint: where decoders break.
                let len = [0u32, 1, 0xffff_ffff, 1 << 30, (1 << 30) + 1, 7][rng.below(6) as usize];
                input.splice(at..at, len.to_le_bytes());
            }
            _ => {
                let other = &corpus[rng.below(corpus.len() as u64) as usize];
                input.extend_from_slice(other);
            }
        }
    }
    input
}

fn decode_all<T>(input: &[u8], chunk: usize, take: impl Fn(&mut BytesMut) -> Result<Option<T>, causeway_core::error::Error>) {
    let mut buf = BytesMut::new();
    for piece in input.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            let before = buf.len();
            match take(&mut buf) {
                Ok(Some(_)) => assert!(buf.len() < before, "a frame consumed nothing"),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

#[test]
fn the_frame_decoder_survives_mutated_peer_traffic() {
    let corpus = corpus();
    let mut rng = Rng::new(0xF1F0);
    let n: usize = std::env::var("FUZZ_ITERATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(50_000);
    for i in 0..n {
        let input = mutate(&mut rng, &corpus);
        let chunk = if i % 4 == 0 { 1 + rng.below(16) as usize } else { input.len() };
        decode_all(&input, chunk, take_message);
        decode_all(&input, chunk, take_sequenced);
        decode_all(&input, chunk, take_frame::<Message>);
        decode_all(&input, chunk, take_frame::<Hello>);
    }
    eprintln!(
        "wire fuzz: {n} mutated frames, each decoded as a message (alone, in a peer's stream, with bincode) and as a handshake, 0 crashes"
    );
}
