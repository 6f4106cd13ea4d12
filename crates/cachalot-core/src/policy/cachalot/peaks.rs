//! The device's statistics from its streams': a merge locks every stream at
//! once (a cut), takes their journals' changes since the last one, and
//! raises the device's peaks from them (`stats::merge`), here or on the
//! settler threads.

use std::sync::MutexGuard;

use super::directory::StreamEntry;
use super::stats::journal::Fill;
use super::stats::merge::{Cut, Merged};
use super::stream::StreamState;
use super::CachalotAllocator;

impl CachalotAllocator {
    /// A cut, unless one is being taken (which takes this stream's changes
    /// too, or the next one will: a journal may pass its limit meanwhile),
    /// handed to the settler threads after letting go of the merge state; an
    /// overfull journal waits for the merge state.
    #[cold]
    #[inline(never)]
    pub(super) fn merge_when_full(&self, fill: Fill) {
        let guard = match fill {
            Fill::Overfull => Some(self.journal.lock()),
            _ if self.journal.busy() => None,
            _ => self.journal.try_lock(),
        };
        let Some(mut merged) = guard else { return };
        let cut = self.cut(&mut merged, |_| {});
        drop(merged);
        if let Some(cut) = cut {
            self.journal.settle_apart(cut);
        }
    }

    /// The device's statistics merged up to now: every cut taken settled,
    /// then one more, all under the merge state's lock (`None` while the
    /// device has had one stream). `visit` sees each stream at that cut.
    pub(super) fn merge(
        &self,
        visit: impl FnMut(&mut StreamState),
    ) -> MutexGuard<'_, Option<Merged>> {
        let mut merged = self.journal.wait_idle(self.journal.lock());
        if let Some(mut cut) = self.cut(&mut merged, visit) {
            cut.settle();
            if let Some(m) = merged.as_mut() {
                m.finish(cut);
            }
        }
        merged
    }

    /// Locks every stream at once (in table order: no change is under way, and
    /// the streams' values add up to the device's), runs `visit` on each, takes
    /// their journals' runs into a cut and lets them go. Called with the merge
    /// state locked, which holds off new streams; `None` while the device has
    /// had one stream.
    pub(super) fn cut(
        &self,
        merged: &mut Option<Merged>,
        mut visit: impl FnMut(&mut StreamState),
    ) -> Option<Cut> {
        let mut locked: Vec<_> = self.streams.iter().map(StreamEntry::lock).collect();
        let Some(m) = merged.as_mut() else {
            locked.iter_mut().for_each(|st| visit(st));
            return None;
        };
        self.journal.set_busy(true);
        let mut cut = m.begin();
        for st in &mut locked {
            visit(st);
            if let Some(run) = st.ledger.take_run(m.spare()) {
                cut.add(run);
            }
        }
        drop(locked);
        self.journal.set_busy(false);
        Some(cut)
    }
}
