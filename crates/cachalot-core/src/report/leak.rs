//! Leak checks: allocations live at the end of a scope that were not live at
//! its start, grouped by where they were made when history records backtraces.
//!
//! ```
//! use cachalot_core::history::{History, HistoryConfig};
//! use cachalot_core::event::{Action, Observer, TraceEvent};
//! use cachalot_core::report::leak::LeakCheck;
//! use cachalot_core::StreamId;
//!
//! let history = History::new(HistoryConfig::default());
//! let alloc = |addr| TraceEvent { time_us: 0, action: Action::Alloc, addr, size: 256, stream: StreamId(0) };
//! history.on_event(&alloc(0x1000));
//! let check = LeakCheck::from_history(&history);
//! history.on_event(&alloc(0x2000)); // made in the scope, never freed
//! let report = check.finish_history(&history);
//! assert_eq!(report.leaks.len(), 1);
//! assert_eq!(report.leaks[0].addr, 0x2000);
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

use crate::backend::{DevicePtr, StreamId};
use crate::error::format_size;
use crate::history::{Frame, History, Stack};
use crate::snapshot::{BlockState, MemorySnapshot};

/// A baseline of live allocations, taken at the start of a scope.
#[derive(Clone, Debug)]
pub struct LeakCheck {
    baseline: Baseline,
}

#[derive(Clone, Debug)]
enum Baseline {
    /// Sequence numbers of the `alloc` events of live allocations.
    History(HashSet<u64>),
    /// (address, size, requested size) of allocated blocks.
    Snapshot(HashSet<(DevicePtr, u64, u64)>),
}

/// An allocation made in the scope and still live (not freed by the caller).
#[derive(Clone, Debug)]
pub struct Leak {
    /// Its address.
    pub addr: DevicePtr,
    /// Requested bytes.
    pub size: u64,
    /// Its stream, when known.
    pub stream: Option<StreamId>,
    /// Where it was made, when history records backtraces.
    pub stack: Option<Arc<Stack>>,
}

/// Leaks sharing one allocation stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeakGroup {
    /// The stack (empty when not recorded).
    pub frames: Vec<Frame>,
    /// Leaked allocations.
    pub count: usize,
    /// Their requested bytes.
    pub bytes: u64,
}

/// What a [`LeakCheck`] found.
#[derive(Clone, Debug)]
pub struct LeakReport {
    /// Every leaked allocation, by address.
    pub leaks: Vec<Leak>,
    /// The leaks grouped by stack, most bytes first.
    pub groups: Vec<LeakGroup>,
}

impl LeakCheck {
    /// A baseline from a history recorder (installed before the scope starts):
    /// precise even when an address is freed and reused inside the scope, and
    /// able to group leaks by stack.
    pub fn from_history(history: &History) -> LeakCheck {
        let live = history
            .live_allocations()
            .into_iter()
            .filter(|a| !a.free_requested);
        LeakCheck {
            baseline: Baseline::History(live.map(|a| a.seq).collect()),
        }
    }

    /// A baseline from a snapshot: works without recording, but an allocation
    /// freed and remade at the same address with the same sizes looks unchanged.
    pub fn from_snapshot(snapshot: &MemorySnapshot) -> LeakCheck {
        LeakCheck {
            baseline: Baseline::Snapshot(allocated_blocks(snapshot).collect()),
        }
    }

    /// The allocations live in `history` now that were not in the baseline.
    /// A baseline taken from a snapshot compares by address and sizes.
    pub fn finish_history(&self, history: &History) -> LeakReport {
        let live = history
            .live_allocations()
            .into_iter()
            .filter(|a| !a.free_requested);
        let leaks = live
            .filter(|a| match &self.baseline {
                Baseline::History(seqs) => !seqs.contains(&a.seq),
                Baseline::Snapshot(blocks) => !blocks
                    .iter()
                    .any(|&(addr, _, req)| addr == a.addr && req == a.size),
            })
            .map(|a| Leak {
                addr: a.addr,
                size: a.size,
                stream: Some(a.stream),
                stack: a.stack,
            })
            .collect();
        LeakReport::new(leaks)
    }

    /// The allocated blocks of `snapshot` that were not in the baseline.
    /// A baseline taken from a history compares by address only, so prefer
    /// [`LeakCheck::finish_history`] with it.
    pub fn finish_snapshot(&self, snapshot: &MemorySnapshot) -> LeakReport {
        let leaks = allocated_blocks(snapshot)
            .filter(|key| match &self.baseline {
                Baseline::Snapshot(blocks) => !blocks.contains(key),
                Baseline::History(_) => true,
            })
            .map(|(addr, _, requested)| Leak {
                addr,
                size: requested,
                stream: None,
                stack: None,
            })
            .collect();
        LeakReport::new(leaks)
    }
}

fn allocated_blocks(snapshot: &MemorySnapshot) -> impl Iterator<Item = (DevicePtr, u64, u64)> + '_ {
    snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| (b.address, b.size, b.requested_size))
}

impl LeakReport {
    fn new(mut leaks: Vec<Leak>) -> LeakReport {
        leaks.sort_by_key(|l| l.addr);
        let mut by_stack: BTreeMap<Vec<Frame>, LeakGroup> = BTreeMap::new();
        for leak in &leaks {
            let frames = leak
                .stack
                .as_ref()
                .map(|s| s.frames().to_vec())
                .unwrap_or_default();
            let group = by_stack.entry(frames.clone()).or_insert(LeakGroup {
                frames,
                count: 0,
                bytes: 0,
            });
            group.count += 1;
            group.bytes += leak.size;
        }
        let mut groups: Vec<LeakGroup> = by_stack.into_values().collect();
        groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
        LeakReport { leaks, groups }
    }

    /// Whether nothing leaked.
    pub fn is_empty(&self) -> bool {
        self.leaks.is_empty()
    }

    /// Requested bytes leaked in all.
    pub fn bytes(&self) -> u64 {
        self.leaks.iter().map(|l| l.size).sum()
    }
}

/// How many frames of each group's stack the report prints.
const SHOWN_FRAMES: usize = 8;

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return writeln!(f, "no leaks: every allocation made in the scope was freed");
        }
        writeln!(
            f,
            "{} allocations ({}) made in the scope are still live:",
            self.leaks.len(),
            format_size(self.bytes())
        )?;
        for g in &self.groups {
            writeln!(
                f,
                "  {} allocations, {}, allocated at:",
                g.count,
                format_size(g.bytes)
            )?;
            if g.frames.is_empty() {
                writeln!(f, "    (no backtrace: record history with backtraces on)")?;
            }
            for frame in g.frames.iter().take(SHOWN_FRAMES) {
                writeln!(f, "    {} ({}:{})", frame.name, frame.filename, frame.line)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Action, Observer, TraceEvent};
    use crate::history::HistoryConfig;
    use crate::snapshot::{BlockInfo, SegmentInfo};

    fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            time_us: 0,
            action,
            addr,
            size,
            stream: StreamId(0),
        }
    }

    #[test]
    fn history_check_sees_a_reused_address_as_new() {
        let h = History::new(HistoryConfig::default());
        h.on_event(&ev(Action::Alloc, 0x10, 100));
        h.on_event(&ev(Action::Alloc, 0x20, 50));
        let check = LeakCheck::from_history(&h);
        h.on_event(&ev(Action::FreeRequested, 0x10, 100));
        h.on_event(&ev(Action::FreeCompleted, 0x10, 100));
        h.on_event(&ev(Action::Alloc, 0x10, 100)); // same address, new allocation
        h.on_event(&ev(Action::Alloc, 0x30, 7));
        h.on_event(&ev(Action::FreeRequested, 0x30, 7)); // freed by the caller: not a leak
        let report = check.finish_history(&h);
        let addrs: Vec<u64> = report.leaks.iter().map(|l| l.addr).collect();
        assert_eq!(addrs, [0x10]);
        assert_eq!(report.bytes(), 100);
        assert_eq!(
            report.groups,
            [LeakGroup {
                frames: vec![],
                count: 1,
                bytes: 100
            }]
        );
        assert!(report.to_string().contains("1 allocations (100 bytes)"));
    }

    #[inline(never)]
    fn leaky_site(h: &History, addr: u64) {
        h.on_event(&ev(Action::Alloc, addr, 1 << 20));
    }

    #[test]
    fn leaks_group_by_backtrace() {
        let h = History::new(HistoryConfig {
            backtraces: true,
            ..HistoryConfig::default()
        });
        let check = LeakCheck::from_history(&h);
        for addr in [0x100, 0x200] {
            leaky_site(&h, addr);
        }
        h.on_event(&ev(Action::Alloc, 0x300, 10));
        let report = check.finish_history(&h);
        assert_eq!(report.leaks.len(), 3);
        assert_eq!(report.groups.len(), 2, "{:?}", report.groups);
        assert_eq!(
            (report.groups[0].count, report.groups[0].bytes),
            (2, 2 << 20)
        );
        assert!(report.groups[0]
            .frames
            .iter()
            .any(|f| f.name.contains("leaky_site")));
        assert!(report.to_string().contains("leaky_site"));
    }

    fn snapshot(blocks: &[(u64, u64, BlockState)]) -> MemorySnapshot {
        let blocks: Vec<BlockInfo> = blocks
            .iter()
            .map(|&(address, size, state)| BlockInfo {
                address,
                size,
                requested_size: size,
                state,
            })
            .collect();
        let total_size = blocks.iter().map(|b| b.size).sum();
        let segment = SegmentInfo {
            device: 0,
            address: 0,
            total_size,
            stream: StreamId(0),
            is_small: true,
            is_expandable: false,
            pool_id: crate::private_pool::PoolId::DEFAULT,
            blocks,
        };
        MemorySnapshot {
            segments: vec![segment],
        }
    }

    #[test]
    fn snapshot_check_reports_new_allocated_blocks() {
        let before = snapshot(&[
            (0, 512, BlockState::ActiveAllocated),
            (512, 1536, BlockState::Inactive),
        ]);
        let after = snapshot(&[
            (0, 512, BlockState::ActiveAllocated),
            (512, 512, BlockState::ActiveAllocated),
            (1024, 512, BlockState::ActivePendingFree),
            (1536, 512, BlockState::Inactive),
        ]);
        let check = LeakCheck::from_snapshot(&before);
        let report = check.finish_snapshot(&after);
        assert_eq!(report.leaks.len(), 1);
        assert_eq!((report.leaks[0].addr, report.leaks[0].size), (512, 512));
        assert!(check.finish_snapshot(&before).is_empty());
        assert!(check
            .finish_snapshot(&before)
            .to_string()
            .starts_with("no leaks"));
    }
}
