//! A member's metadata: key -> `Meta` (place, version, expiry), one
//! allocation per key holding both the metadata and the key's bytes, in a
//! hash table of those allocations. Every key's metadata is kept three
//! times in an ec:3+2 site (its data member and both parity members), so
//! the bytes per entry decide what small values cost: a `HashMap<Box<[u8]>,
//! Meta>` spends a 48-byte bucket per key (96 at half load) and a second
//! allocation for the key; here a bucket is 16 bytes.

use super::{Loc, Meta};
use hashbrown::HashTable;

#[derive(Clone, Default)]
pub struct Index {
    table: HashTable<Item>,
    hasher: ahash::RandomState,
}

/// `at`, `version`, `expires_at_ms` (8 bytes each) and `len` (4), then the
/// key.
#[derive(Clone)]
struct Item(Box<[u8]>);

const HEAD: usize = 28;

/// What an entry takes besides its key: the header and its bucket.
pub const ENTRY_BYTES: usize = HEAD + std::mem::size_of::<Item>();

impl Item {
    fn new(key: &[u8], meta: Meta) -> Item {
        let mut bytes = vec![0; HEAD + key.len()];
        bytes[HEAD..].copy_from_slice(key);
        let mut item = Item(bytes.into_boxed_slice());
        item.set(meta);
        item
    }

    fn key(&self) -> &[u8] {
        &self.0[HEAD..]
    }

    fn meta(&self) -> Meta {
        let u = |i: usize| u64::from_le_bytes(self.0[i..i + 8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(self.0[24..28].try_into().expect("4 bytes"));
        Meta { loc: Loc { at: u(0), len }, version: u(8), expires_at_ms: u(16) }
    }

    fn set(&mut self, m: Meta) {
        self.0[0..8].copy_from_slice(&m.loc.at.to_le_bytes());
        self.0[8..16].copy_from_slice(&m.version.to_le_bytes());
        self.0[16..24].copy_from_slice(&m.expires_at_ms.to_le_bytes());
        self.0[24..28].copy_from_slice(&m.loc.len.to_le_bytes());
    }
}

impl Index {
    pub fn get(&self, key: &[u8]) -> Option<Meta> {
        let hash = self.hasher.hash_one(key);
        self.table.find(hash, |i| i.key() == key).map(Item::meta)
    }

    /// Sets `key`'s metadata; what it was.
    pub fn insert(&mut self, key: &[u8], meta: Meta) -> Option<Meta> {
        let hash = self.hasher.hash_one(key);
        let hasher = &self.hasher;
        match self.table.entry(hash, |i| i.key() == key, |i| hasher.hash_one(i.key())) {
            hashbrown::hash_table::Entry::Occupied(mut e) => {
                let old = e.get().meta();
                e.get_mut().set(meta);
                Some(old)
            }
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(Item::new(key, meta));
                None
            }
        }
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Meta> {
        let hash = self.hasher.hash_one(key);
        let found = self.table.find_entry(hash, |i| i.key() == key).ok()?;
        let (item, _) = found.remove();
        if self.table.len() < self.table.capacity() / 4 {
            // Deleted keys give their memory back.
            let hasher = &self.hasher;
            self.table.shrink_to_fit(|i| hasher.hash_one(i.key()));
        }
        Some(item.meta())
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Meta)> {
        self.table.iter().map(|i| (i.key(), i.meta()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(at: u64, version: u64) -> Meta {
        Meta { loc: Loc { at, len: 7 }, version, expires_at_ms: version * 10 }
    }

    #[test]
    fn keeps_each_key_with_its_metadata() {
        let mut index = Index::default();
        for i in 0..1000u64 {
            assert_eq!(index.insert(format!("k{i}").as_bytes(), meta(i, 1)), None);
        }
        assert_eq!(index.insert(b"k5", meta(50, 2)), Some(meta(5, 1)));
        assert_eq!(index.get(b"k5"), Some(meta(50, 2)));
        assert_eq!(index.get(b"k1000"), None);
        for i in 0..990u64 {
            assert!(index.remove(format!("k{i}").as_bytes()).is_some());
        }
        assert_eq!(index.len(), 10);
        assert!(index.table.capacity() < 1000, "shrunk: {}", index.table.capacity());
        let copy = index.clone();
        let mut keys: Vec<(Vec<u8>, Meta)> = copy.iter().map(|(k, m)| (k.to_vec(), m)).collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(keys[0], (b"k990".to_vec(), meta(990, 1)));
        assert_eq!(index.remove(b"k990"), Some(meta(990, 1)));
        assert_eq!(index.remove(b"k990"), None);
    }
}
