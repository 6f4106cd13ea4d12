//! A stream's page budget: how many pages it may hold before it re-maps a
//! cached page instead of creating one, and whether it churns.
//!
//! The budget is `1 + cachalot_reuse_slack` (default 1.2) times the most pages
//! the stream ever had in use, and at least that peak plus
//! `cachalot_reuse_min_mb` (a small heap's slack is less than one large block;
//! 32 MiB is below the slack of every bundled trace, bert_dynamic's 17 pages
//! included). With the default no bundled recording reaches it: re-mapping
//! within its budget, a stream whose layout never repeats (a serving
//! recording) kept calling the driver pass after pass at 1.035 (see
//! `cachalot_reuse_slack` in the configuration).
//!
//! A stream that keeps re-mapping without its peak growing (a new shape at
//! every step: its layout never repeats, so the cached pages are never where
//! the next blocks land) is *churning*: once, since its peak last grew, it
//! has re-mapped [`CHURN_REMAPS`] times as many pages as it holds, over at least
//! [`CHURN_ALLOCATIONS`] allocations per page it holds (churn that lasts, not a
//! burst just past a peak), and at least one page per [`CHURN_RATE`]
//! allocations (a trickle of remaps is cheaper than the memory), its budget
//! rises by `cachalot_churn_slack` (default 0.15) until its large pool gives its
//! range back (`empty_cache` with no large block live), enough for most
//! layouts to stop moving. A single pass of a workload stays under the trigger,
//! so its reserved memory keeps the tight budget; a workload that repeats
//! settles with few or no driver calls. Replaying bert_dynamic pass after pass
//! with a reuse slack of 0.035, a churn slack of 0.10 still leaves 12 to 106
//! driver calls per pass of 16,800 operations, 0.12 about 100 to 130, 0.14 and
//! 0.15 none from the third pass (0.15: 1.1974 times its peak requested bytes).

use super::settings::StreamConfig;

/// How far (a fraction) reserved bytes may exceed the peak of active bytes
/// before idle segments are freed ahead of a new one (without virtual
/// memory), or of allocated bytes before cached pages are re-mapped instead
/// of new ones made, unless `cachalot_reuse_slack` is larger (with pages,
/// unless the stream churns or its pages in use leave no room).
pub(crate) const WASTE_SLACK: f64 = 0.05;

/// The reuse slack, at most, while the device (or the memory fraction) is
/// more than half full: the default slack buys a workload fewer driver calls
/// with memory, a trade worth making only while memory is plentiful. Near the
/// limit a stream re-maps its own pages before it takes more: with the
/// default slack throughout, the serving workload's largest batch under a
/// 2 GiB cap on an H200 was 59 (expandable segments: 60; 62 at 0.035).
pub(crate) const PRESSED_SLACK: f64 = 0.035;

/// Re-mapped pages, as a multiple of the stream's mapped pages, since its peak
/// of pages in use last grew, that make a stream churning. A single pass of
/// bert_dynamic re-maps at most 1.6 times its pages between two peaks (2.0 with
/// every size scaled by 1.25, but within 1957 allocations of 614 pages).
const CHURN_REMAPS: u64 = 2;

/// Allocations, as a multiple of the stream's mapped pages, since its peak of
/// pages in use last grew, below which a stream is not churning yet.
const CHURN_ALLOCATIONS: u64 = 8;

/// Allocations per re-mapped page, since the peak of pages in use last grew,
/// beyond which a stream is not churning whatever it re-mapped: one page per
/// 1000 allocations is about one driver call per 1000 operations.
const CHURN_RATE: u64 = 1000;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Budget {
    /// `cachalot_reuse_slack`.
    slack: f64,
    /// `cachalot_churn_slack`.
    churn_slack: f64,
    /// `cachalot_reuse_min`, in pages.
    min_pages: u64,
    /// The most pages the stream ever had in use at once.
    peak_in_use: u64,
    /// The most bytes it had allocated at such a peak (the block then
    /// placed included).
    peak_bytes: u64,
    /// Pages re-mapped since `peak_in_use` last grew.
    remaps: u64,
    /// Allocations since `peak_in_use` last grew.
    allocations: u64,
    /// Whether the stream churns: its budget is raised.
    churning: bool,
    /// Whether the stream re-mapped a cached page since it started (or last
    /// started afresh).
    remapped: bool,
    /// Whether the stream gave its cached pages back (`empty_cache` with
    /// blocks live) since it started (or last started afresh): it grows
    /// anew until it re-maps ([`Budget::grows_anew`]).
    regrowing: bool,
}

impl Budget {
    /// A stream's budget before its first allocation.
    pub(crate) fn new(config: &StreamConfig) -> Budget {
        Budget {
            slack: config.slack,
            churn_slack: config.churn_slack,
            min_pages: config.min_pages,
            peak_in_use: 0,
            peak_bytes: 0,
            remaps: 0,
            allocations: 0,
            churning: false,
            remapped: false,
            regrowing: false,
        }
    }

    /// The most pages the stream ever had in use at once.
    pub(crate) fn peak_in_use(&self) -> u64 {
        self.peak_in_use
    }

    /// Whether the stream churns.
    pub(crate) fn churning(&self) -> bool {
        self.churning
    }

    /// Whether the stream re-mapped a cached page since it started (or last
    /// started afresh, or regrew); the policy asks [`Budget::grows_anew`].
    #[cfg(test)]
    fn remapped(&self) -> bool {
        self.remapped
    }

    /// Counts an allocation.
    #[inline(always)]
    pub(crate) fn allocated(&mut self) {
        self.allocations += 1;
    }

    /// Records a new peak of pages in use, if `in_use` is one (with the bytes
    /// then allocated, `bytes()`), and restarts the churn counts; returns
    /// whether it was.
    pub(crate) fn note_in_use(&mut self, in_use: u64, bytes: impl FnOnce() -> u64) -> bool {
        let peaked = in_use > self.peak_in_use;
        if peaked {
            self.peak_in_use = in_use;
            self.peak_bytes = self.peak_bytes.max(bytes());
            self.remaps = 0;
            self.allocations = 0;
        }
        peaked
    }

    /// Counts `n` pages re-mapped (towards churning, and ending the
    /// stream's first growth).
    pub(crate) fn count_remaps(&mut self, n: u64) {
        self.remaps += n;
        self.remapped |= n > 0;
    }

    /// Starts churning once the stream, holding `mapped` pages, re-mapped
    /// enough of them (module docs); whether it started now.
    pub(crate) fn starts_churning(&mut self, mapped: u64) -> bool {
        let starts = !self.churning
            && self.remaps >= CHURN_REMAPS * mapped.max(1)
            && self.allocations >= CHURN_ALLOCATIONS * mapped
            && self.remaps * CHURN_RATE >= self.allocations;
        self.churning |= starts;
        starts
    }

    /// Forgets the page history (peak, churn): the stream now has `in_use`
    /// pages in use and `bytes` allocated.
    pub(crate) fn start_afresh(&mut self, in_use: u64, bytes: u64) {
        self.peak_in_use = in_use;
        self.peak_bytes = bytes;
        self.remaps = 0;
        self.allocations = 0;
        self.churning = false;
        self.remapped = false;
        self.regrowing = false;
    }

    /// The stream gave its cached pages back with blocks still live: its
    /// peak and churn stay, and it grows again as at first (in extents past
    /// its last mapped cell) until it re-maps a page.
    pub(crate) fn regrow(&mut self) {
        self.remapped = false;
        self.regrowing = true;
    }

    /// Whether the stream grows as at first, in extents past its last mapped
    /// cell (Note [Frontier]): at a new peak of pages in use (`peaked`) or
    /// after [`Budget::regrow`], while it has not re-mapped a page since and
    /// does not churn.
    pub(crate) fn grows_anew(&self, peaked: bool) -> bool {
        (peaked || self.regrowing) && !self.remapped && !self.churning
    }

    /// While the stream grows anew after [`Budget::regrow`] (not at a new
    /// peak: [`Budget::grows_anew`]), how many pages it may map ahead of a block past its
    /// last mapped cell, holding `mapped`: up to its peak of pages in use,
    /// which it held before and will most likely hold again. 0 otherwise.
    pub(crate) fn ahead(&self, mapped: u64) -> u64 {
        match self.grows_anew(false) {
            true => self.peak_in_use.saturating_sub(mapped),
            false => 0,
        }
    }

    /// Pages the stream may hold before it re-maps cached ones, with pages
    /// of `granularity` bytes: its peak of pages in use and the slack (the
    /// churn slack too while it churns), at least `cachalot_reuse_min_mb`
    /// over that peak; a stream whose slack exceeds that floor (a large one)
    /// and is not raised for churning holds no more than [`WASTE_SLACK`] (or
    /// the reuse slack, if larger) over its peak of allocated bytes, where
    /// its pages in use leave room. While the device is more than half full
    /// (`pressed`), the reuse slack is at most [`PRESSED_SLACK`].
    pub(crate) fn pages(&self, granularity: u64, pressed: bool) -> u64 {
        let slack = match pressed {
            true => self.slack.min(PRESSED_SLACK),
            false => self.slack,
        };
        let churn = if self.churning { self.churn_slack } else { 0.0 };
        let scaled = ((1.0 + slack + churn) * self.peak_in_use as f64).ceil() as u64;
        let floor = self.peak_in_use + self.min_pages;
        match scaled >= floor && churn == 0.0 {
            true => scaled.min(self.waste_cap(slack, granularity).max(self.peak_in_use)),
            false => scaled.max(floor),
        }
    }

    /// The pages that come to [`WASTE_SLACK`] over the stream's peak of
    /// allocated bytes, or to `cachalot_reuse_slack` where that is larger: a
    /// user who sets it higher trades memory for fewer driver calls, and gets
    /// that trade (bert_dynamic's first pass at 0.2: 226 driver calls instead
    /// of 2,445 at 0.035, at 1.17 times its peak requested instead of 1.05).
    fn waste_cap(&self, slack: f64, granularity: u64) -> u64 {
        let slack = WASTE_SLACK.max(slack);
        ((1.0 + slack) * self.peak_bytes as f64 / granularity as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(slack: f64, churn_slack: f64, min_pages: u64) -> StreamConfig {
        StreamConfig {
            slack,
            churn_slack,
            min_pages,
            extent_pages: 1,
            threshold: None,
            ranges: [1 << 30; 2],
        }
    }

    const G: u64 = 2 << 20;

    #[test]
    fn the_budget_follows_the_peak_within_the_waste_cap() {
        let mut b = Budget::new(&config(0.035, 0.15, 16));
        assert_eq!(b.pages(G, false), 16, "the floor over no peak");
        assert!(b.note_in_use(1000, || 1000 * G));
        assert!(!b.note_in_use(900, || unreachable!("not a peak")));
        // 1.035 x 1000 pages, under the 1.05 cap of 1000 pages' bytes.
        assert_eq!(b.pages(G, false), 1035);
        // A large slack is held to itself over the peak of bytes.
        let mut wide = Budget::new(&config(0.2, 0.15, 16));
        wide.note_in_use(1000, || 900 * G);
        assert_eq!(wide.pages(G, false), 1080, "1.2 x 900 pages' bytes");
        // Past half the device, the tight budget: 1.035 x 1000 pages, under
        // the 1.05 cap of 900 pages' bytes (945), but not under the peak.
        assert_eq!(wide.pages(G, true), 1000);
    }

    #[test]
    fn churn_starts_only_when_remaps_last_and_raises_the_budget_until_afresh() {
        let mut b = Budget::new(&config(0.035, 0.15, 16));
        b.note_in_use(100, || 100 * G);
        b.count_remaps(250);
        assert!(!b.starts_churning(100), "a burst just past a peak");
        (0..800).for_each(|_| b.allocated());
        assert!(b.starts_churning(100));
        assert!(!b.starts_churning(100), "it started once");
        assert!(b.churning() && b.remapped());
        assert_eq!(b.pages(G, false), 119, "1.185 x 100 pages");
        b.start_afresh(50, 50 * G);
        assert!(!b.churning() && !b.remapped());
        assert_eq!(b.peak_in_use(), 50);
    }

    #[test]
    fn after_empty_cache_a_stream_regrows_until_it_re_maps() {
        let mut b = Budget::new(&config(0.2, 0.15, 16));
        b.note_in_use(100, || 100 * G);
        b.count_remaps(3);
        assert!(b.remapped() && !b.grows_anew(false) && !b.grows_anew(true));
        assert_eq!(b.ahead(10), 0, "maps ahead only while it regrows");
        b.regrow();
        assert!(b.grows_anew(false) && !b.remapped());
        assert_eq!(b.peak_in_use(), 100, "its peak stays");
        assert_eq!((b.ahead(10), b.ahead(100), b.ahead(120)), (90, 0, 0));
        b.count_remaps(0);
        assert!(b.grows_anew(false));
        b.count_remaps(1);
        assert!(!b.grows_anew(false) && b.remapped());
        assert_eq!(b.ahead(10), 0, "not once it re-maps");
        b.regrow();
        b.start_afresh(0, 0);
        assert!(!b.grows_anew(false));
    }

    #[test]
    fn a_trickle_of_remaps_is_not_churn() {
        let mut b = Budget::new(&config(0.035, 0.15, 16));
        b.note_in_use(10, || 10 * G);
        b.count_remaps(20);
        (0..30_000).for_each(|_| b.allocated());
        assert!(!b.starts_churning(10), "one page per 1500 allocations");
    }
}
