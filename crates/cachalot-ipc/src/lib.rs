//! # cachalot-ipc: sharing live allocations with other processes
//!
//! CUDA IPC, as torch.multiprocessing does with CUDA tensors, over any
//! allocator of `cachalot-core` (its own crate: it alone needs `nix`, for file
//! descriptors over Unix sockets). The `cachalot` crate re-exports it as
//! `cachalot::ipc`.
//!
//! Glossary:
//! - *backing*: what lies under an allocation: a device segment (`cuMemAlloc`),
//!   or physical pages mapped in a reserved range.
//! - *handle*: the bytes another process opens the allocation with
//!   ([`handle`]); the allocation lies at a byte *offset* from what opens.
//! - *share* / *open*: the two sides. A segment travels as a CUDA IPC handle
//!   (PyTorch 2.11's own format, so either side may be PyTorch's allocator);
//!   pages travel as POSIX file descriptors handed over a Unix socket
//!   ([`server`](mod@server)), then imported and mapped in a range of the receiver's.
//!
//! Invariants: an opened handle is mapped once per process however often it
//! is opened ([`Imports`]); it stays mapped until its last opener closes it;
//! the sender's memory is not reused while the receiver holds it only because
//! the caller (torch.multiprocessing's reference counts) keeps the sender's
//! allocation alive, as with PyTorch's allocator.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(clippy::unwrap_used)]

pub mod handle;
mod import;
pub mod server;

use std::sync::{Arc, OnceLock};

pub use self::import::Imports;

use cachalot_core::allocator::DeviceAllocator;
use cachalot_core::backend::DevicePtr;
pub use cachalot_core::backing::Backing;
use cachalot_core::error::{Error, Result};

use self::handle::Handle;
use self::server::FdServer;

/// A shared allocation: the handle to send, and where the allocation lies
/// from what the handle opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    /// Bytes from the opened base to the allocation.
    pub offset: u64,
    /// The handle's bytes.
    pub handle: Vec<u8>,
}

fn server() -> Result<&'static FdServer> {
    static SERVER: OnceLock<std::result::Result<FdServer, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| FdServer::start().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::InvalidArgument(e.clone()))
}

/// Shares the live allocation at `ptr` of `alloc`.
///
/// # Errors
/// [`Error::InvalidFree`] for an address that is not a live allocation;
/// [`Error::Backend`] when the device cannot export it (a simulated device,
/// pages made before exporting was possible); [`Error::InvalidArgument`] when
/// the socket that hands out pages cannot be served.
pub fn share(alloc: &dyn DeviceAllocator, ptr: DevicePtr) -> Result<Shared> {
    let backend = alloc.backend().clone();
    match alloc.backing(ptr)? {
        Backing::Segment { base } => Ok(Shared {
            offset: ptr - base,
            handle: Handle::Segment(backend.export_segment(base)?).encode(),
        }),
        Backing::Pages { base, pages } => {
            let first = pages
                .first()
                .ok_or_else(|| Error::InvalidArgument(format!("no pages lie under {ptr:#x}")))?;
            // Fails now, not in the receiver, when the pages cannot be exported.
            drop(backend.export_page(first.0)?);
            let sizes = pages.iter().map(|(_, bytes)| *bytes).collect();
            let server = server()?;
            let pages = Arc::new(pages);
            let token = server.offer(Arc::new(move || {
                pages.iter().map(|(p, _)| backend.export_page(*p)).collect()
            }));
            let handle = Handle::Pages {
                socket: server.name().to_string(),
                token,
                sizes,
            };
            Ok(Shared {
                offset: ptr - base,
                handle: handle.encode(),
            })
        }
    }
}
