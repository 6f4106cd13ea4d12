//! Tensor errors, worded like PyTorch's messages and grouped by remedy.
//!
//! * [`TensorError::OutOfMemory`]: free tensors (or call `empty_cache`) and retry.
//! * [`TensorError::DeviceMismatch`], [`TensorError::ShapeMismatch`],
//!   [`TensorError::MatmulShape`], [`TensorError::DTypeMismatch`],
//!   [`TensorError::InvalidShape`], [`TensorError::DimOutOfRange`],
//!   [`TensorError::InvalidDevice`], [`TensorError::Unsupported`]: a bug in the
//!   caller; nothing changed.
//! * [`TensorError::Allocator`] and [`TensorError::Driver`]: the device failed.

use thiserror::Error;

use crate::dtype::DType;
use crate::place::Device;

/// The crate's result type.
pub type Result<T, E = TensorError> = std::result::Result<T, E>;

/// Everything a tensor operation can fail with.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum TensorError {
    /// The device has no room even after the cache was flushed. Its `Display` is
    /// PyTorch's `torch.OutOfMemoryError` message.
    #[error("{0}")]
    OutOfMemory(Box<cachalot::OomReport>),
    /// Operands live on different devices.
    #[error("Expected all tensors to be on the same device, but found at least two devices, {0} and {1}!")]
    DeviceMismatch(Device, Device),
    /// Elementwise operands whose sizes differ.
    #[error(
        "The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton dimension {dim}"
    )]
    ShapeMismatch {
        /// Size of the first operand in that dimension.
        a: usize,
        /// Size of the second.
        b: usize,
        /// The dimension.
        dim: usize,
    },
    /// Matrix operands whose inner dimensions differ.
    #[error("mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})", .0[0], .0[1], .1[0], .1[1])]
    MatmulShape([usize; 2], [usize; 2]),
    /// Operands of different element types.
    #[error("expected both operands to have the same dtype, but got {0} and {1}")]
    DTypeMismatch(DType, DType),
    /// A shape that does not fit the data, or an operand of the wrong rank.
    #[error("{0}")]
    InvalidShape(String),
    /// A dimension index past the tensor's rank.
    #[error("Dimension out of range (expected to be in range of [0, {}], but got {dim})", .rank.saturating_sub(1))]
    DimOutOfRange {
        /// The dimension asked for.
        dim: usize,
        /// The tensor's rank.
        rank: usize,
    },
    /// A CUDA device ordinal that does not exist.
    #[error("CUDA error: invalid device ordinal (device {ordinal} requested, {count} available)")]
    InvalidDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// An operation this build cannot do for these operands (a dtype without a
    /// kernel, say).
    #[error("{0}")]
    Unsupported(String),
    /// The allocator refused for a reason other than memory (double free, bad
    /// argument, device failure).
    #[error("allocator: {0}")]
    Allocator(cachalot::Error),
    /// The CUDA driver or a CUDA library failed.
    #[error("CUDA error in {what}: {message}")]
    Driver {
        /// The call that failed.
        what: &'static str,
        /// The driver's message.
        message: String,
    },
}

impl TensorError {
    /// Whether the error is an out-of-memory condition (free memory and retry).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, TensorError::OutOfMemory(_))
    }

    pub(crate) fn driver(what: &'static str, err: impl std::fmt::Debug) -> TensorError {
        TensorError::Driver {
            what,
            message: format!("{err:?}"),
        }
    }
}

impl From<cachalot::Error> for TensorError {
    fn from(e: cachalot::Error) -> Self {
        match e {
            cachalot::Error::OutOfMemory(report) => TensorError::OutOfMemory(report),
            other => TensorError::Allocator(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_like_pytorch() {
        let e = TensorError::DeviceMismatch(Device::Cuda(0), Device::Cpu);
        assert_eq!(
            e.to_string(),
            "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
        );
        assert_eq!(
            TensorError::MatmulShape([2, 3], [4, 5]).to_string(),
            "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"
        );
        assert_eq!(
            TensorError::ShapeMismatch { a: 3, b: 4, dim: 1 }.to_string(),
            "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1"
        );
    }
}
