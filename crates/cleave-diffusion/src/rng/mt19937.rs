//! The 32-bit Mersenne Twister exactly as `at::mt19937` (`ATen/core/MT19937RNGEngine.h`) seeds and
//! steps it, so that the raw stream equals torch's CPU generator.

/// Degree of recurrence.
const STATE_LEN: usize = 624;
/// Offset of the middle word used by the twist.
const SHIFT_LEN: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

#[derive(Clone)]
pub(super) struct Mt19937 {
    state: [u32; STATE_LEN],
    /// Index of the next word of `state` to temper and return; `STATE_LEN` means "twist first".
    next: usize,
}

impl Mt19937 {
    /// Seeds like `at::mt19937::init_with_uint32`: torch keeps only the low 32 bits of the seed.
    pub(super) fn new(seed: u64) -> Self {
        let mut state = [0u32; STATE_LEN];
        state[0] = seed as u32;
        for j in 1..STATE_LEN {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(j as u32);
        }
        // torch starts with `left_ = 1`, so its first draw regenerates the whole state.
        Self { state, next: STATE_LEN }
    }

    /// One tempered output: torch's `CPUGeneratorImpl::random()`.
    pub(super) fn next_u32(&mut self) -> u32 {
        if self.next == STATE_LEN {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// torch's `random64()`: the first draw is the high half.
    pub(super) fn next_u64(&mut self) -> u64 {
        let high = u64::from(self.next_u32());
        let low = u64::from(self.next_u32());
        (high << 32) | low
    }

    fn twist(&mut self) {
        for j in 0..STATE_LEN {
            let mixed = (self.state[j] & UPPER_MASK) | (self.state[(j + 1) % STATE_LEN] & LOWER_MASK);
            let odd = if mixed & 1 == 1 { MATRIX_A } else { 0 };
            self.state[j] = self.state[(j + SHIFT_LEN) % STATE_LEN] ^ (mixed >> 1) ^ odd;
        }
        self.next = 0;
    }
}
