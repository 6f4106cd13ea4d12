//! A backend wrapper that makes chosen calls fail: how tests reach every error
//! path of a policy on any backend.
//!
//! [`Faults::fail_nth`] arms a fault for the `n`th call of a kind from now on;
//! that call returns the fault instead of reaching the wrapped backend, and the
//! fault is spent. Calls are counted by kind here, failed ones included.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::adaptor::{adaptor, Hooks};
use super::counting::CallCounts;
use super::{BackendError, BackendResult, CallKind};

/// What an injected fault returns.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The call fails with [`BackendError::OutOfMemory`].
    OutOfMemory,
    /// The call fails with [`BackendError::Device`].
    DeviceError,
}

#[derive(Debug, Default)]
struct State {
    calls: CallCounts,
    /// Armed faults by kind: (the call number that fails, the fault).
    armed: HashMap<CallKind, Vec<(u64, Fault)>>,
    injected: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct Faults<B: ?Sized> {
    inner: Arc<B>,
    state: Mutex<State>,
}

impl<B: ?Sized> Faults<B> {
    /// Wraps `inner`, with no fault armed.
    pub fn new(inner: Arc<B>) -> Faults<B> {
        Faults {
            inner,
            state: Mutex::new(State::default()),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<B> {
        &self.inner
    }

    /// Makes the `n`th call of `kind` from now on (1: the next one) fail with `fault`.
    pub fn fail_nth(&self, kind: CallKind, n: u64, fault: Fault) {
        let mut st = self.lock();
        let at = st.calls.count(kind).saturating_add(n.max(1));
        st.armed.entry(kind).or_default().push((at, fault));
    }

    /// How many calls have failed by an injected fault.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Calls made through this wrapper, by kind.
    pub fn calls(&self) -> CallCounts {
        self.lock().calls.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<B: ?Sized> Hooks for Faults<B> {
    fn before(&self, kind: CallKind, bytes: u64) -> BackendResult<()> {
        let mut st = self.lock();
        let n = st.calls.add(kind);
        let fault = st.armed.get_mut(&kind).and_then(|list| {
            let i = list.iter().position(|(at, _)| *at == n)?;
            Some(list.swap_remove(i).1)
        });
        let Some(fault) = fault else {
            return Ok(());
        };
        st.injected += 1;
        Err(match fault {
            Fault::OutOfMemory => BackendError::OutOfMemory {
                call: kind,
                requested: bytes,
            },
            Fault::DeviceError => BackendError::Device {
                call: kind,
                message: format!("injected fault on call {n}"),
            },
        })
    }
}

adaptor!(Faults);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::backend::Backend;

    #[test]
    fn the_nth_call_fails_once_and_never_reaches_the_device() {
        let faults = Faults::new(Arc::new(SimBackend::new(64 << 20)));
        faults.fail_nth(CallKind::SegmentAlloc, 2, Fault::DeviceError);
        faults.fail_nth(CallKind::SegmentAlloc, 3, Fault::OutOfMemory);
        let a = faults.allocate_segment(2 << 20).expect("first call passes");
        let second = faults.allocate_segment(2 << 20).unwrap_err();
        assert!(matches!(second, BackendError::Device { .. }), "{second}");
        let third = faults.allocate_segment(4 << 20).unwrap_err();
        assert_eq!(
            third,
            BackendError::OutOfMemory {
                call: CallKind::SegmentAlloc,
                requested: 4 << 20
            }
        );
        let b = faults
            .allocate_segment(2 << 20)
            .expect("the faults are spent");
        assert_eq!(faults.injected(), 2);
        assert_eq!(faults.calls().count(CallKind::SegmentAlloc), 4);
        assert_eq!(
            faults.inner().counters().used,
            4 << 20,
            "failed calls held nothing on the device"
        );
        faults.free_segment(a).unwrap();
        faults.free_segment(b).unwrap();
        assert_eq!(faults.inner().live_objects(), 0);
    }
}
