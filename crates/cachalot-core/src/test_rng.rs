//! A seeded xorshift generator for the unit tests' randomized checks (same
//! seed, same draws, on every machine).

/// The generator; its state is the last draw.
pub(crate) struct XorShift(pub(crate) u64);

impl XorShift {
    /// The next draw.
    pub(crate) fn draw(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}
