//! A decode step that picks its tokens on the device, greedily or
//! sampling, with repetition penalties or without: the same ids as the
//! host's sampler gives from the same logits, for one sequence and for
//! several decoded together (each by its own rule), with end-of-sequence
//! ids banned; and, once warm, a step allocates nothing on the device,
//! writes nothing to it, and reads back one id (4 bytes) per sequence. A
//! pass over drafted tokens picks after each as the host would. Steps that
//! report log-probabilities and hold some sequences to a grammar's mask
//! pick as the host does too, the reports equal to the host's within
//! 1e-4, with one upload a step (the masks) and one read more (the
//! reports).

use std::sync::Arc;

use crate::common;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_engine::{Penalties, Sampler, SamplerConfig};
use cleave_models::ModelDir;
use cleave_nn::{Allowed, AllowedIds, CausalModel, Logits, PickRule, TokenLogprobs};
use cleave_plan::SplitMode;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::profile::Counters;
use cleave_shaders::{with_kernels, Kernels};
use common::{fixture, load_split, reference, shared_model};

const CONTEXT: usize = 96;
const STEPS: usize = 16;
/// Steps before a decode step's buffers are all made: the first makes the
/// workspace's and the picks', the second its rows' on the device.
const WARM_UP: usize = 2;

/// Top tokens a steered step reports.
const TOP: usize = 5;

/// A grammar's mask that stays put: every id but those of the form 3k + 1.
struct Fixed(Arc<[u32]>);

impl AllowedIds for Fixed {
    fn words(&self) -> cleave_nn::Result<Arc<[u32]>> {
        Ok(self.0.clone())
    }
}

fn fixed_mask(vocab: usize) -> Allowed {
    let mut words = vec![0u32; vocab.div_ceil(32)];
    for id in (0..vocab).filter(|id| id % 3 != 1) {
        words[id / 32] |= 1 << (id % 32);
    }
    Allowed::new(Arc::new(Fixed(words.into())))
}

/// Sequence `i`'s rule: its sampler's, `banned` ids never, and where
/// `steering` holds a mask, reporting its top tokens and, every other
/// sequence, held to the mask.
fn rule(sampler: &Sampler, banned: &[u32], i: usize, steering: Option<&Allowed>) -> PickRule {
    let mut rule = sampler.rule(banned.to_vec());
    if let Some(mask) = steering {
        rule.logprobs = Some(TOP);
        rule.allowed = i.is_multiple_of(2).then(|| mask.clone());
    }
    rule
}

/// The host's picks from each sequence's logits, by each sequence's own
/// rule (see [`rule`]), and the log-probabilities a steered step reports.
fn host_picks(
    logits: Vec<Vec<f32>>,
    banned: &[u32],
    samplers: &mut [Sampler],
    steering: Option<&Allowed>,
) -> (Vec<u32>, Vec<TokenLogprobs>) {
    logits
        .into_iter()
        .zip(samplers)
        .enumerate()
        .map(|(i, (logits, sampler))| {
            let rule = rule(sampler, banned, i, steering);
            let id = rule.pick_on_host(&logits).expect("a token: the logits hold no NaN");
            sampler.accept(id);
            (id, TokenLogprobs::of(&logits, id, TOP))
        })
        .unzip()
}

/// The device's reports against the host's.
fn assert_reports_match(got: &[Option<TokenLogprobs>], want: &[TokenLogprobs], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (got, want) in got.iter().zip(want) {
        let got = got.as_ref().unwrap_or_else(|| panic!("{what}: no report"));
        let ids = |t: &TokenLogprobs| -> Vec<u32> { t.top.iter().map(|&(id, _)| id).collect() };
        assert_eq!((got.id, ids(got)), (want.id, ids(want)), "{what}");
        let close = |a: f32, b: f32| (a - b).abs() < 1e-4;
        assert!(close(got.logprob, want.logprob), "{what}: {got:?} vs {want:?}");
        assert!(
            got.top.iter().zip(&want.top).all(|(g, w)| close(g.1, w.1)),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

struct Steps<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    /// Prompts decoded together, each in a slot of its own, each by its
    /// own sampler.
    prompts: Vec<(Vec<u32>, SamplerConfig)>,
    /// Whether the steps report log-probabilities and hold every other
    /// sequence to a mask (see [`rule`]).
    steered: bool,
}

impl RuntimeTask for Steps<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let llama = load_split(clients, self.group, self.model, CONTEXT, None, SplitMode::Layer).expect("load");
        let eos = self.model.tokenizer.eos_ids();
        let n = self.prompts.len();
        let mask = fixed_mask(llama.vocab_size());
        let steering = self.steered.then_some(&mask);
        // The same sequences on the device's picks and on the host's, a
        // spare slot first so that no sequence starts the cache.
        let (mut device, mut host) = (context(llama.as_ref(), n), context(llama.as_ref(), n));
        let samplers = || -> Vec<Sampler> { self.prompts.iter().map(|(p, c)| Sampler::new(*c, p)).collect() };
        let (mut on_device, mut on_host) = (samplers(), samplers());
        let mut ids: Vec<u32> = Vec::new();
        for (i, (prompt, _)) in self.prompts.iter().enumerate() {
            let rule = rule(&on_device[i], eos, i, steering);
            assert!(rule.sampler.fits_device(), "the device samples by {rule:?}");
            let id = llama.forward_pick(&mut device, i + 1, prompt, &[rule]).unwrap()[0];
            on_device[i].accept(id);
            let logits = llama.forward_slot(&mut host, i + 1, prompt, Logits::Last).unwrap();
            let (want, _) = host_picks(vec![logits], eos, &mut on_host[i..i + 1], steering.filter(|_| i == 0));
            assert_eq!(id, want[0], "first token of prompt {i}");
            ids.push(id);
        }
        for step in 0..STEPS {
            let steps: Vec<(usize, u32)> = ids.iter().enumerate().map(|(i, &id)| (i + 1, id)).collect();
            let rules: Vec<_> = on_device
                .iter()
                .enumerate()
                .map(|(i, s)| rule(s, eos, i, steering))
                .collect();
            let before = Counters::now();
            let picked = llama.decode_pick(&mut device, &steps, &rules).unwrap();
            let counted = Counters::now().since(before);
            for (sampler, &id) in on_device.iter_mut().zip(&picked) {
                sampler.accept(id);
            }
            let (want, reports) = host_picks(llama.decode(&mut host, &steps).unwrap(), eos, &mut on_host, steering);
            let what = format!("step {step} of {n} sequences: {counted:?}");
            assert_eq!(picked, want, "{what}");
            // A steered step uploads its masks and reads its reports: each
            // a row's normalizer, pick and top tokens (ids and values).
            let (uploads, reads, read_bytes) = match self.steered {
                true => (1, 2, 4 * n as u64 * (1 + 2 + 2 * TOP as u64)),
                false => (0, 1, 4 * n as u64),
            };
            if self.steered {
                assert_reports_match(device.logprobs(), &reports, &what);
            }
            if step >= WARM_UP {
                assert_eq!(counted.allocations, uploads, "{what}");
                assert_eq!(counted.writes, uploads, "{what}");
                assert_eq!(counted.reads, reads, "{what}");
                assert_eq!(counted.read_bytes, read_bytes, "{what}");
            }
            ids = picked;
        }
        // A speculative step: drafts (here the prompt's first ids) go
        // through in one pass, with a pick after each by the rule its
        // sequence would have there.
        let vocab = llama.vocab_size();
        for (i, sampler) in on_device.iter().enumerate() {
            let drafts = &self.prompts[i].0[..3];
            let fed: Vec<u32> = std::iter::once(ids[i]).chain(drafts.iter().copied()).collect();
            let mut rules = vec![rule(sampler, eos, i, steering)];
            for &draft in drafts {
                rules.push(rules[rules.len() - 1].after(draft));
            }
            let picked = llama.forward_pick(&mut device, i + 1, &fed, &rules).unwrap();
            let logits = llama.forward_slot(&mut host, i + 1, &fed, Logits::All).unwrap();
            let want: Vec<u32> = logits
                .chunks(vocab)
                .zip(&rules)
                .map(|(row, rule)| rule.pick_on_host(row).expect("a token"))
                .collect();
            assert_eq!(picked, want, "a pass checking drafts, sequence {i}");
        }
    }
}

fn context<R: Runtime>(llama: &dyn CausalModel<R>, sequences: usize) -> cleave_nn::Context {
    llama.new_context_slots(CONTEXT, sequences + 1).unwrap()
}

/// No penalties (llama.cpp's default window, off).
const OFF: Penalties = Penalties {
    repeat: 1.0,
    frequency: 0.0,
    presence: 0.0,
    last_n: 64,
};

/// Greedy decoding, and sampling settings that cut at top-k, at top-p
/// inside it, and at neither; greedy and sampled decoding with penalties
/// over a window the prompt fills and one it does not.
const SAMPLERS: [SamplerConfig; 6] = [
    SamplerConfig {
        temperature: 0.0,
        top_k: 40,
        top_p: 0.95,
        seed: 0,
        penalties: OFF,
    },
    SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        seed: 11,
        penalties: OFF,
    },
    SamplerConfig {
        temperature: 1.5,
        top_k: 5,
        top_p: 1.0,
        seed: 12,
        penalties: OFF,
    },
    SamplerConfig {
        temperature: 1.0,
        top_k: 256,
        top_p: 0.5,
        seed: 13,
        penalties: OFF,
    },
    SamplerConfig {
        temperature: 0.0,
        top_k: 40,
        top_p: 1.0,
        seed: 0,
        penalties: Penalties {
            repeat: 1.3,
            frequency: 0.2,
            presence: 0.5,
            last_n: 4,
        },
    },
    SamplerConfig {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        seed: 14,
        penalties: Penalties {
            repeat: 1.1,
            frequency: 0.3,
            presence: -0.2,
            last_n: 256,
        },
    },
];

/// Decodes the reference prompts of `model_dir`: the first alone (greedy,
/// sampled, and penalized, each its own run) and all of them together,
/// each sequence by a sampler of its own. Sampling runs in the tiled form,
/// as on a GPU: CPU adapters sample on the host (`samples_on_device`).
fn check(model_dir: std::path::PathBuf) {
    let model = ModelDir::open(&model_dir).unwrap();
    let prompts: Vec<Vec<u32>> = reference(&model_dir).cases.into_iter().map(|c| c.input_ids).collect();
    let group = common::test_device();
    let steps = |prompts| Steps {
        model: &model,
        group: &group,
        prompts,
        steered: false,
    };
    let first = &prompts[0];
    group.run(steps(vec![(first.clone(), SAMPLERS[0])]));
    for sampler in [SAMPLERS[1], SAMPLERS[4]] {
        with_kernels(Kernels::Tiled, || group.run(steps(vec![(first.clone(), sampler)])));
    }
    let together: Vec<_> = prompts.into_iter().zip(SAMPLERS.iter().cycle().copied()).collect();
    with_kernels(Kernels::Tiled, || group.run(steps(together.clone())));
    // Reports and masks, over the samplers that take no penalties (the
    // host reports beside those: penalties rewrite the logits in place).
    let unpenalized = together.into_iter().filter(|(_, s)| s.penalties.is_off()).collect();
    let steered = Steps {
        steered: true,
        ..steps(unpenalized)
    };
    with_kernels(Kernels::Tiled, || group.run(steered));
}

#[test]
fn device_picks_equal_host_picks_and_a_warm_step_allocates_nothing() {
    // The step's counts are the process's.
    if common::alone::ran_alone() {
        return;
    }
    check(shared_model("fortune-llama-3m"));
    // Sliding-window layers, whose key ranges move on differently.
    check(fixture("gemma3-tiny"));
}

/// A pass over a few rows of one sequence (a speculative check, a short
/// prompt) after a prompt gives each row's logits bit for bit as
/// decoding the rows one at a time does; and a prompt read for no logits
/// (a chunk before a prompt's last) reads nothing back.
struct ShortPass<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    prompt: Vec<u32>,
}

impl RuntimeTask for ShortPass<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let llama = load_split(clients, self.group, self.model, CONTEXT, None, SplitMode::Layer).expect("load");
        let rows: Vec<u32> = self
            .prompt
            .iter()
            .cycle()
            .copied()
            .take(1 + cleave_nn::MAX_DRAFTS)
            .collect();
        // The pass goes on from a prompt whose logits nobody asked for: it
        // reads nothing back, and caches what a prompt read to its last
        // row's logits caches.
        let mut ctx = llama.new_context(CONTEXT).unwrap();
        let before = Counters::now();
        let none = llama.forward(&mut ctx, &self.prompt, Logits::None).unwrap();
        let counted = Counters::now().since(before);
        assert!(none.is_empty(), "{} logits of a pass asked for none", none.len());
        assert_eq!(counted.reads, 0, "a pass asked for no logits: {counted:?}");
        let pass = llama.forward(&mut ctx, &rows, Logits::All).unwrap();
        let mut ctx = llama.new_context(CONTEXT).unwrap();
        llama.forward(&mut ctx, &self.prompt, Logits::Last).unwrap();
        let one_at_a_time: Vec<f32> = rows
            .iter()
            .flat_map(|&id| llama.forward(&mut ctx, &[id], Logits::Last).unwrap())
            .collect();
        let bits = |logits: &[f32]| -> Vec<u32> { logits.iter().map(|l| l.to_bits()).collect() };
        assert_eq!(bits(&pass), bits(&one_at_a_time), "{} rows in one pass", rows.len());
    }
}

#[test]
fn a_short_pass_gives_each_row_as_decoding_alone() {
    // The pass's counts are the process's.
    if common::alone::ran_alone() {
        return;
    }
    let model_dir = shared_model("fortune-llama-3m");
    let model = ModelDir::open(&model_dir).unwrap();
    let group = common::test_device();
    let prompt = reference(&model_dir).cases.remove(0).input_ids;
    for kernels in [Kernels::Tiled, Kernels::Unit] {
        let pass = ShortPass {
            model: &model,
            group: &group,
            prompt: prompt.clone(),
        };
        with_kernels(kernels, || group.run(pass));
    }
}
