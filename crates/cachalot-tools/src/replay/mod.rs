//! Replaying a recorded workload through any policy, on a simulated device or
//! a real one.
//!
//! A recording ([`crate::trace::Recording`]) is first turned into a [`Plan`]: the
//! allocator calls that reproduce it, with each allocation numbered (see
//! [`plan()`] for the rules: frees at completion, `empty_cache` where the program
//! called it, streams kept). [`replay_on`], the one entry every tool uses, then
//! drives a [`DeviceAllocator`] through the plan on a [`Device`] and reports
//! peaks, the device segments it obtained and the driver calls it made, as a
//! [`ReplayReport`].
//!
//! Out-of-memory during a replay is not fatal: the allocation is counted in
//! [`ReplayReport::ooms`] and skipped (and so is its later free).
//!
//! [`replay_passes_on`] runs the plan several times on one allocator, as a
//! training loop or a server repeats its work: each pass but the last frees
//! what it left allocated, and [`ReplayReport::passes`] says what each pass
//! cost in driver calls and held in reserved memory, so whether a workload
//! settles (no driver call once its cache is warm) and what it then holds can
//! be read off.

pub mod plan;
pub mod workload;

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Serialize, Serializer};
use thiserror::Error;

pub use plan::{plan, plan_routed, Inconsistency, Inferred, Op, Plan, PlanError, RecordedDevice};
pub use workload::Workload;

use cachalot_core::allocator::DeviceAllocator;
use cachalot_core::backend::counting::{CallCounts, Counting};
use cachalot_core::backend::recorded::RecordedAddresses;
use cachalot_core::backend::sim::SimBackend;
use cachalot_core::backend::{Backend, DevicePtr};
use cachalot_core::config::AllocatorConfig;
use cachalot_core::error::{Error, OomReport};
use cachalot_core::event::{Action, Observer, TraceEvent};
use cachalot_core::stats::{MemoryStats, Stat};

/// The capacity of an H100 80GB as PyTorch reports it: the default replay device.
pub const H100_CAPACITY: u64 = 85_017_493_504;

/// How often (in ops) [`replay_on`] reports progress.
pub const PROGRESS_EVERY: usize = 1 << 16;

/// A replay that could not go on.
#[derive(Debug, Error)]
pub enum ReplayError {
    /// The recording is inconsistent.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The allocator failed in a way other than running out of memory (a device
    /// error, or a refused free: a bug in the allocator or the plan).
    #[error("op {op}: {source}")]
    Allocator {
        /// Index of the op in the plan.
        op: usize,
        /// The allocator's error.
        #[source]
        source: Error,
    },
    /// The allocator could not be built for this configuration.
    #[error("cannot build the allocator: {0}")]
    Setup(#[source] Error),
    /// An op names a slot the plan does not have (a hand-built plan).
    #[error("op {op}: slot {slot} is outside the plan's {slots} slots")]
    BadSlot {
        /// Index of the op in the plan.
        op: usize,
        /// The slot named.
        slot: u32,
        /// The plan's slot count.
        slots: usize,
    },
}

/// What a replay measured. Field names are a stable interface (`cachalot replay
/// --json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplayReport {
    /// The policy replayed.
    pub policy: String,
    /// Its configuration string.
    pub conf: String,
    /// The device replayed on, by name (the simulated one, or a GPU's).
    pub device: String,
    /// The simulated device's capacity in bytes.
    pub capacity: u64,
    /// Recorded events replayed, over every pass (as `allocs` and `frees`
    /// count every pass).
    pub events: u64,
    /// Allocations made (ooms not included).
    pub allocs: u64,
    /// Frees made.
    pub frees: u64,
    /// `empty_cache` calls made.
    pub empty_caches: u64,
    /// Peak of the bytes callers asked for.
    pub peak_requested_bytes: u64,
    /// Peak of the allocated (rounded) bytes.
    pub peak_allocated_bytes: u64,
    /// Peak of the reserved bytes (sum of segment sizes).
    pub peak_reserved_bytes: u64,
    /// Device segments obtained (segment allocations and page-range maps).
    pub segment_allocs: u64,
    /// Their sizes, in the order they were obtained.
    pub segment_sizes: Vec<u64>,
    /// Backend calls by kind ([`cachalot_core::backend::CallKind::name`]).
    pub device_calls: BTreeMap<String, u64>,
    /// Costly driver memory calls (allocations, frees, maps, unmaps, ...).
    pub driver_calls: u64,
    /// Allocations that failed for lack of memory (and were skipped).
    pub ooms: u64,
    /// Wall-clock nanoseconds per recorded event spent in the replay loop.
    pub ns_per_event: f64,
    /// The allocator's `memory_stats()` at the end (serialized under PyTorch's
    /// flattened key names).
    #[serde(serialize_with = "stats_by_key")]
    pub final_stats: MemoryStats,
    /// Each pass of the plan, in order (one for a plain replay).
    pub passes: Vec<PassReport>,
    /// The allocations the recording implies but does not show, replayed
    /// all the same (a recording that starts mid-run).
    pub inferred: Inferred,
    /// The first out-of-memory error, with its breakdown (print it with
    /// [`cachalot_core::report::oom::describe`]). Not part of the JSON output.
    #[serde(skip)]
    pub first_oom: Option<OomReport>,
}

/// What one pass of a replay cost and held. Field names are a stable
/// interface (`cachalot replay --passes N --json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PassReport {
    /// Costly driver memory calls made during the pass.
    pub driver_calls: u64,
    /// Reserved bytes at the pass's end (before what it left allocated is
    /// freed).
    pub reserved_bytes: u64,
    /// The most bytes reserved at once from the replay's start to the pass's
    /// end.
    pub peak_reserved_bytes: u64,
}

impl ReplayReport {
    /// Peak reserved over peak requested (1.0 is no waste; 0 when nothing was
    /// requested).
    pub fn fragmentation(&self) -> f64 {
        if self.peak_requested_bytes == 0 {
            return 0.0;
        }
        self.peak_reserved_bytes as f64 / self.peak_requested_bytes as f64
    }

    /// The first pass from which no pass made a driver call (0-based): the
    /// workload has settled there. `None` when the last pass still made one.
    pub fn settled_at(&self) -> Option<usize> {
        let calling = self.passes.iter().rposition(|p| p.driver_calls > 0);
        match calling {
            None => Some(0),
            Some(last) if last + 1 < self.passes.len() => Some(last + 1),
            Some(_) => None,
        }
    }
}

fn stats_by_key<S: Serializer>(stats: &MemoryStats, out: S) -> Result<S::Ok, S::Error> {
    stats.to_map().serialize(out)
}

/// Collects the sizes of the segments an allocator obtains, and passes every
/// event on to `also` (a history recorder, say), stamped with the recorded time
/// of the plan's call that caused it when the plan has times.
#[derive(Default)]
struct SegmentLog {
    sizes: Mutex<Vec<u64>>,
    also: Option<Arc<dyn Observer>>,
    /// The recorded time of the call being replayed, when the plan has times.
    clock: Option<AtomicU64>,
}

impl Observer for SegmentLog {
    fn on_event(&self, event: &TraceEvent) {
        if let Some(also) = &self.also {
            match &self.clock {
                Some(clock) => also.on_event(&TraceEvent {
                    time_us: clock.load(Ordering::Relaxed),
                    ..*event
                }),
                None => also.on_event(event),
            }
        }
        if matches!(event.action, Action::SegmentAlloc | Action::SegmentMap) {
            self.sizes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(event.size);
        }
    }

    /// Segment sizes need no time, and recorded times replace the allocator's.
    fn wants_time(&self) -> bool {
        self.clock.is_none() && self.also.as_ref().is_some_and(|a| a.wants_time())
    }

    /// Segment allocations and maps, and whatever the observer passed on to wants.
    fn wants(&self, action: Action) -> bool {
        matches!(action, Action::SegmentAlloc | Action::SegmentMap)
            || self.also.as_ref().is_some_and(|a| a.wants(action))
    }
}

/// Counts of the calls a replay made.
#[derive(Default)]
struct Tally {
    allocs: u64,
    frees: u64,
    empty_caches: u64,
    ooms: u64,
    first_oom: Option<OomReport>,
}

/// The device a replay runs on.
#[derive(Clone, Debug)]
pub enum Device {
    /// A simulated device of this many bytes.
    Simulated {
        /// Its memory, in bytes.
        capacity: u64,
    },
    /// Any backend: a real GPU (`cachalot::backend::cuda::CudaBackend`),
    /// say. A replay never touches the memory it allocates.
    Backend(Arc<dyn Backend>),
}

/// A finished replay: what it measured and the allocator in its final state.
#[derive(Debug)]
pub struct Replayed {
    /// What the replay measured.
    pub report: ReplayReport,
    /// The allocator, with what the recording left live still allocated.
    pub allocator: Arc<dyn DeviceAllocator>,
}

/// The one way to replay a plan: a fresh allocator for `config` on `device`,
/// drawing through [`RecordedAddresses`] (so blocks land where the recording
/// put them: see [`recorded`](cachalot_core::backend::recorded)) and [`Counting`] (for
/// the report's call counts), every event shown to `observer` stamped with its
/// recorded time. `progress` is called with the number of ops done every
/// [`PROGRESS_EVERY`] ops.
///
/// # Errors
/// [`ReplayError::Setup`] when the policy cannot run `config`;
/// [`ReplayError::Allocator`] when the allocator fails other than by running
/// out of memory.
pub fn replay_on(
    plan: &Plan,
    config: AllocatorConfig,
    device: Device,
    observer: Option<Arc<dyn Observer>>,
    progress: &mut dyn FnMut(usize),
) -> Result<Replayed, ReplayError> {
    replay_passes_on(plan, config, device, NonZeroUsize::MIN, observer, progress)
}

/// [`replay_on`], the plan run `passes` times in a row on the one allocator
/// (see the module docs). Each pass but the last frees what it left
/// allocated; the report's totals and peaks cover every pass, and `progress`
/// counts the ops of all of them.
///
/// # Errors
/// As [`replay_on`].
pub fn replay_passes_on(
    plan: &Plan,
    config: AllocatorConfig,
    device: Device,
    passes: NonZeroUsize,
    observer: Option<Arc<dyn Observer>>,
    progress: &mut dyn FnMut(usize),
) -> Result<Replayed, ReplayError> {
    let (counting, allocator) = open(plan, config, device)?;
    let run = Run {
        plan,
        allocator: allocator.as_ref(),
        counting: &counting,
        passes: passes.get(),
    };
    let report = run.observed(progress, observer)?;
    Ok(Replayed { report, allocator })
}

/// [`replay_on`] a simulated device of `capacity` bytes, unobserved.
///
/// # Errors
/// As [`replay_on`].
pub fn replay(
    plan: &Plan,
    config: AllocatorConfig,
    capacity: u64,
    progress: &mut dyn FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    let device = Device::Simulated { capacity };
    Ok(replay_on(plan, config, device, None, progress)?.report)
}

type Counted = Counting<dyn Backend>;

/// The allocator a replay of `plan` runs through, and the counter of its calls.
fn open(
    plan: &Plan,
    config: AllocatorConfig,
    device: Device,
) -> Result<(Arc<Counted>, Arc<dyn DeviceAllocator>), ReplayError> {
    let inner: Arc<dyn Backend> = match device {
        Device::Simulated { capacity } => Arc::new(SimBackend::new(capacity)),
        Device::Backend(backend) => backend,
    };
    let recorded: Arc<dyn Backend> = Arc::new(RecordedAddresses::new(
        inner,
        plan.recorded_segment_allocs.clone(),
    ));
    let counting = Arc::new(Counting::new(recorded));
    let allocator =
        cachalot_core::policy::create(counting.clone(), config).map_err(ReplayError::Setup)?;
    Ok((counting, allocator))
}

/// A replay under way: `passes` passes of `plan` through `allocator`, which
/// draws from `counting`.
struct Run<'a> {
    plan: &'a Plan,
    allocator: &'a dyn DeviceAllocator,
    counting: &'a Counted,
    passes: usize,
}

impl Run<'_> {
    /// Replays the passes, every event shown to `observer`; the report.
    fn observed(
        &self,
        progress: &mut dyn FnMut(usize),
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<ReplayReport, ReplayError> {
        let plan = self.plan;
        let restamp = observer.is_some() && plan.times_us.len() == plan.ops.len();
        let log = Arc::new(SegmentLog {
            sizes: Mutex::default(),
            also: observer,
            clock: restamp.then(AtomicU64::default),
        });
        self.allocator.set_observer(Some(log.clone()));
        let start = Instant::now();
        let clock = log.clock.as_ref().map(|c| (c, plan.times_us.as_slice()));
        let mut setup_calls = CallCounts::default();
        let result = self.all_passes(progress, clock, false, &mut || {
            log.sizes.lock().unwrap_or_else(|e| e.into_inner()).clear();
            setup_calls = self.counting.counts();
        });
        let elapsed = start.elapsed();
        self.allocator.set_observer(None);
        let (tally, passes) = result?;
        let segment_sizes =
            std::mem::take(&mut *log.sizes.lock().unwrap_or_else(|e| e.into_inner()));
        let calls = self.counting.counts().since(&setup_calls);
        Ok(self.report(tally, passes, segment_sizes, &calls, elapsed))
    }

    /// Every pass, each but the last followed by freeing what it left
    /// allocated; the calls made and each pass's figures. `clock` and
    /// `stop_at_oom` as [`Driver`] takes them; with `stop_at_oom`, no pass
    /// follows the one that ran out of memory. Once the first pass's setup
    /// ops ([`Plan::setup_ops`]) are done, the peaks and counts start again
    /// (out-of-memory failures aside) and `after_setup` is called.
    fn all_passes(
        &self,
        progress: &mut dyn FnMut(usize),
        clock: Option<(&AtomicU64, &[u64])>,
        stop_at_oom: bool,
        after_setup: &mut dyn FnMut(),
    ) -> Result<(Tally, Vec<PassReport>), ReplayError> {
        let (plan, allocator) = (self.plan, self.allocator);
        let mut ptrs: Vec<DevicePtr> = vec![0; plan.slots];
        let mut tally = Tally::default();
        let mut passes = Vec::with_capacity(self.passes);
        for pass in 0..self.passes {
            let mut calls_before = self.counting.counts().memory_calls();
            let done = pass * plan.ops.len();
            let mut offset = |i: usize| progress(done + i);
            let mut driver = Driver {
                plan,
                allocator,
                ptrs: &mut ptrs,
                tally: &mut tally,
                progress: &mut offset,
                stop_at_oom,
                clock,
            };
            driver.drive(0..plan.setup_ops)?;
            if pass == 0 {
                if plan.setup_ops > 0 {
                    allocator.reset_peak_stats();
                    *driver.tally = Tally {
                        ooms: driver.tally.ooms,
                        first_oom: driver.tally.first_oom.take(),
                        ..Tally::default()
                    };
                }
                after_setup();
                calls_before = self.counting.counts().memory_calls();
            }
            if !(stop_at_oom && driver.tally.ooms > 0) {
                driver.drive(plan.setup_ops..plan.ops.len())?;
            }
            let stats = allocator.stats();
            passes.push(PassReport {
                driver_calls: self.counting.counts().memory_calls() - calls_before,
                reserved_bytes: u64::try_from(stats.reserved_bytes.all.current).unwrap_or(0),
                peak_reserved_bytes: u64::try_from(stats.reserved_bytes.all.peak).unwrap_or(0),
            });
            if stop_at_oom && tally.ooms > 0 {
                break;
            }
            if pass + 1 < self.passes {
                free_leftovers(allocator, &mut ptrs, &mut tally, plan.ops.len())?;
            }
        }
        Ok((tally, passes))
    }

    /// The report of a finished replay.
    fn report(
        &self,
        tally: Tally,
        passes: Vec<PassReport>,
        segment_sizes: Vec<u64>,
        counters: &CallCounts,
        elapsed: std::time::Duration,
    ) -> ReplayReport {
        let (allocator, counting) = (self.allocator, self.counting);
        let stats = allocator.stats();
        let peak = |stat: &Stat| u64::try_from(stat.peak).unwrap_or(0);
        let events = self.plan.events * self.passes;
        ReplayReport {
            policy: allocator.policy().name().to_string(),
            conf: allocator.config().source.clone(),
            device: counting.capabilities().name.clone(),
            capacity: counting.capabilities().total_memory,
            events: events as u64,
            allocs: tally.allocs,
            frees: tally.frees,
            empty_caches: tally.empty_caches,
            peak_requested_bytes: peak(&stats.requested_bytes.all),
            peak_allocated_bytes: peak(&stats.allocated_bytes.all),
            peak_reserved_bytes: peak(&stats.reserved_bytes.all),
            segment_allocs: segment_sizes.len() as u64,
            segment_sizes,
            device_calls: counters
                .calls
                .iter()
                .map(|(k, n)| (k.name().to_string(), *n))
                .collect(),
            driver_calls: counters.memory_calls(),
            ooms: tally.ooms,
            ns_per_event: elapsed.as_nanos() as f64 / events.max(1) as f64,
            final_stats: stats,
            passes,
            inferred: self.plan.inferred,
            first_oom: tally.first_oom,
        }
    }
}

/// Frees every slot still allocated (what a pass left live), counting the
/// frees; errors name op `at` (the pass's end).
fn free_leftovers(
    allocator: &dyn DeviceAllocator,
    ptrs: &mut [DevicePtr],
    tally: &mut Tally,
    at: usize,
) -> Result<(), ReplayError> {
    for ptr in ptrs.iter_mut().filter(|p| **p != 0) {
        allocator
            .free(std::mem::take(ptr))
            .map_err(|source| ReplayError::Allocator { op: at, source })?;
        tally.frees += 1;
    }
    Ok(())
}

/// Whether `plan`, run `passes` times in a row (as [`replay_passes_on`] runs
/// it), replays under `config` on a simulated device of `capacity` bytes
/// without running out of memory; stops at the first allocation that does
/// not fit.
///
/// # Errors
/// As [`replay`].
pub fn fits(
    plan: &Plan,
    config: AllocatorConfig,
    capacity: u64,
    passes: NonZeroUsize,
) -> Result<bool, ReplayError> {
    let (counting, allocator) = open(plan, config, Device::Simulated { capacity })?;
    let run = Run {
        plan,
        allocator: allocator.as_ref(),
        counting: &counting,
        passes: passes.get(),
    };
    Ok(run.all_passes(&mut |_| {}, None, true, &mut || {})?.0.ooms == 0)
}

/// One pass of the replay loop, counting into `tally`; `ptrs` holds each
/// slot's pointer (0 for a slot not allocated, or skipped after an OOM,
/// whose free is then a no-op, as freeing the null address is). With
/// `stop_at_oom`, it ends at the first allocation that runs out of memory;
/// with a `clock`, it sets it to each op's recorded time before the op.
struct Driver<'a> {
    plan: &'a Plan,
    allocator: &'a dyn DeviceAllocator,
    ptrs: &'a mut [DevicePtr],
    tally: &'a mut Tally,
    progress: &'a mut dyn FnMut(usize),
    stop_at_oom: bool,
    clock: Option<(&'a AtomicU64, &'a [u64])>,
}

impl Driver<'_> {
    /// Runs the plan's ops in `ops` (a range of indices).
    fn drive(&mut self, ops: std::ops::Range<usize>) -> Result<(), ReplayError> {
        let (plan, allocator) = (self.plan, self.allocator);
        let (ptrs, tally, stop_at_oom) = (&mut *self.ptrs, &mut *self.tally, self.stop_at_oom);
        let progress = &mut *self.progress;
        let end = ops.end;
        for (i, op) in plan.ops[ops.clone()].iter().enumerate() {
            let i = ops.start + i;
            if i.is_multiple_of(PROGRESS_EVERY) && i > 0 {
                progress(i);
            }
            if let Some((clock, times)) = self.clock {
                clock.store(times[i], Ordering::Relaxed);
            }
            let fail = |source: Error| ReplayError::Allocator { op: i, source };
            let bad_slot = |slot: u32| ReplayError::BadSlot {
                op: i,
                slot,
                slots: plan.slots,
            };
            match *op {
                Op::Alloc { slot, size, stream } => {
                    let entry = ptrs.get_mut(slot as usize).ok_or_else(|| bad_slot(slot))?;
                    match allocator.malloc(size, stream) {
                        Ok(ptr) => {
                            *entry = ptr;
                            tally.allocs += 1;
                        }
                        Err(Error::OutOfMemory(report)) => {
                            tally.ooms += 1;
                            if tally.first_oom.is_none() {
                                let breakdown = allocator.oom_breakdown();
                                tally.first_oom = Some(report.with_breakdown(breakdown));
                            }
                            if stop_at_oom {
                                return Ok(());
                            }
                        }
                        Err(e) => return Err(fail(e)),
                    }
                }
                Op::Free { slot } => {
                    let ptr =
                        std::mem::take(ptrs.get_mut(slot as usize).ok_or_else(|| bad_slot(slot))?);
                    if ptr != 0 {
                        allocator.free(ptr).map_err(fail)?;
                        tally.frees += 1;
                    }
                }
                Op::EmptyCache => {
                    allocator.empty_cache().map_err(fail)?;
                    tally.empty_caches += 1;
                }
                Op::EnterPool { pool } => {
                    if allocator.pool_use_count(pool) == 0 {
                        allocator.create_pool(pool).map_err(fail)?;
                    }
                    allocator
                        .begin_allocate_to_pool(pool, Arc::new(|_| true))
                        .map_err(fail)?;
                }
                Op::LeavePool { pool } => {
                    allocator.end_allocate_to_pool(pool).map_err(fail)?;
                    allocator.release_pool(pool).map_err(fail)?;
                }
            }
        }
        if end == plan.ops.len() {
            progress(end);
        }
        Ok(())
    }
}

/// Hand-built plans for the tests of the replay and of what builds on it.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Op, Plan};
    use cachalot_core::backend::StreamId;

    /// Allocates `size` bytes for `slot` on the default stream.
    pub(crate) fn alloc(slot: u32, size: u64) -> Op {
        Op::Alloc {
            slot,
            size,
            stream: StreamId::DEFAULT,
        }
    }

    /// A plan of `ops` over `slots` slots, one event per op.
    pub(crate) fn plan_of(ops: Vec<Op>, slots: usize) -> Plan {
        Plan {
            events: ops.len(),
            ops,
            slots,
            ..Plan::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{alloc, plan_of};
    use super::*;
    use cachalot_core::config::PolicyKind;

    const MIB: u64 = 1 << 20;

    #[test]
    fn passes_free_their_leftovers_and_settle() {
        // Slot 1 stays allocated at the end of the plan, as a recording's
        // parameters do.
        let ops = vec![alloc(0, 64 * MIB), alloc(1, 8 * MIB), Op::Free { slot: 0 }];
        let plan = plan_of(ops, 2);
        for policy in [PolicyKind::Pytorch, PolicyKind::Cachalot] {
            let mut config = AllocatorConfig::default();
            config.policy = policy;
            let device = Device::Simulated { capacity: 1 << 30 };
            let passes = NonZeroUsize::new(3).unwrap();
            let replayed = replay_passes_on(&plan, config, device, passes, None, &mut |_| {})
                .expect("replays");
            let r = &replayed.report;
            assert_eq!(
                (r.allocs, r.frees),
                (6, 5),
                "{policy:?}: the last pass keeps slot 1"
            );
            assert_eq!(
                replayed.allocator.stats().allocated_bytes.all.current,
                8 << 20
            );
            assert_eq!(r.passes.len(), 3);
            assert!(r.passes[0].driver_calls > 0, "{policy:?}: {:?}", r.passes);
            assert_eq!(r.settled_at(), Some(1), "{policy:?}: {:?}", r.passes);
            let total: u64 = r.passes.iter().map(|p| p.driver_calls).sum();
            assert_eq!(total, r.driver_calls);
            let last = r.passes.last().unwrap();
            assert_eq!(last.peak_reserved_bytes, r.peak_reserved_bytes);
            replayed.allocator.validate().expect("invariants hold");
        }
    }

    #[test]
    fn settled_at_is_the_first_pass_of_the_quiet_tail() {
        let with = |calls: &[u64]| ReplayReport {
            passes: calls
                .iter()
                .map(|&driver_calls| PassReport {
                    driver_calls,
                    ..PassReport::default()
                })
                .collect(),
            ..ReplayReport::default()
        };
        assert_eq!(with(&[0, 0]).settled_at(), Some(0));
        assert_eq!(with(&[5, 0, 3, 0, 0]).settled_at(), Some(3));
        assert_eq!(with(&[5, 0, 3]).settled_at(), None);
        assert_eq!(with(&[]).settled_at(), Some(0));
    }

    #[test]
    fn out_of_memory_skips_the_allocation_and_its_free() {
        let ops = vec![
            alloc(0, 64 * MIB),
            alloc(1, 64 * MIB),
            Op::Free { slot: 1 },
            Op::Free { slot: 0 },
            Op::EmptyCache,
        ];
        let r = replay(
            &plan_of(ops, 2),
            AllocatorConfig::default(),
            100 * MIB,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!((r.allocs, r.ooms, r.frees, r.empty_caches), (1, 1, 1, 1));
        assert_eq!(r.peak_requested_bytes, 64 * MIB);
        assert_eq!(r.segment_sizes, [64 * MIB]);
        assert_eq!(
            r.final_stats.reserved_bytes.all.current, 0,
            "empty_cache gave the segment back"
        );
        assert_eq!(r.device_calls.get("segment_free"), Some(&1));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["final_stats"]["num_ooms"], 1);
    }

    #[test]
    fn a_routed_allocation_stays_in_its_pool_through_empty_cache() {
        let pool = cachalot_core::private_pool::PoolId(0, 9);
        let ops = |routed: bool| {
            let mut v = vec![alloc(0, 30 * MIB), Op::Free { slot: 0 }, Op::EmptyCache];
            if routed {
                v.insert(0, Op::EnterPool { pool });
                v.insert(2, Op::LeavePool { pool });
            }
            v
        };
        let reserved = |routed| {
            let r = replay(
                &plan_of(ops(routed), 1),
                AllocatorConfig::default(),
                1 << 30,
                &mut |_| {},
            )
            .unwrap();
            r.final_stats.reserved_bytes.all.current
        };
        assert_eq!(reserved(false), 0);
        assert!(
            reserved(true) >= 30 * MIB as i64,
            "the pool keeps its memory, as a live graph"
        );
    }

    #[test]
    fn a_slot_outside_the_plan_is_an_error() {
        let bad = plan_of(vec![Op::Free { slot: 7 }], 1);
        let err = replay(&bad, AllocatorConfig::default(), 100 * MIB, &mut |_| {}).unwrap_err();
        assert!(
            matches!(
                err,
                ReplayError::BadSlot {
                    op: 0,
                    slot: 7,
                    slots: 1
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn progress_reports_the_end() {
        let mut seen = Vec::new();
        let p = plan_of(vec![alloc(0, 512), Op::Free { slot: 0 }], 1);
        replay(&p, AllocatorConfig::default(), 100 * MIB, &mut |n| {
            seen.push(n)
        })
        .unwrap();
        assert_eq!(seen, [2]);
    }

    #[test]
    fn repeated_out_of_memory_failures_are_counted_and_the_first_explained() {
        // 10,000 failures past a full device, under both policies: each is a
        // counter, not a walk of the live blocks (the benchmark times 100,000).
        for policy in [PolicyKind::Pytorch, PolicyKind::Cachalot] {
            let ops: Vec<Op> = (0..10_064).map(|slot| alloc(slot, MIB)).collect();
            let mut config = AllocatorConfig::default();
            config.policy = policy;
            let r = replay(&plan_of(ops, 10_064), config, 64 * MIB, &mut |_| {}).unwrap();
            assert_eq!((r.allocs, r.ooms), (64, 10_000), "{policy}");
            assert_eq!(r.final_stats.num_ooms, 10_000, "{policy}");
            let first = r.first_oom.expect("an out-of-memory error");
            let breakdown = first.breakdown.expect("the first is explained");
            let live: u64 = breakdown.live_by_size.iter().map(|b| b.count).sum();
            assert_eq!(live, 64, "{policy}");
        }
    }

    #[test]
    fn observed_events_carry_the_recorded_times() {
        struct Times(Mutex<Vec<(Action, u64)>>);
        impl Observer for Times {
            fn on_event(&self, e: &TraceEvent) {
                self.0.lock().unwrap().push((e.action, e.time_us));
            }
        }
        let mut p = plan_of(vec![alloc(0, 512), Op::Free { slot: 0 }], 1);
        p.times_us = vec![1_000_000, 2_500_000];
        let times = Arc::new(Times(Mutex::default()));
        let device = Device::Simulated {
            capacity: 100 * MIB,
        };
        let config = AllocatorConfig::default();
        replay_on(&p, config, device, Some(times.clone()), &mut |_| {}).unwrap();
        let seen = times.0.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                (Action::SegmentAlloc, 1_000_000),
                (Action::Alloc, 1_000_000),
                (Action::FreeRequested, 2_500_000),
                (Action::FreeCompleted, 2_500_000),
            ],
            "each event has its call's recorded time, not the replay's clock"
        );
    }
}
