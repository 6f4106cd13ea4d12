//! The `cachalot` policy: near-zero fragmentation without a global lock.
//!
//! # Data structures
//!
//! * Each stream owns two **pools** (small: requests of 1 MiB or less; large),
//!   each a **heap** (`heap`): blocks in a vector addressed by id, tiling the
//!   pool's regions, a best-fit index of free blocks (`index`: size classes
//!   found by a bitmap, each a short vector by size, then address) and an
//!   address index of live ones (`live`: a hash map, or in the large pool over
//!   a reserved range a table with an entry per MiB). Blocks are 512-byte
//!   multiples.
//! * The small pool (with virtual memory) keeps freed blocks unmerged in
//!   exact-size lists (`reuse`) for the next request of that size; they go
//!   back into the heap (one large enough, when there are many) before any
//!   page is mapped, on `empty_cache`, on out of memory, and once nothing is
//!   live on the stream (so that its next work is laid out from whole free
//!   pages, as its first was: llama_train_bf16's second pass otherwise mapped
//!   a small page its first did not need). A churning
//!   stream's large pool (below) keeps its last 16 freed blocks the same way.
//! * With virtual memory, a pool's region is one reserved virtual range of twice
//!   the device's memory, and `cells` tracks its 2 MiB cells: which hold a
//!   physical page, how many live blocks touch each, and the mapped cells no
//!   block touches (cached pages), found by a clock sweep when one is needed.
//! * Physical memory comes in handles of one or more pages (`cells`'
//!   extents): the cells a new block holds alone (all but an end cell it may
//!   share with a neighbour) get one handle per aligned group of
//!   `cachalot_extent_mb` (default 64 MiB: 32 pages) while the stream may
//!   grow by that much; other cells, and every cell of a churning stream, a
//!   page each. The driver's cost is per handle (on an H100, creating,
//!   mapping and opening one costs about 50 us whatever its size), so the
//!   first pass of a training trace makes 7% to 16% of the driver calls of
//!   one handle per page, at the same peak (tests/cachalot_traces.rs). A
//!   handle maps, unmaps and goes back only whole, once no live block
//!   touches it: re-mapping takes a cached handle of one page, or gives back
//!   a larger one and makes a page. A group that would take the stream past
//!   its budget (below) first gives back the coldest cached handle of
//!   several pages, which would go back whole anyway, and is then one handle
//!   if it fits: the first pass of llama_train_bf16 made 476 driver calls
//!   instead of 742 (with 32 MiB handles: 580), at a lower peak, before the
//!   frontier rule below.
//! * A stream growing for the first time (at a new peak of pages in use,
//!   having never re-mapped a page) maps the cells of a block past its last
//!   mapped cell, the end cell it shares with the next block included, in
//!   handles of up to `cachalot_extent_mb` from there, as far as its budget
//!   leaves room: the next block, laid out after it, finds that cell
//!   mapped, where a page of its own was one more handle. First passes:
//!   vit_train_bf16 548 driver calls instead of 1,102, gpt2_train 654
//!   instead of 1,240, resnet50 406 instead of 678, llama_train_bf16 314
//!   instead of 476 (at 1.0399 its peak requested, was 1.0440), GPT-2
//!   generation 228 instead of 334; every other ratio unchanged.
//! * A cached handle of one page re-mapped within its pool *moves* (`aliases`):
//!   it is mapped at its new cell and stays mapped at the old one, an alias
//!   no block may use, unmapped only when another handle must go there (or
//!   the handle goes back to the device). A re-map then costs one call, not
//!   two (no unmap, so no wait for the stream either), and a block that comes
//!   back to an alias whose handle is cached takes it back with none. The
//!   first pass of bert_dynamic made 2,347 driver calls instead of 4,698
//!   (2,445 with the frontier rule).
//! * `pages` is the device side all streams share: handle and segment creation
//!   counted against the memory fraction (one atomic, slow paths only).
//! * Without virtual memory a pool's regions are device segments (2 MiB for the
//!   small pool, the request rounded up to 2 MiB for the large one), placed by
//!   best fit with merging; idle segments go back on `empty_cache`, on OOM, and
//!   before a new segment would take reserved bytes 5% past the peak of active
//!   bytes.
//!
//! # Why it fragments less
//!
//! Physical pages are interchangeable, so only pages under live blocks need to be
//! backed: a free hole in the virtual range costs nothing once its pages are
//! re-mapped elsewhere. Placement (`pool`) is *mapping-aware best fit*: the
//! smallest free block whose pages are already mapped; failing that, the
//! lowest window needing the fewest new pages (the lowest, so a stream whose
//! layout keeps changing re-uses the holes below its pages instead of
//! creeping up its range). When a page must be mapped, the stream takes a
//! cached page of its own (moved, or unmapped and mapped) instead of creating
//! one once its mapped pages reach `1 + cachalot_reuse_slack` (default 1.2)
//! times the most pages it ever had in use, or that many times its peak of
//! allocated bytes. So reserved memory follows the peak of pages *touched by
//! live blocks* (plus the slack), not the peak of a fragmented address range,
//! and a workload replayed pass after pass settles on mapped pages and makes
//! no driver calls. The default is loose enough that no bundled recording,
//! repeated, re-maps at all: each makes no driver call from its second pass,
//! holding 1.0179 (resnet50), 1.0200 (vit), 1.0367 (gpt2), 1.1717
//! (bert_dynamic, varying shapes), 1.1051 (llama_train_bf16) and 1.0887
//! (llama_serve) times its peak requested bytes, against 1.0205, 1.0206,
//! 1.0369, 1.1781, 1.1071 and 1.1032 for PyTorch's expandable segments
//! (tests/cachalot_traces.rs, cachalot-cli's tests/passes.rs). A tight budget
//! (`cachalot_reuse_slack:0.035`) re-maps within a pass and holds a single
//! pass to 1.0480 (bert_dynamic) and llama_train_bf16 to 1.0399 for good, but
//! a workload whose layout never repeats then never stops calling the driver
//! (llama_serve: 50 to 200 calls a pass, at 1.1177), and bert_dynamic repeated
//! holds 1.1974 (it churns, below). At a new peak of pages in use (which
//! sets the peak reserved), the other pool's idle pages go back before new
//! ones are mapped, where they are at least 2% of that peak: GPT-2 generation
//! (whose small pool idles 27 MiB when its longest prompt peaks) reserves
//! 1.043 times its peak requested instead of 1.092 (expandable segments:
//! 1.102).
//!
//! Under the tight budget, a workload whose layout never repeats
//! (bert_dynamic: a new shape at every step) would re-map pages forever: 1,788 driver calls per
//! pass of 16,800 operations, each pass after the first. A stream that has
//! re-mapped twice as many pages as it holds, over at least 8 allocations per
//! page and at least one page per 1000 allocations, without its peak of pages
//! in use growing is *churning*, and its budget rises by `cachalot_churn_slack`
//! (default 0.15: to 1.185 times that peak) until the stream gives its large
//! pages back on `empty_cache` (`budget`, `stream`), and no longer moves pages
//! back to their aliases (which kept its layout from settling). The budget is never under the peak plus
//! `cachalot_reuse_min_mb` (default 32 MiB: 16 pages), so a small heap (where
//! 3.5% is less than a large block) does not re-map at every step: the GPU
//! benchmark's threaded pattern (32 live blocks of 512 B to 20 MiB per thread)
//! makes 6 driver calls per 100,000 operations instead of 58. Under the tight
//! budget, repeated passes of bert_dynamic make 2,445 and 724 driver calls,
//! then none, and reserve 1.1974 times the peak requested bytes; a single
//! pass, and every training trace, never reaches the trigger.
//!
//! # The hot path
//!
//! When no near fit is fully mapped, placement looks through every free block,
//! at page-aligned windows inside it too, for the one needing the fewest new
//! pages: before the churn rule, a second pass of bert_dynamic made 1,788 driver
//! calls with it instead of 3,482 (tests/cachalot_traces.rs).
//!
//! `malloc`: find the stream's entry (a lock-free scan of a fixed table), lock
//! the stream; a small request of a size freed before pops its reuse list
//! (a large one too, in a churning stream); otherwise one size-class lookup
//! whose best fit is almost always fully mapped (a bit test), bump the users
//! of its cells (the two end cells one by one, the others a run of bits),
//! split, update statistics in `ledger` (its `tally` counts three families,
//! four numbers each, and derives the active ones while nothing waits for
//! another stream). `free`: find the stream by address (ranges
//! published per stream in atomics), lock it, one address-index removal (a
//! hash map, or the large pool's table), then keep the block for reuse (small,
//! or large in a churning stream) or merge it with free neighbours. No backend
//! call unless a page must be mapped, a segment allocated or an event recorded.
//!
//! # Locking
//!
//! One mutex per stream guards its pools, statistics and pending frees; threads
//! on different streams never share a lock on the hot path. Shared state is the
//! stream table (written once per new stream) and the page counter in
//! `pages`; with several streams, each operation also takes a stamp
//! (`stamp`: a read of the machine's clock, or, while one thread keeps the
//! device to itself, its last stamp plus one; no memory written), a
//! merge now and then locks every stream at once for a moment, and threads
//! of the allocator's own (`settler`, the first started with the first merge)
//! work out the device's peaks from what the merge took. Each stream's lock and state sit
//! on cache lines of their own, apart from the stream ids and ranges other
//! threads read (no false sharing). A free
//! from another thread locks the owning stream. Out of memory
//! drops the stream's lock, flushes every stream's cache one lock at a time, and
//! retries once before reporting [`Error::OutOfMemory`]. `validate` and the merges
//! (under the merge state's lock, which holds off new streams) lock them all in
//! table order; nothing else holds two.
//!
//! # Statistics and events
//!
//! PyTorch's meanings, per stream, changed only in `ledger`: reserved bytes
//! are mapped pages plus segment bytes; a `segment` is a contiguous run of mapped
//! pages (as PyTorch's snapshot reports expandable segments) or a device segment;
//! inactive splits are counted only without virtual memory, as PyTorch does for
//! expandable segments. [`DeviceAllocator::stats`] is the device's figures at
//! one moment, peaks included, with any number of streams and threads: from
//! the second stream on, each stream also journals its changes, stamped in
//! an order they could have happened in (`stamp`), in chunks that note their highest values (`journal`); a
//! merge takes every journal at one moment and raises the device's peaks,
//! replaying changes one by one in time order only where the chunks' highest
//! values add up to more than the peaks (`merge`). The streams' currents,
//! totals and counters add up. Events: `alloc`,
//! `free_requested`, `free_completed`, `segment_map`/`segment_unmap` (one per
//! page) or `segment_alloc`/`segment_free`, and `oom`.
//!
//! # Configuration
//!
//! `cachalot_reuse_slack` (default 0.2), `cachalot_churn_slack` (default 0.15;
//! 0 keeps the tight budget for churning streams too), `cachalot_reuse_min_mb`
//! (default 32), `cachalot_extent_mb` (default 64; 2 maps page by page) and
//! `cachalot_release_threshold_mb` (default unlimited: cached pages stay mapped
//! until `empty_cache` or OOM),
//! plus `per_process_memory_fraction`, through [`AllocatorConfig`]'s parser.

mod budget;
mod directory;
mod heap;
mod malloc;
mod peaks;
mod pool;
mod private;
mod settings;
mod stats;
mod stream;
mod streams;
mod validate;
mod vm;

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::backend::{Backend, DevicePtr, StreamId};
use crate::backing::Backing;
use crate::config::{AllocatorConfig, PlacementSettings, PolicyKind};
use crate::device_allocator::{DeviceAllocator, PrivatePools, Tags};
use crate::error::{Error, InvariantViolation, Result};
use crate::event::Observer;
use crate::snapshot::MemorySnapshot;
use crate::stats::MemoryStats;

use crate::private_pool::{
    PoolAllocation, PoolBook, PoolId, PoolOptions, RouteFilter, SegmentSource,
};
use crate::sleep::{Backup, SleepError, SleepReport, TagState, WhenBusy};
use directory::{Directory, StreamEntry};
use settings::StreamConfig;
use stats::levels::Levels;
use stats::merge::DeviceJournal;
use vm::pages::Pages;

/// The `cachalot` policy's allocator for one device. See the module docs.
pub struct CachalotAllocator {
    config: AllocatorConfig,
    backend: Arc<dyn Backend>,
    pages: Pages,
    streams: Directory,
    journal: DeviceJournal,
    observer: Mutex<Option<Arc<dyn Observer>>>,
    stream_config: StreamConfig,
    start: Instant,
    book: Mutex<PoolBook>,
    /// Whether a lane of a pool with an allocator of its own was made: its
    /// segments lie in no stream's range, so a free may have to ask each.
    sourced_lanes: AtomicBool,
}

impl fmt::Debug for CachalotAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachalotAllocator")
            .field("config", &self.config.source)
            .field("pages", &self.pages)
            .finish()
    }
}

impl CachalotAllocator {
    /// An allocator drawing from `backend`: pages and virtual ranges where the
    /// backend has virtual memory, device segments otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a memory fraction outside `[0, 1]`.
    pub fn new(backend: Arc<dyn Backend>, config: AllocatorConfig) -> Result<Self> {
        let stream_config = StreamConfig::new(&config, backend.capabilities());
        let allocator = CachalotAllocator {
            pages: Pages::new(backend.clone()),
            backend,
            streams: Directory::default(),
            journal: DeviceJournal::new(),
            observer: Mutex::new(None),
            stream_config,
            start: Instant::now(),
            book: Mutex::new(PoolBook::default()),
            sourced_lanes: AtomicBool::new(false),
            config,
        };
        allocator
            .pages
            .set_capture_reuse(allocator.config.graph_capture_record_stream_reuse);
        allocator.set_memory_fraction(allocator.config.per_process_memory_fraction)?;
        Ok(allocator)
    }
}

impl DeviceAllocator for CachalotAllocator {
    fn policy(&self) -> PolicyKind {
        PolicyKind::Cachalot
    }

    fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Of PyTorch's run-time settings the cachalot policy follows one:
    /// `graph_capture_record_stream_reuse` (it has no placement rules).
    fn set_placement_settings(&self, settings: &PlacementSettings) {
        self.pages
            .set_capture_reuse(settings.graph_capture_record_stream_reuse);
    }

    fn malloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr> {
        self.allocate(size, stream)
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        self.with_owner(ptr, |st| st.free(&self.pages, ptr))
    }

    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        self.with_owner(ptr, |st| st.record_stream(ptr, stream))
    }

    fn empty_cache(&self) -> Result<()> {
        self.flush_all()
    }

    fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::InvalidArgument(format!(
                "memory fraction {fraction} is outside [0, 1]"
            )));
        }
        let total = self.backend.capabilities().total_memory;
        self.pages
            .set_limit((fraction < 1.0).then_some((fraction * total as f64).round() as u64));
        Ok(())
    }

    fn stats(&self) -> MemoryStats {
        let mut all = MemoryStats::new(self.config.max_split_size);
        let merged = self.merge(|st| all.add(&st.ledger.stats()));
        // The streams' currents and counters add up; their peaks do not
        // (`journal`).
        if let Some(m) = merged.as_ref() {
            m.peaks().write_peaks(&mut all);
        }
        all
    }

    fn reset_peak_stats(&self) {
        let mut now = Levels::default();
        let mut merged = self.merge(|st| now = now.plus(&st.ledger.levels()));
        match merged.as_mut() {
            Some(m) => m.reset_peak(now),
            // One stream: its peaks are the device's (with several, each
            // stream's are its journal's open chunk's).
            None => self
                .streams
                .iter()
                .for_each(|e| e.lock().ledger.reset_peak()),
        }
    }

    fn reset_accumulated_stats(&self) {
        let _merged = self.journal.lock();
        for entry in self.streams.iter() {
            entry.lock().ledger.reset_accumulated();
        }
    }

    fn snapshot(&self) -> MemorySnapshot {
        let device = self.backend.capabilities().device;
        let book = self.book();
        let mut segments: Vec<_> = self
            .streams
            .iter()
            .flat_map(|e| {
                let st = e.lock();
                let pool_id = book.id_of(st.slot());
                let mut segments = st.snapshot(device);
                segments.iter_mut().for_each(|s| s.pool_id = pool_id);
                segments
            })
            .collect();
        segments.sort_by_key(|s| s.address);
        MemorySnapshot { segments }
    }

    fn backing(&self, ptr: DevicePtr) -> Result<Backing> {
        self.with_owner(ptr, |st| st.backing(ptr))
    }

    fn validate(&self) -> std::result::Result<(), InvariantViolation> {
        // No new stream, and every stream locked at once (in table order; nothing
        // else holds two), so no page is between its creation and its mapping.
        // The pool book before any stream's lock (the lock order).
        let pools: std::collections::HashSet<u32> =
            self.book().iter().map(|(_, r)| r.slot).collect();
        let mut merged = self.journal.wait_idle(self.journal.lock());
        let _frozen = self.streams.freeze();
        let mut locked: Vec<_> = self.streams.iter().map(StreamEntry::lock).collect();
        let mut reserved = 0;
        let mut now = Levels::default();
        for st in &mut locked {
            let (stream, pool) = (st.stream(), st.slot());
            st.validate()
                .map_err(|e| InvariantViolation(format!("{stream}: {e}")))?;
            crate::error::ensure_invariant!(
                pool == 0 || pools.contains(&pool) || st.reserved() == 0,
                "{stream}: a lane of forgotten private pool slot {pool} holds memory"
            );
            reserved += st.reserved();
            now = now.plus(&st.ledger.levels());
        }
        if let Some(m) = merged.as_mut() {
            // Every run taken is settled, whatever is found (a cut left in
            // flight would hold off every reader).
            let (mut cut, mut found) = (m.begin(), Ok(()));
            for st in &mut locked {
                let stream = st.stream();
                if let Some(run) = st.ledger.take_run(m.spare()) {
                    if found.is_ok() {
                        found = run
                            .validate()
                            .map_err(|e| InvariantViolation(format!("{stream}: {e}")));
                    }
                    cut.add(run);
                }
            }
            cut.settle();
            m.finish(cut);
            found?;
            m.validate(&now)?;
        }
        let held = self.pages.held_in_use();
        crate::error::ensure_invariant!(
            reserved == held,
            "streams reserve {reserved} bytes but {held} are held from the device (orphans aside)"
        );
        Ok(())
    }

    fn set_observer(&self, observer: Option<Arc<dyn Observer>>) {
        let mut current = self.observer.lock().unwrap_or_else(|e| e.into_inner());
        for entry in self.streams.iter() {
            entry.lock().ledger.set_observer(observer.clone());
        }
        *current = observer;
    }
}

impl PrivatePools for CachalotAllocator {
    fn create_pool(&self, id: PoolId) -> Result<()> {
        self.book().create_or_incref(id).map(|_| ())
    }

    fn set_pool_options(&self, id: PoolId, options: PoolOptions) -> Result<()> {
        self.book().set_options(id, options)
    }

    fn pool_options(&self, id: PoolId) -> Result<PoolOptions> {
        Ok(self.book().require(id)?.options)
    }

    fn begin_allocate_to_pool(&self, id: PoolId, filter: RouteFilter) -> Result<()> {
        let mut book = self.book();
        book.create_or_incref(id)?;
        book.push_route(id, filter)?;
        self.pages.set_quiet(true);
        Ok(())
    }

    fn end_allocate_to_pool(&self, id: PoolId) -> Result<()> {
        let mut book = self.book();
        book.end_route(id)?;
        self.pages.set_quiet(book.routing());
        Ok(())
    }

    fn release_pool(&self, id: PoolId) -> Result<()> {
        self.book().release(id).map(|_| ())
    }

    fn pool_use_count(&self, id: PoolId) -> u32 {
        self.book().use_count(id)
    }

    fn empty_pool_cache(&self, id: PoolId) -> Result<()> {
        self.empty_private_pool(id)
    }

    fn pool_allocations(&self, id: PoolId) -> Result<Vec<PoolAllocation>> {
        self.private_allocations(id)
    }

    fn restore_pool(&self, id: PoolId, live: &[PoolAllocation]) -> Result<Vec<DevicePtr>> {
        self.restore_private_pool(id, live)
    }

    /// The pool's lanes carve their blocks from segments of `source`, as
    /// the policy does without virtual memory (set before the pool's first
    /// allocation; lanes made before keep what they had).
    fn set_pool_source(&self, id: PoolId, source: Arc<dyn SegmentSource>) -> Result<()> {
        self.book().set_source(id, source)
    }
}

/// Tags are the pytorch policy's: each call says which setting enables them.
impl Tags for CachalotAllocator {
    fn make_tag(&self, _id: PoolId, _backup: Backup) -> Result<()> {
        Err(no_tags())
    }

    fn pause_tag(&self, _id: PoolId, _when_busy: WhenBusy) -> Result<SleepReport> {
        Err(no_tags())
    }

    fn resume_tag(&self, _id: PoolId) -> Result<SleepReport> {
        Err(no_tags())
    }

    fn tag_state(&self, _id: PoolId) -> Result<TagState> {
        Err(no_tags())
    }
}

fn no_tags() -> Error {
    SleepError::Unsupported {
        policy: PolicyKind::Cachalot,
    }
    .into()
}

impl Drop for CachalotAllocator {
    fn drop(&mut self) {
        // Best effort: live allocations keep their memory; the rest goes back.
        let _ = self.flush_all();
    }
}
