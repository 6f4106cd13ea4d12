//! The policy's statistics: each stream's [`ledger`] (every block and page
//! transition, applied to the stream's figures), and the exact device-wide
//! peaks with several streams, worked out from the streams' journals without
//! a device lock on the hot path (`journal`, `stamp`, `merge`, `settler`).

pub(crate) mod journal;
pub(crate) mod ledger;
pub(crate) mod levels;
pub(crate) mod merge;
pub(crate) mod settler;
pub(crate) mod stamp;
pub(crate) mod tally;
