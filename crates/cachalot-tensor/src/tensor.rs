//! [`Tensor`]: a shape, a dtype and a device over reference-counted storage.
//!
//! Cloning a tensor shares its storage (like a second Python reference);
//! the memory returns to the device's cache when the last tensor using it drops.
//! Device work goes to the current stream of the tensor's device; allocations
//! are made for that stream.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::engine::RawStream;
use crate::error::{Result, TensorError};
use crate::host_ops;
use crate::layout::Layout;
use crate::registry;
use crate::storage::{HostMem, Storage};
use crate::stream::{current_raw, Stream};

/// An n-dimensional array on the host or a device.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

/// What an allocation holds, for leak reports: `float32[64, 256]`.
pub(crate) fn describe(dtype: DType, sizes: &[usize]) -> String {
    format!("{}{:?}", dtype.name(), sizes)
}

impl Tensor {
    /// A tensor over `storage` with a contiguous layout.
    pub(crate) fn wrap(
        storage: Arc<Storage>,
        sizes: &[usize],
        dtype: DType,
        device: Device,
    ) -> Tensor {
        Tensor {
            storage,
            layout: Layout::contiguous(sizes),
            dtype,
            device,
        }
    }

    /// Allocates a contiguous tensor; its bytes are unspecified (zeros on the host).
    pub(crate) fn alloc(
        sizes: &[usize],
        dtype: DType,
        device: Device,
        at: &'static Location<'static>,
    ) -> Result<(Tensor, Option<RawStream>)> {
        let nbytes = sizes.iter().product::<usize>() * dtype.size();
        match device {
            Device::Cpu => Ok((
                Tensor::wrap(Storage::host(HostMem::Zeros(nbytes)), sizes, dtype, device),
                None,
            )),
            Device::Cuda(i) => {
                let ctx = registry::device(i)?;
                let stream = current_raw(&ctx);
                let ptr = ctx.allocate(nbytes as u64, &stream, describe(dtype, sizes), at)?;
                let storage = Storage::device(ctx, ptr);
                Ok((Tensor::wrap(storage, sizes, dtype, device), Some(stream)))
            }
        }
    }

    /// A tensor of zeros (`torch.zeros`).
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`]; [`TensorError::InvalidDevice`].
    #[track_caller]
    pub fn zeros(sizes: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full_at(sizes, 0.0, dtype, device, Location::caller())
    }

    /// A tensor of ones (`torch.ones`).
    ///
    /// # Errors
    /// As [`Tensor::zeros`].
    #[track_caller]
    pub fn ones(sizes: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full_at(sizes, 1.0, dtype, device, Location::caller())
    }

    /// A tensor with every element `value` (`torch.full`).
    ///
    /// # Errors
    /// As [`Tensor::zeros`].
    #[track_caller]
    pub fn full(sizes: &[usize], value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full_at(sizes, value, dtype, device, Location::caller())
    }

    fn full_at(
        sizes: &[usize],
        value: f64,
        dtype: DType,
        device: Device,
        at: &'static Location<'static>,
    ) -> Result<Tensor> {
        let (t, stream) = Tensor::alloc(sizes, dtype, device, at)?;
        match (&t.storage.device_ptr(), stream) {
            (Some((ctx, ptr)), Some(s)) => ctx.engine.fill(dtype, *ptr, t.numel(), value, &s)?,
            _ => {
                if value != 0.0 {
                    if let Some(mut mem) = t.storage.host_mem() {
                        host_ops::fill(dtype, mem.bytes_mut(), value);
                    }
                }
            }
        }
        Ok(t)
    }

    /// Standard normal numbers (`torch.randn`): cuRAND on a GPU, a seeded host
    /// generator on the host and the simulated device.
    ///
    /// # Errors
    /// As [`Tensor::zeros`]; [`TensorError::Unsupported`] for a non-float dtype.
    #[track_caller]
    pub fn randn(sizes: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(TensorError::Unsupported(format!(
                "\"normal_kernel\" not implemented for '{}'",
                dtype.name()
            )));
        }
        let (t, stream) = Tensor::alloc(sizes, dtype, device, Location::caller())?;
        match (&t.storage.device_ptr(), stream) {
            (Some((ctx, ptr)), Some(s)) => ctx.engine.randn(dtype, *ptr, t.numel(), &s)?,
            _ => {
                if let Some(mut mem) = t.storage.host_mem() {
                    host_ops::HostRng::new(0x5eed).fill_normal(dtype, mem.bytes_mut());
                }
            }
        }
        Ok(t)
    }

    /// `0, 1, ..., end - 1` (`torch.arange(end)`).
    ///
    /// # Errors
    /// As [`Tensor::zeros`].
    #[track_caller]
    pub fn arange(end: usize, dtype: DType, device: Device) -> Result<Tensor> {
        let mut bytes = vec![0u8; end * dtype.size()];
        for (i, chunk) in bytes.chunks_exact_mut(dtype.size()).enumerate() {
            dtype.encode(i as f64, chunk);
        }
        Tensor::from_bytes(bytes, &[end], dtype, device, Location::caller())
    }

    /// A tensor holding `data` in row-major order with the given sizes
    /// (`torch.tensor(data).reshape(sizes)`).
    ///
    /// # Errors
    /// [`TensorError::InvalidShape`] when the sizes do not hold `data.len()` elements;
    /// as [`Tensor::zeros`].
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, sizes: &[usize], device: Device) -> Result<Tensor> {
        let n: usize = sizes.iter().product();
        if n != data.len() {
            return Err(TensorError::InvalidShape(format!(
                "shape '{sizes:?}' is invalid for input of size {}",
                data.len()
            )));
        }
        let mut bytes = Vec::with_capacity(n * T::DTYPE.size());
        for x in data {
            x.put(&mut bytes);
        }
        Tensor::from_bytes(bytes, sizes, T::DTYPE, device, Location::caller())
    }

    fn from_bytes(
        bytes: Vec<u8>,
        sizes: &[usize],
        dtype: DType,
        device: Device,
        at: &'static Location<'static>,
    ) -> Result<Tensor> {
        let host = Tensor::wrap(
            Storage::host(HostMem::Bytes(bytes)),
            sizes,
            dtype,
            Device::Cpu,
        );
        match device {
            Device::Cpu => Ok(host),
            Device::Cuda(_) => host.to_at(device, false, at),
        }
    }

    /// The elements in row-major order, copied to the host.
    ///
    /// # Errors
    /// [`TensorError::DTypeMismatch`] when `T` is not the tensor's dtype; driver failures.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(TensorError::DTypeMismatch(self.dtype, T::DTYPE));
        }
        let bytes = self.host_bytes()?;
        Ok(bytes.chunks_exact(self.dtype.size()).map(T::take).collect())
    }

    /// The elements' bytes in row-major order.
    pub(crate) fn host_bytes(&self) -> Result<Vec<u8>> {
        let host = self.to(Device::Cpu)?;
        let mem = host.storage.host_mem().ok_or(TensorError::Unsupported(
            "host copy without host memory".into(),
        ))?;
        let raw = mem.bytes();
        if host.layout.is_contiguous() {
            let start = host.layout.offset() * self.dtype.size();
            Ok(raw[start..start + self.nbytes()].to_vec())
        } else {
            Ok(host_ops::gather(self.dtype, &raw, &host.layout))
        }
    }

    /// The sizes (`tensor.shape`).
    pub fn sizes(&self) -> &[usize] {
        self.layout.sizes()
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Bytes of the elements (`numel * element size`).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Whether the elements are row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Whether two tensors share storage (one is a view of the other, or a clone).
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// The device address of the first element (0 on the host).
    pub fn data_ptr(&self) -> u64 {
        self.storage.device_ptr().map_or(0, |(_, p)| {
            p + (self.layout.offset() * self.dtype.size()) as u64
        })
    }

    /// Whether the tensor is in pinned host memory.
    pub fn is_pinned(&self) -> bool {
        self.storage.host_mem().is_some_and(|m| m.is_pinned())
    }

    /// Names the tensor's storage in leak reports.
    pub fn set_name(&self, name: &str) {
        if let Some((ctx, ptr)) = self.storage.device_ptr() {
            ctx.set_name(ptr, name);
        }
    }

    /// Marks the storage as used by `stream`, so freeing it waits for the work queued
    /// there (`tensor.record_stream(s)`). No-op on the host.
    ///
    /// # Errors
    /// [`TensorError::DeviceMismatch`] for a stream of another device.
    pub fn record_stream(&self, stream: &Stream) -> Result<()> {
        let Some((ctx, ptr)) = self.storage.device_ptr() else {
            return Ok(());
        };
        if !Arc::ptr_eq(ctx, &stream.ctx) {
            return Err(TensorError::DeviceMismatch(self.device, stream.device()));
        }
        ctx.record_stream(ptr, stream.id())
    }

    /// Dimensions `a` and `b` swapped, sharing storage (`tensor.transpose(a, b)`).
    ///
    /// # Errors
    /// [`TensorError::DimOutOfRange`].
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        let rank = self.sizes().len();
        let layout = self
            .layout
            .transpose(a, b)
            .ok_or(TensorError::DimOutOfRange {
                dim: a.max(b),
                rank,
            })?;
        Ok(Tensor {
            layout,
            ..self.clone()
        })
    }

    /// The transpose of a matrix (`tensor.T` for 2-D).
    ///
    /// # Errors
    /// [`TensorError::InvalidShape`] unless the tensor is 2-D.
    pub fn t(&self) -> Result<Tensor> {
        if self.sizes().len() != 2 {
            return Err(TensorError::InvalidShape(format!(
                "t() expects a tensor with <= 2 dimensions, but self is {}D",
                self.sizes().len()
            )));
        }
        self.transpose(0, 1)
    }

    /// A contiguous tensor with the same elements: `self` when already contiguous.
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`]; driver failures.
    #[track_caller]
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.layout.is_contiguous() && self.layout.offset() == 0 {
            return Ok(self.clone());
        }
        let at = Location::caller();
        match self.storage.device_ptr() {
            None => {
                let bytes = self.host_bytes()?;
                Ok(Tensor::wrap(
                    Storage::host(HostMem::Bytes(bytes)),
                    self.sizes(),
                    self.dtype,
                    Device::Cpu,
                ))
            }
            Some((ctx, src)) => {
                let (out, stream) = Tensor::alloc(self.sizes(), self.dtype, self.device, at)?;
                let stream = stream.unwrap_or_else(|| ctx.engine.default_stream());
                ctx.engine
                    .gather(self.dtype, out.data_ptr(), src, &self.layout, &stream)?;
                Ok(out)
            }
        }
    }

    /// A new tensor with the same elements in new storage (`tensor.clone()` in
    /// PyTorch; Rust's `Clone` shares the storage instead).
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`]; driver failures.
    #[track_caller]
    pub fn deep_copy(&self) -> Result<Tensor> {
        let at = Location::caller();
        let src = self.contiguous()?;
        if src.storage.device_ptr().is_none() {
            let bytes = src.host_bytes()?;
            return Ok(Tensor::wrap(
                Storage::host(HostMem::Bytes(bytes)),
                self.sizes(),
                self.dtype,
                Device::Cpu,
            ));
        }
        let (out, stream) = Tensor::alloc(self.sizes(), self.dtype, self.device, at)?;
        if let (Some((ctx, dst)), Some(s)) = (out.storage.device_ptr(), stream) {
            ctx.engine.copy(dst, src.data_ptr(), self.nbytes(), &s)?;
        }
        Ok(out)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, {:?}, {})",
            self.dtype.name(),
            self.layout,
            self.device
        )
    }
}
