//! Tags on the simulated device under the pytorch policy: pause and resume at
//! the same addresses, with and without a host backup; the statistics, events
//! and snapshots in between; every bad call a typed error with nothing
//! changed; device failures part-way; and a seeded randomized run against a
//! simple model with `validate()` after every step.

use std::collections::BTreeMap;
use std::sync::Arc;

use cachalot::backend::faults::Fault;
use cachalot::backend::host::{ToDevice, ToHost};
use cachalot::backend::sim::SimBackend;
use cachalot::backend::{Backend, CallKind};
use cachalot::event::Action;
use cachalot::history::{History, HistoryConfig};
use cachalot::private_pool::{PoolId, SegmentSource};
use cachalot::sleep::{Backup, SleepError, WhenBusy};
use cachalot::{AllocatorConfig, DeviceAllocator, Error, StreamId};

use cachalot_testkit::device::TestDevice;
use cachalot_testkit::splitmix::SplitMix;

const MIB: u64 = 1 << 20;
const TAG: PoolId = PoolId(0, 7);
const OTHER: PoolId = PoolId(0, 8);
const S0: StreamId = StreamId::DEFAULT;

fn setup(capacity: u64) -> (TestDevice, Arc<dyn DeviceAllocator>) {
    let dev = TestDevice::new(SimBackend::new(capacity));
    let config = AllocatorConfig::parse("").unwrap();
    let alloc = cachalot::allocator::create(dev.backend(), config).unwrap();
    (dev, alloc)
}

fn valid(a: &dyn DeviceAllocator) {
    if let Err(e) = a.validate() {
        panic!("{e}");
    }
}

/// A tag with `backup` made of a new pool.
fn tag(a: &dyn DeviceAllocator, id: PoolId, backup: Backup) {
    a.create_pool(id).unwrap();
    a.make_tag(id, backup).unwrap();
}

/// `size` bytes allocated in pool `id` (a route opened and closed around).
fn alloc_in(a: &dyn DeviceAllocator, id: PoolId, size: u64) -> Result<u64, Error> {
    a.begin_allocate_to_pool(id, Arc::new(|_| true)).unwrap();
    let got = a.malloc(size, S0);
    a.end_allocate_to_pool(id).unwrap();
    a.release_pool(id).unwrap();
    got
}

/// Bytes that tell allocations (and seeds) apart.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed as usize * 31 + i * 7) as u8 | 1)
        .collect()
}

fn write(b: &dyn Backend, ptr: u64, bytes: &[u8]) {
    b.upload(&[ToDevice {
        src: bytes,
        dst: ptr,
    }])
    .unwrap();
}

fn read(b: &dyn Backend, ptr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    b.download(&mut [ToHost {
        src: ptr,
        dst: &mut out,
    }])
    .unwrap();
    out
}

/// `TAG` made a tag with a host backup, holding three 30 MiB allocations
/// each written with a pattern of its own; their addresses.
fn patterned_tag(a: &dyn DeviceAllocator) -> Vec<u64> {
    tag(a, TAG, Backup::Host);
    let ptrs: Vec<u64> = (0..3)
        .map(|_| alloc_in(a, TAG, 30 * MIB).unwrap())
        .collect();
    for (i, p) in ptrs.iter().enumerate() {
        write(a.backend().as_ref(), *p, &pattern(i as u64, 1000));
    }
    ptrs
}

/// Each of `ptrs` holds the pattern [`patterned_tag`] wrote.
fn assert_patterns(b: &dyn Backend, ptrs: &[u64]) {
    for (i, p) in ptrs.iter().enumerate() {
        assert_eq!(read(b, *p, 1000), pattern(i as u64, 1000));
    }
}

fn sleep_error(e: Error) -> SleepError {
    match e {
        Error::Sleep(s) => s,
        other => panic!("not a sleep error: {other}"),
    }
}

#[test]
fn a_paused_tag_gives_its_pages_back_and_resumes_at_the_same_addresses() {
    let (dev, a) = setup(1 << 30);
    let history = Arc::new(History::new(HistoryConfig::default()));
    a.set_observer(Some(history.clone()));
    tag(a.as_ref(), TAG, Backup::Host);
    let sizes = [1000, 300 * 1024, 5 * MIB, 30 * MIB];
    let ptrs: Vec<u64> = sizes
        .iter()
        .map(|s| alloc_in(a.as_ref(), TAG, *s).unwrap())
        .collect();
    let outside = a.malloc(7 * MIB, S0).unwrap();
    let backend = a.backend().clone();
    for (i, (p, s)) in ptrs.iter().zip(sizes).enumerate() {
        write(backend.as_ref(), *p, &pattern(i as u64, s as usize));
    }
    valid(a.as_ref());
    let before = a.stats();
    let used = dev.sim.counters().used;
    let state = a.tag_state(TAG).unwrap();
    assert_eq!((state.paused, state.paused_bytes), (false, 0));

    let report = a.pause_tag(TAG, WhenBusy::Synchronize).unwrap();
    valid(a.as_ref());
    assert_eq!(report.bytes, state.bytes);
    assert_eq!(report.segments, state.segments);
    assert_eq!(
        report.copied,
        a.pool_allocations(TAG)
            .unwrap()
            .iter()
            .map(|x| x.size)
            .sum::<u64>()
    );
    let s = a.stats();
    assert_eq!(s.memory_reserved(), before.memory_reserved() - state.bytes);
    assert_eq!(s.paused_bytes.current as u64, state.bytes);
    assert_eq!(
        s.memory_allocated(),
        before.memory_allocated(),
        "blocks unchanged"
    );
    assert_eq!(
        dev.sim.counters().used,
        used - state.bytes,
        "pages back to the device"
    );
    let shown: u64 = a.snapshot().segments.iter().map(|s| s.total_size).sum();
    assert_eq!(
        shown,
        s.memory_reserved(),
        "paused segments are not in snapshots"
    );
    let paused = a.tag_state(TAG).unwrap();
    assert!(paused.paused);
    assert_eq!(paused.paused_bytes, state.bytes);
    assert!(paused.host_bytes >= report.copied);
    let mut scratch = vec![0u8; 8];
    let mut unmapped = [ToHost {
        src: ptrs[3],
        dst: &mut scratch,
    }];
    assert!(
        backend.download(&mut unmapped).is_err(),
        "nothing mapped there"
    );
    let refused = alloc_in(a.as_ref(), TAG, 4096).unwrap_err();
    assert!(matches!(
        sleep_error(refused),
        SleepError::Paused {
            pool: TAG,
            requested: 4096
        }
    ));
    a.free(a.malloc(MIB, S0).unwrap()).unwrap();

    let back = a.resume_tag(TAG).unwrap();
    valid(a.as_ref());
    assert_eq!(
        (back.segments, back.bytes, back.copied),
        (report.segments, report.bytes, report.copied)
    );
    assert_eq!(
        a.stats().memory_reserved(),
        before.memory_reserved() + MIB * 2
    );
    assert_eq!(a.stats().paused_bytes.current, 0);
    for (i, (p, s)) in ptrs.iter().zip(sizes).enumerate() {
        assert_eq!(
            read(backend.as_ref(), *p, s as usize),
            pattern(i as u64, s as usize),
            "allocation {i}"
        );
    }
    let live: Vec<u64> = a
        .pool_allocations(TAG)
        .unwrap()
        .iter()
        .map(|x| x.ptr)
        .collect();
    let mut want = ptrs.clone();
    want.sort_unstable();
    assert_eq!(live, want, "the same addresses");
    let actions: Vec<Action> = history.events().iter().map(|r| r.event.action).collect();
    let count = |x| actions.iter().filter(|a| **a == x).count();
    assert_eq!(count(Action::SegmentPause), report.segments);
    assert_eq!(count(Action::SegmentResume), report.segments);
    for p in ptrs {
        a.free(p).unwrap();
    }
    a.free(outside).unwrap();
    a.release_pool(TAG).unwrap();
    a.empty_cache().unwrap();
    valid(a.as_ref());
    assert_eq!(dev.sim.live_objects(), 0, "every page and range given back");
}

#[test]
fn without_a_backup_the_bytes_are_gone_and_no_host_memory_is_kept() {
    let (dev, a) = setup(1 << 30);
    tag(a.as_ref(), TAG, Backup::None);
    let p = alloc_in(a.as_ref(), TAG, 3 * MIB).unwrap();
    let backend = a.backend().clone();
    write(backend.as_ref(), p, &pattern(1, 3 * MIB as usize));
    let report = a.pause_tag(TAG, WhenBusy::Synchronize).unwrap();
    assert_eq!(report.copied, 0);
    assert_eq!(dev.calls.counts().count(CallKind::AllocateHost), 0);
    a.resume_tag(TAG).unwrap();
    assert!(read(backend.as_ref(), p, 3 * MIB as usize)
        .iter()
        .all(|b| *b == 0));
    assert_eq!(a.tag_state(TAG).unwrap().host_bytes, 0);
    valid(a.as_ref());
}

#[test]
fn host_memory_is_kept_and_reused_from_one_pause_to_the_next() {
    let (dev, a) = setup(1 << 30);
    tag(a.as_ref(), TAG, Backup::Host);
    for _ in 0..4 {
        alloc_in(a.as_ref(), TAG, 25 * MIB).unwrap();
    }
    // The test's own copies go to the device, past the counter.
    let backend = dev.sim.clone();
    for round in 0..3u64 {
        for (i, x) in a.pool_allocations(TAG).unwrap().iter().enumerate() {
            write(
                backend.as_ref(),
                x.ptr,
                &pattern(round * 10 + i as u64, 4096),
            );
        }
        a.pause_tag(TAG, WhenBusy::Synchronize).unwrap();
        a.resume_tag(TAG).unwrap();
        for (i, x) in a.pool_allocations(TAG).unwrap().iter().enumerate() {
            assert_eq!(
                read(backend.as_ref(), x.ptr, 4096),
                pattern(round * 10 + i as u64, 4096)
            );
        }
        valid(a.as_ref());
    }
    let made = dev.calls.counts().count(CallKind::AllocateHost);
    assert_eq!(
        made, 4,
        "one host buffer per segment, made at the first pause only"
    );
    assert_eq!(
        dev.calls.counts().count(CallKind::Download),
        3,
        "one batch per pause"
    );
    assert_eq!(
        dev.calls.counts().count(CallKind::Upload),
        3,
        "one batch per resume"
    );
}

#[test]
fn a_pause_gives_the_tags_free_cached_segments_back_for_good() {
    let (dev, a) = setup(1 << 30);
    tag(a.as_ref(), TAG, Backup::Host);
    let kept = alloc_in(a.as_ref(), TAG, 30 * MIB).unwrap();
    let dropped = alloc_in(a.as_ref(), TAG, 40 * MIB).unwrap();
    a.free(dropped).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        a.tag_state(TAG).unwrap().segments,
        2,
        "a tag in use keeps its cache"
    );
    let report = a.pause_tag(TAG, WhenBusy::Synchronize).unwrap();
    assert_eq!(report.released, 40 * MIB);
    assert_eq!((report.segments, report.bytes), (1, 30 * MIB));
    assert_eq!(dev.sim.counters().used, 0);
    a.free(kept).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        a.tag_state(TAG).unwrap().segments,
        1,
        "a paused segment stays until resumed"
    );
    valid(a.as_ref());
    a.resume_tag(TAG).unwrap();
    a.release_pool(TAG).unwrap();
    a.empty_cache().unwrap();
    valid(a.as_ref());
    assert_eq!(dev.sim.live_objects(), 0);
}

#[test]
fn a_graph_captured_into_a_tag_keeps_its_free_blocks_across_a_pause() {
    // The graph's intermediates are freed during the capture, but the graph
    // writes there at every replay: a pause that gave their segment back for
    // good left the replay after the resume on unmapped memory (an illegal
    // address on an H200). Its pages go and come back as the others do.
    let (dev, a) = setup(1 << 30);
    let sim = dev.sim.clone();
    let graph = StreamId(21);
    tag(a.as_ref(), TAG, Backup::None);
    a.begin_allocate_to_pool(TAG, Arc::new(move |s| s == graph))
        .unwrap();
    assert!(sim.begin_capture(graph));
    let temp = a.malloc(24 * MIB, graph).unwrap();
    let out = a.malloc(24 * MIB, graph).unwrap();
    a.free(temp).unwrap();
    sim.end_capture();
    a.end_allocate_to_pool(TAG).unwrap();
    a.release_pool(TAG).unwrap();
    a.empty_cache().unwrap();
    let segments = a.tag_state(TAG).unwrap().segments;
    assert_eq!(segments, 2, "the graph's pool keeps its free segment");
    let report = a.pause_tag(TAG, WhenBusy::Synchronize).unwrap();
    assert_eq!(report.released, 0, "nothing given back for good");
    assert_eq!((report.segments, report.bytes), (2, 48 * MIB));
    assert_eq!(dev.sim.counters().used, 0, "every page went");
    valid(a.as_ref());
    let back = a.resume_tag(TAG).unwrap();
    assert_eq!((back.segments, back.bytes), (2, 48 * MIB));
    write(dev.backend().as_ref(), temp, &pattern(3, 4096));
    assert_eq!(read(dev.backend().as_ref(), temp, 4096), pattern(3, 4096));
    valid(a.as_ref());
    a.free(out).unwrap();
    a.release_pool(TAG).unwrap();
    a.empty_cache().unwrap();
    valid(a.as_ref());
    assert_eq!(dev.sim.live_objects(), 0);
}

#[test]
fn bad_calls_are_typed_errors_that_change_nothing() {
    let (dev, a) = setup(1 << 30);
    let a = a.as_ref();
    tag(a, TAG, Backup::Host);
    let p = alloc_in(a, TAG, 5 * MIB).unwrap();
    let check = |e: Error, want: fn(&SleepError) -> bool| {
        let s = sleep_error(e);
        assert!(want(&s), "{s:?}");
        valid(a);
        s.to_string()
    };
    let said = check(a.resume_tag(TAG).unwrap_err(), |e| {
        matches!(e, SleepError::NotPaused { .. })
    });
    assert!(said.contains("nothing to resume"), "{said}");
    a.create_pool(OTHER).unwrap();
    for e in [
        a.pause_tag(OTHER, WhenBusy::Synchronize).unwrap_err(),
        a.resume_tag(OTHER).unwrap_err(),
        a.tag_state(OTHER).unwrap_err(),
    ] {
        check(e, |e| matches!(e, SleepError::NotATag { pool: OTHER }));
    }
    assert!(matches!(
        a.pause_tag(PoolId(5, 5), WhenBusy::Synchronize),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        a.make_tag(PoolId::DEFAULT, Backup::None),
        Err(Error::InvalidArgument(_))
    ));
    a.make_tag(TAG, Backup::Host).unwrap();
    check(a.make_tag(TAG, Backup::None).unwrap_err(), |e| {
        matches!(
            e,
            SleepError::OtherBackup {
                kept: Backup::Host,
                asked: Backup::None,
                ..
            }
        )
    });
    let q = alloc_in(a, OTHER, MIB).unwrap();
    check(a.make_tag(OTHER, Backup::None).unwrap_err(), |e| {
        matches!(e, SleepError::HoldsMemory { segments: 1, .. })
    });
    let own = PoolId(0, 9);
    a.create_pool(own).unwrap();
    a.set_pool_source(own, Arc::new(Nothing)).unwrap();
    check(a.make_tag(own, Backup::None).unwrap_err(), |e| {
        matches!(e, SleepError::OwnAllocator { .. })
    });
    assert!(matches!(
        a.set_pool_source(TAG, Arc::new(Nothing)),
        Err(Error::InvalidArgument(_))
    ));

    a.begin_allocate_to_pool(TAG, Arc::new(|_| true)).unwrap();
    check(a.pause_tag(TAG, WhenBusy::Synchronize).unwrap_err(), |e| {
        matches!(e, SleepError::RouteOpen { .. })
    });
    a.end_allocate_to_pool(TAG).unwrap();
    a.release_pool(TAG).unwrap();

    // In manual mode the simulated streams' work finishes only when the test
    // says so: a pause that may not wait is refused until then.
    dev.sim.set_manual_events(true);
    let busy = StreamId(5);
    a.record_stream(p, busy).unwrap();
    let e = dev.sim.create_event().unwrap();
    dev.sim.record_event(e, busy).unwrap();
    let said = check(a.pause_tag(TAG, WhenBusy::Refuse).unwrap_err(), |e| {
        matches!(e, SleepError::Busy { pool: TAG, .. })
    });
    assert!(said.contains("synchronize"), "{said}");
    assert!(!a.tag_state(TAG).unwrap().paused);
    dev.sim.set_manual_events(false);
    a.pause_tag(TAG, WhenBusy::Refuse).unwrap();
    check(a.pause_tag(TAG, WhenBusy::Synchronize).unwrap_err(), |e| {
        matches!(e, SleepError::AlreadyPaused { .. })
    });
    a.resume_tag(TAG).unwrap();
    dev.sim.set_manual_events(true);
    a.free(p).unwrap();
    check(a.pause_tag(TAG, WhenBusy::Refuse).unwrap_err(), |e| {
        matches!(e, SleepError::Busy { stream: S0, .. })
    });
    dev.sim.record_event(e, busy).unwrap();
    a.pause_tag(TAG, WhenBusy::Synchronize).unwrap();
    assert!(
        dev.sim.query_event(e).unwrap(),
        "the pause waited for the device"
    );
    a.resume_tag(TAG).unwrap();
    dev.sim.set_manual_events(false);
    a.free(q).unwrap();
    valid(a);
}

/// A pool's own allocator that has nothing to give.
#[derive(Debug)]
struct Nothing;

impl SegmentSource for Nothing {
    fn allocate(&self, size: u64) -> cachalot::backend::BackendResult<u64> {
        Err(cachalot::backend::BackendError::OutOfMemory {
            call: CallKind::SegmentAlloc,
            requested: size,
        })
    }
    fn free(&self, _: u64, _: u64) -> cachalot::backend::BackendResult<()> {
        Ok(())
    }
}

#[test]
fn the_cachalot_policy_and_a_device_without_virtual_memory_say_what_to_do() {
    let config = AllocatorConfig::parse("policy:cachalot").unwrap();
    let a = cachalot::allocator::create(Arc::new(SimBackend::new(1 << 30)), config).unwrap();
    a.create_pool(TAG).unwrap();
    let said = sleep_error(a.make_tag(TAG, Backup::None).unwrap_err()).to_string();
    assert!(said.contains("policy:pytorch"), "{said}");
    for e in [
        a.pause_tag(TAG, WhenBusy::Synchronize).unwrap_err(),
        a.resume_tag(TAG).unwrap_err(),
        a.tag_state(TAG).unwrap_err(),
    ] {
        assert!(matches!(sleep_error(e), SleepError::Unsupported { .. }));
    }
    let plain = SimBackend::with_options(1 << 30, false);
    let a =
        cachalot::allocator::create(Arc::new(plain), AllocatorConfig::parse("").unwrap()).unwrap();
    a.create_pool(TAG).unwrap();
    let e = sleep_error(a.make_tag(TAG, Backup::None).unwrap_err());
    assert_eq!(e, SleepError::NoVirtualMemory);
}

#[test]
fn a_resume_makes_room_by_emptying_the_cache() {
    let (dev, a) = setup(1 << 30);
    tag(a.as_ref(), TAG, Backup::Host);
    let p = alloc_in(a.as_ref(), TAG, 40 * MIB).unwrap();
    a.pause_tag(TAG, WhenBusy::Synchronize).unwrap();
    dev.limit.set(Some(64 * MIB));
    a.free(a.malloc(60 * MIB, S0).unwrap()).unwrap();
    assert_eq!(
        a.stats().memory_reserved(),
        60 * MIB,
        "cached by the default pools"
    );
    a.resume_tag(TAG).unwrap();
    assert_eq!(a.stats().memory_reserved(), 40 * MIB);
    valid(a.as_ref());
    a.free(p).unwrap();
}

#[test]
fn a_resume_out_of_memory_stops_part_way_and_resumes_later() {
    let (dev, a) = setup(1 << 30);
    let backend = a.backend().clone();
    let ptrs = patterned_tag(a.as_ref());
    a.pause_tag(TAG, WhenBusy::Synchronize).unwrap();
    dev.limit.set(Some(100 * MIB));
    let blocker = a.malloc(50 * MIB, S0).unwrap();
    let e = sleep_error(a.resume_tag(TAG).unwrap_err());
    assert!(
        matches!(
            e,
            SleepError::Partial {
                what: "resume",
                done: 1,
                left: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("free memory"), "{e}");
    valid(a.as_ref());
    let state = a.tag_state(TAG).unwrap();
    assert!(state.paused);
    assert_eq!(state.paused_bytes, 60 * MIB);
    assert_eq!(a.stats().paused_bytes.current as u64, 60 * MIB);
    assert!(matches!(
        sleep_error(alloc_in(a.as_ref(), TAG, 1).unwrap_err()),
        SleepError::Paused { .. }
    ));
    a.free(blocker).unwrap();
    a.resume_tag(TAG).unwrap();
    valid(a.as_ref());
    assert_patterns(backend.as_ref(), &ptrs);
}

#[test]
fn device_failures_during_a_pause_leave_the_books_true() {
    let (dev, a) = setup(1 << 30);
    let backend = a.backend().clone();
    let ptrs = patterned_tag(a.as_ref());
    let next = |kind| dev.faults.calls().count(kind) + 1;
    dev.faults.fail_nth(
        CallKind::Download,
        next(CallKind::Download),
        Fault::DeviceError,
    );
    assert!(matches!(
        a.pause_tag(TAG, WhenBusy::Synchronize),
        Err(Error::Backend(_))
    ));
    assert!(!a.tag_state(TAG).unwrap().paused, "nothing was given back");
    valid(a.as_ref());
    dev.faults.fail_nth(
        CallKind::Unmap,
        next(CallKind::Unmap) + 1,
        Fault::DeviceError,
    );
    let e = sleep_error(a.pause_tag(TAG, WhenBusy::Synchronize).unwrap_err());
    assert!(
        matches!(
            e,
            SleepError::Partial {
                what: "pause",
                done: 1,
                left: 2,
                ..
            }
        ),
        "{e:?}"
    );
    valid(a.as_ref());
    assert_eq!(a.tag_state(TAG).unwrap().paused_bytes, 30 * MIB);
    a.resume_tag(TAG).unwrap();
    valid(a.as_ref());
    assert_patterns(backend.as_ref(), &ptrs);
}

/// What the model knows of one live allocation.
struct Live {
    pool: PoolId,
    size: u64,
    /// The bytes written at its start, while they are to be kept.
    bytes: Option<Vec<u8>>,
}

/// Random allocations in two tags (one with a backup) and the default pools,
/// frees, pauses, resumes and cache flushes against a model: which tags are
/// paused, what each allocation holds. After each step the invariants hold,
/// paused bytes are the paused tags' segments, and the device holds exactly
/// the reserved bytes.
fn run(seed: u64, steps: usize) {
    let (dev, a) = setup(4 << 30);
    let a = a.as_ref();
    let backend = a.backend().clone();
    let tags = [(TAG, Backup::Host), (OTHER, Backup::None)];
    for (id, backup) in tags {
        tag(a, id, backup);
    }
    let mut rng = SplitMix(seed);
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    let mut paused = [false, false];
    for step in 0..steps {
        let which = rng.below(3) as usize;
        match rng.below(100) {
            0..=39 => {
                let size = match rng.below(4) {
                    0 => 1 + rng.below(MIB),
                    1 | 2 => MIB + rng.below(12 * MIB),
                    _ => 10 * MIB + rng.below(30 * MIB),
                };
                let got = match tags.get(which) {
                    Some((id, _)) => alloc_in(a, *id, size),
                    None => a.malloc(size, S0),
                };
                let pool = tags.get(which).map_or(PoolId::DEFAULT, |t| t.0);
                match got {
                    Ok(p) => {
                        assert!(
                            which == 2 || !paused[which],
                            "step {step}: allocated in a paused tag"
                        );
                        let bytes = pattern(step as u64, size.min(4096) as usize);
                        write(backend.as_ref(), p, &bytes);
                        live.insert(
                            p,
                            Live {
                                pool,
                                size,
                                bytes: Some(bytes),
                            },
                        );
                    }
                    Err(Error::Sleep(SleepError::Paused { pool: p, .. })) => {
                        assert!(paused[which] && p == pool, "step {step}: refused in {p}");
                    }
                    Err(Error::OutOfMemory(_)) => {}
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            40..=69 if !live.is_empty() => {
                let nth = rng.below(live.len() as u64) as usize;
                let p = *live.keys().nth(nth).unwrap();
                a.free(p).unwrap();
                live.remove(&p);
            }
            70..=81 if which < 2 => {
                let (id, _) = tags[which];
                match a.pause_tag(id, WhenBusy::Synchronize) {
                    Ok(_) => {
                        assert!(!paused[which], "step {step}");
                        paused[which] = true;
                    }
                    Err(e) => {
                        assert!(paused[which], "step {step}: {e}");
                        assert!(matches!(sleep_error(e), SleepError::AlreadyPaused { .. }));
                    }
                }
            }
            82..=93 if which < 2 => {
                let (id, backup) = tags[which];
                match a.resume_tag(id) {
                    Ok(_) => {
                        assert!(paused[which], "step {step}");
                        paused[which] = false;
                        check_bytes(backend.as_ref(), &mut live, id, backup, step);
                    }
                    Err(e) => {
                        assert!(!paused[which], "step {step}: {e}");
                        assert!(matches!(sleep_error(e), SleepError::NotPaused { .. }));
                    }
                }
            }
            _ => a.empty_cache().unwrap(),
        }
        if let Err(e) = a.validate() {
            panic!("seed {seed} step {step}: {e}");
        }
        let s = a.stats();
        let paused_now: u64 = tags
            .iter()
            .map(|(id, _)| a.tag_state(*id).unwrap())
            .filter(|t| t.paused)
            .map(|t| t.paused_bytes)
            .sum();
        assert_eq!(
            s.paused_bytes.current as u64, paused_now,
            "seed {seed} step {step}"
        );
        assert_eq!(
            dev.sim.counters().used,
            s.memory_reserved(),
            "seed {seed} step {step}"
        );
        let requested: u64 = live.values().map(|l| l.size).sum();
        assert!(s.memory_allocated() >= requested, "seed {seed} step {step}");
    }
    for p in std::mem::take(&mut live).into_keys() {
        a.free(p).unwrap();
    }
    for (i, (id, _)) in tags.iter().enumerate() {
        if paused[i] {
            a.resume_tag(*id).unwrap();
        }
        a.release_pool(*id).unwrap();
    }
    a.empty_cache().unwrap();
    valid(a);
    assert_eq!(dev.sim.live_objects(), 0, "seed {seed}");
}

/// After a resume of tag `id`: with a backup every allocation's bytes are
/// back; without, they are gone (and no longer checked).
fn check_bytes(
    b: &dyn Backend,
    live: &mut BTreeMap<u64, Live>,
    id: PoolId,
    backup: Backup,
    step: usize,
) {
    for (p, l) in live.iter_mut().filter(|(_, l)| l.pool == id) {
        let Some(bytes) = l.bytes.as_ref() else {
            continue;
        };
        let now = read(b, *p, bytes.len());
        match backup {
            Backup::Host => assert_eq!(&now, bytes, "step {step}: {p:#x}"),
            Backup::None => l.bytes = None,
        }
    }
}

#[test]
fn random_pauses_and_resumes_match_the_model() {
    for seed in [1, 7, 52] {
        run(seed, 1500);
    }
}
