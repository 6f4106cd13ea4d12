//! A backend wrapper that caps the device memory held through it, with a limit
//! that may move while a test runs (the driver's own figures, `mem_info`, pass
//! through unchanged).
//!
//! Segments and pages count against the limit by their size; address ranges do
//! not (they hold no memory). A segment or page that would take the bytes held
//! above the limit is refused with [`BackendError::OutOfMemory`] without reaching
//! the wrapped backend. Lowering the limit below what is held refuses new memory
//! until enough is given back; nothing already held is taken away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::adaptor::{adaptor, Change, Hooks};
use super::{BackendError, BackendResult, CallKind};

#[derive(Debug, Default)]
struct State {
    limit: Option<u64>,
    /// Live segments and pages through this wrapper: (kind, key) -> bytes.
    live: HashMap<(CallKind, u64), u64>,
    held: u64,
    refused: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct Limit<B: ?Sized> {
    inner: Arc<B>,
    state: Mutex<State>,
}

impl<B: ?Sized> Limit<B> {
    /// Wraps `inner` with at most `limit` bytes held (`None`: no limit).
    pub fn new(inner: Arc<B>, limit: Option<u64>) -> Limit<B> {
        Limit {
            inner,
            state: Mutex::new(State {
                limit,
                ..State::default()
            }),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<B> {
        &self.inner
    }

    /// Moves the limit (`None`: no limit).
    pub fn set(&self, limit: Option<u64>) {
        self.lock().limit = limit;
    }

    /// Bytes held through this wrapper now.
    pub fn held(&self) -> u64 {
        self.lock().held
    }

    /// How many calls the limit has refused.
    pub fn refused(&self) -> u64 {
        self.lock().refused
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<B: ?Sized> Hooks for Limit<B> {
    fn before(&self, kind: CallKind, bytes: u64) -> BackendResult<()> {
        if !matches!(kind, CallKind::SegmentAlloc | CallKind::CreatePage) {
            return Ok(());
        }
        let mut st = self.lock();
        let over = st
            .limit
            .is_some_and(|limit| st.held.checked_add(bytes).is_none_or(|after| after > limit));
        if !over {
            return Ok(());
        }
        st.refused += 1;
        Err(BackendError::OutOfMemory {
            call: kind,
            requested: bytes,
        })
    }

    fn after(&self, change: Change) {
        let mut st = self.lock();
        match change {
            Change::Took { kind, key, bytes } => {
                st.live.insert((kind, key), bytes);
                st.held = st.held.saturating_add(bytes);
            }
            Change::Gave { kind, key } => {
                let made_by = match kind {
                    CallKind::SegmentFree => CallKind::SegmentAlloc,
                    _ => CallKind::CreatePage,
                };
                if let Some(bytes) = st.live.remove(&(made_by, key)) {
                    st.held -= bytes;
                }
            }
        }
    }
}

adaptor!(Limit);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::backend::Backend;

    #[test]
    fn segments_and_pages_count_against_a_limit_that_can_move() {
        let limit = Limit::new(Arc::new(SimBackend::new(64 << 20)), Some(6 << 20));
        let seg = limit.allocate_segment(4 << 20).expect("under the limit");
        let page = limit.create_page(2 << 20).expect("exactly at the limit");
        let over = limit.create_page(2 << 20).unwrap_err();
        assert!(over.is_out_of_memory(), "{over}");
        assert_eq!(limit.held(), 6 << 20);
        assert_eq!(limit.refused(), 1);
        assert_eq!(
            limit.inner().counters().used,
            6 << 20,
            "the refused page never reached the device"
        );
        limit
            .reserve_range(32 << 20)
            .expect("ranges hold no memory");
        limit.set(Some(2 << 20));
        assert!(limit.allocate_segment(2 << 20).is_err(), "held is above it");
        limit.free_segment(seg).unwrap();
        assert_eq!(limit.held(), 2 << 20);
        limit.set(None);
        let big = limit.allocate_segment(32 << 20).expect("no limit");
        limit.free_segment(big).unwrap();
        limit.release_page(page).unwrap();
        assert_eq!(limit.held(), 0);
        assert!(
            limit.free_segment(seg).is_err(),
            "a double free is the device's error, and changes nothing here"
        );
        assert_eq!(limit.held(), 0);
    }
}
