//! A hand-written encoding of the messages every replicated write sends
//! (`Put`, `Forward`, `StableUpTo`, `PutDone`): bincode through serde spent
//! a quarter of a replicated SET's instructions on them, most of it in
//! serde's visitors and in an allocation for every key and value. Here a
//! message is a tag byte and LEB128 integers, and a decoded message's keys
//! and values are slices of one copy of its frame (`decode`), so a
//! message costs two allocations whatever it carries, and cloning its
//! bytes later costs a reference count.
//!
//! Every other message keeps bincode: a tag below is a byte no bincode
//! encoding of `Message` starts with (its first byte is the variant's
//! index, and there are far fewer than 240 variants).

use crate::error::Error;
use crate::hlc::Timestamp;
use crate::message::{Ack, Change, Condition, DepOn, Expiry, Message, NewValue, OpId, Put, Update, WriteDep};
use crate::version::{Version, VersionVector};
use bytes::{BufMut, Bytes};

const FORWARD: u8 = 0xF0;
const STABLE_UP_TO: u8 = 0xF1;
const PUT_DONE: u8 = 0xF2;
const PUT: u8 = 0xF3;

/// At most this many items are allocated ahead of a count: a count is
/// bounded by the bytes left, not by what they decode into (an update is
/// far larger than one byte).
const PREALLOCATED: usize = 64;

/// Whether an encoding that starts with `first` is one of these.
pub(super) fn is_hot(first: u8) -> bool {
    (FORWARD..=PUT).contains(&first)
}

/// Appends the encoding of `msg` if it is one of these, and says whether it
/// was.
pub(super) fn encode(msg: &Message, out: &mut impl BufMut) -> bool {
    match msg {
        Message::Forward { epoch, partition, updates, lazy } => {
            out.put_u8(FORWARD);
            varint(out, *epoch);
            varint(out, u64::from(*partition));
            out.put_u8(u8::from(*lazy));
            varint(out, updates.len() as u64);
            for u in updates {
                update(out, u);
            }
        }
        Message::StableUpTo { epoch, partition, seq, reported, durable } => {
            out.put_u8(STABLE_UP_TO);
            for n in [*epoch, u64::from(*partition), *seq, *reported, *durable] {
                varint(out, n);
            }
        }
        Message::PutDone { op, version: v, seq, chain_index, stable, stable_through, old } => {
            out.put_u8(PUT_DONE);
            op_id(out, op);
            out.put_u8(u8::from(v.is_some()) | u8::from(*stable) << 1 | u8::from(old.is_some()) << 2);
            if let Some(v) = v {
                version(out, v);
            }
            varint(out, *seq);
            out.put_u8(*chain_index);
            varint(out, *stable_through);
            if let Some(old) = old {
                bytes(out, old);
            }
        }
        Message::Put(p) => {
            out.put_u8(PUT);
            op_id(out, &p.op);
            varint(out, p.epoch);
            varint(out, u64::from(p.partition));
            bytes(out, &p.key);
            change(out, &p.change);
            vector(out, &p.past);
            out.put_u8(p.ack_at);
            varint(out, p.write);
            varint(out, p.deps.len() as u64);
            for d in &p.deps {
                varint(out, u64::from(d.partition));
                match d.on {
                    DepOn::Seq(s) => {
                        out.put_u8(u8::from(d.same_key) << 1);
                        varint(out, s);
                    }
                    DepOn::Write(w) => {
                        out.put_u8(1 | u8::from(d.same_key) << 1);
                        varint(out, w);
                    }
                }
            }
            varint(out, p.done_below);
        }
        _ => return false,
    }
    true
}

/// Decodes the message `body` holds (one of these: `is_hot` of its first
/// byte). One with keys or values is copied first, and they are slices of
/// the copy.
pub(super) fn decode(body: &[u8]) -> Result<Message, Error> {
    let copy;
    let mut r = match body[0] {
        // Nothing of these is kept as a slice: no copy of the whole.
        STABLE_UP_TO | PUT_DONE => Reader { buf: body, owner: None, at: 1 },
        _ => {
            copy = Bytes::copy_from_slice(body);
            Reader { buf: body, owner: Some(&copy), at: 1 }
        }
    };
    let msg = match body[0] {
        FORWARD => {
            let epoch = r.varint()?;
            let partition = r.u32()?;
            let lazy = r.flag()?;
            let n = r.count()?;
            let mut updates = Vec::with_capacity(n.min(PREALLOCATED));
            for _ in 0..n {
                updates.push(r.update()?);
            }
            Message::Forward { epoch, partition, updates, lazy }
        }
        STABLE_UP_TO => {
            Message::StableUpTo { epoch: r.varint()?, partition: r.u32()?, seq: r.varint()?, reported: r.varint()?, durable: r.varint()? }
        }
        PUT_DONE => {
            let op = r.op_id()?;
            let flags = r.u8()?;
            if flags > 0b111 {
                return Err(bad("flags"));
            }
            let version = if flags & 1 != 0 { Some(r.version()?) } else { None };
            let seq = r.varint()?;
            let chain_index = r.u8()?;
            let stable_through = r.varint()?;
            let old = if flags & 4 != 0 { Some(Box::new(r.copied()?)) } else { None };
            Message::PutDone { op, version, seq, chain_index, stable: flags & 2 != 0, stable_through, old }
        }
        PUT => {
            let op = r.op_id()?;
            let epoch = r.varint()?;
            let partition = r.u32()?;
            let key = r.bytes()?;
            let change = r.change()?;
            let past = r.vector()?;
            let ack_at = r.u8()?;
            let write = r.varint()?;
            let n = r.count()?;
            let mut deps = Vec::with_capacity(n.min(PREALLOCATED));
            for _ in 0..n {
                let partition = r.u32()?;
                let how = r.u8()?;
                let on = match how & 1 {
                    0 => DepOn::Seq(r.varint()?),
                    _ => DepOn::Write(r.varint()?),
                };
                if how > 0b11 {
                    return Err(bad("dependency"));
                }
                deps.push(WriteDep { partition, on, same_key: how & 2 != 0 });
            }
            let done_below = r.varint()?;
            Message::Put(Box::new(Put { op, epoch, partition, key, change, past, ack_at, write, deps, done_below }))
        }
        other => return Err(bad(&format!("tag {other:#x}"))),
    };
    if r.at != body.len() {
        return Err(bad("trailing bytes"));
    }
    Ok(msg)
}

fn bad(what: &str) -> Error {
    Error::InvalidData(format!("malformed message: {what}"))
}

pub(super) fn varint(out: &mut impl BufMut, mut n: u64) {
    while n >= 0x80 {
        out.put_u8(n as u8 | 0x80);
        n >>= 7;
    }
    out.put_u8(n as u8);
}

fn bytes(out: &mut impl BufMut, b: &[u8]) {
    varint(out, b.len() as u64);
    out.put_slice(b);
}

fn op_id(out: &mut impl BufMut, op: &OpId) {
    varint(out, op.client);
    varint(out, op.seq);
}

fn timestamp(out: &mut impl BufMut, ts: Timestamp) {
    varint(out, ts.to_bits());
}

/// A version's vector is mostly its own timestamp (at its own site) and
/// zeros: those entries take one byte each.
fn version(out: &mut impl BufMut, v: &Version) {
    timestamp(out, v.ts);
    varint(out, u64::from(v.site));
    varint(out, v.vv.0.len() as u64);
    for &e in &v.vv.0 {
        if e == v.ts {
            out.put_u8(0);
        } else if e == Timestamp::ZERO {
            out.put_u8(1);
        } else {
            out.put_u8(2);
            timestamp(out, e);
        }
    }
}

fn vector(out: &mut impl BufMut, vv: &VersionVector) {
    varint(out, vv.0.len() as u64);
    for ts in &vv.0 {
        timestamp(out, *ts);
    }
}

fn update(out: &mut impl BufMut, u: &Update) {
    varint(out, u.seq);
    bytes(out, &u.key);
    version(out, &u.version);
    let flags =
        u8::from(u.value.is_some()) | u8::from(u.expires_at_ms.is_some()) << 1 | u8::from(u.ack.is_some()) << 2 | u8::from(u.expired) << 3;
    out.put_u8(flags);
    if let Some(v) = &u.value {
        bytes(out, v);
    }
    if let Some(at) = u.expires_at_ms {
        varint(out, at);
    }
    if let Some(a) = &u.ack {
        op_id(out, &a.op);
        out.put_u8(a.at);
        varint(out, a.done_below);
        match &a.old {
            Some(old) => {
                out.put_u8(1);
                bytes(out, old);
            }
            None => out.put_u8(0),
        }
    }
    timestamp(out, u.local_dep);
}

fn change(out: &mut impl BufMut, c: &Change) {
    match &c.value {
        NewValue::Set(v) => {
            out.put_u8(0);
            bytes(out, v);
        }
        NewValue::Delete => out.put_u8(1),
        NewValue::Keep => out.put_u8(2),
        NewValue::Add(n) => {
            out.put_u8(3);
            // Zigzag: small negative increments stay one byte.
            varint(out, ((n << 1) ^ (n >> 63)) as u64);
        }
        NewValue::AddFloat(bits) => {
            out.put_u8(4);
            out.put_u64_le(*bits);
        }
        NewValue::Append(v) => {
            out.put_u8(5);
            bytes(out, v);
        }
        NewValue::SetRange(at, v) => {
            out.put_u8(6);
            varint(out, *at);
            bytes(out, v);
        }
    }
    match c.expiry {
        Expiry::Keep => out.put_u8(0),
        Expiry::Never => out.put_u8(1),
        Expiry::After(ms) => {
            out.put_u8(2);
            varint(out, ms);
        }
        Expiry::At(ms) => {
            out.put_u8(3);
            varint(out, ms);
        }
    }
    out.put_u8(condition_code(c.condition));
    out.put_u8(u8::from(c.get));
}

fn condition_code(c: Condition) -> u8 {
    match c {
        Condition::Always => 0,
        Condition::IfAbsent => 1,
        Condition::IfPresent => 2,
        Condition::IfNoExpiry => 3,
        Condition::IfExpiry => 4,
        Condition::IfLater => 5,
        Condition::IfSooner => 6,
        Condition::IfExpiryAndSooner => 7,
    }
}

fn condition(code: u8) -> Option<Condition> {
    const ALL: [Condition; 8] = [
        Condition::Always,
        Condition::IfAbsent,
        Condition::IfPresent,
        Condition::IfNoExpiry,
        Condition::IfExpiry,
        Condition::IfLater,
        Condition::IfSooner,
        Condition::IfExpiryAndSooner,
    ];
    ALL.get(code as usize).copied()
}

/// Reads `buf`; the bytes it takes are slices of `owner`, a copy of `buf`.
struct Reader<'a> {
    buf: &'a [u8],
    owner: Option<&'a Bytes>,
    at: usize,
}

/// The LEB128 integer at the start of `buf`, and its length.
pub(super) fn read_varint(buf: &[u8]) -> Result<(u64, usize), Error> {
    let mut r = Reader { buf, owner: None, at: 0 };
    Ok((r.varint()?, r.at))
}

impl Reader<'_> {
    fn u8(&mut self) -> Result<u8, Error> {
        let b = *self.buf.get(self.at).ok_or_else(|| bad("truncated"))?;
        self.at += 1;
        Ok(b)
    }

    fn u64_le(&mut self) -> Result<u64, Error> {
        let b = self.buf.get(self.at..self.at + 8).ok_or_else(|| bad("truncated"))?;
        self.at += 8;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn flag(&mut self) -> Result<bool, Error> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(bad("flag")),
        }
    }

    fn varint(&mut self) -> Result<u64, Error> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(bad("integer out of range"));
            }
            n |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(n);
            }
        }
        Err(bad("integer out of range"))
    }

    fn u32(&mut self) -> Result<u32, Error> {
        u32::try_from(self.varint()?).map_err(|_| bad("integer out of range"))
    }

    /// A number of items, each at least one byte: no more than what is
    /// left (a hostile count cannot make the decoder allocate).
    fn count(&mut self) -> Result<usize, Error> {
        let n = self.varint()?;
        if n > (self.buf.len() - self.at) as u64 {
            return Err(bad("count past the end"));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Result<Bytes, Error> {
        let n = self.count()?;
        let b = self.owner.ok_or_else(|| bad("bytes"))?.slice(self.at..self.at + n);
        self.at += n;
        Ok(b)
    }

    /// Bytes in an allocation of their own (the message is not copied).
    fn copied(&mut self) -> Result<Bytes, Error> {
        let n = self.count()?;
        let b = Bytes::copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(b)
    }

    fn timestamp(&mut self) -> Result<Timestamp, Error> {
        Ok(Timestamp::from_bits(self.varint()?))
    }

    fn op_id(&mut self) -> Result<OpId, Error> {
        Ok(OpId { client: self.varint()?, seq: self.varint()? })
    }

    fn vector(&mut self) -> Result<VersionVector, Error> {
        let n = self.count()?;
        let mut vv = VersionVector::default();
        for _ in 0..n {
            vv.0.push(self.timestamp()?);
        }
        Ok(vv)
    }

    fn version(&mut self) -> Result<Version, Error> {
        let ts = self.timestamp()?;
        let site = u16::try_from(self.varint()?).map_err(|_| bad("site"))?;
        let n = self.count()?;
        let mut vv = VersionVector::default();
        for _ in 0..n {
            vv.0.push(match self.u8()? {
                0 => ts,
                1 => Timestamp::ZERO,
                2 => self.timestamp()?,
                _ => return Err(bad("version vector")),
            });
        }
        Ok(Version { ts, site, vv })
    }

    fn update(&mut self) -> Result<Update, Error> {
        let seq = self.varint()?;
        let key = self.bytes()?;
        let version = self.version()?;
        let flags = self.u8()?;
        if flags > 0b1111 {
            return Err(bad("update flags"));
        }
        let value = if flags & 1 != 0 { Some(self.bytes()?) } else { None };
        let expires_at_ms = if flags & 2 != 0 { Some(self.varint()?) } else { None };
        let ack = if flags & 4 != 0 {
            let op = self.op_id()?;
            let at = self.u8()?;
            let done_below = self.varint()?;
            let old = if self.flag()? { Some(self.bytes()?) } else { None };
            Some(Ack { op, at, done_below, old })
        } else {
            None
        };
        let local_dep = self.timestamp()?;
        Ok(Update { seq, key, version, value, expires_at_ms, ack, local_dep, expired: flags & 8 != 0 })
    }

    fn change(&mut self) -> Result<Change, Error> {
        let value = match self.u8()? {
            0 => NewValue::Set(self.bytes()?),
            1 => NewValue::Delete,
            2 => NewValue::Keep,
            3 => {
                let z = self.varint()?;
                NewValue::Add((z >> 1) as i64 ^ -((z & 1) as i64))
            }
            4 => NewValue::AddFloat(self.u64_le()?),
            5 => NewValue::Append(self.bytes()?),
            6 => {
                let at = self.varint()?;
                NewValue::SetRange(at, self.bytes()?)
            }
            _ => return Err(bad("change")),
        };
        let expiry = match self.u8()? {
            0 => Expiry::Keep,
            1 => Expiry::Never,
            2 => Expiry::After(self.varint()?),
            3 => Expiry::At(self.varint()?),
            _ => return Err(bad("expiry")),
        };
        let condition = condition(self.u8()?).ok_or_else(|| bad("condition"))?;
        let get = self.flag()?;
        Ok(Change { value, expiry, condition, get })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{decode_message, encode_message, put_message, take_message};
    use bytes::BytesMut;

    fn ts(ms: u64, l: u16) -> Timestamp {
        Timestamp::new(1_795_472_920_986 + ms, l)
    }

    /// One of each shape the hot messages take: every optional field
    /// present and absent, every change, dependencies, vectors of several
    /// sites with entries equal to, below and above the version's time.
    fn samples() -> Vec<Message> {
        let version = |vv: &[Timestamp]| Version { ts: ts(5, 2), site: 1, vv: VersionVector(vv.iter().copied().collect()) };
        let update = |i: u64| Update {
            seq: i * 1000,
            key: Bytes::from(format!("key:{i}")),
            version: version(&[Timestamp::ZERO, ts(5, 2), ts(9, 0)][..(i as usize % 4)]),
            value: i.is_multiple_of(2).then(|| Bytes::from(vec![i as u8; i as usize * 37])),
            expires_at_ms: i.is_multiple_of(3).then_some(1_795_472_999_000 + i),
            ack: (i % 2 == 1).then(|| Ack {
                op: OpId { client: 1 << 47, seq: i },
                at: 1,
                done_below: i - 1,
                old: (i == 3).then(|| Bytes::from_static(b"before")),
            }),
            local_dep: ts(i, 0),
            expired: i == 4,
        };
        let mut all = vec![
            Message::Forward { epoch: 7, partition: 63, updates: (0..6).map(update).collect(), lazy: true },
            Message::Forward { epoch: 0, partition: 0, updates: vec![], lazy: false },
            Message::StableUpTo { epoch: u64::MAX, partition: u32::MAX, seq: 1 << 40, reported: 0, durable: 12 },
            Message::PutDone {
                op: OpId { client: 9, seq: 300 },
                version: Some(version(&[ts(5, 2)])),
                seq: 8,
                chain_index: 1,
                stable: true,
                stable_through: 6,
                old: None,
            },
            Message::PutDone {
                op: OpId { client: 9, seq: 301 },
                version: None,
                seq: 0,
                chain_index: 0,
                stable: false,
                stable_through: 0,
                old: Some(Box::new(Bytes::from_static(b"old"))),
            },
        ];
        let conditions = [
            Condition::Always,
            Condition::IfAbsent,
            Condition::IfPresent,
            Condition::IfNoExpiry,
            Condition::IfExpiry,
            Condition::IfLater,
            Condition::IfSooner,
            Condition::IfExpiryAndSooner,
        ];
        for (i, condition) in conditions.into_iter().enumerate() {
            let value = match i % 8 {
                0 => NewValue::Set(Bytes::from(vec![b'v'; 100])),
                1 => NewValue::Delete,
                2 => NewValue::Add(-7),
                3 => NewValue::Add(i64::MIN),
                4 => NewValue::AddFloat((-0.1f64).to_bits()),
                5 => NewValue::Append(Bytes::from("tail")),
                6 => NewValue::SetRange(1 << 40, Bytes::from("at")),
                _ => NewValue::Keep,
            };
            let expiry = [Expiry::Keep, Expiry::Never, Expiry::After(500), Expiry::At(1_795_472_999_000)][i % 4];
            all.push(Message::Put(Box::new(Put {
                op: OpId { client: 77, seq: i as u64 },
                epoch: 3,
                partition: 12,
                key: Bytes::from(format!("k{i}")),
                change: Change { value, expiry, condition, get: i % 2 == 0 },
                past: VersionVector([ts(1, 0), Timestamp::ZERO, ts(3, 3)][..i % 4].iter().copied().collect()),
                ack_at: [1, crate::message::ACK_AT_TAIL][i % 2],
                write: 40 + i as u64,
                deps: (0..i % 3)
                    .map(|d| WriteDep { partition: d as u32, on: [DepOn::Seq(d as u64 * 99), DepOn::Write(39)][d % 2], same_key: d == 1 })
                    .collect(),
                done_below: 38,
            })));
        }
        all
    }

    #[test]
    fn hot_messages_round_trip_by_hand_and_the_rest_through_bincode() {
        let mut wire = BytesMut::new();
        let mut msgs = samples();
        msgs.push(Message::Stable { op: OpId { client: 1, seq: 2 } });
        for m in &msgs {
            let bytes = encode_message(m);
            let by_hand = !matches!(m, Message::Stable { .. });
            assert_eq!(is_hot(bytes[0]), by_hand, "{m:?}");
            assert_eq!(&decode_message(&bytes).unwrap(), m);
            put_message(m, &mut wire);
        }
        for m in &msgs {
            assert_eq!(&take_message(&mut wire).unwrap().unwrap(), m);
        }
        assert!(wire.is_empty());
    }

    #[test]
    fn a_hot_message_is_smaller_than_with_bincode() {
        for m in samples() {
            assert!(encode_message(&m).len() <= crate::wire::encode(&m).len(), "{m:?}");
        }
    }

    /// Every cut of a valid encoding, the valid ones with a byte more, and
    /// random bytes behind each tag are refused with an error, never a
    /// panic or a huge allocation.
    #[test]
    fn malformed_hot_messages_are_refused() {
        for m in samples() {
            let bytes = encode_message(&m);
            for cut in 1..bytes.len() {
                assert!(decode_message(&bytes[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(decode_message(&longer).is_err());
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut decoded = 0;
        for i in 0..20_000 {
            let mut garbage = vec![FORWARD + (i % 4) as u8];
            for _ in 0..(i % 64) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                garbage.push(if x.is_multiple_of(3) { 0xff } else { x as u8 });
            }
            decoded += usize::from(decode_message(&garbage).is_ok());
        }
        assert!(decoded < 20_000);
        // A count of 2^62 updates in a few bytes.
        assert!(decode_message(&[FORWARD, 1, 1, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40]).is_err());
    }

    /// Keys and values decoded by hand share one copy of the message, not
    /// the connection's buffer they were read from.
    #[test]
    fn decoded_bytes_are_a_copy_of_the_message_alone() {
        let m = &samples()[0];
        let mut wire = BytesMut::new();
        put_message(m, &mut wire);
        let read_buffer = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
        let Message::Forward { updates, .. } = take_message(&mut wire).unwrap().unwrap() else { panic!() };
        for u in &updates {
            assert!(!read_buffer.contains(&(u.key.as_ptr() as usize)));
        }
    }
}
