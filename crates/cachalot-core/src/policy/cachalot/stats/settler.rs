//! Settles the device's cuts on threads of their own, off the threads that
//! allocate.
//!
//! Settling a cut (`merge`) is the costly part of exact peaks with several
//! streams: on the GPU benchmark's threaded pattern (8 streams), about two
//! fifths of the changes are replayed one by one, 58 to 68 ns each on the
//! H100 host. Settled by the thread whose journal filled, that cost about
//! 19 ns an operation at 8 threads (63.8 against 75.2 operations per
//! microsecond with no settling at all), and the one allocation that asked
//! for the cut waited for all of it (some 30,000 changes: most of a
//! millisecond). The peaks of separate cuts do not depend on each other, so
//! a stream whose journal filled takes the cut (a moment, every stream
//! locked) and hands it here; a settler thread settles it and finishes it
//! into the merge state. Readers of the statistics wait until every cut
//! taken is settled, as before.
//!
//! The first thread starts with the first cut handed over (a device with one
//! stream never takes one). Where [`QUEUE`] cuts already wait, the thread
//! that took the cut settles it, as without a settler, and one more settler
//! thread starts, up to a quarter of the machine's cores ([`THREADS`] at
//! most): eight streams make changes faster than one thread settles them.
//! Where no thread can be started, every cut is settled by the thread that
//! took it, and so is every cut of a child process forked from this one
//! (it has none of the parent's threads; cuts in flight at the fork are
//! forgotten there, see `Merged::own`). Memory held by cuts in flight stays
//! bounded, and a host with no core to spare settles at the pace the
//! allocating threads set. Dropping the settler closes its queue and joins
//! its threads after the cuts queued are settled.
//!
//! Handing a cut to a thread that waits on the queue wakes it, a system
//! call that cost a lone allocating thread with a side stream 4% of its
//! time. So a settler thread that took a cut looks for the next one after
//! short naps (a quarter of the time between its last two cuts, [`NAPS`]),
//! [`POLL`] of them, before it waits on the queue again: while cuts come
//! steadily, nobody wakes it. A reader that waits for cuts wakes the
//! threads from their naps ([`Settler::hurry`]).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Cuts waiting for the settler at most; past that, the thread that took a
/// cut settles it.
pub(crate) const QUEUE: usize = 4;

/// Settler threads at most: on the GPU benchmark's threaded pattern (8
/// streams on the H100 host) the streams make about 70 changes a
/// microsecond, and one thread settles about 40 (two fifths replayed at
/// some 60 ns each).
pub(crate) const THREADS: usize = 4;

/// How long a settler thread naps between looks for a cut, before it waits
/// on the queue: a quarter of the time between the last two cuts it took,
/// within these bounds (the system's timer slack adds some 50 us on Linux).
const NAPS: (Duration, Duration) = (Duration::from_micros(10), Duration::from_micros(200));

/// Naps at most before a settler thread waits on the queue.
const POLL: u32 = 16;

/// What the settler threads settle cuts into: shared by the device's side
/// and the threads (the merge state, `merge`).
pub(crate) trait Settle: Send + Sync + 'static {
    /// A cut: the work handed over.
    type Cut: Send + 'static;

    /// Settles `cut`, on a settler thread or on the thread that took it.
    fn settle(&self, cut: Self::Cut);
}

/// The queue to the settler threads, which they share.
#[derive(Debug)]
struct Queue<C> {
    cuts: SyncSender<C>,
    taken: Arc<Mutex<Receiver<C>>>,
    /// The process the threads run in: a child forked from it has none.
    pid: u32,
}

impl<C> Queue<C> {
    fn new() -> Queue<C> {
        let (cuts, taken) = sync_channel(QUEUE);
        Queue {
            cuts,
            taken: Arc::new(Mutex::new(taken)),
            pid: std::process::id(),
        }
    }

    /// Whether this is a child forked from the process the threads run in.
    fn forked(&self) -> bool {
        self.pid != std::process::id()
    }
}

impl<C: Send + 'static> Queue<C> {
    /// Starts a settler thread on the queue; `None` where the system refuses
    /// one.
    fn start<S: Settle<Cut = C>>(&self, state: &Arc<S>) -> Option<JoinHandle<()>> {
        let (state, taken) = (state.clone(), self.taken.clone());
        std::thread::Builder::new()
            .name("cachalot-settler".to_string())
            .spawn(move || Queue::run(&*state, &taken))
            .ok()
    }

    /// Settles cuts until the queue is closed and emptied. One thread at a
    /// time waits on the queue; the others wait for it to take a cut.
    fn run<S: Settle<Cut = C>>(state: &S, taken: &Mutex<Receiver<C>>) {
        let (mut last, mut nap) = (Instant::now(), NAPS.1);
        loop {
            let cut = {
                let queue = taken.lock().unwrap_or_else(|e| e.into_inner());
                Queue::poll(&queue, nap).map_or_else(|| queue.recv(), Ok)
            };
            let Ok(cut) = cut else { return };
            nap = (last.elapsed() / 4).clamp(NAPS.0, NAPS.1);
            last = Instant::now();
            state.settle(cut);
        }
    }

    /// The next cut within [`POLL`] naps of `nap`, looked for after each:
    /// while the thread naps instead of waiting on the queue, a thread
    /// handing it a cut has no one to wake (a system call that cost an
    /// allocating thread 4% of its time with a side stream). `None` once
    /// the naps are over (the thread then waits on the queue), or the queue
    /// is closed.
    fn poll(queue: &Receiver<C>, nap: Duration) -> Option<C> {
        for _ in 0..POLL {
            match queue.try_recv() {
                Ok(cut) => return Some(cut),
                Err(TryRecvError::Empty) => std::thread::park_timeout(nap),
                Err(TryRecvError::Disconnected) => return None,
            }
        }
        None
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Settler<C> {
    queue: OnceLock<Queue<C>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Settler threads at most.
    most: usize,
}

impl<C> Default for Settler<C> {
    /// At most a quarter of the machine's cores settle (one to [`THREADS`]).
    fn default() -> Settler<C> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Settler::with_threads((cores / 4).clamp(1, THREADS))
    }
}

impl<C> Settler<C> {
    /// A settler of at most `most` threads.
    pub(crate) fn with_threads(most: usize) -> Settler<C> {
        Settler {
            queue: OnceLock::new(),
            threads: Mutex::new(Vec::new()),
            most,
        }
    }

    /// Settler threads started so far.
    fn threads(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<C: Send + 'static> Settler<C> {
    /// Settles `cut` on a settler thread (the first started on first use),
    /// or here where the queue is full (starting one more thread, up to the
    /// most) or no thread can be started (module docs).
    pub(crate) fn hand<S: Settle<Cut = C>>(&self, mut cut: C, state: &Arc<S>) {
        let queue = self.queue.get_or_init(Queue::new);
        if queue.forked() {
            return state.settle(cut);
        }
        let running = !self.threads().is_empty();
        if running || self.grow(queue, state) {
            match queue.cuts.try_send(cut) {
                Ok(()) => return,
                Err(TrySendError::Full(back) | TrySendError::Disconnected(back)) => cut = back,
            }
            self.grow(queue, state);
        }
        state.settle(cut);
    }

    /// Wakes the settler threads from their naps (a reader waits for the
    /// cuts they have not taken yet).
    pub(crate) fn hurry(&self) {
        for thread in self.threads().iter() {
            thread.thread().unpark();
        }
    }

    /// Starts one more settler thread, unless the most are running or the
    /// system refuses one: whether one started.
    fn grow<S: Settle<Cut = C>>(&self, queue: &Queue<C>, state: &Arc<S>) -> bool {
        let mut threads = self.threads();
        if threads.len() >= self.most {
            return false;
        }
        match queue.start(state) {
            Some(thread) => {
                threads.push(thread);
                true
            }
            None => false,
        }
    }
}

impl<C> Drop for Settler<C> {
    fn drop(&mut self) {
        let queue = self.queue.take();
        let threads = std::mem::take(&mut *self.threads());
        if queue.as_ref().is_some_and(Queue::forked) {
            // A forked child has none of the threads: nothing to close,
            // join or detach.
            std::mem::forget((queue, threads));
            return;
        }
        // The threads end once the queue is closed and emptied.
        drop(queue);
        for thread in threads {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Condvar;

    /// Counts the cuts settled.
    #[derive(Debug, Default)]
    struct Count {
        settled: Mutex<usize>,
        more: Condvar,
    }

    impl Settle for Count {
        type Cut = ();

        fn settle(&self, (): ()) {
            *self.settled.lock().expect("the count") += 1;
            self.more.notify_all();
        }
    }

    /// Hands `n` cuts to `settler` at once.
    fn hand_cuts(settler: &Settler<()>, state: &Arc<Count>, n: usize) {
        for _ in 0..n {
            settler.hand((), state);
        }
    }

    /// Whether `n` cuts were settled, once they all are.
    fn all_settled(state: &Count, n: usize) -> bool {
        let mut settled = state.settled.lock().expect("the count");
        while *settled < n {
            settled = state.more.wait(settled).expect("the count");
        }
        *settled == n
    }

    /// More cuts than the queue holds, handed over at once: each is settled
    /// (on a thread, or here once the queue is full), readers wait for all
    /// of them, and dropping the settler joins its threads.
    #[test]
    fn every_cut_handed_over_is_settled() {
        let state = Arc::new(Count::default());
        let settler = Settler::default();
        hand_cuts(&settler, &state, 10 * QUEUE);
        assert!(all_settled(&state, 10 * QUEUE));
        drop(settler);
        assert_eq!(
            Arc::strong_count(&state),
            1,
            "the threads let go of the state"
        );
    }

    /// A full queue starts one more thread per cut that found it full, up
    /// to the most, and none past that.
    #[test]
    fn a_full_queue_starts_threads_up_to_the_most() {
        let state = Arc::new(Count::default());
        let settler = Settler::with_threads(2);
        let queue = settler.queue.get_or_init(Queue::new);
        let held = queue.taken.lock().expect("the queue");
        hand_cuts(&settler, &state, QUEUE);
        assert_eq!(
            settler.threads().len(),
            1,
            "one thread while the queue has room"
        );
        hand_cuts(&settler, &state, 1);
        assert_eq!(settler.threads().len(), 2, "a full queue starts another");
        hand_cuts(&settler, &state, 3);
        assert_eq!(settler.threads().len(), 2, "never past the most");
        drop(held);
        assert!(all_settled(&state, QUEUE + 4));
        drop(settler);
        assert_eq!(Arc::strong_count(&state), 1);
    }
}
