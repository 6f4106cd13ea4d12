//! A real GPU's data path through cudarc: copies, NVRTC kernels, cuBLAS, cuRAND,
//! streams, events and pinned host memory, all on raw device addresses that the
//! cachalot allocator hands out.
//!
//! Every `unsafe` block here passes an address that the tensor layer owns (a live
//! allocation of at least the bytes named, kept alive by the caller's storage for
//! the duration of the stream-ordered work) to one driver or library call.

use std::sync::{Arc, Mutex, OnceLock};

use cachalot::DevicePtr;
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::curand::{result as rand, sys as rand_sys};
use cudarc::driver::{
    result as drv, sys, CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig,
    PushKernelArg,
};

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::host_ops::{BinaryOp, Rhs};
use crate::layout::Layout;

const KERNELS: &str = include_str!("kernels.cu");
const BLOCK: u32 = 256;

/// One CUDA device's context and libraries.
#[derive(Debug)]
pub(crate) struct CudaEngine {
    ctx: Arc<CudaContext>,
    module: OnceLock<std::result::Result<Arc<CudaModule>, String>>,
    blas: Mutex<Option<BlasHandle>>,
    rng: Mutex<Option<RngHandle>>,
}

#[derive(Debug)]
struct BlasHandle(blas_sys::cublasHandle_t);
// SAFETY: a cuBLAS handle may be used from any thread as long as calls do not overlap;
// it lives in a Mutex and is only touched under that lock.
unsafe impl Send for BlasHandle {}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by create_handle and is destroyed once, here.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

#[derive(Debug)]
struct RngHandle(rand_sys::curandGenerator_t);
// SAFETY: as for BlasHandle: used only under the engine's Mutex.
unsafe impl Send for RngHandle {}

impl Drop for RngHandle {
    fn drop(&mut self) {
        // SAFETY: the generator was created by create_generator and is destroyed once, here.
        let _ = unsafe { rand::destroy_generator(self.0) };
    }
}

fn kernel_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::U8 => "u8",
        DType::Bool => "bool",
    }
}

fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Whether a CUDA driver library can be loaded, and how many devices it sees.
pub(crate) fn probe_device_count() -> usize {
    // SAFETY: only tries to dlopen the driver library; nothing is called through it.
    if !unsafe { sys::is_culib_present() } {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

impl CudaEngine {
    pub(crate) fn new(ordinal: usize) -> Result<CudaEngine> {
        let ctx = CudaContext::new(ordinal).map_err(|e| TensorError::driver("cuCtxCreate", e))?;
        Ok(CudaEngine {
            ctx,
            module: OnceLock::new(),
            blas: Mutex::new(None),
            rng: Mutex::new(None),
        })
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub(crate) fn default_stream(&self) -> Arc<CudaStream> {
        self.ctx.default_stream()
    }

    pub(crate) fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .new_stream()
            .map_err(|e| TensorError::driver("cuStreamCreate", e))
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| TensorError::driver("cuCtxSetCurrent", e))
    }

    fn function(&self, name: &str) -> Result<CudaFunction> {
        let module = self.module.get_or_init(|| {
            let ptx = cudarc::nvrtc::compile_ptx(KERNELS).map_err(|e| format!("{e:?}"))?;
            self.ctx.load_module(ptx).map_err(|e| format!("{e:?}"))
        });
        let module = module.as_ref().map_err(|m| TensorError::Driver {
            what: "nvrtc",
            message: m.clone(),
        })?;
        module
            .load_function(name)
            .map_err(|e| TensorError::driver("cuModuleGetFunction", e))
    }

    /// Host to device. With `pinned` false the copy is complete when this returns.
    pub(crate) fn write(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: &CudaStream,
        pinned: bool,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: dst is a live allocation of at least src.len() bytes; src outlives the
        // copy: pageable copies are waited for below, pinned sources are kept by the
        // pinned-host cache until an event recorded after the copy completes.
        unsafe { drv::memcpy_htod_async(dst, src, stream.cu_stream()) }
            .map_err(|e| TensorError::driver("cuMemcpyHtoDAsync", e))?;
        if !pinned {
            stream
                .synchronize()
                .map_err(|e| TensorError::driver("cuStreamSynchronize", e))?;
        }
        Ok(())
    }

    /// Device to host; complete when this returns.
    pub(crate) fn read(&self, src: DevicePtr, dst: &mut [u8], stream: &CudaStream) -> Result<()> {
        self.bind()?;
        // SAFETY: src is a live allocation of at least dst.len() bytes; the stream is
        // synchronized before dst is used or dropped.
        unsafe { drv::memcpy_dtoh_async(dst, src, stream.cu_stream()) }
            .map_err(|e| TensorError::driver("cuMemcpyDtoHAsync", e))?;
        stream
            .synchronize()
            .map_err(|e| TensorError::driver("cuStreamSynchronize", e))
    }

    pub(crate) fn zero(&self, dst: DevicePtr, len: usize, stream: &CudaStream) -> Result<()> {
        self.bind()?;
        // SAFETY: dst is a live allocation of at least len bytes.
        unsafe { drv::memset_d8_async(dst, 0, len, stream.cu_stream()) }
            .map_err(|e| TensorError::driver("cuMemsetD8Async", e))
    }

    pub(crate) fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: both are live allocations of at least len bytes on this device.
        unsafe { drv::memcpy_dtod_async(dst, src, len, stream.cu_stream()) }
            .map_err(|e| TensorError::driver("cuMemcpyDtoDAsync", e))
    }

    /// Copies from another device's memory; enables peer access first when the pair allows it.
    /// Returns whether the copy went over peer access (rather than staged through the host).
    pub(crate) fn copy_from_peer(
        &self,
        dst: DevicePtr,
        peer: &CudaEngine,
        src: DevicePtr,
        len: usize,
        stream: &CudaStream,
    ) -> Result<bool> {
        let direct = self.enable_peer_access(peer)?;
        self.bind()?;
        // SAFETY: dst is live on this device and src on the peer, each of at least len bytes.
        unsafe {
            drv::memcpy_peer_async(
                self.ctx.cu_ctx(),
                dst,
                peer.ctx.cu_ctx(),
                src,
                len,
                stream.cu_stream(),
            )
        }
        .map_err(|e| TensorError::driver("cuMemcpyPeerAsync", e))?;
        Ok(direct)
    }

    /// Whether this device can read and write `peer`'s memory directly.
    pub(crate) fn can_access_peer(&self, peer: &CudaEngine) -> bool {
        let mut can = 0;
        // SAFETY: both device handles come from live contexts; `can` is a valid out-pointer.
        let r = unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), peer.ctx.cu_device())
        };
        r == sys::CUresult::CUDA_SUCCESS && can != 0
    }

    fn enable_peer_access(&self, peer: &CudaEngine) -> Result<bool> {
        if !self.can_access_peer(peer) {
            return Ok(false);
        }
        self.bind()?;
        // SAFETY: the peer context is live for as long as its engine.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) };
        match r {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(true)
            }
            other => Err(TensorError::driver("cuCtxEnablePeerAccess", other)),
        }
    }

    pub(crate) fn fill(
        &self,
        dtype: DType,
        dst: DevicePtr,
        n: usize,
        value: f64,
        stream: &CudaStream,
    ) -> Result<()> {
        if value == 0.0 {
            return self.zero(dst, n * dtype.size(), stream);
        }
        let f = self.function(&format!("fill_{}", kernel_suffix(dtype)))?;
        let n64 = n as u64;
        let mut b = stream.launch_builder(&f);
        b.arg(&dst).arg(&value).arg(&n64);
        // SAFETY: dst holds n elements of dtype; the kernel writes exactly those.
        unsafe { b.launch(grid(n)) }
            .map(drop)
            .map_err(|e| TensorError::driver("fill kernel", e))
    }

    /// `out = a op rhs` over `n` elements of `dtype` (kernel `binary_*` or `scalar_*`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn elementwise(
        &self,
        op: BinaryOp,
        dtype: DType,
        out: DevicePtr,
        a: DevicePtr,
        rhs: Rhs<DevicePtr>,
        n: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let (family, what) = match rhs {
            Rhs::Each(_) => ("binary", "binary kernel"),
            Rhs::Scalar(_) => ("scalar", "scalar kernel"),
        };
        let f = self.function(&format!("{family}_{}", kernel_suffix(dtype)))?;
        let (n64, code) = (n as u64, op.code());
        let mut l = stream.launch_builder(&f);
        l.arg(&out).arg(&a);
        match &rhs {
            Rhs::Each(b) => l.arg(b),
            Rhs::Scalar(s) => l.arg(s),
        };
        l.arg(&n64).arg(&code);
        // SAFETY: out, a and (for Each) b each hold n contiguous elements of dtype.
        unsafe { l.launch(grid(n)) }
            .map(drop)
            .map_err(|e| TensorError::driver(what, e))
    }

    /// Gathers a strided view of up to 4 dimensions into contiguous `out`.
    pub(crate) fn gather(
        &self,
        dtype: DType,
        out: DevicePtr,
        base: DevicePtr,
        layout: &Layout,
        stream: &CudaStream,
    ) -> Result<()> {
        if layout.sizes().len() > 4 {
            return Err(TensorError::Unsupported(format!(
                "contiguous() of a {}-d strided view on CUDA",
                layout.sizes().len()
            )));
        }
        let f = self.function(&format!("gather_{}", kernel_suffix(dtype)))?;
        let mut s = [1u64; 4];
        let mut t = [0u64; 4];
        for (d, (&size, &stride)) in layout.sizes().iter().zip(layout.strides()).enumerate() {
            s[d] = size as u64;
            t[d] = stride as u64;
        }
        let src = base + (layout.offset() * dtype.size()) as u64;
        let (n, ndim) = (layout.numel() as u64, layout.sizes().len() as i32);
        let mut l = stream.launch_builder(&f);
        l.arg(&out).arg(&src).arg(&n).arg(&ndim);
        for v in s.iter().chain(t.iter()) {
            l.arg(v);
        }
        // SAFETY: out holds numel elements; every index the layout yields lies inside the source storage.
        unsafe { l.launch(grid(layout.numel())) }
            .map(drop)
            .map_err(|e| TensorError::driver("gather kernel", e))
    }

    /// Row-major `out[m, n] = a[m, k] x b[k, n]`, each operand given as
    /// (address, transposed-in-column-major, leading dimension).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        dtype: DType,
        out: DevicePtr,
        a: Operand,
        b: Operand,
        (m, n, k): (usize, usize, usize),
        workspace: (DevicePtr, usize),
        stream: &CudaStream,
    ) -> Result<()> {
        self.bind()?;
        let mut guard = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(BlasHandle(
                blas::create_handle().map_err(|e| TensorError::driver("cublasCreate", e))?,
            ));
        }
        let h = guard.as_ref().map(|h| h.0).ok_or(TensorError::Driver {
            what: "cublasCreate",
            message: "no handle".into(),
        })?;
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let err = |e| TensorError::driver("cublas gemm", e);
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        // Row-major C = A B is column-major C^T = B^T A^T: B goes first.
        // SAFETY: handle is live and used under the lock; the workspace is a live
        // allocation of workspace.1 bytes held for the device's lifetime; a, b and out
        // hold the matrices the leading dimensions describe.
        unsafe {
            blas::set_stream(h, stream.cu_stream() as blas_sys::cudaStream_t).map_err(err)?;
            let ws = blas_sys::cublasSetWorkspace_v2(
                h,
                workspace.0 as *mut std::ffi::c_void,
                workspace.1,
            );
            ws.result().map_err(err)?;
            match dtype {
                DType::F32 => blas::sgemm(
                    h,
                    op(b.1),
                    op(a.1),
                    ni,
                    mi,
                    ki,
                    &1.0f32,
                    b.0 as *const f32,
                    b.2,
                    a.0 as *const f32,
                    a.2,
                    &0.0f32,
                    out as *mut f32,
                    ni,
                ),
                DType::F64 => blas::dgemm(
                    h,
                    op(b.1),
                    op(a.1),
                    ni,
                    mi,
                    ki,
                    &1.0f64,
                    b.0 as *const f64,
                    b.2,
                    a.0 as *const f64,
                    a.2,
                    &0.0f64,
                    out as *mut f64,
                    ni,
                ),
                other => {
                    return Err(TensorError::Unsupported(format!(
                        "matmul for {other} on CUDA"
                    )))
                }
            }
            .map_err(err)
        }
    }

    /// Fills `n` elements with standard normal numbers (cuRAND, XORWOW).
    pub(crate) fn randn(
        &self,
        dtype: DType,
        out: DevicePtr,
        n: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.bind()?;
        let mut guard = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let g = rand::create_generator()
                .map_err(|e| TensorError::driver("curandCreateGenerator", e))?;
            let handle = RngHandle(g);
            // SAFETY: the generator was just created.
            unsafe { rand::set_seed(handle.0, 0x5eed) }
                .map_err(|e| TensorError::driver("curandSetSeed", e))?;
            *guard = Some(handle);
        }
        let g = guard.as_ref().map(|h| h.0).ok_or(TensorError::Driver {
            what: "curand",
            message: "no generator".into(),
        })?;
        // cuRAND's normal generators produce pairs: round an odd count up by one. The
        // extra element lands inside the allocation, whose size the allocator rounds up
        // to a multiple of 512 bytes (an odd count of 4- or 8-byte elements never fills it).
        let even = n + n % 2;
        // SAFETY: the generator is live and used under the lock; out holds `even` elements (see above).
        unsafe {
            rand::set_stream(g, stream.cu_stream() as rand_sys::cudaStream_t)
                .map_err(|e| TensorError::driver("curandSetStream", e))?;
            match dtype {
                DType::F32 => rand::generate::normal_f32(g, out as *mut f32, even, 0.0, 1.0),
                DType::F64 => rand::generate::normal_f64(g, out as *mut f64, even, 0.0, 1.0),
                other => {
                    return Err(TensorError::Unsupported(format!(
                        "randn for {other} on CUDA"
                    )))
                }
            }
            .map_err(|e| TensorError::driver("curandGenerateNormal", e))
        }
    }

    /// Allocates pinned (page-locked, portable) host memory.
    pub(crate) fn alloc_pinned(&self, len: usize) -> Result<*mut u8> {
        self.bind()?;
        // SAFETY: plain allocation; the memory is freed once by free_pinned.
        let p = unsafe { drv::malloc_host(len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| TensorError::driver("cuMemHostAlloc", e))?;
        Ok(p.cast())
    }

    /// Frees memory from alloc_pinned.
    ///
    /// # Safety
    /// `p` came from [`CudaEngine::alloc_pinned`], is freed once, and no copy still reads it.
    pub(crate) unsafe fn free_pinned(&self, p: *mut u8) {
        let _ = self.bind();
        // SAFETY: guaranteed by the caller.
        let _ = unsafe { drv::free_host(p.cast()) };
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.ctx
            .synchronize()
            .map_err(|e| TensorError::driver("cuCtxSynchronize", e))
    }
}

/// A gemm operand: device address, whether cuBLAS must transpose it, leading dimension.
pub(crate) type Operand = (DevicePtr, bool, i32);
