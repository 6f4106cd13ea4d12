//! Devices: the host (`cpu`) and CUDA devices (`cuda:N`), the current device of
//! this thread, and a guard that switches it for a scope (PyTorch's
//! `with torch.cuda.device(1):`).

use std::cell::Cell;

use crate::error::{Result, TensorError};
use crate::registry;

pub use crate::place::Device;

impl Device {
    /// The current CUDA device of this thread (`torch.device("cuda")`).
    pub fn cuda() -> Device {
        Device::Cuda(current_device())
    }
}

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The number of CUDA devices (simulated ones when no GPU is present).
pub fn device_count() -> usize {
    registry::active().device_count()
}

/// This thread's current CUDA device (0 until changed).
pub fn current_device() -> usize {
    CURRENT.with(Cell::get)
}

/// Makes `ordinal` this thread's current CUDA device.
///
/// # Errors
/// [`TensorError::InvalidDevice`] for an ordinal past [`device_count`].
pub fn set_device(ordinal: usize) -> Result<()> {
    check_ordinal(ordinal)?;
    CURRENT.with(|c| c.set(ordinal));
    Ok(())
}

/// Whether device `ordinal` can access `peer`'s memory directly
/// (`torch.cuda.can_device_access_peer`); copies between them use peer access then,
/// and are staged through the host otherwise.
///
/// # Errors
/// [`TensorError::InvalidDevice`]; driver failures.
pub fn can_device_access_peer(ordinal: usize, peer: usize) -> Result<bool> {
    let (a, b) = (registry::device(ordinal)?, registry::device(peer)?);
    Ok(ordinal != peer && a.engine.can_access_peer(&b.engine))
}

pub(crate) fn check_ordinal(ordinal: usize) -> Result<()> {
    let count = device_count();
    if ordinal >= count {
        return Err(TensorError::InvalidDevice { ordinal, count });
    }
    Ok(())
}

/// Restores the previous current device when dropped. Made by [`device_guard`].
#[derive(Debug)]
#[must_use = "the device switches back when the guard drops"]
pub struct DeviceGuard {
    previous: usize,
}

/// Makes `ordinal` the current device until the returned guard drops.
///
/// # Errors
/// [`TensorError::InvalidDevice`] for an ordinal past [`device_count`].
pub fn device_guard(ordinal: usize) -> Result<DeviceGuard> {
    let previous = current_device();
    set_device(ordinal)?;
    Ok(DeviceGuard { previous })
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}
