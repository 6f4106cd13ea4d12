//! Turning a recording into a plan: the allocator calls that reproduce it.
//!
//! A recording names blocks by address; a replay hands out its own addresses. The
//! plan therefore numbers each recorded allocation (its *slot*) and refers to it by
//! number, so the replay loop is a walk over a compact op list with no address
//! lookups. The rules:
//!
//! * `alloc` allocates the requested size on the recorded stream.
//! * A block is freed at its `free_completed`, the moment it became reusable in the
//!   recording. A `free_requested` with no `free_completed` before the address is
//!   handed out again (or before the end) frees at the request.
//! * A run of `segment_free`/`segment_unmap` events is an `empty_cache` call by the
//!   program unless the allocator released the memory itself. PyTorch releases
//!   cached segments on its own only inside a `malloc` that could not get a new
//!   segment (the out-of-memory retry, `max_split_size_mb`'s release of oversize
//!   blocks) or that crossed the garbage-collection threshold; such a release is
//!   directly followed by the new segment (or the out-of-memory event) and happens
//!   only when the recorded reserved memory plus that segment is near the device's
//!   allowed memory (or above the collection threshold). Every other release run
//!   becomes one `empty_cache`.
//! * `segment_alloc`/`segment_map` events are not replayed (the policy decides its
//!   own segments) but their sizes are kept to compare with the replay's.
//! * `oom` and `snapshot` events change nothing; nor do `segment_pause` and
//!   `segment_resume` (a tag's pages going back and coming back: the replay
//!   keeps the tag's memory throughout, so its peaks are the program's without
//!   pauses).
//! * A recording may start in the middle of a run (history turned on late, or
//!   a ring buffer that wrapped). A free of an address the recording has not
//!   shown before is of an allocation made before its first event; so is a
//!   block a snapshot lists as allocated that no event explains. Both are
//!   allocated first, before the first event's call, in address order, on
//!   their recorded stream and pool ([`Inferred`] counts them). A block the
//!   snapshot lists as allocated at an address the events allocated and
//!   freed was allocated after the last event (history stopped before the
//!   snapshot was taken), and is allocated last. Only a second free of an
//!   address, with no allocation between, is an error. The segments that
//!   existed before the first event (the snapshot's, less those the events
//!   created, plus those they released) are reserved before anything else:
//!   each one's size is allocated on its stream and pool, and freed once all
//!   are, so the cache holds them when the first event is replayed. These
//!   ops are the plan's setup ([`Plan::setup_ops`]): a replay's peaks and
//!   counts start after them.
//! * A snapshot names the private pool (CUDA graph, MemPool) of each segment it
//!   lists. An allocation made in such a segment after the segment's last
//!   recorded `segment_alloc`/`segment_map` (or anywhere in it, when the
//!   recording saw no such event) goes to that pool in the replay too
//!   ([`plan_routed`]); allocations in segments freed before the snapshot are
//!   not known to be private and go to the default pools.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use thiserror::Error;

use cachalot_core::backend::StreamId;
use cachalot_core::config::AllocatorConfig;
use cachalot_core::event::{Action, TraceEvent};
use cachalot_core::private_pool::PoolId;
use cachalot_core::snapshot::{BlockState, SegmentInfo};

/// One allocator call of a plan.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes on `stream` for `slot`.
    Alloc {
        /// The allocation's number.
        slot: u32,
        /// Requested bytes.
        size: u64,
        /// The recorded stream.
        stream: StreamId,
    },
    /// Free the allocation of `slot`.
    Free {
        /// The allocation's number.
        slot: u32,
    },
    /// Call `empty_cache`.
    EmptyCache,
    /// Route the next allocation to private pool `pool` (created at its first
    /// use): the recording made it in a segment of that pool.
    EnterPool {
        /// The recorded pool id.
        pool: PoolId,
    },
    /// Close the route [`Op::EnterPool`] opened.
    LeavePool {
        /// The recorded pool id.
        pool: PoolId,
    },
}

/// A recording that cannot be replayed. Remedy: the recording is inconsistent
/// (or truncated); fix or re-record it.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    /// An event that does not follow from the ones before it.
    #[error("event {event}: {problem}")]
    Inconsistent {
        /// Index of the event (0-based; see
        /// [`Recording::event_error`](crate::trace::Recording::event_error) for
        /// its place in the file).
        event: usize,
        /// What is wrong with it.
        problem: Inconsistency,
    },
    /// More allocations than a plan can number.
    #[error("more than {max} allocations")]
    TooManyAllocations {
        /// The limit.
        max: u32,
    },
}

/// What is wrong with an event of an inconsistent recording. Addresses are in
/// decimal, as trace CSVs write them.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Inconsistency {
    /// An `alloc` at an address that is still allocated.
    #[error("alloc at address {addr}, which is still allocated")]
    AddressInUse {
        /// The address.
        addr: u64,
    },
    /// A free of an address the recording allocated (or freed before) and
    /// freed again since.
    #[error("{action} of address {addr}, which was already freed")]
    AlreadyFreed {
        /// `free_requested` or `free_completed`.
        action: Action,
        /// The address.
        addr: u64,
    },
}

/// What is known of the device and configuration a recording was made with; it
/// decides which recorded segment releases were the program's `empty_cache`.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedDevice {
    /// The device's total memory.
    pub capacity: u64,
    /// The allocator configuration of the recording.
    pub config: AllocatorConfig,
    /// Known from the recording's statistics: the allocator never released memory
    /// by itself (no retry, no out-of-memory, no oversize release or garbage
    /// collection configured), so every release run is an `empty_cache`.
    pub program_releases_only: bool,
}

impl RecordedDevice {
    /// A device of `capacity` bytes recorded under `config`, with nothing more known.
    pub fn new(capacity: u64, config: AllocatorConfig) -> RecordedDevice {
        RecordedDevice {
            capacity,
            config,
            program_releases_only: false,
        }
    }

    /// Reserved bytes above which the recorded allocator may have released cached
    /// segments by itself: the collection threshold when garbage collection was on,
    /// else the allowed memory less a sixteenth (what the driver and other
    /// processes keep).
    fn pressure_bytes(&self) -> u64 {
        if self.program_releases_only {
            return u64::MAX;
        }
        let allowed = self.capacity as f64 * self.config.per_process_memory_fraction;
        let gc = self.config.garbage_collection_threshold;
        let limit = if gc > 0.0 && self.config.per_process_memory_fraction < 1.0 {
            allowed * gc
        } else {
            allowed - self.capacity as f64 / 16.0
        };
        limit.max(0.0) as u64
    }
}

/// A recording turned into allocator calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The calls, in order.
    pub ops: Vec<Op>,
    /// The recorded time of each call's event, in microseconds (as the
    /// recording's clock reads; empty for a plan built by hand). A replay stamps
    /// the events of each call with it, so what it records reads in the
    /// recording's time, not the replay's.
    pub times_us: Vec<u64>,
    /// Number of slots (recorded allocations).
    pub slots: usize,
    /// Number of recorded events.
    pub events: usize,
    /// Sizes of the recorded `segment_alloc`/`segment_map` events, in order.
    pub recorded_segment_sizes: Vec<u64>,
    /// Address and size of the recorded `segment_alloc` events, in order.
    pub recorded_segment_allocs: Vec<(u64, u64)>,
    /// The allocations the recording implies but does not show.
    pub inferred: Inferred,
    /// How many of the first ops set up the state before the first event
    /// (the segments reserved, the allocations made before it): a replay
    /// counts what the recording did from the op after them, its peaks
    /// and counts starting there.
    pub setup_ops: usize,
}

/// The allocations a recording implies but does not show (see the module
/// docs): those made before its first event, known from their frees or from
/// the snapshot's blocks, and those made after its last. Field names are a
/// stable interface (`cachalot replay --json`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Inferred {
    /// Allocations made before the first event, known from their frees.
    pub from_frees: u64,
    /// Allocations made before the first event and never freed, known from
    /// the snapshot's blocks.
    pub from_blocks: u64,
    /// The bytes requested by the allocations made before the first event.
    pub bytes: u64,
    /// Allocations made after the last event, known from the snapshot's blocks.
    pub after_last: u64,
    /// The bytes requested by them.
    pub after_last_bytes: u64,
    /// Segments that existed before the first event, reserved first.
    pub segments: u64,
    /// Their bytes.
    pub segment_bytes: u64,
}

impl Inferred {
    /// Allocations made before the first event.
    pub fn before_first(&self) -> u64 {
        self.from_frees + self.from_blocks
    }

    /// Whether the recording showed every allocation and segment it depends on.
    pub fn is_empty(&self) -> bool {
        self.before_first() + self.after_last + self.segments == 0
    }

    /// One sentence on what was inferred, or `None` when nothing was.
    pub fn describe(&self) -> Option<String> {
        use cachalot_core::error::format_size;
        let mut before = Vec::new();
        if self.segments > 0 {
            before.push(format!(
                "{} segments of {} reserved",
                self.segments,
                format_size(self.segment_bytes)
            ));
        }
        if self.before_first() > 0 {
            let mut known = Vec::new();
            if self.from_frees > 0 {
                known.push(format!("{} known from their frees", self.from_frees));
            }
            if self.from_blocks > 0 {
                known.push(format!("{} from the snapshot's blocks", self.from_blocks));
            }
            before.push(format!(
                "{} allocations of {} made: {}",
                self.before_first(),
                format_size(self.bytes),
                known.join(", ")
            ));
        }
        let mut parts = Vec::new();
        if !before.is_empty() {
            parts.push(format!(
                "the recording starts mid-run: it is replayed from the state before its first \
                 event ({}), and its figures count from there",
                before.join("; ")
            ));
        }
        if self.after_last > 0 {
            parts.push(format!(
                "its snapshot holds {} allocations ({}) made after its last event, which are \
                 made last",
                self.after_last,
                format_size(self.after_last_bytes)
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// A recorded allocation that has not been freed yet.
struct Live {
    slot: u32,
    /// Index in the op list of the free placed at its `free_requested`.
    requested_at: Option<usize>,
}

/// Builds the plan of `events` recorded on `device`.
///
/// # Errors
/// A [`PlanError`] for an inconsistent recording.
pub fn plan(events: &[TraceEvent], device: &RecordedDevice) -> Result<Plan, PlanError> {
    plan_routed(events, device, &[])
}

/// Builds the plan of `events` recorded on `device`, sending the allocations
/// made in the private-pool segments of `segments` (a snapshot's, taken after
/// the events) to those pools.
///
/// # Errors
/// A [`PlanError`] for an inconsistent recording.
pub fn plan_routed(
    events: &[TraceEvent],
    device: &RecordedDevice,
    segments: &[SegmentInfo],
) -> Result<Plan, PlanError> {
    let mut builder = Builder {
        ops: Vec::with_capacity(events.len()),
        pools: PoolRanges::new(events, segments),
        ..Builder::default()
    };
    builder.segments_before(events, segments)?;
    let pressure = device.pressure_bytes();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => builder.alloc(i, e)?,
            Action::FreeRequested => builder.free_requested(i, e)?,
            Action::FreeCompleted => builder.free_completed(i, e)?,
            Action::SegmentAlloc | Action::SegmentMap => {
                builder.reserved = builder.reserved.saturating_add(e.size);
                builder.segment_sizes.push(e.size);
                if e.action == Action::SegmentAlloc {
                    builder.segment_allocs.push((e.addr, e.size));
                }
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                let run_start = i == 0 || !is_release(events[i - 1].action);
                if run_start && !released_by_policy(events, i, builder.reserved, pressure) {
                    builder.push(Op::EmptyCache, e);
                }
                builder.reserved = builder.reserved.saturating_sub(e.size);
            }
            // A tag's pages going and coming back: no allocator call.
            Action::SegmentPause => builder.reserved = builder.reserved.saturating_sub(e.size),
            Action::SegmentResume => builder.reserved = builder.reserved.saturating_add(e.size),
            Action::Oom | Action::Snapshot => {}
        }
    }
    builder.blocks_not_shown(segments, events.last().map_or(0, |e| e.time_us))?;
    let slots = builder.next_slot as usize;
    let recorded_segment_sizes = std::mem::take(&mut builder.segment_sizes);
    let recorded_segment_allocs = std::mem::take(&mut builder.segment_allocs);
    let inferred = builder.inferred;
    let first_time = events.first().map_or(0, |e| e.time_us);
    let (ops, times_us, setup_ops) = builder.kept_ops(first_time);
    Ok(Plan {
        setup_ops,
        ops,
        times_us,
        slots,
        events: events.len(),
        recorded_segment_sizes,
        recorded_segment_allocs,
        inferred,
    })
}

fn is_release(action: Action) -> bool {
    matches!(action, Action::SegmentFree | Action::SegmentUnmap)
}

/// Whether the release run starting at `start` is one the allocator made by itself
/// (see the module docs).
fn released_by_policy(events: &[TraceEvent], start: usize, reserved: u64, pressure: u64) -> bool {
    let next = events[start..].iter().find(|e| !is_release(e.action));
    match next {
        Some(e)
            if matches!(
                e.action,
                Action::SegmentAlloc | Action::SegmentMap | Action::Oom
            ) =>
        {
            reserved.saturating_add(e.size) > pressure
        }
        _ => false,
    }
}

/// The private-pool segments of a snapshot: `(base, end, pool, from)`, where
/// `from` is the index of the first event that may allocate in it (after its
/// last recorded creation).
#[derive(Default)]
struct PoolRanges(Vec<(u64, u64, PoolId, usize)>);

impl PoolRanges {
    fn new(events: &[TraceEvent], segments: &[SegmentInfo]) -> PoolRanges {
        let mut ranges: Vec<_> = segments
            .iter()
            .filter(|s| s.pool_id != PoolId::DEFAULT)
            .map(|s| (s.address, s.address + s.total_size, s.pool_id, 0))
            .collect();
        if ranges.is_empty() {
            return PoolRanges(ranges);
        }
        for (i, e) in events.iter().enumerate() {
            if matches!(e.action, Action::SegmentAlloc | Action::SegmentMap) {
                for r in ranges.iter_mut().filter(|r| r.0 <= e.addr && e.addr < r.1) {
                    r.3 = i;
                }
            }
        }
        PoolRanges(ranges)
    }

    /// The pool of an allocation at `addr` made by event `event`.
    fn of(&self, event: usize, addr: u64) -> Option<PoolId> {
        self.0
            .iter()
            .find(|r| r.0 <= addr && addr < r.1 && event >= r.3)
            .map(|r| r.2)
    }
}

/// An allocation made before the first event: allocated first, in address order.
struct Earlier {
    addr: u64,
    slot: u32,
    size: u64,
    stream: StreamId,
}

#[derive(Default)]
struct Builder {
    pools: PoolRanges,
    ops: Vec<Op>,
    /// The recorded time of each op's event.
    times_us: Vec<u64>,
    live: HashMap<u64, Live>,
    /// Every address the events allocated, or freed having allocated it
    /// before the first event.
    seen: HashSet<u64>,
    /// The allocations made before the first event.
    earlier: Vec<Earlier>,
    /// The segments that existed before the first event, as allocations of
    /// their size (freed once all are made).
    reservations: Vec<Earlier>,
    inferred: Inferred,
    next_slot: u32,
    /// Op indices of request-time frees superseded by their completion.
    blanked: Vec<usize>,
    reserved: u64,
    segment_sizes: Vec<u64>,
    segment_allocs: Vec<(u64, u64)>,
}

impl Builder {
    fn push(&mut self, op: Op, e: &TraceEvent) {
        self.ops.push(op);
        self.times_us.push(e.time_us);
    }

    /// The ops and their times: the allocations made before the first event
    /// (at `first_time`), then the events' ops without the request-time frees
    /// that a completion superseded.
    fn kept_ops(mut self, first_time: u64) -> (Vec<Op>, Vec<u64>, usize) {
        self.earlier.sort_unstable_by_key(|e| e.addr);
        let mut ops = Vec::with_capacity(self.ops.len() + self.earlier.len());
        for e in self.reservations.iter().chain(&self.earlier) {
            let op = Op::Alloc {
                slot: e.slot,
                size: e.size,
                stream: e.stream,
            };
            match self.pools.of(0, e.addr) {
                Some(pool) => ops.extend([Op::EnterPool { pool }, op, Op::LeavePool { pool }]),
                None => ops.push(op),
            }
            if self.reservations.last().is_some_and(|r| r.slot == e.slot) {
                ops.extend(self.reservations.iter().map(|r| Op::Free { slot: r.slot }));
            }
        }
        let setup = ops.len();
        let mut times = vec![first_time; setup];
        self.blanked.sort_unstable();
        let mut blanked = self.blanked.into_iter().peekable();
        for (i, pair) in self.ops.into_iter().zip(self.times_us).enumerate() {
            if blanked.next_if_eq(&i).is_none() {
                ops.push(pair.0);
                times.push(pair.1);
            }
        }
        (ops, times, setup)
    }

    /// The segments that existed before the first of `events`: those of
    /// `segments` (a snapshot's, taken after the events) less the ones the
    /// events created, plus the ones they released; walked back from the end.
    /// Each becomes a reservation, in the order the device gave them out
    /// (highest address first), and counts in the reserved bytes.
    fn segments_before(
        &mut self,
        events: &[TraceEvent],
        segments: &[SegmentInfo],
    ) -> Result<(), PlanError> {
        let mut at_start: HashMap<u64, (u64, StreamId)> = segments
            .iter()
            .map(|s| (s.address, (s.total_size, s.stream)))
            .collect();
        for e in events.iter().rev() {
            match e.action {
                Action::SegmentAlloc => {
                    at_start.remove(&e.addr);
                }
                Action::SegmentFree => {
                    at_start.insert(e.addr, (e.size, e.stream));
                }
                _ => {}
            }
        }
        let mut at_start: Vec<_> = at_start.into_iter().collect();
        at_start.sort_unstable_by_key(|(addr, _)| std::cmp::Reverse(*addr));
        for (addr, (size, stream)) in at_start {
            let slot = self.next_slot()?;
            self.reservations.push(Earlier {
                addr,
                slot,
                size,
                stream,
            });
            self.inferred.segments += 1;
            self.inferred.segment_bytes = self.inferred.segment_bytes.saturating_add(size);
            self.reserved = self.reserved.saturating_add(size);
        }
        Ok(())
    }

    fn next_slot(&mut self) -> Result<u32, PlanError> {
        let slot = self.next_slot;
        self.next_slot = slot
            .checked_add(1)
            .ok_or(PlanError::TooManyAllocations { max: u32::MAX })?;
        Ok(slot)
    }

    /// Records an allocation of `size` bytes at `addr` on `stream` made before
    /// the first event, live from the start.
    fn earlier(&mut self, addr: u64, size: u64, stream: StreamId) -> Result<(), PlanError> {
        let slot = self.next_slot()?;
        self.earlier.push(Earlier {
            addr,
            slot,
            size,
            stream,
        });
        self.inferred.bytes = self.inferred.bytes.saturating_add(size);
        self.seen.insert(addr);
        self.live.insert(
            addr,
            Live {
                slot,
                requested_at: None,
            },
        );
        Ok(())
    }

    /// A free of `e.addr`, which is not live: of an allocation made before the
    /// first event when the events never showed the address, else an error.
    fn free_of_unseen(&mut self, event: usize, e: &TraceEvent) -> Result<(), PlanError> {
        if self.seen.contains(&e.addr) {
            return Err(unknown_address(event, e));
        }
        self.inferred.from_frees += 1;
        self.earlier(e.addr, e.size, e.stream)
    }

    /// The blocks `segments` (a snapshot taken after the last event) list as
    /// allocated that the events do not leave allocated: made before the first
    /// event when the events never showed the address, else after the last
    /// (at `last_time`).
    fn blocks_not_shown(
        &mut self,
        segments: &[SegmentInfo],
        last_time: u64,
    ) -> Result<(), PlanError> {
        let allocated = segments.iter().flat_map(|s| {
            s.blocks
                .iter()
                .filter(|b| b.state == BlockState::ActiveAllocated)
                .map(move |b| (b, s.stream))
        });
        for (b, stream) in allocated {
            if self.live.contains_key(&b.address) {
                continue;
            }
            let size = if b.requested_size > 0 {
                b.requested_size
            } else {
                b.size
            };
            if !self.seen.contains(&b.address) {
                self.inferred.from_blocks += 1;
                self.earlier(b.address, size, stream)?;
                continue;
            }
            self.inferred.after_last += 1;
            self.inferred.after_last_bytes = self.inferred.after_last_bytes.saturating_add(size);
            let e = TraceEvent {
                time_us: last_time,
                action: Action::Alloc,
                addr: b.address,
                size,
                stream,
            };
            self.alloc(usize::MAX, &e)?;
        }
        Ok(())
    }

    fn alloc(&mut self, event: usize, e: &TraceEvent) -> Result<(), PlanError> {
        if let Some(old) = self.live.get(&e.addr) {
            if old.requested_at.is_none() {
                return Err(PlanError::Inconsistent {
                    event,
                    problem: Inconsistency::AddressInUse { addr: e.addr },
                });
            }
            // Freed by request with no completion before reuse: the request's free stands.
            self.live.remove(&e.addr);
        }
        self.seen.insert(e.addr);
        let slot = self.next_slot()?;
        let op = Op::Alloc {
            slot,
            size: e.size,
            stream: e.stream,
        };
        match self.pools.of(event, e.addr) {
            Some(pool) => {
                self.push(Op::EnterPool { pool }, e);
                self.push(op, e);
                self.push(Op::LeavePool { pool }, e);
            }
            None => self.push(op, e),
        }
        self.live.insert(
            e.addr,
            Live {
                slot,
                requested_at: None,
            },
        );
        Ok(())
    }

    fn free_requested(&mut self, event: usize, e: &TraceEvent) -> Result<(), PlanError> {
        if !self.live.contains_key(&e.addr) {
            self.free_of_unseen(event, e)?;
        }
        let Some(live) = self.live.get_mut(&e.addr) else {
            return Err(unknown_address(event, e));
        };
        if live.requested_at.is_some() {
            return Err(unknown_address(event, e));
        }
        live.requested_at = Some(self.ops.len());
        let op = Op::Free { slot: live.slot };
        self.push(op, e);
        Ok(())
    }

    fn free_completed(&mut self, event: usize, e: &TraceEvent) -> Result<(), PlanError> {
        if !self.live.contains_key(&e.addr) {
            self.free_of_unseen(event, e)?;
        }
        let Some(live) = self.live.remove(&e.addr) else {
            return Err(unknown_address(event, e));
        };
        if let Some(at) = live.requested_at {
            self.blanked.push(at);
        }
        self.push(Op::Free { slot: live.slot }, e);
        Ok(())
    }
}

/// The error for event `event`, `e`, a free of an address freed before.
fn unknown_address(event: usize, e: &TraceEvent) -> PlanError {
    PlanError::Inconsistent {
        event,
        problem: Inconsistency::AlreadyFreed {
            action: e.action,
            addr: e.addr,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            time_us: 0,
            action,
            addr,
            size,
            stream: StreamId(0),
        }
    }

    fn h100() -> RecordedDevice {
        RecordedDevice::new(85_017_493_504, AllocatorConfig::default())
    }

    use Action::*;

    #[test]
    fn allocations_in_a_snapshots_private_segments_go_to_its_pool() {
        let graph = PoolId(0, 3);
        let seg = |address, pool_id| SegmentInfo {
            device: 0,
            address,
            total_size: 2 << 20,
            stream: StreamId(0),
            is_small: true,
            is_expandable: false,
            pool_id,
            blocks: Vec::new(),
        };
        let events = [
            ev(SegmentAlloc, 1 << 30, 2 << 20),
            ev(Alloc, 1 << 30, 512),
            ev(FreeCompleted, 1 << 30, 512),
            ev(SegmentFree, 1 << 30, 2 << 20),
            ev(SegmentAlloc, 1 << 30, 2 << 20),
            ev(Alloc, (1 << 30) + 512, 512),
            ev(Alloc, 5 << 30, 512),
        ];
        let segments = [seg(1 << 30, graph), seg(5 << 30, PoolId::DEFAULT)];
        let p = plan_routed(&events, &h100(), &segments).unwrap();
        let routed: Vec<usize> = p
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| matches!(o, Op::EnterPool { pool } if *pool == graph))
            .map(|(i, _)| i)
            .collect();
        // Only the allocation after the segment's last creation: the first one
        // was in an earlier segment at the same address. (Slot 0 reserves the
        // default segment, which no event created.)
        assert_eq!(routed.len(), 1);
        let at = routed[0];
        assert!(matches!(p.ops[at + 1], Op::Alloc { slot: 2, .. }));
        assert_eq!(p.ops[at + 2], Op::LeavePool { pool: graph });
        assert_eq!(p.ops.len(), p.times_us.len());
        assert_eq!(p.inferred.segments, 1);
        assert_eq!(plan(&events, &h100()).unwrap().ops.len(), p.ops.len() - 4);
    }

    #[test]
    fn frees_happen_at_completion_or_at_an_unanswered_request() {
        let events = [
            ev(SegmentAlloc, 100, 2 << 20),
            ev(Alloc, 100, 512),
            ev(Alloc, 612, 512),
            ev(FreeRequested, 100, 512),
            ev(FreeRequested, 612, 512),
            ev(FreeCompleted, 100, 512),
            ev(Alloc, 612, 1024),
        ];
        let p = plan(&events, &h100()).unwrap();
        let s = StreamId(0);
        assert_eq!(
            p.ops,
            [
                Op::Alloc {
                    slot: 0,
                    size: 512,
                    stream: s
                },
                Op::Alloc {
                    slot: 1,
                    size: 512,
                    stream: s
                },
                Op::Free { slot: 1 },
                Op::Free { slot: 0 },
                Op::Alloc {
                    slot: 2,
                    size: 1024,
                    stream: s
                },
            ]
        );
        assert_eq!((p.slots, p.events), (3, 7));
        assert_eq!(p.recorded_segment_sizes, [2 << 20]);
    }

    #[test]
    fn a_release_run_is_one_empty_cache_unless_under_pressure() {
        let seg = 20 << 20;
        let events = [
            ev(SegmentAlloc, 1, seg),
            ev(SegmentAlloc, 2, seg),
            ev(SegmentFree, 1, seg),
            ev(SegmentFree, 2, seg),
            ev(SegmentAlloc, 3, seg),
            ev(Alloc, 3, 4 << 20),
        ];
        let p = plan(&events, &h100()).unwrap();
        assert_eq!(p.ops.iter().filter(|o| **o == Op::EmptyCache).count(), 1);
        // The same pattern on a device just large enough: the allocator's own retry.
        let tight = RecordedDevice {
            capacity: 3 * seg,
            ..h100()
        };
        let p = plan(&events, &tight).unwrap();
        assert!(!p.ops.contains(&Op::EmptyCache));
        // ...unless the recording's statistics rule the allocator's own release out.
        let known = RecordedDevice {
            program_releases_only: true,
            ..tight
        };
        let p = plan(&events, &known).unwrap();
        assert_eq!(p.ops.iter().filter(|o| **o == Op::EmptyCache).count(), 1);
    }

    #[test]
    fn inconsistent_recordings_are_errors() {
        let inconsistent = |event, problem| Err(PlanError::Inconsistent { event, problem });
        let double = [ev(Alloc, 1, 512), ev(Alloc, 1, 512)];
        assert_eq!(
            plan(&double, &h100()),
            inconsistent(1, Inconsistency::AddressInUse { addr: 1 })
        );
        let again = [
            ev(Alloc, 139_637_976_727_552, 512),
            ev(FreeCompleted, 139_637_976_727_552, 512),
            ev(FreeCompleted, 139_637_976_727_552, 512),
        ];
        let err = plan(&again, &h100()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "event 2: free_completed of address 139637976727552, which was already freed"
        );
        let twice = [
            ev(Alloc, 1, 512),
            ev(FreeRequested, 1, 512),
            ev(FreeRequested, 1, 512),
        ];
        assert_eq!(
            plan(&twice, &h100()),
            inconsistent(
                2,
                Inconsistency::AlreadyFreed {
                    action: FreeRequested,
                    addr: 1
                }
            )
        );
    }

    fn block(
        address: u64,
        requested_size: u64,
        state: BlockState,
    ) -> cachalot_core::snapshot::BlockInfo {
        cachalot_core::snapshot::BlockInfo {
            address,
            size: 512,
            requested_size,
            state,
        }
    }

    #[test]
    fn a_recording_that_starts_mid_run_allocates_what_it_frees_first() {
        // The ring buffer kept the free of 100 (allocated before it wrapped),
        // both halves of the free of 200, and the completion of 300's.
        let events = [
            ev(Alloc, 400, 64),
            ev(FreeCompleted, 100, 512),
            ev(FreeRequested, 200, 256),
            ev(FreeCompleted, 200, 256),
            ev(FreeCompleted, 300, 128),
            ev(FreeCompleted, 400, 64),
        ];
        let p = plan(&events, &h100()).unwrap();
        let s = StreamId(0);
        let alloc = |slot, size| Op::Alloc {
            slot,
            size,
            stream: s,
        };
        assert_eq!(
            p.ops,
            [
                alloc(1, 512),
                alloc(2, 256),
                alloc(3, 128),
                alloc(0, 64),
                Op::Free { slot: 1 },
                Op::Free { slot: 2 },
                Op::Free { slot: 3 },
                Op::Free { slot: 0 },
            ]
        );
        assert_eq!(
            p.inferred,
            Inferred {
                from_frees: 3,
                from_blocks: 0,
                bytes: 896,
                after_last: 0,
                after_last_bytes: 0,
                segments: 0,
                segment_bytes: 0,
            }
        );
        assert_eq!(p.ops.len(), p.times_us.len());
    }

    #[test]
    fn a_snapshots_blocks_fill_in_what_its_events_do_not_show() {
        let graph = PoolId(0, 7);
        let segment = |address, pool_id, blocks| SegmentInfo {
            device: 0,
            address,
            total_size: 2 << 20,
            stream: StreamId(3),
            is_small: true,
            is_expandable: false,
            pool_id,
            blocks,
        };
        let segments = [
            segment(
                1 << 20,
                PoolId::DEFAULT,
                vec![
                    block(1 << 20, 100, BlockState::ActiveAllocated),
                    block((1 << 20) + 512, 0, BlockState::Inactive),
                    block((1 << 20) + 1024, 300, BlockState::ActiveAllocated),
                    block((1 << 20) + 1536, 50, BlockState::ActivePendingFree),
                ],
            ),
            segment(
                8 << 20,
                graph,
                vec![block(8 << 20, 0, BlockState::ActiveAllocated)],
            ),
        ];
        // Events: (1<<20)+1024 allocated and freed, then allocated again after
        // history stopped; 1<<20 and the graph's block never shown.
        let events = [
            ev(Alloc, (1 << 20) + 1024, 300),
            ev(FreeCompleted, (1 << 20) + 1024, 300),
        ];
        let p = plan_routed(&events, &h100(), &segments).unwrap();
        assert_eq!(
            p.inferred,
            Inferred {
                from_frees: 0,
                from_blocks: 2,
                bytes: 100 + 512,
                after_last: 1,
                after_last_bytes: 300,
                segments: 2,
                segment_bytes: 4 << 20,
            }
        );
        let s3 = StreamId(3);
        let alloc = |slot, size, stream| Op::Alloc { slot, size, stream };
        assert_eq!(
            p.ops,
            [
                // The segments, highest first, reserved and released.
                Op::EnterPool { pool: graph },
                alloc(0, 2 << 20, s3),
                Op::LeavePool { pool: graph },
                alloc(1, 2 << 20, s3),
                Op::Free { slot: 0 },
                Op::Free { slot: 1 },
                // The blocks never shown, by address.
                alloc(3, 100, s3),
                Op::EnterPool { pool: graph },
                alloc(5, 512, s3),
                Op::LeavePool { pool: graph },
                // The events.
                alloc(2, 300, StreamId(0)),
                Op::Free { slot: 2 },
                // Allocated after the last event.
                alloc(4, 300, s3),
            ]
        );
        // A snapshot with no events at all: its allocated blocks, nothing else.
        let p = plan_routed(&[], &h100(), &segments).unwrap();
        assert_eq!(p.inferred.from_blocks, 3);
        assert_eq!(p.slots, 5);
    }
}
