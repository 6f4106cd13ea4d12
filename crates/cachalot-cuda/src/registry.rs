//! What the CUDA backend has handed out and not yet taken back: segments, reserved
//! ranges with their mappings, pages, events and streams.
//!
//! The driver crashes or corrupts memory when handed an address it does not know,
//! so every call is checked here first. The checks are pure bookkeeping: no driver
//! call, testable without a GPU. A `check_*` method validates and changes nothing;
//! the matching `add_*`/`remove_*` method records what the driver then did.

use std::collections::{BTreeMap, HashMap, HashSet};

use cachalot_core::backend::{
    BackendError, BackendResult, CallKind, DevicePtr, EventId, PageHandle, StreamId,
};

/// One reserved range of address space and the pages mapped into it.
#[derive(Debug)]
struct Range {
    size: u64,
    /// Mapped pages by absolute address: (page, mapped bytes).
    mapped: BTreeMap<DevicePtr, (PageHandle, u64)>,
}

/// One physical page: its size and how many mappings of it are live.
#[derive(Debug, Clone, Copy)]
struct Page {
    size: u64,
    mappings: u32,
}

/// One mapping of a page, as [`Registry::check_unmap`] returns them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mapping {
    /// Where the page is mapped.
    pub(super) addr: DevicePtr,
    /// The page mapped there.
    pub(super) page: PageHandle,
    /// Mapped bytes (the page's size).
    pub(super) size: u64,
}

/// Everything live on one CUDA backend. See the module docs.
#[derive(Debug, Default)]
pub(super) struct Registry {
    segments: BTreeMap<DevicePtr, u64>,
    ranges: BTreeMap<DevicePtr, Range>,
    pages: HashMap<PageHandle, Page>,
    events: HashSet<EventId>,
    /// Streams this backend created (it may destroy them).
    own_streams: HashSet<StreamId>,
    /// Streams created elsewhere and registered by the caller.
    foreign_streams: HashSet<StreamId>,
}

/// What is left when a backend is dropped, in the order it must be released.
#[derive(Debug, Default)]
pub(super) struct Leftovers {
    pub(super) mappings: Vec<Mapping>,
    pub(super) pages: Vec<PageHandle>,
    pub(super) ranges: Vec<(DevicePtr, u64)>,
    pub(super) segments: Vec<DevicePtr>,
    pub(super) events: Vec<EventId>,
    pub(super) streams: Vec<StreamId>,
}

fn invalid_argument(call: CallKind, reason: String) -> BackendError {
    BackendError::InvalidArgument { call, reason }
}

impl Registry {
    /// Checks that `size` is a positive multiple of `granularity` (when one is given).
    pub(super) fn check_size(call: CallKind, size: u64, granularity: u64) -> BackendResult<()> {
        if size == 0 || (granularity > 0 && !size.is_multiple_of(granularity)) {
            let reason =
                format!("size {size} is zero or not a multiple of the granularity {granularity}");
            return Err(invalid_argument(call, reason));
        }
        Ok(())
    }

    /// Records a segment the driver allocated.
    pub(super) fn add_segment(&mut self, ptr: DevicePtr, size: u64) {
        self.segments.insert(ptr, size);
    }

    /// Checks that `ptr` is a live segment's base.
    pub(super) fn check_segment(&self, ptr: DevicePtr) -> BackendResult<u64> {
        self.segments
            .get(&ptr)
            .copied()
            .ok_or(BackendError::InvalidAddress {
                call: CallKind::SegmentFree,
                what: "segment",
                value: ptr,
            })
    }

    /// Forgets a freed segment.
    pub(super) fn remove_segment(&mut self, ptr: DevicePtr) {
        self.segments.remove(&ptr);
    }

    /// Records a reserved range.
    pub(super) fn add_range(&mut self, base: DevicePtr, size: u64) {
        self.ranges.insert(
            base,
            Range {
                size,
                mapped: BTreeMap::new(),
            },
        );
    }

    /// Checks that `base`/`size` is a live range with nothing mapped in it.
    pub(super) fn check_range_release(&self, base: DevicePtr, size: u64) -> BackendResult<()> {
        let call = CallKind::ReleaseRange;
        let range = self.ranges.get(&base).ok_or(BackendError::InvalidAddress {
            call,
            what: "range",
            value: base,
        })?;
        if range.size != size {
            return Err(invalid_argument(
                call,
                format!("range {base:#x} has {} bytes, not {size}", range.size),
            ));
        }
        if !range.mapped.is_empty() {
            return Err(invalid_argument(
                call,
                format!(
                    "range {base:#x} still has {} mapped pages",
                    range.mapped.len()
                ),
            ));
        }
        Ok(())
    }

    /// Forgets a released range.
    pub(super) fn remove_range(&mut self, base: DevicePtr) {
        self.ranges.remove(&base);
    }

    /// Records a created page.
    pub(super) fn add_page(&mut self, page: PageHandle, size: u64) {
        self.pages.insert(page, Page { size, mappings: 0 });
    }

    /// Whether `page` is live.
    pub(super) fn has_page(&self, page: PageHandle) -> bool {
        self.pages.contains_key(&page)
    }

    /// Checks that `page` is live and mapped nowhere.
    pub(super) fn check_page_release(&self, page: PageHandle) -> BackendResult<()> {
        let call = CallKind::ReleasePage;
        let p = self.pages.get(&page).ok_or(BackendError::InvalidAddress {
            call,
            what: "page",
            value: page.0,
        })?;
        if p.mappings > 0 {
            return Err(invalid_argument(
                call,
                format!("page {:#x} is still mapped {} times", page.0, p.mappings),
            ));
        }
        Ok(())
    }

    /// Forgets a released page.
    pub(super) fn remove_page(&mut self, page: PageHandle) {
        self.pages.remove(&page);
    }

    fn range_of(&self, addr: DevicePtr) -> Option<(DevicePtr, &Range)> {
        let (base, range) = self.ranges.range(..=addr).next_back()?;
        (addr < base + range.size).then_some((*base, range))
    }

    /// Checks that the whole `page` fits at `addr`, aligned, inside one reserved
    /// range, overlapping no mapping. Returns the page's size.
    pub(super) fn check_map(
        &self,
        addr: DevicePtr,
        page: PageHandle,
        granularity: u64,
    ) -> BackendResult<u64> {
        let call = CallKind::Map;
        let p = self.pages.get(&page).ok_or(BackendError::InvalidAddress {
            call,
            what: "page",
            value: page.0,
        })?;
        let size = p.size;
        let fits = self.range_of(addr).is_some_and(|(base, r)| {
            let aligned = granularity > 0 && (addr - base).is_multiple_of(granularity);
            let inside = addr - base + size <= r.size;
            let before = r
                .mapped
                .range(..=addr)
                .next_back()
                .is_none_or(|(a, (_, s))| a + s <= addr);
            let after = r
                .mapped
                .range(addr..)
                .next()
                .is_none_or(|(a, _)| *a >= addr + size);
            aligned && inside && before && after
        });
        if !fits {
            let reason = format!(
                "cannot map {size} bytes at {addr:#x}: misaligned, unreserved or overlapping"
            );
            return Err(invalid_argument(call, reason));
        }
        Ok(size)
    }

    /// Records a mapping checked by [`Registry::check_map`].
    pub(super) fn add_mapping(&mut self, addr: DevicePtr, page: PageHandle, size: u64) {
        if let Some(base) = self.range_of(addr).map(|(b, _)| b) {
            if let Some(range) = self.ranges.get_mut(&base) {
                range.mapped.insert(addr, (page, size));
            }
        }
        if let Some(p) = self.pages.get_mut(&page) {
            p.mappings += 1;
        }
    }

    /// Checks that `addr`/`size` covers whole mapped pages, contiguously, and returns
    /// them.
    pub(super) fn check_unmap(&self, addr: DevicePtr, size: u64) -> BackendResult<Vec<Mapping>> {
        let covered = self.range_of(addr).and_then(|(_, r)| {
            let end = addr.checked_add(size)?;
            let mut cursor = addr;
            let mut found = Vec::new();
            for (a, (page, s)) in r.mapped.range(addr..end) {
                if *a != cursor {
                    return None;
                }
                found.push(Mapping {
                    addr: *a,
                    page: *page,
                    size: *s,
                });
                cursor += s;
            }
            (size > 0 && cursor == end).then_some(found)
        });
        covered.ok_or_else(|| {
            invalid_argument(
                CallKind::Unmap,
                format!("{size} bytes at {addr:#x} are not whole mapped pages"),
            )
        })
    }

    /// Forgets one unmapped mapping.
    pub(super) fn remove_mapping(&mut self, m: Mapping) {
        if let Some(base) = self.range_of(m.addr).map(|(b, _)| b) {
            if let Some(range) = self.ranges.get_mut(&base) {
                range.mapped.remove(&m.addr);
            }
        }
        if let Some(p) = self.pages.get_mut(&m.page) {
            p.mappings = p.mappings.saturating_sub(1);
        }
    }

    /// Records a created event.
    pub(super) fn add_event(&mut self, event: EventId) {
        self.events.insert(event);
    }

    /// Checks that `event` is live.
    pub(super) fn check_event(&self, call: CallKind, event: EventId) -> BackendResult<()> {
        if self.events.contains(&event) {
            Ok(())
        } else {
            Err(BackendError::InvalidAddress {
                call,
                what: "event",
                value: event.0,
            })
        }
    }

    /// Forgets a destroyed event.
    pub(super) fn remove_event(&mut self, event: EventId) {
        self.events.remove(&event);
    }

    /// Records a stream: `own` when this backend created it.
    pub(super) fn add_stream(&mut self, stream: StreamId, own: bool) {
        if own {
            self.own_streams.insert(stream);
        } else {
            self.foreign_streams.insert(stream);
        }
    }

    /// Checks that work may be queued on `stream`: the default stream (0, or the
    /// driver's special handles `CU_STREAM_LEGACY` = 1 and `CU_STREAM_PER_THREAD` =
    /// 2), a stream this backend created or one registered with it.
    pub(super) fn check_stream(&self, call: CallKind, stream: StreamId) -> BackendResult<()> {
        if stream.0 <= 2
            || self.own_streams.contains(&stream)
            || self.foreign_streams.contains(&stream)
        {
            Ok(())
        } else {
            Err(BackendError::InvalidAddress {
                call,
                what: "stream",
                value: stream.0,
            })
        }
    }

    /// Checks that `stream` was created by this backend and forgets it.
    pub(super) fn take_own_stream(&mut self, stream: StreamId) -> BackendResult<()> {
        if self.own_streams.remove(&stream) {
            Ok(())
        } else {
            Err(BackendError::InvalidAddress {
                call: CallKind::SynchronizeStream,
                what: "stream",
                value: stream.0,
            })
        }
    }

    /// Forgets a registered foreign stream; whether it was registered.
    pub(super) fn remove_foreign_stream(&mut self, stream: StreamId) -> bool {
        self.foreign_streams.remove(&stream)
    }

    /// Checks that `len` bytes from `ptr` lie inside one live segment or inside
    /// contiguously mapped pages of one range.
    pub(super) fn check_accessible(
        &self,
        call: CallKind,
        ptr: DevicePtr,
        len: u64,
    ) -> BackendResult<()> {
        let Some(end) = ptr.checked_add(len) else {
            return Err(invalid_argument(
                call,
                format!("{len} bytes at {ptr:#x} overflow the address space"),
            ));
        };
        if let Some((base, size)) = self.segments.range(..=ptr).next_back() {
            if end <= base + size {
                return Ok(());
            }
        }
        if self.mapped_through(ptr, end) {
            return Ok(());
        }
        Err(invalid_argument(
            call,
            format!("{len} bytes at {ptr:#x} are not inside live device memory"),
        ))
    }

    /// Whether `[ptr, end)` is covered by contiguous mappings of one range.
    fn mapped_through(&self, ptr: DevicePtr, end: DevicePtr) -> bool {
        let Some((_, range)) = self.range_of(ptr) else {
            return false;
        };
        let Some((first, (_, first_size))) = range.mapped.range(..=ptr).next_back() else {
            return false;
        };
        let mut cursor = first + first_size;
        if cursor <= ptr {
            return false;
        }
        for (a, (_, s)) in range.mapped.range(cursor..) {
            if cursor >= end {
                break;
            }
            if *a != cursor {
                return false;
            }
            cursor += s;
        }
        cursor >= end
    }

    /// Bytes in live segments and pages.
    pub(super) fn live_bytes(&self) -> u64 {
        self.segments.values().sum::<u64>() + self.pages.values().map(|p| p.size).sum::<u64>()
    }

    /// Takes everything still live, in release order, leaving the registry empty.
    pub(super) fn drain(&mut self) -> Leftovers {
        let mut left = Leftovers::default();
        for range in self.ranges.values() {
            left.mappings
                .extend(range.mapped.iter().map(|(a, (page, size))| Mapping {
                    addr: *a,
                    page: *page,
                    size: *size,
                }));
        }
        left.pages = self.pages.keys().copied().collect();
        left.ranges = self.ranges.iter().map(|(b, r)| (*b, r.size)).collect();
        left.segments = self.segments.keys().copied().collect();
        left.events = self.events.drain().collect();
        left.streams = self.own_streams.drain().collect();
        *self = Registry::default();
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    #[test]
    fn segments_must_be_live_bases() {
        let mut r = Registry::default();
        r.add_segment(0x1000_0000, 4096);
        assert_eq!(r.check_segment(0x1000_0000), Ok(4096));
        assert!(matches!(
            r.check_segment(0x1000_0200),
            Err(BackendError::InvalidAddress { .. })
        ));
        r.remove_segment(0x1000_0000);
        assert!(r.check_segment(0x1000_0000).is_err());
    }

    #[test]
    fn access_checks_cover_segments_and_mapped_pages() {
        let mut r = Registry::default();
        r.add_segment(0x1000_0000, 4096);
        assert!(r
            .check_accessible(CallKind::SegmentAlloc, 0x1000_0000, 4096)
            .is_ok());
        assert!(r
            .check_accessible(CallKind::SegmentAlloc, 0x1000_0800, 2048)
            .is_ok());
        assert!(r
            .check_accessible(CallKind::SegmentAlloc, 0x1000_0800, 2049)
            .is_err());
        assert!(r
            .check_accessible(CallKind::SegmentAlloc, 0x0fff_ffff, 2)
            .is_err());
        assert!(r
            .check_accessible(CallKind::SegmentAlloc, u64::MAX, 2)
            .is_err());

        let base = 0x7000_0000_0000;
        r.add_range(base, 4 * G);
        for (i, page) in [PageHandle(1), PageHandle(2), PageHandle(3)]
            .into_iter()
            .enumerate()
        {
            r.add_page(page, G);
            if i != 1 {
                let addr = base + i as u64 * G;
                assert_eq!(r.check_map(addr, page, G), Ok(G));
                r.add_mapping(addr, page, G);
            }
        }
        assert!(r.check_accessible(CallKind::Map, base, G).is_ok());
        assert!(
            r.check_accessible(CallKind::Map, base + 10, G).is_err(),
            "page 1 is not mapped"
        );
        r.add_mapping(base + G, PageHandle(2), G);
        assert!(r.check_accessible(CallKind::Map, base + 10, 2 * G).is_ok());
        assert!(r.check_accessible(CallKind::Map, base, 3 * G + 1).is_err());
    }

    #[test]
    fn mapping_rules_are_enforced() {
        let mut r = Registry::default();
        let base = 0x7000_0000_0000;
        r.add_range(base, 2 * G);
        r.add_page(PageHandle(7), G);
        assert!(
            r.check_map(base + 4096, PageHandle(7), G).is_err(),
            "misaligned"
        );
        assert!(
            r.check_map(base + 2 * G, PageHandle(7), G).is_err(),
            "outside"
        );
        assert!(r.check_map(base, PageHandle(8), G).is_err(), "unknown page");
        r.add_mapping(base, PageHandle(7), G);
        assert!(r.check_map(base, PageHandle(7), G).is_err(), "overlap");
        assert!(r.check_page_release(PageHandle(7)).is_err(), "still mapped");
        assert!(
            r.check_range_release(base, 2 * G).is_err(),
            "range still mapped"
        );
        assert!(
            r.check_unmap(base, 2 * G).is_err(),
            "second page not mapped"
        );
        let maps = r.check_unmap(base, G).expect("whole mapped page");
        assert_eq!(
            maps,
            vec![Mapping {
                addr: base,
                page: PageHandle(7),
                size: G
            }]
        );
        for m in maps {
            r.remove_mapping(m);
        }
        assert!(r.check_page_release(PageHandle(7)).is_ok());
        assert!(r.check_range_release(base, G).is_err(), "wrong size");
        assert!(r.check_range_release(base, 2 * G).is_ok());
    }

    #[test]
    fn streams_and_events_must_be_known() {
        let mut r = Registry::default();
        assert!(r
            .check_stream(CallKind::RecordEvent, StreamId::DEFAULT)
            .is_ok());
        assert!(r
            .check_stream(CallKind::RecordEvent, StreamId(0xdead))
            .is_err());
        r.add_stream(StreamId(0xdead), false);
        assert!(r
            .check_stream(CallKind::RecordEvent, StreamId(0xdead))
            .is_ok());
        assert!(
            r.take_own_stream(StreamId(0xdead)).is_err(),
            "not ours to destroy"
        );
        assert!(r.remove_foreign_stream(StreamId(0xdead)));
        r.add_event(EventId(5));
        assert!(r.check_event(CallKind::QueryEvent, EventId(5)).is_ok());
        assert!(r.check_event(CallKind::QueryEvent, EventId(6)).is_err());
    }

    #[test]
    fn drain_returns_everything_once() {
        let mut r = Registry::default();
        r.add_segment(0x1000, 512);
        r.add_range(0x7000_0000_0000, G);
        r.add_page(PageHandle(1), G);
        r.add_mapping(0x7000_0000_0000, PageHandle(1), G);
        r.add_event(EventId(3));
        r.add_stream(StreamId(9), true);
        assert_eq!(r.live_bytes(), 512 + G);
        let left = r.drain();
        assert_eq!(
            (left.mappings.len(), left.pages.len(), left.ranges.len()),
            (1, 1, 1)
        );
        assert_eq!(
            (left.segments.len(), left.events.len(), left.streams.len()),
            (1, 1, 1)
        );
        assert_eq!(r.live_bytes(), 0);
        assert!(r.drain().segments.is_empty());
    }
}
