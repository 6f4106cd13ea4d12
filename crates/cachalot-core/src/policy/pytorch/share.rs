//! What backs a live allocation, for another process to open it (CUDA IPC):
//! the segment of a plain block, the pages under an expandable one.

use crate::backend::DevicePtr;
use crate::backing::Backing;
use crate::error::{Error, Result};

use super::state::State;

impl State {
    /// What backs the live allocation at `ptr`, for another process to open.
    pub(crate) fn backing(&self, ptr: DevicePtr) -> Result<Backing> {
        let id = self.live_block(ptr)?;
        let b = &self.blocks[id];
        let seg = &self.segments[b.segment];
        let Some(ex) = &seg.expandable else {
            return Ok(Backing::Segment { base: seg.base });
        };
        let (first, pages) = ex.pages_under(b.addr - seg.base, b.size).ok_or_else(|| {
            Error::InvalidArgument(format!("allocation {ptr:#x} lies on unmapped pages"))
        })?;
        Ok(Backing::Pages {
            base: seg.base + first * ex.page,
            pages: pages.into_iter().map(|p| (p, ex.page)).collect(),
        })
    }
}
