//! Moving tensors: `to(device)` between the host and devices and between devices
//! (peer access where the GPUs allow it), non-blocking copies from pinned host
//! memory, and `pin_memory`.

use std::panic::Location;
use std::sync::Arc;

use crate::context::DeviceContext;
use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Result, TensorError};
use crate::registry;
use crate::storage::{HostMem, Storage};
use crate::stream::{current_raw, Stream};
use crate::tensor::Tensor;

impl Tensor {
    /// Pinned host memory holding the same elements (`tensor.pin_memory()`).
    ///
    /// # Errors
    /// Only for device tensors: [`TensorError::Unsupported`]; driver failures.
    pub fn pin_memory(&self) -> Result<Tensor> {
        if self.device != Device::Cpu {
            return Err(TensorError::Unsupported(format!(
                "cannot pin '{}' memory: only dense CPU tensors can be pinned",
                self.device
            )));
        }
        let bytes = self.host_bytes()?;
        let reg = registry::active();
        let ctx = if reg.is_simulated() {
            None
        } else {
            Some(reg.device(0)?)
        };
        let mut block = reg.pinned.allocate(bytes.len(), ctx.as_ref())?;
        block.as_mut_slice().copy_from_slice(&bytes);
        Ok(Tensor::wrap(
            Storage::host(HostMem::Pinned(block)),
            self.sizes(),
            self.dtype,
            Device::Cpu,
        ))
    }

    /// The tensor on `device`: `self` when it is already there (`tensor.to(device)`).
    /// Host to device, device to host and device to device (peer access where the
    /// GPUs allow it). Complete on return, except that the device side is queued on
    /// the current stream.
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`]; [`TensorError::InvalidDevice`]; driver failures.
    #[track_caller]
    pub fn to(&self, device: Device) -> Result<Tensor> {
        self.to_at(device, false, Location::caller())
    }

    /// As [`Tensor::to`], but a copy from pinned host memory is only queued on the
    /// current stream (`tensor.to(device, non_blocking=True)`); the pinned block is not
    /// reused until the copy has finished.
    ///
    /// # Errors
    /// As [`Tensor::to`].
    #[track_caller]
    pub fn to_non_blocking(&self, device: Device) -> Result<Tensor> {
        self.to_at(device, true, Location::caller())
    }

    pub(crate) fn to_at(
        &self,
        device: Device,
        non_blocking: bool,
        at: &'static Location<'static>,
    ) -> Result<Tensor> {
        if device == self.device {
            return Ok(self.clone());
        }
        if let Device::Cuda(i) = device {
            crate::device::check_ordinal(i)?;
        }
        let src = self.contiguous()?;
        match (src.storage.device_ptr(), device) {
            (None, _) => src.host_to_device(device, non_blocking, at),
            (Some((ctx, ptr)), Device::Cpu) => src.device_to_host(ctx, ptr),
            (Some((ctx, ptr)), Device::Cuda(_)) => src.device_to_device(ctx, ptr, device, at),
        }
    }

    fn host_to_device(
        &self,
        device: Device,
        non_blocking: bool,
        at: &'static Location<'static>,
    ) -> Result<Tensor> {
        let (out, stream) = Tensor::alloc(self.sizes(), self.dtype, device, at)?;
        let (Some((ctx, dst)), Some(stream)) = (out.storage.device_ptr(), stream) else {
            return Err(TensorError::Unsupported(
                "a device copy into host memory".into(),
            ));
        };
        let mut mem = self.storage.host_mem().ok_or(TensorError::Unsupported(
            "a host copy from device memory".into(),
        ))?;
        match &mut *mem {
            HostMem::Zeros(_) => ctx
                .engine
                .fill(self.dtype, dst, self.numel(), 0.0, &stream)?,
            HostMem::Bytes(b) => ctx.engine.write(dst, b, &stream, false)?,
            HostMem::Pinned(block) => {
                ctx.engine
                    .write(dst, block.as_slice(), &stream, non_blocking)?;
                let ev = ctx.engine.new_event()?;
                let mut ev = ev;
                ev.record(&stream)?;
                block.add_pending(Box::new(move || ev.query()));
            }
        }
        Ok(out)
    }

    fn device_to_host(&self, ctx: &Arc<DeviceContext>, ptr: u64) -> Result<Tensor> {
        let n = self.nbytes();
        let stream = current_raw(ctx);
        let mem = match &ctx.engine {
            Engine::Sim(e) if e.is_unwritten(ptr, n) => HostMem::Zeros(n),
            engine => {
                let mut buf = vec![0u8; n];
                engine.read(ptr, &mut buf, &stream)?;
                HostMem::Bytes(buf)
            }
        };
        Ok(Tensor::wrap(
            Storage::host(mem),
            self.sizes(),
            self.dtype,
            Device::Cpu,
        ))
    }

    fn device_to_device(
        &self,
        src_ctx: &Arc<DeviceContext>,
        src: u64,
        device: Device,
        at: &'static Location<'static>,
    ) -> Result<Tensor> {
        // The copy runs on the destination's stream: first let the source's work finish.
        Stream {
            ctx: src_ctx.clone(),
            raw: current_raw(src_ctx),
        }
        .synchronize()?;
        let (out, stream) = Tensor::alloc(self.sizes(), self.dtype, device, at)?;
        let (Some((dst_ctx, dst)), Some(stream)) = (out.storage.device_ptr(), stream) else {
            return Err(TensorError::Unsupported(
                "a device copy into host memory".into(),
            ));
        };
        dst_ctx
            .engine
            .copy_from_peer(dst, &src_ctx.engine, src, self.nbytes(), &stream)?;
        dst_ctx.rebind_backend();
        Ok(out)
    }
}
