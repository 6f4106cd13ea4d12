//! Host memory and the copies between it and the device: what a backup of
//! paused memory ([`crate::sleep`]) is made of.
//!
//! [`Backend::allocate_host`](super::Backend::allocate_host) hands out host
//! memory that the device copies to and from at the link's speed (pinned on
//! CUDA); the caller keeps it and reuses it, so a copy never waits for a host
//! allocation. [`Backend::download`](super::Backend::download) and
//! [`Backend::upload`](super::Backend::upload) take a batch of copies, queue
//! them back to back on a stream of the backend's own and wait for the last:
//! one wait per batch, however many ranges it holds.

use std::fmt;

use super::DevicePtr;

/// Host memory a backend copies device bytes into and out of.
pub trait HostMemory: Send + Sync + fmt::Debug {
    /// Its bytes.
    fn bytes(&self) -> &[u8];

    /// Its bytes, to write.
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// Plain host memory: what the simulated device hands out, and what any
/// backend copies to and from (more slowly than pinned memory on CUDA).
impl HostMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// One copy of `dst.len()` bytes from device address `src` to host memory.
#[derive(Debug)]
pub struct ToHost<'a> {
    /// Where the bytes lie on the device.
    pub src: DevicePtr,
    /// Where they go.
    pub dst: &'a mut [u8],
}

/// One copy of host bytes to device address `dst`.
#[derive(Debug, Clone, Copy)]
pub struct ToDevice<'a> {
    /// The bytes.
    pub src: &'a [u8],
    /// Where they go on the device.
    pub dst: DevicePtr,
}
