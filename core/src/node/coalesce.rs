//! Chain traffic held back until a flush (`Node::flush`), merged.

use crate::chain::{forward_bytes, FORWARD_BYTES};
use crate::message::{Dest, Message, Outbox};
use crate::ring::PartitionId;

/// Whether `msg` is traffic along a chain that `flush` coalesces.
pub(super) fn is_chain_traffic(msg: &Message) -> bool {
    matches!(msg, Message::Forward { .. } | Message::StableUpTo { .. })
}

/// Moves `pending` to `out`, merging what goes to one node for one
/// partition at one epoch: forwards into one (updates in the order they
/// were applied; lazy only if every part was) of at most `FORWARD_BYTES`
/// of keys and values, acknowledgements into the last one (they are
/// cumulative).
pub(super) fn coalesce(pending: Outbox, out: &mut Outbox) {
    if pending.len() < 2 {
        out.extend(pending);
        return;
    }
    out.reserve(pending.len());
    // Where each merged message is in `out`, and its forwards' bytes.
    let mut at: ahash::AHashMap<(Dest, PartitionId, u64, bool), (usize, usize)> = ahash::AHashMap::with_capacity(pending.len());
    for env in pending {
        let (key, bytes) = match &env.msg {
            Message::Forward { epoch, partition, updates, .. } => {
                ((env.to, *partition, *epoch, true), updates.iter().map(forward_bytes).sum::<usize>())
            }
            Message::StableUpTo { epoch, partition, .. } => ((env.to, *partition, *epoch, false), 0),
            _ => {
                out.push(env);
                continue;
            }
        };
        let i = match at.get_mut(&key) {
            Some((i, merged)) if *merged + bytes <= FORWARD_BYTES => {
                *merged += bytes;
                *i
            }
            _ => {
                at.insert(key, (out.len(), bytes));
                out.push(env);
                continue;
            }
        };
        match (&mut out[i].msg, env.msg) {
            (Message::Forward { updates, lazy, .. }, Message::Forward { updates: more, lazy: more_lazy, .. }) => {
                updates.extend(more);
                *lazy &= more_lazy;
            }
            (ack @ Message::StableUpTo { .. }, later @ Message::StableUpTo { .. }) => *ack = later,
            _ => unreachable!("keyed by kind"),
        }
    }
}
