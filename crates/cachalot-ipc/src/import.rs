//! The receiving side: handles of other processes opened on a device, each
//! once, until its last opener closes it.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};

use cachalot_core::backend::{Backend, BackendResult, DevicePtr, PageHandle};
use cachalot_core::error::{Error, Result};

use super::handle::Handle;
use super::server;

/// How an opened handle is mapped here.
#[derive(Debug)]
enum Mapping {
    Segment,
    Pages { size: u64, pages: Vec<PageHandle> },
}

#[derive(Debug)]
struct Opened {
    handle: Vec<u8>,
    backend: Arc<dyn Backend>,
    mapping: Mapping,
    openers: u32,
}

/// The handles this process has open, by the address they opened at.
#[derive(Debug, Default)]
pub struct Imports {
    open: Mutex<HashMap<DevicePtr, Opened>>,
}

impl Imports {
    fn lock(&self) -> MutexGuard<'_, HashMap<DevicePtr, Opened>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens `bytes` (a handle from [`share`](super::share) or PyTorch 2.11)
    /// on `backend`'s device, or counts another opener of a handle already
    /// open; returns the base address (the allocation lies at the handle's
    /// offset from it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bytes that are not a handle, or a sender
    /// that cannot be reached; [`Error::Backend`] when the driver refuses it.
    pub fn open(&self, backend: &Arc<dyn Backend>, bytes: &[u8]) -> Result<DevicePtr> {
        let handle = Handle::decode(bytes)?;
        let mut open = self.lock();
        if let Some((ptr, o)) = open.iter_mut().find(|(_, o)| o.handle == bytes) {
            o.openers += 1;
            return Ok(*ptr);
        }
        let (ptr, mapping) = match handle {
            Handle::Segment(h) => (backend.open_segment(&h)?, Mapping::Segment),
            Handle::Pages {
                socket,
                token,
                sizes,
            } => {
                let fds = server::fetch(&socket, &token, sizes.len())?;
                let (base, pages) = map_pages(backend.as_ref(), &fds, &sizes)?;
                let size = sizes.iter().sum();
                (base, Mapping::Pages { size, pages })
            }
        };
        open.insert(
            ptr,
            Opened {
                handle: bytes.to_vec(),
                backend: backend.clone(),
                mapping,
                openers: 1,
            },
        );
        Ok(ptr)
    }

    /// Closes one opener of the handle opened at `ptr`; the last one unmaps it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when nothing is open at `ptr`;
    /// [`Error::Backend`] when the driver fails to unmap it (it stays open).
    pub fn close(&self, ptr: DevicePtr) -> Result<()> {
        let mut open = self.lock();
        let o = open.get_mut(&ptr).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no shared memory of another process is open at {ptr:#x}"
            ))
        })?;
        if o.openers > 1 {
            o.openers -= 1;
            return Ok(());
        }
        match &o.mapping {
            Mapping::Segment => o.backend.close_segment(ptr)?,
            Mapping::Pages { size, pages } => unmap_pages(o.backend.as_ref(), ptr, *size, pages)?,
        }
        open.remove(&ptr);
        Ok(())
    }

    /// How many handles are open.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Imports each descriptor's handle (of `sizes[i]` bytes) and maps them in
/// order in a fresh range; on failure, undoes what it did.
fn map_pages(
    backend: &dyn Backend,
    fds: &[std::os::fd::OwnedFd],
    sizes: &[u64],
) -> Result<(DevicePtr, Vec<PageHandle>)> {
    let mut pages = Vec::with_capacity(fds.len());
    for (fd, bytes) in fds.iter().zip(sizes) {
        match backend.import_page(fd.as_fd(), *bytes) {
            Ok(p) => pages.push(p),
            Err(e) => {
                release_all(backend, &pages);
                return Err(e.into());
            }
        }
    }
    let size = sizes.iter().sum();
    let base = match backend.reserve_range(size) {
        Ok(b) => b,
        Err(e) => {
            release_all(backend, &pages);
            return Err(e.into());
        }
    };
    let mut mapped = 0;
    for (p, bytes) in pages.iter().zip(sizes) {
        if let Err(e) = backend.map(base + mapped, *p) {
            if mapped > 0 {
                let _ = backend.unmap(base, mapped);
            }
            let _ = backend.release_range(base, size);
            release_all(backend, &pages);
            return Err(e.into());
        }
        mapped += bytes;
    }
    Ok((base, pages))
}

fn release_all(backend: &dyn Backend, pages: &[PageHandle]) {
    for p in pages {
        let _ = backend.release_page(*p);
    }
}

fn unmap_pages(
    backend: &dyn Backend,
    base: DevicePtr,
    size: u64,
    pages: &[PageHandle],
) -> BackendResult<()> {
    backend.unmap(base, size)?;
    backend.release_range(base, size)?;
    for p in pages {
        backend.release_page(*p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot_core::backend::sim::SimBackend;

    #[test]
    fn bad_handles_and_closes_are_errors_and_open_nothing() {
        let imports = Imports::default();
        let backend: Arc<dyn Backend> = Arc::new(SimBackend::new(1 << 30));
        assert!(imports.open(&backend, b"").is_err());
        assert!(imports.open(&backend, &[2, b'q']).is_err());
        let mut seg = vec![2, b'c'];
        seg.extend_from_slice(&[0; 64]);
        let e = imports.open(&backend, &seg).unwrap_err().to_string();
        assert!(e.contains("not supported"), "{e}");
        assert!(imports.close(0x1000).is_err());
        assert!(imports.is_empty());
    }
}
