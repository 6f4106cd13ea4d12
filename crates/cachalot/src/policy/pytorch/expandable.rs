//! Expandable segments: a reserved virtual range per (stream, pool) of about 9/8 of
//! device memory, into which pages (2 MiB for the small pool, 20 MiB for the large)
//! are mapped as the segment grows and unmapped when `empty_cache` finds them free.

use crate::backend::{Backend, BackendError, BackendResult, DevicePtr, PageHandle, StreamId};

/// The page bookkeeping of one expandable segment.
#[derive(Debug)]
pub(crate) struct ExpandableSegment {
    /// Bytes per page.
    pub(crate) page: u64,
    /// The page mapped at each page index, if any.
    pages: Vec<Option<PageHandle>>,
}

/// A byte range `(offset, len)` relative to the segment base.
pub(crate) type Span = (u64, u64);

/// What an unmap achieved: the pages actually unmapped, and the first failure.
#[derive(Debug, Default)]
pub(crate) struct Unmapped {
    /// The unmapped range, if any page was unmapped.
    pub(crate) span: Option<Span>,
    /// The backend error that stopped it early.
    pub(crate) error: Option<BackendError>,
    /// Pages unmapped whose release failed; to be retried later.
    pub(crate) orphans: Vec<PageHandle>,
}

impl ExpandableSegment {
    /// Reserves a range for a segment of the given pool on a device of
    /// `total_memory` bytes; returns its base, its size and its bookkeeping.
    pub(crate) fn reserve(
        backend: &dyn Backend,
        total_memory: u64,
        page: u64,
    ) -> BackendResult<(DevicePtr, u64, Self)> {
        let count = (total_memory + total_memory / 8).div_ceil(page);
        let size = count * page;
        let base = backend.reserve_range(size)?;
        let pages = vec![None; usize::try_from(count).unwrap_or(usize::MAX)];
        Ok((base, size, ExpandableSegment { page, pages }))
    }

    /// Bytes currently mapped.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.pages.iter().filter(|p| p.is_some()).count() as u64 * self.page
    }

    /// Whether every page overlapping `[offset, offset + len)` is mapped (`want`) or
    /// unmapped (`!want`).
    pub(crate) fn pages_are(&self, offset: u64, len: u64, want: bool) -> bool {
        let (begin, end) = (offset / self.page, (offset + len).div_ceil(self.page));
        (begin..end).all(|i| {
            self.pages
                .get(i as usize)
                .is_some_and(|p| p.is_some() == want)
        })
    }

    /// Maps the pages covering `[offset, offset + len)` (`offset` page-aligned).
    /// `Ok(None)` when the device is out of memory; nothing stays mapped then.
    pub(crate) fn map(
        &mut self,
        backend: &dyn Backend,
        base: DevicePtr,
        offset: u64,
        len: u64,
    ) -> BackendResult<Option<Span>> {
        let (begin, end) = (offset / self.page, (offset + len).div_ceil(self.page));
        let mut created = Vec::new();
        for _ in begin..end {
            match backend.create_page(self.page) {
                Ok(h) => created.push(h),
                Err(e) => {
                    release_all(backend, &created);
                    return if e.is_out_of_memory() {
                        Ok(None)
                    } else {
                        Err(e)
                    };
                }
            }
        }
        for (k, h) in created.iter().enumerate() {
            let addr = base + (begin + k as u64) * self.page;
            if let Err(e) = backend.map(addr, *h) {
                for j in 0..k as u64 {
                    // Best effort: the mapping was made by us a moment ago.
                    let _ = backend.unmap(base + (begin + j) * self.page, self.page);
                }
                release_all(backend, &created);
                return Err(e);
            }
        }
        for (k, h) in created.into_iter().enumerate() {
            self.pages[(begin as usize) + k] = Some(h);
        }
        Ok(Some((begin * self.page, (end - begin) * self.page)))
    }

    /// Unmaps the whole pages inside `[offset, offset + len)`, after waiting for
    /// `stream` (unmapping does not wait for queued work by itself).
    pub(crate) fn unmap(
        &mut self,
        backend: &dyn Backend,
        base: DevicePtr,
        offset: u64,
        len: u64,
        stream: StreamId,
    ) -> Unmapped {
        let (begin, end) = (offset.div_ceil(self.page), (offset + len) / self.page);
        let mut out = Unmapped::default();
        if begin >= end {
            return out;
        }
        if let Err(e) = backend.synchronize_stream(stream) {
            out.error = Some(e);
            return out;
        }
        let mut done = begin;
        while done < end {
            let Some(handle) = self.pages[done as usize] else {
                break;
            };
            if let Err(e) = backend.unmap(base + done * self.page, self.page) {
                out.error = Some(e);
                break;
            }
            self.pages[done as usize] = None;
            if backend.release_page(handle).is_err() {
                out.orphans.push(handle);
            }
            done += 1;
        }
        if done > begin {
            out.span = Some((begin * self.page, (done - begin) * self.page));
        }
        out
    }
}

fn release_all(backend: &dyn Backend, pages: &[PageHandle]) {
    for h in pages {
        // Best effort: these pages were never mapped.
        let _ = backend.release_page(*h);
    }
}
