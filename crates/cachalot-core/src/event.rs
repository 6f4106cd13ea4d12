//! Allocator events: what happened to memory, in PyTorch's trace vocabulary.
//!
//! Policies report each state change to an optional [`Observer`] as a
//! [`TraceEvent`]; history recording, the replay engine and tests hang off that
//! single hook. The same type is what the trace readers produce, so a recording
//! and a replay speak one language.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::{DevicePtr, StreamId};

/// What happened.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A block was handed to a caller (`size` = requested bytes).
    Alloc,
    /// The caller freed a block; it may still be in use by a stream.
    FreeRequested,
    /// The block became reusable.
    FreeCompleted,
    /// A segment was obtained from the device.
    SegmentAlloc,
    /// A segment was returned to the device.
    SegmentFree,
    /// Pages were mapped into an expandable segment.
    SegmentMap,
    /// Pages were unmapped from an expandable segment.
    SegmentUnmap,
    /// A snapshot was taken (`size` = active bytes).
    Snapshot,
    /// An allocation failed for lack of memory (`size` = requested bytes,
    /// `addr` = device free bytes).
    Oom,
    /// The pages of a tag's segment went back to the device; the segment
    /// keeps its addresses ([`crate::sleep`]). cachalot's own: PyTorch's
    /// traces have no such action (the plug-in shows it as `segment_unmap`).
    SegmentPause,
    /// The pages of a paused segment came back at its addresses (shown as
    /// `segment_map` by the plug-in).
    SegmentResume,
}

impl Action {
    /// Every action.
    pub const ALL: [Action; 11] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
        Action::SegmentPause,
        Action::SegmentResume,
    ];

    /// PyTorch's name for the action.
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::SegmentPause => "segment_pause",
            Action::SegmentResume => "segment_resume",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Action {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Action::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown action '{s}'"))
    }
}

/// One event.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Microseconds (since the epoch for recordings; since the start for replays).
    pub time_us: u64,
    /// What happened.
    pub action: Action,
    /// The block or segment address.
    pub addr: DevicePtr,
    /// Bytes (see [`Action`] for which).
    pub size: u64,
    /// The stream.
    pub stream: StreamId,
}

/// Receives every event of an allocator, on the thread that caused it.
/// Implementations must be cheap and must not call back into the allocator.
pub trait Observer: Send + Sync {
    /// Called once per event, with the allocator's lock held.
    fn on_event(&self, event: &TraceEvent);

    /// Whether the observer reads [`TraceEvent::time_us`]. An observer that
    /// answers `false` gets events stamped 0, and spares the allocator a clock
    /// read per event. Asked once, when the observer is installed.
    fn wants_time(&self) -> bool {
        true
    }

    /// Whether the observer wants events of `action` at all; the allocator skips
    /// the others. Asked for each action once, when the observer is installed.
    fn wants(&self, action: Action) -> bool {
        let _ = action;
        true
    }
}

/// An optional [`Observer`] with what it asked for (times, actions) resolved once
/// when it is installed: the one path by which policies send events.
#[derive(Clone)]
pub(crate) struct EventSink {
    observer: Option<Arc<dyn Observer>>,
    /// Whether the observer reads event times ([`Observer::wants_time`]).
    stamp: bool,
    /// The actions the observer wants ([`Observer::wants`]), one bit each.
    wanted: u16,
    /// Event times count from here.
    pub(crate) epoch: Instant,
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSink")
            .field("observed", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl EventSink {
    /// No observer yet; event times will count from `epoch`.
    pub(crate) fn new(epoch: Instant) -> EventSink {
        EventSink {
            observer: None,
            stamp: false,
            wanted: 0,
            epoch,
        }
    }

    /// Installs or removes the observer, asking once what it wants.
    pub(crate) fn set(&mut self, observer: Option<Arc<dyn Observer>>) {
        self.stamp = observer.as_ref().is_some_and(|o| o.wants_time());
        self.wanted = observer.as_deref().map_or(0, |o| {
            Action::ALL
                .iter()
                .filter(|a| o.wants(**a))
                .fold(0, |mask, a| mask | action_bit(*a))
        });
        self.observer = observer;
    }

    /// Tells the observer, if there is one and it wants `action`.
    #[inline]
    pub(crate) fn emit(&self, action: Action, addr: DevicePtr, size: u64, stream: StreamId) {
        let Some(o) = self
            .observer
            .as_ref()
            .filter(|_| self.wanted & action_bit(action) != 0)
        else {
            return;
        };
        let time_us = if self.stamp {
            u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
        } else {
            0
        };
        o.on_event(&TraceEvent {
            time_us,
            action,
            addr,
            size,
            stream,
        });
    }
}

/// The bit of `action` in an [`EventSink`]'s mask of wanted actions.
fn action_bit(action: Action) -> u16 {
    1 << (action as u16)
}
