//! The group's Reed-Solomon code (reed-solomon-erasure, GF(2^8)): K data
//! shards, M parity shards. A parity member never re-encodes a stripe: a
//! data member ships `old ^ new` of the bytes it changed, and parity `j`
//! adds `coefficient(j, i) * diff` in place (the code is linear), which is
//! what makes small in-place updates cheap.

use reed_solomon_erasure::galois_8::{self, ReedSolomon};

pub struct Code {
    k: usize,
    m: usize,
    rs: ReedSolomon,
    /// `coef[j][i]`: data shard i's coefficient in parity shard j.
    coef: Vec<Vec<u8>>,
}

impl Code {
    pub fn new(k: usize, m: usize) -> Result<Code, String> {
        if k == 0 || m == 0 || k + m > 64 {
            return Err(format!("ec:{k}+{m}: need at least one data and one parity member, at most 64 in all"));
        }
        let rs = ReedSolomon::new(k, m).map_err(|e| format!("ec:{k}+{m}: {e:?}"))?;
        let mut coef = vec![vec![0u8; k]; m];
        for i in 0..k {
            // The code's column for data shard i: encode the unit vector.
            let mut shards = vec![vec![0u8; 1]; k + m];
            shards[i][0] = 1;
            rs.encode(&mut shards).expect("shard sizes agree");
            for j in 0..m {
                coef[j][i] = shards[k + j][0];
            }
        }
        Ok(Code { k, m, rs, coef })
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn m(&self) -> usize {
        self.m
    }

    /// `parity ^= coefficient(j, i) * diff`: parity shard j's share of data
    /// shard i's change.
    pub fn add_delta(&self, j: usize, i: usize, diff: &[u8], parity: &mut [u8]) {
        galois_8::mul_slice_xor(self.coef[j][i], diff, parity);
    }

    /// Fills every data shard that is `None` from the others (at least K of
    /// the K+M present, all the same length).
    pub fn reconstruct_data(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), String> {
        self.rs.reconstruct_data(shards).map_err(|e| format!("cannot decode: {e:?}"))
    }

    /// The parity shards of whole data shards (checks and benchmarks).
    pub fn encode(&self, shards: &mut [Vec<u8>]) -> Result<(), String> {
        self.rs.encode(shards).map_err(|e| format!("cannot encode: {e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parity_deltas_equal_a_full_encode() {
        let code = Code::new(3, 2).unwrap();
        let n = 64;
        let mut shards: Vec<Vec<u8>> = (0..5).map(|s| (0..n).map(|b| (s * 31 + b * 7) as u8).collect()).collect();
        code.encode(&mut shards).unwrap();
        // Change data shard 1 and fold the diff into both parities.
        let new: Vec<u8> = (0..n).map(|b| (b * 13 + 5) as u8).collect();
        let diff: Vec<u8> = shards[1].iter().zip(&new).map(|(a, b)| a ^ b).collect();
        let mut parity = [shards[3].clone(), shards[4].clone()];
        for (j, p) in parity.iter_mut().enumerate() {
            code.add_delta(j, 1, &diff, p);
        }
        shards[1] = new;
        code.encode(&mut shards).unwrap();
        assert_eq!(parity[0], shards[3]);
        assert_eq!(parity[1], shards[4]);
        // Any two lost data shards come back.
        let mut lost: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
        lost[0] = None;
        lost[1] = None;
        code.reconstruct_data(&mut lost).unwrap();
        assert_eq!(lost[0].as_ref().unwrap(), &shards[0]);
        assert_eq!(lost[1].as_ref().unwrap(), &shards[1]);
    }
}
