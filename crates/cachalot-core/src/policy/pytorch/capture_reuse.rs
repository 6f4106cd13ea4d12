//! `graph_capture_record_stream_reuse`: a block freed during a CUDA graph
//! capture after `record_stream` is reused in that capture once the graph
//! orders its next use after every use recorded on other streams.
//!
//! Without the setting such a block waits for the capture to end (its events
//! are recorded then; see [`State::insert_deferred_events`]). With it, the free
//! takes "free marks": the capture's frontier on each stream that used the
//! block. Before each allocation during the capture, a deferred block of the
//! allocating stream whose marks all precede that stream's frontier (the
//! streams joined again, as `wait_stream` does) goes back to its pool. A block
//! used by a stream outside the capture, or used before it began, keeps the
//! deferred path: only work inside the graph can be ordered by the graph.

use crate::backend::{capture_marks, StreamId};
use crate::error::Result;

use super::block::BlockId;
use super::state::State;

impl State {
    /// Takes the free marks of block `id`, freed during a capture after
    /// `record_stream`, when the setting is on and every stream that used it
    /// did so inside the capture. A failed query leaves the block without
    /// marks: it waits for the capture's end, as without the setting.
    pub(crate) fn mark_capture_free(&mut self, id: BlockId) {
        if !self.capture_reuse {
            return;
        }
        let b = &self.blocks[id];
        if b.stream_uses.iter().any(|s| !b.capture_uses.contains(s)) {
            return;
        }
        if let Some(marks) = capture_marks(self.backend.as_ref(), &b.stream_uses) {
            self.free_marks.insert(id, marks);
        }
    }

    /// Returns to their pools the deferred blocks of `stream` whose free marks
    /// all precede `stream`'s capture frontier.
    pub(crate) fn reuse_captured_frees(&mut self, stream: StreamId) -> Result<()> {
        if self.free_marks.is_empty() {
            return Ok(());
        }
        let candidates: Vec<BlockId> = self
            .deferred
            .iter()
            .copied()
            .filter(|id| self.blocks[*id].stream == stream && self.free_marks.contains_key(id))
            .collect();
        for id in candidates {
            if self
                .backend
                .capture_follows(stream, &self.free_marks[&id])?
            {
                self.free_marks.remove(&id);
                self.deferred.retain(|d| *d != id);
                let b = &mut self.blocks[id];
                b.stream_uses.clear();
                b.capture_uses.clear();
                self.free_block(id);
            }
        }
        Ok(())
    }
}
