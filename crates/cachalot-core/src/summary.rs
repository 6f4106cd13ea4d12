//! `memory_summary()`: the statistics as a readable table, laid out like
//! PyTorch's `torch.cuda.memory_summary()`.
//!
//! The table is 75 characters wide between `|` borders. Each statistic family
//! gets a row for both pools and, unless abbreviated, one per pool; columns are
//! the current value, the peak, the total allocated and the total freed. Byte
//! cells step up from `B` to `KiB`, `MiB`, ... while the row's reference value
//! (the same column of the `all` row) is at least 768 KiB of the current unit;
//! count cells step up to `K` and `M` at 750,000. Both truncate, as PyTorch does.

use std::fmt::Write;

use crate::stats::{MemoryStats, Stat, StatArray, StatPool};

/// Width of the table between its `|` borders.
const WIDTH: usize = 75;

/// How a row's cells are written.
#[derive(Copy, Clone, Debug)]
enum Unit {
    Bytes,
    Count,
}

impl Unit {
    /// One cell: `value` scaled by the unit chosen for `reference`.
    fn cell(self, value: i64, reference: i64) -> String {
        match self {
            Unit::Bytes => scaled(
                value,
                reference,
                &["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"],
                1024,
                768 * 1024,
                6,
            ),
            Unit::Count => {
                let cell = scaled(value, reference, &[" ", "K", "M"], 1000, 750_000, 7);
                format!("{cell} ")
            }
        }
    }
}

/// Divides `value` by `step` for as long as the (also divided) `reference`
/// stays at or above `threshold`, then writes it right-aligned in `width`
/// followed by the unit.
fn scaled(
    mut value: i64,
    reference: i64,
    units: &[&str],
    step: i64,
    threshold: i64,
    width: usize,
) -> String {
    let mut reference = reference as f64;
    let mut unit = units[0];
    for next in &units[1..] {
        if reference < threshold as f64 {
            break;
        }
        unit = next;
        value = value.div_euclid(step);
        reference /= step as f64;
    }
    format!("{value:>width$} {unit}")
}

/// The statistic families with a per-pool breakdown, in table order.
fn pooled_rows(stats: &MemoryStats) -> [(&'static str, &StatArray, Unit); 9] {
    [
        ("Allocated memory", &stats.allocated_bytes, Unit::Bytes),
        ("Active memory", &stats.active_bytes, Unit::Bytes),
        ("Requested memory", &stats.requested_bytes, Unit::Bytes),
        ("GPU reserved memory", &stats.reserved_bytes, Unit::Bytes),
        (
            "Non-releasable memory",
            &stats.inactive_split_bytes,
            Unit::Bytes,
        ),
        ("Allocations", &stats.allocation, Unit::Count),
        ("Active allocs", &stats.active, Unit::Count),
        ("GPU reserved segments", &stats.segment, Unit::Count),
        ("Non-releasable allocs", &stats.inactive_split, Unit::Count),
    ]
}

/// One table row: a label and four cells, each scaled by `reference`'s column.
fn row(out: &mut String, label: &str, stat: &Stat, reference: &Stat, unit: Unit) {
    let cells = [
        unit.cell(stat.current, reference.current),
        unit.cell(stat.peak, reference.peak),
        unit.cell(stat.allocated, reference.allocated),
        unit.cell(stat.freed, reference.freed),
    ];
    line(out, &format!(" {label:<21} | {} ", cells.join(" | ")));
}

fn line(out: &mut String, body: &str) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "|{body:<WIDTH$}|");
}

fn rule(out: &mut String, c: char) {
    line(out, &c.to_string().repeat(WIDTH));
}

/// The statistics of `device` as PyTorch's `memory_summary()` table, with the
/// per-pool rows.
pub fn memory_summary(stats: &MemoryStats, device: usize) -> String {
    memory_summary_with(stats, device, false)
}

/// The statistics of `device` as a table; `abbreviated` leaves out the
/// per-pool rows, as PyTorch's `abbreviated=True` does.
pub fn memory_summary_with(stats: &MemoryStats, device: usize, abbreviated: bool) -> String {
    let mut out = String::new();
    rule(&mut out, '=');
    line(
        &mut out,
        &format!(
            "{:^WIDTH$}",
            format!("cachalot memory summary, device ID {device}")
        ),
    );
    rule(&mut out, '-');
    line(
        &mut out,
        &format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
    );
    rule(&mut out, '=');
    line(
        &mut out,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    );
    for (label, array, unit) in pooled_rows(stats) {
        rule(&mut out, '-');
        let all = array.get(StatPool::All);
        row(&mut out, label, all, all, unit);
        if !abbreviated {
            row(
                &mut out,
                "      from large pool",
                array.get(StatPool::Large),
                all,
                unit,
            );
            row(
                &mut out,
                "      from small pool",
                array.get(StatPool::Small),
                all,
                unit,
            );
        }
    }
    for (label, stat) in [
        ("Oversize allocations", &stats.oversize_allocations),
        ("Oversize GPU segments", &stats.oversize_segments),
    ] {
        rule(&mut out, '-');
        row(&mut out, label, stat, stat, Unit::Count);
    }
    rule(&mut out, '=');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stats after: a 3 MiB request (20 MiB large segment), a 512-byte request
    /// (2 MiB small segment), then the 3 MiB one freed.
    fn example() -> MemoryStats {
        let mut s = MemoryStats::new(None);
        for (small, block, req, seg) in [
            (false, 3 << 20, 3 << 20, 20 << 20),
            (true, 512, 500, 2 << 20),
        ] {
            s.segment.update(small, 1);
            s.reserved_bytes.update(small, seg);
            s.allocation.update(small, 1);
            s.active.update(small, 1);
            s.allocated_bytes.update(small, block);
            s.active_bytes.update(small, block);
            s.requested_bytes.update(small, req);
            s.inactive_split.update(small, 1);
            s.inactive_split_bytes.update(small, seg - block);
        }
        s.allocation.update(false, -1);
        s.active.update(false, -1);
        s.allocated_bytes.update(false, -(3 << 20));
        s.active_bytes.update(false, -(3 << 20));
        s.requested_bytes.update(false, -(3 << 20));
        s.inactive_split.update(false, -1);
        s.inactive_split_bytes.update(false, -(17 << 20));
        s.num_ooms = 1;
        s.num_alloc_retries = 2;
        s
    }

    #[test]
    fn table_matches_hand_computed_layout() {
        let expected = "\
|===========================================================================|
|                   cachalot memory summary, device ID 0                    |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 1            |        cudaMalloc retries: 2         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |    512 B   |   3072 KiB |   3072 KiB |   3072 KiB |
|       from large pool |      0 B   |   3072 KiB |   3072 KiB |   3072 KiB |
|       from small pool |    512 B   |      0 KiB |      0 KiB |      0 KiB |
|---------------------------------------------------------------------------|
| Active memory         |    512 B   |   3072 KiB |   3072 KiB |   3072 KiB |
|       from large pool |      0 B   |   3072 KiB |   3072 KiB |   3072 KiB |
|       from small pool |    512 B   |      0 KiB |      0 KiB |      0 KiB |
|---------------------------------------------------------------------------|
| Requested memory      |    500 B   |   3072 KiB |   3072 KiB |   3072 KiB |
|       from large pool |      0 B   |   3072 KiB |   3072 KiB |   3072 KiB |
|       from small pool |    500 B   |      0 KiB |      0 KiB |      0 KiB |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  22528 KiB |  22528 KiB |  22528 KiB |      0 B   |
|       from large pool |  20480 KiB |  20480 KiB |  20480 KiB |      0 B   |
|       from small pool |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |
|---------------------------------------------------------------------------|
| Non-releasable memory |   2047 KiB |  19455 KiB |  19455 KiB |  17408 KiB |
|       from large pool |      0 KiB |  17408 KiB |  17408 KiB |  17408 KiB |
|       from small pool |   2047 KiB |   2047 KiB |   2047 KiB |      0 KiB |
|---------------------------------------------------------------------------|
| Allocations           |       1    |       2    |       2    |       1    |
|       from large pool |       0    |       1    |       1    |       1    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| Active allocs         |       1    |       2    |       2    |       1    |
|       from large pool |       0    |       1    |       1    |       1    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| GPU reserved segments |       2    |       2    |       2    |       0    |
|       from large pool |       1    |       1    |       1    |       0    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       1    |       2    |       2    |       1    |
|       from large pool |       0    |       1    |       1    |       1    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| Oversize allocations  |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |       0    |       0    |       0    |       0    |
|===========================================================================|
";
        assert_eq!(memory_summary(&example(), 0), expected);
    }

    #[test]
    fn abbreviated_has_no_pool_rows() {
        let table = memory_summary_with(&example(), 3, true);
        assert!(!table.contains("from large pool"));
        assert!(table.contains("device ID 3"));
        assert_eq!(table.lines().count(), 6 + 9 * 2 + 2 * 2 + 1);
        assert!(table.lines().all(|l| l.chars().count() == WIDTH + 2));
    }

    #[test]
    fn units_step_up_with_the_reference_value() {
        assert_eq!(Unit::Bytes.cell(786_431, 786_431), "786431 B  ");
        assert_eq!(Unit::Bytes.cell(786_432, 786_432), "   768 KiB");
        assert_eq!(Unit::Bytes.cell(5 << 30, 5 << 30), "  5120 MiB");
        assert_eq!(Unit::Bytes.cell(1 << 40, 1 << 40), "  1024 GiB");
        assert_eq!(Unit::Count.cell(749_999, 749_999), " 749999   ");
        assert_eq!(Unit::Count.cell(750_000, 750_000), "    750 K ");
        assert_eq!(Unit::Count.cell(2_000_000_000, 2_000_000_000), "   2000 M ");
    }
}
