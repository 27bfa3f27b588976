//! FLUX latent layout: the VAE's `[C, H, W]` latents are packed into `(H/2)·(W/2)` tokens of `4·C`
//! features (2×2 patches) for the transformer, with rope position ids per token, and unpacked and
//! rescaled before the VAE decodes them.

use std::path::Path;

use serde::Deserialize;

use crate::config::{read_json, ConfigFileError};

#[derive(Debug, thiserror::Error)]
pub enum LatentsError {
    #[error(transparent)]
    File(#[from] ConfigFileError),
    #[error("vae config field `{field}` is missing (FluxPipeline needs it)")]
    MissingField { field: &'static str },
    #[error("vae config field `{field}`: {problem}")]
    InvalidField { field: &'static str, problem: &'static str },
    #[error("latent shape {channels}x{height}x{width} needs channels and even, non-zero sides (2x2 patches)")]
    InvalidShape {
        channels: usize,
        height: usize,
        width: usize,
    },
    #[error("image {height}x{width} is too small for a latent grid at VAE scale factor {vae_scale_factor}")]
    ImageTooSmall {
        height: usize,
        width: usize,
        vae_scale_factor: usize,
    },
    #[error("expected {expected} latent values for this shape, got {actual}")]
    LengthMismatch { expected: usize, actual: usize },
}

/// Side of the square patch folded into one token.
const PATCH: usize = 2;
const PATCH_AREA: usize = PATCH * PATCH;

/// Shape of unpacked latents `[channels, height, width]`, with both sides even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatentShape {
    channels: usize,
    height: usize,
    width: usize,
}

impl LatentShape {
    pub fn new(channels: usize, height: usize, width: usize) -> Result<Self, LatentsError> {
        let even = |side: usize| side > 0 && side.is_multiple_of(PATCH);
        if channels == 0 || !even(height) || !even(width) {
            return Err(LatentsError::InvalidShape {
                channels,
                height,
                width,
            });
        }
        Ok(Self {
            channels,
            height,
            width,
        })
    }

    pub fn channels(&self) -> usize {
        self.channels
    }

    pub fn height(&self) -> usize {
        self.height
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// Values in the unpacked (or packed) tensor.
    pub fn num_values(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Image tokens after packing: `(H/2)·(W/2)`, the `image_seq_len` that sets the shift `mu`.
    pub fn seq_len(&self) -> usize {
        (self.height / PATCH) * (self.width / PATCH)
    }

    /// Features per packed token: `4·C`.
    pub fn packed_channels(&self) -> usize {
        self.channels * PATCH_AREA
    }

    fn check_len(&self, actual: usize) -> Result<(), LatentsError> {
        if actual == self.num_values() {
            Ok(())
        } else {
            Err(LatentsError::LengthMismatch {
                expected: self.num_values(),
                actual,
            })
        }
    }

    /// Position of unpacked `[c, y, x]` in the packed `[seq, 4·C]` buffer:
    /// token `(y/2)·(W/2) + x/2`, feature `4c + 2(y%2) + x%2`.
    fn packed_index(&self, c: usize, y: usize, x: usize) -> usize {
        let token = (y / PATCH) * (self.width / PATCH) + x / PATCH;
        let feature = c * PATCH_AREA + (y % PATCH) * PATCH + x % PATCH;
        token * self.packed_channels() + feature
    }

    /// Every `(unpacked index, packed index)` pair, in unpacked memory order.
    fn index_pairs(self) -> impl Iterator<Item = (usize, usize)> {
        (0..self.channels)
            .flat_map(move |c| (0..self.height).flat_map(move |y| (0..self.width).map(move |x| (c, y, x))))
            .enumerate()
            .map(move |(i, (c, y, x))| (i, self.packed_index(c, y, x)))
    }
}

/// `FluxPipeline._pack_latents`: `[C, H, W]` → `[(H/2)·(W/2), 4·C]`.
pub fn pack(shape: LatentShape, latents: &[f32]) -> Result<Vec<f32>, LatentsError> {
    shape.check_len(latents.len())?;
    let mut packed = vec![0.0; shape.num_values()];
    for (unpacked_index, packed_index) in shape.index_pairs() {
        packed[packed_index] = latents[unpacked_index];
    }
    Ok(packed)
}

/// `FluxPipeline._unpack_latents`: the inverse of [`pack`].
pub fn unpack(shape: LatentShape, packed: &[f32]) -> Result<Vec<f32>, LatentsError> {
    shape.check_len(packed.len())?;
    Ok(shape
        .index_pairs()
        .map(|(_, packed_index)| packed[packed_index])
        .collect())
}

/// Rope position ids of the image tokens, `[0, row, col]` in token order (`_prepare_latent_image_ids`).
pub fn image_ids(shape: LatentShape) -> Vec<[f32; 3]> {
    let (rows, cols) = (shape.height / PATCH, shape.width / PATCH);
    (0..rows)
        .flat_map(|row| (0..cols).map(move |col| [0.0, row as f32, col as f32]))
        .collect()
}

/// Rope position ids of the text tokens: all zeros, so text attends without position bias.
pub fn text_ids(len: usize) -> Vec<[f32; 3]> {
    vec![[0.0; 3]; len]
}

/// `vae/config.json` as written; defaults are AutoencoderKL's, except that FLUX's latent shift has
/// none and is required.
#[derive(Debug, Deserialize)]
struct RawVaeConfig {
    scaling_factor: Option<f64>,
    shift_factor: Option<f64>,
    latent_channels: Option<usize>,
    block_out_channels: Option<Vec<usize>>,
}

/// What the pipeline needs of the VAE config to lay out and rescale latents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VaeLatentConfig {
    scaling_factor: f32,
    shift_factor: f32,
    latent_channels: usize,
    vae_scale_factor: usize,
}

impl VaeLatentConfig {
    pub fn from_file(path: &Path) -> Result<Self, LatentsError> {
        let raw: RawVaeConfig = read_json(path)?;
        let scaling_factor = raw.scaling_factor.unwrap_or(0.18215);
        if !scaling_factor.is_finite() || scaling_factor == 0.0 {
            return Err(LatentsError::InvalidField {
                field: "scaling_factor",
                problem: "must be finite and non-zero",
            });
        }
        let shift_factor = raw
            .shift_factor
            .ok_or(LatentsError::MissingField { field: "shift_factor" })?;
        if !shift_factor.is_finite() {
            return Err(LatentsError::InvalidField {
                field: "shift_factor",
                problem: "must be finite",
            });
        }
        let latent_channels = raw.latent_channels.unwrap_or(4);
        if latent_channels == 0 {
            return Err(LatentsError::InvalidField {
                field: "latent_channels",
                problem: "must be positive",
            });
        }
        // diffusers' default `block_out_channels` is `(64,)`: one level, no downsampling.
        let levels = raw.block_out_channels.map_or(1, |channels| channels.len());
        let vae_scale_factor = levels
            .checked_sub(1)
            .and_then(|downsamplings| u32::try_from(downsamplings).ok())
            .and_then(|downsamplings| 1usize.checked_shl(downsamplings))
            .ok_or(LatentsError::InvalidField {
                field: "block_out_channels",
                problem: "needs 1 to 63 levels",
            })?;
        Ok(Self {
            scaling_factor: scaling_factor as f32,
            shift_factor: shift_factor as f32,
            latent_channels,
            vae_scale_factor,
        })
    }

    /// `2^(levels − 1)`: image pixels per latent pixel along each side.
    pub fn vae_scale_factor(&self) -> usize {
        self.vae_scale_factor
    }

    /// Image pixels along each side of one 2×2 latent patch (16 for FLUX.1): image sides are
    /// whole numbers of them.
    pub fn pixels_per_patch(&self) -> usize {
        PATCH * self.vae_scale_factor
    }

    /// The latent grid for an image, as `prepare_latents` rounds it: each side becomes
    /// `2·(side / (2·vae_scale_factor))`, i.e. rounded down to a whole number of 2×2 patches.
    pub fn latent_shape(&self, image_height: usize, image_width: usize) -> Result<LatentShape, LatentsError> {
        let step = self.pixels_per_patch();
        let (height, width) = (PATCH * (image_height / step), PATCH * (image_width / step));
        if height == 0 || width == 0 {
            return Err(LatentsError::ImageTooSmall {
                height: image_height,
                width: image_width,
                vae_scale_factor: self.vae_scale_factor,
            });
        }
        LatentShape::new(self.latent_channels, height, width)
    }

    /// Maps final unpacked latents to the VAE decoder's input, `z / scaling_factor + shift_factor`,
    /// in f32 with both factors rounded to f32 as torch does with Python scalars.
    pub fn to_vae_input(&self, latents: &mut [f32]) {
        for z in latents {
            *z = *z / self.scaling_factor + self.shift_factor;
        }
    }
}
