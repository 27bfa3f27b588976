//! `cleave bench`: a language model's prompt and generation speed, as
//! llama.cpp's llama-bench measures them. `pp512` reads a 512-token prompt
//! in one pass; `tg128` generates 128 tokens one at a time after a
//! one-token prompt. Tokens are fixed ids, each next one picked on the
//! device as `cleave run` picks it. Each test runs once untimed first,
//! which compiles every kernel it launches (cubek compiles its matmuls
//! for each product shape), then `-r` times: the mean tok/s and its
//! standard deviation.

use std::time::Instant;

use anyhow::{bail, Result};
use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::LoraMode;
use cleave_models::ModelDir;
use cleave_nn::{CausalLm, PickRule, Session};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::SamplerConfig;
use serde_json::json;

use crate::output::outln;
use crate::{setup, Format, ModelArgs};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens read in one pass (the `pp` test; 0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens generated one at a time (the `tg` test; 0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Timed runs of each test, after one untimed run.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    repetitions: u32,
    /// `text`: a table; `json`: one object per test.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
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

/// One test and each timed run's tok/s.
struct Measured {
    test: Test,
    samples: Vec<f64>,
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
        let greedy = PickRule {
            banned: Vec::new(),
            sampler: SamplerConfig::greedy(),
            drawn: 0,
            window: Vec::new(),
        };
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
            measured.push(Measured { test, samples });
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
    args.model.ctx_size = Some(args.model.ctx_size.unwrap_or(0).max(needed));
    let (context, plan, specs) = setup::plan_llm(&args.model, &model, 1)?;
    let group = cleave_device::open_group(&specs)?;
    setup::announce(&plan);
    let devices = group.names().join("&");
    let precision = setup::product_precisions(&group)
        .first()
        .map_or("exact", |(_, p)| p.precision.name());
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
            let report = json!({
                "model": name,
                "weights_bytes": model.checkpoint.total_bytes(),
                "devices": group.names(),
                "precision": precision,
                "test": m.test.name(),
                "tokens": m.test.tokens(),
                "samples_tokens_per_second": m.samples,
                "mean_tokens_per_second": m.mean(),
                "stddev_tokens_per_second": m.deviation(),
            });
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
    Ok(())
}
