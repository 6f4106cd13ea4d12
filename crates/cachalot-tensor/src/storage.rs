//! Tensor storage: bytes shared by reference count. Device storage holds one
//! allocation from the device's caching allocator and gives it back when the last
//! reference drops; host storage holds plain or pinned host memory.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};

use cachalot::DevicePtr;

use crate::context::DeviceContext;
use crate::pinned::PinnedBlock;

/// Host bytes.
#[derive(Debug)]
pub(crate) enum HostMem {
    /// `n` zero bytes, not materialised until written.
    Zeros(usize),
    /// Pageable memory.
    Bytes(Vec<u8>),
    /// Pinned memory from the registry's cache.
    Pinned(PinnedBlock),
}

impl HostMem {
    pub(crate) fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            HostMem::Zeros(n) => Cow::Owned(vec![0u8; *n]),
            HostMem::Bytes(b) => Cow::Borrowed(b),
            HostMem::Pinned(p) => Cow::Borrowed(p.as_slice()),
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        if let HostMem::Zeros(n) = self {
            *self = HostMem::Bytes(vec![0u8; *n]);
        }
        match self {
            HostMem::Zeros(_) => &mut [],
            HostMem::Bytes(b) => b,
            HostMem::Pinned(p) => p.as_mut_slice(),
        }
    }

    pub(crate) fn is_pinned(&self) -> bool {
        matches!(self, HostMem::Pinned(_))
    }
}

/// Where a storage's bytes are.
#[derive(Debug)]
pub(crate) enum Place {
    /// Host memory.
    Host(Mutex<HostMem>),
    /// One allocation on a device.
    Device {
        /// The device.
        ctx: Arc<DeviceContext>,
        /// The allocation's address.
        ptr: DevicePtr,
    },
}

/// A tensor's storage.
#[derive(Debug)]
pub(crate) struct Storage {
    pub(crate) place: Place,
}

impl Storage {
    pub(crate) fn host(mem: HostMem) -> Arc<Storage> {
        Arc::new(Storage {
            place: Place::Host(Mutex::new(mem)),
        })
    }

    pub(crate) fn device(ctx: Arc<DeviceContext>, ptr: DevicePtr) -> Arc<Storage> {
        Arc::new(Storage {
            place: Place::Device { ctx, ptr },
        })
    }

    /// The host bytes; `None` for device storage.
    pub(crate) fn host_mem(&self) -> Option<MutexGuard<'_, HostMem>> {
        match &self.place {
            Place::Host(m) => Some(m.lock().unwrap_or_else(|e| e.into_inner())),
            Place::Device { .. } => None,
        }
    }

    /// The device and address; `None` for host storage.
    pub(crate) fn device_ptr(&self) -> Option<(&Arc<DeviceContext>, DevicePtr)> {
        match &self.place {
            Place::Device { ctx, ptr } => Some((ctx, *ptr)),
            Place::Host(_) => None,
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Place::Device { ctx, ptr } = &self.place {
            ctx.release(*ptr);
        }
    }
}
