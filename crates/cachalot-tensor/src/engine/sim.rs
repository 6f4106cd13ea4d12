//! The simulated device's data: host buffers behind the addresses the allocator
//! hands out.
//!
//! The `sim` backend gives addresses only; this engine keeps the bytes, one
//! buffer per allocation, created lazily on the first write (an unwritten
//! allocation reads as zeros, so a 1 GiB `zeros` costs no host memory until
//! something is written to it). Every operation runs at once on the calling
//! thread, so every stream is always idle and every event complete.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cachalot::{DevicePtr, StreamId};

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::host_ops::{self, BinaryOp, HostRng, Rhs};
use crate::layout::Layout;

#[derive(Debug)]
struct Buffer {
    len: usize,
    /// `None` until first written: all zeros.
    bytes: Option<Vec<u8>>,
}

/// Host memory standing in for one simulated device.
#[derive(Debug)]
pub(crate) struct SimEngine {
    buffers: Mutex<BTreeMap<DevicePtr, Buffer>>,
    rng: Mutex<HostRng>,
    next_stream: AtomicU64,
}

impl SimEngine {
    pub(crate) fn new(ordinal: usize) -> SimEngine {
        SimEngine {
            buffers: Mutex::new(BTreeMap::new()),
            rng: Mutex::new(HostRng::new(0x5eed + ordinal as u64)),
            next_stream: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<DevicePtr, Buffer>> {
        self.buffers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh side-stream id.
    pub(crate) fn new_stream(&self) -> StreamId {
        StreamId(self.next_stream.fetch_add(1, Ordering::Relaxed))
    }

    /// Starts tracking an allocation (no host memory yet).
    pub(crate) fn register(&self, ptr: DevicePtr, len: usize) {
        self.lock().insert(ptr, Buffer { len, bytes: None });
    }

    /// Drops an allocation's bytes.
    pub(crate) fn forget(&self, ptr: DevicePtr) {
        self.lock().remove(&ptr);
    }

    /// Runs `f` on `len` bytes at `addr`, which must lie inside one allocation.
    fn with_range<R>(
        &self,
        addr: DevicePtr,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let mut map = self.lock();
        let (base, buf) = map
            .range_mut(..=addr)
            .next_back()
            .ok_or(TensorError::Driver {
                what: "sim memory access",
                message: format!("{addr:#x} is not allocated"),
            })?;
        let start = (addr - *base) as usize;
        if start + len > buf.len {
            return Err(TensorError::Driver {
                what: "sim memory access",
                message: format!("{len} bytes at {addr:#x} run past the allocation at {base:#x}"),
            });
        }
        let bytes = buf.bytes.get_or_insert_with(|| vec![0u8; buf.len]);
        Ok(f(&mut bytes[start..start + len]))
    }

    /// Copies `len` bytes out, without materialising an unwritten buffer.
    pub(crate) fn read(&self, addr: DevicePtr, out: &mut [u8]) -> Result<()> {
        {
            let map = self.lock();
            if let Some((base, buf)) = map.range(..=addr).next_back() {
                let start = (addr - *base) as usize;
                if buf.bytes.is_none() && start + out.len() <= buf.len {
                    out.fill(0);
                    return Ok(());
                }
            }
        }
        self.with_range(addr, out.len(), |b| out.copy_from_slice(b))
    }

    fn read_vec(&self, addr: DevicePtr, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }

    pub(crate) fn write(&self, addr: DevicePtr, src: &[u8]) -> Result<()> {
        self.with_range(addr, src.len(), |b| b.copy_from_slice(src))
    }

    pub(crate) fn zero(&self, addr: DevicePtr, len: usize) -> Result<()> {
        let mut map = self.lock();
        if let Some(buf) = map.get_mut(&addr) {
            if buf.len == len {
                buf.bytes = None;
                return Ok(());
            }
        }
        drop(map);
        self.with_range(addr, len, |b| b.fill(0))
    }

    pub(crate) fn fill(&self, dtype: DType, addr: DevicePtr, n: usize, value: f64) -> Result<()> {
        if value == 0.0 {
            return self.zero(addr, n * dtype.size());
        }
        self.with_range(addr, n * dtype.size(), |b| host_ops::fill(dtype, b, value))
    }

    pub(crate) fn copy(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        let data = self.read_vec(src, len)?;
        self.write(dst, &data)
    }

    /// `out = a op rhs` over `n` elements of `dtype`.
    pub(crate) fn elementwise(
        &self,
        op: BinaryOp,
        dtype: DType,
        out: DevicePtr,
        a: DevicePtr,
        rhs: Rhs<DevicePtr>,
        n: usize,
    ) -> Result<()> {
        let len = n * dtype.size();
        let x = self.read_vec(a, len)?;
        let y = rhs.try_map(|b| self.read_vec(b, len))?;
        self.with_range(out, len, |o| host_ops::elementwise(op, dtype, o, &x, y))
    }

    /// Reads the storage span a layout touches (from its base) into a vector.
    fn read_span(&self, dtype: DType, base: DevicePtr, layout: &Layout) -> Result<Vec<u8>> {
        let span = layout.indices().max().map_or(0, |m| m + 1);
        self.read_vec(base, span * dtype.size())
    }

    pub(crate) fn gather(
        &self,
        dtype: DType,
        out: DevicePtr,
        base: DevicePtr,
        layout: &Layout,
    ) -> Result<()> {
        let src = self.read_span(dtype, base, layout)?;
        self.write(out, &host_ops::gather(dtype, &src, layout))
    }

    pub(crate) fn matmul(
        &self,
        dtype: DType,
        out: DevicePtr,
        a: (DevicePtr, &Layout),
        b: (DevicePtr, &Layout),
    ) -> Result<()> {
        let x = self.read_span(dtype, a.0, a.1)?;
        let y = self.read_span(dtype, b.0, b.1)?;
        self.write(out, &host_ops::matmul(dtype, (&x, a.1), (&y, b.1)))
    }

    pub(crate) fn randn(&self, dtype: DType, out: DevicePtr, n: usize) -> Result<()> {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        self.with_range(out, n * dtype.size(), |o| rng.fill_normal(dtype, o))
    }

    /// Copies from another simulated device.
    pub(crate) fn copy_from_peer(
        &self,
        dst: DevicePtr,
        peer: &SimEngine,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        let data = peer.read_vec(src, len)?;
        self.write(dst, &data)
    }

    /// Whether `len` bytes at `addr` were never written (so read as zeros).
    pub(crate) fn is_unwritten(&self, addr: DevicePtr, len: usize) -> bool {
        let map = self.lock();
        map.range(..=addr)
            .next_back()
            .is_some_and(|(base, b)| b.bytes.is_none() && (addr - base) as usize + len <= b.len)
    }

    /// Bytes of host memory the simulated device holds now (written buffers only).
    pub(crate) fn host_bytes(&self) -> usize {
        self.lock()
            .values()
            .filter_map(|b| b.bytes.as_ref().map(Vec::len))
            .sum()
    }
}
