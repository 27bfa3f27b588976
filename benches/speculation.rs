//! Speculative decoding on the built-in demo model: decode tok/s of plain
//! greedy decoding beside prompt lookup at several draft lengths and a
//! draft model (the model drafting for itself: every draft kept, so the
//! row shows what checking drafts in one pass can give at best, drafting
//! cost included), on prompts that repeat themselves, with the share of
//! drafts kept and the tokens each step gave. Every run generates the
//! same text; the bench checks that it does.
//!
//! `cargo bench --bench speculation` (CLEAVE_BENCH_DEVICE picks the
//! adapter, CLEAVE_BENCH_MODEL another model directory). Each figure is
//! the median of several runs after a warm-up.

#[path = "support/device.rs"]
mod device;

#[path = "support/timing.rs"]
#[allow(dead_code)]
mod timing;

use std::ops::ControlFlow;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_engine::{generate, DraftModel, Drafter, Limits, PrefillChunk, PromptLookup, SamplerConfig, Speculation};
use cleave_models::ModelDir;
use cleave_nn::{Placed, Session};
use cleave_shaders::cubecl::prelude::*;

const RUNS: usize = 3;
const NEW_TOKENS: usize = 128;
const CONTEXT: usize = 512;
const PROMPTS: [&str; 2] = [
    "A journey of a thousand miles begins with a single step. A journey of a thousand miles begins with a \
     single step. A journey of a thousand miles begins with a single step. A journey",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the",
];

/// How a row drafts.
#[derive(Clone, Copy)]
enum Drafting {
    None,
    Lookup(usize),
    SelfDraft(usize),
}

const DRAFTINGS: [Drafting; 6] = [
    Drafting::None,
    Drafting::Lookup(4),
    Drafting::Lookup(8),
    Drafting::Lookup(16),
    Drafting::SelfDraft(4),
    Drafting::SelfDraft(8),
];

impl Drafting {
    fn label(self) -> String {
        match self {
            Drafting::None => "plain".into(),
            Drafting::Lookup(n) => format!("prompt lookup, {n}"),
            Drafting::SelfDraft(n) => format!("draft model (itself), {n}"),
        }
    }
}

struct Bench<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
}

/// Per prompt and drafting: (decode tok/s, share of drafts kept, tokens a
/// step, the ids generated).
type Row = (f64, Option<f64>, f64, Vec<u32>);

impl RuntimeTask for Bench<'_> {
    type Output = Vec<Vec<Row>>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let plan = || {
            let inventory = self.model.inventory(CONTEXT);
            cleave_plan::plan(
                &inventory,
                &cleave_nn::plan_members(self.group),
                None,
                &Default::default(),
            )
            .expect("plan")
        };
        let load = |clients: Vec<ComputeClient<R>>| {
            self.model
                .load(Placed::group(clients, self.group), plan(), &mut |_| {})
                .expect("load")
        };
        let (model, draft) = (load(clients.clone()), load(clients));
        let limits = Limits {
            max_new_tokens: NEW_TOKENS,
            ignore_eos: true,
        };
        PROMPTS
            .iter()
            .map(|prompt| {
                let ids = self.model.tokenizer.encode(prompt).expect("tokenize");
                DRAFTINGS
                    .iter()
                    .map(|&drafting| {
                        // The first run compiles what the others time.
                        let runs: Vec<Row> = (0..=RUNS)
                            .map(|_| {
                                let mut session = Session::new(model.as_ref(), CONTEXT).unwrap();
                                let mut draft_session = Session::new(draft.as_ref(), CONTEXT).unwrap();
                                let mut lookup = PromptLookup::default();
                                let banned = limits.banned(&self.model.tokenizer);
                                let mut self_draft = DraftModel::new(&mut draft_session, banned);
                                let (drafter, max_drafts): (Option<&mut dyn Drafter>, usize) = match drafting {
                                    Drafting::None => (None, 0),
                                    Drafting::Lookup(n) => (Some(&mut lookup), n),
                                    Drafting::SelfDraft(n) => (Some(&mut self_draft), n),
                                };
                                let speculation = drafter.map(|drafter| Speculation { drafter, max_drafts });
                                let out = generate(
                                    &mut session,
                                    &self.model.tokenizer,
                                    SamplerConfig::greedy(),
                                    &ids,
                                    limits,
                                    PrefillChunk::default(),
                                    false,
                                    speculation,
                                    None,
                                    &mut |_| ControlFlow::Continue(()),
                                )
                                .expect("generate");
                                let stats = out.speculation.unwrap_or_default();
                                // The first token comes from the prompt's pass.
                                let steps = (out.new_ids.len() - 1) as f64;
                                let passes = steps - stats.accepted as f64;
                                (
                                    out.timings.generation_tokens_per_second(),
                                    stats.acceptance_rate(),
                                    steps / passes,
                                    out.new_ids,
                                )
                            })
                            .skip(1)
                            .collect();
                        let speed = timing::median(runs.iter().map(|r| r.0).collect());
                        let (_, kept, per_step, ids) = runs.into_iter().next().expect("a run");
                        (speed, kept, per_step, ids)
                    })
                    .collect()
            })
            .collect()
    }
}

fn main() {
    let dir = timing::bench_model_dir();
    let model = ModelDir::open(&dir).expect("model");
    let device = device::bench_device();
    let group = device::open_alone(&device);
    println!("{} on {device}, {NEW_TOKENS} greedy tokens", dir.display());
    println!("| prompt | drafting, most drafts a step | decode tok/s | vs plain | drafts kept | tokens a step |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let rows = group.run(Bench {
        model: &model,
        group: &group,
    });
    for (p, prompt_rows) in rows.iter().enumerate() {
        let (plain, _, _, plain_ids) = &prompt_rows[0];
        for ((speed, kept, per_step, ids), drafting) in prompt_rows.iter().zip(DRAFTINGS) {
            let label = drafting.label();
            assert_eq!(ids, plain_ids, "prompt {p}, {label}: speculation changed the text");
            let kept = kept.map_or("-".into(), |k| format!("{:.0}%", k * 100.0));
            println!(
                "| {} | {label} | {speed:.1} | {:.2}x | {kept} | {per_step:.2} |",
                p + 1,
                speed / plain
            );
        }
    }
}
