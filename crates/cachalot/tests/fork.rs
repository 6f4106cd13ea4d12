//! A child process forked from one whose streams handed cuts to settler
//! threads (which the child does not have): the child settles its own cuts,
//! its statistics come back at once with the exact peaks, and it validates.
//! Alone in its test binary, so that no other test's threads are forked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cachalot::backend::sim::SimBackend;
use cachalot::policy::cachalot::CachalotAllocator;
use cachalot::{AllocatorConfig, DeviceAllocator, StreamId};
use cachalot_testkit::lcg::Lcg;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

/// Live blocks (address, bytes) and the bytes allocated now and at most.
#[derive(Default)]
struct Model {
    live: Vec<(u64, i64)>,
    allocated: i64,
    peak: i64,
}

/// `steps` allocations and frees over two streams, enough for the journals
/// to fill and cuts to be handed to the settler again and again.
fn churn(alloc: &CachalotAllocator, model: &mut Model, seed: u64, steps: u64) {
    let mut rng = Lcg(seed);
    for _ in 0..steps {
        let r = rng.draw();
        if model.live.len() < 16 && r.is_multiple_of(2) {
            let size = 512 * (1 + (r >> 2) % 4096);
            let ptr = alloc.malloc(size, StreamId((r >> 1) % 2)).expect("fits");
            model.live.push((ptr, size as i64));
            model.allocated += size as i64;
            model.peak = model.peak.max(model.allocated);
        } else if !model.live.is_empty() {
            let (ptr, size) = model
                .live
                .swap_remove((r % model.live.len() as u64) as usize);
            alloc.free(ptr).expect("live");
            model.allocated -= size;
        }
    }
}

/// What the child checks; its exit code.
fn child(alloc: &CachalotAllocator, model: &mut Model) -> i32 {
    churn(alloc, model, 7, 40_000);
    let stats = alloc.stats();
    match () {
        _ if alloc.validate().is_err() => 2,
        _ if stats.allocated_bytes.all.peak != model.peak => 3,
        _ if stats.allocated_bytes.all.current != model.allocated => 4,
        _ => 0,
    }
}

/// Waits for `pid` for at most `limit`; kills it past that.
fn wait_for(pid: Pid, limit: Duration) -> Option<WaitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(20)),
            Ok(status) => return Some(status),
            Err(e) => panic!("waitpid: {e}"),
        }
    }
    let _ = kill(pid, Signal::SIGKILL);
    let _ = waitpid(pid, None);
    None
}

#[test]
fn a_forked_child_settles_its_own_cuts() {
    let backend = Arc::new(SimBackend::h100());
    let alloc = CachalotAllocator::new(backend, AllocatorConfig::default()).expect("allocator");
    let mut model = Model::default();
    churn(&alloc, &mut model, 3, 40_000);
    // Every cut handed over settled: none is in flight at the fork.
    assert_eq!(alloc.stats().allocated_bytes.all.peak, model.peak);
    // SAFETY: the child only runs this allocator's code (its other threads,
    // the settler threads and the test harness's, are not in the child, and
    // none holds a lock the child takes: the parent is idle between its
    // statistics read and the fork) and leaves through `exit`.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => std::process::exit(child(&alloc, &mut model)),
        ForkResult::Parent { child } => {
            let status = wait_for(child, Duration::from_secs(60));
            assert_eq!(
                status,
                Some(WaitStatus::Exited(child, 0)),
                "the child hung (None), or its figures were wrong (2: validate, 3: peak, 4: current)"
            );
        }
    }
    alloc.validate().expect("the parent is unaffected");
}
