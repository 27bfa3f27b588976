//! GGUF files (llama.cpp's converter and quantizer) against what
//! transformers computes when it loads the same file itself
//! (`gguf_file=`, dequantized by gguf-py, q/k permutation undone): every
//! llama-gguf file's prompt ids, every position's logits and its greedy
//! ids, on one device and split by layers, rows and tensors over two and
//! three logical devices. The project's own fixtures the same way, on one
//! device and split over two: the other families' files (tests/fixtures/
//! gguf-families: Qwen2, Qwen3, Qwen3-MoE, Gemma 2, 3 and 4, Phi-3, Mixtral,
//! gpt-oss in f32 and with MXFP4 experts, a Qwen3-MoE at Q4_K_M, whose
//! experts also stream through an expert cache of one, a Gemma 4 and a
//! Qwen3.5 at Q4_K_M and Qwen3.5 dense and MoE at Q8_0; Gemma 4's blocks
//! of two head sizes split by layers and experts only, Qwen3.5's Gated
//! DeltaNet layers by layers and rows) and
//! the other quant types' (tests/fixtures/gguf-types*: split and in the
//! tiled form, one file of each block layout, every file under
//! CLEAVE_TEST_EVERY_VARIANT). The demo model's F16 file gives the greedy
//! ids of the f32 model's reference, as llama.cpp's does.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::ModelDir;
use cleave_nn::CacheType;
use cleave_plan::{Plan, SplitMode};
use cleave_shaders::cubecl::prelude::*;
use common::{fixture, Case};
use serde::Deserialize;

/// transformers' f32 arithmetic on the same dequantized weights: the
/// worst difference is printed per file and split; measured on lavapipe
/// it is 3.6e-5 (Q4_0 on one device; 2.8e-5 split), so golden's bound
/// holds, with room for other backends' summation orders.
const LOGIT_TOLERANCE: f32 = 1e-4;

/// With keys and values rounded to f16 in the cache, logits move by up to
/// 1.05e-2 (Q4_K_M; 9.7e-3 F16, 9.3e-3 Q8_0, measured on lavapipe) on these
/// random-weight files, whose greedy steps are often closer than that (so
/// greedy ids through an f16 cache are compared on the demo model, whose
/// steps are decisive).
const F16_CACHE_TOLERANCE: f32 = 2e-2;

#[derive(Deserialize)]
struct GgufReference {
    files: BTreeMap<String, GgufFileReference>,
}

#[derive(Deserialize)]
pub(crate) struct GgufFileReference {
    pub(crate) cases: Vec<Case>,
}

/// The references of the files in `dir`, by file name.
pub(crate) fn references_in(dir: &Path) -> BTreeMap<String, GgufFileReference> {
    let path = dir.join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<GgufReference>(&text).unwrap().files
}

fn references() -> BTreeMap<String, GgufFileReference> {
    references_in(&fixture("llama-gguf"))
}

/// The quant types' fixtures, one folder of files a block layout: blocks of
/// 32 values (tests/fixtures/gguf-types) and super-blocks of 256
/// (tests/fixtures/gguf-types-k).
fn is_quant_types_dir(dir: &Path) -> bool {
    dir.ends_with("gguf-types") || dir.ends_with("gguf-types-k")
}

/// The files of `dir` with their references, for a test that repeats what
/// [`every_own_gguf_fixture_gives_its_reference_on_one_device`] checks in
/// another form or split: a quant types' folder gives its first file (one
/// of its block layout) unless every variant is asked for, where the
/// layout's code is what is tested, not each type's decoder.
fn files_for_another_form(dir: &Path) -> BTreeMap<String, GgufFileReference> {
    let mut files = references_in(dir);
    if is_quant_types_dir(dir) && !common::every_variant() {
        let first = files.pop_first().expect("a quant types' folder holds files");
        files = BTreeMap::from([first]);
    }
    files
}

/// The project's own GGUF fixtures, each a folder of files with their
/// reference.json: tests/fixtures/gguf-families/<family> and the quant
/// types' tests/fixtures/gguf-types*.
fn own_fixture_dirs() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let families = root.join("gguf-families");
    let mut dirs: Vec<_> = std::fs::read_dir(&families)
        .unwrap_or_else(|e| panic!("{}: {e}", families.display()))
        .map(|entry| entry.unwrap().path())
        .chain([root.join("gguf-types"), root.join("gguf-types-k")])
        .filter(|path| path.join("reference.json").is_file())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 8, "{}: {dirs:?}", root.display());
    dirs
}

/// Checks `cases` on `model` loaded onto `group` in `mode`: logits within
/// `tolerance`, and greedy ids if `greedy`.
struct Check<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    mode: SplitMode,
    cases: &'a [Case],
    tolerance: f32,
    greedy: bool,
}

impl RuntimeTask for Check<'_> {
    type Output = f32;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> f32 {
        let llama = common::load_split(clients, self.group, self.model, 256, None, self.mode).expect("load");
        let mut worst = 0.0f32;
        for case in self.cases {
            worst = worst.max(common::check_logits(llama.as_ref(), case, self.tolerance));
            if self.greedy {
                common::check_greedy(llama.as_ref(), &self.model.tokenizer, case);
            }
        }
        worst
    }
}

/// `file` with an f32 KV cache: the references are f32 arithmetic on the
/// dequantized weights (a GGUF model's default cache is f16).
fn open(file: &Path) -> ModelDir {
    let mut model = ModelDir::open(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    model.cache_type = CacheType::F32;
    model
}

/// The file `name` in `dir` gives `reference`'s ids, logits and greedy
/// ids on one device.
fn gives_its_reference_on_one_device(dir: &Path, name: &str, reference: &GgufFileReference) {
    let group = common::test_device();
    let model = open(&dir.join(name));
    for case in &reference.cases {
        assert_eq!(
            model.tokenizer.encode(&case.prompt).unwrap(),
            case.input_ids,
            "{name}: {:?}",
            case.prompt
        );
    }
    let worst = group.run(Check {
        model: &model,
        group: &group,
        mode: SplitMode::Layer,
        cases: &reference.cases,
        tolerance: tolerance_of(&model),
        greedy: true,
    });
    eprintln!("{name}: worst logit difference {worst:e}");
}

/// The logits' tolerance for `model`: Qwen3.5's Gated DeltaNet layers
/// are held to [`common::HYBRID_LOGIT_TOLERANCE`] (a GGUF file's value
/// heads, in llama.cpp's order, also sum its products in another order
/// than transformers' on the source: 3.7e-4 apart on qwen3_5-tiny's f32
/// conversion).
fn tolerance_of(model: &ModelDir) -> f32 {
    match model.config.linear_attention {
        Some(_) => common::HYBRID_LOGIT_TOLERANCE,
        None => LOGIT_TOLERANCE,
    }
}

/// `model` (the file `name`) split over `group` in each of `modes` gives
/// `case`'s logits and greedy ids.
fn gives_its_reference_split(group: &DeviceGroup, model: &ModelDir, name: &str, case: &Case, modes: &[SplitMode]) {
    let devices = group.names().len();
    for &mode in modes {
        let worst = group.run(Check {
            model,
            group,
            mode,
            cases: std::slice::from_ref(case),
            tolerance: tolerance_of(model),
            greedy: true,
        });
        eprintln!("{name}, {mode:?} split over {devices}: worst logit difference {worst:e}");
    }
}

#[test]
fn every_llama_gguf_file_gives_its_reference_on_one_device() {
    for (name, reference) in references() {
        gives_its_reference_on_one_device(&fixture("llama-gguf"), &name, &reference);
    }
}

#[test]
fn every_own_gguf_fixture_gives_its_reference_on_one_device() {
    for dir in own_fixture_dirs() {
        for (name, reference) in references_in(&dir) {
            gives_its_reference_on_one_device(&dir, &name, &reference);
        }
    }
}

/// Split over two devices on each file's longest prompt: by layers, rows
/// and tensors, or by layers and experts where the model has experts.
#[test]
fn every_own_gguf_fixture_gives_its_reference_split_over_two_devices() {
    let group = common::logical_group(2);
    for dir in own_fixture_dirs() {
        for (name, reference) in files_for_another_form(&dir) {
            let model = open(&dir.join(&name));
            let longest = reference.cases.into_iter().max_by_key(|c| c.input_ids.len()).unwrap();
            // Row and tensor split cut every block alike, so Gemma 4's
            // blocks of two head sizes go by layers only; tensor split
            // does not cut Qwen3.5's Gated DeltaNet layers.
            let geometry = model.inventory(256).geometry;
            let uneven = geometry.as_ref().is_some_and(|g| g.uneven_blocks > 0);
            let hybrid = geometry.as_ref().is_some_and(|g| g.linear_blocks > 0);
            let modes: &[SplitMode] = match (model.config.experts, uneven, hybrid) {
                (Some(_), _, _) => &[SplitMode::Layer, SplitMode::Expert],
                (None, true, _) => &[SplitMode::Layer],
                (None, false, true) => &[SplitMode::Layer, SplitMode::Row],
                (None, false, false) => &[SplitMode::Layer, SplitMode::Row, SplitMode::Tensor],
            };
            gives_its_reference_split(&group, &model, &name, &longest, modes);
        }
    }
}

/// Quantized experts (a Qwen3-MoE Q4_K_M file: experts in Q4_K and Q6_K
/// blocks) streamed through an expert cache of one per block: every case's
/// logits and greedy ids, the experts uploaded as they are routed.
#[test]
fn quantized_experts_give_their_reference_through_an_expert_cache_of_one() {
    struct Cached<'a> {
        model: &'a ModelDir,
        group: &'a DeviceGroup,
        cases: &'a [Case],
    }
    impl RuntimeTask for Cached<'_> {
        type Output = cleave_nn::UploadStats;

        fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> cleave_nn::UploadStats {
            let members = cleave_nn::plan_members(self.group);
            let options = common::expert_options(Some(1));
            let plan = cleave_plan::plan(&self.model.inventory(256), &members, None, &options).expect("plan");
            let devices = cleave_nn::Placed::group(clients, self.group);
            let llama = self.model.load(devices, plan, &mut |_| {}).expect("load");
            for case in self.cases {
                common::check_logits(llama.as_ref(), case, LOGIT_TOLERANCE);
                common::check_greedy(llama.as_ref(), &self.model.tokenizer, case);
            }
            llama.upload_stats()
        }
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf-families/qwen3moe-q4_k_m");
    let (name, reference) = references_in(&dir).pop_first().expect("the Q4_K_M file's reference");
    let model = open(&dir.join(&name));
    let group = common::test_device();
    let stats = group.run(Cached {
        model: &model,
        group: &group,
        cases: &reference.cases,
    });
    assert!(stats.expert_misses > 0 && stats.uploaded_bytes > 0, "{name}: {stats:?}");
}

/// The tiled kernels GPUs take, on the k-quant mix users download most:
/// Q4_K and Q6_K blocks decoded in the products' lanes.
#[test]
fn a_q4_k_m_file_gives_its_reference_in_the_tiled_form() {
    let name = "llama-gguf-Q4_K_M.gguf";
    let reference = &references()[name];
    common::in_the_tiled_form(|| gives_its_reference_on_one_device(&fixture("llama-gguf"), name, reference));
}

/// The other quant types' files in the tiled form too: their blocks
/// decoded in the products' lanes.
#[test]
fn the_quant_type_files_give_their_references_in_the_tiled_form() {
    for dir in own_fixture_dirs().iter().filter(|d| is_quant_types_dir(d)) {
        for (name, reference) in files_for_another_form(dir) {
            common::in_the_tiled_form(|| gives_its_reference_on_one_device(dir, &name, &reference));
        }
    }
}

/// The llama.cpp-made files of one type a block layout (f16, blocks of 32
/// in Q8_0, super-blocks of 256 in Q4_K_M's Q4_K and Q6_K) split over two
/// and three devices, every file where every variant is asked for: what a
/// split slices is the layout's blocks (each type's decoder is checked on
/// one device).
#[test]
fn every_llama_gguf_layout_gives_its_reference_split_over_two_and_three_devices() {
    let layouts = ["llama-gguf-F16.gguf", "llama-gguf-Q8_0.gguf", "llama-gguf-Q4_K_M.gguf"];
    for devices in [2, 3] {
        let group = common::logical_group(devices);
        let files = references()
            .into_iter()
            .filter(|(name, _)| common::every_variant() || layouts.contains(&name.as_str()));
        for (name, reference) in files {
            let model = open(&fixture("llama-gguf").join(&name));
            let longest = reference.cases.into_iter().max_by_key(|c| c.input_ids.len()).unwrap();
            let modes = [SplitMode::Layer, SplitMode::Row, SplitMode::Tensor];
            gives_its_reference_split(&group, &model, &name, &longest, &modes);
        }
    }
}

#[test]
fn an_f16_cache_keeps_the_logits_close() {
    let group = common::test_device();
    let references = references();
    for name in ["llama-gguf-F16.gguf", "llama-gguf-Q8_0.gguf", "llama-gguf-Q4_K_M.gguf"] {
        let path = fixture("llama-gguf").join(name);
        let model = ModelDir::open(&path).unwrap();
        assert_eq!(model.cache_type, CacheType::F16, "{name}: the default cache type");
        let worst = group.run(Check {
            model: &model,
            group: &group,
            mode: SplitMode::Layer,
            cases: &references[name].cases,
            tolerance: F16_CACHE_TOLERANCE,
            greedy: false,
        });
        eprintln!("{name} with an f16 cache: worst logit difference {worst:e}");
    }
}

/// With either cache type, as llama.cpp's own run of the file does.
#[test]
fn the_demo_models_f16_file_decodes_the_references_greedy_ids() {
    let mut model = open(&common::shared_model("fortune-llama-3m-gguf").join("fortune-llama-3m-F16.gguf"));
    let reference = common::reference(&common::shared_model("fortune-llama-3m"));
    let group = common::test_device();
    struct Greedy<'a>(&'a ModelDir, &'a DeviceGroup, &'a [Case]);
    impl RuntimeTask for Greedy<'_> {
        type Output = ();
        fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
            let llama = common::load_split(clients, self.1, self.0, 256, None, SplitMode::Layer).expect("load");
            for case in self.2 {
                assert_eq!(self.0.tokenizer.encode(&case.prompt).unwrap(), case.input_ids);
                common::check_greedy(llama.as_ref(), &self.0.tokenizer, case);
            }
        }
    }
    for cache in [CacheType::F32, CacheType::F16] {
        model.cache_type = cache;
        group.run(Greedy(&model, &group, &reference.cases));
    }
}

#[test]
fn a_directory_holding_one_gguf_file_opens_it_and_several_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let source = common::shared_model("fortune-llama-3m-gguf");
    std::fs::copy(source.join("fortune-llama-3m-Q8_0.gguf"), dir.path().join("model.gguf")).unwrap();
    let model = open(dir.path());
    assert_eq!(
        model.config.layers,
        open(&source.join("fortune-llama-3m-Q8_0.gguf")).config.layers
    );
    let err = ModelDir::open(&source).err().expect("three GGUF files").to_string();
    assert!(
        err.contains("holds 3 GGUF files") && err.contains("fortune-llama-3m-Q4_0.gguf"),
        "{err}"
    );
}

/// Loads `model` on `group` in `mode` and checks that every device holds
/// what the plan says, and that the plan's weights are `expected` bytes
/// where given (the file's matrices as stored, its vectors widened to
/// f32). Returns the plan.
struct Memory<'a> {
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    mode: SplitMode,
    expected: Option<u64>,
}

impl RuntimeTask for Memory<'_> {
    type Output = Plan;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Plan {
        let llama = common::load_split(clients, self.group, self.model, 64, None, self.mode).expect("load");
        let plan = llama.placement().plan();
        if let Some(expected) = self.expected {
            let planned: u64 = plan.devices.iter().map(|d| d.weight_bytes).sum();
            assert_eq!(planned, expected, "{}: planned weight bytes", self.model.path.display());
        }
        // Rows of a block type are padded to whole u32 words per buffer.
        common::assert_memory_matches_plan(llama.placement(), 64);
        plan.clone()
    }
}

/// The bytes the file's tensors take as cleave places them: matrices as
/// stored, vectors in f32, by `(shape, stored bytes)`.
fn placed_bytes(tensors: impl Iterator<Item = (Vec<usize>, u64)>) -> u64 {
    tensors
        .map(|(shape, bytes)| match shape[..] {
            [len] => (len * 4) as u64,
            _ => bytes,
        })
        .sum()
}

#[test]
fn weights_on_the_device_are_the_checkpoints_bytes_as_planned() {
    let group = common::test_device();
    // A bf16 safetensors checkpoint: matrices stay bf16 (half of f32).
    let bf16 = fixture("llama-tiny-bf16");
    let file = std::fs::read(bf16.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&file).unwrap();
    let expected = placed_bytes(
        tensors
            .tensors()
            .into_iter()
            .map(|(_, t)| (t.shape().to_vec(), t.data().len() as u64)),
    );
    let model = open(&bf16);
    group.run(Memory {
        model: &model,
        group: &group,
        mode: SplitMode::Layer,
        expected: Some(expected),
    });
    let f32_bytes: u64 = tensors.tensors().iter().map(|(_, t)| (t.data().len() * 2) as u64).sum();
    assert!(
        expected * 10 < f32_bytes * 6,
        "bf16 matrices: {expected} bytes vs {f32_bytes} in f32"
    );

    // A Q4_K_M file: Q4_K and Q6_K blocks on the device as stored.
    let path = fixture("llama-gguf").join("llama-gguf-Q4_K_M.gguf");
    let gguf = cleave_gguf::GgufFile::open(&path).unwrap();
    let expected = placed_bytes(
        gguf.tensors()
            .iter()
            .map(|t| (t.dims.iter().rev().copied().collect(), t.bytes as u64)),
    );
    let model = open(&path);
    group.run(Memory {
        model: &model,
        group: &group,
        mode: SplitMode::Layer,
        expected: Some(expected),
    });
}

/// Tensor split of a Q4_K_M file over two devices: down_proj's input
/// columns split on whole 256-value blocks; o_proj's 256 columns are one
/// block, which the two devices' heads cut, so those slices are held in
/// f32, and the plan counts them so and says it. Each device holds what
/// the plan says.
#[test]
fn tensor_split_widens_only_the_blocks_it_must_cut_and_says_so() {
    let model = open(&fixture("llama-gguf").join("llama-gguf-Q4_K_M.gguf"));
    let group = common::logical_group(2);
    let plan = group.run(Memory {
        model: &model,
        group: &group,
        mode: SplitMode::Tensor,
        expected: None,
    });
    for device in &plan.devices {
        let heads = device.heads.as_ref().expect("a head slice");
        assert!(
            heads.intermediate.start % 256 == 0 && heads.intermediate.end % 256 == 0,
            "{plan}"
        );
    }
    assert_eq!(plan.notes.len(), 1, "{plan}");
    assert!(
        plan.notes[0].starts_with("self_attn.o_proj:") && plan.notes[0].contains("held in f32"),
        "{plan}"
    );
}

#[test]
fn cleave_plan_names_the_stored_weight_types() {
    let file = fixture("llama-gguf").join("llama-gguf-Q4_K_M.gguf");
    let out = common::cleave()
        .args(["plan", "-m", file.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("weights stored as F32, Q4_K, Q6_K"), "{stdout}");
}
