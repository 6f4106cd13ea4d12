//! The progress bar of long replays: drawn on stderr only when stdout is a
//! terminal and the input is long enough to be worth watching.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Inputs shorter than this many ops replay too fast to need a bar.
const LONG_INPUT: u64 = 1 << 20;

/// A bar for `len` ops labelled `label`; hidden for short inputs and when stdout
/// is not a terminal.
pub(crate) fn bar(len: u64, label: &str) -> ProgressBar {
    if len < LONG_INPUT || !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} ops ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    bar
}

/// A bar for `len` steps of a search labelled `label`, drawn whenever stdout
/// is a terminal.
pub(crate) fn steps(len: u64, label: &str) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let style =
        ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} configurations ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    bar
}
