//! Tuning: which allocator settings serve a recorded workload best. Every
//! candidate of a [`Space`] is replayed exactly on the simulated device (the
//! pytorch policy is PyTorch 2.11's allocator, so its figures are the ones
//! PyTorch would show), the candidates are ranked by an [`Objective`], and
//! [`smallest_capacity`] answers "will it fit?" for any of them.
//!
//! * **live peak**: the most requested bytes a recording keeps live at once; no
//!   device smaller than it can run the recording, whatever the settings.
//! * **passes**: how many times in a row each candidate runs the recording
//!   (as a training loop or a server repeats its work, [`replay::replay_passes_on`]);
//!   its figures cover every pass, so a setting whose memory grows after the
//!   first pass ranks by what it then holds.
//! * **waste**: peak reserved bytes less the live peak.

mod fit;
mod space;

use std::num::NonZeroUsize;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use serde::Serialize;
use thiserror::Error;

use crate::replay::{self, Op, Plan, ReplayError};
use cachalot_core::config::{AllocatorConfig, ConfigError, PolicyKind};

pub use fit::{fit_leaders, recommend, smallest_capacity, Fit};
pub use space::{Space, Workload, DEFAULT_VALUE, SEARCH_KEYS};

/// Why a tuning cannot run. Remedy: as each variant says.
#[derive(Debug, Error)]
pub enum TuneError {
    /// The recording allocates nothing. Remedy: record the workload itself.
    #[error("the recording has no allocations: there is nothing to tune")]
    NoAllocations,
    /// The recording keeps more bytes live than the device holds: no setting
    /// can help. Remedy: a larger device, or less live memory.
    #[error(
        "nothing fits: the recording keeps {} live at its peak, more than the whole {}-byte \
         device ({}); no allocator setting can run it there; give a --capacity of at least {}",
        cachalot_core::error::format_size(*live), capacity, cachalot_core::error::format_size(*capacity),
        cachalot_core::error::format_size(*live)
    )]
    LiveAboveCapacity {
        /// The recording's live peak in bytes.
        live: u64,
        /// The device's capacity in bytes.
        capacity: u64,
    },
    /// A search-space key the allocator does not know. Remedy: one of
    /// [`SEARCH_KEYS`].
    #[error("unknown key '{key}' in the search space; the keys searched are: {}", SEARCH_KEYS.join(", "))]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A configuration key that does not change device memory.
    #[error(
        "'{key}' does not change device memory, so a search does not vary it; \
         the keys searched are: {}", SEARCH_KEYS.join(", ")
    )]
    NotSearched {
        /// The key as written.
        key: String,
    },
    /// A malformed search-space specification. Remedy: `KEY=V1,V2,...`.
    #[error("search space: {0}")]
    Space(String),
    /// A candidate configuration that does not parse or fit its policy.
    #[error("candidate '{conf}': {source}")]
    Config {
        /// The candidate's configuration string.
        conf: String,
        /// Why.
        source: ConfigError,
    },
    /// A replay failed other than by running out of memory.
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// What a tuning minimises first.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Peak reserved bytes, then driver calls.
    #[default]
    Reserved,
    /// Driver memory calls, then peak reserved bytes.
    Calls,
}

impl FromStr for Objective {
    type Err = String;
    fn from_str(s: &str) -> Result<Objective, String> {
        match s {
            "reserved" => Ok(Objective::Reserved),
            "calls" => Ok(Objective::Calls),
            _ => Err(format!(
                "'{s}' is not an objective: expected reserved or calls"
            )),
        }
    }
}

/// One configuration's replay. Field names are a stable interface (`cachalot
/// tune --json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// Its configuration string (`PYTORCH_CUDA_ALLOC_CONF` syntax; empty for
    /// the default).
    pub conf: String,
    /// Its policy's name.
    pub policy: String,
    /// Predicted peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Peak reserved bytes less the recording's live peak.
    pub waste_bytes: u64,
    /// Predicted driver memory calls.
    pub driver_calls: u64,
    /// Segments obtained.
    pub segment_allocs: u64,
    /// Allocations that ran out of memory on the device searched.
    pub ooms: u64,
}

impl Candidate {
    /// Whether it ran without running out of memory.
    pub fn fits(&self) -> bool {
        self.ooms == 0
    }

    /// Whether `other` replayed to the same figures.
    fn same_outcome(&self, other: &Candidate) -> bool {
        (self.peak_reserved_bytes, self.driver_calls, self.ooms)
            == (other.peak_reserved_bytes, other.driver_calls, other.ooms)
    }

    /// The order of `objective`: candidates that fit first, then the
    /// objective's measures, then the shorter configuration.
    fn rank_key(&self, objective: Objective) -> (bool, u64, u64, usize, &str) {
        let (first, second) = match objective {
            Objective::Reserved => (self.peak_reserved_bytes, self.driver_calls),
            Objective::Calls => (self.driver_calls, self.peak_reserved_bytes),
        };
        (!self.fits(), first, second, self.conf.len(), &self.conf)
    }
}

/// The ranked candidates of a search.
#[derive(Clone, Debug, Serialize)]
pub struct Ranking {
    /// The device's capacity in bytes.
    pub capacity: u64,
    /// How many times in a row each candidate ran the recording.
    pub passes: NonZeroUsize,
    /// What was minimised.
    pub objective: Objective,
    /// The recording's live peak in bytes.
    pub live_peak_bytes: u64,
    /// Every candidate, best first.
    pub candidates: Vec<Candidate>,
}

impl Ranking {
    /// The best candidate that fits, of `policy` when given.
    pub fn best(&self, policy: Option<PolicyKind>) -> Option<&Candidate> {
        self.candidates
            .iter()
            .filter(|c| c.fits())
            .find(|c| policy.is_none_or(|p| c.policy == p.name()))
    }

    /// The first (shortest) candidate of each outcome, in ranking order: a
    /// candidate whose peak reserved bytes, driver calls and out-of-memory
    /// count equal a better one's adds nothing.
    pub fn leaders(&self) -> impl Iterator<Item = &Candidate> {
        self.candidates.iter().enumerate().filter_map(|(i, c)| {
            let alike = self.candidates[..i].iter().any(|b| b.same_outcome(c));
            (!alike).then_some(c)
        })
    }

    /// How many candidates ranked after `candidate` have its outcome.
    pub fn alike(&self, candidate: &Candidate) -> usize {
        self.candidates
            .iter()
            .filter(|c| c.same_outcome(candidate))
            .count()
            - 1
    }

    /// The default configuration's replay.
    pub fn default_candidate(&self) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.conf.is_empty())
    }
}

/// The most requested bytes `plan` keeps live at once.
pub fn live_peak(plan: &Plan) -> u64 {
    let mut sizes = vec![0u64; plan.slots];
    let (mut live, mut peak) = (0u64, 0u64);
    for op in &plan.ops {
        match *op {
            Op::Alloc { slot, size, .. } => {
                if let Some(s) = sizes.get_mut(slot as usize) {
                    *s = size;
                }
                live += size;
                peak = peak.max(live);
            }
            Op::Free { slot } => {
                live -= sizes.get_mut(slot as usize).map_or(0, std::mem::take);
            }
            Op::EmptyCache | Op::EnterPool { .. } | Op::LeavePool { .. } => {}
        }
    }
    peak
}

/// Replays every candidate (from [`Space::candidates`]) on a device of `capacity` bytes,
/// `passes` times in a row each, on all cores, and ranks them by `objective`.
/// `progress` is called with the number of candidates done, after each.
///
/// # Errors
/// [`TuneError::NoAllocations`], [`TuneError::LiveAboveCapacity`] or a
/// failed replay.
pub fn search(
    plan: &Plan,
    candidates: Vec<AllocatorConfig>,
    capacity: u64,
    passes: NonZeroUsize,
    objective: Objective,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Ranking, TuneError> {
    let live = live_peak(plan);
    if !plan.ops.iter().any(|op| matches!(op, Op::Alloc { .. })) {
        return Err(TuneError::NoAllocations);
    }
    if live > capacity {
        return Err(TuneError::LiveAboveCapacity { live, capacity });
    }
    let done = AtomicUsize::new(0);
    let mut candidates = candidates
        .into_par_iter()
        .map(|config| {
            let candidate = replay_candidate(plan, config, capacity, passes, live);
            progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            candidate
        })
        .collect::<Result<Vec<_>, _>>()?;
    candidates.sort_by(|a, b| a.rank_key(objective).cmp(&b.rank_key(objective)));
    Ok(Ranking {
        capacity,
        passes,
        objective,
        live_peak_bytes: live,
        candidates,
    })
}

fn replay_candidate(
    plan: &Plan,
    config: AllocatorConfig,
    capacity: u64,
    passes: NonZeroUsize,
    live: u64,
) -> Result<Candidate, TuneError> {
    let conf = config.source.clone();
    let device = replay::Device::Simulated { capacity };
    let replayed = replay::replay_passes_on(plan, config, device, passes, None, &mut |_| {})?;
    let report = replayed.report;
    Ok(Candidate {
        conf,
        policy: report.policy,
        peak_reserved_bytes: report.peak_reserved_bytes,
        waste_bytes: report.peak_reserved_bytes.saturating_sub(live),
        driver_calls: report.driver_calls,
        segment_allocs: report.segment_allocs,
        ooms: report.ooms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::testing::{alloc, plan_of};

    const MIB: u64 = 1 << 20;
    const ONE: NonZeroUsize = NonZeroUsize::MIN;

    /// Large blocks of changing sizes: PyTorch's default splits and caches
    /// them; a split limit or expandable segments waste less.
    fn churn() -> Plan {
        let mut ops = Vec::new();
        let mut slot = 0;
        for round in 0..6u64 {
            let a = slot;
            ops.push(alloc(a, (100 + 30 * round) * MIB));
            ops.push(alloc(a + 1, (60 + 7 * round) * MIB));
            ops.push(Op::Free { slot: a });
            ops.push(alloc(a + 2, (150 - 10 * round) * MIB));
            ops.push(Op::Free { slot: a + 1 });
            ops.push(Op::Free { slot: a + 2 });
            slot += 3;
        }
        plan_of(ops, slot as usize)
    }

    #[test]
    fn the_live_peak_counts_requested_bytes() {
        let plan = plan_of(
            vec![
                alloc(0, 10),
                alloc(1, 20),
                Op::Free { slot: 0 },
                alloc(2, 5),
                Op::EmptyCache,
            ],
            3,
        );
        assert_eq!(live_peak(&plan), 30);
    }

    #[test]
    fn the_ranking_is_ordered_and_its_best_replays_as_printed() {
        let plan = churn();
        let space = Space::default_for(Workload {
            live_peak: live_peak(&plan),
            capacity: 4096 * MIB,
        });
        let candidates = space.candidates().unwrap();
        let ranking = search(
            &plan,
            candidates.clone(),
            4096 * MIB,
            ONE,
            Objective::Reserved,
            &|_| {},
        )
        .unwrap();
        let keys: Vec<_> = ranking
            .candidates
            .iter()
            .map(|c| (c.peak_reserved_bytes, c.driver_calls))
            .collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
        let best = ranking.best(None).unwrap();
        let default = ranking.default_candidate().unwrap();
        assert!(best.peak_reserved_bytes <= default.peak_reserved_bytes);
        let again = replay::replay(
            &plan,
            AllocatorConfig::parse(&best.conf).unwrap(),
            4096 * MIB,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(again.peak_reserved_bytes, best.peak_reserved_bytes);
        let calls = search(
            &plan,
            candidates,
            4096 * MIB,
            ONE,
            Objective::Calls,
            &|_| {},
        )
        .unwrap();
        let first = &calls.candidates[0];
        assert!(calls
            .candidates
            .iter()
            .all(|c| c.driver_calls >= first.driver_calls));
    }

    #[test]
    fn a_search_over_passes_ranks_by_every_pass() {
        let plan = churn();
        let candidates = Space::from_specs(&["expandable_segments=default,True".to_string()])
            .unwrap()
            .candidates()
            .unwrap();
        let twice = NonZeroUsize::new(2).unwrap();
        let ranking = search(
            &plan,
            candidates,
            4096 * MIB,
            twice,
            Objective::Reserved,
            &|_| {},
        )
        .unwrap();
        assert_eq!(ranking.passes, twice);
        for c in &ranking.candidates {
            let config = AllocatorConfig::parse(&c.conf).unwrap();
            let device = replay::Device::Simulated {
                capacity: 4096 * MIB,
            };
            let again = replay::replay_passes_on(&plan, config, device, twice, None, &mut |_| {})
                .unwrap()
                .report;
            assert_eq!(again.passes.len(), 2);
            assert_eq!(
                (c.peak_reserved_bytes, c.driver_calls),
                (again.peak_reserved_bytes, again.driver_calls),
                "{}",
                c.conf
            );
        }
    }

    #[test]
    fn what_cannot_be_tuned_is_refused() {
        let empty = plan_of(vec![Op::EmptyCache], 0);
        let default = || Space::from_specs(&[]).unwrap().candidates().unwrap();
        assert!(matches!(
            search(
                &empty,
                default(),
                64 * MIB,
                ONE,
                Objective::Reserved,
                &|_| {}
            ),
            Err(TuneError::NoAllocations)
        ));
        let big = plan_of(vec![alloc(0, 100 * MIB)], 1);
        let err = search(&big, default(), 64 * MIB, ONE, Objective::Reserved, &|_| {}).unwrap_err();
        assert!(matches!(err, TuneError::LiveAboveCapacity { .. }));
        assert!(err.to_string().contains("100.00 MiB"), "{err}");
    }
}
