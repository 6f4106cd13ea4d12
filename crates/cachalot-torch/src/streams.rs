//! Making PyTorch's streams known to a backend before the allocator queues work on
//! them.
//!
//! The CUDA backend passes to the driver only streams it made or was told about
//! (`CudaBackend::register_stream`), so that a stray id never reaches the driver.
//! PyTorch's streams are made by PyTorch, so the plug-in registers each one the
//! first time it sees it: the stream of an allocation, and the stream of a
//! `record_stream`. The allocation path stays cheap: a thread remembers the last
//! (registry, device, stream) it registered and skips everything on a repeat.

use std::cell::Cell;
use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use cachalot::StreamId;

/// Tells one device's backend about a stream.
pub type StreamRegistrar = dyn Fn(StreamId) + Send + Sync;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The last (streams id, stream) this thread saw registered.
    static LAST: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// The streams one device's backend already knows.
pub struct KnownStreams {
    /// Distinguishes this set in each thread's one-entry cache.
    id: u64,
    register: Box<StreamRegistrar>,
    seen: RwLock<HashSet<StreamId>>,
}

impl fmt::Debug for KnownStreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seen = self.seen.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("KnownStreams")
            .field("seen", &seen.len())
            .finish_non_exhaustive()
    }
}

impl KnownStreams {
    /// A set that calls `register` once for each new stream.
    pub fn new(register: Box<StreamRegistrar>) -> KnownStreams {
        KnownStreams {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            register,
            seen: RwLock::new(HashSet::new()),
        }
    }

    /// Registers `stream` unless it is the default stream or already known.
    pub fn note(&self, stream: StreamId) {
        if stream == StreamId::DEFAULT || LAST.get() == (self.id, stream.0) {
            return;
        }
        let known = self
            .seen
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&stream);
        if !known {
            let mut seen = self.seen.write().unwrap_or_else(PoisonError::into_inner);
            if seen.insert(stream) {
                (self.register)(stream);
            }
        }
        LAST.set((self.id, stream.0));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn registers_each_stream_once_and_never_the_default() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let log = calls.clone();
        let known = KnownStreams::new(Box::new(move |s| log.lock().unwrap().push(s.0)));
        for s in [0, 7, 7, 9, 7, 0, 9] {
            known.note(StreamId(s));
        }
        assert_eq!(*calls.lock().unwrap(), vec![7, 9]);
        // A second set is not fooled by this thread's cache of the first.
        let other_calls = Arc::new(Mutex::new(0));
        let count = other_calls.clone();
        let other = KnownStreams::new(Box::new(move |_| *count.lock().unwrap() += 1));
        other.note(StreamId(9));
        assert_eq!(*other_calls.lock().unwrap(), 1);
    }
}
