//! Where a decode step's time goes (`cleave run --profile`). The decode
//! steps of a generation are taken in three parts: the first is left out
//! (it compiles kernels), the middle ones are counted as they run
//! (launches, allocations, reads and writes per token, and the host's time
//! apart from waiting on reads), and the last few have each launch timed on
//! the device, which makes the host wait after every launch and so would
//! spoil the counted part's times.

use std::time::{Duration, Instant};

use cleave_shaders::profile::{self, Counters, KernelTime};

/// The most decode steps whose kernels are timed one by one.
const TIMED_STEPS: usize = 8;

/// What a profile of a generation's decode steps found.
#[derive(Clone, Debug, Default)]
pub struct DecodeProfile {
    /// Decode steps counted, and their summed wall time.
    pub steps: usize,
    pub wall: Duration,
    /// Their launches, allocations, reads and writes, summed.
    pub counters: Counters,
    /// Decode steps whose launches were each timed on the device.
    pub timed_steps: usize,
    /// Per kernel, over the timed steps, longest first.
    pub kernels: Vec<KernelTime>,
}

impl DecodeProfile {
    /// Wall time of a counted step.
    pub fn wall_per_step(&self) -> Duration {
        self.wall / self.steps.max(1) as u32
    }

    /// Host time of a counted step apart from waiting on reads: the time
    /// it takes to issue the step's work.
    pub fn host_per_step(&self) -> Duration {
        self.wall.saturating_sub(self.counters.read_wait) / self.steps.max(1) as u32
    }

    /// `count` of the counted steps as a mean per step.
    pub fn per_step(&self, count: u64) -> f64 {
        count as f64 / self.steps.max(1) as f64
    }

    /// Device time of a timed step, all kernels summed.
    pub fn device_per_step(&self) -> Duration {
        self.kernels.iter().map(|k| k.time).sum::<Duration>() / self.timed_steps.max(1) as u32
    }
}

/// Takes a profile of decode steps 0.. of a generation that plans
/// `planned` of them.
pub(crate) struct Profiler {
    /// The first step whose launches are timed.
    timed_from: usize,
    started: Option<(Instant, Counters)>,
    profile: DecodeProfile,
}

impl Profiler {
    pub(crate) fn new(planned: usize) -> Profiler {
        // Step 0 compiles; of the rest, up to a quarter (at most
        // TIMED_STEPS, at least one) are timed.
        let rest = planned.saturating_sub(1);
        let timed = (rest / 4).clamp(1, TIMED_STEPS);
        Profiler {
            timed_from: planned.saturating_sub(timed).max(1),
            started: None,
            profile: DecodeProfile::default(),
        }
    }

    pub(crate) fn before_step(&mut self, step: usize) {
        if step == self.timed_from {
            profile::time_kernels(true);
        }
        if step >= 1 && step < self.timed_from {
            self.started = Some((Instant::now(), Counters::now()));
        }
    }

    pub(crate) fn after_step(&mut self, step: usize) {
        if step >= self.timed_from {
            self.profile.timed_steps += 1;
        } else if let Some((start, counters)) = self.started.take() {
            let p = &mut self.profile;
            p.steps += 1;
            p.wall += start.elapsed();
            p.counters = p.counters + Counters::now().since(counters);
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
