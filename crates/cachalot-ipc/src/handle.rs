//! The bytes of a shared allocation's handle, as they travel to the other
//! process (inside a pickled tensor, for torch.multiprocessing).
//!
//! Every handle starts with a version byte and a kind byte, as PyTorch 2.11's
//! do (`SHAREABLE_HANDLE_VERSION` 2):
//! - `'c'`: a device segment, then its 64-byte CUDA IPC handle. PyTorch's own
//!   allocator writes and opens the same bytes, so either side may be PyTorch's.
//! - `'x'`: mapped pages (cachalot's own kind), then, little-endian: the
//!   length (u16) and bytes of the name of the abstract Unix socket that hands
//!   out the pages' file descriptors, the 16-byte token that names the pages
//!   there, the count of physical handles (u32) and each one's size in bytes
//!   (u64), in address order.

use cachalot_core::backend::IPC_HANDLE_BYTES;
use cachalot_core::error::{Error, Result};

/// The version byte PyTorch 2.11 writes first.
pub const VERSION: u8 = 2;
const SEGMENT: u8 = b'c';
const PAGES: u8 = b'x';
/// The most physical handles one shared allocation may have (an allocation
/// of a whole H200 in 2 MiB pages has 71,680).
const MAX_PAGES: u32 = 1 << 20;

/// A decoded handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handle {
    /// A device segment, opened through the CUDA IPC handle.
    Segment([u8; IPC_HANDLE_BYTES]),
    /// Pages whose descriptors `socket` hands out for `token`.
    Pages {
        /// The abstract socket's name.
        socket: String,
        /// What names the pages there.
        token: [u8; 16],
        /// The bytes of each physical handle, mapped one after another from
        /// the shared range's base.
        sizes: Vec<u64>,
    },
}

impl Handle {
    /// The bytes to send.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        match self {
            Handle::Segment(h) => {
                out.push(SEGMENT);
                out.extend_from_slice(h);
            }
            Handle::Pages {
                socket,
                token,
                sizes,
            } => {
                out.push(PAGES);
                let name = socket.as_bytes();
                out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                out.extend_from_slice(name);
                out.extend_from_slice(token);
                out.extend_from_slice(&(sizes.len() as u32).to_le_bytes());
                sizes
                    .iter()
                    .for_each(|s| out.extend_from_slice(&s.to_le_bytes()));
            }
        }
        out
    }

    /// Reads the bytes another process sent.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bytes that are not a handle of a known
    /// version and kind, or are cut short.
    pub fn decode(bytes: &[u8]) -> Result<Handle> {
        let mut r = Reader { bytes, at: 0 };
        let version = r.byte()?;
        if version != VERSION {
            return Err(bad(format!(
                "version {version} (this build reads version {VERSION}, PyTorch 2.11's)"
            )));
        }
        let handle = match r.byte()? {
            SEGMENT => Handle::Segment(r.array()?),
            PAGES => {
                let len = u16::from_le_bytes(r.array()?);
                let name = r.take(usize::from(len))?;
                let socket = String::from_utf8(name.to_vec())
                    .map_err(|_| bad("a socket name that is not UTF-8".into()))?;
                let token = r.array()?;
                let count = u32::from_le_bytes(r.array()?);
                if count == 0 || count > MAX_PAGES {
                    return Err(bad(format!("{count} pages (1 to {MAX_PAGES})")));
                }
                let sizes = (0..count)
                    .map(|_| Ok(u64::from_le_bytes(r.array()?)))
                    .collect::<Result<Vec<u64>>>()?;
                let total = sizes.iter().try_fold(0u64, |t, s| t.checked_add(*s));
                if sizes.contains(&0) || total.is_none() {
                    return Err(bad(format!("page sizes {sizes:?}")));
                }
                Handle::Pages {
                    socket,
                    token,
                    sizes,
                }
            }
            b'e' => {
                return Err(bad(
                    "an expandable segment shared by PyTorch's own allocator; open it with \
                     PyTorch's allocator, or share it from cachalot"
                        .into(),
                ))
            }
            kind => return Err(bad(format!("unknown kind {kind:#04x}"))),
        };
        if r.at != bytes.len() {
            return Err(bad(format!("{} bytes after the end", bytes.len() - r.at)));
        }
        Ok(handle)
    }
}

fn bad(what: String) -> Error {
    Error::InvalidArgument(format!("not a shared-memory handle: {what}"))
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| bad(format!("cut short at byte {}", self.bytes.len())))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn byte(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kinds_round_trip() {
        let seg = Handle::Segment([7; IPC_HANDLE_BYTES]);
        let bytes = seg.encode();
        assert_eq!(&bytes[..2], &[2, b'c'], "PyTorch 2.11's layout");
        assert_eq!(bytes.len(), 2 + IPC_HANDLE_BYTES);
        assert_eq!(Handle::decode(&bytes).unwrap(), seg);
        let pages = Handle::Pages {
            socket: "cachalot-ipc.12.ab".into(),
            token: [9; 16],
            sizes: vec![2 << 20, 8 << 20, 2 << 20],
        };
        assert_eq!(Handle::decode(&pages.encode()).unwrap(), pages);
    }

    #[test]
    fn every_truncation_and_corruption_is_refused() {
        let pages = Handle::Pages {
            socket: "s".into(),
            token: [1; 16],
            sizes: vec![2 << 20],
        }
        .encode();
        for cut in 0..pages.len() {
            assert!(Handle::decode(&pages[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = pages.clone();
        longer.push(0);
        assert!(Handle::decode(&longer).is_err());
        let mut old = pages.clone();
        old[0] = 1;
        let e = Handle::decode(&old).unwrap_err().to_string();
        assert!(e.contains("version 1"), "{e}");
        let mut native = vec![2, b'e'];
        native.extend_from_slice(&[0; 40]);
        let e = Handle::decode(&native).unwrap_err().to_string();
        assert!(e.contains("PyTorch's own allocator"), "{e}");
        let mut empty = pages.clone();
        let at = empty.len() - 8;
        empty[at..].copy_from_slice(&0u64.to_le_bytes());
        assert!(Handle::decode(&empty).is_err(), "a page of 0 bytes");
        let mut none = pages;
        let at = none.len() - 12;
        none[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
        assert!(Handle::decode(&none[..at + 4]).is_err(), "no pages");
    }
}
