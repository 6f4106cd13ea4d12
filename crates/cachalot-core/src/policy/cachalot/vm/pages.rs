//! The device side shared by all streams: physical pages and segments obtained
//! from the backend, counted against the memory-fraction limit.
//!
//! Only slow paths come here (a stream needing a page or segment it does not
//! cache), so one atomic counter is all the sharing there is.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, BackendError, BackendResult, CallKind, DevicePtr, PageHandle};
use crate::private_pool::SegmentSource;

/// Handles of any length up to `cachalot_extent` are made only while the
/// device (or the limit) stays at most 1/N full with them; past it, streams
/// keep the tight budget and a handle has at most [`PRESSED_EXTENT`] pages
/// (Note [Extents] in docs/cachalot-policy.md).
const EXTENT_MARGIN: u64 = 2;
/// Pages of one handle at most while the device is more than half full:
/// 20 MiB of 2 MiB pages, the size of expandable segments' handles. Under
/// pressure a handle a live block still touches holds all its pages, so
/// with up to 64 MiB the llama and DDP GPT-2 recordings needed 20 to 22 MiB
/// more than expandable segments (with 16 pages, llama_serve 30 MiB more);
/// page by page, a random recording of a million events (tests/pressure.rs)
/// made 5.1 million driver calls on a 24 GiB device, where expandable
/// segments made 0.97 million (1.14 million with this cap).
const PRESSED_EXTENT: u32 = 10;
/// Address space the ranges of one allocator may take together: half of
/// x86-64's 47-bit user space (128 TiB), which with unified addressing the
/// process's host memory and every CUDA library share with the device's
/// ranges. An H200 granted 128 TiB of ranges in all (233 of four times its
/// memory, 832 of 1.125 times), so without a bound the ranges of 156
/// streams (each pool's full range: 6 times the device's memory) took all
/// of it; past this one, ranges are halved ([`Pages::reserve_range`]).
const ADDRESS_BUDGET: u64 = 64 << 40;
/// What device segments are rounded up to, without virtual memory (the
/// small pool's segment size).
pub(crate) const SEGMENT_UNIT: u64 = 2 << 20;

/// See the module docs.
pub(crate) struct Pages {
    backend: Arc<dyn Backend>,
    granularity: u64,
    /// Bytes this allocator may hold (the memory fraction); `u64::MAX` = no limit.
    limit: AtomicU64,
    /// Bytes held now in pages and segments.
    held: AtomicU64,
    /// The device's memory, or the limit where lower, in whole pages (in
    /// whole segment units without virtual memory): no request of more is
    /// ever served.
    most: AtomicU64,
    /// Bytes of address space held in reserved ranges.
    ranges: AtomicU64,
    /// Unmapped handles (with their bytes) whose release failed; retried by
    /// [`Pages::retry_orphans`].
    orphans: Mutex<Vec<(PageHandle, u64)>>,
    /// Whether a route to a private pool is open (as during a CUDA graph
    /// capture, when no stream or event may be waited for or queried).
    quiet: AtomicBool,
    /// `graph_capture_record_stream_reuse`: while quiet, a block freed after
    /// `record_stream` is reused once the capture's graph orders it.
    capture_reuse: AtomicBool,
}

impl fmt::Debug for Pages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pages")
            .field("held", &self.held())
            .field("limit", &self.limit())
            .finish()
    }
}

impl Pages {
    /// Pages of the backend's granularity.
    /// A granularity that is not a power of two (no GPU has one) is treated
    /// as no virtual memory: cells are found by shifts.
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Pages {
        let granularity = Some(backend.capabilities().granularity)
            .filter(|g| g.is_power_of_two())
            .unwrap_or(0);
        let pages = Pages {
            backend,
            granularity,
            limit: AtomicU64::new(u64::MAX),
            held: AtomicU64::new(0),
            most: AtomicU64::new(0),
            ranges: AtomicU64::new(0),
            orphans: Mutex::new(Vec::new()),
            quiet: AtomicBool::new(false),
            capture_reuse: AtomicBool::new(false),
        };
        pages.set_limit(None);
        pages
    }

    /// Whether streams must not wait or query events now: while a route to a
    /// private pool is open, streams neither re-map cached pages (which waits
    /// for the stream) nor complete cross-stream frees.
    pub(crate) fn quiet(&self) -> bool {
        self.quiet.load(Ordering::Relaxed)
    }

    /// Sets [`Pages::quiet`].
    pub(crate) fn set_quiet(&self, quiet: bool) {
        self.quiet.store(quiet, Ordering::Relaxed);
    }

    /// Whether frees during a capture may be reused once its graph orders
    /// them (`graph_capture_record_stream_reuse`).
    pub(crate) fn capture_reuse(&self) -> bool {
        self.capture_reuse.load(Ordering::Relaxed)
    }

    /// Sets [`Pages::capture_reuse`].
    pub(crate) fn set_capture_reuse(&self, on: bool) {
        self.capture_reuse.store(on, Ordering::Relaxed);
    }

    /// The backend.
    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The page size (0 without virtual memory).
    pub(crate) fn granularity(&self) -> u64 {
        self.granularity
    }

    /// Sets the byte limit (`None` = none).
    pub(crate) fn set_limit(&self, limit: Option<u64>) {
        let limit = limit.unwrap_or(u64::MAX);
        self.limit.store(limit, Ordering::Relaxed);
        let unit = match self.granularity {
            0 => SEGMENT_UNIT,
            g => g,
        };
        let most = limit.min(self.backend.capabilities().total_memory);
        self.most.store(most / unit * unit, Ordering::Relaxed);
    }

    /// Whether a block of `bytes` could ever be served: it fits in the
    /// device's memory (or under the limit), whole pages counted. What
    /// could not is refused before any driver call.
    pub(crate) fn ever_fits(&self, bytes: u64) -> bool {
        bytes <= self.most.load(Ordering::Relaxed)
    }

    /// The most pages of one new handle for `wanted` cells: all of them
    /// while the device (or the limit) stays at most half full with them
    /// ([`EXTENT_MARGIN`]), else at most [`PRESSED_EXTENT`]. A handle maps
    /// and goes back only whole, so one a live block still touches holds all
    /// its pages (Note [Extents] in docs/cachalot-policy.md).
    pub(crate) fn extent_cap(&self, wanted: u32) -> u32 {
        let bytes = u64::from(wanted).saturating_mul(self.granularity());
        match self.held().saturating_add(bytes) <= self.half_full() {
            true => wanted,
            false => wanted.min(PRESSED_EXTENT),
        }
    }

    /// Whether the device (or the limit) is more than half full
    /// ([`EXTENT_MARGIN`]): streams then keep the tight budget
    /// (`budget::PRESSED_SLACK`).
    pub(crate) fn pressed(&self) -> bool {
        self.held() > self.half_full()
    }

    /// The bytes held past which the device counts as under pressure
    /// ([`EXTENT_MARGIN`]).
    fn half_full(&self) -> u64 {
        let most = self.most.load(Ordering::Relaxed);
        most - most / EXTENT_MARGIN
    }

    /// The byte limit, if any.
    pub(crate) fn limit(&self) -> Option<u64> {
        Some(self.limit.load(Ordering::Relaxed)).filter(|l| *l != u64::MAX)
    }

    /// Whole pages the device (or the limit) has left.
    pub(crate) fn free_pages(&self) -> u64 {
        let most = self.most.load(Ordering::Relaxed);
        most.saturating_sub(self.held()) / self.granularity.max(1)
    }

    /// Bytes held in pages and segments.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Counts `bytes` against the limit (and the device's memory), or fails
    /// with out-of-memory.
    fn charge(&self, call: CallKind, bytes: u64) -> BackendResult<()> {
        // Within the limit and the device's memory: past that, the driver
        // would only refuse (under pressure, one call in 60 was a refusal).
        let most = self.most.load(Ordering::Relaxed);
        let fits = |held: u64| held.checked_add(bytes).filter(|h| *h <= most);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, fits)
            .map(|_| ())
            .map_err(|_| BackendError::OutOfMemory {
                call,
                requested: bytes,
            })
    }

    fn refund(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Creates one handle of `n` pages.
    pub(crate) fn create_pages(&self, n: u32) -> BackendResult<PageHandle> {
        let bytes = u64::from(n) * self.granularity;
        self.charge(CallKind::CreatePage, bytes)?;
        self.backend
            .create_page(bytes)
            .inspect_err(|_| self.refund(bytes))
    }

    /// Releases an unmapped handle of `n` pages; a handle the backend refuses
    /// is kept as an orphan and retried later.
    pub(crate) fn release_pages(&self, page: PageHandle, n: u32) -> BackendResult<()> {
        let bytes = u64::from(n) * self.granularity;
        if let Err(e) = self.backend.release_page(page) {
            self.lock_orphans().push((page, bytes));
            return Err(e);
        }
        self.refund(bytes);
        Ok(())
    }

    fn lock_orphans(&self) -> std::sync::MutexGuard<'_, Vec<(PageHandle, u64)>> {
        self.orphans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tries again to release the orphaned handles.
    pub(crate) fn retry_orphans(&self) -> BackendResult<()> {
        let mut orphans = self.lock_orphans();
        let mut result = Ok(());
        orphans.retain(|(page, bytes)| match self.backend.release_page(*page) {
            Ok(()) => {
                self.refund(*bytes);
                false
            }
            Err(e) => {
                result = Err(e);
                true
            }
        });
        result
    }

    /// Bytes held from the device, less those in orphaned pages (read together).
    pub(crate) fn held_in_use(&self) -> u64 {
        let orphans = self.lock_orphans();
        self.held() - orphans.iter().map(|(_, bytes)| bytes).sum::<u64>()
    }

    /// Reserves a range of `wanted` bytes of address space (a whole number of
    /// pages), or of half that, and so on down to `least` bytes, while the
    /// ranges held would pass [`ADDRESS_BUDGET`] or the driver refuses: a
    /// stream among many gets a smaller range, where it would get none. Past
    /// the budget, ranges of `least` bytes are still asked for. The range's
    /// base and size.
    pub(crate) fn reserve_range(&self, wanted: u64, least: u64) -> BackendResult<(DevicePtr, u64)> {
        let unit = self.granularity.max(1);
        let least = least.div_ceil(unit).max(1) * unit;
        let mut size = wanted.div_ceil(unit).saturating_mul(unit).max(least);
        loop {
            let half = (size / 2 / unit * unit).max(least);
            let held = self.ranges.load(Ordering::Relaxed);
            if held.saturating_add(size) > ADDRESS_BUDGET && half < size {
                size = half;
                continue;
            }
            match self.backend.reserve_range(size) {
                Ok(base) => {
                    self.ranges.fetch_add(size, Ordering::AcqRel);
                    return Ok((base, size));
                }
                Err(e) if e.is_out_of_memory() && half < size => size = half,
                Err(e) => return Err(e),
            }
        }
    }

    /// Releases a range [`Pages::reserve_range`] reserved.
    pub(crate) fn release_range(&self, base: DevicePtr, size: u64) -> BackendResult<()> {
        self.backend.release_range(base, size)?;
        self.ranges.fetch_sub(size, Ordering::AcqRel);
        Ok(())
    }

    /// Allocates a segment from `source` (a private pool's own allocator)
    /// or the device.
    pub(crate) fn allocate_segment(
        &self,
        source: Option<&dyn SegmentSource>,
        size: u64,
    ) -> BackendResult<DevicePtr> {
        self.charge(CallKind::SegmentAlloc, size)?;
        match source {
            Some(s) => s.allocate(size),
            None => self.backend.allocate_segment(size),
        }
        .inspect_err(|_| self.refund(size))
    }

    /// Frees a segment of `size` bytes to where it came from.
    pub(crate) fn free_segment(
        &self,
        source: Option<&dyn SegmentSource>,
        base: DevicePtr,
        size: u64,
    ) -> BackendResult<()> {
        match source {
            Some(s) => s.free(base, size)?,
            None => self.backend.free_segment(base)?,
        }
        self.refund(size);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::counting::Counting;
    use crate::backend::sim::SimBackend;

    #[test]
    fn the_limit_is_enforced_and_refunded() {
        let sim = Arc::new(Counting::new(Arc::new(SimBackend::new(1 << 30))));
        let pages = Pages::new(sim.clone());
        pages.set_limit(Some(4 << 20));
        let a = pages.create_pages(1).unwrap();
        assert_eq!(pages.free_pages(), 1);
        let b = pages.create_pages(1).unwrap();
        assert!(pages.create_pages(1).unwrap_err().is_out_of_memory());
        assert_eq!(pages.free_pages(), 0);
        assert_eq!(
            sim.counts().count(CallKind::CreatePage),
            2,
            "the limit answers without a call"
        );
        pages.release_pages(a, 1).unwrap();
        assert_eq!(pages.held(), 2 << 20);
        pages.release_pages(b, 1).unwrap();
        pages.set_limit(None);
        let c = pages.create_pages(3).unwrap();
        assert_eq!(pages.held(), 6 << 20, "one handle of three pages");
        pages.release_pages(c, 3).unwrap();
        let s = pages.allocate_segment(None, 8 << 20).unwrap();
        pages.free_segment(None, s, 8 << 20).unwrap();
        assert_eq!((pages.held(), sim.inner().live_objects()), (0, 0));
    }

    #[test]
    fn ranges_shrink_where_address_space_is_short() {
        use crate::backend::faults::{Fault, Faults};
        let sim = Arc::new(Faults::new(Arc::new(SimBackend::new(1 << 30))));
        let pages = Pages::new(sim.clone());
        sim.fail_nth(CallKind::ReserveRange, 1, Fault::OutOfMemory);
        let (a, size) = pages.reserve_range(64 << 20, 3 << 20).unwrap();
        assert_eq!(size, 32 << 20, "refused once: half");
        let (odd, size) = pages.reserve_range((5 << 20) + 1, 1).unwrap();
        assert_eq!(size, 6 << 20, "whole pages");
        pages.release_range(odd, size).unwrap();
        const TIB: u64 = 1 << 40;
        let held: Vec<_> = (0..3)
            .map(|_| pages.reserve_range(20 * TIB, 2 << 20).unwrap())
            .collect();
        assert!(held.iter().all(|(_, s)| *s == 20 * TIB));
        let (b, size) = pages.reserve_range(20 * TIB, 2 << 20).unwrap();
        assert_eq!(size, 5 * TIB / 2, "within 64 TiB in all");
        let (least, size) = pages.reserve_range(20 * TIB, 2 * TIB).unwrap();
        assert_eq!(size, 2 * TIB, "past the budget, the least asked for");
        sim.fail_nth(CallKind::ReserveRange, 1, Fault::OutOfMemory);
        let refused = pages.reserve_range(4 << 20, 4 << 20).unwrap_err();
        assert!(refused.is_out_of_memory(), "not below the least asked for");
        sim.fail_nth(CallKind::ReserveRange, 1, Fault::DeviceError);
        let failed = pages.reserve_range(64 << 20, 2 << 20).unwrap_err();
        assert!(
            !failed.is_out_of_memory(),
            "a device error is not retried smaller"
        );
        let rest = [(a, 32 << 20), (b, 5 * TIB / 2), (least, 2 * TIB)];
        for (base, size) in held.into_iter().chain(rest) {
            pages.release_range(base, size).unwrap();
        }
        assert_eq!(pages.reserve_range(20 * TIB, 2 << 20).unwrap().1, 20 * TIB);
    }

    #[test]
    fn past_half_the_device_handles_are_capped() {
        let sim = Arc::new(SimBackend::new(64 << 20));
        let pages = Pages::new(sim.clone());
        assert_eq!(pages.extent_cap(16), 16, "32 MiB keeps 64 MiB half full");
        assert_eq!(pages.extent_cap(17), PRESSED_EXTENT);
        assert_eq!(pages.extent_cap(3), 3, "fewer than the cap stay whole");
        let held = pages.create_pages(12).unwrap();
        assert_eq!(pages.extent_cap(4), 4);
        assert_eq!(
            (pages.extent_cap(5), pages.extent_cap(11)),
            (5, PRESSED_EXTENT)
        );
        pages.set_limit(Some(32 << 20));
        assert_eq!(pages.extent_cap(1), 1, "under a limit, half of it");
        assert_eq!(pages.extent_cap(40), PRESSED_EXTENT);
        pages.release_pages(held, 12).unwrap();
        assert_eq!(pages.extent_cap(8), 8);
    }

    #[test]
    fn past_the_devices_memory_no_call_is_made() {
        let sim = Arc::new(Counting::new(Arc::new(SimBackend::new(8 << 20))));
        let pages = Pages::new(sim.clone());
        let a = pages.create_pages(3).unwrap();
        assert!(pages.create_pages(2).unwrap_err().is_out_of_memory());
        let b = pages.create_pages(1).unwrap();
        assert!(pages.create_pages(1).unwrap_err().is_out_of_memory());
        assert_eq!(sim.counts().count(CallKind::CreatePage), 2);
        pages.release_pages(a, 3).unwrap();
        pages.release_pages(b, 1).unwrap();
        assert_eq!((pages.held(), sim.inner().live_objects()), (0, 0));
    }
}
