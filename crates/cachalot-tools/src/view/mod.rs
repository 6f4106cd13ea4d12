//! The memory page: one self-contained HTML file (inline script, style and
//! data; no network) that shows a run's memory, exact at any length.
//!
//! * Active memory over time: every allocation, or in a run of more than
//!   [`MAX_DRAWN`] the largest of each of [`STRETCHES`] stretches and of those
//!   live at the peak, each as a band, stacked in allocation order, with
//!   details on hover; behind them, all active memory as an area; reserved
//!   memory as a line.
//! * The peak of active memory marked, with the largest allocations live at it.
//! * The segment and page map at a time chosen with a slider: each segment (or
//!   mapped range) as a row of 2 MiB pages shaded by how full they are.
//!
//! A run of any length fits: the events are summarized in at most [`COLUMNS`]
//! columns ([`Timeline::columns`]), each with the most memory held inside it and
//! what was held after its last event, so the peaks drawn and printed are the
//! exact ones; up to [`COLUMNS`] events each column is one event. The slider
//! moves from column end to column end, where every figure it shows is exact.
//! Times are the recorded clock's. The page says when it draws only the
//! largest allocations.
//!
//! When drawing is done the page sets `data-drawn-allocations`,
//! `data-total-allocations`, `data-peak-active`, `data-peak-reserved`,
//! `data-peak-allocations`, `data-drawn-segments` and `data-render-ms` on
//! `<body>`, which the browser test reads.

pub mod timeline;

use serde::Serialize;

use timeline::{AllocSpan, STILL_LIVE};
pub use timeline::{Timeline, TimelineRecorder};

const TEMPLATE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

/// The most allocations drawn one by one (the largest); the others show in the
/// area of all active memory behind them.
pub const MAX_DRAWN: usize = 20_000;
/// The stretches of events each of which has its largest allocations drawn.
pub const STRETCHES: usize = 500;
/// The most columns the events are summarized in.
pub const COLUMNS: usize = 1 << 15;
/// The most allocations listed in the table of the peak.
pub const PEAK_ROWS: usize = 200;

/// Words shown above the charts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageInfo {
    /// The headline (usually the trace's file name).
    pub title: String,
    /// A line under it (policy, configuration, source).
    pub subtitle: String,
}

/// The page's data, flattened into number arrays to keep the file small.
#[derive(Serialize)]
struct PageData<'a> {
    title: &'a str,
    subtitle: &'a str,
    events: usize,
    /// Allocations in the run (drawn or not).
    allocations: usize,
    /// `[last event, microseconds since the first event, active max, active at
    /// the end, reserved max, reserved at the end]` per column.
    columns: Vec<u64>,
    /// `[addr, size, stream, start, end, stack]` per drawn allocation, in
    /// allocation order; `end` and `stack` are -1 when absent.
    allocs: Vec<i64>,
    /// `[addr, size, start, end, mapped]` per chunk.
    chunks: Vec<i64>,
    peak_index: u32,
    peak_bytes: u64,
    peak_reserved: u64,
    /// Allocations live at the peak.
    peak_live: usize,
    /// The largest of them, as `allocs`.
    peak_rows: Vec<i64>,
    ooms: &'a [u32],
    stacks: &'a [Vec<String>],
}

fn end_or_minus_one(end: u32) -> i64 {
    if end == STILL_LIVE {
        -1
    } else {
        end.into()
    }
}

fn alloc_numbers(a: &AllocSpan) -> [i64; 6] {
    [
        a.addr as i64,
        a.size as i64,
        a.stream as i64,
        a.start.into(),
        end_or_minus_one(a.end),
        a.stack.map_or(-1, i64::from),
    ]
}

fn page_data<'a>(t: &'a Timeline, info: &'a PageInfo) -> PageData<'a> {
    let t0 = t.times_us.first().copied().unwrap_or(0);
    let columns = t.columns(COLUMNS).into_iter().flat_map(|c| {
        [
            u64::from(c.last),
            c.time_us.saturating_sub(t0),
            c.active_max,
            c.active_end,
            c.reserved_max,
            c.reserved_end,
        ]
    });
    let drawn = t.drawn(MAX_DRAWN, STRETCHES);
    let allocs = drawn.iter().flat_map(|&k| alloc_numbers(&t.allocs[k]));
    let chunks = t.chunks.iter().flat_map(|c| {
        [
            c.addr as i64,
            c.size as i64,
            c.start.into(),
            end_or_minus_one(c.end),
            i64::from(c.mapped),
        ]
    });
    let mut at_peak: Vec<&AllocSpan> = t.live_at(t.peak_index).collect();
    let peak_live = at_peak.len();
    at_peak.sort_by_key(|a| std::cmp::Reverse(a.size));
    PageData {
        title: &info.title,
        subtitle: &info.subtitle,
        events: t.times_us.len(),
        allocations: t.allocs.len(),
        columns: columns.collect(),
        allocs: allocs.collect(),
        chunks: chunks.collect(),
        peak_index: t.peak_index,
        peak_bytes: t.peak_bytes,
        peak_reserved: t.peak_reserved(),
        peak_live,
        peak_rows: at_peak
            .into_iter()
            .take(PEAK_ROWS)
            .flat_map(alloc_numbers)
            .collect(),
        ooms: &t.ooms,
        stacks: &t.stacks,
    }
}

/// Escapes text for HTML element content.
fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The page for `timeline`.
pub fn render(timeline: &Timeline, info: &PageInfo) -> String {
    // serde_json cannot fail on these plain types; fall back to no data if it did.
    let json =
        serde_json::to_string(&page_data(timeline, info)).unwrap_or_else(|_| "null".to_string());
    // Inside <script>, "</" ends the element and "<!--" can hide its end:
    // no '<' (nor '>' or '&') is left as itself. They only occur in strings,
    // where JSON's escape reads back the same.
    let json = json
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    let title = html_escape(&info.title);
    fill(
        TEMPLATE,
        &[
            ("TITLE", &title),
            ("STYLE", STYLE),
            ("SCRIPT", SCRIPT),
            ("DATA", &json),
        ],
    )
}

/// `template` with each `{{KEY}}` of `values` replaced, in one pass: what a
/// value holds is never read as a placeholder.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out =
        String::with_capacity(template.len() + values.iter().map(|v| v.1.len()).sum::<usize>());
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let found = values
            .iter()
            .find(|(key, _)| after.starts_with(key) && after[key.len()..].starts_with("}}"));
        match found {
            Some((key, value)) => {
                out.push_str(value);
                rest = &after[key.len() + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot_core::backend::StreamId;
    use cachalot_core::event::{Action, TraceEvent};

    #[test]
    fn page_is_self_contained_and_embeds_the_data() {
        let ev = |action, addr, size| TraceEvent {
            time_us: 5000,
            action,
            addr,
            size,
            stream: StreamId(0),
        };
        let t = Timeline::from_events(&[
            ev(Action::SegmentAlloc, 0, 2 << 20),
            ev(Action::Alloc, 0, 512),
        ]);
        let info = PageInfo {
            title: "a <b> trace".into(),
            subtitle: "x</script>y".into(),
        };
        let html = render(&t, &info);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<title>a &lt;b&gt; trace</title>"));
        assert!(
            html.contains("\"allocs\":[0,512,0,1,-1,-1]"),
            "flattened allocations"
        );
        assert!(
            html.contains("x\\u003c/script\\u003ey"),
            "data cannot close the script element"
        );
        assert_eq!(
            html.matches("</script>").count(),
            2,
            "one data and one code element"
        );
        for remote in ["http://", "https://", "src=", "@import"] {
            assert!(!html.contains(remote), "no network: found {remote}");
        }
        assert!(!html.contains("{{"), "every placeholder filled");
    }

    #[test]
    fn no_name_can_hide_the_end_of_the_data_or_fill_a_placeholder() {
        let t = Timeline::from_events(&[]);
        let info = PageInfo {
            title: "<!--<script>x.csv {{SCRIPT}}".into(),
            subtitle: "<!--<script>".into(),
        };
        let html = render(&t, &info);
        let data = html
            .split("<script type=\"application/json\" id=\"data\">")
            .nth(1)
            .and_then(|rest| rest.split("</script>").next())
            .expect("the data element");
        assert!(!data.contains('<'), "{data}");
        assert!(html.contains("<title>&lt;!--&lt;script&gt;x.csv {{SCRIPT}}</title>"));
        assert_eq!(html.matches("</script>").count(), 2);
    }
}
