//! The per-device allocators of one process, created on first use.
//!
//! PyTorch hands the plug-in a device ordinal with every allocation. The
//! [`Registry`] keeps one [`DeviceAllocator`] per ordinal, built on first use by a
//! factory (over the CUDA backend in the shipped library, over the simulated
//! device in tests), all with the same [`AllocatorConfig`]. Lookups after creation
//! take no lock. Streams the allocator may queue work on are made known to the
//! backend first ([`KnownStreams`]).
//!
//! The registry itself is an ordinary value; the one process-global instance lives
//! in [`crate::ffi`], so the `cachalot` library keeps no singletons.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use cachalot::config::PlacementSettings;
use cachalot::history::{History, HistoryConfig};
use cachalot::{AllocatorConfig, DeviceAllocator, DevicePtr, Error, StreamId};

use crate::error::{PluginError, PluginResult};
use crate::streams::{KnownStreams, StreamRegistrar};
use crate::tags::Tagged;

/// The highest number of devices the registry serves (ordinals `0..MAX_DEVICES`).
pub const MAX_DEVICES: usize = 64;

/// What a factory opens for one device.
pub struct OpenedDevice {
    /// The device's allocator.
    pub allocator: Arc<dyn DeviceAllocator>,
    /// For backends that accept only streams they were told about: tells the
    /// backend about a stream.
    pub register_stream: Option<Box<StreamRegistrar>>,
}

impl std::fmt::Debug for OpenedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedDevice")
            .field("allocator", &self.allocator)
            .field("register_stream", &self.register_stream.is_some())
            .finish()
    }
}

/// Opens one device with a configuration.
pub type DeviceFactory =
    dyn Fn(usize, &AllocatorConfig) -> cachalot::Result<OpenedDevice> + Send + Sync;

/// One open device.
#[derive(Debug)]
struct Slot {
    allocator: Arc<dyn DeviceAllocator>,
    streams: Option<KnownStreams>,
    /// When the allocator was created, in microseconds since the Unix epoch: its
    /// events are stamped in microseconds since then.
    opened_unix_us: u64,
}

impl Slot {
    /// Registers `stream` with the backend if it is new (the default stream
    /// never needs it: the common case, checked here without a call).
    #[inline]
    fn note_stream(&self, stream: StreamId) {
        if let Some(streams) = self
            .streams
            .as_ref()
            .filter(|_| stream != StreamId::DEFAULT)
        {
            streams.note(stream);
        }
    }
}

/// History recording: the settings in force and each device's recorder.
#[derive(Debug, Default)]
struct Recording {
    /// `Some` while recording (devices created later start recording too).
    config: Option<HistoryConfig>,
    /// Each device's recorder, kept after recording stops so that a snapshot
    /// taken then still holds the events.
    devices: BTreeMap<usize, Arc<History>>,
}

impl Recording {
    fn start(&mut self, device: usize, allocator: &Arc<dyn DeviceAllocator>) {
        if let Some(config) = &self.config {
            let history = Arc::new(History::new(config.clone()));
            allocator.set_observer(Some(Arc::new(Tagged(history.clone()))));
            self.devices.insert(device, history);
        }
    }
}

/// One allocator per device, created lazily.
pub struct Registry {
    config: RwLock<AllocatorConfig>,
    factory: Box<DeviceFactory>,
    slots: Box<[OnceLock<Slot>]>,
    /// Held while a device's allocator is being created, so it is created once.
    creating: Mutex<()>,
    /// How many devices have been opened.
    open_count: AtomicUsize,
    /// History recording, applied to devices created later too.
    recording: Mutex<Recording>,
    /// `empty_cache` calls each device has missed by not being open yet.
    /// PyTorch builds every device's allocator at `torch.cuda.init()` and each
    /// call counts a sync of all streams (`num_sync_all_streams`) on each; a
    /// device opened later makes up for them (opening every device at once
    /// would make a CUDA context on every GPU).
    missed_empty_caches: Box<[AtomicU64]>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.config().source)
            .field(
                "devices",
                &self.devices().map(|(d, _)| d).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Registry {
    /// A registry whose devices are built by `factory` with `config`.
    pub fn new(config: AllocatorConfig, factory: Box<DeviceFactory>) -> Registry {
        Registry {
            config: RwLock::new(config),
            factory,
            slots: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            creating: Mutex::new(()),
            open_count: AtomicUsize::new(0),
            recording: Mutex::new(Recording::default()),
            missed_empty_caches: (0..MAX_DEVICES).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The configuration a device's allocator gets when it opens, with the
    /// settings changed since.
    pub fn config(&self) -> AllocatorConfig {
        self.config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts PyTorch's run-time settings in force on every open device and on
    /// devices opened later (`torch.cuda.memory._set_allocator_settings`).
    pub fn set_placement_settings(&self, settings: &PlacementSettings) {
        // Same lock order as `open`: no device opens with the old settings meanwhile.
        let _creating = self.creating.lock().unwrap_or_else(PoisonError::into_inner);
        let mut config = self.config.write().unwrap_or_else(PoisonError::into_inner);
        *config = config.with_placement_settings(settings);
        for (_, allocator) in self.devices() {
            allocator.set_placement_settings(settings);
        }
    }

    /// The allocator of `device`, created now if this is its first use.
    ///
    /// # Errors
    /// [`PluginError::InvalidDevice`] outside `0..MAX_DEVICES`;
    /// [`PluginError::Allocator`] when the device cannot be opened.
    pub fn device(&self, device: i64) -> PluginResult<&Arc<dyn DeviceAllocator>> {
        self.open(device).map(|(_, allocator)| allocator)
    }

    /// [`Registry::device`], with the ordinal as an index.
    ///
    /// # Errors
    /// As [`Registry::device`].
    pub fn open(&self, device: i64) -> PluginResult<(usize, &Arc<dyn DeviceAllocator>)> {
        self.slot(device)
            .map(|(index, slot)| (index, &slot.allocator))
    }

    #[inline]
    fn slot(&self, device: i64) -> PluginResult<(usize, &Slot)> {
        let index = usize::try_from(device)
            .ok()
            .filter(|&d| d < MAX_DEVICES)
            .ok_or(PluginError::InvalidDevice(device))?;
        match self.slots[index].get() {
            Some(slot) => Ok((index, slot)),
            None => self.open_slot(index),
        }
    }

    /// Opens device `index` (its first use; another thread may be opening it).
    #[cold]
    #[inline(never)]
    fn open_slot(&self, index: usize) -> PluginResult<(usize, &Slot)> {
        let cell = &self.slots[index];
        let _creating = self.creating.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = cell.get() {
            return Ok((index, slot));
        }
        let opened_unix_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let opened =
            (self.factory)(index, &self.config()).map_err(PluginError::allocator(index))?;
        for _ in 0..self.missed_empty_caches[index].swap(0, Ordering::AcqRel) {
            opened
                .allocator
                .empty_cache()
                .map_err(PluginError::allocator(index))?;
        }
        self.recording
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .start(index, &opened.allocator);
        let slot = Slot {
            allocator: opened.allocator,
            streams: opened.register_stream.map(KnownStreams::new),
            opened_unix_us,
        };
        self.open_count.fetch_add(1, Ordering::Release);
        Ok((index, cell.get_or_init(|| slot)))
    }

    /// How many devices have been opened (cheap: one atomic load).
    pub fn open_count(&self) -> usize {
        self.open_count.load(Ordering::Acquire)
    }

    /// The devices created so far, by ordinal.
    pub fn devices(&self) -> impl Iterator<Item = (usize, &Arc<dyn DeviceAllocator>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(d, cell)| cell.get().map(|slot| (d, &slot.allocator)))
    }

    /// Allocates `size` bytes on `device` for use on `stream`; 0 bytes give the
    /// null address.
    ///
    /// # Errors
    /// [`PluginError::InvalidArgument`] for a negative size; the allocator's error
    /// (out of memory above all).
    pub fn malloc(&self, size: i64, device: i64, stream: StreamId) -> PluginResult<DevicePtr> {
        let size = u64::try_from(size)
            .map_err(|_| PluginError::InvalidArgument(format!("negative size {size}")))?;
        let (index, slot) = self.slot(device)?;
        slot.note_stream(stream);
        slot.allocator
            .malloc(size, stream)
            .map_err(|e| match e {
                // The message PyTorch raises carries the breakdown.
                Error::OutOfMemory(report) => {
                    let breakdown = slot.allocator.oom_breakdown();
                    Error::OutOfMemory(Box::new(report.with_breakdown(breakdown)))
                }
                other => other,
            })
            .map_err(PluginError::allocator(index))
    }

    /// Frees an allocation of `device`. The null address is a no-op.
    ///
    /// # Errors
    /// [`PluginError::UnknownPointer`] when `device` was never opened; the
    /// allocator's error for a double or foreign free (nothing changes).
    pub fn free(&self, ptr: DevicePtr, device: i64) -> PluginResult<()> {
        if ptr == 0 {
            return Ok(());
        }
        // A device never opened handed nothing out: do not open it for a free.
        let index = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES);
        let Some((index, slot)) = index.and_then(|i| self.slots[i].get().map(|s| (i, s))) else {
            return Err(PluginError::UnknownPointer(ptr));
        };
        slot.allocator
            .free(ptr)
            .map_err(PluginError::allocator(index))
    }

    /// When `device` was opened, in microseconds since the Unix epoch (its
    /// events' times count from then); `None` when it was never opened.
    pub fn opened_unix_us(&self, device: usize) -> Option<u64> {
        self.slots
            .get(device)?
            .get()
            .map(|slot| slot.opened_unix_us)
    }

    /// Frees an allocation of whichever device handed it out (PyTorch's deleters
    /// name no device). The null address is a no-op.
    ///
    /// # Errors
    /// [`PluginError::UnknownPointer`] when no device handed `ptr` out.
    pub fn free_any(&self, ptr: DevicePtr) -> PluginResult<()> {
        if ptr == 0 {
            return Ok(());
        }
        for (device, allocator) in self.devices() {
            match allocator.free(ptr) {
                Ok(()) => return Ok(()),
                Err(cachalot::Error::InvalidFree { .. }) if self.open_count() > 1 => continue,
                Err(e) => return Err(PluginError::allocator(device)(e)),
            }
        }
        Err(PluginError::UnknownPointer(ptr))
    }

    /// Marks `ptr` as used by `stream`, so its free waits for the work queued
    /// there. PyTorch's hook names no device, so each created device is asked.
    ///
    /// # Errors
    /// [`PluginError::UnknownPointer`] when no device handed `ptr` out.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> PluginResult<()> {
        for cell in self.slots.iter() {
            let Some(slot) = cell.get() else { continue };
            // Only the owner learns the stream: it belongs to the owner's device.
            // The allocator queues work on it at the free, not now.
            if slot.allocator.record_stream(ptr, stream).is_ok() {
                slot.note_stream(stream);
                return Ok(());
            }
        }
        Err(PluginError::UnknownPointer(ptr))
    }

    /// Returns every device's cached, unused memory to the driver; a device
    /// not open yet counts the call, as PyTorch's does, when it opens.
    ///
    /// # Errors
    /// The first device failure; the other devices are still emptied.
    pub fn empty_cache(&self) -> PluginResult<()> {
        // Same lock order as `open`: no device can open between the count of
        // a missed call and the calls it makes up for.
        let _creating = self.creating.lock().unwrap_or_else(PoisonError::into_inner);
        let mut first = Ok(());
        for (device, slot) in self.slots.iter().enumerate() {
            let Some(slot) = slot.get() else {
                self.missed_empty_caches[device].fetch_add(1, Ordering::AcqRel);
                continue;
            };
            if let Err(e) = slot.allocator.empty_cache() {
                first = first.and(Err(PluginError::Allocator { device, source: e }));
            }
        }
        first
    }

    /// Limits `device` to `fraction` of its memory.
    ///
    /// # Errors
    /// [`PluginError::Allocator`] for a fraction outside `[0, 1]`.
    pub fn set_memory_fraction(&self, fraction: f64, device: i64) -> PluginResult<()> {
        let (index, allocator) = self.open(device)?;
        allocator
            .set_memory_fraction(fraction)
            .map_err(PluginError::allocator(index))
    }

    /// `memory_stats(device)` as a JSON object with PyTorch's flattened keys.
    ///
    /// # Errors
    /// [`PluginError::InvalidDevice`], or the device cannot be opened.
    pub fn stats_json(&self, device: i64) -> PluginResult<String> {
        let stats = self.device(device)?.stats();
        Ok(serde_json::Value::from_iter(
            stats
                .to_map()
                .into_iter()
                .map(|(k, v)| (k, serde_json::Value::from(v))),
        )
        .to_string())
    }

    /// Starts (`Some`) or stops (`None`) history recording on every device, now
    /// and for devices created later. Starting makes fresh recorders unless
    /// recording is already on and `clear` is false; stopping keeps the events
    /// for snapshots unless `clear` is true.
    pub fn set_history(&self, config: Option<HistoryConfig>, clear: bool) {
        // Same lock order as `open`: no device can be half-created meanwhile.
        let _creating = self.creating.lock().unwrap_or_else(PoisonError::into_inner);
        let mut recording = self
            .recording
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let keep = config.is_some() && recording.config.is_some() && !clear;
        recording.config = config;
        if keep {
            return;
        }
        for (device, allocator) in self.devices() {
            if recording.config.is_some() {
                recording.start(device, allocator);
            } else {
                allocator.set_observer(None);
                if clear {
                    recording.devices.remove(&device);
                }
            }
        }
    }

    /// The recorder of `device`, if history was ever recorded there.
    pub fn history(&self, device: usize) -> Option<Arc<History>> {
        self.recording
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .devices
            .get(&device)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cachalot::backend::sim::SimBackend;
    use cachalot::event::Action;

    use super::*;

    const MIB: u64 = 1 << 20;

    /// Streams registered, by device.
    type StreamLog = Arc<Mutex<Vec<(usize, StreamId)>>>;

    /// A registry over simulated H100s that counts factory calls and stream
    /// registrations.
    fn sim_registry(conf: &str) -> (Registry, Arc<AtomicUsize>, StreamLog) {
        let opened = Arc::new(AtomicUsize::new(0));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let (o, s) = (opened.clone(), streams.clone());
        let factory =
            move |device: usize, config: &AllocatorConfig| -> cachalot::Result<OpenedDevice> {
                o.fetch_add(1, Ordering::SeqCst);
                let backend = Arc::new(SimBackend::h100().with_device(device));
                let allocator = cachalot::allocator::create(backend, config.clone())?;
                let log = s.clone();
                let register_stream =
                    Box::new(move |stream| log.lock().unwrap().push((device, stream)));
                Ok(OpenedDevice {
                    allocator,
                    register_stream: Some(register_stream),
                })
            };
        (
            Registry::new(AllocatorConfig::parse(conf).unwrap(), Box::new(factory)),
            opened,
            streams,
        )
    }

    #[test]
    fn devices_open_once_on_first_use_even_under_contention() {
        let (registry, opened, _) = sim_registry("");
        assert_eq!(registry.devices().count(), 0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    let p = registry.malloc(4096, 0, StreamId::DEFAULT).unwrap();
                    registry.free(p, 0).unwrap();
                });
            }
        });
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        registry.device(3).unwrap();
        assert_eq!(
            registry.devices().map(|(d, _)| d).collect::<Vec<_>>(),
            [0, 3]
        );
        assert_eq!(opened.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let (registry, opened, _) = sim_registry("");
        assert!(matches!(
            registry.malloc(8, -1, StreamId::DEFAULT),
            Err(PluginError::InvalidDevice(-1))
        ));
        assert!(matches!(
            registry.malloc(8, 64, StreamId::DEFAULT),
            Err(PluginError::InvalidDevice(64))
        ));
        assert!(matches!(
            registry.malloc(-8, 0, StreamId::DEFAULT),
            Err(PluginError::InvalidArgument(_))
        ));
        assert_eq!(registry.malloc(0, 0, StreamId::DEFAULT).unwrap(), 0);
        registry.free(0, 0).unwrap();
        let foreign = registry.free(0xdead_0000, 0).unwrap_err();
        assert!(
            foreign.to_string().starts_with("device 0: invalid free"),
            "{foreign}"
        );
        assert!(matches!(
            registry.record_stream(0xdead_0000, StreamId(5)),
            Err(PluginError::UnknownPointer(_))
        ));
        assert!(registry.set_memory_fraction(1.5, 0).is_err());
        // A free never opens a device: one never opened handed nothing out.
        assert!(matches!(
            registry.free(0x1000, 5),
            Err(PluginError::UnknownPointer(0x1000))
        ));
        assert!(matches!(
            registry.free(0x1000, -3),
            Err(PluginError::UnknownPointer(0x1000))
        ));
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        assert_eq!(registry.open_count(), 1);
        registry.device(0).unwrap().validate().unwrap();
    }

    #[test]
    fn a_failing_device_is_reported_and_retried() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let factory = move |_: usize, _: &AllocatorConfig| -> cachalot::Result<OpenedDevice> {
            c.fetch_add(1, Ordering::SeqCst);
            Err(cachalot::backend::BackendError::Unavailable("no GPU".into()).into())
        };
        let registry = Registry::new(AllocatorConfig::default(), Box::new(factory));
        let e = registry.malloc(8, 1, StreamId::DEFAULT).unwrap_err();
        assert_eq!(
            e.to_string(),
            "device 1: device failure: no GPU available: no GPU"
        );
        assert!(registry.malloc(8, 1, StreamId::DEFAULT).is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(registry.devices().count(), 0);
    }

    #[test]
    fn an_empty_cache_before_a_device_opens_counts_there_as_in_pytorch() {
        let (registry, opened, _) = sim_registry("");
        let syncs = |device: i64| {
            let stats: serde_json::Value =
                serde_json::from_str(&registry.stats_json(device).unwrap()).unwrap();
            stats["num_sync_all_streams"].as_i64().unwrap()
        };
        registry.empty_cache().unwrap();
        registry.empty_cache().unwrap();
        assert_eq!(opened.load(Ordering::SeqCst), 0, "counting opens nothing");
        assert_eq!(syncs(0), 2);
        registry.empty_cache().unwrap();
        assert_eq!(syncs(0), 3, "an open device counts its own");
        assert_eq!(syncs(1), 3, "device 1 opens with the three it missed");
        registry.device(1).unwrap().reset_accumulated_stats();
        assert_eq!(syncs(1), 0);
        registry.device(0).unwrap().validate().unwrap();
    }

    #[test]
    fn stats_json_has_pytorch_keys_and_follows_allocations() {
        let (registry, _, _) = sim_registry("");
        let p = registry
            .malloc(3 * MIB as i64, 0, StreamId::DEFAULT)
            .unwrap();
        let stats: serde_json::Value =
            serde_json::from_str(&registry.stats_json(0).unwrap()).unwrap();
        assert_eq!(stats["allocated_bytes.all.current"], 3 * MIB);
        assert_eq!(stats["requested_bytes.large_pool.current"], 3 * MIB);
        assert_eq!(stats["allocation.all.current"], 1);
        assert_eq!(stats["max_split_size"], -1);
        registry.free(p, 0).unwrap();
        registry.empty_cache().unwrap();
        let stats: serde_json::Value =
            serde_json::from_str(&registry.stats_json(0).unwrap()).unwrap();
        assert_eq!(stats["allocated_bytes.all.current"], 0);
        assert_eq!(stats["reserved_bytes.all.current"], 0);
        assert_eq!(stats["reserved_bytes.all.peak"], 20 * MIB);
    }

    #[test]
    fn run_time_settings_reach_open_devices_and_later_ones() {
        let (registry, _, _) = sim_registry("");
        let allocated = |device: i64| {
            registry
                .device(device)
                .unwrap()
                .stats()
                .allocated_bytes
                .all
                .current
        };
        registry
            .malloc(84 * MIB as i64, 0, StreamId::DEFAULT)
            .unwrap();
        let mut settings = registry.config().placement_settings();
        settings.roundup_power2_divisions = [4; cachalot::config::ROUNDUP_BUCKETS];
        registry.set_placement_settings(&settings);
        registry
            .malloc(84 * MIB as i64, 0, StreamId::DEFAULT)
            .unwrap();
        assert_eq!(allocated(0), (84 + 96) * MIB as i64);
        registry
            .malloc(84 * MIB as i64, 1, StreamId::DEFAULT)
            .unwrap();
        assert_eq!(allocated(1), 96 * MIB as i64, "opened after the change");
        assert_eq!(registry.config().roundup_power2_divisions[0], 4);
    }

    #[test]
    fn streams_are_registered_with_their_own_device_only() {
        let (registry, _, streams) = sim_registry("");
        let a = registry.malloc(4096, 0, StreamId(0x10)).unwrap();
        // Simulated devices share an address range: move device 1's block away
        // from device 0's (real GPUs share one unified address space).
        registry
            .malloc(8 * MIB as i64, 1, StreamId::DEFAULT)
            .unwrap();
        let b = registry.malloc(4096, 1, StreamId::DEFAULT).unwrap();
        assert_ne!(a, b);
        registry.malloc(4096, 0, StreamId(0x10)).unwrap();
        registry.record_stream(b, StreamId(0x20)).unwrap();
        registry.record_stream(a, StreamId(0x20)).unwrap();
        assert_eq!(
            *streams.lock().unwrap(),
            [
                (0, StreamId(0x10)),
                (1, StreamId(0x20)),
                (0, StreamId(0x20))
            ]
        );
    }

    #[test]
    fn a_recorded_stream_holds_the_block_until_it_passes_the_free() {
        let backend = Arc::new(SimBackend::h100());
        backend.set_manual_events(true);
        let b = backend.clone();
        let factory = move |_: usize, config: &AllocatorConfig| -> cachalot::Result<OpenedDevice> {
            let allocator = cachalot::allocator::create(b.clone(), config.clone())?;
            Ok(OpenedDevice {
                allocator,
                register_stream: None,
            })
        };
        let registry = Registry::new(AllocatorConfig::default(), Box::new(factory));
        let side = StreamId(0x5);
        let first = registry
            .malloc(MIB as i64 * 4, 0, StreamId::DEFAULT)
            .unwrap();
        registry.record_stream(first, side).unwrap();
        registry.free(first, 0).unwrap();
        let second = registry
            .malloc(MIB as i64 * 4, 0, StreamId::DEFAULT)
            .unwrap();
        assert_ne!(
            second, first,
            "reused while the side stream may still read it"
        );
        backend.complete_stream(side);
        registry.free(second, 0).unwrap();
        let third = registry
            .malloc(MIB as i64 * 4, 0, StreamId::DEFAULT)
            .unwrap();
        assert!(third == first || third == second);
        registry.device(0).unwrap().validate().unwrap();
    }

    #[test]
    fn history_reaches_devices_opened_before_and_after_it_starts() {
        let (registry, _, _) = sim_registry("");
        let before = registry.malloc(4096, 0, StreamId::DEFAULT).unwrap();
        registry.set_history(Some(HistoryConfig::default()), false);
        registry.free(before, 0).unwrap();
        let after = registry.malloc(4096, 2, StreamId::DEFAULT).unwrap();
        registry.set_history(None, false);
        registry.free(after, 2).unwrap();
        let actions = |d| {
            registry
                .history(d)
                .unwrap()
                .events()
                .iter()
                .map(|e| e.event.action)
                .collect::<Vec<_>>()
        };
        assert!(
            actions(0).contains(&Action::FreeRequested),
            "{:?}",
            actions(0)
        );
        assert!(
            actions(2).contains(&Action::Alloc) && !actions(2).contains(&Action::FreeRequested)
        );
        assert!(registry.history(1).is_none());
    }
}
