//! `cleave bench`: a language model's prompt and generation speed, as
//! llama.cpp's llama-bench measures them. `pp512` reads a 512-token prompt
//! in one pass; `tg128` generates 128 tokens one at a time after a
//! one-token prompt. Tokens are fixed ids, each next one picked on the
//! device as `cleave run` picks it. Each test runs once untimed first,
//! which compiles every kernel it launches (cubek compiles its matmuls
//! for each product shape), then `-r` times: the mean tok/s and its
//! standard deviation.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::LoraMode;
use cleave_models::ModelDir;
use cleave_nn::{CausalLm, CausalModel, PickRule, Placement, Session};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::profile::{self, Counters, KernelTime};
use serde_json::json;

use super::profile::{device_time, kernel_table, kernels_json, us};

use crate::output::outln;
use crate::{parse, setup, Format, ModelArgs};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens read in one pass (the `pp` test; 0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    n_prompt: usize,
    /// Tokens generated one at a time (the `tg` test; 0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    n_gen: usize,
    /// Timed runs of each test, after one untimed run.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000), allow_negative_numbers = true)]
    repetitions: u32,
    /// `text`: a table; `json`: one object per test.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
    /// Report where a prompt pass's time goes: after the `pp` test, one
    /// more pass counted (launches, device allocations, reads, writes, the
    /// host's time issuing it, each device's memory after it) and one with
    /// each launch timed on the device (on stderr, or the `pp` object's
    /// `profile` in json).
    #[arg(long)]
    profile: bool,
}

/// What a test times.
#[derive(Clone, Copy)]
enum Test {
    /// One pass over a prompt of this many tokens.
    Prompt(usize),
    /// This many tokens generated one at a time.
    Generate(usize),
}

impl Test {
    /// llama-bench's name for it: `pp512`, `tg128`.
    fn name(self) -> String {
        match self {
            Test::Prompt(n) => format!("pp{n}"),
            Test::Generate(n) => format!("tg{n}"),
        }
    }

    fn tokens(self) -> usize {
        match self {
            Test::Prompt(n) | Test::Generate(n) => n,
        }
    }
}

/// One test and each timed run's tok/s, and a prompt test's profile.
struct Measured {
    test: Test,
    samples: Vec<f64>,
    profile: Option<PassProfile>,
}

/// Where one prompt pass's time went: a pass counted, then a pass with
/// each launch timed on the device (which makes the host wait after every
/// launch, and so would spoil the counted pass's times); and each device's
/// memory after the counted pass.
struct PassProfile {
    wall: Duration,
    counters: Counters,
    kernels: Vec<KernelTime>,
    memory: Vec<DeviceMemory>,
}

/// A device's memory once a prompt pass has run, its context still held:
/// what cleave's buffers take, what cubecl holds for them (its pools' whole
/// pages), and what the plan counts.
struct DeviceMemory {
    name: String,
    in_use: u64,
    held: u64,
    planned: u64,
}

impl DeviceMemory {
    fn of_each<R: Runtime>(placement: &Placement<R>) -> Result<Vec<DeviceMemory>> {
        let planned = placement.plan().devices.iter().map(|d| d.total_bytes());
        placement
            .devices()
            .iter()
            .zip(planned)
            .map(|(device, planned)| {
                let (in_use, held) = device.memory()?;
                Ok(DeviceMemory {
                    name: device.name.clone(),
                    in_use,
                    held,
                    planned,
                })
            })
            .collect()
    }

    fn text(&self) -> String {
        let bytes = cleave_plan::format_bytes;
        format!(
            "{}: {} in use, {} held, {} planned",
            self.name,
            bytes(self.in_use),
            bytes(self.held),
            bytes(self.planned)
        )
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "device": self.name,
            "in_use_bytes": self.in_use,
            "held_bytes": self.held,
            "planned_bytes": self.planned,
        })
    }
}

impl PassProfile {
    fn take<R: Runtime>(
        model: &dyn CausalModel<R>,
        context: usize,
        ids: &[u32],
        pick: &[PickRule],
    ) -> Result<PassProfile> {
        let mut session = Session::new(model, context)?;
        let before = Counters::now();
        let start = Instant::now();
        session.forward_pick(ids, pick)?;
        let wall = start.elapsed();
        let counters = Counters::now().since(before);
        let memory = DeviceMemory::of_each(model.placement())?;
        drop(session);
        let mut session = Session::new(model, context)?;
        profile::time_kernels(true);
        let timed = session.forward_pick(ids, pick);
        let kernels = profile::kernel_times();
        profile::time_kernels(false);
        timed?;
        Ok(PassProfile {
            wall,
            counters,
            kernels,
            memory,
        })
    }

    /// The host's time issuing the pass: its wall time but for waiting on
    /// reads.
    fn host(&self) -> Duration {
        self.wall.saturating_sub(self.counters.read_wait)
    }

    fn text(&self, tokens: usize) -> String {
        let c = &self.counters;
        let bytes = cleave_plan::format_bytes;
        format!(
            "prompt pass profile ({tokens} tokens): {:.0} us wall, {:.0} us host issuing it, {:.0} us waiting on reads\n\
             {} launches, {} device allocations ({}), {} reads ({}), {} writes ({})\n\
             device memory after it: {}\n{}",
            us(self.wall),
            us(self.host()),
            us(c.read_wait),
            c.launches,
            c.allocations,
            bytes(c.allocated_bytes),
            c.reads,
            bytes(c.read_bytes),
            c.writes,
            bytes(c.write_bytes),
            self.memory.iter().map(DeviceMemory::text).collect::<Vec<_>>().join("; "),
            kernel_table(&self.kernels, 1, "pass"),
        )
    }

    fn json(&self) -> serde_json::Value {
        let c = &self.counters;
        json!({
            "wall_us": us(self.wall),
            "host_us": us(self.host()),
            "read_wait_us": us(c.read_wait),
            "launches": c.launches,
            "allocations": c.allocations,
            "allocated_bytes": c.allocated_bytes,
            "reads": c.reads,
            "read_bytes": c.read_bytes,
            "writes": c.writes,
            "write_bytes": c.write_bytes,
            "device_us": us(device_time(&self.kernels, 1)),
            "kernels": kernels_json(&self.kernels, 1, "pass"),
            "memory": self.memory.iter().map(DeviceMemory::json).collect::<Vec<_>>(),
        })
    }
}

impl Measured {
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len() as f64
    }

    /// The sample standard deviation (0 for one run).
    fn deviation(&self) -> f64 {
        let n = self.samples.len();
        if n < 2 {
            return 0.0;
        }
        let mean = self.mean();
        (self.samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

/// The tests, in order.
fn tests(args: &BenchArgs) -> Vec<Test> {
    let mut tests = Vec::new();
    if args.n_prompt > 0 {
        tests.push(Test::Prompt(args.n_prompt));
    }
    if args.n_gen > 0 {
        tests.push(Test::Generate(args.n_gen));
    }
    tests
}

struct Task<'a> {
    args: &'a BenchArgs,
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    plan: Plan,
    context: usize,
}

impl RuntimeTask for Task<'_> {
    type Output = Result<Vec<Measured>>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let (model, _) = setup::load(clients, self.group, self.plan, self.model, (&[], LoraMode::Auto))?;
        let vocab = model.vocab_size() as u32;
        let ids: Vec<u32> = (0..self.args.n_prompt.max(1) as u32)
            .map(|i| (i * 7 + 3) % vocab)
            .collect();
        let greedy = PickRule::greedy(Vec::new());
        let mut measured = Vec::new();
        for test in tests(self.args) {
            let mut samples = Vec::new();
            for run in 0..=self.args.repetitions {
                let mut session = Session::new(model.as_ref(), self.context)?;
                let pick = std::slice::from_ref(&greedy);
                let seconds = match test {
                    Test::Prompt(_) => {
                        let start = Instant::now();
                        session.forward_pick(&ids, pick)?;
                        start.elapsed().as_secs_f64()
                    }
                    Test::Generate(tokens) => {
                        let mut next = session.forward_pick(&ids[..1], pick)?;
                        let start = Instant::now();
                        for _ in 0..tokens {
                            next = session.forward_pick(&next, pick)?;
                        }
                        start.elapsed().as_secs_f64()
                    }
                };
                if run > 0 {
                    samples.push(test.tokens() as f64 / seconds);
                }
            }
            let profile = match test {
                Test::Prompt(_) if self.args.profile => Some(PassProfile::take(
                    model.as_ref(),
                    self.context,
                    &ids,
                    std::slice::from_ref(&greedy),
                )?),
                _ => None,
            };
            measured.push(Measured { test, samples, profile });
        }
        Ok(measured)
    }
}

pub fn run(mut args: BenchArgs) -> Result<()> {
    if args.n_prompt == 0 && args.n_gen == 0 {
        bail!("-p/--n-prompt and -n/--n-gen are both 0: nothing to measure");
    }
    setup::locate(&mut args.model.model, &args.model.source)?;
    // Room for the longer test, unless -c asks for more.
    let needed = args.n_prompt.max(args.n_gen.saturating_add(1));
    let model = setup::open_model(&args.model)?;
    if needed > model.max_positions() {
        bail!(
            "the tests need {needed} positions, past the {} {} was trained for: lower -p/--n-prompt or -n/--n-gen",
            model.max_positions(),
            args.model.model.display()
        );
    }
    match args.model.ctx_size.filter(|&c| c > 0) {
        Some(c) if c < needed => {
            bail!("the tests need {needed} positions, but -c/--ctx-size holds {c}: raise it or leave it out")
        }
        Some(_) => {}
        None => args.model.ctx_size = Some(needed),
    }
    let (context, plan, group) = setup::place_llm(&args.model, &model)?;
    let devices = group.names().join("&");
    let precisions = setup::product_precisions(&group);
    let (precision, products) = precisions
        .first()
        .map_or(("exact", ""), |(_, p)| (p.precision.name(), p.how.as_str()));
    let measured = group.run(Task {
        args: &args,
        model: &model,
        group: &group,
        plan,
        context,
    })?;
    let name = args.model.model.display().to_string();
    let size = cleave_plan::format_bytes(model.checkpoint.total_bytes());
    if let Format::Json = args.format {
        for m in &measured {
            let mut report = json!({
                "model": name,
                "weights_bytes": model.checkpoint.total_bytes(),
                "devices": group.names(),
                "precision": precision,
                "products": products,
                "test": m.test.name(),
                "tokens": m.test.tokens(),
                "samples_tokens_per_second": m.samples,
                "mean_tokens_per_second": m.mean(),
                "stddev_tokens_per_second": m.deviation(),
            });
            if let Some(profile) = &m.profile {
                report["profile"] = profile.json();
            }
            outln!("{report}")?;
        }
        return Ok(());
    }
    outln!("| model | weights | devices | precision | test | tok/s |")?;
    outln!("| --- | ---: | --- | --- | --- | ---: |")?;
    for m in &measured {
        outln!(
            "| {name} | {size} | {devices} | {precision} | {} | {:.2} ± {:.2} |",
            m.test.name(),
            m.mean(),
            m.deviation()
        )?;
    }
    for m in &measured {
        if let Some(profile) = &m.profile {
            eprint!("{}", profile.text(m.test.tokens()));
        }
    }
    Ok(())
}
