//! Seeded randomized test: thousands of mixed operations on several streams with
//! `record_stream`, manual events, `empty_cache` and injected backend faults,
//! `validate()` after every one; at the end nothing is left on the device.

use std::collections::BTreeMap;

use cachalot::backend::faults::Fault;
use cachalot::backend::sim::SimBackend;
use cachalot::backend::CallKind;
use cachalot::{AllocatorConfig, Error, StreamId};

use cachalot_testkit::device::TestDevice;
use cachalot_testkit::splitmix::SplitMix;

fn size(rng: &mut SplitMix) -> u64 {
    match rng.below(10) {
        0..=4 => 1 + rng.below(1 << 20),
        5..=7 => (1 << 20) + rng.below(12 << 20),
        8 => (10 << 20) + rng.below(200 << 20),
        _ => 1 + rng.below(4096),
    }
}

const FAULT_KINDS: [CallKind; 7] = [
    CallKind::SegmentAlloc,
    CallKind::CreatePage,
    CallKind::Map,
    CallKind::SegmentFree,
    CallKind::Unmap,
    CallKind::QueryEvent,
    CallKind::ReleasePage,
];

fn run(seed: u64, conf: &str, ops: usize) {
    let dev = TestDevice::new(SimBackend::new(3 << 30));
    dev.sim.set_manual_events(true);
    let alloc =
        cachalot::allocator::create(dev.backend(), AllocatorConfig::parse(conf).unwrap()).unwrap();
    let mut rng = SplitMix(seed);
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut ooms, mut faults) = (0, 0);
    for step in 0..ops {
        match rng.below(100) {
            0..=44 => {
                let s = size(&mut rng);
                match alloc.malloc(s, StreamId(rng.below(3))) {
                    Ok(p) => {
                        let overlaps = live
                            .range(..p + s)
                            .next_back()
                            .is_some_and(|(q, qs)| q + qs > p);
                        assert!(
                            !overlaps,
                            "step {step}: {p:#x}+{s} overlaps a live allocation"
                        );
                        live.insert(p, s);
                    }
                    Err(Error::OutOfMemory(_)) => ooms += 1,
                    Err(Error::Backend(_)) => faults += 1,
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            45..=79 if !live.is_empty() => {
                let nth = rng.below(live.len() as u64) as usize;
                let p = *live.keys().nth(nth).unwrap();
                match alloc.free(p) {
                    Ok(()) => {
                        live.remove(&p);
                    }
                    Err(Error::Backend(_)) => faults += 1,
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            80..=87 if !live.is_empty() => {
                let nth = rng.below(live.len() as u64) as usize;
                let p = *live.keys().nth(nth).unwrap();
                alloc.record_stream(p, StreamId(rng.below(4))).unwrap();
            }
            88..=92 => dev.sim.complete_stream(StreamId(rng.below(4))),
            93..=94 => match alloc.empty_cache() {
                Ok(()) | Err(Error::Backend(_)) => {}
                Err(e) => panic!("step {step}: {e}"),
            },
            95..=97 => {
                let kind = FAULT_KINDS[rng.below(FAULT_KINDS.len() as u64) as usize];
                let fault = if rng.below(2) == 0 {
                    Fault::OutOfMemory
                } else {
                    Fault::DeviceError
                };
                dev.faults.fail_nth(kind, 1 + rng.below(3), fault);
            }
            _ => {
                let used = dev.limit.held();
                dev.limit.set(if rng.below(2) == 0 {
                    Some(used + (64 << 20))
                } else {
                    None
                });
            }
        }
        if let Err(e) = alloc.validate() {
            panic!("seed {seed} conf '{conf}' step {step}: {e}");
        }
    }
    assert!(ooms + faults > 0, "the run exercised no failure path");
    dev.limit.set(None);
    dev.sim.complete_all();
    for p in std::mem::take(&mut live).into_keys() {
        while let Err(e) = alloc.free(p) {
            assert!(matches!(e, Error::Backend(_)), "{e}");
        }
    }
    let mut tries = 0;
    while alloc.empty_cache().is_err() || dev.sim.live_objects() > 0 {
        tries += 1;
        assert!(
            tries < 50,
            "seed {seed} conf '{conf}': {} device objects remain",
            dev.sim.live_objects()
        );
    }
    alloc.validate().unwrap();
    let st = alloc.stats();
    assert_eq!(
        (
            st.memory_allocated(),
            st.memory_reserved(),
            st.active.all.current
        ),
        (0, 0, 0)
    );
    assert_eq!(dev.sim.counters().used, 0);
}

#[test]
fn random_ops_native() {
    run(1, "", 4000);
}

#[test]
fn random_ops_expandable() {
    run(2, "expandable_segments:True", 4000);
}

#[test]
fn random_ops_max_split() {
    run(3, "max_split_size_mb:64", 4000);
}

#[test]
fn random_ops_roundup_and_gc() {
    run(4, "roundup_power2_divisions:4,garbage_collection_threshold:0.6,per_process_memory_fraction:0.5", 4000);
}

#[test]
fn random_ops_many_seeds() {
    for seed in 10..16 {
        run(
            seed,
            if seed % 2 == 0 {
                ""
            } else {
                "expandable_segments:True"
            },
            1500,
        );
    }
}

#[test]
fn random_ops_cachalot() {
    run(5, "policy:cachalot", 4000);
    run(
        6,
        "policy:cachalot,cachalot_reuse_slack:0,cachalot_reuse_min_mb:0,cachalot_release_threshold_mb:16",
        4000,
    );
}
