//! History recording: a bounded ring buffer of the allocator's events, with
//! optional Rust backtraces, like PyTorch's `_record_memory_history`.
//!
//! Recording is opt-in. Without it the allocator's observer is `None` and its
//! hot path pays one branch on an empty option. With it, install a [`History`]
//! as the observer:
//!
//! ```
//! use std::sync::Arc;
//! use cachalot_core::history::{History, HistoryConfig};
//! use cachalot_core::event::{Action, Observer, TraceEvent};
//! use cachalot_core::StreamId;
//!
//! let history = Arc::new(History::new(HistoryConfig { capacity: 2, ..HistoryConfig::default() }));
//! // allocator.set_observer(Some(history.clone())); // then use the allocator
//! for addr in [0x100, 0x200, 0x300] {
//!     let e = TraceEvent { time_us: 0, action: Action::Alloc, addr, size: 8, stream: StreamId(0) };
//!     history.on_event(&e);
//! }
//! let kept: Vec<u64> = history.events().iter().map(|r| r.event.addr).collect();
//! assert_eq!(kept, [0x200, 0x300]); // the oldest was overwritten
//! assert_eq!(history.live_allocations().len(), 3); // live allocations are all kept
//! ```
//!
//! Besides the ring, the history keeps every live allocation (its sequence
//! number and, with backtraces on, where it was made), so snapshots can show
//! the stack of each block and leak checks can tell new allocations from old
//! ones at a reused address.

use std::backtrace::Backtrace;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use serde::{Deserialize, Serialize};

use crate::addr_map::AddrMap;
use crate::backend::{DevicePtr, StreamId};
use crate::event::{Action, Observer, TraceEvent};

/// How a [`History`] records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryConfig {
    /// The most events kept; older ones are overwritten (PyTorch's
    /// `max_entries`). Default: 100,000.
    pub capacity: usize,
    /// Capture a Rust backtrace at each alloc, free and segment event (PyTorch's
    /// `context="all"`). Costly: microseconds per event. Default: off.
    pub backtraces: bool,
    /// Actions not recorded at all (PyTorch's `skip_actions`). Default: none.
    pub skip: Vec<Action>,
}

impl Default for HistoryConfig {
    fn default() -> HistoryConfig {
        HistoryConfig {
            capacity: 100_000,
            backtraces: false,
            skip: Vec::new(),
        }
    }
}

/// One stack frame, in PyTorch's snapshot shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frame {
    /// The function.
    pub name: String,
    /// The source file, empty when unknown.
    pub filename: String,
    /// The line, 0 when unknown.
    pub line: u32,
}

/// A stack captured at an event. Capture is cheap-ish; symbol resolution is
/// deferred until [`Stack::frames`] is first called.
pub struct Stack {
    captured: Option<Backtrace>,
    frames: OnceLock<Vec<Frame>>,
}

impl Stack {
    fn capture() -> Stack {
        Stack {
            captured: Some(Backtrace::force_capture()),
            frames: OnceLock::new(),
        }
    }

    /// A stack made of known frames (read back from a file, say).
    pub fn from_frames(frames: Vec<Frame>) -> Stack {
        Stack {
            captured: None,
            frames: OnceLock::from(frames),
        }
    }

    /// The frames, innermost first, without the recorder's own frames.
    pub fn frames(&self) -> &[Frame] {
        self.frames.get_or_init(|| {
            self.captured
                .as_ref()
                .map(parse_backtrace)
                .unwrap_or_default()
        })
    }
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("frames", &self.frames().len())
            .finish()
    }
}

/// Turns a resolved backtrace's text (`  N: name` lines, each maybe followed by
/// `at file:line:col`) into frames, dropping the capture machinery's own.
fn parse_backtrace(bt: &Backtrace) -> Vec<Frame> {
    parse_backtrace_text(&bt.to_string())
}

fn parse_backtrace_text(text: &str) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    for raw in text.lines() {
        let line = raw.trim();
        if let Some(location) = line.strip_prefix("at ") {
            if let Some(last) = frames.last_mut() {
                let mut parts = location.rsplitn(3, ':');
                let (_col, line_no, file) = (parts.next(), parts.next(), parts.next());
                if let (Some(file), Some(Ok(n))) = (file, line_no.map(str::parse)) {
                    last.filename = file.to_string();
                    last.line = n;
                }
            }
        } else if let Some((index, name)) = line.split_once(": ") {
            if index.chars().all(|c| c.is_ascii_digit()) {
                frames.push(Frame {
                    name: name.to_string(),
                    filename: String::new(),
                    line: 0,
                });
            }
        }
    }
    let own = |f: &Frame| {
        f.name.starts_with("std::backtrace")
            || f.name.contains("Backtrace")
            || f.name.contains("history::Stack::capture")
            || f.name.contains("history::History as ")
    };
    let first_caller = frames.iter().position(|f| !own(f)).unwrap_or(frames.len());
    frames.split_off(first_caller)
}

/// One recorded event.
#[derive(Clone, Debug)]
pub struct RecordedEvent {
    /// Position in the whole recording (0 for the first event ever seen),
    /// so gaps show where the ring overwrote events.
    pub seq: u64,
    /// The event.
    pub event: TraceEvent,
    /// Where it happened, when backtraces are on.
    pub stack: Option<Arc<Stack>>,
    /// What the caller of the call that caused it tagged that call with
    /// ([`History::record`]; 0: untagged).
    pub tag: u64,
}

/// An allocation live at the moment of asking.
#[derive(Clone, Debug)]
pub struct LiveAllocation {
    /// Sequence number of its `alloc` event: unique, unlike the address.
    pub seq: u64,
    /// Its address.
    pub addr: DevicePtr,
    /// Requested bytes.
    pub size: u64,
    /// The stream it was allocated on.
    pub stream: StreamId,
    /// When it was allocated.
    pub time_us: u64,
    /// Where it was allocated, when backtraces are on.
    pub stack: Option<Arc<Stack>>,
    /// The caller freed it; it waits for a stream before it is reusable.
    pub free_requested: bool,
}

#[derive(Debug, Default)]
struct Recording {
    ring: VecDeque<RecordedEvent>,
    next_seq: u64,
    live: AddrMap<LiveAllocation>,
}

/// A history recorder: an [`Observer`] to install on an allocator.
#[derive(Debug)]
pub struct History {
    config: HistoryConfig,
    recording: Mutex<Recording>,
}

impl History {
    /// A recorder with nothing recorded yet.
    pub fn new(config: HistoryConfig) -> History {
        let ring = VecDeque::with_capacity(config.capacity.min(1 << 16));
        History {
            config,
            recording: Mutex::new(Recording {
                ring,
                ..Recording::default()
            }),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &HistoryConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, Recording> {
        // A panic elsewhere while holding the lock leaves the ring consistent
        // (each update is a push or pop), so keep recording.
        self.recording
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The kept events, oldest first.
    pub fn events(&self) -> Vec<RecordedEvent> {
        self.lock().ring.iter().cloned().collect()
    }

    /// How many events were overwritten or never kept because the ring was full.
    pub fn dropped(&self) -> u64 {
        let r = self.lock();
        r.next_seq - r.ring.len() as u64
    }

    /// Every allocation live now, by address.
    pub fn live_allocations(&self) -> Vec<LiveAllocation> {
        let mut live: Vec<LiveAllocation> = self.lock().live.values().cloned().collect();
        live.sort_by_key(|a| a.addr);
        live
    }

    /// The stack where the live allocation at `addr` was made, if recorded.
    pub fn stack_of(&self, addr: DevicePtr) -> Option<Arc<Stack>> {
        self.lock().live.get(&addr).and_then(|a| a.stack.clone())
    }

    /// Forgets the kept events (live allocations stay known).
    pub fn clear(&self) {
        self.lock().ring.clear();
    }

    /// Records a `snapshot` event: a snapshot was taken with `active_bytes` active.
    pub fn mark_snapshot(&self, time_us: u64, active_bytes: u64) {
        let event = TraceEvent {
            time_us,
            action: Action::Snapshot,
            addr: 0,
            size: active_bytes,
            stream: StreamId::DEFAULT,
        };
        self.record(&event, 0);
    }

    fn wants_stack(&self, action: Action) -> bool {
        self.config.backtraces && !matches!(action, Action::Snapshot)
    }
}

impl History {
    /// Records `event`, tagged with `tag`: an id the program that drives the
    /// allocator gave the call that caused it (the PyTorch plug-in keeps
    /// Python stacks under such ids). An [`Observer`] call records tag 0.
    pub fn record(&self, event: &TraceEvent, tag: u64) {
        if self.config.skip.contains(&event.action) {
            return;
        }
        // Capture outside the lock: it is the slow part.
        let stack = self
            .wants_stack(event.action)
            .then(|| Arc::new(Stack::capture()));
        let mut r = self.lock();
        let seq = r.next_seq;
        r.next_seq += 1;
        match event.action {
            Action::Alloc => {
                let live = LiveAllocation {
                    seq,
                    addr: event.addr,
                    size: event.size,
                    stream: event.stream,
                    time_us: event.time_us,
                    stack: stack.clone(),
                    free_requested: false,
                };
                r.live.insert(event.addr, live);
            }
            Action::FreeRequested => {
                if let Some(live) = r.live.get_mut(&event.addr) {
                    live.free_requested = true;
                }
            }
            Action::FreeCompleted => {
                r.live.remove(&event.addr);
            }
            _ => {}
        }
        if self.config.capacity == 0 {
            return;
        }
        if r.ring.len() == self.config.capacity {
            r.ring.pop_front();
        }
        r.ring.push_back(RecordedEvent {
            seq,
            event: *event,
            stack,
            tag,
        });
    }
}

impl Observer for History {
    fn on_event(&self, event: &TraceEvent) {
        self.record(event, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            time_us: addr,
            action,
            addr,
            size,
            stream: StreamId(7),
        }
    }

    #[test]
    fn ring_keeps_the_newest_events() {
        let h = History::new(HistoryConfig {
            capacity: 3,
            ..HistoryConfig::default()
        });
        for i in 0..5 {
            h.on_event(&ev(Action::SegmentAlloc, i, 10));
        }
        let seqs: Vec<u64> = h.events().iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [2, 3, 4]);
        assert_eq!(h.dropped(), 2);
        assert_eq!(h.events()[0].event, ev(Action::SegmentAlloc, 2, 10));
    }

    #[test]
    fn live_allocations_follow_alloc_and_free_completed() {
        let h = History::new(HistoryConfig {
            capacity: 1,
            ..HistoryConfig::default()
        });
        h.on_event(&ev(Action::Alloc, 0x10, 4));
        h.on_event(&ev(Action::Alloc, 0x20, 8));
        h.on_event(&ev(Action::FreeRequested, 0x10, 4));
        assert_eq!(h.live_allocations().len(), 2, "pending frees stay live");
        assert!(h.live_allocations()[0].free_requested);
        h.on_event(&ev(Action::FreeCompleted, 0x10, 4));
        let live = h.live_allocations();
        assert_eq!(live.len(), 1);
        assert_eq!((live[0].addr, live[0].size, live[0].seq), (0x20, 8, 1));
        h.on_event(&ev(Action::Alloc, 0x10, 4));
        assert_eq!(
            h.live_allocations()[0].seq,
            4,
            "a reused address is a new allocation"
        );
    }

    #[test]
    fn events_keep_their_callers_tag() {
        let h = History::new(HistoryConfig::default());
        h.record(&ev(Action::Alloc, 1, 1), 7);
        h.on_event(&ev(Action::FreeRequested, 1, 1));
        let tags: Vec<u64> = h.events().iter().map(|r| r.tag).collect();
        assert_eq!(tags, [7, 0]);
    }

    #[test]
    fn skipped_actions_are_not_recorded() {
        let config = HistoryConfig {
            skip: vec![Action::FreeRequested],
            ..HistoryConfig::default()
        };
        let h = History::new(config);
        h.on_event(&ev(Action::Alloc, 1, 1));
        h.on_event(&ev(Action::FreeRequested, 1, 1));
        h.mark_snapshot(9, 1);
        let actions: Vec<Action> = h.events().iter().map(|r| r.event.action).collect();
        assert_eq!(actions, [Action::Alloc, Action::Snapshot]);
    }

    #[inline(never)]
    fn allocate_here(h: &History) {
        h.on_event(&ev(Action::Alloc, 0x40, 64));
    }

    #[test]
    fn backtraces_name_the_caller() {
        let h = History::new(HistoryConfig {
            backtraces: true,
            ..HistoryConfig::default()
        });
        allocate_here(&h);
        h.mark_snapshot(1, 64);
        let events = h.events();
        let stack = events[0].stack.as_ref().expect("backtraces are on");
        let frames = stack.frames();
        assert!(!frames.is_empty());
        assert!(
            !frames[0].name.contains("Backtrace"),
            "capture frames dropped: {:?}",
            frames[0]
        );
        let caller = frames
            .iter()
            .find(|f| f.name.contains("allocate_here"))
            .expect("the caller is on the stack");
        assert!(caller.filename.ends_with("history.rs"), "{caller:?}");
        assert!(caller.line > 0);
        assert!(events[1].stack.is_none(), "snapshot events carry no stack");
        assert!(h.stack_of(0x40).is_some());
    }

    #[test]
    fn frames_parse_from_backtrace_text() {
        let text = "   0: std::backtrace::Backtrace::force_capture\n\
             at /rustc/library/std/src/backtrace.rs:312:13\n\
           1: cachalot::history::Stack::capture\n\
           2: app::train_step\n\
             at ./src/main.rs:42:9\n\
           3: main\n";
        let frames = parse_backtrace_text(text);
        assert_eq!(
            frames,
            [
                Frame {
                    name: "app::train_step".into(),
                    filename: "./src/main.rs".into(),
                    line: 42
                },
                Frame {
                    name: "main".into(),
                    filename: String::new(),
                    line: 0
                },
            ]
        );
        let stack = Stack::from_frames(frames);
        assert_eq!(stack.frames()[0].line, 42);
    }
}
