//! Virtual memory: the device's page supply all streams share (`pages`), the
//! cells of a reserved range and the extents mapped over them (`cells`), the
//! mappings a moved page leaves behind (`aliases`), and the ranges each
//! stream publishes for frees to find it (`ranges`). Bookkeeping and driver
//! calls only: which page goes where is the stream's mapping engine's.

pub(crate) mod aliases;
pub(crate) mod cells;
pub(crate) mod pages;
pub(crate) mod ranges;
