//! Tags by name: the pools behind `cachalot_torch.region`, `pause` and
//! `resume` ([`cachalot::sleep`]).
//!
//! A name covers any number of private pools, each on one device with one
//! backup: `region(tag, backup)` makes a `torch.cuda.MemPool` per tag, backup
//! and device, and a CUDA graph captured for a tag gets a pool of its own.
//! Python creates each pool and hands it over with `cachalot_tag_add`
//! ([`crate::regions`]); the
//! library makes it a tag. A pause or resume by name acts on every pool of
//! the name: a pause of a name whose pools are all paused, or a resume of one
//! with none paused, is the library's typed error; with no name, every tag's
//! pools that are awake are paused (or those paused are resumed), which is
//! never an error of state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use cachalot::private_pool::PoolId;
use cachalot::sleep::{Backup, SleepReport, TagState, WhenBusy};
use serde::Serialize;

use crate::error::{PluginError, PluginResult};
use crate::registry::Registry;

/// One pool of a name.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TagPool {
    /// Its device.
    pub device: usize,
    /// The pool (PyTorch's `MempoolId_t`).
    pub pool: (u64, u64),
    /// Where its bytes go while paused.
    pub backup: Backup,
}

impl TagPool {
    fn id(&self) -> PoolId {
        PoolId(self.pool.0, self.pool.1)
    }
}

/// What a pause or resume by name did, summed over the pools it acted on.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Pools paused or resumed.
    pub pools: usize,
    /// Their segments, bytes, copies and released cache, summed.
    #[serde(flatten)]
    pub report: SleepReport,
}

impl Totals {
    fn add(&mut self, r: SleepReport) {
        self.pools += 1;
        self.report.segments += r.segments;
        self.report.bytes += r.bytes;
        self.report.copied += r.copied;
        self.report.released += r.released;
    }
}

/// One pool of a name with where it stands, as [`TagBook::states`] lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolState {
    /// The name.
    pub tag: String,
    /// The pool.
    #[serde(flatten)]
    pub pool: TagPool,
    /// Where it stands.
    #[serde(flatten)]
    pub state: TagState,
}

/// The names of a process's tags and their pools.
#[derive(Debug, Default)]
pub struct TagBook {
    names: Mutex<BTreeMap<String, Vec<TagPool>>>,
}

impl TagBook {
    /// No tags.
    pub const fn new() -> TagBook {
        TagBook {
            names: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Vec<TagPool>>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes pool `pool` of `device` a tag with `backup`, under `name` (again:
    /// nothing more).
    ///
    /// # Errors
    /// The device's refusal ([`cachalot::sleep::SleepError`]), or a bad device.
    pub fn add(
        &self,
        registry: &Registry,
        name: &str,
        device: i64,
        pool: PoolId,
        backup: Backup,
    ) -> PluginResult<()> {
        let (device, allocator) = registry.open(device)?;
        allocator
            .make_tag(pool, backup)
            .map_err(PluginError::allocator(device))?;
        let entry = TagPool {
            device,
            pool: (pool.0, pool.1),
            backup,
        };
        let mut names = self.lock();
        let pools = names.entry(name.to_string()).or_default();
        if !pools.contains(&entry) {
            pools.push(entry);
        }
        Ok(())
    }

    /// Pauses the pools of `name` (every tag's when `None`), then gives the
    /// cache of free blocks of their devices back too (counted in
    /// `released`): a pause leaves the device as free as the program can.
    ///
    /// # Errors
    /// [`PluginError::UnknownTag`]; the first pool's refusal (the pools before
    /// it stay paused); a device whose cache cannot be released.
    pub fn pause(
        &self,
        registry: &Registry,
        name: Option<&str>,
        when_busy: WhenBusy,
    ) -> PluginResult<Totals> {
        let mut totals = self.each(registry, name, true, |a, id| a.pause_tag(id, when_busy))?;
        let devices: BTreeSet<usize> = self.pools(name)?.iter().map(|p| p.device).collect();
        for device in devices {
            let allocator = registry.device(device as i64)?;
            let before = allocator.memory_reserved();
            allocator
                .empty_cache()
                .map_err(PluginError::allocator(device))?;
            totals.report.released += before.saturating_sub(allocator.memory_reserved());
        }
        Ok(totals)
    }

    /// Resumes the pools of `name` (every tag's when `None`).
    ///
    /// # Errors
    /// As [`TagBook::pause`].
    pub fn resume(&self, registry: &Registry, name: Option<&str>) -> PluginResult<Totals> {
        self.each(registry, name, false, |a, id| a.resume_tag(id))
    }

    /// Every pool of every name with where it stands.
    ///
    /// # Errors
    /// A device that cannot answer.
    pub fn states(&self, registry: &Registry) -> PluginResult<Vec<PoolState>> {
        self.forget_gone(registry);
        let mut out = Vec::new();
        for (tag, pools) in self.lock().iter() {
            for pool in pools {
                let allocator = registry.device(pool.device as i64)?;
                let state = allocator
                    .tag_state(pool.id())
                    .map_err(PluginError::allocator(pool.device))?;
                out.push(PoolState {
                    tag: tag.clone(),
                    pool: *pool,
                    state,
                });
            }
        }
        Ok(out)
    }

    /// Runs `act` on each pool of `name` (of every name when `None`) whose
    /// paused state is not `pausing` yet; with a name and no such pool, on
    /// the first pool, to get the library's error of state.
    fn each(
        &self,
        registry: &Registry,
        name: Option<&str>,
        pausing: bool,
        act: impl Fn(&dyn cachalot::DeviceAllocator, PoolId) -> cachalot::Result<SleepReport>,
    ) -> PluginResult<Totals> {
        self.forget_gone(registry);
        let pools = self.pools(name)?;
        let mut totals = Totals::default();
        let mut acted = false;
        for pool in &pools {
            let allocator = registry.device(pool.device as i64)?;
            let state = allocator
                .tag_state(pool.id())
                .map_err(PluginError::allocator(pool.device))?;
            if state.paused == pausing {
                continue;
            }
            acted = true;
            let report =
                act(allocator.as_ref(), pool.id()).map_err(PluginError::allocator(pool.device))?;
            totals.add(report);
        }
        if let (false, Some(first), Some(_)) = (acted, pools.first(), name) {
            let allocator = registry.device(first.device as i64)?;
            act(allocator.as_ref(), first.id()).map_err(PluginError::allocator(first.device))?;
        }
        Ok(totals)
    }

    /// Forgets the pools their devices no longer know (their `MemPool`s
    /// went and the library forgot them once empty), and names left with
    /// none.
    fn forget_gone(&self, registry: &Registry) {
        let mut names = self.lock();
        for pools in names.values_mut() {
            pools.retain(|p| {
                registry
                    .device(p.device as i64)
                    .is_ok_and(|a| a.pool_options(p.id()).is_ok())
            });
        }
        names.retain(|_, pools| !pools.is_empty());
    }

    /// The pools of `name`, or of every name.
    fn pools(&self, name: Option<&str>) -> PluginResult<Vec<TagPool>> {
        let names = self.lock();
        let Some(name) = name else {
            return Ok(names.values().flatten().copied().collect());
        };
        names
            .get(name)
            .cloned()
            .ok_or_else(|| PluginError::UnknownTag {
                name: name.to_string(),
                known: match names.len() {
                    0 => "no tags yet".to_string(),
                    _ => format!(
                        "tags: {}",
                        names.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                },
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cachalot::backend::sim::SimBackend;
    use cachalot::sleep::SleepError;
    use cachalot::{AllocatorConfig, Error, StreamId};

    use super::*;
    use crate::registry::OpenedDevice;

    const MIB: u64 = 1 << 20;

    fn sim_registry() -> Registry {
        let factory = |device: usize, config: &AllocatorConfig| -> cachalot::Result<OpenedDevice> {
            let backend = Arc::new(SimBackend::new(1 << 30).with_device(device));
            Ok(OpenedDevice {
                allocator: cachalot::allocator::create(backend, config.clone())?,
                register_stream: None,
            })
        };
        Registry::new(AllocatorConfig::parse("").unwrap(), Box::new(factory))
    }

    /// A pool of `device` made a tag named `name`, with `size` bytes in it.
    fn region(
        r: &Registry,
        book: &TagBook,
        name: &str,
        device: i64,
        pool: PoolId,
        backup: Backup,
        size: u64,
    ) -> u64 {
        let a = r.device(device).unwrap();
        a.create_pool(pool).unwrap();
        book.add(r, name, device, pool, backup).unwrap();
        a.begin_allocate_to_pool(pool, Arc::new(|_| true)).unwrap();
        let p = a.malloc(size, StreamId::DEFAULT).unwrap();
        a.end_allocate_to_pool(pool).unwrap();
        a.release_pool(pool).unwrap();
        p
    }

    fn sleep_error(e: PluginError) -> SleepError {
        match e {
            PluginError::Allocator {
                source: Error::Sleep(s),
                ..
            } => s,
            other => panic!("not a sleep error: {other}"),
        }
    }

    #[test]
    fn a_name_pauses_and_resumes_its_pools_on_every_device() {
        let (r, book) = (sim_registry(), TagBook::new());
        region(
            &r,
            &book,
            "weights",
            0,
            PoolId(0, 1),
            Backup::Host,
            30 * MIB,
        );
        region(
            &r,
            &book,
            "weights",
            0,
            PoolId(0, 2),
            Backup::None,
            20 * MIB,
        );
        region(
            &r,
            &book,
            "weights",
            1,
            PoolId(0, 1),
            Backup::Host,
            10 * MIB,
        );
        region(&r, &book, "kv", 0, PoolId(0, 3), Backup::None, 40 * MIB);
        book.add(&r, "weights", 0, PoolId(0, 1), Backup::Host)
            .unwrap();
        let paused = book
            .pause(&r, Some("weights"), WhenBusy::Synchronize)
            .unwrap();
        assert_eq!((paused.pools, paused.report.bytes), (3, 60 * MIB));
        assert_eq!(paused.report.copied, 40 * MIB);
        assert_eq!(
            r.device(0).unwrap().stats().paused_bytes.current as u64,
            50 * MIB
        );
        let e = book
            .pause(&r, Some("weights"), WhenBusy::Synchronize)
            .unwrap_err();
        assert!(matches!(sleep_error(e), SleepError::AlreadyPaused { .. }));
        let e = book.resume(&r, Some("kv")).unwrap_err();
        assert!(matches!(sleep_error(e), SleepError::NotPaused { .. }));
        let all = book.pause(&r, None, WhenBusy::Synchronize).unwrap();
        assert_eq!(
            (all.pools, all.report.bytes),
            (1, 40 * MIB),
            "only kv was awake"
        );
        let states = book.states(&r).unwrap();
        assert_eq!(states.len(), 4);
        assert!(states.iter().all(|s| s.state.paused));
        let text = serde_json::to_string(&states).unwrap();
        assert!(
            text.contains("\"tag\":\"kv\"") && text.contains("\"backup\":\"host\""),
            "{text}"
        );
        let back = book.resume(&r, None).unwrap();
        assert_eq!((back.pools, back.report.bytes), (4, 100 * MIB));
        assert!(
            book.resume(&r, None).unwrap().pools == 0,
            "nothing left to resume"
        );
        for (d, a) in r.devices() {
            a.validate().unwrap_or_else(|e| panic!("device {d}: {e}"));
            assert_eq!(a.stats().paused_bytes.current, 0);
        }
    }

    #[test]
    fn unknown_names_and_bad_arguments_say_what_to_do() {
        let (r, book) = (sim_registry(), TagBook::new());
        let e = book
            .pause(&r, Some("weights"), WhenBusy::Synchronize)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "no tag named \"weights\" (no tags yet): allocate inside cachalot_torch.region(\"weights\") first"
        );
        assert_eq!(
            book.pause(&r, None, WhenBusy::Synchronize).unwrap(),
            Totals::default()
        );
        region(&r, &book, "kv", 0, PoolId(0, 3), Backup::None, MIB);
        let e = book.resume(&r, Some("kv_cache")).unwrap_err();
        assert!(e.to_string().contains("(tags: kv)"), "{e}");
        let e = book
            .add(&r, "kv", 0, PoolId(0, 3), Backup::Host)
            .unwrap_err();
        assert!(matches!(sleep_error(e), SleepError::OtherBackup { .. }));
        assert_eq!(book.states(&r).unwrap().len(), 1);
    }

    #[test]
    fn a_pause_gives_the_devices_cache_of_free_blocks_back_too() {
        let (r, book) = (sim_registry(), TagBook::new());
        region(&r, &book, "kv", 0, PoolId(0, 1), Backup::None, 20 * MIB);
        let a = r.device(0).unwrap();
        let cached = a.malloc(30 * MIB, StreamId::DEFAULT).unwrap();
        a.free(cached).unwrap();
        assert_eq!(a.memory_reserved(), 50 * MIB);
        let done = book.pause(&r, Some("kv"), WhenBusy::Synchronize).unwrap();
        assert_eq!(
            (done.report.bytes, done.report.released),
            (20 * MIB, 30 * MIB)
        );
        assert_eq!(a.memory_reserved(), 0, "the tag paused, the cache released");
        a.validate().unwrap();
    }

    /// A tag whose MemPool went (its last use released, its memory freed and
    /// the cache emptied) leaves the book: listing tags and pausing every
    /// tag do not stumble on it.
    #[test]
    fn tags_whose_pools_went_are_forgotten() {
        let (r, book) = (sim_registry(), TagBook::new());
        let p = region(&r, &book, "kv", 0, PoolId(0, 10), Backup::None, MIB);
        region(&r, &book, "weights", 0, PoolId(0, 11), Backup::None, MIB);
        let a = r.device(0).unwrap();
        a.free(p).unwrap();
        a.release_pool(PoolId(0, 10)).unwrap();
        a.empty_cache().unwrap();
        let states = book.states(&r).unwrap();
        assert_eq!(states.len(), 1);
        assert_eq!(states[0].tag, "weights");
        assert_eq!(
            book.pause(&r, None, WhenBusy::Synchronize).unwrap().pools,
            1
        );
        a.validate().unwrap();
    }
}
