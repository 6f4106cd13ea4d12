//! The out-of-memory report: PyTorch's message, then where the memory is and
//! what to try.
//!
//! A policy that runs out fills an [`OomReport`] from its counters; whoever shows
//! it attaches an [`OomBreakdown`] built from the blocks
//! ([`crate::DeviceAllocator::oom_breakdown`]); [`describe`] turns the report into the text `cachalot replay --capacity`
//! prints, and [`advice`] gives the suggestions on their own.

use std::fmt::{self, Write};

use crate::config::{AllocatorConfig, PolicyKind};
use crate::error::{format_size, OomBreakdown, OomReport, SizeBucket};
use crate::snapshot::{BlockState, MemorySnapshot};

/// Upper bounds of the size buckets of [`OomBreakdown::live_by_size`]: the
/// small pool (1 MiB), then steps of 8x.
pub const BUCKET_BOUNDS: [u64; 6] = [1 << 20, 8 << 20, 64 << 20, 512 << 20, 4 << 30, u64::MAX];

impl OomBreakdown {
    /// The breakdown of an allocator's state (its snapshot at the failure).
    pub fn from_snapshot(snapshot: &MemorySnapshot) -> OomBreakdown {
        let mut live_by_size: Vec<SizeBucket> = BUCKET_BOUNDS
            .iter()
            .map(|&max_size| SizeBucket {
                max_size,
                ..SizeBucket::default()
            })
            .collect();
        let mut breakdown = OomBreakdown {
            segments: snapshot.segments.len(),
            ..OomBreakdown::default()
        };
        for segment in &snapshot.segments {
            let has_active = segment
                .blocks
                .iter()
                .any(|b| b.state != BlockState::Inactive);
            for block in &segment.blocks {
                match block.state {
                    BlockState::Inactive => {
                        breakdown.largest_free_block = breakdown.largest_free_block.max(block.size);
                        if has_active && !segment.is_expandable {
                            breakdown.inactive_split_bytes += block.size;
                        }
                    }
                    BlockState::ActiveAllocated | BlockState::ActivePendingFree => {
                        let bucket = BUCKET_BOUNDS.iter().position(|&max| block.size <= max);
                        if let Some(bucket) = bucket.and_then(|i| live_by_size.get_mut(i)) {
                            bucket.count += 1;
                            bucket.bytes += block.size;
                        }
                    }
                }
            }
        }
        live_by_size.retain(|b| b.count > 0);
        breakdown.live_by_size = live_by_size;
        breakdown
    }
}

/// One suggestion for getting past an out-of-memory error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Advice {
    /// Much reserved memory is free but in pieces: a policy that fragments
    /// less would fit the request.
    Fragmentation {
        /// Reserved bytes no allocation uses.
        reserved_unallocated: u64,
        /// The largest free block, when the report has a breakdown.
        largest_free_block: Option<u64>,
    },
    /// The memory fraction, not the device, is the limit.
    MemoryFraction {
        /// Bytes the fraction allows.
        allowed: u64,
        /// The device's total memory.
        capacity: u64,
    },
    /// Live allocations themselves fill the device: the program needs less memory.
    LiveMemory {
        /// Bytes in allocated blocks.
        allocated: u64,
    },
}

impl fmt::Display for Advice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Advice::Fragmentation { reserved_unallocated, largest_free_block } => {
                write!(f, "{} is reserved but unallocated", format_size(reserved_unallocated))?;
                if let Some(largest) = largest_free_block {
                    write!(f, " and the largest free block is {}", format_size(largest))?;
                }
                f.write_str(
                    ": memory is fragmented. Try policy:cachalot or expandable_segments:True in \
                     PYTORCH_CUDA_ALLOC_CONF.",
                )
            }
            Advice::MemoryFraction { allowed, capacity } => write!(
                f,
                "the memory fraction allows only {} of the device's {}: raise it \
                 (set_memory_fraction / per_process_memory_fraction) if nothing else shares the device.",
                format_size(allowed),
                format_size(capacity),
            ),
            Advice::LiveMemory { allocated } => write!(
                f,
                "{} is held by live allocations: free tensors sooner, or use smaller batches or \
                 activation checkpointing.",
                format_size(allocated),
            ),
        }
    }
}

/// The suggestions that fit `report`, most useful first.
pub fn advice(report: &OomReport) -> Vec<Advice> {
    let expandable = AllocatorConfig::parse(&report.config).is_ok_and(|c| c.expandable_segments);
    let already_packed = expandable || report.policy == PolicyKind::Cachalot;
    let unallocated = report.reserved_unallocated();
    let mut out = Vec::new();
    let fragmented = unallocated >= report.requested && unallocated * 8 >= report.reserved;
    if fragmented && !already_packed {
        out.push(Advice::Fragmentation {
            reserved_unallocated: unallocated,
            largest_free_block: report.breakdown.as_ref().map(|b| b.largest_free_block),
        });
    }
    if let Some(allowed) = report.allowed.filter(|&a| a < report.capacity) {
        out.push(Advice::MemoryFraction {
            allowed,
            capacity: report.capacity,
        });
    }
    let limit = report.allowed.unwrap_or(report.capacity);
    if report.allocated.saturating_add(report.requested) > limit.saturating_mul(3) / 4 {
        out.push(Advice::LiveMemory {
            allocated: report.allocated,
        });
    }
    out
}

/// PyTorch's message, the breakdown (when attached) and the advice, as lines of
/// text.
pub fn describe(report: &OomReport) -> String {
    let mut out = format!("{report}\n");
    let config = if report.config.is_empty() {
        "(defaults)"
    } else {
        report.config.as_str()
    };
    let breakdown = report.breakdown.as_ref();
    let reserved = match breakdown {
        Some(b) => format!(
            "{} in {} segments",
            format_size(report.reserved),
            b.segments
        ),
        None => format_size(report.reserved),
    };
    let mut rows = vec![
        ("requested:", format_size(report.requested)),
        ("reserved:", reserved),
        ("allocated:", format_size(report.allocated)),
        (
            "reserved but unallocated:",
            format_size(report.reserved_unallocated()),
        ),
    ];
    if let Some(b) = breakdown {
        rows.push((
            "of which non-releasable:",
            format_size(b.inactive_split_bytes),
        ));
        rows.push(("largest free block:", format_size(b.largest_free_block)));
    }
    rows.push((
        "configuration:",
        format!("{config}, {} policy", report.policy),
    ));
    // Writing to a String cannot fail.
    for (label, value) in rows {
        let _ = writeln!(out, "  {label:<29}{value}");
    }
    let live = breakdown.into_iter().flat_map(|b| &b.live_by_size);
    for (i, bucket) in live.enumerate() {
        if i == 0 {
            let _ = writeln!(out, "  live allocations by size:");
        }
        let bound = if bucket.max_size == u64::MAX {
            "larger".to_string()
        } else {
            format!("<= {}", format_size(bucket.max_size))
        };
        let _ = writeln!(
            out,
            "    {bound:>14}: {:>7} allocations, {}",
            bucket.count,
            format_size(bucket.bytes)
        );
    }
    for (i, a) in advice(report).iter().enumerate() {
        let _ = writeln!(out, "  advice {}: {a}", i + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StreamId;
    use crate::snapshot::{BlockInfo, SegmentInfo};

    fn block(address: u64, size: u64, state: BlockState) -> BlockInfo {
        BlockInfo {
            address,
            size,
            requested_size: if state == BlockState::Inactive {
                0
            } else {
                size
            },
            state,
        }
    }

    fn segment(address: u64, blocks: Vec<BlockInfo>) -> SegmentInfo {
        let total_size = blocks.iter().map(|b| b.size).sum();
        SegmentInfo {
            device: 0,
            address,
            total_size,
            stream: StreamId(0),
            is_small: false,
            is_expandable: false,
            pool_id: crate::private_pool::PoolId::DEFAULT,
            blocks,
        }
    }

    /// Two 20 MiB segments, each with a 2 MiB allocation and 18 MiB free, and a
    /// 2 MiB small segment with one 512-byte allocation.
    fn fragmented() -> MemorySnapshot {
        let mib = 1 << 20;
        let mut small = segment(
            0,
            vec![
                block(0, 512, BlockState::ActiveAllocated),
                block(512, 2 * mib - 512, BlockState::Inactive),
            ],
        );
        small.is_small = true;
        MemorySnapshot {
            segments: vec![
                small,
                segment(
                    100 * mib,
                    vec![
                        block(100 * mib, 2 * mib, BlockState::ActiveAllocated),
                        block(102 * mib, 18 * mib, BlockState::Inactive),
                    ],
                ),
                segment(
                    200 * mib,
                    vec![
                        block(200 * mib, 18 * mib, BlockState::Inactive),
                        block(218 * mib, 2 * mib, BlockState::ActivePendingFree),
                    ],
                ),
            ],
        }
    }

    #[test]
    fn breakdown_buckets_live_blocks_and_finds_the_largest_hole() {
        let b = OomBreakdown::from_snapshot(&fragmented());
        assert_eq!(b.segments, 3);
        assert_eq!(b.largest_free_block, 18 << 20);
        assert_eq!(b.inactive_split_bytes, (36 << 20) + (2 << 20) - 512);
        assert_eq!(
            b.live_by_size,
            [
                SizeBucket {
                    max_size: 1 << 20,
                    count: 1,
                    bytes: 512
                },
                SizeBucket {
                    max_size: 8 << 20,
                    count: 2,
                    bytes: 4 << 20
                },
            ]
        );
    }

    fn report(config: &str) -> OomReport {
        OomReport {
            requested: 30 << 20,
            alloc_size: 30 << 20,
            capacity: 64 << 20,
            device_free: 2 << 20,
            allocated: (4 << 20) + 512,
            reserved: 42 << 20,
            config: config.to_string(),
            ..OomReport::default()
        }
        .with_breakdown(OomBreakdown::from_snapshot(&fragmented()))
    }

    #[test]
    fn fragmentation_advice_unless_already_packed() {
        let r = report("");
        let a = advice(&r);
        assert_eq!(
            a,
            [Advice::Fragmentation {
                reserved_unallocated: (38 << 20) - 512,
                largest_free_block: Some(18 << 20)
            }]
        );
        assert!(advice(&report("expandable_segments:True")).is_empty());
        let cachalot = OomReport {
            policy: PolicyKind::Cachalot,
            ..report("")
        };
        assert!(advice(&cachalot).is_empty());
    }

    #[test]
    fn the_cachalot_policy_is_suggested_only_under_the_pytorch_policy() {
        let pytorch = describe(&report(""));
        assert!(pytorch.contains("(or policy:cachalot)"), "{pytorch}");
        assert!(pytorch.contains("(defaults), pytorch policy"), "{pytorch}");
        let cachalot = describe(&OomReport {
            policy: PolicyKind::Cachalot,
            ..report("")
        });
        assert!(!cachalot.contains("policy:cachalot"), "{cachalot}");
        assert!(!cachalot.contains("expandable_segments"), "{cachalot}");
        assert!(
            cachalot.contains("(defaults), cachalot policy"),
            "{cachalot}"
        );
    }

    #[test]
    fn fraction_and_live_memory_advice() {
        let mut r = report("");
        r.allowed = Some(16 << 20);
        r.allocated = 14 << 20;
        r.reserved = 16 << 20;
        let a = advice(&r);
        assert!(
            a.contains(&Advice::MemoryFraction {
                allowed: 16 << 20,
                capacity: 64 << 20
            }),
            "{a:?}"
        );
        assert!(
            a.contains(&Advice::LiveMemory {
                allocated: 14 << 20
            }),
            "{a:?}"
        );
        assert!(
            !a.iter().any(|x| matches!(x, Advice::Fragmentation { .. })),
            "{a:?}"
        );
    }

    #[test]
    fn describe_shows_message_breakdown_and_advice() {
        let text = describe(&report("garbage_collection_threshold:0.6"));
        assert!(
            text.starts_with("CUDA out of memory. Tried to allocate 30.00 MiB."),
            "{text}"
        );
        assert!(
            text.contains("largest free block:          18.00 MiB"),
            "{text}"
        );
        assert!(
            text.contains("<= 8.00 MiB:       2 allocations, 4.00 MiB"),
            "{text}"
        );
        assert!(
            text.contains("configuration:               garbage_collection_threshold:0.6"),
            "{text}"
        );
        assert!(
            text.contains("advice 1: 38.00 MiB is reserved but unallocated"),
            "{text}"
        );
    }

    #[test]
    fn without_a_breakdown_no_figure_is_invented() {
        let bare = OomReport {
            breakdown: None,
            ..report("")
        };
        let text = describe(&bare);
        assert!(
            text.contains("reserved:                    42.00 MiB\n"),
            "{text}"
        );
        for absent in [
            "largest free block",
            "non-releasable",
            "live allocations",
            " in 0 segments",
        ] {
            assert!(!text.contains(absent), "{absent} in {text}");
        }
        assert!(
            text.contains("advice 1: 38.00 MiB is reserved but unallocated: memory is fragmented"),
            "{text}"
        );
    }
}
