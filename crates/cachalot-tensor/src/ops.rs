//! Arithmetic: elementwise add and mul (with a tensor or a scalar) and matmul.
//! On a GPU they are NVRTC kernels and cuBLAS; on the host and the simulated
//! device, host loops. Operands must share device, dtype and (for elementwise
//! ops) shape; the errors read like PyTorch's.

use std::panic::Location;

use crate::engine::{cuda_stream, Engine};
use crate::error::{Result, TensorError};
use crate::host_ops::{self, BinaryOp, Rhs};
use crate::layout::Layout;
use crate::stream::current_raw;
use crate::tensor::Tensor;

fn same_device(a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device != b.device {
        return Err(TensorError::DeviceMismatch(a.device, b.device));
    }
    Ok(())
}

fn same_dtype(a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(TensorError::DTypeMismatch(a.dtype, b.dtype));
    }
    Ok(())
}

fn same_shape(a: &Tensor, b: &Tensor) -> Result<()> {
    let (x, y) = (a.sizes(), b.sizes());
    if x.len() != y.len() {
        return Err(TensorError::InvalidShape(format!(
            "elementwise operands must have the same number of dimensions (broadcasting is not supported): {x:?} and {y:?}"
        )));
    }
    match x.iter().zip(y).position(|(p, q)| p != q) {
        Some(dim) => Err(TensorError::ShapeMismatch {
            a: x[dim],
            b: y[dim],
            dim,
        }),
        None => Ok(()),
    }
}

impl Tensor {
    /// `self + other`, elementwise.
    ///
    /// # Errors
    /// [`TensorError::DeviceMismatch`], [`TensorError::DTypeMismatch`],
    /// [`TensorError::ShapeMismatch`], [`TensorError::OutOfMemory`].
    #[track_caller]
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.elementwise(BinaryOp::Add, Rhs::Each(other), Location::caller())
    }

    /// `self * other`, elementwise.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    #[track_caller]
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.elementwise(BinaryOp::Mul, Rhs::Each(other), Location::caller())
    }

    /// `self + value`.
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`].
    #[track_caller]
    pub fn add_scalar(&self, value: f64) -> Result<Tensor> {
        self.elementwise(BinaryOp::Add, Rhs::Scalar(value), Location::caller())
    }

    /// `self * value`.
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`].
    #[track_caller]
    pub fn mul_scalar(&self, value: f64) -> Result<Tensor> {
        self.elementwise(BinaryOp::Mul, Rhs::Scalar(value), Location::caller())
    }

    /// `self += other`, in place (`tensor.add_(other)`): the storage is kept, so the
    /// tensor's memory and every view of it see the update.
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`TensorError::Unsupported`] when `self` is not contiguous.
    pub fn add_(&self, other: &Tensor) -> Result<()> {
        self.binary_in_place(BinaryOp::Add, other)
    }

    /// `self *= other`, in place (`tensor.mul_(other)`).
    ///
    /// # Errors
    /// As [`Tensor::add_`].
    pub fn mul_(&self, other: &Tensor) -> Result<()> {
        self.binary_in_place(BinaryOp::Mul, other)
    }

    fn binary_in_place(&self, op: BinaryOp, other: &Tensor) -> Result<()> {
        same_device(self, other)?;
        same_dtype(self, other)?;
        same_shape(self, other)?;
        if !self.is_contiguous() {
            return Err(TensorError::Unsupported(
                "in-place operation on a non-contiguous view".into(),
            ));
        }
        let b = other.contiguous()?;
        match self.storage.device_ptr() {
            Some((ctx, _)) => {
                let s = current_raw(ctx);
                let o = self.data_ptr();
                let rhs = Rhs::Each(b.data_ptr());
                ctx.engine
                    .elementwise(op, self.dtype, o, o, rhs, self.numel(), &s)
            }
            None => {
                let (x, y) = (self.host_bytes()?, b.host_bytes()?);
                let start = self.layout.offset() * self.dtype.size();
                let len = x.len();
                write_host(self, |o| {
                    let out = &mut o[start..start + len];
                    host_ops::elementwise(op, self.dtype, out, &x, Rhs::Each(&y))
                });
                Ok(())
            }
        }
    }

    fn elementwise(
        &self,
        op: BinaryOp,
        rhs: Rhs<&Tensor>,
        at: &'static Location<'static>,
    ) -> Result<Tensor> {
        if let Rhs::Each(other) = rhs {
            same_device(self, other)?;
            same_dtype(self, other)?;
            same_shape(self, other)?;
        }
        let a = self.contiguous()?;
        let rhs = rhs.try_map(Tensor::contiguous)?;
        let (out, stream) = Tensor::alloc(a.sizes(), a.dtype, a.device, at)?;
        match (out.storage.device_ptr(), stream) {
            (Some((ctx, o)), Some(s)) => {
                let rhs = rhs.borrowed().map(Tensor::data_ptr);
                ctx.engine
                    .elementwise(op, a.dtype, o, a.data_ptr(), rhs, a.numel(), &s)?
            }
            _ => {
                let x = a.host_bytes()?;
                let y = rhs.borrowed().try_map(Tensor::host_bytes)?;
                write_host(&out, |o| host_ops::elementwise(op, a.dtype, o, &x, y));
            }
        }
        Ok(out)
    }

    /// The matrix product of two 2-D tensors (`self @ other`). On a device, the
    /// output is allocated first and then, on the first product on each stream,
    /// cuBLAS's workspace (32 MiB on Hopper) from the same caching allocator, as
    /// PyTorch does; the workspace stays allocated for the device's lifetime.
    ///
    /// # Errors
    /// [`TensorError::MatmulShape`], [`TensorError::InvalidShape`] (not 2-D),
    /// [`TensorError::DeviceMismatch`], [`TensorError::DTypeMismatch`],
    /// [`TensorError::OutOfMemory`]; [`TensorError::Unsupported`] on a GPU for
    /// dtypes other than f32 and f64.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let at = Location::caller();
        if self.sizes().len() != 2 || other.sizes().len() != 2 {
            return Err(TensorError::InvalidShape(format!(
                "matmul expects 2-D tensors, got {}-D and {}-D",
                self.sizes().len(),
                other.sizes().len()
            )));
        }
        same_device(self, other)?;
        let (sa, sb) = (
            [self.sizes()[0], self.sizes()[1]],
            [other.sizes()[0], other.sizes()[1]],
        );
        if sa[1] != sb[0] {
            return Err(TensorError::MatmulShape(sa, sb));
        }
        same_dtype(self, other)?;
        let (a, b) = (gemm_ready(self)?, gemm_ready(other)?);
        let (out, stream) = Tensor::alloc(&[sa[0], sb[1]], a.dtype, a.device, at)?;
        let (Some((ctx, o)), Some(s)) = (out.storage.device_ptr(), stream) else {
            let (x, y) = (a.host_bytes()?, b.host_bytes()?);
            let (la, lb) = (Layout::contiguous(a.sizes()), Layout::contiguous(b.sizes()));
            let product = host_ops::matmul(a.dtype, (&x, &la), (&y, &lb));
            write_host(&out, |buf| buf.copy_from_slice(&product));
            return Ok(out);
        };
        let workspace = ctx.cublas_workspace(&s)?;
        match &ctx.engine {
            Engine::Sim(e) => e.matmul(
                a.dtype,
                o,
                (a.data_ptr(), &rebase(&a)),
                (b.data_ptr(), &rebase(&b)),
            )?,
            Engine::Cuda(e) => {
                e.gemm(
                    a.dtype,
                    o,
                    operand(&a),
                    operand(&b),
                    (sa[0], sb[1], sa[1]),
                    workspace,
                    cuda_stream(&s)?,
                )?;
                ctx.rebind_backend();
            }
        }
        Ok(out)
    }
}

/// The layout of a [`gemm_ready`] matrix relative to its first element.
fn rebase(t: &Tensor) -> Layout {
    let (rows, cols) = (t.sizes()[0], t.sizes()[1]);
    match Layout::contiguous(&[cols, rows]).transpose(0, 1) {
        Some(view) if !t.layout.is_contiguous() => view,
        _ => Layout::contiguous(t.sizes()),
    }
}

/// A matrix cuBLAS can read as is: row-major, or a transposed row-major view.
fn gemm_ready(t: &Tensor) -> Result<Tensor> {
    let transposed_view = t.layout.strides() == [1, t.sizes()[0]];
    if t.layout.is_contiguous() || transposed_view {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

/// (address, transpose flag, leading dimension) of a row-major matrix or its transposed view.
fn operand(t: &Tensor) -> crate::engine::cuda::Operand {
    let (rows, cols) = (t.sizes()[0], t.sizes()[1]);
    if t.layout.is_contiguous() {
        (t.data_ptr(), false, cols.max(1) as i32)
    } else {
        (t.data_ptr(), true, rows.max(1) as i32)
    }
}

fn write_host(out: &Tensor, f: impl FnOnce(&mut [u8])) {
    if let Some(mut mem) = out.storage.host_mem() {
        f(mem.bytes_mut());
    }
}
