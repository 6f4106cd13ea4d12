//! The search space: which allocator settings a tuning replays. A space is a
//! list of families (PyTorch's segments, PyTorch's expandable segments, a memory
//! fraction with garbage collection, cachalot's policy); each family is the
//! product of a few keys' values, and each candidate is a configuration string
//! in `PYTORCH_CUDA_ALLOC_CONF` syntax.

use cachalot_core::config::{split_top_level, AllocatorConfig, ConfigError, PolicyKind};

use super::TuneError;

/// A value that leaves its key out of the configuration (the default).
pub const DEFAULT_VALUE: &str = "default";

/// The keys a search may vary: the ones that change device memory.
pub const SEARCH_KEYS: [&str; 12] = [
    "policy",
    "expandable_segments",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
    "cachalot_reuse_slack",
    "cachalot_churn_slack",
    "cachalot_reuse_min_mb",
    "cachalot_extent_mb",
    "cachalot_release_threshold_mb",
];

/// One key and the values tried for it.
#[derive(Clone, Debug, PartialEq)]
struct Dimension {
    key: String,
    /// Values as written in a configuration; [`DEFAULT_VALUE`] leaves the key out.
    values: Vec<String>,
    /// A key that must be set (not default) for this one to matter; else only
    /// the default is tried.
    only_with: Option<&'static str>,
}

impl Dimension {
    fn new(key: &str, values: &[&str]) -> Dimension {
        Dimension {
            key: key.to_string(),
            values: values.iter().map(|v| v.to_string()).collect(),
            only_with: None,
        }
    }
}

/// Configurations sharing fixed settings, over the product of some keys' values.
#[derive(Clone, Debug, PartialEq)]
struct Family {
    /// Settings every candidate of the family has (`expandable_segments:True`).
    fixed: Vec<String>,
    dimensions: Vec<Dimension>,
}

/// What a tuning replays.
#[derive(Clone, Debug, PartialEq)]
pub struct Space {
    families: Vec<Family>,
}

/// What the default space needs to know of the workload: the most bytes it
/// keeps live and the device, to place memory fractions around the workload.
#[derive(Copy, Clone, Debug)]
pub struct Workload {
    /// Peak of the requested bytes live at once.
    pub live_peak: u64,
    /// The device's capacity in bytes.
    pub capacity: u64,
}

impl Space {
    /// The default search: PyTorch's segments (max_split_size_mb, its
    /// max_non_split_rounding_mb, roundup_power2_divisions in both forms),
    /// expandable segments with each rounding, a memory fraction just above
    /// the workload's live peak with garbage collection, and the cachalot
    /// policy's keys.
    pub fn default_for(workload: Workload) -> Space {
        let roundups = ["default", "2", "4", "8", "16", "[256:1,512:2,1024:4,>:8]"];
        let segments = Family {
            fixed: Vec::new(),
            dimensions: vec![
                Dimension::new(
                    "max_split_size_mb",
                    &["default", "32", "64", "128", "256", "512", "1024"],
                ),
                Dimension {
                    only_with: Some("max_split_size_mb"),
                    ..Dimension::new("max_non_split_rounding_mb", &["default", "64", "256"])
                },
                Dimension::new("roundup_power2_divisions", &roundups),
            ],
        };
        let expandable = Family {
            fixed: vec!["expandable_segments:True".to_string()],
            dimensions: vec![Dimension::new("roundup_power2_divisions", &roundups)],
        };
        let fractions: Vec<String> = [1050, 1150, 1300, 1600]
            .iter()
            .filter_map(|m| fraction_for(workload, *m))
            .collect();
        let garbage = Family {
            fixed: Vec::new(),
            dimensions: vec![
                Dimension {
                    key: "per_process_memory_fraction".to_string(),
                    values: fractions,
                    only_with: None,
                },
                Dimension::new("garbage_collection_threshold", &["0.5", "0.7", "0.9"]),
            ],
        };
        let cachalot = Family {
            fixed: vec!["policy:cachalot".to_string()],
            dimensions: vec![
                Dimension::new("cachalot_reuse_slack", &["0", "0.035", "0.1", "default"]),
                Dimension::new("cachalot_churn_slack", &["0", "default", "0.3"]),
                Dimension::new("cachalot_reuse_min_mb", &["0", "default", "128"]),
                Dimension::new("cachalot_extent_mb", &["2", "default", "128"]),
            ],
        };
        Space {
            families: vec![segments, expandable, garbage, cachalot],
        }
    }

    /// A space from `KEY=V1,V2,...` specifications, one per key: the product
    /// of their values (`default` leaves a key out; list values such as
    /// `[256:1,>:4]` keep their commas). Keys of the cachalot policy make it
    /// the policy of every candidate.
    ///
    /// # Errors
    /// [`TuneError::UnknownKey`], [`TuneError::NotSearched`],
    /// [`TuneError::Space`] for a malformed specification.
    pub fn from_specs(specs: &[String]) -> Result<Space, TuneError> {
        let mut dimensions: Vec<Dimension> = Vec::new();
        for spec in specs {
            let (key, values) = spec
                .split_once('=')
                .ok_or_else(|| TuneError::Space(format!("'{spec}': expected KEY=V1,V2,...")))?;
            let key = key.trim();
            check_key(key)?;
            if dimensions.iter().any(|d| d.key == key) {
                return Err(TuneError::Space(format!("'{key}' is given twice")));
            }
            let compact: String = values.chars().filter(|c| !c.is_whitespace()).collect();
            let values = split_top_level(&compact).map_err(|e| TuneError::Space(e.to_string()))?;
            if values.is_empty() {
                return Err(TuneError::Space(format!("'{key}' has no values")));
            }
            dimensions.push(Dimension {
                key: key.to_string(),
                values: values.into_iter().map(str::to_string).collect(),
                only_with: None,
            });
        }
        let cachalot_keys = dimensions
            .iter()
            .any(|d| PolicyKind::of_key(&d.key) == Some(PolicyKind::Cachalot));
        let chooses_policy = dimensions.iter().any(|d| d.key == "policy");
        let fixed = if cachalot_keys && !chooses_policy {
            vec!["policy:cachalot".to_string()]
        } else {
            Vec::new()
        };
        Ok(Space {
            families: vec![Family { fixed, dimensions }],
        })
    }

    /// Every candidate configuration, parsed and checked, without repeats; the
    /// default configuration (the empty string) comes first.
    ///
    /// # Errors
    /// [`TuneError::Config`] naming a candidate whose value does not parse or
    /// whose keys do not fit its policy.
    pub fn candidates(&self) -> Result<Vec<AllocatorConfig>, TuneError> {
        let mut out = vec![AllocatorConfig::default()];
        for family in &self.families {
            for conf in family.configurations() {
                let config = AllocatorConfig::parse(&conf)
                    .and_then(|c| c.check_keys().map(|()| c))
                    .map_err(|source| TuneError::Config { conf, source })?;
                if !out.iter().any(|c| same_settings(c, &config)) {
                    out.push(config);
                }
            }
        }
        Ok(out)
    }
}

impl Family {
    /// The family's configuration strings: the product of its dimensions.
    fn configurations(&self) -> Vec<String> {
        let mut partial: Vec<Vec<(String, String)>> = vec![Vec::new()];
        for dim in &self.dimensions {
            let mut next = Vec::new();
            for settings in partial {
                let active = dim
                    .only_with
                    .is_none_or(|key| settings.iter().any(|(k, _)| k == key));
                let values = if active {
                    &dim.values[..]
                } else {
                    &dim.values[..1]
                };
                for value in values {
                    let mut s = settings.clone();
                    if value != DEFAULT_VALUE {
                        s.push((dim.key.clone(), value.clone()));
                    }
                    next.push(s);
                }
            }
            partial = next;
        }
        partial
            .into_iter()
            .map(|settings| {
                self.fixed
                    .iter()
                    .cloned()
                    .chain(settings.into_iter().map(|(k, v)| format!("{k}:{v}")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect()
    }
}

/// Whether two configurations behave alike (their source strings aside).
fn same_settings(a: &AllocatorConfig, b: &AllocatorConfig) -> bool {
    let strip = |c: &AllocatorConfig| {
        let mut c = c.clone();
        c.source.clear();
        c
    };
    strip(a) == strip(b)
}

/// A memory fraction that allows `permille`/1000 times the workload's live
/// peak, when that is below the whole device; in millionths, rounded up.
fn fraction_for(workload: Workload, permille: u64) -> Option<String> {
    let allowed = u128::from(workload.live_peak) * u128::from(permille);
    let millionths = (allowed * 1000).div_ceil(u128::from(workload.capacity.max(1)));
    (millionths > 0 && millionths < 1_000_000).then(|| format!("{}", millionths as f64 / 1e6))
}

/// Refuses keys a search cannot vary.
fn check_key(key: &str) -> Result<(), TuneError> {
    if SEARCH_KEYS.contains(&key) {
        return Ok(());
    }
    match AllocatorConfig::default().set(key, "") {
        Err(ConfigError::UnknownKey(_)) => Err(TuneError::UnknownKey { key: key.into() }),
        _ => Err(TuneError::NotSearched { key: key.into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn workload() -> Workload {
        Workload {
            live_peak: 8 * GIB,
            capacity: 80 * GIB,
        }
    }

    #[test]
    fn the_default_space_starts_with_the_default_and_has_no_repeats() {
        let candidates = Space::default_for(workload()).candidates().unwrap();
        assert_eq!(candidates[0].source, "");
        for (i, a) in candidates.iter().enumerate() {
            for b in &candidates[i + 1..] {
                assert!(!same_settings(a, b), "{} and {}", a.source, b.source);
            }
        }
        let has = |s: &str| candidates.iter().any(|c| c.source == s);
        assert!(has("max_split_size_mb:64,max_non_split_rounding_mb:256"));
        assert!(has(
            "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"
        ));
        assert!(has(
            "policy:cachalot,cachalot_reuse_slack:0,cachalot_churn_slack:0"
        ));
        assert!(has("policy:cachalot,cachalot_extent_mb:2"));
        assert!(has(
            "per_process_memory_fraction:0.105,garbage_collection_threshold:0.5"
        ));
        // Rounding of oversize blocks only with a split limit.
        assert!(!has("max_non_split_rounding_mb:64"));
    }

    /// The configuration strings a space of `specs` searches.
    fn confs(specs: &[&str]) -> Vec<String> {
        let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
        Space::from_specs(&specs)
            .unwrap()
            .candidates()
            .unwrap()
            .into_iter()
            .map(|c| c.source)
            .collect()
    }

    #[test]
    fn specifications_make_a_product() {
        assert_eq!(
            confs(&[
                "max_split_size_mb=default,64",
                "roundup_power2_divisions = 4, [256:1,>:4]"
            ]),
            [
                "",
                "roundup_power2_divisions:4",
                "roundup_power2_divisions:[256:1,>:4]",
                "max_split_size_mb:64,roundup_power2_divisions:4",
                "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4]",
            ]
        );
        assert_eq!(
            confs(&["cachalot_reuse_slack=0,0.1"]),
            [
                "",
                "policy:cachalot,cachalot_reuse_slack:0",
                "policy:cachalot,cachalot_reuse_slack:0.1"
            ]
        );
    }

    #[test]
    fn bad_specifications_say_why() {
        let err = |spec: &str| {
            Space::from_specs(&[spec.to_string()]).and_then(|s| s.candidates().map(|_| ()))
        };
        assert!(matches!(
            err("max_split=64"),
            Err(TuneError::UnknownKey { .. })
        ));
        assert!(matches!(
            err("pinned_use_cuda_host_register=True"),
            Err(TuneError::NotSearched { .. })
        ));
        assert!(matches!(err("max_split_size_mb"), Err(TuneError::Space(_))));
        assert!(matches!(
            err("max_split_size_mb=10"),
            Err(TuneError::Config { .. })
        ));
        let mixed = Space::from_specs(&[
            "policy=pytorch".to_string(),
            "cachalot_reuse_slack=0".to_string(),
        ])
        .unwrap();
        assert!(matches!(mixed.candidates(), Err(TuneError::Config { .. })));
        let message = err("max_split=64").unwrap_err().to_string();
        assert!(message.contains("max_split_size_mb"), "{message}");
    }
}
