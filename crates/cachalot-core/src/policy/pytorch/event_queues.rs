//! The events of freed blocks that other streams used, one queue per stream,
//! walked in the order PyTorch's table of them has ([`HashOrder`]), and the
//! hashes that order comes from.

use std::collections::{HashMap, VecDeque};

use crate::backend::StreamId;

use super::block::PendingEvent;
use super::hash_order::{c10_stream_hash, HashOrder};

/// Each stream's hash in PyTorch's tables: told by the caller (the plug-in
/// knows c10's stream ids), else the stream's handle packed as c10 packs an id.
#[derive(Debug, Default)]
pub(crate) struct StreamHashes {
    device: u64,
    by_stream: HashMap<StreamId, u64>,
    by_hash: HashMap<u64, StreamId>,
}

impl StreamHashes {
    /// The hashes of streams on `device`.
    pub(crate) fn new(device: usize) -> StreamHashes {
        StreamHashes {
            device: device as u64,
            ..StreamHashes::default()
        }
    }

    /// Records that PyTorch hashes `stream` to `hash`.
    pub(crate) fn set(&mut self, stream: StreamId, hash: u64) {
        if let Some(old) = self.by_stream.insert(stream, hash) {
            self.by_hash.remove(&old);
        }
        self.by_hash.insert(hash, stream);
    }

    /// The hash of `stream`.
    pub(crate) fn of(&mut self, stream: StreamId) -> u64 {
        if let Some(h) = self.by_stream.get(&stream) {
            return *h;
        }
        let h = c10_stream_hash(self.device, stream.0);
        self.set(stream, h);
        h
    }

    /// The stream of `hash` (one [`StreamHashes::of`] handed out).
    fn stream(&self, hash: u64) -> StreamId {
        self.by_hash.get(&hash).copied().unwrap_or(StreamId(hash))
    }

    /// `streams` (distinct) in the order PyTorch's stream set holding them,
    /// inserted in this order, iterates them.
    pub(crate) fn set_order(&mut self, streams: &[StreamId]) -> Vec<StreamId> {
        let hashes: Vec<u64> = streams.iter().map(|s| self.of(*s)).collect();
        HashOrder::order_of(hashes)
            .into_iter()
            .map(|h| self.stream(h))
            .collect()
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct EventQueues {
    queues: HashMap<StreamId, VecDeque<PendingEvent>>,
    order: HashOrder,
}

impl EventQueues {
    /// Whether no event is outstanding.
    pub(crate) fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Queues `event` on `stream` (of hash `hash`).
    pub(crate) fn push(&mut self, stream: StreamId, hash: u64, event: PendingEvent) {
        let q = self.queues.entry(stream).or_default();
        if q.is_empty() {
            self.order.insert(hash);
        }
        q.push_back(event);
    }

    /// The streams with events, in the table's order, with their hashes.
    pub(crate) fn walk(&self, hashes: &StreamHashes) -> Vec<(StreamId, u64)> {
        self.order.iter().map(|h| (hashes.stream(h), h)).collect()
    }

    /// The oldest event of `stream`.
    pub(crate) fn front(&self, stream: StreamId) -> Option<PendingEvent> {
        self.queues.get(&stream).and_then(|q| q.front().copied())
    }

    /// Drops the oldest event of `stream`.
    pub(crate) fn pop_front(&mut self, stream: StreamId) {
        if let Some(q) = self.queues.get_mut(&stream) {
            q.pop_front();
        }
    }

    /// Takes `stream`'s queue out (to be put back with [`EventQueues::put`]).
    pub(crate) fn take(&mut self, stream: StreamId) -> VecDeque<PendingEvent> {
        self.queues.remove(&stream).unwrap_or_default()
    }

    /// Puts back a queue taken out.
    pub(crate) fn put(&mut self, stream: StreamId, queue: VecDeque<PendingEvent>) {
        self.queues.insert(stream, queue);
    }

    /// After a walk over `walked`: forgets the streams whose queues emptied,
    /// in walk order, as PyTorch erases them during its walk.
    pub(crate) fn drop_emptied(&mut self, walked: &[(StreamId, u64)]) {
        for (s, h) in walked {
            if self.queues.get(s).is_none_or(VecDeque::is_empty) {
                self.queues.remove(s);
                self.order.erase(*h);
            }
        }
    }

    /// Every outstanding event.
    pub(crate) fn events(&self) -> impl Iterator<Item = &PendingEvent> {
        self.queues.values().flatten()
    }

    /// Takes every outstanding event out.
    pub(crate) fn drain(&mut self) -> Vec<PendingEvent> {
        let out = self.queues.drain().flat_map(|(_, q)| q).collect();
        self.order.clear();
        out
    }

    /// Checks that the table holds exactly the streams with events.
    pub(crate) fn check(&self, hashes: &StreamHashes) -> Result<(), String> {
        self.order.check()?;
        let walked = self.walk(hashes);
        if walked.len() != self.queues.len()
            || walked
                .iter()
                .any(|(s, _)| self.queues.get(s).is_none_or(VecDeque::is_empty))
        {
            return Err(format!(
                "{} streams with events, {} in the table",
                self.queues.len(),
                walked.len()
            ));
        }
        Ok(())
    }
}
