//! `graph_capture_record_stream_reuse` under both policies, on the simulated
//! device's capture graph: PyTorch's `test_graph_capture_reclaim_2_streams`
//! and `_4_streams`, step by step. A block freed during a capture after
//! `record_stream` is reused in the capture once the graph orders the
//! allocating stream's next work after every other stream's use; not before,
//! and not at all without the setting or for a use outside the capture.

use std::sync::Arc;

use cachalot::backend::sim::SimBackend;
use cachalot::policy::create;
use cachalot::private_pool::PoolId;
use cachalot::snapshot::BlockState;
use cachalot::{AllocatorConfig, DeviceAllocator, StreamId};

const POLICIES: [&str; 2] = ["pytorch", "cachalot"];
const GRAPH: PoolId = PoolId(1, 0);

fn make(policy: &str, reuse: bool) -> (Arc<SimBackend>, Arc<dyn DeviceAllocator>) {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let flag = if reuse { "True" } else { "False" };
    let conf = format!("policy:{policy},graph_capture_record_stream_reuse:{flag}");
    let a = create(sim.clone(), AllocatorConfig::parse(&conf).unwrap()).unwrap();
    (sim, a)
}

/// The snapshot's state of the block at `addr`.
fn state_at(a: &dyn DeviceAllocator, addr: u64) -> Option<BlockState> {
    let snap = a.snapshot();
    let mut blocks = snap.segments.iter().flat_map(|s| s.blocks.iter());
    blocks.find(|b| b.address == addr).map(|b| b.state)
}

/// Ends the capture, frees `live`, releases the graph's pool and checks that
/// nothing is left.
fn finish(sim: &SimBackend, a: &dyn DeviceAllocator, live: &[u64]) {
    a.validate().unwrap();
    sim.end_capture();
    a.end_allocate_to_pool(GRAPH).unwrap();
    for p in live {
        a.free(*p).unwrap();
    }
    a.release_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    a.validate().unwrap();
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
}

#[test]
fn a_free_is_reused_once_the_streams_join() {
    for policy in POLICIES {
        for reuse in [true, false] {
            let (sim, a) = make(policy, reuse);
            let (s1, s2) = (StreamId(11), StreamId(12));
            a.begin_allocate_to_pool(GRAPH, Arc::new(|_| true)).unwrap();
            assert!(sim.begin_capture(s1));
            let sink = a.malloc(32, s1).unwrap();
            let data1 = a.malloc(32, s1).unwrap();
            assert!(sim.capture_wait(s2, s1));
            let buf2 = a.malloc(32, s2).unwrap();
            sim.capture_work(s2).unwrap();
            a.record_stream(data1, s2).unwrap();
            a.free(data1).unwrap();
            let data2 = a.malloc(32, s1).unwrap();
            assert_ne!(data2, data1, "{policy}: s1 has not waited on s2");
            assert!(sim.capture_wait(s1, s2));
            sim.capture_work(s1).unwrap();
            let data3 = a.malloc(32, s1).unwrap();
            assert_eq!(
                data3 == data1,
                reuse,
                "{policy}: reused after the join: {reuse}"
            );
            finish(&sim, a.as_ref(), &[sink, buf2, data2, data3]);
        }
    }
}

#[test]
fn a_free_waits_until_every_use_is_joined() {
    for policy in POLICIES {
        let (sim, a) = make(policy, true);
        let [s1, s2, s3, s4, outside] = [21, 22, 23, 24, 25].map(StreamId);
        a.begin_allocate_to_pool(GRAPH, Arc::new(|_| true)).unwrap();
        assert!(sim.begin_capture(s1));
        let data1 = a.malloc(32, s1).unwrap();
        sim.capture_work(s1).unwrap();
        let kept = a.malloc(32, s1).unwrap();
        for s in [s2, s3, s4] {
            assert!(sim.capture_wait(s, s1));
            sim.capture_work(s).unwrap();
            a.record_stream(data1, s).unwrap();
            a.record_stream(kept, s).unwrap();
        }
        a.record_stream(kept, outside).unwrap();
        a.free(data1).unwrap();
        a.free(kept).unwrap();
        assert_eq!(
            state_at(a.as_ref(), kept),
            Some(BlockState::ActivePendingFree)
        );
        assert!(sim.capture_wait(s1, s2));
        sim.capture_work(s1).unwrap();
        assert!(sim.capture_wait(s3, s4));
        sim.capture_work(s3).unwrap();
        let data2 = a.malloc(32, s1).unwrap();
        assert_ne!(data2, data1, "{policy}: s1 and s3 are not joined yet");
        assert!(sim.capture_wait(s1, s3));
        sim.capture_work(s1).unwrap();
        let data3 = a.malloc(32, s1).unwrap();
        assert_eq!(data3, data1, "{policy}: every use joined");
        let data4 = a.malloc(32, s1).unwrap();
        assert_ne!(data4, kept, "{policy}: used outside the capture");
        finish(&sim, a.as_ref(), &[data2, data3, data4]);
    }
}
