//! Golden tests: every reference model in ../shared, against the numbers
//! Hugging Face transformers computed for it (float32, CPU).
//!
//! - the tokenizer gives the reference input ids exactly;
//! - a full prefill gives every position's logits within 1e-4;
//! - 24 greedy tokens, each fed back one at a time through the KV cache,
//!   are exactly the reference's up to its first near tie (none in these
//!   fixtures). The reference never picks EOS (it was made with
//!   transformers' min_new_tokens), so neither does the test.

use crate::common;

use std::path::Path;

use cleave_device::RuntimeTask;
use cleave_models::ModelDir;
use cleave_nn::CacheType;
use cleave_shaders::cubecl::prelude::*;
use common::{reference, test_device, Case};

/// f32 against transformers' f32: the worst difference over every golden
/// case is 1.9e-5 (fortune-llama-3m; 1.2e-5 on the tiny fixtures) on
/// lavapipe, so 1e-4 leaves room for other backends' summation orders and
/// still catches a wrong operation.
const LOGIT_TOLERANCE: f32 = 1e-4;

struct Golden<'a> {
    model: &'a ModelDir,
    group: &'a cleave_device::DeviceGroup,
    cases: &'a [Case],
    tolerance: f32,
}

impl RuntimeTask for Golden<'_> {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let context = self
            .cases
            .iter()
            .map(|case| case.input_ids.len() + case.greedy_new_ids.len())
            .max()
            .unwrap_or(0)
            .max(256);
        let llama = common::load_split(
            clients,
            self.group,
            self.model,
            context,
            None,
            cleave_plan::SplitMode::Layer,
        )
        .expect("load");
        let mut worst = 0.0f32;
        for case in self.cases {
            worst = worst.max(common::check_logits(llama.as_ref(), case, self.tolerance));
            worst = worst.max(common::check_prefill_in_pieces(llama.as_ref(), case, self.tolerance));
            common::check_greedy(llama.as_ref(), &self.model.tokenizer, case);
        }
        eprintln!("{}: worst logit difference {worst:e}", self.model.path.display());
    }
}

fn golden(dir: &Path) {
    golden_against(dir, &reference(dir).cases);
}

/// A hybrid fixture, held to [`common::HYBRID_LOGIT_TOLERANCE`].
fn golden_hybrid(dir: &Path) {
    golden_within(dir, &reference(dir).cases, common::HYBRID_LOGIT_TOLERANCE);
}

/// The model in `dir` against `cases`: its fixture's own, or another
/// fixture's for the same model written another way.
fn golden_against(dir: &Path, cases: &[Case]) {
    golden_within(dir, cases, LOGIT_TOLERANCE);
}

fn golden_within(dir: &Path, cases: &[Case], tolerance: f32) {
    let mut model = ModelDir::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    // The references are f32 arithmetic: compare with an f32 cache (a
    // 16-bit checkpoint defaults to f16).
    model.cache_type = CacheType::F32;
    for case in cases {
        let ids = model.tokenizer.encode(&case.prompt).unwrap();
        assert_eq!(ids, case.input_ids, "{}: token ids of {:?}", dir.display(), case.prompt);
    }
    let group = test_device();
    group.run(Golden {
        model: &model,
        group: &group,
        cases,
        tolerance,
    });
}

#[test]
fn llama_tiny() {
    golden(&common::fixture("llama-tiny"));
}

#[test]
fn llama_tiny_bf16() {
    golden(&common::fixture("llama-tiny-bf16"));
}

#[test]
fn llama_tiny_sharded() {
    golden(&common::fixture("llama-tiny-sharded"));
}

#[test]
fn qwen2_tiny() {
    golden(&common::fixture("qwen2-tiny"));
}

/// A sliding window (8) shorter than every prompt.
#[test]
fn mistral_tiny() {
    golden(&common::fixture("mistral-tiny"));
}

/// Soft caps that bite and `query_pre_attn_scalar` unlike `head_dim`
/// (the reference records how far each moves the logits).
#[test]
fn gemma2_tiny() {
    golden(&common::fixture("gemma2-tiny"));
}

/// A prompt of 1,981 tokens (four prefill batches of at most 512 rows;
/// the reference keeps every 97th position's logits and the last four's),
/// whose decisive greedy steps take the keys past 2,048.
#[test]
fn llama_long_tiny() {
    let dir = common::fixture("llama-long-tiny");
    let case = common::longest_case(reference(&dir));
    let keys = case.input_ids.len() + case.decisive_steps();
    assert!(keys > 2048, "{}: the decisive steps end at {keys} keys", dir.display());
    assert!(
        case.input_ids.len() > 3 * cleave_nn::MAX_BATCH_ROWS,
        "{}: prompt of {}",
        dir.display(),
        case.input_ids.len()
    );
    golden(&dir);
}

#[test]
fn qwen3_tiny() {
    golden(&common::fixture("qwen3-tiny"));
}

#[test]
fn phi3_tiny() {
    golden(&common::fixture("phi3-tiny"));
}

#[test]
fn gemma3_tiny() {
    golden(&common::fixture("gemma3-tiny"));
}

#[test]
fn mixtral_tiny() {
    golden(&common::fixture("mixtral-tiny"));
}

#[test]
fn qwen3_moe_tiny() {
    golden(&common::fixture("qwen3-moe-tiny"));
}

#[test]
fn gpt_oss_tiny() {
    golden(&common::fixture("gpt-oss-tiny"));
}

/// gpt-oss-tiny with its experts in the published MXFP4 layout, read
/// onto the device in llama.cpp's MXFP4 blocks.
#[test]
fn gpt_oss_mxfp4_tiny() {
    golden(&common::fixture("gpt-oss-mxfp4-tiny"));
}

#[test]
fn gpt_oss_tiny_in_the_tiled_form() {
    common::in_the_tiled_form(|| golden(&common::fixture("gpt-oss-tiny")));
}

/// Per-layer inputs, full layers with heads of 512 and a proportional
/// rope, and two layers reading earlier layers' KV caches.
#[test]
fn gemma4_tiny() {
    golden(&common::fixture("gemma4-tiny"));
}

/// The KV-shared layers' MLPs twice as wide (`use_double_wide_mlp`).
#[test]
fn gemma4_wide_mlp_tiny() {
    golden(&common::fixture("gemma4-wide-mlp-tiny"));
}

/// Gemma 4's experts beside the dense MLP.
#[test]
fn gemma4_moe_tiny() {
    golden(&common::fixture("gemma4-moe-tiny"));
}

#[test]
fn gemma4_tiny_in_the_tiled_form() {
    common::in_the_tiled_form(|| golden(&common::fixture("gemma4-tiny")));
}

#[test]
fn qwen3_5_tiny() {
    golden_hybrid(&common::fixture("qwen3_5-tiny"));
}

#[test]
fn qwen3_5_moe_tiny() {
    golden_hybrid(&common::fixture("qwen3_5-moe-tiny"));
}

/// The published multimodal layout: its text path, the vision tower left
/// unread.
#[test]
fn qwen3_5_vl_tiny() {
    golden_hybrid(&common::fixture("qwen3_5-vl-tiny"));
}

#[test]
fn qwen3_5_tiny_in_the_tiled_form() {
    common::in_the_tiled_form(|| golden_hybrid(&common::fixture("qwen3_5-tiny")));
}

#[test]
fn fortune_llama_3m() {
    golden(&common::shared_model("fortune-llama-3m"));
}

/// The tiled kernels GPUs take, against the same references at the same
/// bound: a dense family, one with per-head norms and sliding windows, a
/// soft-capped one, a mixture and the long prompt.
#[test]
fn llama_tiny_in_the_tiled_form() {
    common::in_the_tiled_form(|| golden(&common::fixture("llama-tiny")));
}

#[test]
fn gemma3_tiny_in_the_tiled_form() {
    common::in_the_tiled_form(|| golden(&common::fixture("gemma3-tiny")));
}

#[test]
fn gemma2_tiny_in_the_tiled_form() {
    common::in_the_tiled_form(|| golden(&common::fixture("gemma2-tiny")));
}

#[test]
fn llama_long_tiny_in_the_tiled_form() {
    common::in_the_tiled_form(|| golden(&common::fixture("llama-long-tiny")));
}

#[test]
fn mixtral_tiny_in_the_tiled_form() {
    common::in_the_tiled_form(|| golden(&common::fixture("mixtral-tiny")));
}

/// A config that does not say whether the head is tied: a checkpoint
/// without `lm_head.weight` ties it, as transformers does.
#[test]
fn head_tied_by_the_checkpoint_when_the_config_is_silent() {
    let dir = common::copy_of("qwen2-tiny");
    common::edit_json(&dir.path().join("config.json"), |c| {
        c.as_object_mut().unwrap().remove("tie_word_embeddings");
    });
    let reference = reference(&common::fixture("qwen2-tiny"));
    golden_against(dir.path(), &reference.cases[..1]);
}

/// Published Gemma 3 checkpoints carry transformers 4's config layout:
/// `rope_theta` and `rope_local_base_freq` at the top level, and
/// `sliding_window_pattern` in place of `layer_types`. The same model
/// written that way gives the same reference.
#[test]
fn gemma3_tiny_in_the_transformers_4_layout() {
    let dir = common::copy_of("gemma3-tiny");
    common::edit_json(&dir.path().join("config.json"), |c| {
        let rope = c["rope_parameters"].clone();
        let config = c.as_object_mut().unwrap();
        for field in ["rope_parameters", "layer_types", "_sliding_window_pattern"] {
            config.remove(field);
        }
        config.insert("rope_theta".into(), rope["full_attention"]["rope_theta"].clone());
        config.insert(
            "rope_local_base_freq".into(),
            rope["sliding_attention"]["rope_theta"].clone(),
        );
        config.insert("sliding_window_pattern".into(), 2.into());
    });
    golden_against(dir.path(), &reference(&common::fixture("gemma3-tiny")).cases);
}

/// Greedy ids are compared up to the reference's first near tie (a step
/// whose top-two margin is under `DECISIVE_MARGIN`), whatever a README
/// promises; the first step's margin is also read from the reference
/// logits. A reference that decides fewer than `MIN_DECISIVE_STEPS` steps
/// fails whatever the ids.
#[test]
fn greedy_ids_are_compared_up_to_the_first_near_tie() {
    let llama_tiny = reference(&common::fixture("llama-tiny"));
    let case = &llama_tiny.cases[0];
    assert_eq!(case.decisive_steps(), case.greedy_new_ids.len());
    let compare = |ids: &[u32], case: &Case| common::greedy_mismatch(ids, case).is_none();
    assert!(compare(&case.greedy_new_ids, case));

    let tie_at = |step: usize| {
        let mut tied = reference(&common::fixture("llama-tiny")).cases.remove(0);
        tied.greedy_margins[step] = 5e-4;
        tied
    };
    let tied = tie_at(14);
    assert_eq!(tied.decisive_steps(), 14);
    assert!(!tied.greedy_text_is_decisive());
    let mut ids = tied.greedy_new_ids.clone();
    ids[14] ^= 1;
    ids[20] ^= 1;
    assert!(compare(&ids, &tied), "ids after the tie are not compared");
    assert!(!compare(&ids, case), "without the tie they are");
    assert!(!compare(&ids[..13], &tied), "too few ids");
    ids[13] ^= 1;
    assert!(!compare(&ids, &tied), "ids before the tie are compared");

    // A tie before the floor: even the reference's own ids do not pass.
    let early = tie_at(common::MIN_DECISIVE_STEPS - 1);
    assert_eq!(early.decisive_steps(), common::MIN_DECISIVE_STEPS - 1);
    let mismatch = common::greedy_mismatch(&early.greedy_new_ids, &early).expect("too few decisive steps");
    let only = format!("decides only {} greedy steps", common::MIN_DECISIVE_STEPS - 1);
    assert!(mismatch.contains(&only), "{mismatch}");
    let at_floor = tie_at(common::MIN_DECISIVE_STEPS);
    assert!(compare(&at_floor.greedy_new_ids, &at_floor));

    // A near tie in the reference's last row of logits: nothing is decided.
    let mut tied = reference(&common::fixture("llama-tiny")).cases.remove(0);
    let last = tied.logits.last_mut().unwrap();
    let top = last.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let other = last.iter().position(|&l| l != top).unwrap();
    last[other] = top - 1e-4;
    assert_eq!(tied.decisive_steps(), 0);
}
