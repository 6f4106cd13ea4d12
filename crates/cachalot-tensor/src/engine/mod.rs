//! Engines: where a device's bytes live and its work runs. [`Engine::Sim`] keeps
//! host buffers behind simulated addresses; [`Engine::Cuda`] drives a real GPU.
//! Both take raw device addresses from the cachalot allocator, so everything
//! above this module is the same for both.

pub(crate) mod cuda;
pub(crate) mod sim;

use std::sync::Arc;
use std::time::Instant;

use cachalot::{DevicePtr, StreamId};
use cudarc::driver::{sys, CudaEvent, CudaStream};

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::host_ops::{BinaryOp, Rhs};
use crate::layout::Layout;
use cuda::CudaEngine;
use sim::SimEngine;

/// A device's engine.
#[derive(Debug)]
pub(crate) enum Engine {
    /// Host memory standing in for a GPU.
    Sim(SimEngine),
    /// A real GPU.
    Cuda(CudaEngine),
}

/// A stream as the engine sees it.
#[derive(Clone, Debug)]
pub(crate) enum RawStream {
    /// A simulated stream id (0 = default).
    Sim(StreamId),
    /// A CUDA stream.
    Cuda(Arc<CudaStream>),
}

impl RawStream {
    /// The id the allocator knows this stream by (the raw `CUstream` on CUDA).
    pub(crate) fn id(&self) -> StreamId {
        match self {
            RawStream::Sim(id) => *id,
            RawStream::Cuda(s) => StreamId(s.cu_stream() as u64),
        }
    }
}

/// An event as the engine sees it.
#[derive(Debug)]
pub(crate) enum RawEvent {
    /// A simulated event: work is done when issued, so it records the host time.
    Sim(Option<Instant>),
    /// A CUDA event (timing enabled).
    Cuda(CudaEvent),
}

pub(crate) fn cuda_stream(s: &RawStream) -> Result<&Arc<CudaStream>> {
    match s {
        RawStream::Cuda(s) => Ok(s),
        RawStream::Sim(_) => Err(TensorError::Unsupported(
            "a simulated stream used on a CUDA device".into(),
        )),
    }
}

macro_rules! dispatch {
    ($self:ident, $stream:ident, $sim:expr, $cuda:expr) => {
        match $self {
            Engine::Sim(e) => {
                let _ = $stream;
                let f: &dyn Fn(&SimEngine) -> Result<()> = &$sim;
                f(e)
            }
            Engine::Cuda(e) => {
                let s = cuda_stream($stream)?;
                let f: &dyn Fn(&CudaEngine, &Arc<CudaStream>) -> Result<()> = &$cuda;
                f(e, s)
            }
        }
    };
}

impl Engine {
    pub(crate) fn is_sim(&self) -> bool {
        matches!(self, Engine::Sim(_))
    }

    pub(crate) fn default_stream(&self) -> RawStream {
        match self {
            Engine::Sim(_) => RawStream::Sim(StreamId::DEFAULT),
            Engine::Cuda(e) => RawStream::Cuda(e.default_stream()),
        }
    }

    pub(crate) fn new_stream(&self) -> Result<RawStream> {
        Ok(match self {
            Engine::Sim(e) => RawStream::Sim(e.new_stream()),
            Engine::Cuda(e) => RawStream::Cuda(e.new_stream()?),
        })
    }

    /// Called for each new allocation (the simulated device tracks its bytes).
    pub(crate) fn register(&self, ptr: DevicePtr, len: usize) {
        if let Engine::Sim(e) = self {
            e.register(ptr, len);
        }
    }

    /// Called when an allocation is freed.
    pub(crate) fn forget(&self, ptr: DevicePtr) {
        if let Engine::Sim(e) = self {
            e.forget(ptr);
        }
    }

    pub(crate) fn write(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: &RawStream,
        pinned: bool,
    ) -> Result<()> {
        dispatch!(self, stream, |e| e.write(dst, src), |e, s| e
            .write(dst, src, s, pinned))
    }

    pub(crate) fn read(&self, src: DevicePtr, dst: &mut [u8], stream: &RawStream) -> Result<()> {
        match self {
            Engine::Sim(e) => e.read(src, dst),
            Engine::Cuda(e) => e.read(src, dst, cuda_stream(stream)?),
        }
    }

    pub(crate) fn fill(
        &self,
        dtype: DType,
        dst: DevicePtr,
        n: usize,
        value: f64,
        stream: &RawStream,
    ) -> Result<()> {
        dispatch!(self, stream, |e| e.fill(dtype, dst, n, value), |e, s| e
            .fill(dtype, dst, n, value, s))
    }

    pub(crate) fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: &RawStream,
    ) -> Result<()> {
        dispatch!(self, stream, |e| e.copy(dst, src, len), |e, s| e
            .copy(dst, src, len, s))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn elementwise(
        &self,
        op: BinaryOp,
        dtype: DType,
        out: DevicePtr,
        a: DevicePtr,
        rhs: Rhs<DevicePtr>,
        n: usize,
        stream: &RawStream,
    ) -> Result<()> {
        dispatch!(
            self,
            stream,
            |e| e.elementwise(op, dtype, out, a, rhs, n),
            |e, s| e.elementwise(op, dtype, out, a, rhs, n, s)
        )
    }

    pub(crate) fn gather(
        &self,
        dtype: DType,
        out: DevicePtr,
        base: DevicePtr,
        layout: &Layout,
        stream: &RawStream,
    ) -> Result<()> {
        dispatch!(
            self,
            stream,
            |e| e.gather(dtype, out, base, layout),
            |e, s| e.gather(dtype, out, base, layout, s)
        )
    }

    pub(crate) fn randn(
        &self,
        dtype: DType,
        out: DevicePtr,
        n: usize,
        stream: &RawStream,
    ) -> Result<()> {
        dispatch!(self, stream, |e| e.randn(dtype, out, n), |e, s| e
            .randn(dtype, out, n, s))
    }

    /// Copies `len` bytes from `src` on `peer` to `dst` here. Returns whether the GPUs
    /// copied directly (peer access); always true on the simulated device.
    pub(crate) fn copy_from_peer(
        &self,
        dst: DevicePtr,
        peer: &Engine,
        src: DevicePtr,
        len: usize,
        stream: &RawStream,
    ) -> Result<bool> {
        match (self, peer) {
            (Engine::Sim(e), Engine::Sim(p)) => e.copy_from_peer(dst, p, src, len).map(|()| true),
            (Engine::Cuda(e), Engine::Cuda(p)) => {
                e.copy_from_peer(dst, p, src, len, cuda_stream(stream)?)
            }
            _ => Err(TensorError::Unsupported(
                "a copy between a simulated and a real device".into(),
            )),
        }
    }

    /// Whether this device can access `peer`'s memory directly (always on the simulated device).
    pub(crate) fn can_access_peer(&self, peer: &Engine) -> bool {
        match (self, peer) {
            (Engine::Sim(_), Engine::Sim(_)) => true,
            (Engine::Cuda(e), Engine::Cuda(p)) => e.can_access_peer(p),
            _ => false,
        }
    }

    pub(crate) fn new_event(&self) -> Result<RawEvent> {
        Ok(match self {
            Engine::Sim(_) => RawEvent::Sim(None),
            Engine::Cuda(e) => RawEvent::Cuda(
                e.context()
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|err| TensorError::driver("cuEventCreate", err))?,
            ),
        })
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            Engine::Sim(_) => Ok(()),
            Engine::Cuda(e) => e.synchronize(),
        }
    }
}

impl RawEvent {
    pub(crate) fn record(&mut self, stream: &RawStream) -> Result<()> {
        match self {
            RawEvent::Sim(t) => {
                *t = Some(Instant::now());
                Ok(())
            }
            RawEvent::Cuda(ev) => ev
                .record(cuda_stream(stream)?)
                .map_err(|e| TensorError::driver("cuEventRecord", e)),
        }
    }

    pub(crate) fn query(&self) -> bool {
        match self {
            RawEvent::Sim(_) => true,
            RawEvent::Cuda(ev) => ev.is_complete(),
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            RawEvent::Sim(_) => Ok(()),
            RawEvent::Cuda(ev) => ev
                .synchronize()
                .map_err(|e| TensorError::driver("cuEventSynchronize", e)),
        }
    }

    pub(crate) fn elapsed_ms(&self, end: &RawEvent) -> Result<f32> {
        match (self, end) {
            (RawEvent::Sim(Some(a)), RawEvent::Sim(Some(b))) => {
                Ok(b.saturating_duration_since(*a).as_secs_f32() * 1000.0)
            }
            (RawEvent::Cuda(a), RawEvent::Cuda(b)) => a
                .elapsed_ms(b)
                .map_err(|e| TensorError::driver("cuEventElapsedTime", e)),
            _ => Err(TensorError::Unsupported(
                "elapsed time between events never recorded, or of different devices".into(),
            )),
        }
    }

    pub(crate) fn wait_on(&self, stream: &RawStream) -> Result<()> {
        match (self, stream) {
            (RawEvent::Sim(_), _) => Ok(()),
            (RawEvent::Cuda(ev), RawStream::Cuda(s)) => s
                .wait(ev)
                .map_err(|e| TensorError::driver("cuStreamWaitEvent", e)),
            (RawEvent::Cuda(_), RawStream::Sim(_)) => Err(TensorError::Unsupported(
                "a CUDA event waited on by a simulated stream".into(),
            )),
        }
    }
}
