//! The data behind the memory page: every allocation's lifetime, the device
//! memory held over time and the peak, computed from an event stream.
//!
//! Time is the event index (as in PyTorch's memory_viz), so bursts of events stay
//! readable; `times_us` maps an index back to the clock. An allocation is live
//! from its `alloc` to its `free_completed` (or its `free_requested` when no
//! completion follows); its size is the requested size. Device memory is held
//! in chunks: a segment from `segment_alloc` to `segment_free`, or a mapped range
//! from `segment_map` to the `segment_unmap` that covers it (a partial unmap
//! splits the chunk). A paused tag's segment is held until its `segment_pause`
//! and again from its `segment_resume`, as a mapped range; its allocations stay
//! live in between.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde::Serialize;

use cachalot_core::backend::DevicePtr;
use cachalot_core::event::{Action, Observer, TraceEvent};
use cachalot_core::history::Frame;

/// Sentinel end of something still live after the last event.
pub const STILL_LIVE: u32 = u32::MAX;

/// One allocation's lifetime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AllocSpan {
    /// Its address.
    pub addr: DevicePtr,
    /// Requested bytes.
    pub size: u64,
    /// Its stream.
    pub stream: u64,
    /// Index of its `alloc` event.
    pub start: u32,
    /// Index of the event that freed it, or [`STILL_LIVE`].
    pub end: u32,
    /// Index into [`Timeline::stacks`], when a stack was recorded.
    pub stack: Option<u32>,
}

/// One chunk of device memory held: a segment or a mapped range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkSpan {
    /// Its address.
    pub addr: DevicePtr,
    /// Its size.
    pub size: u64,
    /// Index of the event that obtained it.
    pub start: u32,
    /// Index of the event that returned it, or [`STILL_LIVE`].
    pub end: u32,
    /// Whether it was mapped (expandable segments) rather than allocated.
    pub mapped: bool,
}

/// A stretch of consecutive events, summarized for drawing: the most memory
/// held inside it and what was held after its last event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Column {
    /// Index of its last event.
    pub last: u32,
    /// The clock of its last event, in microseconds.
    pub time_us: u64,
    /// The most active (requested) bytes after any of its events.
    pub active_max: u64,
    /// Active bytes after its last event.
    pub active_end: u64,
    /// The most reserved bytes after any of its events.
    pub reserved_max: u64,
    /// Reserved bytes after its last event.
    pub reserved_end: u64,
}

/// Everything the page draws.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Timeline {
    /// The clock of each event, in microseconds.
    pub times_us: Vec<u64>,
    /// Allocations in the order they were made.
    pub allocs: Vec<AllocSpan>,
    /// Device memory chunks in the order they were obtained.
    pub chunks: Vec<ChunkSpan>,
    /// `(event index, reserved bytes after it)` at every change.
    pub reserved: Vec<(u32, u64)>,
    /// The event index after which active bytes peaked (first such).
    pub peak_index: u32,
    /// Active (requested) bytes at the peak.
    pub peak_bytes: u64,
    /// Event indices of out-of-memory events.
    pub ooms: Vec<u32>,
    /// Frees of addresses that were not live (allocated before the trace began).
    pub unmatched_frees: u64,
    /// Distinct recorded stacks, each as `name (file:line)` lines.
    pub stacks: Vec<Vec<String>>,
}

impl Timeline {
    /// The timeline of `events` (no stacks).
    pub fn from_events(events: &[TraceEvent]) -> Timeline {
        Timeline::build(events.iter().map(|e| (e, &[][..])))
    }

    /// The timeline of events with the stack recorded at each.
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = (&'a TraceEvent, &'a [Frame])>,
    ) -> Timeline {
        Timeline::build(records)
    }

    fn build<'a>(records: impl IntoIterator<Item = (&'a TraceEvent, &'a [Frame])>) -> Timeline {
        let mut b = Builder::default();
        for (i, (event, frames)) in records.into_iter().enumerate() {
            b.step(u32::try_from(i).unwrap_or(STILL_LIVE - 1), event, frames);
        }
        b.finish()
    }

    /// Allocations live just after event `index`.
    pub fn live_at(&self, index: u32) -> impl Iterator<Item = &AllocSpan> + '_ {
        self.live_indices_at(index).map(|k| &self.allocs[k])
    }

    /// Indices in [`Timeline::allocs`] of the allocations live just after
    /// event `index`.
    pub fn live_indices_at(&self, index: u32) -> impl Iterator<Item = usize> + '_ {
        let live = move |a: &AllocSpan| a.start <= index && index < a.end;
        (0..self.allocs.len()).filter(move |&k| live(&self.allocs[k]))
    }

    /// Reserved bytes just after event `index`.
    pub fn reserved_at(&self, index: u32) -> u64 {
        let after = self.reserved.partition_point(|&(i, _)| i <= index);
        after.checked_sub(1).map_or(0, |k| self.reserved[k].1)
    }

    /// The highest reserved byte count.
    pub fn peak_reserved(&self) -> u64 {
        self.reserved.iter().map(|&(_, r)| r).max().unwrap_or(0)
    }

    /// The events in at most `max` columns of (nearly) equal length, one per
    /// event when there are no more than `max`. Every event falls in one column,
    /// so the columns' maxima hold the exact peaks.
    pub fn columns(&self, max: usize) -> Vec<Column> {
        let n = self.times_us.len();
        let count = n.min(max.max(1));
        let mut delta = vec![0i128; n];
        for a in &self.allocs {
            let size = i128::from(a.size);
            if let Some(d) = delta.get_mut(a.start as usize) {
                *d += size;
            }
            if let Some(d) = delta.get_mut(a.end as usize) {
                *d -= size;
            }
        }
        let mut out = Vec::with_capacity(count);
        let mut column = Column::default();
        let (mut active, mut reserved, mut changes) = (0i128, 0, self.reserved.iter().peekable());
        for (i, d) in delta.into_iter().enumerate() {
            active += d;
            while let Some(&(_, bytes)) = changes.next_if(|(at, _)| *at as usize <= i) {
                reserved = bytes;
            }
            let bytes = u64::try_from(active).unwrap_or(0);
            column.active_max = column.active_max.max(bytes);
            column.reserved_max = column.reserved_max.max(reserved);
            let column_end = (out.len() + 1) * n / count;
            if i + 1 == column_end {
                out.push(Column {
                    last: u32::try_from(i).unwrap_or(STILL_LIVE - 1),
                    time_us: self.times_us[i],
                    active_end: bytes,
                    reserved_end: reserved,
                    ..column
                });
                column = Column::default();
            }
        }
        out
    }

    /// Indices of at most `max` allocations to draw one by one, in allocation
    /// order: all of them when there are no more; else the largest of each of
    /// `stretches` equal stretches of events (by where they start), so every
    /// part of the run has its bands, and the largest live at the peak.
    pub fn drawn(&self, max: usize, stretches: usize) -> Vec<usize> {
        if self.allocs.len() <= max {
            return (0..self.allocs.len()).collect();
        }
        let stretches = stretches.clamp(1, max);
        let quota = max / stretches / 2;
        let events = self.times_us.len().max(1) as u64;
        let mut by_stretch: Vec<Vec<usize>> = vec![Vec::new(); stretches];
        for (k, a) in self.allocs.iter().enumerate() {
            let s = u64::from(a.start) * stretches as u64 / events;
            by_stretch[(s as usize).min(stretches - 1)].push(k);
        }
        let mut out: Vec<usize> = by_stretch
            .into_iter()
            .flat_map(|ks| self.largest_of(ks, quota))
            .collect();
        let at_peak: Vec<usize> = self.live_indices_at(self.peak_index).collect();
        out.extend(self.largest_of(at_peak, max - out.len()));
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The `n` largest of `ks` (ties: the earlier).
    fn largest_of(&self, mut ks: Vec<usize>, n: usize) -> Vec<usize> {
        if ks.len() > n {
            let size = |k: &usize| std::cmp::Reverse(self.allocs[*k].size);
            ks.select_nth_unstable_by(n, |a, b| size(a).cmp(&size(b)).then(a.cmp(b)));
            ks.truncate(n);
        }
        ks
    }
}

/// Builds a [`Timeline`] from the events an allocator sends (install it as the
/// allocator's [`Observer`]), keeping no event list: a run of any length is
/// drawn from every one of its events.
#[derive(Debug, Default)]
pub struct TimelineRecorder {
    builder: Mutex<Builder>,
}

impl TimelineRecorder {
    /// A recorder that has seen nothing.
    pub fn new() -> TimelineRecorder {
        TimelineRecorder::default()
    }

    /// The timeline of the events seen so far; the recorder starts over.
    pub fn finish(&self) -> Timeline {
        let builder = std::mem::take(&mut *self.builder.lock().unwrap_or_else(|e| e.into_inner()));
        builder.finish()
    }
}

impl Observer for TimelineRecorder {
    fn on_event(&self, event: &TraceEvent) {
        let mut b = self.builder.lock().unwrap_or_else(|e| e.into_inner());
        let i = u32::try_from(b.t.times_us.len()).unwrap_or(STILL_LIVE - 1);
        b.step(i, event, &[]);
    }
}

#[derive(Debug, Default)]
struct Builder {
    t: Timeline,
    /// Live allocation by address: its index in `allocs`.
    live: HashMap<DevicePtr, usize>,
    /// Live allocations the caller freed, by address: the `free_requested` index.
    requested: HashMap<DevicePtr, u32>,
    /// Held chunks by address: index in `chunks`.
    held: BTreeMap<DevicePtr, usize>,
    stack_ids: HashMap<Vec<Frame>, u32>,
    active: u64,
    reserved: u64,
}

impl Builder {
    fn step(&mut self, i: u32, e: &TraceEvent, frames: &[Frame]) {
        self.t.times_us.push(e.time_us);
        match e.action {
            Action::Alloc => self.alloc(i, e, frames),
            Action::FreeRequested => {
                self.requested.insert(e.addr, i);
            }
            Action::FreeCompleted => {
                self.requested.remove(&e.addr);
                self.free(i, e.addr);
            }
            Action::SegmentAlloc => self.obtain(i, e, false),
            Action::SegmentMap | Action::SegmentResume => self.obtain(i, e, true),
            Action::SegmentFree | Action::SegmentUnmap | Action::SegmentPause => {
                self.release(i, e.addr, e.size)
            }
            Action::Oom => self.t.ooms.push(i),
            Action::Snapshot => {}
        }
    }

    fn alloc(&mut self, i: u32, e: &TraceEvent, frames: &[Frame]) {
        let stack = (!frames.is_empty()).then(|| self.stack_id(frames));
        // An address still live means its free never completed: end it here.
        self.requested.remove(&e.addr);
        if let Some(old) = self.live.insert(e.addr, self.t.allocs.len()) {
            self.end_alloc(old, i);
        }
        self.t.allocs.push(AllocSpan {
            addr: e.addr,
            size: e.size,
            stream: e.stream.0,
            start: i,
            end: STILL_LIVE,
            stack,
        });
        self.active += e.size;
        if self.active > self.t.peak_bytes {
            self.t.peak_bytes = self.active;
            self.t.peak_index = i;
        }
    }

    fn free(&mut self, i: u32, addr: DevicePtr) {
        match self.live.remove(&addr) {
            Some(k) => self.end_alloc(k, i),
            None => self.t.unmatched_frees += 1,
        }
    }

    fn end_alloc(&mut self, k: usize, i: u32) {
        if let Some(a) = self.t.allocs.get_mut(k) {
            a.end = i;
            self.active -= a.size;
        }
    }

    fn stack_id(&mut self, frames: &[Frame]) -> u32 {
        if let Some(&id) = self.stack_ids.get(frames) {
            return id;
        }
        let id = self.t.stacks.len() as u32;
        self.t.stacks.push(
            frames
                .iter()
                .map(|f| format!("{} ({}:{})", f.name, f.filename, f.line))
                .collect(),
        );
        self.stack_ids.insert(frames.to_vec(), id);
        id
    }

    fn obtain(&mut self, i: u32, e: &TraceEvent, mapped: bool) {
        self.held.insert(e.addr, self.t.chunks.len());
        self.t.chunks.push(ChunkSpan {
            addr: e.addr,
            size: e.size,
            start: i,
            end: STILL_LIVE,
            mapped,
        });
        self.set_reserved(i, self.reserved + e.size);
    }

    /// Returns `[addr, addr + size)`: ends every chunk inside it and re-opens
    /// the parts of chunks that stick out of it.
    fn release(&mut self, i: u32, addr: DevicePtr, size: u64) {
        let end = addr.saturating_add(size);
        let first = self
            .held
            .range(..addr)
            .next_back()
            .map_or(addr, |(&a, _)| a);
        let overlapping: Vec<(DevicePtr, usize)> =
            self.held.range(first..end).map(|(&a, &k)| (a, k)).collect();
        let mut released = 0;
        for (a, k) in overlapping {
            let c = self.t.chunks[k].clone();
            let c_end = a + c.size;
            if c_end <= addr {
                continue;
            }
            self.held.remove(&a);
            self.t.chunks[k].end = i;
            let (lo, hi) = (a.max(addr), c_end.min(end));
            released += hi - lo;
            for (piece, piece_end) in [(a, lo), (hi, c_end)] {
                if piece < piece_end {
                    self.held.insert(piece, self.t.chunks.len());
                    self.t.chunks.push(ChunkSpan {
                        addr: piece,
                        size: piece_end - piece,
                        start: i,
                        end: STILL_LIVE,
                        mapped: c.mapped,
                    });
                }
            }
        }
        self.set_reserved(i, self.reserved.saturating_sub(released));
    }

    fn set_reserved(&mut self, i: u32, bytes: u64) {
        self.reserved = bytes;
        match self.t.reserved.last_mut() {
            Some(last) if last.0 == i => last.1 = bytes,
            _ => self.t.reserved.push((i, bytes)),
        }
    }

    /// Ends, at their `free_requested`, the allocations whose free never completed.
    fn finish(mut self) -> Timeline {
        for (addr, i) in std::mem::take(&mut self.requested) {
            if let Some(k) = self.live.remove(&addr) {
                self.end_alloc(k, i);
            }
        }
        self.t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot_core::backend::StreamId;

    fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            time_us: 1000 + addr,
            action,
            addr,
            size,
            stream: StreamId(0),
        }
    }

    #[test]
    fn allocations_live_from_alloc_to_free_completed() {
        let t = Timeline::from_events(&[
            ev(Action::SegmentAlloc, 0, 100),
            ev(Action::Alloc, 0, 40),
            ev(Action::Alloc, 40, 50),
            ev(Action::FreeRequested, 0, 40),
            ev(Action::FreeCompleted, 0, 40),
            ev(Action::Alloc, 0, 30),
            ev(Action::FreeCompleted, 999, 1),
            ev(Action::FreeRequested, 40, 50),
        ]);
        let spans: Vec<(u64, u32, u32)> =
            t.allocs.iter().map(|a| (a.addr, a.start, a.end)).collect();
        assert_eq!(
            spans,
            [(0, 1, 4), (40, 2, 7), (0, 5, STILL_LIVE)],
            "an uncompleted free ends at its request"
        );
        assert_eq!((t.peak_index, t.peak_bytes), (2, 90));
        assert_eq!(t.live_at(3).count(), 2);
        assert_eq!(t.live_at(4).count(), 1);
        assert_eq!(t.unmatched_frees, 1);
        assert_eq!(t.times_us.len(), 8);
        assert_eq!(t.reserved, [(0, 100)]);
    }

    #[test]
    fn partial_unmaps_split_mapped_chunks() {
        let mib = 1 << 20;
        let t = Timeline::from_events(&[
            ev(Action::SegmentMap, 0, 6 * mib),
            ev(Action::SegmentMap, 6 * mib, 2 * mib),
            ev(Action::SegmentUnmap, 2 * mib, 6 * mib),
            ev(Action::SegmentFree, 0, 2 * mib),
        ]);
        assert_eq!(
            t.reserved,
            [(0, 6 * mib), (1, 8 * mib), (2, 2 * mib), (3, 0)]
        );
        let kept: Vec<(u64, u64, u32, u32)> = t
            .chunks
            .iter()
            .map(|c| (c.addr, c.size, c.start, c.end))
            .collect();
        assert_eq!(
            kept,
            [
                (0, 6 * mib, 0, 2),
                (6 * mib, 2 * mib, 1, 2),
                (0, 2 * mib, 2, 3)
            ]
        );
        assert!(t.chunks.iter().all(|c| c.mapped));
        assert_eq!(t.reserved_at(1), 8 * mib);
        assert_eq!(t.reserved_at(2), 2 * mib);
        assert_eq!(t.peak_reserved(), 8 * mib);
    }

    #[test]
    fn a_paused_segment_is_held_again_from_its_resume() {
        let mib = 1 << 20;
        let t = Timeline::from_events(&[
            ev(Action::SegmentAlloc, 0, 20 * mib),
            ev(Action::Alloc, 0, 8 * mib),
            ev(Action::SegmentPause, 0, 20 * mib),
            ev(Action::SegmentResume, 0, 20 * mib),
        ]);
        assert_eq!(t.reserved, [(0, 20 * mib), (2, 0), (3, 20 * mib)]);
        assert_eq!(t.allocs[0].end, STILL_LIVE, "the allocation lives through");
        let chunks: Vec<(u32, u32, bool)> = t
            .chunks
            .iter()
            .map(|c| (c.start, c.end, c.mapped))
            .collect();
        assert_eq!(chunks, [(0, 2, false), (3, STILL_LIVE, true)]);
    }

    #[test]
    fn stacks_are_shared_between_allocations() {
        let frames = [Frame {
            name: "f".into(),
            filename: "a.rs".into(),
            line: 1,
        }];
        let a = ev(Action::Alloc, 0, 1);
        let b = ev(Action::Alloc, 8, 1);
        let c = ev(Action::Alloc, 16, 1);
        let t = Timeline::from_records([(&a, &frames[..]), (&b, &[][..]), (&c, &frames[..])]);
        let ids: Vec<Option<u32>> = t.allocs.iter().map(|a| a.stack).collect();
        assert_eq!(ids, [Some(0), None, Some(0)]);
        assert_eq!(t.stacks, [vec!["f (a.rs:1)".to_string()]]);
    }

    #[test]
    fn columns_keep_the_exact_peaks() {
        let events: Vec<TraceEvent> = (0..10)
            .flat_map(|k| {
                [
                    ev(Action::SegmentAlloc, k * 100, 100),
                    ev(Action::Alloc, k * 100, 10 + k),
                    ev(Action::FreeCompleted, k * 100, 10 + k),
                    ev(Action::SegmentFree, k * 100, 100),
                ]
            })
            .collect();
        let t = Timeline::from_events(&events);
        let cols = t.columns(5);
        assert_eq!(cols.len(), 5);
        assert_eq!(cols.last().map(|c| c.last), Some(39));
        let active = cols.iter().map(|c| c.active_max).max();
        assert_eq!(active, Some(t.peak_bytes));
        assert_eq!(t.peak_bytes, 19);
        let reserved = cols.iter().map(|c| c.reserved_max).max();
        assert_eq!(reserved, Some(t.peak_reserved()));
        assert!(cols
            .iter()
            .all(|c| c.active_end == 0 && c.reserved_end == 0));
        let every = t.columns(1000);
        assert_eq!(every.len(), 40, "one column per event");
        assert_eq!((every[1].active_end, every[1].reserved_end), (10, 100));
        assert_eq!(every[1].time_us, events[1].time_us);
    }

    #[test]
    fn drawn_allocations_cover_every_stretch_and_the_peak() {
        // Two stretches of four events: sizes 5, 50, 7, 50 then 1, 2, 3, 4; the
        // peak is at the end, with all eight live.
        let sizes = [5, 50, 7, 50, 1, 2, 3, 4];
        let events: Vec<TraceEvent> = sizes
            .iter()
            .enumerate()
            .map(|(k, &size)| ev(Action::Alloc, 64 * k as u64, size))
            .collect();
        let t = Timeline::from_events(&events);
        assert_eq!(t.drawn(9, 2), [0, 1, 2, 3, 4, 5, 6, 7], "all when they fit");
        // One per stretch (the largest of each), then the largest at the peak.
        assert_eq!(t.drawn(4, 2), [1, 3, 7]);
        assert_eq!(t.drawn(6, 2), [0, 1, 2, 3, 7]);
    }

    #[test]
    fn a_recorder_sees_what_a_list_gives() {
        let events = [
            ev(Action::SegmentAlloc, 0, 100),
            ev(Action::Alloc, 0, 40),
            ev(Action::FreeCompleted, 0, 40),
        ];
        let recorder = TimelineRecorder::new();
        for e in &events {
            recorder.on_event(e);
        }
        assert_eq!(recorder.finish(), Timeline::from_events(&events));
        assert_eq!(recorder.finish(), Timeline::default(), "it starts over");
    }
}
