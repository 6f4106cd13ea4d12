//! One device's state in the registry: its caching allocator, its engine, the
//! live allocations the tensor layer made (for leak checks), and the cuBLAS
//! workspaces.

use std::collections::{BTreeMap, HashMap};
use std::panic::Location;
use std::sync::{Arc, Mutex, MutexGuard};

use cachalot::backend::cuda::CudaBackend;
use cachalot::backend::sim::SimBackend;
use cachalot::{AllocatorConfig, Backend, DeviceAllocator, DevicePtr, StreamId};

use crate::engine::cuda::CudaEngine;
use crate::engine::sim::SimEngine;
use crate::engine::{Engine, RawStream};
use crate::error::{Result, TensorError};

/// What the tensor layer knows about one live device allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveAllocation {
    /// Order of creation on this device (0 = first).
    pub seq: u64,
    /// The device address.
    pub ptr: DevicePtr,
    /// Bytes requested.
    pub bytes: u64,
    /// What it holds, e.g. `float32[64, 256]` or `cuBLAS workspace`.
    pub what: String,
    /// A name given with `Tensor::set_name`, if any.
    pub name: Option<String>,
    /// Where in the program it was created.
    pub location: &'static Location<'static>,
    /// Whether the tensor layer itself holds it for the device's lifetime (the cuBLAS
    /// workspace); leak checks skip these.
    pub internal: bool,
}

/// Side streams per device, as in PyTorch's stream pool.
pub(crate) const SIDE_STREAMS: usize = 32;

#[derive(Debug, Default)]
struct StreamPool {
    streams: Vec<RawStream>,
    next: usize,
}

/// The per-device state.
#[derive(Debug)]
pub(crate) struct DeviceContext {
    pub(crate) ordinal: usize,
    pub(crate) allocator: Arc<dyn DeviceAllocator>,
    pub(crate) engine: Engine,
    /// The CUDA backend, kept to register the streams the engine creates.
    cuda_backend: Option<Arc<CudaBackend>>,
    live: Mutex<BTreeMap<DevicePtr, LiveAllocation>>,
    next_seq: Mutex<u64>,
    workspaces: Mutex<HashMap<StreamId, DevicePtr>>,
    side_streams: Mutex<StreamPool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DeviceContext {
    /// A simulated device of `capacity` bytes.
    pub(crate) fn sim(
        ordinal: usize,
        capacity: u64,
        config: AllocatorConfig,
    ) -> Result<DeviceContext> {
        let backend: Arc<dyn Backend> = Arc::new(SimBackend::new(capacity).with_device(ordinal));
        let allocator = cachalot::allocator::create(backend, config)?;
        Ok(DeviceContext::assemble(
            ordinal,
            allocator,
            Engine::Sim(SimEngine::new(ordinal)),
            None,
        ))
    }

    /// A real GPU.
    pub(crate) fn cuda(ordinal: usize, config: AllocatorConfig) -> Result<DeviceContext> {
        let engine = CudaEngine::new(ordinal)?;
        let backend = Arc::new(CudaBackend::new(ordinal).map_err(cachalot::Error::from)?);
        let dyn_backend: Arc<dyn Backend> = backend.clone();
        let allocator = cachalot::allocator::create(dyn_backend, config)?;
        Ok(DeviceContext::assemble(
            ordinal,
            allocator,
            Engine::Cuda(engine),
            Some(backend),
        ))
    }

    fn assemble(
        ordinal: usize,
        allocator: Arc<dyn DeviceAllocator>,
        engine: Engine,
        cuda_backend: Option<Arc<CudaBackend>>,
    ) -> DeviceContext {
        DeviceContext {
            ordinal,
            allocator,
            engine,
            cuda_backend,
            live: Mutex::new(BTreeMap::new()),
            next_seq: Mutex::new(0),
            workspaces: Mutex::new(HashMap::new()),
            side_streams: Mutex::new(StreamPool::default()),
        }
    }

    /// A side stream from the device's pool: the first [`SIDE_STREAMS`] requests create
    /// streams (registered with the backend, so the allocator accepts them), later ones
    /// hand them out again round-robin, as PyTorch's `torch.cuda.Stream()` does. Pooled
    /// streams live as long as the device.
    pub(crate) fn new_stream(&self) -> Result<RawStream> {
        let mut pool = lock(&self.side_streams);
        if pool.streams.len() < SIDE_STREAMS {
            let raw = self.engine.new_stream()?;
            if let Some(backend) = &self.cuda_backend {
                // SAFETY: the stream was just created in this device's primary context by
                // the engine, and the pool keeps it live for as long as this context, which
                // holds the backend.
                unsafe { backend.register_stream(raw.id()) };
            }
            pool.streams.push(raw.clone());
            return Ok(raw);
        }
        let raw = pool.streams[pool.next % SIDE_STREAMS].clone();
        pool.next += 1;
        Ok(raw)
    }

    /// Tells the CUDA backend that another library (cudarc, for this crate's copies and
    /// kernels) may have changed the thread's current context, so its next call binds
    /// this device's context again. Called before every allocator call.
    pub(crate) fn rebind_backend(&self) {
        if self.cuda_backend.is_some() {
            CudaBackend::forget_context_binding();
        }
    }

    /// Allocates `bytes` for use on `stream` and records what it is for.
    pub(crate) fn allocate(
        &self,
        bytes: u64,
        stream: &RawStream,
        what: String,
        location: &'static Location<'static>,
    ) -> Result<DevicePtr> {
        self.rebind_backend();
        let ptr = self.allocator.malloc(bytes, stream.id())?;
        if ptr == 0 {
            return Ok(ptr);
        }
        self.engine.register(ptr, bytes as usize);
        let seq = {
            let mut s = lock(&self.next_seq);
            *s += 1;
            *s - 1
        };
        lock(&self.live).insert(
            ptr,
            LiveAllocation {
                seq,
                ptr,
                bytes,
                what,
                name: None,
                location,
                internal: false,
            },
        );
        Ok(ptr)
    }

    /// Returns an allocation to the allocator's cache.
    pub(crate) fn release(&self, ptr: DevicePtr) {
        lock(&self.live).remove(&ptr);
        self.engine.forget(ptr);
        self.rebind_backend();
        // A failed free means the allocator never handed out this address: a bug in
        // this crate that must not abort a drop; the allocator's state is unchanged.
        let _ = self.allocator.free(ptr);
    }

    pub(crate) fn set_name(&self, ptr: DevicePtr, name: &str) {
        if let Some(rec) = lock(&self.live).get_mut(&ptr) {
            rec.name = Some(name.to_string());
        }
    }

    /// The sequence number the next allocation will get.
    pub(crate) fn next_seq(&self) -> u64 {
        *lock(&self.next_seq)
    }

    /// Live allocations created at or after `seq`, oldest first.
    pub(crate) fn live_since(&self, seq: u64) -> Vec<LiveAllocation> {
        let mut v: Vec<LiveAllocation> = lock(&self.live)
            .values()
            .filter(|r| r.seq >= seq)
            .cloned()
            .collect();
        v.sort_by_key(|r| r.seq);
        v
    }

    /// The cuBLAS workspace of `stream`, allocated from the cachalot allocator on first
    /// use and kept for the device's lifetime, as PyTorch keeps it per handle and stream.
    pub(crate) fn cublas_workspace(&self, stream: &RawStream) -> Result<(DevicePtr, usize)> {
        let size = self.cublas_workspace_size();
        let mut ws = lock(&self.workspaces);
        if let Some(&ptr) = ws.get(&stream.id()) {
            return Ok((ptr, size));
        }
        let ptr = self.allocate(
            size as u64,
            stream,
            "cuBLAS workspace".into(),
            Location::caller(),
        )?;
        if let Some(rec) = lock(&self.live).get_mut(&ptr) {
            rec.internal = true;
        }
        ws.insert(stream.id(), ptr);
        Ok((ptr, size))
    }

    /// PyTorch's default cuBLAS workspace: `:4096:8` (32 MiB) on Hopper and newer, as on
    /// the H100 the recorded traces come from; `:4096:2:16:8` (8 MiB + 128 KiB) before.
    /// The simulated device models an H100.
    fn cublas_workspace_size(&self) -> usize {
        const HOPPER: usize = 4096 * 1024 * 8;
        const OLDER: usize = 4096 * 1024 * 2 + 16 * 1024 * 8;
        match &self.engine {
            Engine::Sim(_) => HOPPER,
            Engine::Cuda(e) => match e.context().compute_capability() {
                Ok((major, _)) if major < 9 => OLDER,
                _ => HOPPER,
            },
        }
    }

    /// Returns every unused cached segment to the device.
    pub(crate) fn empty_cache(&self) -> Result<()> {
        self.rebind_backend();
        self.allocator.empty_cache().map_err(TensorError::from)
    }

    /// `record_stream` on one of this device's allocations.
    pub(crate) fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        self.rebind_backend();
        self.allocator
            .record_stream(ptr, stream)
            .map_err(TensorError::from)
    }

    /// The device's free and total bytes.
    pub(crate) fn mem_get_info(&self) -> Result<cachalot::backend::MemInfo> {
        self.rebind_backend();
        self.allocator.mem_get_info().map_err(TensorError::from)
    }

    /// Reserves `fraction` of the device up front and caps the allocator there
    /// ([`crate::MemoryMode::Preallocate`]): one segment of that size is allocated and
    /// freed into the cache, where later allocations split it.
    pub(crate) fn preallocate(&self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(TensorError::Allocator(cachalot::Error::InvalidArgument(
                format!("preallocation fraction {fraction} is outside [0, 1]"),
            )));
        }
        let total = self.mem_get_info()?.total;
        const GRAIN: u64 = 2 << 20;
        let bytes = ((total as f64 * fraction) as u64 / GRAIN) * GRAIN;
        self.allocator.set_memory_fraction(fraction)?;
        if bytes > 0 {
            self.rebind_backend();
            let ptr = self.allocator.malloc(bytes, cachalot::StreamId::DEFAULT)?;
            self.allocator.free(ptr)?;
        }
        Ok(())
    }
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        let ws: Vec<DevicePtr> = lock(&self.workspaces).drain().map(|(_, p)| p).collect();
        for ptr in ws {
            self.release(ptr);
        }
    }
}
