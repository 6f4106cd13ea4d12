//! A backend wrapper that hands out the recorded device's segment addresses.
//!
//! PyTorch's best fit breaks ties between free blocks of one size by address, so
//! which block serves a request depends on where the driver put each segment. The
//! simulated device numbers its segments in increasing order; the CUDA driver does
//! not. To replay a recording exactly, [`RecordedAddresses`] gives the `n`th
//! segment allocation the address the `n`th recorded `segment_alloc` got (when the
//! sizes agree and the range is free), and otherwise an address above every
//! recorded one. It translates frees back; every other call goes straight through.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::adaptor::{adaptor, Hooks};
use super::{Backend, BackendResult, DevicePtr};

/// Alignment of the region above the recorded addresses used once a replay departs
/// from the recording.
const REGION_ALIGN: u64 = 1 << 30;

#[derive(Debug, Default)]
struct State {
    /// The next recorded segment to hand out.
    cursor: usize,
    /// Live segments: handed-out address -> (inner address, size).
    live: BTreeMap<DevicePtr, (DevicePtr, u64)>,
}

/// See the module docs.
#[derive(Debug)]
pub struct RecordedAddresses<B: ?Sized> {
    inner: Arc<B>,
    /// Recorded `segment_alloc` (address, size) pairs, in order.
    recorded: Vec<(DevicePtr, u64)>,
    /// Added to the inner address of a segment with no recorded counterpart.
    shift: u64,
    state: Mutex<State>,
}

impl<B: Backend + ?Sized> RecordedAddresses<B> {
    /// Wraps `inner`, handing out `recorded` (address, size) pairs in order.
    pub fn new(inner: Arc<B>, recorded: Vec<(DevicePtr, u64)>) -> RecordedAddresses<B> {
        let top = recorded
            .iter()
            .map(|(a, s)| a.saturating_add(*s))
            .max()
            .unwrap_or(0);
        let shift = top
            .div_ceil(REGION_ALIGN)
            .saturating_add(1)
            .saturating_mul(REGION_ALIGN);
        RecordedAddresses {
            inner,
            recorded,
            shift,
            state: Mutex::new(State::default()),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<B> {
        &self.inner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn overlaps(live: &BTreeMap<DevicePtr, (DevicePtr, u64)>, addr: DevicePtr, size: u64) -> bool {
    let end = addr.saturating_add(size);
    let before = live.range(..end).next_back();
    before.is_some_and(|(a, (_, s))| a.saturating_add(*s) > addr)
}

impl<B: Backend + ?Sized> RecordedAddresses<B> {
    /// Makes a segment below and hands out the recorded address for it.
    fn allocate_recorded(&self, size: u64) -> BackendResult<DevicePtr> {
        let inner = self.inner.allocate_segment(size)?;
        let mut st = self.lock();
        let recorded = self.recorded.get(st.cursor).copied();
        st.cursor += 1;
        let addr = match recorded {
            Some((addr, s)) if s == size && !overlaps(&st.live, addr, size) => addr,
            _ => inner.saturating_add(self.shift),
        };
        st.live.insert(addr, (inner, size));
        Ok(addr)
    }

    /// Frees the segment below the address handed out.
    fn free_recorded(&self, ptr: DevicePtr) -> BackendResult<()> {
        let found = self.lock().live.get(&ptr).copied();
        match found {
            Some((inner, _)) => {
                self.inner.free_segment(inner)?;
                self.lock().live.remove(&ptr);
                Ok(())
            }
            None => self.inner.free_segment(ptr),
        }
    }
}

impl<B: ?Sized> Hooks for RecordedAddresses<B> {}

adaptor!(RecordedAddresses, segments: allocate_recorded, free_recorded);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::backend::BackendError;

    #[test]
    fn recorded_addresses_are_handed_out_in_order_and_translated_back() {
        let sim = Arc::new(SimBackend::new(1 << 30));
        let mib = 1 << 20;
        let recorded = vec![
            (0x9000_0000, 2 * mib),
            (0x8000_0000, 20 * mib),
            (0x9000_0000, 2 * mib),
        ];
        let b = RecordedAddresses::new(sim.clone(), recorded);
        assert_eq!(b.allocate_segment(2 * mib).unwrap(), 0x9000_0000);
        assert_eq!(b.allocate_segment(20 * mib).unwrap(), 0x8000_0000);
        // The third recorded range is still live: an address above the recording.
        let third = b.allocate_segment(2 * mib).unwrap();
        assert!(third > 0x9000_0000 + 2 * mib);
        // A size the recording does not have: also above it.
        assert!(b.allocate_segment(4 * mib).unwrap() > 0x9000_0000);
        b.free_segment(0x9000_0000).unwrap();
        b.free_segment(third).unwrap();
        assert!(matches!(
            b.free_segment(0x9000_0000),
            Err(BackendError::InvalidAddress { .. })
        ));
        assert_eq!(sim.live_segments().len(), 2);
    }
}
