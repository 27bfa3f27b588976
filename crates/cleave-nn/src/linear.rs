//! Weights as the kernels use them: a matrix in row chunks, `nn.Linear`
//! with its bias and LoRA updates, and a projection whose rows several
//! devices may hold (row split).

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    add_bias, add_scaled, copy_columns, embedding_weight, matmul, matmul_weight_into, Tensor, Weight, WeightType,
};

use crate::error::Result;
use crate::placement::Placement;

/// A 2-D weight in its stored type (f32, f16, bf16 or GGUF blocks) in one
/// or more device buffers, split by rows so that no buffer exceeds what one
/// shader binding may address (128 MiB on many wgpu adapters, less than a
/// large vocabulary's embedding table).
#[derive(Clone, Debug)]
pub struct Matrix {
    /// `(first row, rows first_row..first_row + chunk.rows)`.
    pub(crate) chunks: Vec<(usize, Weight)>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

impl Matrix {
    /// Gathers the rows `ids` into a new `[ids.len(), cols]` tensor.
    pub fn gather<R: Runtime>(&self, client: &ComputeClient<R>, ids: &[u32]) -> Result<Tensor> {
        let out = Tensor::empty(client, &[ids.len(), self.cols]);
        for (first, chunk) in &self.chunks {
            embedding_weight(client, chunk, *first, ids, &out)?;
        }
        Ok(out)
    }

    /// The type its rows are stored in.
    pub fn weight_type(&self) -> WeightType {
        self.chunks.first().map_or(WeightType::F32, |(_, w)| w.ty)
    }

    /// Bytes its rows take on the device.
    pub fn bytes(&self) -> usize {
        self.chunks.iter().map(|(_, w)| w.bytes()).sum()
    }
}

/// `x · Wᵀ + b`, PyTorch's `nn.Linear`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Matrix,
    pub bias: Option<Tensor>,
    /// LoRA updates applied at run time, each `+ scale · x·Aᵀ·Bᵀ`.
    pub low_rank: Vec<LowRank>,
}

/// A low-rank update kept beside its weight: `a: [r, in]`, `b: [out, r]`.
#[derive(Clone, Debug)]
pub struct LowRank {
    pub(crate) a: Tensor,
    pub(crate) b: Tensor,
    pub(crate) scale: f32,
}

impl Linear {
    /// A plain linear layer, without bias or low-rank updates.
    pub fn new(weight: Matrix) -> Self {
        Linear {
            weight,
            bias: None,
            low_rank: Vec::new(),
        }
    }

    pub fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        let out = Tensor::empty(client, &x.shape_with_cols(self.weight.rows));
        for (first, chunk) in &self.weight.chunks {
            matmul_weight_into(client, x, chunk, &out, *first)?;
        }
        if let Some(bias) = &self.bias {
            add_bias(client, &out, bias)?;
        }
        for update in &self.low_rank {
            let down = matmul(client, x, &update.a)?;
            add_scaled(client, &out, &matmul(client, &down, &update.b)?, update.scale)?;
        }
        Ok(out)
    }
}

/// A linear layer whose output rows one or more devices hold: whole on one
/// device, or sliced by rows across a group (row split).
pub struct Proj {
    pub(crate) parts: Vec<ProjPart>,
    pub(crate) out: usize,
}

pub(crate) struct ProjPart {
    pub(crate) device: usize,
    pub(crate) first: usize,
    pub(crate) linear: Linear,
}

impl Proj {
    /// All of `linear` (of `out` outputs) on `device`.
    pub fn whole(device: usize, linear: Linear, out: usize) -> Self {
        Proj {
            parts: vec![ProjPart {
                device,
                first: 0,
                linear,
            }],
            out,
        }
    }

    /// `x · Wᵀ + b` for `x` on device `here`, the result on `here` too.
    /// Each part computes its rows on its own device from a copy of `x`;
    /// `here` gathers them.
    pub fn forward<R: Runtime>(&self, placement: &Placement<R>, here: usize, x: &Tensor) -> Result<Tensor> {
        if let [part] = self.parts.as_slice() {
            if part.device == here && part.first == 0 {
                return part.linear.forward(placement.client(here), x);
            }
        }
        let out = Tensor::empty(placement.client(here), &x.shape_with_cols(self.out));
        for part in &self.parts {
            let xd = placement.copy_to(x, here, part.device);
            let y = part.linear.forward(placement.client(part.device), &xd)?;
            let y = placement.copy_to(&y, part.device, here);
            copy_columns(placement.client(here), &y, &out, part.first)?;
        }
        Ok(out)
    }
}
