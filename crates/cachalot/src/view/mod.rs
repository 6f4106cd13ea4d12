//! The memory page: one self-contained HTML file (inline script, style and
//! data; no network) that shows a run's memory.
//!
//! * Active memory over time, stacked by allocation (each allocation a band,
//!   in allocation order), with details on hover; reserved memory as a line.
//! * The peak of active memory marked, with the allocations live at it.
//! * The segment and page map at a time chosen with a slider: each segment (or
//!   mapped range) as a row of 2 MiB pages shaded by how full they are.
//!
//! The page computes each band's outline once at load and draws on canvases;
//! outlines are thinned to one point per pixel column, so traces of tens of
//! thousands of events stay responsive. When drawing is done it sets
//! `data-drawn-allocations` (and `data-drawn-segments`) on `<body>`, which the
//! browser test reads.

pub mod timeline;

use serde::Serialize;

pub use timeline::Timeline;
use timeline::STILL_LIVE;

const TEMPLATE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

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
    /// Microseconds since the first event, per event.
    times: Vec<u64>,
    /// `[addr, size, stream, start, end, stack]` per allocation; `end` and
    /// `stack` are -1 when absent.
    allocs: Vec<i64>,
    /// `[addr, size, start, end, mapped]` per chunk.
    chunks: Vec<i64>,
    /// `[event index, reserved bytes]` per change.
    reserved: Vec<u64>,
    peak_index: u32,
    peak_bytes: u64,
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

fn page_data<'a>(t: &'a Timeline, info: &'a PageInfo) -> PageData<'a> {
    let t0 = t.times_us.first().copied().unwrap_or(0);
    let allocs = t.allocs.iter().flat_map(|a| {
        let stack = a.stack.map_or(-1, i64::from);
        [
            a.addr as i64,
            a.size as i64,
            a.stream as i64,
            a.start.into(),
            end_or_minus_one(a.end),
            stack,
        ]
    });
    let chunks = t.chunks.iter().flat_map(|c| {
        [
            c.addr as i64,
            c.size as i64,
            c.start.into(),
            end_or_minus_one(c.end),
            i64::from(c.mapped),
        ]
    });
    PageData {
        title: &info.title,
        subtitle: &info.subtitle,
        events: t.times_us.len(),
        times: t.times_us.iter().map(|&x| x.saturating_sub(t0)).collect(),
        allocs: allocs.collect(),
        chunks: chunks.collect(),
        reserved: t
            .reserved
            .iter()
            .flat_map(|&(i, r)| [u64::from(i), r])
            .collect(),
        peak_index: t.peak_index,
        peak_bytes: t.peak_bytes,
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
    // Inside <script>, only "</" can end the element early.
    let json = json.replace("</", "<\\/");
    TEMPLATE
        .replace("{{TITLE}}", &html_escape(&info.title))
        .replace("{{STYLE}}", STYLE)
        .replace("{{SCRIPT}}", SCRIPT)
        .replace("{{DATA}}", &json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Action, TraceEvent};
    use crate::StreamId;

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
            html.contains("x<\\/script>y"),
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
}
