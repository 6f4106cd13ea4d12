//! The progress bars of long replays and searches: drawn on stderr only when
//! stdout is a terminal (and, for a replay, the input is long enough to be
//! worth watching).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Inputs shorter than this many ops replay too fast to need a bar.
const LONG_INPUT: u64 = 1 << 20;

/// A bar for `len` ops labelled `label`; hidden for short inputs and when stdout
/// is not a terminal.
pub(crate) fn bar(len: u64, label: &str) -> ProgressBar {
    if len < LONG_INPUT {
        return ProgressBar::hidden();
    }
    counting(len, label, "allocator calls")
}

/// A counter of the bytes of `name` read so far, with the time taken, for a
/// file large enough to take seconds; hidden otherwise and when stdout is
/// not a terminal.
pub(crate) fn reading(size: u64, name: &str) -> ProgressBar {
    if size < LONG_FILE || !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    let style = ProgressStyle::with_template("{spinner} reading {prefix}: {bytes} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    bar.set_style(style);
    bar.set_prefix(name.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// Files smaller than this many bytes read too fast to need a counter.
const LONG_FILE: u64 = 16 << 20;

/// A bar for `len` steps of a search labelled `label`, drawn whenever stdout
/// is a terminal.
pub(crate) fn steps(len: u64, label: &str) -> ProgressBar {
    counting(len, label, "configurations")
}

/// A bar of `len` `things` labelled `label`; hidden when stdout is not a
/// terminal.
fn counting(len: u64, label: &str, things: &str) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let template = format!("{{prefix}} [{{bar:40}}] {{pos}}/{{len}} {things} ({{eta}})");
    let style = ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    bar
}
