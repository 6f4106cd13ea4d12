//! A seeded generator for the integration tests' random traffic and the GPU
//! bench's threaded pattern (`benches/gpu`, whose C++ twin in
//! scripts/gpu/native_alloc.cpp draws the same numbers): the same seed gives
//! the same draws on every machine, with no dependency.

/// Knuth's MMIX linear congruential generator; its state is the last step.
pub struct Lcg(pub u64);

impl Lcg {
    /// The next draw: the state's high 31 bits (its low bits repeat with
    /// short periods).
    pub fn draw(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A draw in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.draw() % n
    }
}
