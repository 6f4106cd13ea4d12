//! The segments of a tag: each a reserved range with one page of its size
//! mapped, whose page goes back to the device at a pause and comes back at
//! the same address at a resume, with its allocations' bytes copied to host
//! memory and back when the tag keeps a backup.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::host::{HostMemory, ToDevice, ToHost};
use crate::backend::{Backend, BackendError, BackendResult, CallKind, DevicePtr, PageHandle};
use crate::segment_source::SegmentSource;

/// Host memory is handed out in multiples of this, so a backup that grows a
/// little reuses what it has.
const HOST_STEP: u64 = 2 << 20;

/// One segment's pages and backup.
#[derive(Debug)]
struct Pages {
    /// Bytes reserved and mapped: the segment's size rounded up to the page
    /// granularity.
    span: u64,
    /// The page mapped at the base; `None` while paused.
    page: Option<PageHandle>,
    /// Host memory of its backups, kept from one pause to the next.
    host: Option<Box<dyn HostMemory>>,
    /// What the last pause copied and the next resume copies back: each
    /// range's address, length and place in `host`.
    saved: Vec<(DevicePtr, usize, usize)>,
}

/// A page or range whose release failed once it was unmapped, retried at the
/// next segment made or freed.
#[derive(Copy, Clone, Debug)]
enum Stray {
    Page(PageHandle),
    Range(DevicePtr, u64),
}

/// What the source's lock guards.
#[derive(Debug, Default)]
struct Book {
    /// Segments by base address.
    segments: BTreeMap<DevicePtr, Pages>,
    strays: Vec<Stray>,
}

/// A tag's [`SegmentSource`]: pages mapped by cachalot, which it can give back
/// and bring back at the same addresses. Every method is called with the
/// policy's lock held.
pub(crate) struct PageSource {
    /// Dropped before the backend.
    book: Mutex<Book>,
    backend: Arc<dyn Backend>,
}

impl fmt::Debug for PageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageSource")
            .field("segments", &self.len())
            .finish_non_exhaustive()
    }
}

impl PageSource {
    /// A source of segments on `backend`, which has virtual memory.
    pub(crate) fn new(backend: Arc<dyn Backend>) -> PageSource {
        PageSource {
            book: Mutex::new(Book::default()),
            backend,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        // Each change is made in one step after the device calls it needs
        // succeeded, so a poisoned lock still guards consistent state.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Releases `page`, unmapped by now, or keeps it to try again.
    fn release_page(&self, book: &mut Book, page: PageHandle) {
        if self.backend.release_page(page).is_err() {
            book.strays.push(Stray::Page(page));
        }
    }

    /// Tries the releases that failed before again.
    fn retry_strays(&self, book: &mut Book) {
        book.strays.retain(|stray| match *stray {
            Stray::Page(page) => self.backend.release_page(page).is_err(),
            Stray::Range(base, span) => self.backend.release_range(base, span).is_err(),
        });
    }

    fn span(&self, size: u64) -> u64 {
        let g = self.backend.capabilities().granularity.max(1);
        size.div_ceil(g).saturating_mul(g)
    }

    /// Whether segment `base` is known, and if so whether it is paused.
    pub(crate) fn paused(&self, base: DevicePtr) -> Option<bool> {
        self.lock().segments.get(&base).map(|p| p.page.is_none())
    }

    /// How many segments it holds.
    pub(crate) fn len(&self) -> usize {
        self.lock().segments.len()
    }

    /// Host memory kept for backups.
    pub(crate) fn host_bytes(&self) -> u64 {
        let book = self.lock();
        let kept = book.segments.values().filter_map(|p| p.host.as_ref());
        kept.map(|h| h.bytes().len() as u64).sum()
    }

    /// Copies `ranges` (each an address and a length inside the segment whose
    /// base goes with them) to host memory, kept for [`PageSource::restore`]:
    /// one batch of copies, one wait. Returns the bytes copied; on failure
    /// nothing is kept.
    pub(crate) fn back_up(
        &self,
        ranges: &[(DevicePtr, Vec<(DevicePtr, u64)>)],
    ) -> BackendResult<u64> {
        let mut book = self.lock();
        let segments = &mut book.segments;
        for (base, live) in ranges {
            let pages = known(segments, *base, CallKind::Download)?;
            let need: u64 = live.iter().map(|(_, len)| len).sum();
            let short = pages
                .host
                .as_ref()
                .is_none_or(|h| (h.bytes().len() as u64) < need);
            if need > 0 && short {
                pages.host = Some(
                    self.backend
                        .allocate_host(need.div_ceil(HOST_STEP) * HOST_STEP)?,
                );
            }
            pages.saved = place(live);
        }
        let mut copies = Vec::new();
        for (_, pages) in segments
            .iter_mut()
            .filter(|(b, _)| ranges.iter().any(|(r, _)| r == *b))
        {
            let Some(host) = pages.host.as_mut() else {
                continue;
            };
            let mut rest = host.bytes_mut();
            for (src, len, _) in &pages.saved {
                let (dst, tail) = std::mem::take(&mut rest).split_at_mut(*len);
                copies.push(ToHost { src: *src, dst });
                rest = tail;
            }
        }
        let copied = copies.iter().map(|c| c.dst.len() as u64).sum();
        let done = self.backend.download(&mut copies);
        drop(copies);
        if let Err(e) = done {
            segments.values_mut().for_each(|p| p.saved.clear());
            return Err(e);
        }
        Ok(copied)
    }

    /// Gives segment `base`'s page back to the device; its range stays.
    pub(crate) fn release(&self, base: DevicePtr) -> BackendResult<()> {
        let mut book = self.lock();
        let pages = known(&mut book.segments, base, CallKind::Unmap)?;
        let Some(page) = pages.page else {
            return Err(invalid(CallKind::Unmap, "segment is paused already"));
        };
        self.backend.unmap(base, pages.span)?;
        pages.page = None;
        self.release_page(&mut book, page);
        Ok(())
    }

    /// Maps a new page at paused segment `base`.
    pub(crate) fn restore(&self, base: DevicePtr) -> BackendResult<()> {
        let mut book = self.lock();
        let pages = known(&mut book.segments, base, CallKind::Map)?;
        if pages.page.is_some() {
            return Err(invalid(CallKind::Map, "segment is not paused"));
        }
        pages.page = Some(self.map_new_page(base, pages.span)?);
        Ok(())
    }

    /// Copies back what the last [`PageSource::back_up`] kept of the segments
    /// of `bases` (mapped by now): one batch, one wait. Returns the bytes
    /// copied; on failure they stay kept for another try.
    pub(crate) fn restore_bytes(&self, bases: &[DevicePtr]) -> BackendResult<u64> {
        let mut book = self.lock();
        let segments = &mut book.segments;
        let wanted = |b: &DevicePtr| bases.contains(b);
        let mut copies = Vec::new();
        for (_, pages) in segments.iter().filter(|(b, _)| wanted(b)) {
            let Some(host) = pages.host.as_ref() else {
                continue;
            };
            for (dst, len, at) in &pages.saved {
                copies.push(ToDevice {
                    src: &host.bytes()[*at..*at + *len],
                    dst: *dst,
                });
            }
        }
        let copied = copies.iter().map(|c| c.src.len() as u64).sum();
        self.backend.upload(&copies)?;
        for (_, pages) in segments.iter_mut().filter(|(b, _)| wanted(b)) {
            pages.saved.clear();
        }
        Ok(copied)
    }

    /// A new page of `span` bytes mapped at `base`.
    fn map_new_page(&self, base: DevicePtr, span: u64) -> BackendResult<PageHandle> {
        let page = self.backend.create_page(span)?;
        if let Err(e) = self.backend.map(base, page) {
            let _ = self.backend.release_page(page);
            return Err(e);
        }
        Ok(page)
    }
}

/// The host memory places of `live`'s ranges, one after the other.
fn place(live: &[(DevicePtr, u64)]) -> Vec<(DevicePtr, usize, usize)> {
    let mut at = 0usize;
    live.iter()
        .map(|(ptr, len)| {
            let len = *len as usize;
            at += len;
            (*ptr, len, at - len)
        })
        .collect()
}

fn known(
    segments: &mut BTreeMap<DevicePtr, Pages>,
    base: DevicePtr,
    call: CallKind,
) -> BackendResult<&mut Pages> {
    segments.get_mut(&base).ok_or(BackendError::InvalidAddress {
        call,
        what: "tag segment",
        value: base,
    })
}

fn invalid(call: CallKind, reason: &str) -> BackendError {
    BackendError::InvalidArgument {
        call,
        reason: reason.to_string(),
    }
}

impl SegmentSource for PageSource {
    fn allocate(&self, size: u64) -> BackendResult<DevicePtr> {
        let span = self.span(size);
        self.retry_strays(&mut self.lock());
        let base = self.backend.reserve_range(span)?;
        match self.map_new_page(base, span) {
            Ok(page) => {
                let pages = Pages {
                    span,
                    page: Some(page),
                    host: None,
                    saved: Vec::new(),
                };
                self.lock().segments.insert(base, pages);
                Ok(base)
            }
            Err(e) => {
                let _ = self.backend.release_range(base, span);
                Err(e)
            }
        }
    }

    /// Frees segment `ptr`: once its page is unmapped (the one step that may
    /// fail and leave it as it was), a release that fails is tried again
    /// later.
    fn free(&self, ptr: DevicePtr, _size: u64) -> BackendResult<()> {
        let mut book = self.lock();
        let pages = known(&mut book.segments, ptr, CallKind::SegmentFree)?;
        let (span, page) = (pages.span, pages.page);
        if page.is_some() {
            self.backend.unmap(ptr, span)?;
        }
        book.segments.remove(&ptr);
        if let Some(page) = page {
            self.release_page(&mut book, page);
        }
        if self.backend.release_range(ptr, span).is_err() {
            book.strays.push(Stray::Range(ptr, span));
        }
        self.retry_strays(&mut book);
        Ok(())
    }
}
