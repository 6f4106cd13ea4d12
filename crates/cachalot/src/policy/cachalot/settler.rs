//! Settles the device's cuts on a thread of its own, off the threads that
//! allocate.
//!
//! Settling a cut (`merge`) is the costly part of exact peaks with several
//! streams: on the GPU benchmark's threaded pattern (8 streams), about two
//! fifths of the changes are replayed one by one, about 24 ns each on the
//! H100 host. Settled by the thread whose journal filled, that cost about
//! 19 ns an operation at 8 threads (63.8 against 75.2 operations per
//! microsecond with no settling at all), and the one allocation that asked
//! for the cut waited for all of it (some 30,000 changes: most of a
//! millisecond). The peaks of separate cuts do not depend on each other, so
//! a stream whose journal filled takes the cut (a moment, every stream
//! locked) and hands it here; the settler thread settles the cuts in the
//! order received and finishes each into the merge state. Readers of the
//! statistics wait until every cut taken is settled, as before.
//!
//! The thread starts with the first cut handed over (a device with one stream
//! never takes one). Where it cannot be started, or [`QUEUE`] cuts already
//! wait, the cut is settled by the thread that took it, as without a settler:
//! memory held by cuts in flight stays bounded, and a host with no core to
//! spare settles at the pace the allocating threads set. Dropping the settler
//! closes its queue and joins the thread after the cuts queued are settled.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use super::merge::{Cut, Merged};

/// Cuts waiting for the settler at most; past that, the thread that took a
/// cut settles it.
pub(crate) const QUEUE: usize = 4;

/// The merge state and the signal that a cut was settled: shared by the
/// device's side and the settler thread.
#[derive(Debug, Default)]
pub(crate) struct MergeState {
    merged: Mutex<Option<Merged>>,
    /// Signalled when a cut is settled.
    settled: Condvar,
}

impl MergeState {
    /// The merge state: `None` while the device has had one stream.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Merged>> {
        self.merged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The merge state, unless another thread holds it.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Option<Merged>>> {
        match self.merged.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Waits, the merge state locked, until every cut taken is settled.
    pub(crate) fn wait_idle<'a>(
        &self,
        mut guard: MutexGuard<'a, Option<Merged>>,
    ) -> MutexGuard<'a, Option<Merged>> {
        while guard.as_ref().is_some_and(|m| !m.idle()) {
            guard = self.settled.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        guard
    }

    /// Settles `cut` and takes it back into the merge state. A settle that
    /// panics (a bug) still finishes the cut, so that readers never wait for
    /// it forever, and leaves the merge state marked for `validate`.
    pub(crate) fn settle(&self, mut cut: Cut) {
        let panicked = catch_unwind(AssertUnwindSafe(|| cut.settle())).is_err();
        if let Some(m) = self.lock().as_mut() {
            if panicked {
                m.mark_lost();
            }
            m.finish(cut);
        }
        self.settled.notify_all();
    }
}

/// The settler thread and the queue to it.
#[derive(Debug)]
struct Worker {
    queue: SyncSender<Cut>,
    thread: JoinHandle<()>,
}

impl Worker {
    /// Starts the thread; `None` where the system refuses one.
    fn start(state: Arc<MergeState>) -> Option<Worker> {
        let (queue, cuts) = sync_channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("cachalot-settler".to_string())
            .spawn(move || Worker::run(&state, &cuts))
            .ok()?;
        Some(Worker { queue, thread })
    }

    fn run(state: &MergeState, cuts: &Receiver<Cut>) {
        while let Ok(cut) = cuts.recv() {
            state.settle(cut);
        }
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Settler {
    worker: OnceLock<Option<Worker>>,
}

impl Settler {
    /// Settles `cut` on the settler thread (started on first use), or here
    /// where it cannot take it (module docs).
    pub(crate) fn hand(&self, cut: Cut, state: &Arc<MergeState>) {
        let worker = self.worker.get_or_init(|| Worker::start(state.clone()));
        let cut = match worker {
            Some(w) => match w.queue.try_send(cut) {
                Ok(()) => return,
                Err(TrySendError::Full(cut) | TrySendError::Disconnected(cut)) => cut,
            },
            None => cut,
        };
        state.settle(cut);
    }
}

impl Drop for Settler {
    fn drop(&mut self) {
        if let Some(Some(Worker { queue, thread })) = self.worker.take() {
            // The thread ends once the queue is closed and emptied.
            drop(queue);
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More cuts than the queue holds, handed over at once: each is settled
    /// (on the thread, or here once the queue is full), readers wait for all
    /// of them, and dropping the settler joins its thread.
    #[test]
    fn every_cut_handed_over_is_settled() {
        let state = Arc::new(MergeState::default());
        *state.lock() = Some(Merged::default());
        let settler = Settler::default();
        for _ in 0..10 * QUEUE {
            let cut = state.lock().as_mut().map(Merged::begin).expect("merging");
            settler.hand(cut, &state);
        }
        let guard = state.wait_idle(state.lock());
        assert!(guard.as_ref().is_some_and(Merged::idle));
        drop(guard);
        drop(settler);
        assert_eq!(
            Arc::strong_count(&state),
            1,
            "the thread let go of the state"
        );
    }
}
