//! The data behind the memory page: every allocation's lifetime, the device
//! memory held over time and the peak, computed from an event stream.
//!
//! Time is the event index (as in PyTorch's memory_viz), so bursts of events stay
//! readable; `times_us` maps an index back to the clock. An allocation is live
//! from its `alloc` to its `free_completed` (or its `free_requested` when no
//! completion follows); its size is the requested size. Device memory is held
//! in chunks: a segment from `segment_alloc` to `segment_free`, or a mapped range
//! from `segment_map` to the `segment_unmap` that covers it (a partial unmap
//! splits the chunk).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::backend::DevicePtr;
use crate::event::{Action, TraceEvent};
use crate::history::Frame;

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
        self.allocs
            .iter()
            .filter(move |a| a.start <= index && index < a.end)
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
}

#[derive(Default)]
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
            Action::SegmentAlloc | Action::SegmentMap => {
                self.obtain(i, e, e.action == Action::SegmentMap)
            }
            Action::SegmentFree | Action::SegmentUnmap => self.release(i, e.addr, e.size),
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
    use crate::StreamId;

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
}
