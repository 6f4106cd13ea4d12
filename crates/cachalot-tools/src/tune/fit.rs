//! "Will it fit?": the smallest device on which a recording runs under a
//! configuration without running out of memory, by bisection over capacities
//! in whole pages, each step a replay that stops at the first allocation that
//! does not fit.

use std::num::NonZeroUsize;

use rayon::prelude::*;
use serde::Serialize;

use super::{Candidate, Ranking};
use crate::replay::{self, Plan, ReplayError};
use cachalot_core::backend::sim::{SIM_GRANULARITY, SIM_MAX_CAPACITY};
use cachalot_core::config::{AllocatorConfig, PolicyKind};

/// A candidate's smallest device. Field names are a stable interface
/// (`cachalot tune --json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fit {
    /// The candidate's configuration string.
    pub conf: String,
    /// The smallest capacity in bytes on which it runs without running out of
    /// memory; `None` when not even the largest simulated device fits.
    pub smallest_capacity_bytes: Option<u64>,
}

/// "Will it fit?" for the `count` best of `ranking`'s leaders (one candidate
/// per outcome), for the best of PyTorch's own allocator and for the default
/// configuration, on all cores, in ranking order, each replayed for as many
/// passes as the search was.
///
/// # Errors
/// A replay that failed other than by running out of memory.
pub fn fit_leaders(plan: &Plan, ranking: &Ranking, count: usize) -> Result<Vec<Fit>, ReplayError> {
    let mut chosen: Vec<&Candidate> = ranking.leaders().take(count).collect();
    let also = [
        ranking.best(Some(PolicyKind::Pytorch)),
        ranking.default_candidate(),
    ];
    for candidate in also.into_iter().flatten() {
        if !chosen.iter().any(|c| c.conf == candidate.conf) {
            chosen.push(candidate);
        }
    }
    chosen
        .into_par_iter()
        .map(|candidate| {
            let config = AllocatorConfig::parse(&candidate.conf)
                .map_err(|e| ReplayError::Setup(e.into()))?;
            // Where it ran out of memory, look up to the largest device.
            let most = if candidate.fits() {
                ranking.capacity
            } else {
                SIM_MAX_CAPACITY
            };
            let least = smallest_capacity(
                plan,
                &config,
                ranking.passes,
                ranking.live_peak_bytes,
                most,
                candidate.peak_reserved_bytes,
            )?;
            Ok(Fit {
                conf: candidate.conf.clone(),
                smallest_capacity_bytes: least,
            })
        })
        .collect()
}

/// The setting to recommend (of `policy` when given): the best-ranked
/// candidate that runs on the device searched and, of those whose smallest
/// device `fits` knows, needs no larger a device than the default does. A
/// setting with less peak reserved on a large device can need a larger one
/// to run at all (it reuses less under pressure); it is not recommended
/// over the default. When no such candidate is known, the one whose
/// smallest device is least.
pub fn recommend<'a>(
    ranking: &'a Ranking,
    fits: &[Fit],
    policy: Option<PolicyKind>,
) -> Option<&'a Candidate> {
    let need = |c: &Candidate| {
        fits.iter()
            .find(|f| f.conf == c.conf)
            .and_then(|f| f.smallest_capacity_bytes)
    };
    let default_need = ranking.default_candidate().and_then(need);
    let known = || {
        ranking
            .candidates
            .iter()
            .filter(|c| c.fits() && policy.is_none_or(|p| c.policy == p.name()))
            .filter_map(move |c| need(c).map(|n| (c, n)))
    };
    known()
        .find(|(_, n)| default_need.is_none_or(|d| *n <= d))
        .or_else(|| known().min_by_key(|(_, n)| *n))
        .map(|(c, _)| c)
}

/// The smallest capacity (a multiple of the simulated page) on which `plan`,
/// run `passes` times in a row, replays under `config` without running out
/// of memory, searched between the
/// recording's `live_peak` (below it nothing fits) and `most`; `None` when it
/// does not fit even there. `hint` (its peak reserved bytes on a device where
/// it fitted, say) is tried first to narrow the search.
///
/// Running out of memory is taken to be monotone in the capacity, as it is
/// for both policies: a larger device only adds room.
///
/// # Errors
/// A replay that failed other than by running out of memory.
pub fn smallest_capacity(
    plan: &Plan,
    config: &AllocatorConfig,
    passes: NonZeroUsize,
    live_peak: u64,
    most: u64,
    hint: u64,
) -> Result<Option<u64>, ReplayError> {
    let page = SIM_GRANULARITY;
    let fits = |pages: u64| replay::fits(plan, config.clone(), pages * page, passes);
    let mut low = (live_peak / page).max(1); // in pages
    let mut high = (most / page).max(low);
    let hinted = hint.div_ceil(page).clamp(low, high);
    if hinted < high && fits(hinted)? {
        high = hinted;
    } else if !fits(high)? {
        return Ok(None);
    }
    if fits(low)? {
        return Ok(Some(low * page));
    }
    // `high` fits, `low` does not.
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(mid)? {
            high = mid;
        } else {
            low = mid;
        }
    }
    Ok(Some(high * page))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::testing::{alloc, plan_of};
    use crate::replay::Op;

    const MIB: u64 = 1 << 20;
    const ONE: NonZeroUsize = NonZeroUsize::MIN;

    #[test]
    fn the_smallest_capacity_fits_and_one_page_less_does_not() {
        // Two live blocks of 30 and 50 MiB, then a 70 MiB one after the first
        // is freed: PyTorch's policy needs room for the cached 30 MiB segment
        // unless it is released on the way.
        let ops = vec![
            alloc(0, 30 * MIB),
            alloc(1, 50 * MIB),
            Op::Free { slot: 0 },
            alloc(2, 70 * MIB),
            Op::Free { slot: 1 },
            Op::Free { slot: 2 },
        ];
        let plan = plan_of(ops, 3);
        for conf in ["", "expandable_segments:True", "policy:cachalot"] {
            let config = AllocatorConfig::parse(conf).unwrap();
            let least = smallest_capacity(&plan, &config, ONE, 120 * MIB, 1024 * MIB, 150 * MIB)
                .unwrap()
                .unwrap();
            assert!(
                replay::fits(&plan, config.clone(), least, ONE).unwrap(),
                "{conf}"
            );
            assert!(
                !replay::fits(&plan, config, least - SIM_GRANULARITY, ONE).unwrap(),
                "{conf}"
            );
            assert!(least >= 120 * MIB, "{conf}: {least}");
        }
        let tight = AllocatorConfig::default();
        assert_eq!(
            smallest_capacity(&plan, &tight, ONE, 10 * MIB, 64 * MIB, 0).unwrap(),
            None
        );
    }
}
