//! The decoder of diffusers' `AutoencoderKL` (FLUX.1's VAE): latents to
//! pixels. `conv_in`, a mid block (resnet, single-head self-attention over
//! the pixels, resnet), up blocks (resnets, then nearest ×2 upsampling and
//! a 3×3 conv on all but the last), GroupNorm, SiLU, `conv_out`.
//!
//! Weights are looked up by their diffusers names (`decoder.up_blocks.1
//! .resnets.0.conv_shortcut.weight`, ...). Activations are `[C, H, W]`
//! maps: NCHW with a batch of one.

use std::path::Path;

use cleave_hf::{read_json, Checkpoint, Validator};
use cleave_nn::{Bias, Conv2d, GroupNorm, Linear, Loader, ModelError, Placed, Placement, Result, Weights};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    add_assign, attention, transpose, upsample_nearest2x, AttentionShape, KeyRanges, ProductPath, Tensor, WeightType,
};
use serde::Deserialize;

/// diffusers' `resnet_eps` for every norm of the decoder.
const EPS: f32 = 1e-6;

#[derive(Deserialize)]
struct RawVaeConfig {
    out_channels: Option<usize>,
    latent_channels: Option<usize>,
    block_out_channels: Option<Vec<usize>>,
    layers_per_block: Option<usize>,
    norm_num_groups: Option<usize>,
    act_fn: Option<String>,
    up_block_types: Option<Vec<String>>,
    mid_block_add_attention: Option<bool>,
    use_post_quant_conv: Option<bool>,
    scaling_factor: Option<f64>,
    shift_factor: Option<f64>,
}

/// A validated `AutoencoderKL` config (the decoder's part).
#[derive(Clone, Debug)]
pub struct VaeConfig {
    pub latent_channels: usize,
    /// Latents are decoded as `z / scaling_factor + shift_factor`.
    pub scaling_factor: f32,
    pub shift_factor: f32,
    pub out_channels: usize,
    /// The encoder's order; the decoder walks them reversed.
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    pub norm_num_groups: usize,
    pub mid_block_add_attention: bool,
    /// A 1×1 conv on the latents before the decoder (not in FLUX.1).
    pub use_post_quant_conv: bool,
}

impl VaeConfig {
    pub fn from_file(path: &Path) -> cleave_hf::Result<Self> {
        let raw: RawVaeConfig = read_json(path)?;
        let check = Validator { path };
        let error = |field: &'static str, reason: String| check.error(field, reason);
        let positive = |value: Option<usize>, field: &'static str| check.positive(value, field);
        // The fields that shape the network have no silent defaults; the
        // rest default as in diffusers' AutoencoderKL.
        let latent_channels = positive(raw.latent_channels, "latent_channels")?;
        let layers_per_block = positive(raw.layers_per_block, "layers_per_block")?;
        let norm_num_groups = positive(raw.norm_num_groups, "norm_num_groups")?;
        let block_out_channels = match raw.block_out_channels {
            None => return Err(error("block_out_channels", "missing".into())),
            Some(b) if b.is_empty() || b.contains(&0) => {
                return Err(error(
                    "block_out_channels",
                    format!("{b:?}: must be non-empty and positive"),
                ))
            }
            Some(b) => b,
        };
        if let Some(&bad) = block_out_channels.iter().find(|&&c| c % norm_num_groups != 0) {
            return Err(error(
                "norm_num_groups",
                format!("{norm_num_groups} does not divide block_out_channels entry {bad}"),
            ));
        }
        check.supported("act_fn", raw.act_fn.as_deref().unwrap_or("silu"), &["silu"])?;
        if let Some(types) = &raw.up_block_types {
            if types.len() != block_out_channels.len() {
                return Err(error(
                    "up_block_types",
                    format!(
                        "{} entries, but block_out_channels has {}",
                        types.len(),
                        block_out_channels.len()
                    ),
                ));
            }
            for kind in types {
                check.supported("up_block_types", kind, &["UpDecoderBlock2D"])?;
            }
        }
        let scaling_factor = raw.scaling_factor.unwrap_or(0.18215) as f32;
        if !(scaling_factor.is_finite() && scaling_factor != 0.0) {
            return Err(error(
                "scaling_factor",
                format!("{scaling_factor} cannot divide the latents"),
            ));
        }
        Ok(VaeConfig {
            latent_channels,
            scaling_factor,
            shift_factor: raw.shift_factor.unwrap_or(0.0) as f32,
            out_channels: positive(Some(raw.out_channels.unwrap_or(3)), "out_channels")?,
            block_out_channels,
            layers_per_block,
            norm_num_groups,
            mid_block_add_attention: raw.mid_block_add_attention.unwrap_or(true),
            use_post_quant_conv: raw.use_post_quant_conv.unwrap_or(true),
        })
    }

    /// How many times the decoder doubles the latents' sides (3 for FLUX.1:
    /// pixels are 8× the latents).
    pub fn upsamplings(&self) -> usize {
        self.block_out_channels.len() - 1
    }

    /// `(in, out)` channels of each up block, in decoder order: the first
    /// takes the mid block's (the widest) channels.
    fn up_channels(&self) -> Vec<(usize, usize)> {
        let reversed: Vec<usize> = self.block_out_channels.iter().rev().copied().collect();
        (0..reversed.len())
            .map(|i| (reversed[i.saturating_sub(1)], reversed[i]))
            .collect()
    }

    fn top_channels(&self) -> usize {
        *self.block_out_channels.last().unwrap_or(&0)
    }

    /// What the planner needs to place the `vae` module for an image of
    /// `height × width` pixels: `conv_in` (and `post_quant_conv`) at the
    /// head, blocks = the mid block then each up block, the output norm
    /// and `conv_out` at the tail, each the checkpoint's own tensors as the
    /// loader puts them on a device (convolutions and the attention's
    /// projections in their stored type, norms in f32), and the largest
    /// convolution's scratch beside the largest maps. Layer split only.
    pub fn inventory(&self, checkpoint: &Checkpoint, height: usize, width: usize) -> cleave_plan::Inventory {
        let f32s = |count: usize| (count * size_of::<f32>()) as u64;
        let top = self.top_channels();
        let bytes = |name: &str| checkpoint.device_bytes(name);
        let head = bytes("decoder.conv_in")
            + if self.use_post_quant_conv {
                bytes("post_quant_conv")
            } else {
                0
            };
        let blocks = std::iter::once(bytes("decoder.mid_block"))
            .chain((0..self.up_channels().len()).map(|i| bytes(&format!("decoder.up_blocks.{i}"))))
            .collect();
        let first = self.block_out_channels[0];
        // A map's largest moment: four maps of the widest channels at full
        // size (input, normed, conv output, residual), plus the attention's
        // q, k, v, output and transposed input over the latent pixels (it
        // writes no scores).
        let scale = 1 << self.upsamplings();
        let latent_pixels = height.div_ceil(scale) * width.div_ceil(scale);
        let widest = self
            .up_channels()
            .iter()
            .enumerate()
            .map(|(i, &(inp, out))| (inp.max(out) * latent_pixels) << (2 * i))
            .max()
            .unwrap_or(0);
        let attention = if self.mid_block_add_attention {
            5 * top * latent_pixels
        } else {
            0
        };
        cleave_plan::Inventory {
            module: "vae".into(),
            head_bytes: head,
            block_bytes: blocks,
            tail_bytes: bytes("decoder.conv_norm_out") + bytes("decoder.conv_out"),
            tail_shared_with_head: 0,
            cache_bytes: Vec::new(),
            compute_bytes: f32s(4 * widest.max(height * width * first) + attention)
                + self.conv_scratch_bytes(checkpoint, latent_pixels),
            geometry: None,
        }
    }
}

impl VaeConfig {
    /// Each convolution of the decoder over latents of `latent_pixels`:
    /// its weight's name (some, such as a shortcut where the channels stay,
    /// are not in a checkpoint) and the pixels it runs over.
    fn convolutions(&self, latent_pixels: usize) -> Vec<(String, usize)> {
        let mut convolutions = vec![("decoder.conv_in.weight".to_string(), latent_pixels)];
        if self.use_post_quant_conv {
            convolutions.push(("post_quant_conv.weight".to_string(), latent_pixels));
        }
        let resnet = |prefix: String, pixels: usize| {
            ["conv1", "conv2", "conv_shortcut"].map(|conv| (format!("{prefix}.{conv}.weight"), pixels))
        };
        for r in 0..2 {
            convolutions.extend(resnet(format!("decoder.mid_block.resnets.{r}"), latent_pixels));
        }
        for i in 0..self.up_channels().len() {
            let pixels = latent_pixels << (2 * i);
            for r in 0..=self.layers_per_block {
                convolutions.extend(resnet(format!("decoder.up_blocks.{i}.resnets.{r}"), pixels));
            }
            // After the ×2 upsampling.
            convolutions.push((format!("decoder.up_blocks.{i}.upsamplers.0.conv.weight"), pixels << 2));
        }
        let image = latent_pixels << (2 * self.upsamplings());
        convolutions.push(("decoder.conv_out.weight".to_string(), image));
        convolutions
    }

    /// Device bytes the largest convolution takes beyond its input and
    /// output, on whichever path the chosen precision lets a device take
    /// (see [`ProductPath::conv_scratch_bytes`]).
    fn conv_scratch_bytes(&self, checkpoint: &Checkpoint, latent_pixels: usize) -> u64 {
        let paths = ProductPath::possible(cleave_shaders::chosen_precision());
        self.convolutions(latent_pixels)
            .into_iter()
            .filter_map(|(name, pixels)| match checkpoint.shape(&name)?[..] {
                [out, inp, k, _] => {
                    let ty = checkpoint.dtype(&name).unwrap_or(WeightType::F32);
                    Some((ty, (pixels, out, inp.saturating_mul(k).saturating_mul(k)), k))
                }
                _ => None,
            })
            .flat_map(|(ty, dims, k)| paths.iter().map(move |path| path.conv_scratch_bytes(ty, dims, k)))
            .max()
            .unwrap_or(0)
    }
}

/// `ResnetBlock2D` without a time embedding.
struct ResnetBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    norm2: GroupNorm,
    conv2: Conv2d,
    /// A 1×1 conv on the residual where the channels change.
    conv_shortcut: Option<Conv2d>,
}

impl ResnetBlock {
    fn load<R: Runtime>(w: Weights<R>, inp: usize, out: usize, groups: usize) -> Result<Self> {
        Ok(ResnetBlock {
            norm1: GroupNorm::load(w.pp("norm1"), inp, groups, EPS)?,
            conv1: Conv2d::load(w.pp("conv1"), inp, out, 3)?,
            norm2: GroupNorm::load(w.pp("norm2"), out, groups, EPS)?,
            conv2: Conv2d::load(w.pp("conv2"), out, out, 3)?,
            conv_shortcut: (inp != out)
                .then(|| Conv2d::load(w.pp("conv_shortcut"), inp, out, 1))
                .transpose()?,
        })
    }

    fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        let h = self.conv1.forward(client, &self.norm1.forward(client, x, true)?)?;
        let h = self.conv2.forward(client, &self.norm2.forward(client, &h, true)?)?;
        match &self.conv_shortcut {
            Some(shortcut) => add_assign(client, &h, &shortcut.forward(client, x)?)?,
            None => add_assign(client, &h, x)?,
        }
        Ok(h)
    }
}

/// The mid block's `Attention`: GroupNorm, then one head over the pixels
/// (`[H·W, C]` rows), `to_out.0`, plus the input.
struct SpatialAttention {
    group_norm: GroupNorm,
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
}

impl SpatialAttention {
    fn load<R: Runtime>(w: Weights<R>, channels: usize, groups: usize) -> Result<Self> {
        let c = channels;
        Ok(SpatialAttention {
            group_norm: GroupNorm::load(w.pp("group_norm"), c, groups, EPS)?,
            to_q: w.linear("to_q", c, c, Bias::Yes)?,
            to_k: w.linear("to_k", c, c, Bias::Yes)?,
            to_v: w.linear("to_v", c, c, Bias::Yes)?,
            to_out: w.linear("to_out.0", c, c, Bias::Yes)?,
        })
    }

    fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        let (c, pixels) = (x.shape[0], x.len() / x.shape[0]);
        let normed = self.group_norm.forward(client, &x.reshape(&[c, pixels]), false)?;
        let rows = transpose(client, &normed)?;
        let (q, k, v) = (
            self.to_q.forward(client, &rows)?,
            self.to_k.forward(client, &rows)?,
            self.to_v.forward(client, &rows)?,
        );
        // At `--precision fast` its products round their inputs to the
        // projections' 16-bit type, as the convolutions do.
        let shape = AttentionShape::new(1, 1, c).rounding_like(self.to_out.weight.weight_type());
        // Every pixel sees every pixel.
        let ranges = KeyRanges::new(client, &vec![(0, pixels as u32); pixels]);
        let context = attention(client, &q, &k, &v, shape, &ranges, None)?;
        let out = transpose(client, &self.to_out.forward(client, &context)?)?.reshape(&x.shape);
        add_assign(client, &out, x)?;
        Ok(out)
    }
}

/// Block 0 of the plan: resnet, attention (unless disabled), resnet.
struct MidBlock {
    resnet0: ResnetBlock,
    attention: Option<SpatialAttention>,
    resnet1: ResnetBlock,
}

/// Blocks 1.. of the plan: `layers_per_block + 1` resnets, then
/// upsampling unless it is the last.
struct UpBlock {
    resnets: Vec<ResnetBlock>,
    upsampler: Option<Conv2d>,
}

enum Block {
    // Boxed: each holds a few hundred bytes of handles, and the blocks
    // sit side by side in one Vec.
    Mid(Box<MidBlock>),
    Up(Box<UpBlock>),
}

impl Block {
    fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: Tensor) -> Result<Tensor> {
        match self {
            Block::Mid(mid) => {
                let mut x = mid.resnet0.forward(client, &x)?;
                if let Some(attention) = &mid.attention {
                    x = attention.forward(client, &x)?;
                }
                mid.resnet1.forward(client, &x)
            }
            Block::Up(up) => {
                let mut x = x;
                for resnet in &up.resnets {
                    x = resnet.forward(client, &x)?;
                }
                match &up.upsampler {
                    Some(conv) => conv.forward(client, &upsample_nearest2x(client, &x)?),
                    None => Ok(x),
                }
            }
        }
    }
}

/// A VAE decoder on a device group, split by blocks as its plan says.
pub struct VaeDecoder<R: Runtime> {
    placement: Placement<R>,
    config: VaeConfig,
    post_quant_conv: Option<Conv2d>,
    conv_in: Conv2d,
    blocks: Vec<Block>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
}

cleave_nn::placed_model!(VaeDecoder);

impl<R: Runtime> VaeDecoder<R> {
    pub fn load(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &VaeConfig,
        checkpoint: &Checkpoint,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self> {
        let c = config;
        let groups = c.norm_num_groups;
        let (latent, top) = (c.latent_channels, c.top_channels());
        let loader = Loader::new(&devices, checkpoint, progress);
        let root = loader.weights(plan.head_device());
        let post_quant_conv = c
            .use_post_quant_conv
            .then(|| Conv2d::load(root.pp("post_quant_conv"), latent, latent, 1))
            .transpose()?;
        let decoder = root.pp("decoder");
        let conv_in = Conv2d::load(decoder.pp("conv_in"), latent, top, 3)?;

        let m = decoder.pp("mid_block").on(plan.device_of_block(0));
        let mid = MidBlock {
            resnet0: ResnetBlock::load(m.pp("resnets.0"), top, top, groups)?,
            attention: c
                .mid_block_add_attention
                .then(|| SpatialAttention::load(m.pp("attentions.0"), top, groups))
                .transpose()?,
            resnet1: ResnetBlock::load(m.pp("resnets.1"), top, top, groups)?,
        };
        let last = c.block_out_channels.len() - 1;
        let ups = c
            .up_channels()
            .into_iter()
            .enumerate()
            .map(|(i, (inp, out))| {
                let w = decoder.pp("up_blocks").pp(i).on(plan.device_of_block(i + 1));
                let resnets = (0..=c.layers_per_block)
                    .map(|r| {
                        let from = if r == 0 { inp } else { out };
                        ResnetBlock::load(w.pp("resnets").pp(r), from, out, groups)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let upsampler = (i < last)
                    .then(|| Conv2d::load(w.pp("upsamplers.0.conv"), out, out, 3))
                    .transpose()?;
                Ok(Block::Up(Box::new(UpBlock { resnets, upsampler })))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut blocks = vec![Block::Mid(Box::new(mid))];
        blocks.extend(ups);

        let tail = decoder.on(plan.tail_device());
        let first = c.block_out_channels[0];
        let conv_norm_out = GroupNorm::load(tail.pp("conv_norm_out"), first, groups, EPS)?;
        let conv_out = Conv2d::load(tail.pp("conv_out"), first, c.out_channels, 3)?;
        Ok(VaeDecoder {
            placement: Placement::new(devices, plan),
            config: c.clone(),
            post_quant_conv,
            conv_in,
            blocks,
            conv_norm_out,
            conv_out,
        })
    }

    /// `latents`: `[latent_channels, h, w]` already scaled (`z /
    /// scaling_factor + shift_factor`, cleave_diffusion's `to_vae_input`); returns
    /// `[out_channels, 8h, 8w]` (NCHW without the batch; 8 = 2^upsamplings).
    pub fn decode(&self, latents: &[f32], h: usize, w: usize) -> Result<Vec<f32>> {
        let c = &self.config;
        let expected = c.latent_channels * h * w;
        if latents.len() != expected || expected == 0 {
            return Err(ModelError::LatentShape {
                got: latents.len(),
                channels: c.latent_channels,
                height: h,
                width: w,
                expected,
            });
        }
        let (placement, plan) = (&self.placement, self.placement.plan());
        let client = placement.client(plan.head_device());
        let mut x = Tensor::from_f32(client, latents, &[c.latent_channels, h, w]);
        if let Some(conv) = &self.post_quant_conv {
            x = conv.forward(client, &x)?;
        }
        x = self.conv_in.forward(client, &x)?;
        let (x, mut here) = placement.run_blocks(x, self.blocks.len(), |b, device, x| {
            self.blocks[b].forward(placement.client(device), x)
        })?;
        let x = placement.hand_over(x, &mut here, plan.tail_device());
        let client = placement.client(here);
        let x = self
            .conv_out
            .forward(client, &self.conv_norm_out.forward(client, &x, true)?)?;
        Ok(x.to_vec(client)?)
    }
}
