//! The bytes the simulated device keeps: written by uploads, read by
//! downloads, per segment and per page (so a page mapped twice shows its bytes
//! at both addresses), in chunks made on first write. Unwritten bytes read as
//! zero, and a page released and created again starts from zero, as no real
//! device promises but a test can tell apart from bytes restored.

use std::collections::HashMap;

use crate::backend::{DevicePtr, PageHandle};

/// Bytes per chunk.
const CHUNK: u64 = 4096;

/// What a piece of device memory belongs to.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Owner {
    /// A segment, by its base address.
    Segment(DevicePtr),
    /// A page.
    Page(PageHandle),
}

/// A stretch of one owner's bytes: `len` bytes from `offset`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    pub(super) owner: Owner,
    pub(super) offset: u64,
    pub(super) len: usize,
}

/// Every owner's written chunks.
#[derive(Debug, Default)]
pub(super) struct Contents {
    chunks: HashMap<Owner, HashMap<u64, Box<[u8]>>>,
}

impl Contents {
    /// Reads `dst.len()` bytes of `piece` into `dst`.
    pub(super) fn read(&self, piece: Piece, dst: &mut [u8]) {
        let chunks = self.chunks.get(&piece.owner);
        for (index, start, range) in spans(piece) {
            let out = &mut dst[range];
            match chunks.and_then(|c| c.get(&index)) {
                Some(chunk) => out.copy_from_slice(&chunk[start..start + out.len()]),
                None => out.fill(0),
            }
        }
    }

    /// Writes `src` over `piece`.
    pub(super) fn write(&mut self, piece: Piece, src: &[u8]) {
        let chunks = self.chunks.entry(piece.owner).or_default();
        for (index, start, range) in spans(piece) {
            let chunk = chunks
                .entry(index)
                .or_insert_with(|| vec![0; CHUNK as usize].into_boxed_slice());
            chunk[start..start + range.len()].copy_from_slice(&src[range]);
        }
    }

    /// Forgets an owner's bytes (its segment was freed, its page released).
    pub(super) fn forget(&mut self, owner: Owner) {
        self.chunks.remove(&owner);
    }
}

/// The chunks `piece` touches: each chunk's index, where the piece starts in
/// it, and the piece's bytes that fall in it (as a range of the piece).
fn spans(piece: Piece) -> impl Iterator<Item = (u64, usize, std::ops::Range<usize>)> {
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= piece.len {
            return None;
        }
        let at = piece.offset + done as u64;
        let start = (at % CHUNK) as usize;
        let len = (CHUNK as usize - start).min(piece.len - done);
        let span = (at / CHUNK, start, done..done + len);
        done += len;
        Some(span)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_back_across_chunks_and_unwritten_ones_are_zero() {
        let mut c = Contents::default();
        let owner = Owner::Page(PageHandle(3));
        let piece = |offset, len| Piece { owner, offset, len };
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        c.write(piece(4000, data.len()), &data);
        let mut back = vec![0u8; data.len() + 200];
        c.read(piece(3900, back.len()), &mut back);
        assert!(back[..100].iter().all(|b| *b == 0));
        assert_eq!(&back[100..100 + data.len()], &data[..]);
        assert!(back[100 + data.len()..].iter().all(|b| *b == 0));
        c.forget(owner);
        c.read(piece(4000, 16), &mut back[..16]);
        assert!(back[..16].iter().all(|b| *b == 0));
    }
}
