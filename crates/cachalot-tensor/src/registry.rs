//! The process-level registry: one lazily initialised [`DeviceContext`] per device.
//!
//! This is the thin layer on top of the library that PyTorch keeps as globals:
//! cachalot itself has no singletons. A process-wide registry is built on first
//! use from the environment (`PYTORCH_CUDA_ALLOC_CONF`, `CACHALOT_DEVICE`), or
//! from [`configure`] called before that; a thread may also [`Registry::enter`] a
//! registry of its own (tests do, to keep their statistics apart).

use std::cell::RefCell;
use std::sync::{Arc, Mutex, OnceLock};

use cachalot::AllocatorConfig;

use crate::context::DeviceContext;
use crate::engine::cuda::probe_device_count;
use crate::error::{Result, TensorError};
use crate::pinned::PinnedCache;

/// Which devices back `cuda:N`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// Real GPUs when the driver sees any, else simulated ones. The default.
    Auto,
    /// Simulated devices backed by host memory.
    Sim,
    /// Real GPUs only.
    Cuda,
}

/// How a device reserves memory.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum MemoryMode {
    /// Reserve segments on demand (PyTorch's behaviour; TensorFlow's
    /// `set_memory_growth`). The default.
    Growth,
    /// Reserve this fraction of the device when it is first used and cap the
    /// allocator there (XLA's preallocation).
    Preallocate(f64),
}

/// Settings of a registry.
#[derive(Clone, Debug)]
pub struct Options {
    /// The allocator configuration of every device. Default: parsed from
    /// `PYTORCH_CUDA_ALLOC_CONF` by [`Options::from_env`], else PyTorch's defaults.
    pub config: AllocatorConfig,
    /// Real or simulated devices. Default: [`BackendChoice::Auto`].
    pub backend: BackendChoice,
    /// Number of simulated devices. Default: 2.
    pub sim_devices: usize,
    /// Bytes of each simulated device. Default: an H100 80GB's 85,017,493,504.
    pub sim_capacity: u64,
    /// Growth or preallocation. Default: growth.
    pub mode: MemoryMode,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            config: AllocatorConfig::default(),
            backend: BackendChoice::Auto,
            sim_devices: 2,
            sim_capacity: 85_017_493_504,
            mode: MemoryMode::Growth,
        }
    }
}

impl Options {
    /// Simulated devices with the given configuration.
    pub fn sim(config: AllocatorConfig) -> Options {
        Options {
            config,
            backend: BackendChoice::Sim,
            ..Options::default()
        }
    }

    /// Defaults, with `PYTORCH_CUDA_ALLOC_CONF` parsed into the configuration and
    /// `CACHALOT_DEVICE` (`sim`, `cuda` or `auto`) choosing the devices.
    ///
    /// # Errors
    /// [`TensorError::Allocator`] for a malformed configuration string or device choice.
    pub fn from_env() -> Result<Options> {
        let mut o = Options::default();
        if let Ok(conf) = std::env::var("PYTORCH_CUDA_ALLOC_CONF") {
            o.config = AllocatorConfig::parse(&conf).map_err(cachalot::Error::from)?;
        }
        if let Ok(dev) = std::env::var("CACHALOT_DEVICE") {
            o.backend = match dev.as_str() {
                "sim" => BackendChoice::Sim,
                "cuda" => BackendChoice::Cuda,
                "auto" | "" => BackendChoice::Auto,
                other => {
                    return Err(TensorError::Allocator(cachalot::Error::InvalidArgument(
                        format!("CACHALOT_DEVICE must be sim, cuda or auto, not '{other}'"),
                    )))
                }
            };
        }
        Ok(o)
    }
}

/// Devices and their lazily created contexts.
#[derive(Debug)]
pub struct Registry {
    options: Options,
    simulated: bool,
    devices: Vec<Mutex<Option<Arc<DeviceContext>>>>,
    pub(crate) pinned: Arc<PinnedCache>,
    /// Why the process-wide registry fell back to defaults, reported on first device use.
    init_error: Option<TensorError>,
}

impl Registry {
    /// A registry with these options. Finds the GPUs (without initialising them).
    ///
    /// # Errors
    /// [`TensorError::InvalidDevice`] when [`BackendChoice::Cuda`] is asked for and the
    /// driver sees no GPU.
    pub fn new(options: Options) -> Result<Arc<Registry>> {
        let gpus = match options.backend {
            BackendChoice::Sim => 0,
            BackendChoice::Auto | BackendChoice::Cuda => probe_device_count(),
        };
        if options.backend == BackendChoice::Cuda && gpus == 0 {
            return Err(TensorError::InvalidDevice {
                ordinal: 0,
                count: 0,
            });
        }
        let simulated = gpus == 0;
        let count = if simulated { options.sim_devices } else { gpus };
        Ok(Arc::new(Registry {
            options,
            simulated,
            devices: (0..count).map(|_| Mutex::new(None)).collect(),
            pinned: Arc::new(PinnedCache::default()),
            init_error: None,
        }))
    }

    /// A registry with no devices that answers every device request with `error`:
    /// what the process-wide registry becomes when the environment is malformed.
    fn failed(error: TensorError) -> Arc<Registry> {
        Arc::new(Registry {
            options: Options::default(),
            simulated: true,
            devices: Vec::new(),
            pinned: Arc::new(PinnedCache::default()),
            init_error: Some(error),
        })
    }

    /// Number of devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Whether the devices are simulated.
    pub fn is_simulated(&self) -> bool {
        self.simulated
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Makes this registry the one this thread uses until the guard drops.
    pub fn enter(self: &Arc<Self>) -> RegistryGuard {
        OVERRIDE.with(|o| o.borrow_mut().push(self.clone()));
        RegistryGuard {
            _not_send: std::marker::PhantomData,
        }
    }

    /// The context of device `ordinal`, created on first use.
    pub(crate) fn device(&self, ordinal: usize) -> Result<Arc<DeviceContext>> {
        if let Some(e) = &self.init_error {
            return Err(e.clone());
        }
        let slot = self
            .devices
            .get(ordinal)
            .ok_or(TensorError::InvalidDevice {
                ordinal,
                count: self.devices.len(),
            })?;
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ctx) = slot.as_ref() {
            return Ok(ctx.clone());
        }
        let ctx = Arc::new(self.create(ordinal)?);
        *slot = Some(ctx.clone());
        Ok(ctx)
    }

    /// The context of `ordinal` if it was created already.
    pub(crate) fn initialized(&self, ordinal: usize) -> Option<Arc<DeviceContext>> {
        self.devices
            .get(ordinal)?
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn create(&self, ordinal: usize) -> Result<DeviceContext> {
        let config = self.options.config.clone();
        let ctx = if self.simulated {
            DeviceContext::sim(ordinal, self.options.sim_capacity, config)?
        } else {
            DeviceContext::cuda(ordinal, config)?
        };
        if let MemoryMode::Preallocate(fraction) = self.options.mode {
            ctx.preallocate(fraction)?;
        }
        Ok(ctx)
    }
}

/// Restores the thread's previous registry when dropped. Made by [`Registry::enter`].
#[derive(Debug)]
#[must_use = "the registry is left when the guard drops"]
pub struct RegistryGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        OVERRIDE.with(|o| o.borrow_mut().pop());
    }
}

thread_local! {
    static OVERRIDE: RefCell<Vec<Arc<Registry>>> = const { RefCell::new(Vec::new()) };
}

static GLOBAL: OnceLock<Arc<Registry>> = OnceLock::new();

/// Sets the options of the process-wide registry. Call before any device is used.
///
/// # Errors
/// [`TensorError::Unsupported`] when the process-wide registry exists already;
/// errors of [`Registry::new`].
pub fn configure(options: Options) -> Result<()> {
    let reg = Registry::new(options)?;
    GLOBAL.set(reg).map_err(|_| {
        TensorError::Unsupported("configure() called after the devices were first used".into())
    })
}

fn global() -> Arc<Registry> {
    GLOBAL
        .get_or_init(|| {
            Options::from_env()
                .and_then(Registry::new)
                .unwrap_or_else(Registry::failed)
        })
        .clone()
}

/// The registry this thread uses: the innermost [`Registry::enter`], else the
/// process-wide one.
pub fn active() -> Arc<Registry> {
    OVERRIDE
        .with(|o| o.borrow().last().cloned())
        .unwrap_or_else(global)
}

/// The context of `ordinal` in the active registry.
pub(crate) fn device(ordinal: usize) -> Result<Arc<DeviceContext>> {
    active().device(ordinal)
}
