//! Weights as the kernels use them: a matrix in row chunks, `nn.Linear`
//! with its bias and LoRA updates, and a projection whose rows several
//! devices may hold (row split).

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    add_assign, copy_columns, embedding_weight, embedding_weight_picked, gated_mul, matmul, matmul_weight_into,
    rms_norm, scale_shift, Activation, Epilogue, KernelError, Output, Picked, Tensor, Weight, WeightType,
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
        self.gather_each(client, ids.len(), |chunk, first, out| {
            embedding_weight(client, chunk, first, ids, out)
        })
    }

    /// [`Matrix::gather`] of the ids a pick left on the device.
    pub fn gather_picked<R: Runtime>(&self, client: &ComputeClient<R>, ids: &Picked) -> Result<Tensor> {
        self.gather_each(client, ids.len(), |chunk, first, out| {
            embedding_weight_picked(client, chunk, first, ids, out)
        })
    }

    /// A new `[rows, cols]` tensor, filled by `gather(chunk, first row,
    /// out)` from each row chunk.
    fn gather_each<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        rows: usize,
        gather: impl Fn(&Weight, usize, &Tensor) -> std::result::Result<(), KernelError>,
    ) -> Result<Tensor> {
        let out = Tensor::empty(client, &[rows, self.cols]);
        for (first, chunk) in &self.chunks {
            gather(chunk, *first, &out)?;
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

/// A projection's input: `x`, RMS-normed first where `norm` (the norm's
/// weight and epsilon) is given. The decode kernel norms `x` as it reads
/// it, so a block's norms cost no launch of their own.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub x: &'a Tensor,
    pub norm: Option<(&'a Tensor, f32)>,
}

impl<'a> Input<'a> {
    /// `x` as it is.
    pub fn plain(x: &'a Tensor) -> Self {
        Input { x, norm: None }
    }

    /// `rms_norm(x, weight, eps)`.
    pub fn normed(x: &'a Tensor, weight: &'a Tensor, eps: f32) -> Self {
        Input {
            x,
            norm: Some((weight, eps)),
        }
    }

    /// The input's values in a tensor of their own (`x` itself where it is
    /// not normed), for what cannot norm as it reads.
    pub fn values<R: Runtime>(&self, client: &ComputeClient<R>) -> Result<Tensor> {
        Ok(match self.norm {
            Some((weight, eps)) => rms_norm(client, self.x, weight, eps)?,
            None => self.x.clone(),
        })
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
        self.forward_input(client, Input::plain(x))
    }

    /// [`Linear::forward`] of an input that may be normed as it is read.
    pub fn forward_input<R: Runtime>(&self, client: &ComputeClient<R>, input: Input) -> Result<Tensor> {
        let out = Tensor::empty(client, &input.x.shape_with_cols(self.weight.rows));
        self.write(client, input, &out, 0, Output::Store)?;
        Ok(out)
    }

    /// `into += x·Wᵀ + b`: a residual add done by the matmul as it stores.
    pub fn accumulate<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor, into: &Tensor) -> Result<()> {
        self.write(client, Input::plain(x), into, 0, Output::Accumulate)
    }

    /// `x·Wᵀ + b` into columns `col_offset..` of `out`, stored or added as
    /// `output` says, then each low-rank update added: `out += (scale ·
    /// x·Aᵀ)·Bᵀ`.
    fn write<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        input: Input,
        out: &Tensor,
        col_offset: usize,
        output: Output,
    ) -> Result<()> {
        // Low-rank updates read `x` too: normed once for all.
        let normed;
        let input = if input.norm.is_some() && (!self.low_rank.is_empty() || self.weight.chunks.len() > 1) {
            normed = input.values(client)?;
            Input::plain(&normed)
        } else {
            input
        };
        for (first, chunk) in &self.weight.chunks {
            let epilogue = Epilogue::new(output)
                .with_bias(self.bias.as_ref(), *first)
                .with_norm(input.norm);
            matmul_weight_into(client, input.x, chunk, out, col_offset + first, epilogue)?;
        }
        let x = input.x;
        for update in &self.low_rank {
            let down = matmul(client, x, &update.a)?;
            scale_shift(client, &down, update.scale, 0.0)?;
            let b = Weight::from_tensor(update.b.clone());
            matmul_weight_into(client, &down, &b, out, col_offset, Epilogue::accumulate())?;
        }
        Ok(())
    }

    /// `activation(x·Gᵀ + b) · (x·Uᵀ)`, this layer being G and `up` U, in
    /// one matmul over both weights where they allow it: `up` without a
    /// bias, neither with low-rank updates, their row chunks alike. `None`
    /// where they do not.
    pub fn gated<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        input: Input,
        up: &Linear,
        activation: Activation,
    ) -> Result<Option<Tensor>> {
        let chunks_alike = self.weight.chunks.len() == up.weight.chunks.len()
            && self
                .weight
                .chunks
                .iter()
                .zip(&up.weight.chunks)
                .all(|((a, wa), (b, wb))| a == b && wa.rows == wb.rows && wa.cols == wb.cols);
        if !chunks_alike || up.bias.is_some() || !self.low_rank.is_empty() || !up.low_rank.is_empty() {
            return Ok(None);
        }
        // Several chunks would each norm `x` again: normed once for all.
        let normed;
        let input = if input.norm.is_some() && self.weight.chunks.len() > 1 {
            normed = input.values(client)?;
            Input::plain(&normed)
        } else {
            input
        };
        let out = Tensor::empty(client, &input.x.shape_with_cols(self.weight.rows));
        for ((first, gate), (_, up)) in self.weight.chunks.iter().zip(&up.weight.chunks) {
            let output = Output::Gated { up, activation };
            let epilogue = Epilogue::new(output)
                .with_bias(self.bias.as_ref(), *first)
                .with_norm(input.norm);
            matmul_weight_into(client, input.x, gate, &out, *first, epilogue)?;
        }
        Ok(Some(out))
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

    /// The layer, where device `here` holds all of it.
    pub fn whole_on(&self, here: usize) -> Option<&Linear> {
        match self.parts.as_slice() {
            [part] if part.device == here && part.first == 0 => Some(&part.linear),
            _ => None,
        }
    }

    /// Its output width.
    pub fn out(&self) -> usize {
        self.out
    }

    /// The type its weight is stored in.
    pub fn weight_type(&self) -> WeightType {
        self.parts
            .first()
            .map_or(WeightType::F32, |part| part.linear.weight.weight_type())
    }

    /// `x · Wᵀ + b` for `x` on device `here`, the result on `here` too.
    pub fn forward<R: Runtime>(&self, placement: &Placement<R>, here: usize, x: &Tensor) -> Result<Tensor> {
        let out = Tensor::empty(placement.client(here), &x.shape_with_cols(self.out));
        self.forward_into(placement, here, Input::plain(x), &out, 0)?;
        Ok(out)
    }

    /// `x · Wᵀ + b` into columns `col_offset..col_offset + out` of `out`
    /// on `here`. The parts on `here` write their columns directly; each
    /// other part computes its rows on its own device from a copy of `x`
    /// (normed at `here` first), and `here` copies them in.
    pub fn forward_into<R: Runtime>(
        &self,
        placement: &Placement<R>,
        here: usize,
        input: Input,
        out: &Tensor,
        col_offset: usize,
    ) -> Result<()> {
        let normed;
        let input = if input.norm.is_some() && self.whole_on(here).is_none() {
            normed = input.values(placement.client(here))?;
            Input::plain(&normed)
        } else {
            input
        };
        for part in &self.parts {
            let columns = col_offset + part.first;
            if part.device == here {
                part.linear
                    .write(placement.client(here), input, out, columns, Output::Store)?;
                continue;
            }
            let xd = placement.copy_to(input.x, here, part.device);
            let y = part.linear.forward(placement.client(part.device), &xd)?;
            let y = placement.copy_to(&y, part.device, here);
            copy_columns(placement.client(here), &y, out, columns)?;
        }
        Ok(())
    }

    /// `into += x · Wᵀ + b` on `here`: in the matmul's own pass where
    /// `here` holds the whole layer.
    pub fn accumulate<R: Runtime>(
        &self,
        placement: &Placement<R>,
        here: usize,
        x: &Tensor,
        into: &Tensor,
    ) -> Result<()> {
        match self.whole_on(here) {
            Some(linear) => linear.accumulate(placement.client(here), x, into),
            None => Ok(add_assign(
                placement.client(here),
                into,
                &self.forward(placement, here, x)?,
            )?),
        }
    }

    /// `activation(x·Gᵀ + b) · (x·Uᵀ + b)` on device `d`, this projection
    /// being G: one matmul where `d` holds both whole and they allow it
    /// ([`Linear::gated`]), else two and the gated product.
    pub fn gated<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        input: Input,
        up: &Proj,
        activation: Activation,
    ) -> Result<Tensor> {
        let client = placement.client(d);
        if let (Some(gate), Some(up)) = (self.whole_on(d), up.whole_on(d)) {
            if let Some(out) = gate.gated(client, input, up, activation)? {
                return Ok(out);
            }
        }
        let x = input.values(client)?;
        let gate = self.forward(placement, d, &x)?;
        let up = up.forward(placement, d, &x)?;
        Ok(gated_mul(client, &gate, &up, activation)?)
    }
}
