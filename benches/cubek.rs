//! cubek 0.2.0's kernels against cleave's own on one device, all f32: its
//! matmul strategies on linear-layer shapes (and one 3×3 convolution's
//! implicit GEMM), its 2-D convolution on 3×3, 64 → 64 channel maps, and its
//! attention on one 128-wide head where every query sees every key.
//!
//! `cargo bench --bench cubek --features cubek` (CLEAVE_BENCH_DEVICE picks
//! the adapter). Each figure is the median of 5 calls after a warm-up call
//! (which compiles), each waited for with a device sync. A cubek result is
//! checked against ours before it is timed; a strategy that cannot launch
//! on the device shows its error instead of a time.
//!
//! A second matmul table takes bf16 inputs with f32 accumulation and
//! output, on the matrix units where the device has them (cubek's cmma
//! strategies), at the shapes of a 1B and an 8B Llama's prefill of 512
//! tokens, beside our f32 kernel over the same (bf16-rounded) values; it
//! gives TFLOP/s. The last tables are the same on cubek's `mma` tiles, and
//! its specialized TMA matmul (what `--precision fast` takes on a Hopper
//! GPU) on blueprints its selector infers with other options.
//!
//! cubek's matmul reads our `[n, k]` weights as they are (a column-major
//! right-hand side); its convolution wants channels last, so its input and
//! weight are permuted once before timing; its attention keeps its tiles in
//! f16 whatever the global type, hence its larger difference from ours.
//!
//! Beside our exact convolution and attention, ours at `--precision fast`
//! for bf16 weights: on the matrix units where the device has them, else
//! the same rounded products on ordinary units.
//!
//! A third table, where the device has matrix units, gives our fast prefill
//! products by weight type at the same shapes, in TFLOP/s: f16 weights by
//! cubek's cmma matmul, block types decoded tile by tile beside the matrix
//! units' products (`matmul_decoded`), each checked against the exact
//! product of the values rounded to f16.

#[path = "support/device.rs"]
mod device;

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use cleave_device::RuntimeTask;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::cubecl::server::Handle;
use cleave_shaders::{profile, AttentionShape, KeyRanges, Precision, Tensor, Weight, WeightType};
use cubek_attention::definition::{AttentionGlobalTypes, AttentionOptions};
use cubek_attention::routines::blackbox_accelerated::BlackboxAcceleratedStrategy;
use cubek_convolution::{AcceleratedTileKind, ConvAlgorithm, ConvolutionArgs, ConvolutionInputs};
use cubek_matmul::components::tile::TileMatmulKind;
use cubek_matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulProblem, MatmulVectorSizes, MultiRowStrategy};
use cubek_matmul::launch::Strategy;
use cubek_matmul::routines::double_unit::DoubleUnitSelectionArgs;
use cubek_matmul::routines::simple_unit::SimpleUnitSelectionArgs;
use cubek_matmul::routines::specialized::SpecializedAlgorithm;
use cubek_matmul::routines::{
    infer_blueprint_plane, BlueprintStrategy, PlaneTilingBlueprintOptions, Routine, TileSizeSelection,
};
use cubek_std::InputBinding;

const RUNS: usize = 5;
/// Largest difference from our result allowed, relative to our result's
/// largest magnitude (an element-wise ratio would blow up near zero).
const TOLERANCE: f32 = 1e-3;

/// (m, n, k) of `[m, k] · [n, k]ᵀ`: linear layers of a small model, a wide
/// one, and the last is a VAE 3×3 convolution as a GEMM (4096 pixels, 128
/// output channels, 128·9 inputs).
const MATMULS: [(usize, usize, usize); 4] = [(128, 512, 192), (512, 1024, 1024), (128, 2048, 2048), (4096, 128, 1152)];
/// (m, n, k) of a 512-token prefill's products: a 1B Llama's q/k/v,
/// o, gate (or up) and down, then an 8B's gate and down.
const PREFILL_MATMULS: [(usize, usize, usize); 6] = [
    (512, 3072, 2048),
    (512, 2048, 2048),
    (512, 8192, 2048),
    (512, 2048, 8192),
    (512, 14336, 4096),
    (512, 4096, 14336),
];
/// Map sides of the 3×3, 64 → 64 channel convolution.
const CONV_SIDES: [usize; 2] = [64, 128];
const CONV_CHANNELS: usize = 64;
const HEAD_DIM: usize = 128;
const ATTENTION_TOKENS: [usize; 2] = [1024, 4096];

/// A table cell: a time and how far the result is from ours, or why there
/// is none.
enum Cell {
    Time { ms: f64, diff: f32 },
    Failed(String),
}

impl Cell {
    fn text(&self, notes: &mut Vec<String>) -> String {
        match self {
            Cell::Time { ms, diff } => format!("{ms:.2} (Δ {diff:.1e})"),
            Cell::Failed(why) => {
                // The full error goes under the table; the cell points to it.
                notes.push(why.clone());
                format!("failed [{}]", notes.len())
            }
        }
    }
}

struct Bench;

impl RuntimeTask for Bench {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let client = &clients[0];
        // A kernel the device refuses on its own thread fails every later
        // read, so what has run on a GPU before goes first, our own fast
        // products next, and cubek's kernels not yet run on one last.
        matmul_table(client);
        half_matmul_table(client, "cmma tiles", inferred(half_matmul_strategies()));
        typed_matmul_table(client);
        conv_table(client);
        attention_table(client);
        half_matmul_table(client, "mma tiles", inferred(half_matmul_mma_strategies()));
        if client.properties().features.tma.is_empty() {
            println!("(specialized tma blueprints not run: the device has no tensor-memory copies)\n");
        } else {
            half_matmul_table(client, "specialized tma blueprints", specialized_blueprints());
        }
    }
}

fn main() {
    let device = device::bench_device();
    let group = device::open_alone(&device);
    println!("one device ({device}), f32, ms per call, median of {RUNS} after a warm-up;");
    println!("Δ: largest difference from ours relative to our largest magnitude\n");
    group.run(Bench);
}

fn matmul_strategies() -> Vec<(&'static str, Strategy)> {
    let unit_min = SimpleUnitSelectionArgs {
        tile_size: TileSizeSelection::MinTileSize,
    };
    let double_min = DoubleUnitSelectionArgs {
        tile_size: TileSizeSelection::MinTileSize,
    };
    vec![
        ("naive", Strategy::Naive),
        ("simple unit", Strategy::SimpleUnit(BlueprintStrategy::default())),
        (
            "simple unit, min tile",
            Strategy::SimpleUnit(BlueprintStrategy::Inferred(unit_min)),
        ),
        ("double unit", Strategy::DoubleUnit(BlueprintStrategy::default())),
        (
            "double unit, min tile",
            Strategy::DoubleUnit(BlueprintStrategy::Inferred(double_min)),
        ),
        ("auto", Strategy::Auto),
        (
            "simple cyclic cmma",
            Strategy::SimpleCyclicCmma(BlueprintStrategy::default()),
        ),
    ]
}

fn matmul_table<R: Runtime>(client: &ComputeClient<R>) {
    let strategies = matmul_strategies();
    let names: Vec<&str> = strategies.iter().map(|(name, _)| *name).collect();
    println!("## matmul `[m, k] · [n, k]ᵀ`\n");
    println!("| m × n × k | ours | {} |", names.join(" | "));
    println!("| --- | ---:{} |", " | ---:".repeat(names.len()));
    let mut notes = Vec::new();
    for (m, n, k) in MATMULS {
        let x = Tensor::from_f32(client, &data(m * k, 1), &[m, k]);
        let w = Tensor::from_f32(client, &data(n * k, 2), &[n, k]);
        let ours = cleave_shaders::matmul(client, &x, &w).expect("our matmul");
        let expected = ours.to_vec(client).expect("read our matmul");
        let ours_ms = time_ms(client, || {
            cleave_shaders::matmul(client, &x, &w).expect("our matmul");
        });
        let cells: Vec<String> = strategies
            .iter()
            .map(|(_, strategy)| {
                let out = poisoned(client, &[m, n]);
                let cell = checked_time(client, &out, &expected, || cubek_matmul(client, strategy, &x, &w, &out));
                cell.text(&mut notes)
            })
            .collect();
        println!("| {m} × {n} × {k} | {ours_ms:.2} | {} |", cells.join(" | "));
    }
    print_notes(&notes);
}

/// Launches cubek's matmul of `x: [m, k]` by `w: [n, k]` into `out: [m, n]`.
fn cubek_matmul<R: Runtime>(
    client: &ComputeClient<R>,
    strategy: &Strategy,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
) -> Result<(), String> {
    let (m, k, n) = (x.shape[0], x.shape[1], w.shape[0]);
    let lhs = InputBinding::new(binding(&x.handle, &[m, k], &[k, 1]), f32_storage());
    // `w` row-major `[n, k]` is the `[k, n]` right-hand side in column-major
    // order: the same bytes, seen through strides, so nothing is copied.
    let rhs = InputBinding::new(binding(&w.handle, &[k, n], &[1, k]), f32_storage());
    let out = binding(&out.handle, &[m, n], &[n, 1]);
    let mut dtypes = MatmulElems::from_single_dtype(f32::as_type_native_unchecked());
    cubek_matmul::launch::launch_ref(strategy, client, lhs, rhs, out, &mut dtypes).map_err(|e| format!("{e:?}"))
}

fn half_matmul_strategies() -> Vec<(&'static str, Strategy)> {
    vec![
        ("auto", Strategy::Auto),
        (
            "simple cyclic",
            Strategy::SimpleCyclicCmma(BlueprintStrategy::default()),
        ),
        (
            "double cyclic",
            Strategy::DoubleCyclicCmma(BlueprintStrategy::default()),
        ),
        (
            "double tilewise",
            Strategy::DoubleTilewiseCmma(BlueprintStrategy::default()),
        ),
        ("simple tma", Strategy::SimpleTmaCmma(BlueprintStrategy::default())),
        ("double tma", Strategy::DoubleTmaCmma(BlueprintStrategy::default())),
        (
            "specialized tma",
            Strategy::SpecializedTmaCmma(BlueprintStrategy::default()),
        ),
        (
            "ordered double",
            Strategy::OrderedDoubleCmma(BlueprintStrategy::default()),
        ),
    ]
}

/// cubek's strategies on `mma` tiles (`mma.sync` on fragments it lays out
/// in registers itself) rather than `cmma` (the `wmma` API's fragments).
fn half_matmul_mma_strategies() -> Vec<(&'static str, Strategy)> {
    vec![
        ("simple cyclic", Strategy::SimpleCyclicMma(BlueprintStrategy::default())),
        ("double cyclic", Strategy::DoubleCyclicMma(BlueprintStrategy::default())),
        ("simple tma", Strategy::SimpleTmaMma(BlueprintStrategy::default())),
        ("double tma", Strategy::DoubleTmaMma(BlueprintStrategy::default())),
        (
            "specialized tma",
            Strategy::SpecializedTmaMma(BlueprintStrategy::default()),
        ),
    ]
}

/// A column of the bf16 tables: a strategy on the blueprint cubek infers
/// for each shape, or its specialized TMA matmul (what `--precision fast`
/// takes on a Hopper GPU) on a blueprint inferred with other options.
enum Column {
    Inferred(Strategy),
    Specialized(fn(&mut PlaneTilingBlueprintOptions)),
}

fn inferred(strategies: Vec<(&'static str, Strategy)>) -> Vec<(&'static str, Column)> {
    strategies
        .into_iter()
        .map(|(name, strategy)| (name, Column::Inferred(strategy)))
        .collect()
}

/// cubek's specialized TMA cmma matmul with the options its selector
/// infers a blueprint under, and changes of them that its selector does
/// not try at a 512-token prefill: two rows of tiles a plane (its own
/// choice only past 1,024 rows), a stage of 64 values of k instead of 32.
fn specialized_blueprints() -> Vec<(&'static str, Column)> {
    vec![
        ("inferred", Column::Specialized(|_| {})),
        (
            "2 rows a plane",
            Column::Specialized(|o| o.multi_row_strategy = MultiRowStrategy::Always(2)),
        ),
        ("k stage 64", Column::Specialized(|o| o.partition_k = Some(4))),
        (
            "both",
            Column::Specialized(|o| {
                o.multi_row_strategy = MultiRowStrategy::Always(2);
                o.partition_k = Some(4);
            }),
        ),
    ]
}

/// The specialized TMA strategy for bf16 `[m, k] · [n, k]ᵀ` into f32 on
/// the blueprint cubek's plane selector infers with the options its
/// specialized routine passes, changed by `change`.
fn specialized_with<R: Runtime>(
    client: &ComputeClient<R>,
    (m, n, k): (usize, usize, usize),
    change: fn(&mut PlaneTilingBlueprintOptions),
) -> Result<Strategy, String> {
    let bf16 = half::bf16::as_type_native_unchecked().storage_type();
    let globals = MatmulGlobalElems {
        lhs: bf16,
        rhs: bf16,
        out: f32_storage(),
    };
    let problem = MatmulProblem::from_shapes_and_strides(
        [m, k].as_slice().into(),
        [k, n].as_slice().into(),
        [m, n].as_slice().into(),
        [k, 1].as_slice().into(),
        [1, k].as_slice().into(),
        [n, 1].as_slice().into(),
        globals,
        AddressType::U32,
        None,
        None,
    )
    .map_err(|e| format!("{e:?}"))?;
    let tile = TileMatmulKind::Cmma;
    let mut options = PlaneTilingBlueprintOptions {
        specialized: true,
        multi_row_strategy: MultiRowStrategy::Adaptive { minimum_stage_count: 8 },
        swizzled: tile.should_swizzle(client),
        ..Default::default()
    };
    change(&mut options);
    // 16 bytes of bf16 a load in, 4 f32 out: what the launch picks here.
    let vectors = MatmulVectorSizes { lhs: 8, rhs: 8, out: 4 };
    let settings = <SpecializedAlgorithm as Routine<()>>::device_settings(client, vectors);
    let types = MatmulElems::from_globals(&problem.global_dtypes);
    let (blueprint, _) = infer_blueprint_plane(
        tile,
        client,
        &problem,
        settings.plane_dim,
        types,
        &settings.vector_sizes,
        options,
    )
    .map_err(|e| format!("{e:?}"))?;
    Ok(Strategy::SpecializedTmaCmma(BlueprintStrategy::Forced(blueprint)))
}

/// bf16 `[m, k] · [n, k]ᵀ` with f32 accumulation, in TFLOP/s: ours over
/// the same values widened to f32, and cubek's `columns` (`title`).
fn half_matmul_table<R: Runtime>(client: &ComputeClient<R>, title: &str, columns: Vec<(&'static str, Column)>) {
    println!("## matmul, bf16 inputs, f32 accumulation and output, {title}: TFLOP/s\n");
    // Every strategy would fail, and the 8B shapes' buffers are past a CPU
    // adapter's allocation limit.
    if cleave_shaders::default_precision(client) != Precision::Fast {
        println!("(not run: the device has no matrix units)\n");
        return;
    }
    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    println!("| m × n × k | ours (f32) | {} |", names.join(" | "));
    println!("| --- | ---:{} |", " | ---:".repeat(names.len()));
    let mut notes = Vec::new();
    for (m, n, k) in PREFILL_MATMULS {
        let (x, w) = (bf16_values(data(m * k, 1)), bf16_values(data(n * k, 2)));
        let bf16_bytes =
            |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&f| half::bf16::from_f32(f).to_le_bytes()).collect() };
        let x32 = Tensor::from_f32(client, &x, &[m, k]);
        let w32 = Tensor::from_f32(client, &w, &[n, k]);
        let x16 = profile::upload(client, &bf16_bytes(&x));
        let w16 = profile::upload(client, &bf16_bytes(&w));
        let expected = cleave_shaders::matmul(client, &x32, &w32)
            .and_then(|out| out.to_vec(client))
            .expect("our matmul");
        let flops = 2.0 * (m * n * k) as f64;
        let tflops = |ms: f64| flops / (ms * 1e-3) / 1e12;
        let ours_ms = time_ms(client, || {
            cleave_shaders::matmul(client, &x32, &w32).expect("our matmul");
        });
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, column)| {
                let strategy = match column {
                    Column::Inferred(strategy) => Ok(strategy.clone()),
                    Column::Specialized(change) => specialized_with(client, (m, n, k), *change),
                };
                let out = poisoned(client, &[m, n]);
                let cell = match strategy {
                    Ok(strategy) => checked_time(client, &out, &expected, || {
                        cubek_half_matmul(client, &strategy, (&x16, &w16), (m, n, k), &out)
                    }),
                    Err(why) => Cell::Failed(why),
                };
                match cell {
                    Cell::Time { ms, diff } => format!("{:.1} (Δ {diff:.1e})", tflops(ms)),
                    failed => failed.text(&mut notes),
                }
            })
            .collect();
        println!("| {m} × {n} × {k} | {:.2} | {} |", tflops(ours_ms), cells.join(" | "));
    }
    print_notes(&notes);
}

/// Our fast prefill products of weights of each type, in TFLOP/s, where
/// the device has matrix units (elsewhere they are the same rounded
/// products on ordinary units, which the kernel tests check).
fn typed_matmul_table<R: Runtime>(client: &ComputeClient<R>) {
    const TYPES: [WeightType; 4] = [WeightType::F16, WeightType::Q8_0, WeightType::Q4_K, WeightType::Q6_K];
    println!("## our fast prefill products by weight type: TFLOP/s\n");
    if cleave_shaders::default_precision(client) != Precision::Fast {
        println!("(not run: the device has no matrix units)\n");
        return;
    }
    let names: Vec<String> = TYPES.iter().map(|ty| ty.to_string()).collect();
    println!("| m × n × k | {} |", names.join(" | "));
    println!("| --- |{}", " ---: |".repeat(names.len()));
    let mut notes = Vec::new();
    for (m, n, k) in PREFILL_MATMULS {
        let values = data(m * k, 1);
        let x = Tensor::from_f32(client, &values, &[m, k]);
        let x16 = Tensor::from_f32(client, &f16_values(values), &[m, k]);
        let flops = 2.0 * (m * n * k) as f64;
        let cells: Vec<String> = TYPES
            .iter()
            .map(|&ty| {
                let w = Weight::upload(client, &random_blocks(ty, n, k), ty, n, k).expect("upload");
                // The exact product of the values the matrix units take.
                let rounded = cleave_shaders::dequantize_rows(client, &w, 0..n)
                    .and_then(|w32| w32.to_vec(client))
                    .map(|w32| Tensor::from_f32(client, &f16_values(w32), &[n, k]));
                let expected = rounded
                    .and_then(|w16| cleave_shaders::matmul(client, &x16, &w16))
                    .and_then(|out| out.to_vec(client))
                    .expect("the exact product");
                let out = poisoned(client, &[m, n]);
                cleave_shaders::set_precision(Some(Precision::Fast));
                let cell = checked_time(client, &out, &expected, || {
                    let epilogue = cleave_shaders::Epilogue::default();
                    cleave_shaders::matmul_weight_into(client, &x, &w, &out, 0, epilogue).map_err(|e| e.to_string())
                });
                cleave_shaders::set_precision(None);
                match cell {
                    Cell::Time { ms, diff } => format!("{:.1} (Δ {diff:.1e})", flops / (ms * 1e-3) / 1e12),
                    failed => failed.text(&mut notes),
                }
            })
            .collect();
        println!("| {m} × {n} × {k} | {} |", cells.join(" | "));
    }
    print_notes(&notes);
}

/// `[rows, cols]` of random valid `ty` blocks (every byte random, each
/// block's f16 scales set to 1/64), or f16 values.
fn random_blocks(ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let scale = half::f16::from_f32(1.0 / 64.0).to_le_bytes();
    if ty == WeightType::F16 {
        return data(rows * cols, 3)
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
    }
    let len = rows * ty.row_bytes(cols).expect("whole blocks");
    let mut bytes: Vec<u8> = data(len, 3).iter().map(|&v| (v * 128.0 + 128.0) as u8).collect();
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &at in ty.traits().scale_offsets {
            block[at..at + 2].copy_from_slice(&scale);
        }
    }
    bytes
}

/// `values` rounded to f16 and back.
fn f16_values(values: Vec<f32>) -> Vec<f32> {
    values.into_iter().map(|v| half::f16::from_f32(v).to_f32()).collect()
}

/// Launches cubek's matmul of bf16 `x: [m, k]` by bf16 `w: [n, k]` into
/// f32 `out: [m, n]`, accumulating in f32.
fn cubek_half_matmul<R: Runtime>(
    client: &ComputeClient<R>,
    strategy: &Strategy,
    (x, w): (&Handle, &Handle),
    (m, n, k): (usize, usize, usize),
    out: &Tensor,
) -> Result<(), String> {
    let bf16 = half::bf16::as_type_native_unchecked().storage_type();
    let lhs = InputBinding::new(binding(x, &[m, k], &[k, 1]), bf16);
    let rhs = InputBinding::new(binding(w, &[k, n], &[1, k]), bf16);
    let out = binding(&out.handle, &[m, n], &[n, 1]);
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: bf16,
        rhs: bf16,
        out: f32_storage(),
    });
    cubek_matmul::launch::launch_ref(strategy, client, lhs, rhs, out, &mut dtypes).map_err(|e| format!("{e:?}"))
}

fn conv_table<R: Runtime>(client: &ComputeClient<R>) {
    let strategies = [
        ("simple sync cyclic, cmma", AcceleratedTileKind::Cmma),
        ("simple sync cyclic, mma", AcceleratedTileKind::Mma),
    ];
    let c = CONV_CHANNELS;
    println!("## conv2d 3×3, {c} → {c} channels, stride 1, padding 1\n");
    println!(
        "| map | ours | ours, bf16 at fast | {} |",
        strategies.map(|(name, _)| name).join(" | ")
    );
    println!("| --- | ---: | ---:{} |", " | ---:".repeat(strategies.len()));
    let mut notes = Vec::new();
    for side in CONV_SIDES {
        let pixels = side * side;
        // Values bf16 holds, so that a bf16 convolution rounds nothing
        // and is held to the same tolerance.
        let x = bf16_values(data(c * pixels, 3));
        let weight = bf16_values(data(c * c * 9, 4));
        let bias = data(c, 5);
        let x_t = Tensor::from_f32(client, &x, &[c, side, side]);
        let weight_t = Weight::from_tensor(Tensor::from_f32(client, &weight, &[c, c * 9]));
        let bias_t = Tensor::from_f32(client, &bias, &[c]);
        let ours = cleave_shaders::conv2d(client, &x_t, &weight_t, 3, &bias_t).expect("our conv2d");
        let ours = ours.to_vec(client).expect("read our conv2d");
        // Ours is `[out, h, w]`; cubek's is `[h, w, out]`.
        let expected = transpose(&ours, c, pixels);
        let ours_ms = time_ms(client, || {
            cleave_shaders::conv2d(client, &x_t, &weight_t, 3, &bias_t).expect("our conv2d");
        });
        // Ours at `fast` by a bf16 weight: on the matrix units where the
        // device has them, else the implicit GEMM over the rounded map.
        let bf16_bytes: Vec<u8> = weight
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let weight16 = Weight::upload(client, &bf16_bytes, WeightType::BF16, c, c * 9).expect("a bf16 weight");
        cleave_shaders::set_precision(Some(Precision::Fast));
        let fast = || cleave_shaders::conv2d(client, &x_t, &weight16, 3, &bias_t).expect("our conv2d at fast");
        let fast_diff = relative_diff(&fast().to_vec(client).expect("read our conv2d"), &ours);
        let fast_ms = time_ms(client, || {
            fast();
        });
        cleave_shaders::set_precision(None);
        // cubek wants channels last (NHWC input, `[out, kh, kw, in]`
        // weight) and would copy anything else inside its call; the
        // conversion is done here, once, so that only its kernel is timed.
        let input = Tensor::from_f32(client, &transpose(&x, c, pixels), &[1, side, side, c]);
        let kernel = Tensor::from_f32(client, &weight_channels_last(&weight, c, c, 9), &[c, 3, 3, c]);
        let cells: Vec<String> = strategies
            .iter()
            .map(|&(_, tile_kind)| {
                let out = poisoned(client, &[1, side, side, c]);
                let cell = checked_time(client, &out, &expected, || {
                    cubek_conv(client, tile_kind, &input, &kernel, &bias_t, &out)
                });
                cell.text(&mut notes)
            })
            .collect();
        println!(
            "| {side}×{side} | {ours_ms:.2} | {fast_ms:.2} (Δ {fast_diff:.1e}) | {} |",
            cells.join(" | ")
        );
    }
    print_notes(&notes);
}

/// Launches cubek's 3×3, stride 1, padding 1 convolution of the NHWC
/// `input` by the `[out, 3, 3, in]` `kernel` plus `bias` into NHWC `out`.
fn cubek_conv<R: Runtime>(
    client: &ComputeClient<R>,
    tile_kind: AcceleratedTileKind,
    input: &Tensor,
    kernel: &Tensor,
    bias: &Tensor,
    out: &Tensor,
) -> Result<(), String> {
    let strategy = cubek_convolution::Strategy::Inferred {
        algorithm: ConvAlgorithm::SimpleSyncCyclic,
        tile_kind,
    };
    let inputs = ConvolutionInputs::Forward {
        input: InputBinding::new(contiguous(&input.handle, &input.shape), f32_storage()),
        weight: InputBinding::new(contiguous(&kernel.handle, &kernel.shape), f32_storage()),
        bias: Some(InputBinding::new(contiguous(&bias.handle, &bias.shape), f32_storage())),
        out: contiguous(&out.handle, &out.shape),
    };
    let args = ConvolutionArgs {
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
    };
    let dtypes = MatmulElems::from_single_dtype(f32::as_type_native_unchecked());
    cubek_convolution::launch_ref(&strategy, client, inputs, args, dtypes).map_err(|e| format!("{e:?}"))
}

fn attention_table<R: Runtime>(client: &ComputeClient<R>) {
    let strategies = [
        (
            "unit",
            cubek_attention::launch::Strategy::Unit(cubek_attention::launch::BlueprintStrategy::Inferred(())),
        ),
        (
            "blackbox accelerated",
            cubek_attention::launch::Strategy::BlackboxAccelerated(
                cubek_attention::launch::BlueprintStrategy::Inferred(BlackboxAcceleratedStrategy {
                    num_planes: 1,
                    seq_q: 1,
                    seq_kv: 1,
                }),
            ),
        ),
    ];
    println!("## attention, 1 head of {HEAD_DIM}, every query row sees every key\n");
    println!(
        "| tokens | ours | ours, bf16 at fast | {} |",
        strategies.clone().map(|(name, _)| name).join(" | ")
    );
    println!("| --- | ---: | ---:{} |", " | ---:".repeat(strategies.len()));
    let mut notes = Vec::new();
    for tokens in ATTENTION_TOKENS {
        // Values bf16 holds, so that only the probabilities round at fast.
        let [q, k, v] = [6, 7, 8].map(|seed| {
            let values = bf16_values(data(tokens * HEAD_DIM, seed));
            Tensor::from_f32(client, &values, &[tokens, HEAD_DIM])
        });
        let ranges = KeyRanges::new(client, &vec![(0, tokens as u32); tokens]);
        let shape = AttentionShape::new(1, 1, HEAD_DIM);
        let ours = cleave_shaders::attention(client, &q, &k, &v, shape, &ranges, None).expect("our attention");
        let expected = ours.to_vec(client).expect("read our attention");
        let ours_ms = time_ms(client, || {
            cleave_shaders::attention(client, &q, &k, &v, shape, &ranges, None).expect("our attention");
        });
        // Ours at `fast` for a bf16 model: one launch of `attention_tiles`,
        // on the matrix units where the device has them.
        let bf16 = shape.rounding_like(WeightType::BF16);
        cleave_shaders::set_precision(Some(Precision::Fast));
        let fast = || cleave_shaders::attention(client, &q, &k, &v, bf16, &ranges, None).expect("our fast attention");
        let fast_diff = relative_diff(&fast().to_vec(client).expect("read our attention"), &expected);
        let fast_ms = time_ms(client, || {
            fast();
        });
        cleave_shaders::set_precision(None);
        let cells: Vec<String> = strategies
            .iter()
            .map(|(_, strategy)| {
                let out = poisoned(client, &[tokens, HEAD_DIM]);
                let cell = checked_time(client, &out, &expected, || {
                    cubek_attention(client, strategy.clone(), [&q, &k, &v], &out)
                });
                cell.text(&mut notes)
            })
            .collect();
        println!(
            "| {tokens} | {ours_ms:.2} | {fast_ms:.2} (Δ {fast_diff:.1e}) | {} |",
            cells.join(" | ")
        );
    }
    print_notes(&notes);
}

/// Launches cubek's attention of `[q, k, v]`, each `[tokens, head_dim]`
/// (one head), into `out`, unmasked.
fn cubek_attention<R: Runtime>(
    client: &ComputeClient<R>,
    strategy: cubek_attention::launch::Strategy,
    qkv: [&Tensor; 3],
    out: &Tensor,
) -> Result<(), String> {
    // Its unit routine stages q, k, v and the probabilities in f16 (cubek
    // hard-codes that), accumulating in f32: AttentionOptions' default.
    // `[tokens, head_dim]` is cubek's `[batch, heads, tokens, head_dim]`
    // with one batch and one head: the same bytes.
    let heads_view = |t: &Tensor| contiguous(&t.handle, &[1, 1, t.shape[0], t.shape[1]]);
    let [q, k, v] = qkv.map(heads_view);
    let dtypes = AttentionGlobalTypes::from_single_float_dtype(
        f32::as_type_native_unchecked(),
        AttentionGlobalTypes::mask_dtype(client),
    );
    cubek_attention::launch::launch_ref(
        strategy,
        client,
        q,
        k,
        v,
        None,
        heads_view(out),
        &dtypes,
        AttentionOptions::default(),
    )
    .map_err(|e| format!("{e:?}"))
}

/// Launches `launch` once (compiling it), checks what it wrote to `out`
/// against `expected`, and only then times it: a wrong launch is reported,
/// not timed. A panic inside cubek is reported like an error.
fn checked_time<R: Runtime>(
    client: &ComputeClient<R>,
    out: &Tensor,
    expected: &[f32],
    launch: impl Fn() -> Result<(), String>,
) -> Cell {
    if let Err(why) = guarded(&launch) {
        return Cell::Failed(why);
    }
    let got = match out.to_vec(client) {
        Ok(got) => got,
        Err(e) => return Cell::Failed(format!("reading the result: {e}")),
    };
    let diff = relative_diff(&got, expected);
    if diff.is_nan() || diff > TOLERANCE {
        return Cell::Failed(format!(
            "wrong result: largest difference {diff:.2e} of our largest magnitude"
        ));
    }
    let ms = time_ms(client, || {
        launch().expect("it launched before");
    });
    Cell::Time { ms, diff }
}

/// `launch`'s error, or its panic's message.
fn guarded(launch: &impl Fn() -> Result<(), String>) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(launch)) {
        Ok(result) => result,
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .map_or_else(|| "panicked".to_string(), |message| format!("panicked: {message}"))),
    }
}

/// Median milliseconds of RUNS calls of `launch` after one warm-up call.
/// Launches are queued, so each call is waited for with a device sync.
fn time_ms<R: Runtime>(client: &ComputeClient<R>, mut launch: impl FnMut()) -> f64 {
    launch();
    sync(client);
    let mut ms: Vec<f64> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            launch();
            sync(client);
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[RUNS / 2]
}

fn sync<R: Runtime>(client: &ComputeClient<R>) {
    cleave_shaders::cubecl::future::block_on(client.sync()).expect("device sync");
}

fn print_notes(notes: &[String]) {
    println!();
    for (i, note) in notes.iter().enumerate() {
        // One line each, so that a multi-line error keeps the list readable.
        println!("[{}] {}", i + 1, note.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    if !notes.is_empty() {
        println!();
    }
}

/// An output filled with NaN, so that a launch that writes nothing (or
/// only part of it) fails the check instead of passing on what an earlier
/// strategy left in a reused buffer.
fn poisoned<R: Runtime>(client: &ComputeClient<R>, shape: &[usize]) -> Tensor {
    Tensor::from_f32(client, &vec![f32::NAN; shape.iter().product()], shape)
}

/// A binding of `handle` as a tensor of `shape` with the given strides.
fn binding<R: Runtime>(handle: &Handle, shape: &[usize], strides: &[usize]) -> TensorBinding<R> {
    TensorBinding {
        handle: handle.clone().binding(),
        shape: shape.into(),
        strides: strides.into(),
        runtime: PhantomData,
    }
}

/// A binding of `handle` as a row-major tensor of `shape`.
fn contiguous<R: Runtime>(handle: &Handle, shape: &[usize]) -> TensorBinding<R> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    binding(handle, shape, &strides)
}

fn f32_storage() -> cleave_shaders::cubecl::ir::StorageType {
    f32::as_type_native_unchecked().storage_type()
}

/// `len` values in [-1, 1) from a fixed seed (a 64-bit LCG's top bits), so
/// every run multiplies the same numbers.
fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `values` rounded to bf16 and back.
fn bf16_values(values: Vec<f32>) -> Vec<f32> {
    values.into_iter().map(|v| half::bf16::from_f32(v).to_f32()).collect()
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols * rows).map(|i| x[(i % rows) * cols + i / rows]).collect()
}

/// `[out, in, taps]` → `[out, taps, in]`: PyTorch's conv weight with its
/// input channels moved last.
fn weight_channels_last(weight: &[f32], out: usize, inp: usize, taps: usize) -> Vec<f32> {
    (0..out)
        .flat_map(|o| transpose(&weight[o * inp * taps..(o + 1) * inp * taps], inp, taps))
        .collect()
}

fn relative_diff(got: &[f32], expected: &[f32]) -> f32 {
    if got.len() != expected.len() {
        return f32::NAN;
    }
    let scale = expected.iter().fold(0f32, |m, e| m.max(e.abs())).max(f32::MIN_POSITIVE);
    let mut diff = 0f32;
    for (g, e) in got.iter().zip(expected) {
        let d = (g - e).abs();
        // `max` would drop a NaN.
        if d.is_nan() {
            return f32::NAN;
        }
        diff = diff.max(d);
    }
    diff / scale
}
