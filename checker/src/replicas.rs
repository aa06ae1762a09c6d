//! The replicas' state once a run has settled: `converged` compares the
//! replicas of every partition and `durable` looks for every acknowledged
//! write in them. They read `Digest`s (a replica's applied and stable
//! positions and its latest version of every key), which the simulator
//! takes from its nodes directly.

use bytes::Bytes;
use causeway_core::chain::Digest;
use causeway_core::version::Version;
use std::collections::HashMap;

/// Every replica of every partition (by partition, then chain position,
/// as `causeway_sim::Sim::digests` gives them) holds the same data, with
/// nothing left unstable.
pub fn converged(digests: &[Vec<Digest>]) -> Result<(), String> {
    for (p, replicas) in digests.iter().enumerate() {
        for (i, r) in replicas.iter().enumerate() {
            if r.applied != r.stable {
                return Err(format!("partition {p} replica {i} applied {} but only {} stable", r.applied, r.stable));
            }
            if r != &replicas[0] {
                let (h, fingerprint) = (&replicas[0], Digest::fingerprint);
                return Err(format!(
                    "partition {p} replica {i} differs from the head: applied {} (head {}), {} keys (head {}), data {:x} (head {:x})",
                    r.applied,
                    h.applied,
                    r.latest.len(),
                    h.latest.len(),
                    fingerprint(r),
                    fingerprint(h)
                ));
            }
        }
    }
    Ok(())
}

/// Every acknowledged write (key, version) is in the heads of `digests`, or
/// overwritten by a newer version.
pub fn durable(digests: &[Vec<Digest>], acknowledged: &[(Bytes, Version)]) -> Result<(), String> {
    let latest: HashMap<&Bytes, &Version> =
        digests.iter().filter_map(|replicas| replicas.first()).flat_map(|head| head.latest.iter().map(|(k, s)| (k, &s.version))).collect();
    for (key, version) in acknowledged {
        let have = latest.get(key);
        if have.is_none_or(|h| *h < version) {
            return Err(format!("acknowledged write {key:?}@{version} lost (have {have:?})"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Each check catches a known-bad final state.
    use super::*;
    use causeway_core::hlc::Timestamp;

    fn v(ts: u64) -> Version {
        Version::local(0, Timestamp::new(ts, 0))
    }

    fn digest(applied: u64, stable: u64, latest: &[(&str, &str, u64)]) -> Digest {
        let latest = latest
            .iter()
            .map(|&(k, value, ts)| {
                let stored = causeway_core::store::Stored {
                    version: v(ts),
                    seq: 0,
                    value: Some(Bytes::from(value.to_string())),
                    expires_at_ms: None,
                };
                (Bytes::from(k.to_string()), stored)
            })
            .collect();
        Digest { applied, stable, latest }
    }

    #[test]
    fn a_lost_acknowledged_write_is_caught() {
        let replicas = vec![vec![digest(1, 1, &[("k", "old", 5)]); 3]];
        assert_eq!(durable(&replicas, &[(Bytes::from("k"), v(5))]), Ok(()));
        let lost = durable(&replicas, &[(Bytes::from("k"), v(10))]).unwrap_err();
        assert!(lost.contains("lost"), "{lost}");
    }

    #[test]
    fn diverged_replicas_are_caught() {
        let same = digest(2, 2, &[("k", "a", 10), ("x", "b", 20)]);
        assert_eq!(converged(&[vec![same.clone(); 3]]), Ok(()));
        // A middle replica that missed the write to x, at the same position.
        let mut missed = same.clone();
        missed.latest.pop();
        let diverged = converged(&[vec![same.clone(), missed, same.clone()]]).unwrap_err();
        assert!(diverged.contains("replica 1 differs"), "{diverged}");
        // A tail that never declared its last update stable.
        let unstable = converged(&[vec![same.clone(), same, digest(2, 1, &[("k", "a", 10), ("x", "b", 20)])]]).unwrap_err();
        assert!(unstable.contains("only 1 stable"), "{unstable}");
    }
}
