//! Seeded random recordings, as large as wanted: the events a PyTorch program
//! with random sizes and lifetimes would record, for tests and benchmarks that
//! need millions of events or a device near full.
//!
//! Each allocation draws its size log-uniformly between the spec's bounds
//! (as many of 1 KiB as of 1 MiB), a stream (most on the default one), and a
//! lifetime: most are freed within a few hundred events, a few are held
//! for a long stretch (activations kept for a backward pass, a cache). When
//! live bytes would pass the spec's bound, the allocations closest to their
//! end are freed first, so the peak of live bytes is that bound at most. A
//! free is recorded as `free_requested` then `free_completed`, as PyTorch
//! records one with no pending stream use.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use cachalot_core::backend::StreamId;
use cachalot_core::event::{Action, TraceEvent};

/// What to generate. Field names are the `cachalot synth` options'.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct SynthSpec {
    /// Events to generate: that many, or one or two fewer where the last
    /// allocation's free ends the recording (every allocation is freed
    /// within it).
    pub events: u64,
    /// The seed: the same spec, the same events.
    pub seed: u64,
    /// Smallest request, in bytes.
    pub min_size: u64,
    /// Largest request, in bytes.
    pub max_size: u64,
    /// Most bytes live at once.
    pub max_live: u64,
    /// Share of allocations held for long (0 to 1).
    pub held: f64,
    /// Shortest and longest hold of those, in events.
    pub hold_events: (u64, u64),
    /// Streams used (the default one and `streams - 1` others).
    pub streams: u64,
}

impl Default for SynthSpec {
    /// 1M events of 16 B to 1 GiB, at most 21 GiB live, 2% held for 100k to
    /// 2M events, on 4 streams.
    fn default() -> SynthSpec {
        SynthSpec {
            events: 1_000_000,
            seed: 1,
            min_size: 16,
            max_size: 1 << 30,
            max_live: 21 << 30,
            held: 0.02,
            hold_events: (100_000, 2_000_000),
            streams: 4,
        }
    }
}

/// The events of `spec`, generated as they are consumed.
pub fn synthesize(spec: &SynthSpec) -> Synth {
    Synth {
        spec: *spec,
        rng: spec.seed.max(1),
        made: 0,
        live: BinaryHeap::new(),
        live_bytes: 0,
        next_addr: 1 << 40,
        pending: Vec::new(),
    }
}

/// A live allocation: when it dies (in events), its address, size and stream.
type Live = Reverse<(u64, u64, u64, u64)>;

/// The iterator [`synthesize`] returns.
#[derive(Debug)]
pub struct Synth {
    spec: SynthSpec,
    rng: u64,
    /// Events handed out so far.
    made: u64,
    live: BinaryHeap<Live>,
    live_bytes: u64,
    next_addr: u64,
    /// Events generated and not yet handed out, last first.
    pending: Vec<TraceEvent>,
}

impl Synth {
    fn draw(&mut self) -> u64 {
        // xorshift64*: fast, and the same on every machine.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniform draw in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.draw() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn event(&self, action: Action, addr: u64, size: u64, stream: u64) -> TraceEvent {
        TraceEvent {
            time_us: 1_000_000 + self.made + self.pending.len() as u64,
            action,
            addr,
            size,
            stream: StreamId(stream),
        }
    }

    /// Queues the free of the allocation that dies first.
    fn free_first(&mut self) {
        if let Some(Reverse((_, addr, size, stream))) = self.live.pop() {
            self.live_bytes -= size;
            self.pending
                .push(self.event(Action::FreeRequested, addr, size, stream));
            self.pending
                .push(self.event(Action::FreeCompleted, addr, size, stream));
        }
    }

    /// Queues the next step: the frees that are due, then an allocation (or,
    /// near the end, only frees).
    fn step(&mut self) {
        let now = self.made;
        if self.live.peek().is_some_and(|Reverse(l)| l.0 <= now) {
            self.free_first();
            return;
        }
        // Leave room to free everything still live within the events asked for.
        if now + 3 + 2 * self.live.len() as u64 > self.spec.events {
            self.free_first();
            return;
        }
        let (lo, hi) = (self.spec.min_size.max(1), self.spec.max_size.max(1));
        let span = (hi as f64 / lo as f64).max(1.0).ln();
        let size = ((lo as f64) * (self.unit() * span).exp()).round() as u64;
        let size = size.clamp(lo, hi.min(self.spec.max_live.max(lo)));
        while self.live_bytes + size > self.spec.max_live && !self.live.is_empty() {
            self.free_first();
        }
        let lifetime = if self.unit() < self.spec.held {
            let (a, b) = self.spec.hold_events;
            a + self.draw() % (b.saturating_sub(a) + 1)
        } else {
            1 + self.draw() % 400
        };
        let stream = if self.spec.streams > 1 && self.draw().is_multiple_of(8) {
            1 + self.draw() % (self.spec.streams - 1)
        } else {
            0
        };
        let addr = self.next_addr;
        self.next_addr += size.div_ceil(512) * 512;
        self.live_bytes += size;
        self.live
            .push(Reverse((now + lifetime, addr, size, stream)));
        self.pending
            .push(self.event(Action::Alloc, addr, size, stream));
    }
}

impl Iterator for Synth {
    type Item = TraceEvent;

    fn next(&mut self) -> Option<TraceEvent> {
        if self.made >= self.spec.events {
            return None;
        }
        if self.pending.is_empty() {
            if self.live.is_empty() && self.made + 3 > self.spec.events {
                return None;
            }
            self.step();
            self.pending.reverse();
        }
        let event = self.pending.pop()?;
        self.made += 1;
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{plan, RecordedDevice, H100_CAPACITY};

    fn small(events: u64, seed: u64) -> SynthSpec {
        SynthSpec {
            events,
            seed,
            max_live: 1 << 30,
            hold_events: (1_000, 5_000),
            ..SynthSpec::default()
        }
    }

    #[test]
    fn the_same_spec_gives_the_same_events() {
        let a: Vec<_> = synthesize(&small(10_000, 7)).collect();
        let b: Vec<_> = synthesize(&small(10_000, 7)).collect();
        let c: Vec<_> = synthesize(&small(10_000, 8)).collect();
        assert!(a.len() >= 9_998);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn recordings_are_consistent_bounded_and_end_empty() {
        let spec = small(50_001, 3);
        let events: Vec<_> = synthesize(&spec).collect();
        assert!(events.len() as u64 + 2 >= spec.events);
        let device = RecordedDevice::new(
            H100_CAPACITY,
            cachalot_core::config::AllocatorConfig::default(),
        );
        let p = plan(&events, &device).expect("consistent");
        assert!(p.inferred.is_empty());
        let (mut live, mut peak) = (0i64, 0i64);
        for e in &events {
            match e.action {
                Action::Alloc => live += e.size as i64,
                Action::FreeCompleted => live -= e.size as i64,
                _ => {}
            }
            peak = peak.max(live);
            assert!(e.size >= spec.min_size && e.size <= spec.max_size);
        }
        assert!(peak as u64 <= spec.max_live, "{peak}");
        assert!(peak as u64 > spec.max_live / 2, "{peak}");
        assert_eq!(live, 0, "everything freed by the end");
    }
}
