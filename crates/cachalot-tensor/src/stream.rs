//! Streams and events: the default stream and side streams of a device, the
//! current stream of this thread (which every operation and allocation on that
//! device uses), a guard that switches it for a scope, and events to order and
//! time work across streams.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use cachalot::StreamId;

use crate::context::DeviceContext;
use crate::device::{current_device, Device};
use crate::engine::{RawEvent, RawStream};
use crate::error::{Result, TensorError};
use crate::registry;

/// A stream of one device.
#[derive(Clone)]
pub struct Stream {
    pub(crate) ctx: Arc<DeviceContext>,
    pub(crate) raw: RawStream,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream(cuda:{}, {})", self.ctx.ordinal, self.raw.id())
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.ctx, &other.ctx) && self.raw.id() == other.raw.id()
    }
}

thread_local! {
    /// The current stream per device context (by address), when not the default.
    static CURRENT: RefCell<HashMap<usize, Vec<RawStream>>> = RefCell::new(HashMap::new());
}

fn key(ctx: &Arc<DeviceContext>) -> usize {
    Arc::as_ptr(ctx) as usize
}

/// The stream work on `ctx` goes to on this thread.
pub(crate) fn current_raw(ctx: &Arc<DeviceContext>) -> RawStream {
    CURRENT
        .with(|c| c.borrow().get(&key(ctx)).and_then(|v| v.last().cloned()))
        .unwrap_or_else(|| ctx.engine.default_stream())
}

impl Stream {
    /// A side stream on CUDA device `ordinal` (`torch.cuda.Stream(device)`): like
    /// PyTorch, each device has a pool of 32 side streams, created on demand and then
    /// handed out again round-robin.
    ///
    /// # Errors
    /// [`TensorError::InvalidDevice`]; driver failures.
    pub fn new(ordinal: usize) -> Result<Stream> {
        let ctx = registry::device(ordinal)?;
        let raw = ctx.new_stream()?;
        Ok(Stream { ctx, raw })
    }

    /// The default stream of device `ordinal`.
    ///
    /// # Errors
    /// [`TensorError::InvalidDevice`].
    pub fn default_stream(ordinal: usize) -> Result<Stream> {
        let ctx = registry::device(ordinal)?;
        let raw = ctx.engine.default_stream();
        Ok(Stream { ctx, raw })
    }

    /// This thread's current stream on device `ordinal`.
    ///
    /// # Errors
    /// [`TensorError::InvalidDevice`].
    pub fn current(ordinal: usize) -> Result<Stream> {
        let ctx = registry::device(ordinal)?;
        let raw = current_raw(&ctx);
        Ok(Stream { ctx, raw })
    }

    /// This thread's current stream on its current device.
    ///
    /// # Errors
    /// [`TensorError::InvalidDevice`].
    pub fn current_on_current_device() -> Result<Stream> {
        Stream::current(current_device())
    }

    /// The device.
    pub fn device(&self) -> Device {
        Device::Cuda(self.ctx.ordinal)
    }

    /// The id the allocator knows the stream by.
    pub fn id(&self) -> StreamId {
        self.raw.id()
    }

    /// Makes this the current stream of its device on this thread until the guard
    /// drops (`with torch.cuda.stream(s):`).
    pub fn enter(&self) -> StreamGuard {
        let k = key(&self.ctx);
        CURRENT.with(|c| c.borrow_mut().entry(k).or_default().push(self.raw.clone()));
        StreamGuard {
            key: k,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Records an event on this stream.
    ///
    /// # Errors
    /// Driver failures.
    pub fn record_event(&self) -> Result<Event> {
        let ev = Event::on(&self.ctx)?;
        ev.record(self)?;
        Ok(ev)
    }

    /// Makes future work on this stream wait for `event`.
    ///
    /// # Errors
    /// Driver failures.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let raw = event.raw.lock().unwrap_or_else(|e| e.into_inner());
        raw.wait_on(&self.raw)
    }

    /// Makes future work on this stream wait for the work queued on `other` so far.
    ///
    /// # Errors
    /// Driver failures.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        if self == other {
            return Ok(());
        }
        self.wait_event(&other.record_event()?)
    }

    /// Blocks until the work queued on this stream has finished.
    ///
    /// # Errors
    /// Driver failures.
    pub fn synchronize(&self) -> Result<()> {
        match &self.raw {
            RawStream::Sim(_) => Ok(()),
            RawStream::Cuda(s) => s
                .synchronize()
                .map_err(|e| TensorError::driver("cuStreamSynchronize", e)),
        }
    }
}

/// Restores the previous current stream when dropped. Made by [`Stream::enter`].
#[derive(Debug)]
#[must_use = "the stream is current only until the guard drops"]
pub struct StreamGuard {
    key: usize,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| {
            if let Some(v) = c.borrow_mut().get_mut(&self.key) {
                v.pop();
            }
        });
    }
}

/// An event: a point in a stream's work that other streams and the host can wait
/// for, and time.
pub struct Event {
    pub(crate) ctx: Arc<DeviceContext>,
    pub(crate) raw: Mutex<RawEvent>,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event(cuda:{})", self.ctx.ordinal)
    }
}

impl Event {
    /// A new event on CUDA device `ordinal`, not yet recorded.
    ///
    /// # Errors
    /// [`TensorError::InvalidDevice`]; driver failures.
    pub fn new(ordinal: usize) -> Result<Event> {
        Event::on(&registry::device(ordinal)?)
    }

    pub(crate) fn on(ctx: &Arc<DeviceContext>) -> Result<Event> {
        Ok(Event {
            ctx: ctx.clone(),
            raw: Mutex::new(ctx.engine.new_event()?),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RawEvent> {
        self.raw.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the event at the current end of `stream`'s work.
    ///
    /// # Errors
    /// Driver failures.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.lock().record(&stream.raw)
    }

    /// Whether the recorded work has finished. Never blocks.
    pub fn query(&self) -> bool {
        self.lock().query()
    }

    /// Blocks until the recorded work has finished.
    ///
    /// # Errors
    /// Driver failures.
    pub fn synchronize(&self) -> Result<()> {
        self.lock().synchronize()
    }

    /// Milliseconds between this event and `end` (both recorded and complete).
    ///
    /// # Errors
    /// Events never recorded, or driver failures.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        if std::ptr::eq(self, end) {
            return Ok(0.0);
        }
        let (a, b) = (self.lock(), end.lock());
        a.elapsed_ms(&b)
    }
}
