//! The name of a private pool, below every module that names one in a
//! message or a record ([`crate::private_pool`] re-exports it).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A private pool's name: PyTorch's `MempoolId_t`, a pair of integers. CUDA
/// graphs made without a pool use `(id, 0)`; `graph_pool_handle()` and
/// `MemPool` use `(0, id)`. `(0, 0)` names the default pools.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// The default pools, which serve every request no route claims.
    pub const DEFAULT: PoolId = PoolId(0, 0);

    /// Whether this names the default pools.
    pub fn is_default(self) -> bool {
        self == PoolId::DEFAULT
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}
