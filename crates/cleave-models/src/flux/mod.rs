//! FLUX.1's transformer (diffusers' `FluxTransformer2DModel`), module
//! `diffusion`: the packed latents and the T5 states are embedded
//! (`x_embedder`, `context_embedder`), the timestep, guidance and CLIP's
//! pooled vector become one conditioning vector `temb`
//! (`time_text_embed`); then double-stream blocks (image and text each
//! with their own weights, one joint attention over [txt; img]) and
//! single-stream blocks (one set of weights over the joint sequence,
//! attention and MLP in parallel), every norm modulated by `temb`
//! (`AdaLayerNormZero`); `norm_out` (`AdaLayerNormContinuous`) and
//! `proj_out` give the noise prediction of the image tokens.
//!
//! Positions are 3-axis ids per token; the rotary table (interleaved
//! pairs) is computed on the host in f64 as diffusers does and uploaded
//! once per forward to each device that runs blocks.

use std::path::Path;

use cleave_hf::{read_json, Checkpoint, Validator};
use cleave_nn::{Bias, Linear, Loader, ModelError, PerDevice, Placed, Placement, Result, Weights};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    activate, add_assign, add_gated, attention, copy_columns, copy_rows, layer_norm, modulate, rms_norm, rope_pairs,
    Activation, AttentionShape, KeyRanges, Tensor, WeightType,
};
use serde::Deserialize;

/// Channels of the sinusoidal timestep (and guidance) projection.
const TIME_CHANNELS: usize = 256;
/// `FluxPosEmbed`'s theta.
const ROPE_THETA: f64 = 10_000.0;
/// Every LayerNorm and q/k RMSNorm of the model.
const NORM_EPS: f32 = 1e-6;
/// The MLPs' hidden width over the model width.
const MLP_RATIO: usize = 4;

#[derive(Deserialize)]
struct RawFluxConfig {
    patch_size: Option<usize>,
    in_channels: Option<usize>,
    out_channels: Option<usize>,
    num_layers: Option<usize>,
    num_single_layers: Option<usize>,
    attention_head_dim: Option<usize>,
    num_attention_heads: Option<usize>,
    joint_attention_dim: Option<usize>,
    pooled_projection_dim: Option<usize>,
    guidance_embeds: Option<bool>,
    axes_dims_rope: Option<Vec<usize>>,
}

/// A validated `FluxTransformer2DModel` config.
#[derive(Clone, Debug)]
pub struct FluxConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub joint_attention_dim: usize,
    pub pooled_projection_dim: usize,
    pub guidance_embeds: bool,
    pub double_layers: usize,
    pub single_layers: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Rotary dimensions per position axis; they sum to `head_dim`.
    pub axes_dims_rope: Vec<usize>,
}

impl FluxConfig {
    pub fn from_file(path: &Path) -> cleave_hf::Result<Self> {
        let raw: RawFluxConfig = read_json(path)?;
        let check = Validator { path };
        let error = |field: &'static str, reason: String| check.error(field, reason);
        let positive = |value: Option<usize>, field: &'static str| check.positive(value, field);
        let patch_size = positive(raw.patch_size.or(Some(1)), "patch_size")?;
        if patch_size != 1 {
            return Err(error(
                "patch_size",
                format!("{patch_size} is not supported (FLUX.1 packs 2x2 patches on the host: 1)"),
            ));
        }
        let in_channels = positive(raw.in_channels, "in_channels")?;
        let head_dim = positive(raw.attention_head_dim, "attention_head_dim")?;
        let axes_dims_rope = raw
            .axes_dims_rope
            .ok_or_else(|| error("axes_dims_rope", "missing".into()))?;
        if axes_dims_rope.len() != 3 || axes_dims_rope.iter().any(|d| d % 2 != 0) {
            return Err(error(
                "axes_dims_rope",
                format!("{axes_dims_rope:?}: expected three axes (FLUX's ids), each an even number of dimensions"),
            ));
        }
        if axes_dims_rope.iter().sum::<usize>() != head_dim {
            return Err(error(
                "axes_dims_rope",
                format!("{axes_dims_rope:?} must sum to attention_head_dim ({head_dim})"),
            ));
        }
        Ok(FluxConfig {
            in_channels,
            // diffusers: `out_channels or in_channels`.
            out_channels: raw.out_channels.filter(|&n| n > 0).unwrap_or(in_channels),
            joint_attention_dim: positive(raw.joint_attention_dim, "joint_attention_dim")?,
            pooled_projection_dim: positive(raw.pooled_projection_dim, "pooled_projection_dim")?,
            // diffusers' default: FLUX.1-schnell has no guidance embedder.
            guidance_embeds: raw.guidance_embeds.unwrap_or(false),
            double_layers: raw.num_layers.ok_or_else(|| error("num_layers", "missing".into()))?,
            single_layers: raw
                .num_single_layers
                .ok_or_else(|| error("num_single_layers", "missing".into()))?,
            heads: positive(raw.num_attention_heads, "num_attention_heads")?,
            head_dim,
            axes_dims_rope,
        })
    }

    /// The model width.
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }

    fn blocks(&self) -> usize {
        self.double_layers + self.single_layers
    }

    /// What the planner needs to place the `diffusion` module for `tokens`
    /// text and image tokens: the checkpoint's own tensors, matrices in
    /// their stored type (f32, f16 or bf16) and vectors in f32, as the
    /// loader puts them on a device.
    pub fn inventory(&self, checkpoint: &Checkpoint, tokens: usize) -> cleave_plan::Inventory {
        let (d, hd) = (self.inner(), self.head_dim);
        let mlp = MLP_RATIO * d;
        let bytes = |names: &[&str]| {
            names
                .iter()
                .map(|n| checkpoint.device_bytes(n))
                .fold(0, u64::saturating_add)
        };
        let guidance: &[&str] = if self.guidance_embeds {
            &["time_text_embed.guidance_embedder"]
        } else {
            &[]
        };
        let head = bytes(&[
            "x_embedder",
            "context_embedder",
            "time_text_embed.timestep_embedder",
            "time_text_embed.text_embedder",
        ]) + bytes(guidance);
        let blocks = (0..self.double_layers)
            .map(|l| bytes(&[&format!("transformer_blocks.{l}")]))
            .chain((0..self.single_layers).map(|l| bytes(&[&format!("single_transformer_blocks.{l}")])))
            .collect();
        // The streams, normed, q/k/v, attention and its concatenation, the
        // MLP; the rope tables. Attention writes no scores.
        let compute = tokens * (8 * d + 2 * mlp) + tokens * hd;
        cleave_plan::Inventory {
            module: "diffusion".into(),
            head_bytes: head,
            block_bytes: blocks,
            tail_bytes: bytes(&["norm_out", "proj_out"]),
            tail_shared_with_head: 0,
            cache_bytes: Vec::new(),
            compute_bytes: (compute * size_of::<f32>()) as u64,
            geometry: None,
        }
    }
}

/// One call of the transformer (batch 1).
pub struct FluxInput<'a> {
    /// `[n_img, in_channels]`, packed latents.
    pub img: &'a [f32],
    pub img_ids: &'a [[f32; 3]],
    /// `[n_txt, joint_attention_dim]`, T5 output.
    pub txt: &'a [f32],
    pub txt_ids: &'a [[f32; 3]],
    /// `[pooled_projection_dim]`, CLIP pooled.
    pub pooled: &'a [f32],
    /// Already divided by 1000 (the model multiplies by 1000 inside).
    pub timestep: f32,
    /// The guidance scale (the model multiplies by 1000 inside, as diffusers does).
    pub guidance: Option<f32>,
}

/// `TimestepEmbedding` (linear, SiLU, linear) or `PixArtAlphaTextProjection`
/// with `act_fn="silu"`: the same shape of MLP.
struct SiluMlp {
    linear_1: Linear,
    linear_2: Linear,
}

impl SiluMlp {
    fn load<R: Runtime>(w: Weights<R>, inp: usize, d: usize) -> Result<Self> {
        Ok(SiluMlp {
            linear_1: w.linear("linear_1", d, inp, Bias::Yes)?,
            linear_2: w.linear("linear_2", d, d, Bias::Yes)?,
        })
    }

    fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        let hidden = self.linear_1.forward(client, x)?;
        activate(client, &hidden, Activation::Silu)?;
        self.linear_2.forward(client, &hidden)
    }
}

/// `CombinedTimestepGuidanceTextProjEmbeddings` (or without guidance).
struct TimeTextEmbed {
    timestep_embedder: SiluMlp,
    guidance_embedder: Option<SiluMlp>,
    text_embedder: SiluMlp,
}

/// The rows of `linear` cut into `n` equal chunks, one `Linear` each: the
/// shift/scale/gate vectors of an adaptive norm's `linear`, in the order
/// diffusers' `chunk` gives them.
fn chunks<R: Runtime>(w: &Weights<R>, linear: &str, n: usize, d: usize) -> Result<Vec<Linear>> {
    (0..n)
        .map(|i| w.linear_rows(linear, n * d, d, Bias::Yes, i * d..(i + 1) * d))
        .collect()
}

/// Each chunk applied to `silu(temb)`: one `[1, d]` vector each.
fn modulation<R: Runtime>(client: &ComputeClient<R>, chunks: &[Linear], silu_temb: &Tensor) -> Result<Vec<Tensor>> {
    chunks.iter().map(|c| c.forward(client, silu_temb)).collect()
}

/// One stream of a double block: its adaptive norm, q/k/v with their
/// per-head RMS norms, the attention's output projection and the MLP.
struct Stream {
    /// shift, scale, gate (attention), shift, scale, gate (MLP).
    norm1: Vec<Linear>,
    q: Linear,
    k: Linear,
    v: Linear,
    norm_q: Tensor,
    norm_k: Tensor,
    out: Linear,
    ff_up: Linear,
    ff_down: Linear,
}

/// The checkpoint names of one stream's layers inside a double block.
struct StreamNames {
    norm1: &'static str,
    q: &'static str,
    k: &'static str,
    v: &'static str,
    norm_q: &'static str,
    norm_k: &'static str,
    out: &'static str,
    ff: &'static str,
}

const IMAGE_STREAM: StreamNames = StreamNames {
    norm1: "norm1",
    q: "attn.to_q",
    k: "attn.to_k",
    v: "attn.to_v",
    norm_q: "attn.norm_q",
    norm_k: "attn.norm_k",
    out: "attn.to_out.0",
    ff: "ff",
};

const TEXT_STREAM: StreamNames = StreamNames {
    norm1: "norm1_context",
    q: "attn.add_q_proj",
    k: "attn.add_k_proj",
    v: "attn.add_v_proj",
    norm_q: "attn.norm_added_q",
    norm_k: "attn.norm_added_k",
    out: "attn.to_add_out",
    ff: "ff_context",
};

/// `FluxTransformerBlock`.
struct DoubleBlock {
    img: Stream,
    txt: Stream,
}

/// `FluxSingleTransformerBlock`.
struct SingleBlock {
    /// shift, scale, gate.
    norm: Vec<Linear>,
    q: Linear,
    k: Linear,
    v: Linear,
    norm_q: Tensor,
    norm_k: Tensor,
    proj_mlp: Linear,
    proj_out: Linear,
}

/// What every block on one device reads: `silu(temb)`, the rope tables of
/// the joint sequence, the all-visible key ranges and the no-affine
/// LayerNorm's ones and zeros.
struct OnDevice {
    silu_temb: Tensor,
    cos: Tensor,
    sin: Tensor,
    ranges: KeyRanges,
    ones: Tensor,
    zeros: Tensor,
    /// The most token rows the MLPs take at a time: few enough that their
    /// widest activations (a single block's `[rows, inner + mlp]`) fit one
    /// buffer, which a 1024x1024 image's 4,608 tokens would pass.
    mlp_rows: usize,
}

/// FLUX.1's transformer on a device group, split by layers as its plan says.
pub struct FluxTransformer<R: Runtime> {
    placement: Placement<R>,
    config: FluxConfig,
    x_embedder: Linear,
    context_embedder: Linear,
    time_text_embed: TimeTextEmbed,
    /// Blocks `0..double_layers` of the plan.
    transformer_blocks: Vec<DoubleBlock>,
    /// Blocks `double_layers..` of the plan.
    single_transformer_blocks: Vec<SingleBlock>,
    /// scale, shift (`AdaLayerNormContinuous` chunks scale first).
    norm_out: Vec<Linear>,
    proj_out: Linear,
    /// The most token rows the MLPs take at a time where asked for fewer
    /// than one buffer holds.
    mlp_rows: Option<usize>,
}

cleave_nn::placed_model!(FluxTransformer);

impl<R: Runtime> FluxTransformer<R> {
    pub fn load(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &FluxConfig,
        checkpoint: &Checkpoint,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self> {
        let c = config;
        let (d, hd) = (c.inner(), c.head_dim);
        let mlp = MLP_RATIO * d;
        let loader = Loader::new(&devices, checkpoint, progress);
        let root = loader.weights(plan.head_device());
        let x_embedder = root.linear("x_embedder", d, c.in_channels, Bias::Yes)?;
        let context_embedder = root.linear("context_embedder", d, c.joint_attention_dim, Bias::Yes)?;
        let tt = root.pp("time_text_embed");
        let time_text_embed = TimeTextEmbed {
            timestep_embedder: SiluMlp::load(tt.pp("timestep_embedder"), TIME_CHANNELS, d)?,
            guidance_embedder: c
                .guidance_embeds
                .then(|| SiluMlp::load(tt.pp("guidance_embedder"), TIME_CHANNELS, d))
                .transpose()?,
            text_embedder: SiluMlp::load(tt.pp("text_embedder"), c.pooled_projection_dim, d)?,
        };
        let transformer_blocks = (0..c.double_layers)
            .map(|l| {
                let w = root.pp("transformer_blocks").pp(l).on(plan.device_of_block(l));
                Ok(DoubleBlock {
                    img: Stream::load(&w, &IMAGE_STREAM, c)?,
                    txt: Stream::load(&w, &TEXT_STREAM, c)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let single_transformer_blocks = (0..c.single_layers)
            .map(|l| {
                let w = root
                    .pp("single_transformer_blocks")
                    .pp(l)
                    .on(plan.device_of_block(c.double_layers + l));
                let attn = w.pp("attn");
                Ok(SingleBlock {
                    norm: chunks(&w, "norm.linear", 3, d)?,
                    q: attn.linear("to_q", d, d, Bias::Yes)?,
                    k: attn.linear("to_k", d, d, Bias::Yes)?,
                    v: attn.linear("to_v", d, d, Bias::Yes)?,
                    norm_q: attn.vector("norm_q.weight", hd)?,
                    norm_k: attn.vector("norm_k.weight", hd)?,
                    proj_mlp: w.linear("proj_mlp", mlp, d, Bias::Yes)?,
                    proj_out: w.linear("proj_out", d, d + mlp, Bias::Yes)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let tail = root.on(plan.tail_device());
        let norm_out = chunks(&tail, "norm_out.linear", 2, d)?;
        let proj_out = tail.linear("proj_out", c.out_channels, d, Bias::Yes)?;
        Ok(FluxTransformer {
            placement: Placement::new(devices, plan),
            config: c.clone(),
            x_embedder,
            context_embedder,
            time_text_embed,
            transformer_blocks,
            single_transformer_blocks,
            norm_out,
            proj_out,
            mlp_rows: None,
        })
    }

    /// Runs the MLPs over at most `rows` token rows at a time (at least
    /// one), fewer than a buffer's limit asks for: smaller activations, as
    /// llama.cpp's `--ubatch-size` gives, for the same result.
    pub fn limit_mlp_rows(&mut self, rows: usize) {
        self.mlp_rows = Some(rows.max(1));
    }

    /// The noise prediction `[n_img, out_channels]`.
    pub fn forward(&self, input: &FluxInput) -> Result<Vec<f32>> {
        self.run(input, &mut Trace(None))
    }

    /// [`FluxTransformer::forward`], reporting named intermediates on the
    /// way (`x_embedder`, `context_embedder`, `temb`, `rope_cos`,
    /// `rope_sin`, `double{i}.{txt,img}`, `single{i}.{txt,img}`,
    /// `norm_out`), as diffusers' reference dump names them.
    #[doc(hidden)]
    pub fn forward_traced(&self, input: &FluxInput, trace: &mut dyn FnMut(&str, Vec<f32>)) -> Result<Vec<f32>> {
        self.run(input, &mut Trace(Some(trace)))
    }

    fn check_input(&self, input: &FluxInput) -> Result<()> {
        let c = &self.config;
        let (n_img, n_txt) = (input.img_ids.len(), input.txt_ids.len());
        let lengths = [
            (
                "img",
                input.img.len(),
                n_img * c.in_channels,
                "img_ids.len() × in_channels",
            ),
            (
                "txt",
                input.txt.len(),
                n_txt * c.joint_attention_dim,
                "txt_ids.len() × joint_attention_dim",
            ),
            (
                "pooled",
                input.pooled.len(),
                c.pooled_projection_dim,
                "pooled_projection_dim",
            ),
        ];
        for (what, got, want, rule) in lengths {
            if got != want {
                return Err(ModelError::Input(format!(
                    "{what} has {got} values, expected {want} ({rule})"
                )));
            }
        }
        if n_img == 0 {
            return Err(ModelError::Input("no image tokens".into()));
        }
        match (input.guidance, c.guidance_embeds) {
            (None, true) => Err(ModelError::Input(
                "this transformer embeds a guidance scale (guidance_embeds), but none was given".into(),
            )),
            (Some(_), false) => Err(ModelError::Input(
                "a guidance scale was given, but this transformer has no guidance embedder".into(),
            )),
            _ => Ok(()),
        }
    }

    fn run(&self, input: &FluxInput, trace: &mut Trace) -> Result<Vec<f32>> {
        self.check_input(input)?;
        let c = &self.config;
        let d = c.inner();
        let (placement, plan) = (&self.placement, self.placement.plan());
        let (n_img, n_txt) = (input.img_ids.len(), input.txt_ids.len());
        let tokens = n_txt + n_img;

        // Head: embeddings and the conditioning vector.
        let client = placement.client(plan.head_device());
        let img = self
            .x_embedder
            .forward(client, &Tensor::from_f32(client, input.img, &[n_img, c.in_channels]))?;
        trace.tensor("x_embedder", client, &img)?;
        let txt = self.context_embedder.forward(
            client,
            &Tensor::from_f32(client, input.txt, &[n_txt, c.joint_attention_dim]),
        )?;
        trace.tensor("context_embedder", client, &txt)?;
        let silu_temb = self.time_text_embed.forward(client, input)?;
        trace.tensor("temb", client, &silu_temb)?;
        // Every adaptive norm takes `silu(temb)`, nothing `temb` itself.
        activate(client, &silu_temb, Activation::Silu)?;

        let ids: Vec<[f32; 3]> = input.txt_ids.iter().chain(input.img_ids).copied().collect();
        let (cos, sin) = rope_table(&c.axes_dims_rope, &ids);
        trace.host("rope_cos", cos.iter().flat_map(|&v| [v, v]).collect());
        trace.host("rope_sin", sin.iter().flat_map(|&v| [v, v]).collect());
        let half = c.head_dim / 2;
        let upload = |device: usize| {
            let client = placement.client(device);
            OnDevice {
                silu_temb: placement.copy_to(&silu_temb, plan.head_device(), device),
                cos: Tensor::from_f32(client, &cos, &[tokens, half]),
                sin: Tensor::from_f32(client, &sin, &[tokens, half]),
                ranges: KeyRanges::new(client, &vec![(0, tokens as u32); tokens]),
                ones: Tensor::from_f32(client, &vec![1.0; d], &[d]),
                zeros: Tensor::from_f32(client, &vec![0.0; d], &[d]),
                mlp_rows: (placement.max_buffer() / ((d + MLP_RATIO * d) * size_of::<f32>()))
                    .min(self.mlp_rows.unwrap_or(usize::MAX))
                    .max(1),
            }
        };

        let on_device = PerDevice::new(placement, |device| Ok(upload(device)));
        let ((_, img), mut here) = placement.run_blocks((txt, img), c.blocks(), |l, device, (txt, img)| {
            let client = placement.client(device);
            let on_device = on_device.get(device)?;
            let (name, txt, img) = if let Some(block) = self.transformer_blocks.get(l) {
                block.forward(client, c, &txt, &img, on_device)?;
                (format!("double{l}"), txt, img)
            } else {
                let s = l - c.double_layers;
                let (txt, img) = self.single_transformer_blocks[s].forward(client, c, &txt, &img, on_device)?;
                (format!("single{s}"), txt, img)
            };
            trace.tensor(&format!("{name}.txt"), client, &txt)?;
            trace.tensor(&format!("{name}.img"), client, &img)?;
            Ok((txt, img))
        })?;

        // Tail: the image tokens only.
        let img = placement.hand_over(img, &mut here, plan.tail_device());
        let on_device = on_device.get(here)?;
        let client = placement.client(here);
        let [scale, shift] = &modulation(client, &self.norm_out, &on_device.silu_temb)?[..] else {
            unreachable!("norm_out is loaded as two chunks")
        };
        let normed = modulate(client, &norm(client, &img, on_device)?, shift, scale)?;
        trace.tensor("norm_out", client, &normed)?;
        Ok(self.proj_out.forward(client, &normed)?.to_vec(client)?)
    }
}

impl TimeTextEmbed {
    /// `temb: [1, d]` from the timestep, the guidance and the pooled vector;
    /// both scalars are multiplied by 1000 in f32 first, as diffusers does.
    fn forward<R: Runtime>(&self, client: &ComputeClient<R>, input: &FluxInput) -> Result<Tensor> {
        let sinusoid = |t: f32| Tensor::from_f32(client, &timestep_embedding(t * 1000.0), &[1, TIME_CHANNELS]);
        let temb = self.timestep_embedder.forward(client, &sinusoid(input.timestep))?;
        if let (Some(embedder), Some(guidance)) = (&self.guidance_embedder, input.guidance) {
            add_assign(client, &temb, &embedder.forward(client, &sinusoid(guidance))?)?;
        }
        let pooled = Tensor::from_f32(client, input.pooled, &[1, input.pooled.len()]);
        add_assign(client, &temb, &self.text_embedder.forward(client, &pooled)?)?;
        Ok(temb)
    }
}

/// diffusers' `get_timestep_embedding` with `flip_sin_to_cos=True`,
/// `downscale_freq_shift=0`: `[cos(t·f_i), sin(t·f_i)]` with
/// `f_i = exp(-ln(10000) · i / half)`, every step in f32 as torch takes it
/// (cos, sin and exp rounded from f64, within an ulp of torch's).
fn timestep_embedding(t: f32) -> Vec<f32> {
    let half = TIME_CHANNELS / 2;
    let log_period = -(10_000f64.ln() as f32);
    let angles: Vec<f32> = (0..half)
        .map(|i| {
            let exponent = log_period * i as f32 / half as f32;
            t * ((exponent as f64).exp() as f32)
        })
        .collect();
    let cos = angles.iter().map(|&a| (a as f64).cos() as f32);
    let sin = angles.iter().map(|&a| (a as f64).sin() as f32);
    cos.chain(sin).collect()
}

/// `FluxPosEmbed`: per token, each axis `a` contributes `axes[a] / 2`
/// frequencies `1 / theta^(2j / axes[a])` at position `ids[a]`, in f64
/// (diffusers' `freqs_dtype`), then rounded to f32. Returns `(cos, sin)`,
/// each `[tokens, head_dim / 2]`: one value per rotated pair (diffusers
/// repeats each twice).
fn rope_table(axes: &[usize], ids: &[[f32; 3]]) -> (Vec<f32>, Vec<f32>) {
    debug_assert!(axes.len() <= 3, "the config allows three axes");
    let mut angles = Vec::new();
    for id in ids {
        for (axis, &dim) in axes.iter().enumerate() {
            let pos = id[axis] as f64;
            for j in 0..dim / 2 {
                let freq = 1.0 / ROPE_THETA.powf((2 * j) as f64 / dim as f64);
                angles.push(pos * freq);
            }
        }
    }
    angles.iter().map(|a| (a.cos() as f32, a.sin() as f32)).unzip()
}

/// `[a; b]`: the rows of `a` then those of `b`.
fn concat_rows<R: Runtime>(client: &ComputeClient<R>, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(client, &[a.rows() + b.rows(), a.cols()]);
    copy_rows(client, a, 0, &out, 0, a.rows())?;
    copy_rows(client, b, 0, &out, a.rows(), b.rows())?;
    Ok(out)
}

/// The first `at` rows of `x` and the rest.
fn split_rows<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, at: usize) -> Result<(Tensor, Tensor)> {
    let cols = x.cols();
    let (first, second) = (
        Tensor::empty(client, &[at, cols]),
        Tensor::empty(client, &[x.rows() - at, cols]),
    );
    copy_rows(client, x, 0, &first, 0, at)?;
    copy_rows(client, x, at, &second, 0, x.rows() - at)?;
    Ok((first, second))
}

/// The rows `first..first + count` of `x` (`x` itself when that is all).
fn rows_of<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, first: usize, count: usize) -> Result<Tensor> {
    if first == 0 && count == x.rows() {
        return Ok(x.clone());
    }
    let part = Tensor::empty(client, &[count, x.cols()]);
    copy_rows(client, x, first, &part, 0, count)?;
    Ok(part)
}

/// `f(first, count)` over consecutive chunks of `rows` rows, at most
/// `chunk` each, the outputs' rows gathered in one tensor.
fn in_row_chunks<R: Runtime>(
    client: &ComputeClient<R>,
    rows: usize,
    chunk: usize,
    mut f: impl FnMut(usize, usize) -> Result<Tensor>,
) -> Result<Tensor> {
    if rows <= chunk {
        return f(0, rows);
    }
    let mut gathered: Option<Tensor> = None;
    for first in (0..rows).step_by(chunk) {
        let count = chunk.min(rows - first);
        let part = f(first, count)?;
        let out = gathered.get_or_insert_with(|| Tensor::empty(client, &[rows, part.cols()]));
        copy_rows(client, &part, 0, out, first, count)?;
    }
    Ok(gathered.expect("rows > chunk, so at least one chunk"))
}

/// RMSNorm of each head of `x: [rows, heads · head_dim]`.
fn per_head_rms_norm<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let heads = x.cols() / weight.len();
    let normed = rms_norm(client, &x.reshape(&[x.rows() * heads, weight.len()]), weight, NORM_EPS)?;
    Ok(normed.reshape(&x.shape))
}

/// Joint attention over `q`, `k`, `v: [txt; img]`: rotated, all rows
/// seeing all keys, scaled by `1/sqrt(head_dim)`; at `--precision fast`
/// rounded as the products of the block's weights, of type `weights`.
fn joint_attention<R: Runtime>(
    client: &ComputeClient<R>,
    (c, weights): (&FluxConfig, WeightType),
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    on: &OnDevice,
) -> Result<Tensor> {
    rope_pairs(client, q, &on.cos, &on.sin, c.heads)?;
    rope_pairs(client, k, &on.cos, &on.sin, c.heads)?;
    let shape = AttentionShape::new(c.heads, c.heads, c.head_dim).rounding_like(weights);
    Ok(attention(client, q, k, v, shape, &on.ranges, None)?)
}

/// The no-affine LayerNorm (eps 1e-6) of every adaptive norm.
fn norm<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, on: &OnDevice) -> Result<Tensor> {
    Ok(layer_norm(client, x, &on.ones, &on.zeros, NORM_EPS)?)
}

impl Stream {
    /// One stream of the double block `w`, its layers named by `names`.
    fn load<R: Runtime>(w: &Weights<R>, names: &StreamNames, c: &FluxConfig) -> Result<Self> {
        let (d, hd, mlp) = (c.inner(), c.head_dim, MLP_RATIO * c.inner());
        let ff = w.pp(names.ff);
        Ok(Stream {
            norm1: chunks(&w.pp(names.norm1), "linear", 6, d)?,
            q: w.linear(names.q, d, d, Bias::Yes)?,
            k: w.linear(names.k, d, d, Bias::Yes)?,
            v: w.linear(names.v, d, d, Bias::Yes)?,
            norm_q: w.pp(names.norm_q).vector("weight", hd)?,
            norm_k: w.pp(names.norm_k).vector("weight", hd)?,
            out: w.linear(names.out, d, d, Bias::Yes)?,
            ff_up: ff.linear("net.0.proj", mlp, d, Bias::Yes)?,
            ff_down: ff.linear("net.2", d, mlp, Bias::Yes)?,
        })
    }

    /// q, k, v of the normed and modulated stream, and the five other
    /// modulation vectors.
    fn qkv<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        x: &Tensor,
        on: &OnDevice,
    ) -> Result<([Tensor; 3], Vec<Tensor>)> {
        let m = modulation(client, &self.norm1, &on.silu_temb)?;
        let normed = modulate(client, &norm(client, x, on)?, &m[0], &m[1])?;
        let q = per_head_rms_norm(client, &self.q.forward(client, &normed)?, &self.norm_q)?;
        let k = per_head_rms_norm(client, &self.k.forward(client, &normed)?, &self.norm_k)?;
        let v = self.v.forward(client, &normed)?;
        Ok(([q, k, v], m))
    }

    /// The gated attention residual, then the gated MLP residual, in place.
    fn finish<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        x: &Tensor,
        attended: &Tensor,
        m: &[Tensor],
        on: &OnDevice,
    ) -> Result<()> {
        add_gated(client, x, &self.out.forward(client, attended)?, &m[2])?;
        let normed = modulate(client, &norm(client, x, on)?, &m[3], &m[4])?;
        let mlp_out = in_row_chunks(client, x.rows(), on.mlp_rows, |first, count| {
            let hidden = self.ff_up.forward(client, &rows_of(client, &normed, first, count)?)?;
            activate(client, &hidden, Activation::GeluTanh)?;
            self.ff_down.forward(client, &hidden)
        })?;
        add_gated(client, x, &mlp_out, &m[5])?;
        Ok(())
    }
}

impl DoubleBlock {
    /// Updates both streams in place.
    fn forward<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        c: &FluxConfig,
        txt: &Tensor,
        img: &Tensor,
        on: &OnDevice,
    ) -> Result<()> {
        let ([tq, tk, tv], tm) = self.txt.qkv(client, txt, on)?;
        let ([iq, ik, iv], im) = self.img.qkv(client, img, on)?;
        let (q, k, v) = (
            concat_rows(client, &tq, &iq)?,
            concat_rows(client, &tk, &ik)?,
            concat_rows(client, &tv, &iv)?,
        );
        let weights = self.img.q.weight.weight_type();
        let attended = joint_attention(client, (c, weights), (&q, &k, &v), on)?;
        let (txt_attended, img_attended) = split_rows(client, &attended, txt.rows())?;
        self.img.finish(client, img, &img_attended, &im, on)?;
        self.txt.finish(client, txt, &txt_attended, &tm, on)?;
        Ok(())
    }
}

impl SingleBlock {
    /// The new (txt, img) streams.
    fn forward<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        c: &FluxConfig,
        txt: &Tensor,
        img: &Tensor,
        on: &OnDevice,
    ) -> Result<(Tensor, Tensor)> {
        let d = c.inner();
        let x = concat_rows(client, txt, img)?;
        let m = modulation(client, &self.norm, &on.silu_temb)?;
        let normed = modulate(client, &norm(client, &x, on)?, &m[0], &m[1])?;
        let q = per_head_rms_norm(client, &self.q.forward(client, &normed)?, &self.norm_q)?;
        let k = per_head_rms_norm(client, &self.k.forward(client, &normed)?, &self.norm_k)?;
        let v = self.v.forward(client, &normed)?;
        let weights = self.q.weight.weight_type();
        let attended = joint_attention(client, (c, weights), (&q, &k, &v), on)?;
        // The MLP and the output projection over [attention, MLP] columns.
        let out = in_row_chunks(client, x.rows(), on.mlp_rows, |first, count| {
            let mlp = self
                .proj_mlp
                .forward(client, &rows_of(client, &normed, first, count)?)?;
            activate(client, &mlp, Activation::GeluTanh)?;
            let both = Tensor::empty(client, &[count, d + mlp.cols()]);
            copy_columns(client, &rows_of(client, &attended, first, count)?, &both, 0)?;
            copy_columns(client, &mlp, &both, d)?;
            self.proj_out.forward(client, &both)
        })?;
        add_gated(client, &x, &out, &m[2])?;
        split_rows(client, &x, txt.rows())
    }
}

/// `forward_traced`'s callback: a name and the tensor's values.
type TraceFn<'a> = &'a mut dyn FnMut(&str, Vec<f32>);

/// The optional hook of `forward_traced`.
struct Trace<'a>(Option<TraceFn<'a>>);

impl Trace<'_> {
    fn tensor<R: Runtime>(&mut self, name: &str, client: &ComputeClient<R>, t: &Tensor) -> Result<()> {
        if let Some(f) = self.0.as_mut() {
            f(name, t.to_vec(client)?);
        }
        Ok(())
    }

    fn host(&mut self, name: &str, values: Vec<f32>) {
        if let Some(f) = self.0.as_mut() {
            f(name, values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{in_row_chunks, rope_table, rows_of, timestep_embedding};
    use cleave_device::RuntimeTask;
    use cleave_shaders::cubecl::prelude::*;
    use cleave_shaders::{copy_columns, Tensor};

    /// Rows in chunks of 1, 3 (the last one short), 7 and all at once,
    /// each chunk's output twice as wide as its input: the gathered rows
    /// are the input's, in order, on both sides.
    #[test]
    fn row_chunks_gather_in_order() {
        struct Check;
        impl RuntimeTask for Check {
            type Output = ();
            fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
                let client = &clients[0];
                let values: Vec<f32> = (0..14).map(|v| v as f32).collect();
                let x = Tensor::from_f32(client, &values, &[7, 2]);
                for chunk in [1, 3, 7, 10] {
                    let out = in_row_chunks(client, 7, chunk, |first, count| {
                        let part = rows_of(client, &x, first, count)?;
                        let wide = Tensor::empty(client, &[count, 4]);
                        copy_columns(client, &part, &wide, 0)?;
                        copy_columns(client, &part, &wide, 2)?;
                        Ok(wide)
                    })
                    .unwrap();
                    let want: Vec<f32> = values.chunks(2).flat_map(|row| [row, row].concat()).collect();
                    assert_eq!(out.to_vec(client).unwrap(), want, "chunks of {chunk}");
                }
            }
        }
        cleave_device::open_default().expect("a device").run(Check);
    }

    #[test]
    fn timestep_embedding_is_cos_then_sin() {
        let e = timestep_embedding(0.0);
        assert!(e[..128].iter().all(|&v| v == 1.0) && e[128..].iter().all(|&v| v == 0.0));
        // The first frequency is 1: cos(t), sin(t).
        let e = timestep_embedding(2.0);
        assert_eq!((e[0], e[128]), (2f32.cos(), 2f32.sin()));
    }

    #[test]
    fn rope_table_concatenates_the_axes() {
        // Axes of 2, 4, 2 dims: frequencies [1], [1, 1/100], [1].
        let (cos, sin) = rope_table(&[2, 4, 2], &[[3.0, 5.0, 7.0]]);
        let angles = [3.0f64, 5.0, 0.05, 7.0];
        assert_eq!(cos, angles.map(|a| a.cos() as f32));
        assert_eq!(sin, angles.map(|a| a.sin() as f32));
    }
}
