//! The simulated device: a strict, deterministic [`Backend`] with no GPU behind it.
//!
//! * Fixed capacity; segments and pages count against it.
//! * Addresses start at a high, unusual base and are never reused, with a guard gap
//!   between ranges, so a block that strays across a segment boundary, or an address
//!   used after its free, is caught.
//! * Strict: freeing an unknown or already-freed address, releasing a mapped page,
//!   unmapping what is not mapped, or using an unknown event is a typed error and is
//!   counted in [`SimCounters::misuse`].
//! * Keeps the bytes in use and their peak ([`SimCounters`]), and the bytes
//!   written to its memory by [`Backend::upload`] for [`Backend::download`] to
//!   read (`contents.rs`). Call counts, fault
//!   injection and memory limits are adaptors over any backend
//!   ([`super::counting`], [`super::faults`], [`super::limit`]).
//! * Events: by default they complete as soon as they are recorded (a device that is
//!   always idle). In manual mode ([`SimBackend::set_manual_events`]) an event
//!   completes only when the test completes its stream, or synchronizes.
//! * Stream captures: a test begins one ([`SimBackend::begin_capture`]), queues
//!   work and waits between streams, and ends it; the backend answers
//!   [`Backend::capture_frontier`] and [`Backend::capture_follows`] from that
//!   graph (`capture.rs`).

mod capture;
mod contents;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use self::capture::Captures;
use self::contents::{Contents, Owner, Piece};
use super::host::{HostMemory, ToDevice, ToHost};
use super::{
    Backend, BackendError, BackendResult, CallKind, Capabilities, DevicePtr, EventId, GraphNode,
    MemInfo, PageHandle, StreamId,
};

/// The first address the simulated device hands out.
pub const SIM_BASE_ADDRESS: DevicePtr = 0x7f3a_5e00_0000;

/// The simulated page size (and mapping granularity): 2 MiB.
pub const SIM_GRANULARITY: u64 = 2 << 20;

/// The largest device the simulation supports: 256 TiB (2^48 bytes). Policies
/// reserve virtual ranges larger than the device (the cachalot policy six times
/// its size per stream, expandable segments 9/8 of it), and addresses, which are
/// never reused, must stay far below 2^64 over thousands of such ranges.
/// Larger capacities are not refused here; callers taking a capacity from a
/// user check it against this bound (and against [`SIM_GRANULARITY`], the
/// smallest useful device).
pub const SIM_MAX_CAPACITY: u64 = 1 << 48;

/// The address space the simulated device's ranges may take together, at
/// least (16 device sizes where that is more, so that the largest simulated
/// devices still hold ranges larger than themselves): 128 TiB, x86-64's
/// 47-bit user space, which an H200 granted to ranges and no more (233
/// ranges of four times its memory). Past it, a reservation runs out of
/// memory.
const ADDRESS_SPACE: u64 = 1 << 47;

/// The address space below the first range handed out in
/// [`AddressOrder::Descending`]: this many bytes, or 16 device sizes when that
/// is more, so that ranges larger than the device still fit.
const DESCENDING_ROOM: u64 = 1 << 44;

/// Where the simulated device places new segments and ranges.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum AddressOrder {
    /// Each new range above the previous one (the default).
    #[default]
    Ascending,
    /// A model of the CUDA driver's placement, inferred from PyTorch recordings on
    /// an H100: each new range goes below the previous ones, except that a range
    /// larger than one page reuses the highest freed span that fits (at that
    /// span's top); single-page ranges never reuse freed spans. PyTorch breaks ties
    /// between equal-size cached blocks by address, so replays that must match a
    /// recording use this order. Addresses are still never handed out twice while
    /// live, and a guard page follows each range.
    Descending,
}

/// Counters of a simulated device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// Calls that broke a contract (double free, unknown address, ...).
    pub misuse: u64,
    /// Bytes in live segments and pages now.
    pub used: u64,
    /// The highest `used` seen.
    pub peak_used: u64,
}

#[derive(Debug)]
struct Range {
    size: u64,
    /// Mapped pages by offset from the range base.
    mapped: BTreeMap<u64, (PageHandle, u64)>,
}

#[derive(Debug, Default)]
struct Event {
    /// The stream and sequence number of the last record.
    recorded: Option<(StreamId, u64)>,
}

#[derive(Debug, Default)]
struct State {
    next_address: DevicePtr,
    order: AddressOrder,
    /// Freed address spans (base, bytes) reusable in descending order.
    holes: BTreeMap<DevicePtr, u64>,
    next_handle: u64,
    segments: BTreeMap<DevicePtr, u64>,
    ranges: BTreeMap<DevicePtr, Range>,
    /// Bytes of the live ranges.
    range_bytes: u64,
    /// Page size and the number of live mappings of each page.
    pages: HashMap<PageHandle, (u64, u32)>,
    events: HashMap<EventId, Event>,
    /// Per stream: (records issued, records completed).
    streams: HashMap<StreamId, (u64, u64)>,
    manual_events: bool,
    counters: SimCounters,
    contents: Contents,
    captures: Captures,
}

/// A simulated GPU. See the module docs.
#[derive(Debug)]
pub struct SimBackend {
    caps: Capabilities,
    state: Mutex<State>,
}

impl SimBackend {
    /// A device of `capacity` bytes with virtual memory support.
    pub fn new(capacity: u64) -> SimBackend {
        SimBackend::with_options(capacity, true)
    }

    /// A device of `capacity` bytes, with or without virtual memory.
    pub fn with_options(capacity: u64, virtual_memory: bool) -> SimBackend {
        let caps = Capabilities {
            name: "simulated device".to_string(),
            device: 0,
            total_memory: capacity,
            virtual_memory,
            granularity: if virtual_memory { SIM_GRANULARITY } else { 0 },
        };
        let state = State {
            next_address: SIM_BASE_ADDRESS,
            next_handle: 1,
            ..State::default()
        };
        SimBackend {
            caps,
            state: Mutex::new(state),
        }
    }

    /// Sets where new ranges are placed (see [`AddressOrder`]). Call before any
    /// allocation.
    pub fn with_address_order(self, order: AddressOrder) -> SimBackend {
        {
            let mut st = self.lock();
            st.order = order;
            if order == AddressOrder::Descending {
                let room = DESCENDING_ROOM.max(self.caps.total_memory.saturating_mul(16));
                st.next_address = SIM_BASE_ADDRESS.saturating_add(room);
            }
        }
        self
    }

    /// A device the size of an H100 80GB (85,017,493,504 bytes), as PyTorch saw it.
    pub fn h100() -> SimBackend {
        SimBackend::new(85_017_493_504)
    }

    /// Sets the device ordinal reported in [`Capabilities::device`].
    pub fn with_device(mut self, device: usize) -> SimBackend {
        self.caps.device = device;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated in a way
        // that matters more than losing the simulation, so recover the guard.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the counters.
    pub fn counters(&self) -> SimCounters {
        self.lock().counters.clone()
    }

    /// In manual mode, events complete only through [`SimBackend::complete_stream`],
    /// [`SimBackend::complete_all`] or a synchronize call.
    pub fn set_manual_events(&self, manual: bool) {
        let mut st = self.lock();
        st.manual_events = manual;
        if !manual {
            complete_all(&mut st);
        }
    }

    /// Completes all work recorded so far on `stream`.
    pub fn complete_stream(&self, stream: StreamId) {
        let mut st = self.lock();
        if let Some(s) = st.streams.get_mut(&stream) {
            s.1 = s.0;
        }
    }

    /// Completes all work on every stream.
    pub fn complete_all(&self) {
        complete_all(&mut self.lock());
    }

    /// Starts capturing `stream` into a graph; false when a capture is in
    /// progress (the simulation holds one at a time).
    pub fn begin_capture(&self, stream: StreamId) -> bool {
        self.lock().captures.begin(stream)
    }

    /// Queues work (a kernel) on capturing `stream`: a node after its
    /// frontier. `None` when `stream` is not capturing.
    pub fn capture_work(&self, stream: StreamId) -> Option<GraphNode> {
        self.lock().captures.work(stream)
    }

    /// Makes capturing `stream`'s next work follow `on`'s (an event recorded
    /// on `on`, waited on by `stream`); false when `on` is not capturing.
    pub fn capture_wait(&self, stream: StreamId, on: StreamId) -> bool {
        self.lock().captures.wait(stream, on)
    }

    /// Ends the capture in progress.
    pub fn end_capture(&self) {
        self.lock().captures.end();
    }

    /// Live segments (base, size), by address.
    pub fn live_segments(&self) -> Vec<(DevicePtr, u64)> {
        let mut v: Vec<_> = self.lock().segments.iter().map(|(a, s)| (*a, *s)).collect();
        v.sort_unstable();
        v
    }

    /// Live pages plus live segments plus reserved ranges: zero once everything was
    /// given back.
    pub fn live_objects(&self) -> usize {
        let st = self.lock();
        st.segments.len() + st.pages.len() + st.ranges.len()
    }
}

fn complete_all(st: &mut State) {
    for s in st.streams.values_mut() {
        s.1 = s.0;
    }
}

impl State {
    fn misuse(&mut self, err: BackendError) -> BackendError {
        self.counters.misuse += 1;
        err
    }

    fn take_memory(&mut self, kind: CallKind, size: u64, capacity: u64) -> BackendResult<()> {
        let after = self.counters.used.checked_add(size);
        if after.is_none_or(|a| a > capacity) {
            return Err(BackendError::OutOfMemory {
                call: kind,
                requested: size,
            });
        }
        self.counters.used += size;
        self.counters.peak_used = self.counters.peak_used.max(self.counters.used);
        Ok(())
    }

    /// Hands out a fresh address range of `size` bytes, 2 MiB aligned, followed by a
    /// guard gap.
    fn fresh_addresses(&mut self, size: u64) -> DevicePtr {
        let span = (size.div_ceil(SIM_GRANULARITY).max(1) + 1) * SIM_GRANULARITY;
        match self.order {
            AddressOrder::Ascending => {
                let base = self.next_address;
                self.next_address = base.saturating_add(span);
                base
            }
            AddressOrder::Descending => {
                if size > SIM_GRANULARITY {
                    let hole = self.holes.iter().rev().find(|(_, len)| **len >= span);
                    if let Some((base, len)) = hole.map(|(b, l)| (*b, *l)) {
                        self.holes.remove(&base);
                        if len > span {
                            self.holes.insert(base, len - span);
                        }
                        return base + len - span;
                    }
                }
                self.next_address = self.next_address.saturating_sub(span);
                self.next_address
            }
        }
    }

    /// In descending order, makes the span of a freed range of more than one page
    /// reusable (merged with adjacent freed spans).
    fn release_addresses(&mut self, base: DevicePtr, size: u64) {
        if self.order != AddressOrder::Descending || size <= SIM_GRANULARITY {
            return;
        }
        let mut span = (size.div_ceil(SIM_GRANULARITY) + 1) * SIM_GRANULARITY;
        let mut start = base;
        if let Some((b, l)) = self.holes.range(..base).next_back().map(|(b, l)| (*b, *l)) {
            if b + l == start {
                self.holes.remove(&b);
                start = b;
                span += l;
            }
        }
        if let Some(l) = self.holes.remove(&(start + span)) {
            span += l;
        }
        self.holes.insert(start, span);
    }

    fn event(&mut self, kind: CallKind, event: EventId) -> BackendResult<&mut Event> {
        if !self.events.contains_key(&event) {
            return Err(self.misuse(BackendError::InvalidAddress {
                call: kind,
                what: "event",
                value: event.0,
            }));
        }
        Ok(self.events.get_mut(&event).expect("checked above"))
    }

    fn event_done(&self, ev: &Event) -> bool {
        match ev.recorded {
            None => true,
            Some((stream, seq)) => self.streams.get(&stream).is_none_or(|s| s.1 >= seq),
        }
    }

    fn range_of(&self, addr: DevicePtr) -> Option<(DevicePtr, &Range)> {
        let (base, r) = self.ranges.range(..=addr).next_back()?;
        (addr < base + r.size).then_some((*base, r))
    }

    /// The segment or pages under `len` bytes at `addr`, or the misuse error
    /// of a `call` that reaches outside live device memory.
    fn pieces(&mut self, call: CallKind, addr: DevicePtr, len: usize) -> BackendResult<Vec<Piece>> {
        let found = self
            .segment_piece(addr, len)
            .or_else(|| self.page_pieces(addr, len));
        found.ok_or_else(|| {
            let reason = format!("{len} bytes at {addr:#x} are not inside live device memory");
            self.misuse(BackendError::InvalidArgument { call, reason })
        })
    }

    /// The piece of one segment that holds `len` bytes at `addr`.
    fn segment_piece(&self, addr: DevicePtr, len: usize) -> Option<Vec<Piece>> {
        let (base, size) = self.segments.range(..=addr).next_back()?;
        let end = addr.checked_add(len as u64)?;
        (end <= base + size).then(|| {
            vec![Piece {
                owner: Owner::Segment(*base),
                offset: addr - base,
                len,
            }]
        })
    }

    /// The pieces of the pages mapped one after the other under `len` bytes at
    /// `addr`, if they cover them.
    fn page_pieces(&self, addr: DevicePtr, len: usize) -> Option<Vec<Piece>> {
        let (base, range) = self.range_of(addr)?;
        let (mut at, end) = (addr - base, (addr - base).checked_add(len as u64)?);
        let mut out = Vec::new();
        while at < end {
            let (off, (page, size)) = range.mapped.range(..=at).next_back()?;
            if off + size <= at {
                return None;
            }
            let take = (off + size).min(end) - at;
            out.push(Piece {
                owner: Owner::Page(*page),
                offset: at - off,
                len: take as usize,
            });
            at += take;
        }
        Some(out)
    }
}

impl Backend for SimBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn mem_info(&self) -> BackendResult<MemInfo> {
        let st = self.lock();
        Ok(MemInfo {
            free: self.caps.total_memory - st.counters.used,
            total: self.caps.total_memory,
        })
    }

    fn allocate_segment(&self, size: u64) -> BackendResult<DevicePtr> {
        let mut st = self.lock();
        if size == 0 {
            let reason = "zero-size segment".to_string();
            return Err(st.misuse(BackendError::InvalidArgument {
                call: CallKind::SegmentAlloc,
                reason,
            }));
        }
        st.take_memory(CallKind::SegmentAlloc, size, self.caps.total_memory)?;
        let base = st.fresh_addresses(size);
        st.segments.insert(base, size);
        Ok(base)
    }

    fn free_segment(&self, ptr: DevicePtr) -> BackendResult<()> {
        let mut st = self.lock();
        match st.segments.remove(&ptr) {
            Some(size) => {
                st.counters.used -= size;
                st.release_addresses(ptr, size);
                st.contents.forget(Owner::Segment(ptr));
                Ok(())
            }
            None => Err(st.misuse(BackendError::InvalidAddress {
                call: CallKind::SegmentFree,
                what: "segment",
                value: ptr,
            })),
        }
    }

    fn reserve_range(&self, size: u64) -> BackendResult<DevicePtr> {
        let call = CallKind::ReserveRange;
        if !self.caps.virtual_memory {
            return Err(BackendError::Unsupported {
                call,
                backend: "sim",
            });
        }
        let mut st = self.lock();
        if size == 0 || !size.is_multiple_of(SIM_GRANULARITY) {
            let reason = format!("size {size} is not a positive multiple of the granularity");
            return Err(st.misuse(BackendError::InvalidArgument { call, reason }));
        }
        let space = ADDRESS_SPACE.max(self.caps.total_memory.saturating_mul(16));
        if st.range_bytes.saturating_add(size) > space {
            return Err(BackendError::OutOfMemory {
                call,
                requested: size,
            });
        }
        st.range_bytes += size;
        let base = st.fresh_addresses(size);
        st.ranges.insert(
            base,
            Range {
                size,
                mapped: BTreeMap::new(),
            },
        );
        Ok(base)
    }

    fn release_range(&self, base: DevicePtr, size: u64) -> BackendResult<()> {
        let call = CallKind::ReleaseRange;
        let mut st = self.lock();
        let Some(r) = st.ranges.get(&base) else {
            return Err(st.misuse(BackendError::InvalidAddress {
                call,
                what: "range",
                value: base,
            }));
        };
        if r.size != size || !r.mapped.is_empty() {
            let reason = format!(
                "range {base:#x} has size {} and {} mapped pages",
                r.size,
                r.mapped.len()
            );
            return Err(st.misuse(BackendError::InvalidArgument { call, reason }));
        }
        st.ranges.remove(&base);
        st.range_bytes -= size;
        st.release_addresses(base, size);
        Ok(())
    }

    fn create_page(&self, size: u64) -> BackendResult<PageHandle> {
        let call = CallKind::CreatePage;
        if !self.caps.virtual_memory {
            return Err(BackendError::Unsupported {
                call,
                backend: "sim",
            });
        }
        let mut st = self.lock();
        if size == 0 || !size.is_multiple_of(SIM_GRANULARITY) {
            let reason = format!("page size {size} is not a positive multiple of the granularity");
            return Err(st.misuse(BackendError::InvalidArgument { call, reason }));
        }
        st.take_memory(call, size, self.caps.total_memory)?;
        let handle = PageHandle(st.next_handle);
        st.next_handle += 1;
        st.pages.insert(handle, (size, 0));
        Ok(handle)
    }

    fn release_page(&self, page: PageHandle) -> BackendResult<()> {
        let call = CallKind::ReleasePage;
        let mut st = self.lock();
        match st.pages.get(&page).copied() {
            None => Err(st.misuse(BackendError::InvalidAddress {
                call,
                what: "page",
                value: page.0,
            })),
            Some((_, maps)) if maps > 0 => {
                let reason = format!("page {} is still mapped {maps} time(s)", page.0);
                Err(st.misuse(BackendError::InvalidArgument { call, reason }))
            }
            Some((size, _)) => {
                st.pages.remove(&page);
                st.counters.used -= size;
                st.contents.forget(Owner::Page(page));
                Ok(())
            }
        }
    }

    fn map(&self, addr: DevicePtr, page: PageHandle) -> BackendResult<()> {
        let call = CallKind::Map;
        let mut st = self.lock();
        let Some((size, _)) = st.pages.get(&page).copied() else {
            return Err(st.misuse(BackendError::InvalidAddress {
                call,
                what: "page",
                value: page.0,
            }));
        };
        let fits = st.range_of(addr).and_then(|(base, r)| {
            let off = addr - base;
            let aligned = off.is_multiple_of(SIM_GRANULARITY) && off + size <= r.size;
            let before_ok = r
                .mapped
                .range(..=off)
                .next_back()
                .is_none_or(|(o, (_, s))| o + s <= off);
            let after_ok = r
                .mapped
                .range(off..)
                .next()
                .is_none_or(|(o, _)| *o >= off + size);
            (aligned && before_ok && after_ok).then_some((base, off))
        });
        let Some((base, off)) = fits else {
            let reason = format!(
                "cannot map {size} bytes at {addr:#x}: misaligned, unreserved or overlapping"
            );
            return Err(st.misuse(BackendError::InvalidArgument { call, reason }));
        };
        st.ranges
            .get_mut(&base)
            .expect("found above")
            .mapped
            .insert(off, (page, size));
        st.pages.get_mut(&page).expect("found above").1 += 1;
        Ok(())
    }

    fn unmap(&self, addr: DevicePtr, size: u64) -> BackendResult<()> {
        let call = CallKind::Unmap;
        let mut st = self.lock();
        let covered = st.range_of(addr).and_then(|(base, r)| {
            let (start, end) = (addr - base, addr - base + size);
            let pages: Vec<(u64, PageHandle, u64)> = r
                .mapped
                .range(start..end)
                .map(|(o, (p, s))| (*o, *p, *s))
                .collect();
            let mut cursor = start;
            for (o, _, s) in &pages {
                if *o != cursor {
                    return None;
                }
                cursor += s;
            }
            (size > 0 && cursor == end).then_some((base, pages))
        });
        let Some((base, pages)) = covered else {
            let reason = format!("{size} bytes at {addr:#x} are not whole mapped pages");
            return Err(st.misuse(BackendError::InvalidArgument { call, reason }));
        };
        for (off, page, _) in pages {
            st.ranges
                .get_mut(&base)
                .expect("found above")
                .mapped
                .remove(&off);
            if let Some(p) = st.pages.get_mut(&page) {
                p.1 -= 1;
            }
        }
        Ok(())
    }

    fn create_event(&self) -> BackendResult<EventId> {
        let mut st = self.lock();
        let id = EventId(st.next_handle);
        st.next_handle += 1;
        st.events.insert(id, Event::default());
        Ok(id)
    }

    fn destroy_event(&self, event: EventId) -> BackendResult<()> {
        let mut st = self.lock();
        st.event(CallKind::DestroyEvent, event)?;
        st.events.remove(&event);
        Ok(())
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> BackendResult<()> {
        let mut st = self.lock();
        st.event(CallKind::RecordEvent, event)?;
        let manual = st.manual_events;
        let s = st.streams.entry(stream).or_default();
        s.0 += 1;
        if !manual {
            s.1 = s.0;
        }
        let seq = s.0;
        st.event(CallKind::RecordEvent, event)?.recorded = Some((stream, seq));
        Ok(())
    }

    fn query_event(&self, event: EventId) -> BackendResult<bool> {
        let mut st = self.lock();
        st.event(CallKind::QueryEvent, event)?;
        Ok(st.event_done(&st.events[&event]))
    }

    fn synchronize_event(&self, event: EventId) -> BackendResult<()> {
        let mut st = self.lock();
        let recorded = st.event(CallKind::SynchronizeEvent, event)?.recorded;
        if let Some((stream, seq)) = recorded {
            let s = st.streams.entry(stream).or_default();
            s.1 = s.1.max(seq);
        }
        Ok(())
    }

    fn synchronize_stream(&self, stream: StreamId) -> BackendResult<()> {
        let mut st = self.lock();
        if let Some(s) = st.streams.get_mut(&stream) {
            s.1 = s.0;
        }
        Ok(())
    }

    fn synchronize_device(&self) -> BackendResult<()> {
        let mut st = self.lock();
        complete_all(&mut st);
        Ok(())
    }

    fn capture_frontier(&self, stream: StreamId) -> BackendResult<Option<Vec<GraphNode>>> {
        Ok(self.lock().captures.frontier(stream))
    }

    fn capture_follows(&self, stream: StreamId, marks: &[GraphNode]) -> BackendResult<bool> {
        Ok(self.lock().captures.follows(stream, marks))
    }

    fn allocate_host(&self, size: u64) -> BackendResult<Box<dyn HostMemory>> {
        let call = CallKind::AllocateHost;
        if size == 0 {
            let reason = "zero-size host memory".to_string();
            return Err(self
                .lock()
                .misuse(BackendError::InvalidArgument { call, reason }));
        }
        let bytes = usize::try_from(size).map_err(|_| BackendError::OutOfMemory {
            call,
            requested: size,
        })?;
        Ok(Box::new(vec![0u8; bytes]))
    }

    fn download(&self, copies: &mut [ToHost<'_>]) -> BackendResult<()> {
        let mut st = self.lock();
        let mut plan = Vec::with_capacity(copies.len());
        for c in copies.iter() {
            plan.push(st.pieces(CallKind::Download, c.src, c.dst.len())?);
        }
        for (c, pieces) in copies.iter_mut().zip(plan) {
            let mut at = 0;
            for p in pieces {
                st.contents.read(p, &mut c.dst[at..at + p.len]);
                at += p.len;
            }
        }
        Ok(())
    }

    fn upload(&self, copies: &[ToDevice<'_>]) -> BackendResult<()> {
        let mut st = self.lock();
        let mut plan = Vec::with_capacity(copies.len());
        for c in copies {
            plan.push(st.pieces(CallKind::Upload, c.dst, c.src.len())?);
        }
        for (c, pieces) in copies.iter().zip(plan) {
            let mut at = 0;
            for p in pieces {
                st.contents.write(p, &c.src[at..at + p.len]);
                at += p.len;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_strict() {
        let sim = SimBackend::new(10 << 20);
        let a = sim.allocate_segment(4 << 20).unwrap();
        assert_eq!(a, SIM_BASE_ADDRESS);
        let b = sim.allocate_segment(4 << 20).unwrap();
        assert!(b >= a + (6 << 20), "guard gap between segments");
        assert!(sim
            .allocate_segment(4 << 20)
            .unwrap_err()
            .is_out_of_memory());
        sim.free_segment(a).unwrap();
        assert!(matches!(
            sim.free_segment(a),
            Err(BackendError::InvalidAddress { .. })
        ));
        assert!(matches!(
            sim.free_segment(a + 512),
            Err(BackendError::InvalidAddress { .. })
        ));
        let c = sim.counters();
        assert_eq!(c.misuse, 2);
        assert_eq!(c.used, 4 << 20);
        sim.free_segment(b).unwrap();
        assert_eq!(sim.live_objects(), 0);
    }

    #[test]
    fn virtual_memory_maps_whole_pages() {
        let sim = SimBackend::new(1 << 30);
        let g = SIM_GRANULARITY;
        let base = sim.reserve_range(8 * g).unwrap();
        let p = sim.create_page(2 * g).unwrap();
        assert!(sim.map(base + 512, p).is_err());
        sim.map(base + 2 * g, p).unwrap();
        assert!(sim.map(base + 3 * g, p).is_err(), "overlap");
        assert!(sim.release_page(p).is_err(), "still mapped");
        assert!(sim.release_range(base, 8 * g).is_err(), "still mapped");
        assert!(sim.unmap(base + 2 * g, g).is_err(), "half a page");
        sim.unmap(base + 2 * g, 2 * g).unwrap();
        sim.release_page(p).unwrap();
        sim.release_range(base, 8 * g).unwrap();
        assert_eq!(sim.live_objects(), 0);
        let no_vm = SimBackend::with_options(1 << 30, false);
        assert!(matches!(
            no_vm.reserve_range(g),
            Err(BackendError::Unsupported { .. })
        ));
    }

    #[test]
    fn copies_keep_bytes_of_segments_and_pages_until_they_go() {
        let sim = SimBackend::new(1 << 30);
        let g = SIM_GRANULARITY;
        let seg = sim.allocate_segment(g).unwrap();
        let base = sim.reserve_range(4 * g).unwrap();
        let (p, q) = (sim.create_page(g).unwrap(), sim.create_page(g).unwrap());
        sim.map(base, p).unwrap();
        sim.map(base + g, q).unwrap();
        let data: Vec<u8> = (0..300u32).map(|i| i as u8 ^ 0x5a).collect();
        let across = base + g - 100;
        sim.upload(&[
            ToDevice {
                src: &data,
                dst: seg + 8,
            },
            ToDevice {
                src: &data,
                dst: across,
            },
        ])
        .unwrap();
        let (mut a, mut b) = (vec![0u8; 300], vec![0u8; 300]);
        sim.download(&mut [
            ToHost {
                src: seg + 8,
                dst: &mut a,
            },
            ToHost {
                src: across,
                dst: &mut b,
            },
        ])
        .unwrap();
        assert_eq!((&a, &b), (&data, &data));
        let misuse = sim.counters().misuse;
        let outside = [ToDevice {
            src: &data,
            dst: base + 2 * g - 8,
        }];
        assert!(sim.upload(&outside).is_err(), "runs past the mapped pages");
        assert!(sim
            .download(&mut [ToHost {
                src: seg + g - 1,
                dst: &mut a
            }])
            .is_err());
        assert_eq!(sim.counters().misuse, misuse + 2);
        sim.unmap(base + g, g).unwrap();
        sim.release_page(q).unwrap();
        let q = sim.create_page(g).unwrap();
        sim.map(base + g, q).unwrap();
        sim.download(&mut [ToHost {
            src: across,
            dst: &mut b,
        }])
        .unwrap();
        assert_eq!(&b[..100], &data[..100], "the first page kept its bytes");
        assert!(
            b[100..].iter().all(|x| *x == 0),
            "a new page starts from zero"
        );
        let mut host = sim.allocate_host(64).unwrap();
        assert_eq!(host.bytes_mut().len(), 64);
        assert!(sim.allocate_host(0).is_err());
    }

    #[test]
    fn manual_events_complete_when_told() {
        let sim = SimBackend::new(1 << 30);
        sim.set_manual_events(true);
        let e = sim.create_event().unwrap();
        assert!(sim.query_event(e).unwrap(), "never recorded: complete");
        sim.record_event(e, StreamId(7)).unwrap();
        assert!(!sim.query_event(e).unwrap());
        sim.complete_stream(StreamId(7));
        assert!(sim.query_event(e).unwrap());
        sim.record_event(e, StreamId(7)).unwrap();
        sim.synchronize_event(e).unwrap();
        assert!(sim.query_event(e).unwrap());
        sim.destroy_event(e).unwrap();
        assert!(sim.query_event(e).is_err());
    }

    #[test]
    fn descending_order_reuses_large_freed_spans() {
        let sim = SimBackend::new(1 << 30).with_address_order(AddressOrder::Descending);
        let a = sim.allocate_segment(20 << 20).unwrap();
        let b = sim.allocate_segment(20 << 20).unwrap();
        let small = sim.allocate_segment(2 << 20).unwrap();
        assert!(b < a && small < b, "each new range below the previous");
        sim.free_segment(a).unwrap();
        sim.free_segment(small).unwrap();
        assert_eq!(
            sim.allocate_segment(10 << 20).unwrap() + (12 << 20),
            a + (22 << 20)
        );
        assert!(
            sim.allocate_segment(2 << 20).unwrap() < small,
            "single pages never reuse"
        );
    }

    #[test]
    fn ranges_take_at_most_the_address_space() {
        let sim = SimBackend::new(80 << 30);
        let quarter = ADDRESS_SPACE / 4;
        let bases: Vec<_> = (0..4)
            .map(|_| sim.reserve_range(quarter).unwrap())
            .collect();
        let refused = sim.reserve_range(SIM_GRANULARITY).unwrap_err();
        assert!(refused.is_out_of_memory(), "{refused}");
        sim.release_range(bases[1], quarter).unwrap();
        let again = sim.reserve_range(quarter).unwrap();
        for base in [bases[0], bases[2], bases[3], again] {
            sim.release_range(base, quarter).unwrap();
        }
        assert_eq!(sim.live_objects(), 0);
    }

    #[test]
    fn the_largest_device_has_room_for_ranges_larger_than_itself() {
        for order in [AddressOrder::Ascending, AddressOrder::Descending] {
            let sim = SimBackend::new(SIM_MAX_CAPACITY).with_address_order(order);
            // Four ranges of 9/8 of the device, as expandable segments reserve.
            let size = SIM_MAX_CAPACITY / 8 * 9;
            let mut bases: Vec<_> = (0..4).map(|_| sim.reserve_range(size).unwrap()).collect();
            bases.sort_unstable();
            assert!(bases[0] > 0, "{order:?}: no range at address 0");
            for pair in bases.windows(2) {
                assert!(pair[0] + size < pair[1], "{order:?}: {bases:x?} overlap");
            }
            let page = sim.create_page(SIM_GRANULARITY).unwrap();
            let last = bases[3] + size - SIM_GRANULARITY;
            sim.map(last, page).unwrap();
            sim.unmap(last, SIM_GRANULARITY).unwrap();
        }
    }
}
