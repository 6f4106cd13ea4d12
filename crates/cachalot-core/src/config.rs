//! Allocator configuration, parsed from `PYTORCH_CUDA_ALLOC_CONF` syntax.
//!
//! The syntax is PyTorch's: comma-separated `key:value` pairs, list values in
//! brackets (`roundup_power2_divisions:[256:1,512:2,>:8]`), whitespace ignored,
//! booleans exactly `True` or `False`. cachalot adds two keys, `policy`
//! (`pytorch` or `cachalot`) and `segments` (`auto`, `driver` or `runtime`:
//! [`SegmentRoute`]), and keys of its own policy prefixed `cachalot_`.
//! Unknown keys and bad values are errors that name the key. One parser,
//! [`AllocatorConfig::parse`], serves the library, the CLI and the PyTorch plug-in;
//! [`AllocatorConfig::layered`] reads PyTorch's own string under cachalot's (the
//! plug-in's `PYTORCH_ALLOC_CONF` and `CACHALOT_ALLOC_CONF`), and
//! [`PlacementSettings`] are the keys PyTorch lets a program change while it runs.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// Number of `roundup_power2_divisions` buckets (1 MiB, 2 MiB, ... 16 GiB and above).
pub const ROUNDUP_BUCKETS: usize = 16;

/// The allocation policy.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyKind {
    /// PyTorch 2.11's native caching allocator, reproduced exactly.
    #[default]
    Pytorch,
    /// cachalot's own lower-fragmentation policy.
    Cachalot,
}

impl PolicyKind {
    /// The name used in configuration strings and reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Pytorch => "pytorch",
            PolicyKind::Cachalot => "cachalot",
        }
    }
}

/// Where a CUDA device's segments come from (`segments`): the choice of the
/// program that opens the backend (the PyTorch plug-in), not of a policy.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SegmentRoute {
    /// The runtime's `cudaMalloc` when a library preloaded before the CUDA
    /// runtime intercepts it (torch_memory_saver's preload mode), else the
    /// driver.
    #[default]
    Auto,
    /// The driver's `cuMemAlloc`, with virtual memory where the device has it.
    Driver,
    /// The runtime's `cudaMalloc` as the process resolves it, with no virtual
    /// memory (an interposer sees only what `cudaMalloc` gives).
    Runtime,
}

impl SegmentRoute {
    /// Whether segments come from the runtime, `interposed` telling (when
    /// asked, for [`SegmentRoute::Auto`]) whether something intercepts
    /// `cudaMalloc`.
    pub fn runtime(self, interposed: impl FnOnce() -> bool) -> bool {
        match self {
            SegmentRoute::Auto => interposed(),
            SegmentRoute::Driver => false,
            SegmentRoute::Runtime => true,
        }
    }
}

impl FromStr for SegmentRoute {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "auto" => Ok(SegmentRoute::Auto),
            "driver" => Ok(SegmentRoute::Driver),
            "runtime" => Ok(SegmentRoute::Runtime),
            _ => Err(ConfigError::bad(
                "segments",
                s,
                "expected auto, driver or runtime",
            )),
        }
    }
}

impl PolicyKind {
    /// The policy a configuration key configures, when it configures only one
    /// (`expandable_segments` the pytorch policy, `cachalot_*` the cachalot
    /// policy); `None` for keys that apply to both.
    pub fn of_key(key: &str) -> Option<PolicyKind> {
        match key {
            "max_split_size_mb"
            | "max_non_split_rounding_mb"
            | "roundup_power2_divisions"
            | "garbage_collection_threshold"
            | "expandable_segments" => Some(PolicyKind::Pytorch),
            k if k.starts_with("cachalot_") => Some(PolicyKind::Cachalot),
            _ => None,
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "pytorch" => Ok(PolicyKind::Pytorch),
            "cachalot" => Ok(PolicyKind::Cachalot),
            _ => Err(ConfigError::bad(
                "policy",
                s,
                "expected `pytorch` or `cachalot`",
            )),
        }
    }
}

/// A configuration string that could not be parsed. Remedy: fix the string.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A key this allocator does not know.
    #[error("unrecognized key '{0}' in allocator config")]
    UnknownKey(String),
    /// A known key with a value it cannot take.
    #[error("bad value '{value}' for allocator config key '{key}': {reason}")]
    BadValue {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// What was expected.
        reason: String,
    },
    /// A key of one policy, in the configuration of another.
    #[error("allocator config key '{key}' applies to the {owner} policy, not the {policy} policy")]
    OtherPolicy {
        /// The key.
        key: String,
        /// The policy it configures.
        owner: PolicyKind,
        /// The policy chosen.
        policy: PolicyKind,
    },
    /// A key of cachalot's own in PyTorch's settings.
    #[error("'{0}' is cachalot's key: set it in CACHALOT_ALLOC_CONF, not in PyTorch's allocator settings")]
    NotPytorchKey(String),
    /// The string is not a list of `key:value` pairs.
    #[error("malformed allocator config near '{0}': expected key:value")]
    Syntax(String),
}

impl ConfigError {
    fn bad(key: &str, value: &str, reason: &str) -> ConfigError {
        ConfigError::BadValue {
            key: key.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// Allocator settings. Defaults are PyTorch's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AllocatorConfig {
    /// Which policy places blocks. Default: `pytorch`.
    pub policy: PolicyKind,
    /// Blocks of at least this size are never split (`max_split_size_mb`).
    /// Default: unlimited (`None`).
    pub max_split_size: Option<u64>,
    /// How much larger than the request a cached oversize block may be and still
    /// serve it (`max_non_split_rounding_mb`). Default: 20 MiB.
    pub max_non_split_rounding: u64,
    /// Divisions per power-of-two interval for size rounding, per bucket
    /// (1 MiB, 2 MiB, ..., 16 GiB and above); 0 or 1 = plain 512-byte rounding.
    /// Default: all 0.
    pub roundup_power2_divisions: [u64; ROUNDUP_BUCKETS],
    /// Fraction of the allowed memory above which cached blocks are reclaimed
    /// (`garbage_collection_threshold`); 0 = off. Needs a memory fraction below 1.
    pub garbage_collection_threshold: f64,
    /// Grow segments by mapping pages instead of allocating new segments.
    pub expandable_segments: bool,
    /// Fraction of device memory this allocator may reserve. Default: 1.
    pub per_process_memory_fraction: f64,
    /// Accepted for compatibility; cachalot never holds a lock across a driver call
    /// that this would change.
    pub release_lock_on_cudamalloc: bool,
    /// Accepted for compatibility (pinned host memory settings).
    pub pinned_use_cuda_host_register: bool,
    /// Accepted for compatibility (pinned host memory settings).
    pub pinned_num_register_threads: u64,
    /// Accepted for compatibility (pinned host memory settings).
    pub pinned_use_background_threads: bool,
    /// Whether a block freed during a CUDA graph capture after `record_stream`
    /// is reused once the capture has joined the recorded streams back
    /// (`graph_capture_record_stream_reuse`). Default: false.
    pub graph_capture_record_stream_reuse: bool,
    /// `cachalot` policy: how far, as a fraction, a stream's mapped pages may exceed
    /// the most pages it ever had in use, and its peak of allocated bytes,
    /// before it re-maps its own cached pages instead of creating new ones
    /// (`cachalot_reuse_slack`; below 0.05, the bytes may exceed their peak by
    /// 5%). Lower trades driver calls for less reserved memory. Default: 0.2,
    /// which no bundled recording replayed pass after pass reaches: each
    /// settles from its second pass at most at expandable segments' peak
    /// reserved. 0.035 holds a single pass of bert_dynamic to 1.048 times its
    /// peak requested bytes (2,445 driver calls instead of 226), but a serving
    /// workload then re-maps pages for good (llama_serve: 50 to 200 driver
    /// calls a pass).
    pub cachalot_reuse_slack: f64,
    /// `cachalot` policy: what a *churning* stream's budget adds to
    /// `cachalot_reuse_slack` (`cachalot_churn_slack`): one that has re-mapped
    /// twice as many pages as it holds, over at least 8 allocations per page and
    /// at least one page per 1000 allocations, without its peak of pages in use
    /// growing (a layout that never repeats, as with a new shape at every step).
    /// Higher trades reserved memory for fewer driver calls once a workload
    /// repeats. A churning stream also keeps its last 16 freed large blocks for
    /// exact-size reuse. 0 keeps the tight budget and no large blocks. A
    /// stream stays churning until `empty_cache` finds none of its large
    /// blocks live. Default: 0.15 (the least with which repeated passes of
    /// bert_dynamic settle: 0.15 makes no driver call from the seventh pass,
    /// 0.125 still about 100 to 370 per pass of 16,800 operations).
    pub cachalot_churn_slack: f64,
    /// `cachalot` policy: bytes of pages a stream may always map beyond the most
    /// it ever had in use, whatever the slack (`cachalot_reuse_min_mb`), so a
    /// small heap, whose slack is less than one large block, does not re-map
    /// at every step. Default: 32 MiB (below the slack of every bundled trace).
    pub cachalot_reuse_min: u64,
    /// `cachalot` policy: bytes of one physical handle at most where a block's
    /// own pages are mapped in bulk (`cachalot_extent_mb`); the driver's cost
    /// is per handle, so larger ones make the first pass faster, but a handle
    /// goes back only whole, once no live block touches it. 2 (one page) maps
    /// page by page, for workloads whose shapes change at every step.
    /// Default: 64 MiB.
    pub cachalot_extent: u64,
    /// `cachalot` policy: cached (mapped but unused) bytes a stream keeps; past it,
    /// frees unmap and release the least recently used pages
    /// (`cachalot_release_threshold_mb`). Default: unlimited (`None`).
    pub cachalot_release_threshold: Option<u64>,
    /// Where a CUDA device's segments come from (`segments`). Default: `auto`.
    #[serde(default)]
    pub segments: SegmentRoute,
    /// The string this configuration was parsed from.
    pub source: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            policy: PolicyKind::Pytorch,
            max_split_size: None,
            max_non_split_rounding: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_BUCKETS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: 1.0,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            graph_capture_record_stream_reuse: false,
            cachalot_reuse_slack: 0.2,
            cachalot_churn_slack: 0.15,
            cachalot_reuse_min: 32 * MIB,
            cachalot_extent: 64 * MIB,
            cachalot_release_threshold: None,
            segments: SegmentRoute::Auto,
            source: String::new(),
        }
    }
}

impl FromStr for AllocatorConfig {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        AllocatorConfig::parse(s)
    }
}

impl AllocatorConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF`-style string. The empty string gives the
    /// defaults.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first unknown key or bad value.
    pub fn parse(s: &str) -> Result<AllocatorConfig, ConfigError> {
        let mut cfg = AllocatorConfig {
            source: s.to_string(),
            ..AllocatorConfig::default()
        };
        for (key, value) in items(s)? {
            cfg.set(&key, &value)?;
        }
        Ok(cfg)
    }

    /// Sets one key from its string value.
    ///
    /// # Errors
    /// [`ConfigError::UnknownKey`] or [`ConfigError::BadValue`].
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "policy" => self.policy = value.parse()?,
            "segments" => self.segments = value.parse()?,
            "backend" if value == "native" => {}
            "backend" => return Err(ConfigError::bad(key, value, "only `native` is provided")),
            "max_split_size_mb" => self.max_split_size = Some(parse_mb_at_least_20(key, value)?),
            "max_non_split_rounding_mb" => {
                self.max_non_split_rounding = parse_mb_at_least_20(key, value)?
            }
            "roundup_power2_divisions" => self.roundup_power2_divisions = parse_divisions(value)?,
            "garbage_collection_threshold" => {
                let t = parse_f64(key, value)?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(ConfigError::bad(key, value, "must be within (0.0, 1.0)"));
                }
                self.garbage_collection_threshold = t;
            }
            "per_process_memory_fraction" => {
                self.per_process_memory_fraction = parse_fraction(key, value)?
            }
            "expandable_segments" => self.expandable_segments = parse_bool(key, value)?,
            "release_lock_on_cudamalloc" => {
                self.release_lock_on_cudamalloc = parse_bool(key, value)?
            }
            "pinned_use_cuda_host_register" => {
                self.pinned_use_cuda_host_register = parse_bool(key, value)?
            }
            "pinned_use_background_threads" => {
                self.pinned_use_background_threads = parse_bool(key, value)?
            }
            "graph_capture_record_stream_reuse" => {
                self.graph_capture_record_stream_reuse = parse_bool(key, value)?
            }
            "cachalot_reuse_slack" => self.cachalot_reuse_slack = parse_fraction(key, value)?,
            "cachalot_churn_slack" => self.cachalot_churn_slack = parse_fraction(key, value)?,
            "cachalot_release_threshold_mb" => {
                self.cachalot_release_threshold = Some(parse_mib(key, value)?);
            }
            "cachalot_reuse_min_mb" => self.cachalot_reuse_min = parse_mib(key, value)?,
            "cachalot_extent_mb" => {
                self.cachalot_extent = parse_mib(key, value)?;
                if self.cachalot_extent == 0 {
                    return Err(ConfigError::bad(key, value, "must be at least 1"));
                }
            }
            "large_segment_size_mb" if parse_u64(key, value)? == LARGE_SEGMENT_MB => {}
            "large_segment_size_mb" => {
                return Err(ConfigError::bad(
                    key,
                    value,
                    "cachalot grows the large pool in segments of 20 MiB only",
                ))
            }
            "release_lock_on_hipmalloc" => {
                self.release_lock_on_cudamalloc = parse_bool(key, value)?
            }
            "pinned_use_hip_host_register" => {
                self.pinned_use_cuda_host_register = parse_bool(key, value)?
            }
            // PyTorch's pinned host memory: checked here, used by PyTorch alone.
            "pinned_reserve_segment_size_mb" => {
                parse_u64(key, value)?;
            }
            "pinned_num_register_threads" => {
                let n = parse_u64(key, value)?;
                if !n.is_power_of_two() || n > 128 {
                    return Err(ConfigError::bad(
                        key,
                        value,
                        "must be a power of 2 no larger than 128",
                    ));
                }
                self.pinned_num_register_threads = n;
            }
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// PyTorch's settings `pytorch` (its `PYTORCH_ALLOC_CONF` string) with
    /// cachalot's `conf` over them: `conf` may choose the policy and set any
    /// key, and its keys must apply to that policy ([`Self::check_keys`]);
    /// `pytorch` may set PyTorch's keys only, which the cachalot policy takes
    /// and leaves unused where it has no such rule (it always maps pages).
    /// [`source`](Self::source) holds both, `pytorch` first.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad key or value of either string, or
    /// [`ConfigError::NotPytorchKey`] for a cachalot key in `pytorch`.
    pub fn layered(pytorch: &str, conf: &str) -> Result<AllocatorConfig, ConfigError> {
        let own = AllocatorConfig::parse(conf)?;
        own.check_keys()?;
        let mut cfg = AllocatorConfig {
            policy: own.policy,
            ..AllocatorConfig::default()
        };
        for (key, value) in items(pytorch)? {
            if key == "policy" || key == "segments" || key.starts_with("cachalot_") {
                return Err(ConfigError::NotPytorchKey(key.to_string()));
            }
            cfg.set(&key, &value)?;
        }
        for (key, value) in items(conf)? {
            cfg.set(&key, &value)?;
        }
        cfg.source = [pytorch.trim(), conf.trim()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(",");
        Ok(cfg)
    }

    /// The settings a program may change while it runs.
    pub fn placement_settings(&self) -> PlacementSettings {
        PlacementSettings {
            max_split_size: self.max_split_size,
            max_non_split_rounding: self.max_non_split_rounding,
            roundup_power2_divisions: self.roundup_power2_divisions,
            garbage_collection_threshold: self.garbage_collection_threshold,
            expandable_segments: self.expandable_segments,
            graph_capture_record_stream_reuse: self.graph_capture_record_stream_reuse,
        }
    }

    /// This configuration with `settings` in force.
    pub fn with_placement_settings(&self, settings: &PlacementSettings) -> AllocatorConfig {
        AllocatorConfig {
            max_split_size: settings.max_split_size,
            max_non_split_rounding: settings.max_non_split_rounding,
            roundup_power2_divisions: settings.roundup_power2_divisions,
            garbage_collection_threshold: settings.garbage_collection_threshold,
            expandable_segments: settings.expandable_segments,
            graph_capture_record_stream_reuse: settings.graph_capture_record_stream_reuse,
            ..self.clone()
        }
    }

    /// Checks that every key of [`source`](Self::source) applies to
    /// [`policy`](Self::policy) (see [`PolicyKind::of_key`]), which may have been
    /// set after parsing.
    ///
    /// # Errors
    /// [`ConfigError::OtherPolicy`] naming the first key that does not.
    pub fn check_keys(&self) -> Result<(), ConfigError> {
        let compact: String = self.source.chars().filter(|c| !c.is_whitespace()).collect();
        for item in split_top_level(&compact)? {
            let key = item.split_once(':').map_or(item, |(key, _)| key);
            if let Some(owner) = PolicyKind::of_key(key).filter(|o| *o != self.policy) {
                return Err(ConfigError::OtherPolicy {
                    key: key.to_string(),
                    owner,
                    policy: self.policy,
                });
            }
        }
        Ok(())
    }

    /// The divisions that apply to a (rounded or raw) request of `size` bytes.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - u64::from(size.max(1).leading_zeros());
        let start = MIB.trailing_zeros() as u64;
        let index = log.saturating_sub(start).min(ROUNDUP_BUCKETS as u64 - 1);
        self.roundup_power2_divisions[index as usize]
    }
}

/// The keys of PyTorch's allocator that a program may change while it runs
/// (`torch.cuda.memory._set_allocator_settings`): what PyTorch's parser
/// leaves in force after each change, handed over whole.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementSettings {
    /// See [`AllocatorConfig::max_split_size`].
    pub max_split_size: Option<u64>,
    /// See [`AllocatorConfig::max_non_split_rounding`].
    pub max_non_split_rounding: u64,
    /// See [`AllocatorConfig::roundup_power2_divisions`].
    pub roundup_power2_divisions: [u64; ROUNDUP_BUCKETS],
    /// See [`AllocatorConfig::garbage_collection_threshold`].
    pub garbage_collection_threshold: f64,
    /// See [`AllocatorConfig::expandable_segments`].
    pub expandable_segments: bool,
    /// See [`AllocatorConfig::graph_capture_record_stream_reuse`].
    pub graph_capture_record_stream_reuse: bool,
}

/// The only `large_segment_size_mb` cachalot takes (PyTorch's default).
const LARGE_SEGMENT_MB: u64 = 20;

/// The `key:value` pairs of a configuration string, whitespace removed.
fn items(s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    split_top_level(&compact)?
        .into_iter()
        .map(|item| {
            item.split_once(':')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| ConfigError::Syntax(item.into()))
        })
        .collect()
}

/// Splits a settings string on the commas that are not inside brackets (the
/// items of `PYTORCH_CUDA_ALLOC_CONF` syntax, list values kept whole).
///
/// # Errors
/// [`ConfigError::Syntax`] for unbalanced or nested brackets.
pub fn split_top_level(s: &str) -> Result<Vec<&str>, ConfigError> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(ConfigError::Syntax(s[start..].to_string()));
        }
    }
    if depth != 0 {
        return Err(ConfigError::Syntax(s[start..].to_string()));
    }
    items.push(&s[start..]);
    Ok(items.into_iter().filter(|i| !i.is_empty()).collect())
}

fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(ConfigError::bad(key, value, "expected `True` or `False`")),
    }
}

/// A count of MiB, as bytes.
fn parse_mib(key: &str, value: &str) -> Result<u64, ConfigError> {
    parse_u64(key, value)?
        .checked_mul(MIB)
        .ok_or_else(|| ConfigError::bad(key, value, "too large"))
}

fn parse_u64(key: &str, value: &str) -> Result<u64, ConfigError> {
    value
        .parse()
        .map_err(|_| ConfigError::bad(key, value, "expected a non-negative integer"))
}

/// A number within `[0, 1]`.
fn parse_fraction(key: &str, value: &str) -> Result<f64, ConfigError> {
    let f = parse_f64(key, value)?;
    if !(0.0..=1.0).contains(&f) {
        return Err(ConfigError::bad(key, value, "must be within [0.0, 1.0]"));
    }
    Ok(f)
}

fn parse_f64(key: &str, value: &str) -> Result<f64, ConfigError> {
    value
        .parse()
        .map_err(|_| ConfigError::bad(key, value, "expected a number"))
}

fn parse_mb_at_least_20(key: &str, value: &str) -> Result<u64, ConfigError> {
    let mb = parse_u64(key, value)?;
    if mb < 20 {
        return Err(ConfigError::bad(key, value, "must be at least 20 (MiB)"));
    }
    mb.checked_mul(MIB)
        .ok_or_else(|| ConfigError::bad(key, value, "too large"))
}

fn parse_division_value(value: &str) -> Result<u64, ConfigError> {
    let key = "roundup_power2_divisions";
    let v = parse_u64(key, value)?;
    if v != 0 && !v.is_power_of_two() {
        return Err(ConfigError::bad(
            key,
            value,
            "divisions must be a power of 2 or 0",
        ));
    }
    Ok(v)
}

/// Parses `4` or `[256:1,512:2,>:8]` (interval keys in MiB, powers of two).
fn parse_divisions(value: &str) -> Result<[u64; ROUNDUP_BUCKETS], ConfigError> {
    let key = "roundup_power2_divisions";
    let Some(list) = value.strip_prefix('[') else {
        return Ok([parse_division_value(value)?; ROUNDUP_BUCKETS]);
    };
    let list = list
        .strip_suffix(']')
        .ok_or_else(|| ConfigError::bad(key, value, "unclosed list"))?;
    let mut out = [0u64; ROUNDUP_BUCKETS];
    let mut last: Option<usize> = None;
    for pair in list.split(',').filter(|p| !p.is_empty()) {
        let (interval, divs) = pair
            .split_once(':')
            .ok_or_else(|| ConfigError::bad(key, pair, "expected interval:divisions"))?;
        let divs = parse_division_value(divs)?;
        if interval == ">" {
            let from = last.map_or(0, |l| l + 1);
            out[from.min(ROUNDUP_BUCKETS)..].fill(divs);
            continue;
        }
        let mb = parse_u64(key, interval)?;
        if !mb.is_power_of_two() {
            return Err(ConfigError::bad(
                key,
                interval,
                "intervals must be powers of 2 (MiB)",
            ));
        }
        let index = (63 - mb.leading_zeros() as usize).min(ROUNDUP_BUCKETS - 1);
        if last.is_none() {
            out[..index].fill(divs);
        }
        out[index] = divs;
        last = Some(index);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default() {
        let c = AllocatorConfig::parse("").unwrap();
        assert_eq!(c.max_split_size, None);
        assert_eq!(c.policy, PolicyKind::Pytorch);
    }

    #[test]
    fn parses_known_keys() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:64, expandable_segments:True,roundup_power2_divisions:4,policy:cachalot",
        )
        .unwrap();
        assert_eq!(c.max_split_size, Some(64 * MIB));
        assert!(c.expandable_segments);
        assert_eq!(c.roundup_power2_divisions, [4; ROUNDUP_BUCKETS]);
        assert_eq!(c.policy, PolicyKind::Cachalot);
    }

    #[test]
    fn parses_division_lists() {
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        let d = c.roundup_power2_divisions;
        assert_eq!(d[0], 1);
        assert_eq!(d[8], 1);
        assert_eq!(d[9], 2);
        assert_eq!(d[10], 4);
        assert_eq!(d[11..], [8; 5]);
        assert_eq!(c.divisions_for(300 * MIB), 1);
        assert_eq!(c.divisions_for(600 * MIB), 2);
        assert_eq!(c.divisions_for(1 << 40), 8);
    }

    #[test]
    fn errors_name_the_key() {
        let e = AllocatorConfig::parse("max_split_size_mb:10").unwrap_err();
        assert!(e.to_string().contains("max_split_size_mb"), "{e}");
        let e = AllocatorConfig::parse("bogus:1").unwrap_err();
        assert_eq!(e, ConfigError::UnknownKey("bogus".into()));
        assert!(AllocatorConfig::parse("expandable_segments:true").is_err());
        assert!(AllocatorConfig::parse("garbage_collection_threshold:1.0").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:3").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[256:1").is_err());
        assert!(AllocatorConfig::parse("expandable_segments").is_err());
        assert!(AllocatorConfig::parse("per_process_memory_fraction:1.5").is_err());
        assert!(AllocatorConfig::parse("cachalot_reuse_slack:2").is_err());
        assert!(AllocatorConfig::parse("cachalot_churn_slack:-0.1").is_err());
        assert!(AllocatorConfig::parse("cachalot_churn_slack:x").is_err());
        assert!(AllocatorConfig::parse("cachalot_release_threshold_mb:-1").is_err());
    }

    #[test]
    fn parses_cachalot_keys() {
        let c = AllocatorConfig::parse(
            "policy:cachalot,cachalot_reuse_slack:0.1,cachalot_release_threshold_mb:64,\
             cachalot_churn_slack:0",
        )
        .unwrap();
        assert_eq!(c.cachalot_reuse_slack, 0.1);
        assert_eq!(c.cachalot_churn_slack, 0.0);
        assert_eq!(AllocatorConfig::default().cachalot_churn_slack, 0.15);
        assert_eq!(c.cachalot_release_threshold, Some(64 * MIB));
        assert_eq!(AllocatorConfig::default().cachalot_reuse_slack, 0.2);
        assert_eq!(AllocatorConfig::default().cachalot_reuse_min, 32 * MIB);
        assert_eq!(AllocatorConfig::default().cachalot_extent, 64 * MIB);
        let c = AllocatorConfig::parse("cachalot_extent_mb:2").unwrap();
        assert_eq!(c.cachalot_extent, 2 * MIB);
        assert!(AllocatorConfig::parse("cachalot_extent_mb:0").is_err());
        let c = AllocatorConfig::parse("cachalot_reuse_min_mb:0").unwrap();
        assert_eq!(c.cachalot_reuse_min, 0);
        assert!(AllocatorConfig::parse("cachalot_reuse_min_mb:-1").is_err());
        assert!(AllocatorConfig::parse(&format!("cachalot_reuse_min_mb:{}", u64::MAX)).is_err());
    }

    #[test]
    fn the_segment_route_is_cachalots_key_for_both_policies() {
        assert_eq!(AllocatorConfig::default().segments, SegmentRoute::Auto);
        for policy in ["pytorch", "cachalot"] {
            let c =
                AllocatorConfig::layered("", &format!("policy:{policy},segments:runtime")).unwrap();
            assert_eq!(c.segments, SegmentRoute::Runtime);
        }
        assert!(matches!(
            AllocatorConfig::layered("segments:driver", ""),
            Err(ConfigError::NotPytorchKey(k)) if k == "segments"
        ));
        assert!(AllocatorConfig::parse("segments:cudaMalloc").is_err());
        assert!(SegmentRoute::Runtime.runtime(|| false));
        assert!(!SegmentRoute::Driver.runtime(|| true));
        assert!(SegmentRoute::Auto.runtime(|| true));
        assert!(!SegmentRoute::Auto.runtime(|| false));
    }

    #[test]
    fn pytorch_settings_lie_under_cachalots() {
        let c = AllocatorConfig::layered(
            "expandable_segments:True, max_split_size_mb:64,pinned_reserve_segment_size_mb:8",
            "max_split_size_mb:128",
        )
        .unwrap();
        assert_eq!(c.policy, PolicyKind::Pytorch);
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, Some(128 * MIB), "cachalot's string wins");
        assert_eq!(
            c.source,
            "expandable_segments:True, max_split_size_mb:64,pinned_reserve_segment_size_mb:8,max_split_size_mb:128"
        );
        let c = AllocatorConfig::layered("expandable_segments:True", "policy:cachalot").unwrap();
        assert_eq!(
            c.policy,
            PolicyKind::Cachalot,
            "PyTorch's keys are taken, and unused"
        );
        assert_eq!(
            AllocatorConfig::layered("", "").unwrap(),
            AllocatorConfig::default()
        );
        assert!(matches!(
            AllocatorConfig::layered("policy:cachalot", ""),
            Err(ConfigError::NotPytorchKey(_))
        ));
        assert!(AllocatorConfig::layered("", "policy:cachalot,expandable_segments:True").is_err());
        assert!(AllocatorConfig::layered("max_split_size_mb:2", "").is_err());
        assert!(AllocatorConfig::layered("large_segment_size_mb:20", "").is_ok());
        assert!(AllocatorConfig::layered("large_segment_size_mb:40", "").is_err());
        assert!(AllocatorConfig::layered("release_lock_on_hipmalloc:True", "").is_ok());
    }

    #[test]
    fn placement_settings_round_trip() {
        let c = AllocatorConfig::parse("policy:pytorch,cachalot_extent_mb:8").unwrap();
        let s = PlacementSettings {
            max_split_size: Some(40 * MIB),
            garbage_collection_threshold: 0.5,
            ..AllocatorConfig::default().placement_settings()
        };
        let d = c.with_placement_settings(&s);
        assert_eq!(d.placement_settings(), s);
        assert_eq!(d.cachalot_extent, 8 * MIB, "other keys stay");
    }

    #[test]
    fn keys_of_another_policy_are_named() {
        let mut c = AllocatorConfig::parse("policy:cachalot,expandable_segments:True").unwrap();
        let e = c.check_keys().unwrap_err();
        assert_eq!(
            e.to_string(),
            "allocator config key 'expandable_segments' applies to the pytorch policy, \
             not the cachalot policy"
        );
        c.policy = PolicyKind::Pytorch;
        assert_eq!(c.check_keys(), Ok(()));
        let c = AllocatorConfig::parse("cachalot_reuse_slack:0.1").unwrap();
        assert!(matches!(
            c.check_keys(),
            Err(ConfigError::OtherPolicy {
                owner: PolicyKind::Cachalot,
                policy: PolicyKind::Pytorch,
                ..
            })
        ));
        let both =
            "policy:cachalot,per_process_memory_fraction:0.5,release_lock_on_cudamalloc:True";
        assert_eq!(AllocatorConfig::parse(both).unwrap().check_keys(), Ok(()));
    }
}
