//! A simulated device under the adaptors the failure tests drive: injected
//! faults over a movable memory limit over a call count.

use std::sync::Arc;

use cachalot::backend::counting::Counting;
use cachalot::backend::faults::Faults;
use cachalot::backend::limit::Limit;
use cachalot::backend::sim::SimBackend;
use cachalot::backend::Backend;

/// Each layer of the stack, from the device up.
pub struct TestDevice {
    /// The simulated device: manual events, live objects, bytes in use.
    pub sim: Arc<SimBackend>,
    /// The calls that reached the device.
    pub calls: Arc<Counting<SimBackend>>,
    /// The memory limit (none until set).
    pub limit: Arc<Limit<Counting<SimBackend>>>,
    /// Faults, fired before a call reaches anything below.
    pub faults: Arc<Faults<Limit<Counting<SimBackend>>>>,
}

impl TestDevice {
    /// The stack over `sim`, with no fault armed and no limit.
    pub fn new(sim: SimBackend) -> TestDevice {
        let sim = Arc::new(sim);
        let calls = Arc::new(Counting::new(sim.clone()));
        let limit = Arc::new(Limit::new(calls.clone(), None));
        let faults = Arc::new(Faults::new(limit.clone()));
        TestDevice {
            sim,
            calls,
            limit,
            faults,
        }
    }

    /// The top of the stack, for an allocator.
    pub fn backend(&self) -> Arc<dyn Backend> {
        self.faults.clone()
    }
}
