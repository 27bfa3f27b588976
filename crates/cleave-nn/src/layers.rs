//! Layers that several families share, loaded by their checkpoint names
//! under a [`Weights`] prefix.

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{conv2d, group_norm, layer_norm, Tensor, Weight};

use crate::error::Result;
use crate::loader::Weights;

/// `nn.LayerNorm` with weight and bias (BERT, CLIP).
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
}

impl LayerNorm {
    /// `w.weight` and `w.bias`, `size` each.
    pub fn load<R: Runtime>(w: Weights<R>, size: usize, eps: f32) -> Result<Self> {
        Ok(LayerNorm {
            weight: w.vector("weight", size)?,
            bias: w.vector("bias", size)?,
            eps,
        })
    }

    pub fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        Ok(layer_norm(client, x, &self.weight, &self.bias, self.eps)?)
    }
}

/// `nn.GroupNorm(groups, channels, eps)` on a `[C, ...]` map, optionally
/// followed by SiLU.
pub struct GroupNorm {
    weight: Tensor,
    bias: Tensor,
    groups: usize,
    eps: f32,
}

impl GroupNorm {
    pub fn load<R: Runtime>(w: Weights<R>, channels: usize, groups: usize, eps: f32) -> Result<Self> {
        Ok(GroupNorm {
            weight: w.vector("weight", channels)?,
            bias: w.vector("bias", channels)?,
            groups,
            eps,
        })
    }

    pub fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor, silu: bool) -> Result<Tensor> {
        Ok(group_norm(
            client,
            x,
            &self.weight,
            &self.bias,
            self.groups,
            self.eps,
            silu,
        )?)
    }
}

/// `nn.Conv2d(inp, out, k, padding=k/2)` with bias: weights `[out, inp, k,
/// k]`, kept in their stored type.
pub struct Conv2d {
    weight: Weight,
    window: usize,
    bias: Tensor,
}

impl Conv2d {
    pub fn load<R: Runtime>(w: Weights<R>, inp: usize, out: usize, k: usize) -> Result<Self> {
        Ok(Conv2d {
            weight: w.conv_weight("weight", out, inp, k)?,
            window: k,
            bias: w.vector("bias", out)?,
        })
    }

    pub fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        Ok(conv2d(client, x, &self.weight, self.window, &self.bias)?)
    }
}
