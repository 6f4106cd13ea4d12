//! Hash maps keyed by device addresses: the allocators' address indexes and
//! the history's live allocations.
//!
//! One folded multiplication instead of SipHash (the maps are private, so no
//! untrusted keys). Folding the 128-bit product puts every address bit into
//! both the low bits (the bucket) and the high bits (the tag): addresses are
//! 512-byte aligned, so a plain product's low bits are zero.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::backend::DevicePtr;

/// See the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct AddrHasher(u64);

const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = fold_mul(self.0 ^ u64::from(*b), MIX);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = fold_mul(self.0 ^ n, MIX);
    }
}

/// A map keyed by device address.
pub(crate) type AddrMap<V> = HashMap<DevicePtr, V, BuildHasherDefault<AddrHasher>>;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        let build = BuildHasherDefault::<AddrHasher>::default();
        let buckets: BTreeSet<u64> = (0..256u64)
            .map(|k| build.hash_one(0x7f00_0000_0000 + k * 512) & 0xff)
            .collect();
        assert!(buckets.len() > 128, "{} buckets of 256", buckets.len());
    }
}
