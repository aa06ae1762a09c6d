//! The binary encoding of `Message`s and session tokens (bincode, varint
//! integers), with a size limit so a corrupt or hostile length prefix cannot
//! make a node allocate without bound.

use serde::{de::DeserializeOwned, Serialize};

/// The largest frame a node accepts from a peer or native client.
pub const MAX_FRAME: u64 = 1 << 30;

fn options() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new().with_limit(MAX_FRAME)
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    use bincode::Options;
    options().serialize(value).expect("in-memory values always encode")
}

/// Appends the encoding of `value` to `out` (no intermediate buffer).
pub fn encode_into<T: Serialize>(value: &T, out: &mut impl std::io::Write) {
    use bincode::Options;
    options().serialize_into(out, value).expect("in-memory values always encode")
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    use bincode::Options;
    options().deserialize(bytes).map_err(|e| e.to_string())
}
