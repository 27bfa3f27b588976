//! Where a decode step's time goes (`cleave run --profile`). The decode
//! steps of a generation are taken in three parts: the first is left out
//! (it compiles kernels), the middle ones are counted as they run
//! (launches, allocations, reads and writes per token, and the host's time
//! apart from waiting on reads), and those of the last few tokens have each
//! launch timed on the device, which makes the host wait after every launch
//! and so would spoil the counted part's times.

use std::time::{Duration, Instant};

use cleave_shaders::profile::{self, Counters, KernelTime};

/// The most decode steps whose kernels are timed one by one.
const TIMED_STEPS: usize = 8;

/// What a profile of a generation's decode steps found. A step takes one
/// token, or several where it checked drafts (speculative decoding);
/// every figure is given per token taken.
#[derive(Clone, Debug, Default)]
pub struct DecodeProfile {
    /// Decode steps counted, the tokens they took, and their summed wall
    /// time.
    pub steps: usize,
    pub tokens: usize,
    pub wall: Duration,
    /// Their launches, allocations, reads and writes, summed.
    pub counters: Counters,
    /// Decode steps whose launches were each timed on the device, and the
    /// tokens they took.
    pub timed_steps: usize,
    pub timed_tokens: usize,
    /// Per kernel, over the timed steps, longest first.
    pub kernels: Vec<KernelTime>,
}

impl DecodeProfile {
    /// Wall time of a counted token.
    pub fn wall_per_token(&self) -> Duration {
        self.wall / self.tokens.max(1) as u32
    }

    /// Host time of a counted token apart from waiting on reads: the time
    /// it takes to issue its share of the step's work.
    pub fn host_per_token(&self) -> Duration {
        self.wall.saturating_sub(self.counters.read_wait) / self.tokens.max(1) as u32
    }

    /// `count` of the counted steps as a mean per token they took.
    pub fn per_token(&self, count: u64) -> f64 {
        count as f64 / self.tokens.max(1) as f64
    }

    /// Tokens a counted step took.
    pub fn tokens_per_step(&self) -> f64 {
        self.tokens as f64 / self.steps.max(1) as f64
    }
}

/// Takes a profile of the decode steps of a generation that plans
/// `planned` of them, one token each (fewer where steps take several).
pub(crate) struct Profiler {
    /// Steps are timed once at most this many tokens are left to take.
    timed_from_remaining: usize,
    /// Whether the step under way is counted or timed.
    step: Option<StepKind>,
    profile: DecodeProfile,
}

enum StepKind {
    Counted(Instant, Counters),
    Timed,
}

impl Profiler {
    pub(crate) fn new(planned: usize) -> Profiler {
        // Step 0 compiles; of the rest, up to a quarter (at most
        // TIMED_STEPS, at least one) are timed.
        let rest = planned.saturating_sub(1);
        Profiler {
            timed_from_remaining: (rest / 4).clamp(1, TIMED_STEPS),
            step: None,
            profile: DecodeProfile::default(),
        }
    }

    /// Before step `step`, with `remaining` tokens still to take.
    pub(crate) fn before_step(&mut self, step: usize, remaining: usize) {
        if step == 0 {
            return;
        }
        if remaining > self.timed_from_remaining {
            self.step = Some(StepKind::Counted(Instant::now(), Counters::now()));
            return;
        }
        if self.profile.timed_steps == 0 {
            profile::time_kernels(true);
        }
        self.step = Some(StepKind::Timed);
    }

    /// After a step that took `tokens` tokens.
    pub(crate) fn after_step(&mut self, tokens: usize) {
        let p = &mut self.profile;
        match self.step.take() {
            None => {}
            Some(StepKind::Timed) => {
                p.timed_steps += 1;
                p.timed_tokens += tokens;
            }
            Some(StepKind::Counted(start, counters)) => {
                p.steps += 1;
                p.tokens += tokens;
                p.wall += start.elapsed();
                p.counters = p.counters + Counters::now().since(counters);
            }
        }
    }

    pub(crate) fn finish(mut self) -> DecodeProfile {
        if self.profile.timed_steps > 0 {
            self.profile.kernels = profile::kernel_times();
        }
        profile::time_kernels(false);
        self.profile
    }
}
