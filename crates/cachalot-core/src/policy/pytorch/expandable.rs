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

/// A page whose cleanup failed: still mapped at an address, or only unreleased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Orphan {
    /// Where it is still mapped (address, bytes), if it is.
    pub(crate) mapped: Option<(DevicePtr, u64)>,
    /// The page.
    pub(crate) page: PageHandle,
}

impl Orphan {
    /// Tries again to unmap and release the page; returns whether it is gone.
    pub(crate) fn retry(&mut self, backend: &dyn Backend) -> bool {
        if let Some((addr, size)) = self.mapped {
            if backend.unmap(addr, size).is_err() {
                return false;
            }
            self.mapped = None;
        }
        backend.release_page(self.page).is_ok()
    }
}

/// What an unmap achieved: the pages actually unmapped, and the first failure.
#[derive(Debug, Default)]
pub(crate) struct Unmapped {
    /// The unmapped range, if any page was unmapped.
    pub(crate) span: Option<Span>,
    /// The backend error that stopped it early.
    pub(crate) error: Option<BackendError>,
    /// Pages unmapped whose release failed; to be retried later.
    pub(crate) orphans: Vec<Orphan>,
}

impl ExpandableSegment {
    /// The pages under `offset..offset + len` (relative to the base), from the
    /// first page index, or `None` when one of them is not mapped.
    pub(crate) fn pages_under(&self, offset: u64, len: u64) -> Option<(u64, Vec<PageHandle>)> {
        let first = offset / self.page;
        let end = (offset + len.max(1)).div_ceil(self.page);
        let pages = (first..end)
            .map(|i| self.pages.get(i as usize).copied().flatten())
            .collect::<Option<Vec<_>>>()?;
        Some((first, pages))
    }

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
    /// Pages whose cleanup after a failure failed go to `orphans`.
    pub(crate) fn map(
        &mut self,
        backend: &dyn Backend,
        base: DevicePtr,
        offset: u64,
        len: u64,
        orphans: &mut Vec<Orphan>,
    ) -> BackendResult<Option<Span>> {
        let (begin, end) = (offset / self.page, (offset + len).div_ceil(self.page));
        let mut created = Vec::new();
        for _ in begin..end {
            match backend.create_page(self.page) {
                Ok(page) => created.push(Orphan { mapped: None, page }),
                Err(e) => {
                    abandon(backend, created, orphans);
                    return if e.is_out_of_memory() {
                        Ok(None)
                    } else {
                        Err(e)
                    };
                }
            }
        }
        for k in 0..created.len() {
            let addr = base + (begin + k as u64) * self.page;
            if let Err(e) = backend.map(addr, created[k].page) {
                abandon(backend, created, orphans);
                return Err(e);
            }
            created[k].mapped = Some((addr, self.page));
        }
        for (k, o) in created.into_iter().enumerate() {
            self.pages[(begin as usize) + k] = Some(o.page);
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
                out.orphans.push(Orphan {
                    mapped: None,
                    page: handle,
                });
            }
            done += 1;
        }
        if done > begin {
            out.span = Some((begin * self.page, (done - begin) * self.page));
        }
        out
    }
}

/// Undoes a partial map; what cannot be undone now is kept for a later retry.
fn abandon(backend: &dyn Backend, pages: Vec<Orphan>, orphans: &mut Vec<Orphan>) {
    for mut o in pages {
        if !o.retry(backend) {
            orphans.push(o);
        }
    }
}
