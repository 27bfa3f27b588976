//! Uploading checkpoint tensors to a device as f32.

use cleave_shaders::cubecl::prelude::*;
use std::ops::Range;

use cleave_shaders::{
    add_bias, add_scaled, bf16_to_f32, copy_columns, embedding, f16_to_f32, matmul, matmul_into, Tensor,
};

use crate::checkpoint::{Checkpoint, DType};
use crate::error::Result;
use crate::lora::{LoraAdapter, LoraMode};
use crate::placement::{Placed, Placement};

/// A 2-D weight in one or more device buffers, split by rows so that no
/// buffer exceeds what one shader binding may address (128 MiB on many
/// wgpu adapters, less than a large vocabulary's embedding table).
#[derive(Clone, Debug)]
pub struct Matrix {
    /// `(first row, rows first_row..first_row + chunk.rows())`.
    chunks: Vec<(usize, Tensor)>,
    rows: usize,
    cols: usize,
}

impl Matrix {
    /// Gathers the rows `ids` into a new `[ids.len(), cols]` tensor.
    pub fn gather<R: Runtime>(&self, client: &ComputeClient<R>, ids: &[u32]) -> Result<Tensor> {
        let out = Tensor::empty(client, &[ids.len(), self.cols]);
        for (first, chunk) in &self.chunks {
            embedding(client, chunk, *first, ids, &out)?;
        }
        Ok(out)
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
    a: Tensor,
    b: Tensor,
    scale: f32,
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
            matmul_into(client, x, chunk, &out, *first)?;
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

/// Reads tensors from a checkpoint and uploads each to the device of a
/// group that the plan gives it, refusing to go past a device's cap.
pub struct Loader<'a, R: Runtime> {
    devices: &'a [Placed<R>],
    checkpoint: &'a Checkpoint,
    progress: &'a mut dyn FnMut(u64),
    adapters: &'a [LoraAdapter],
    lora_mode: LoraMode,
}

impl<'a, R: Runtime> Loader<'a, R> {
    /// `progress` is told the checkpoint bytes read after every tensor.
    pub fn new(devices: &'a [Placed<R>], checkpoint: &'a Checkpoint, progress: &'a mut dyn FnMut(u64)) -> Self {
        Loader {
            devices,
            checkpoint,
            progress,
            adapters: &[],
            lora_mode: LoraMode::Auto,
        }
    }

    /// Applies `adapters` to the linear layers they name, in `mode`.
    pub fn with_lora(mut self, adapters: &'a [LoraAdapter], mode: LoraMode) -> Self {
        self.adapters = adapters;
        self.lora_mode = mode;
        self
    }

    fn upload(&self, device: usize, name: &str, dtype: DType, bytes: &[u8], shape: &[usize]) -> Result<Tensor> {
        let placed = &self.devices[device];
        placed.reserve((shape.iter().product::<usize>() * size_of::<f32>()) as u64, name)?;
        let client = &placed.client;
        Ok(match dtype {
            DType::F32 => {
                // The mapped bytes need not be 4-aligned: copy, don't cast.
                Tensor {
                    handle: client.create_from_slice(bytes),
                    shape: shape.to_vec(),
                }
            }
            DType::BF16 => bf16_to_f32(client, bytes, shape),
            DType::F16 => f16_to_f32(client, bytes, shape),
        })
    }

    /// Elements `range` of the 1-D tensor `name` (`len` long), on `device`.
    pub fn vector_part(&mut self, device: usize, name: &str, len: usize, range: Range<usize>) -> Result<Tensor> {
        let data = self.checkpoint.tensor(name, &[len])?;
        let size = data.dtype.size();
        let bytes = &data.bytes[range.start * size..range.end * size];
        let tensor = self.upload(device, name, data.dtype, bytes, &[range.len()])?;
        self.checkpoint.release(bytes);
        (self.progress)(bytes.len() as u64);
        Ok(tensor)
    }

    /// A 1-D tensor of `len` elements, on `device`.
    pub fn vector(&mut self, device: usize, name: &str, len: usize) -> Result<Tensor> {
        self.vector_part(device, name, len, 0..len)
    }

    /// A tensor of any `shape` in one buffer (a convolution's `[out, in,
    /// k, k]` weight), on `device`.
    pub fn tensor(&mut self, device: usize, name: &str, shape: &[usize]) -> Result<Tensor> {
        let data = self.checkpoint.tensor(name, shape)?;
        let tensor = self.upload(device, name, data.dtype, data.bytes, shape)?;
        self.checkpoint.release(data.bytes);
        (self.progress)(data.bytes.len() as u64);
        Ok(tensor)
    }

    /// `bytes` holding `rows` rows of `cols` elements, uploaded as a
    /// matrix in as many row chunks as the binding limit needs.
    fn upload_matrix(
        &self,
        device: usize,
        name: &str,
        dtype: DType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        let row_bytes = cols * dtype.size();
        let rows_per_chunk =
            (self.devices[device].max_buffer() / (cols * size_of::<f32>()).max(1)).clamp(1, rows.max(1));
        let chunks = (0..rows)
            .step_by(rows_per_chunk)
            .map(|first| {
                let n = rows_per_chunk.min(rows - first);
                let chunk = &bytes[first * row_bytes..(first + n) * row_bytes];
                Ok((first, self.upload(device, name, dtype, chunk, &[n, cols])?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Matrix { chunks, rows, cols })
    }

    /// Rows `part` of the `[rows, cols]` matrix `name`, on `device`.
    pub fn matrix_rows(
        &mut self,
        device: usize,
        name: &str,
        rows: usize,
        cols: usize,
        part: Range<usize>,
    ) -> Result<Matrix> {
        let data = self.checkpoint.tensor(name, &[rows, cols])?;
        let row_bytes = cols * data.dtype.size();
        let bytes = &data.bytes[part.start * row_bytes..part.end * row_bytes];
        let matrix = self.upload_matrix(device, name, data.dtype, bytes, part.len(), cols)?;
        self.checkpoint.release(bytes);
        (self.progress)(bytes.len() as u64);
        Ok(matrix)
    }

    /// A `[rows, cols]` matrix, on `device`.
    pub fn matrix(&mut self, device: usize, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.matrix_rows(device, name, rows, cols, 0..rows)
    }

    /// Columns `part` of the `[rows, cols]` matrix `name`, gathered on the
    /// host (one slice's worth of memory) and uploaded to `device`.
    pub fn matrix_cols(
        &mut self,
        device: usize,
        name: &str,
        rows: usize,
        cols: usize,
        part: Range<usize>,
    ) -> Result<Matrix> {
        let data = self.checkpoint.tensor(name, &[rows, cols])?;
        let size = data.dtype.size();
        let gathered = columns(data.bytes, cols, size, &part);
        let matrix = self.upload_matrix(device, name, data.dtype, &gathered, rows, part.len())?;
        self.checkpoint.release(data.bytes);
        (self.progress)(gathered.len() as u64);
        Ok(matrix)
    }

    /// A linear layer `prefix.weight` (`[out, inp]`) with `prefix.bias` if
    /// asked, on `device`.
    pub fn linear(&mut self, device: usize, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        self.linear_rows(device, prefix, out, inp, bias, 0..out)
    }

    /// Output rows `part` of a linear layer (and of its bias), on `device`.
    pub fn linear_rows(
        &mut self,
        device: usize,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
        part: Range<usize>,
    ) -> Result<Linear> {
        let weight = self.matrix_rows(device, &format!("{prefix}.weight"), out, inp, part.clone())?;
        let bias = if bias {
            Some(self.vector_part(device, &format!("{prefix}.bias"), out, part.clone())?)
        } else {
            None
        };
        let mut linear = Linear {
            weight,
            bias,
            low_rank: Vec::new(),
        };
        let sliced = part.len() != out;
        for adapter in self.adapters {
            if let Some((a, b)) = adapter.factors(prefix, out, inp)? {
                let r = adapter.rank();
                // Output rows `part` take B's rows `part`, and all of A.
                let b_rows = &b.bytes[part.start * r * b.dtype.size()..part.end * r * b.dtype.size()];
                let factors = Factors {
                    a: (a.bytes.to_vec(), a.dtype),
                    b: (b_rows.to_vec(), b.dtype),
                    rank: r,
                    inp,
                };
                self.apply_low_rank(device, prefix, &mut linear, factors, adapter.scale(), sliced)?;
            }
        }
        Ok(linear)
    }

    /// Input columns `part` of a linear layer's weight, without its bias:
    /// one device's term of a sum that an all-reduce completes.
    pub fn linear_cols(
        &mut self,
        device: usize,
        prefix: &str,
        out: usize,
        inp: usize,
        part: Range<usize>,
    ) -> Result<Linear> {
        let weight = self.matrix_cols(device, &format!("{prefix}.weight"), out, inp, part.clone())?;
        let mut linear = Linear::new(weight);
        for adapter in self.adapters {
            if let Some((a, b)) = adapter.factors(prefix, out, inp)? {
                let r = adapter.rank();
                // Input columns `part` take A's columns `part`, and all of B.
                let factors = Factors {
                    a: (columns(a.bytes, inp, a.dtype.size(), &part), a.dtype),
                    b: (b.bytes.to_vec(), b.dtype),
                    rank: r,
                    inp: part.len(),
                };
                self.apply_low_rank(device, prefix, &mut linear, factors, adapter.scale(), true)?;
            }
        }
        Ok(linear)
    }

    /// Merges `scale · B·A` into `linear`'s weight, or keeps A and B beside
    /// it, as the LoRA mode says (auto: beside a weight sliced across
    /// devices, merged into a whole one).
    fn apply_low_rank(
        &self,
        device: usize,
        prefix: &str,
        linear: &mut Linear,
        factors: Factors,
        scale: f32,
        sliced: bool,
    ) -> Result<()> {
        let Factors { a, b, rank, inp } = factors;
        let name = format!("{prefix} (LoRA)");
        let out = linear.weight.rows;
        let runtime = match self.lora_mode {
            LoraMode::Runtime => true,
            LoraMode::Direct => false,
            LoraMode::Auto => sliced,
        };
        if runtime {
            linear.low_rank.push(LowRank {
                a: self.upload(device, &name, a.1, &a.0, &[rank, inp])?,
                b: self.upload(device, &name, b.1, &b.0, &[out, rank])?,
                scale,
            });
            return Ok(());
        }
        // delta = B·A = B · (Aᵀ)ᵀ, computed chunk by chunk of the weight's rows.
        let a_t = self.upload(
            device,
            &name,
            a.1,
            &transpose(&a.0, rank, inp, a.1.size()),
            &[inp, rank],
        )?;
        let client = &self.devices[device].client;
        let row_bytes = rank * b.1.size();
        for (first, chunk) in &linear.weight.chunks {
            let rows = chunk.rows();
            let b_chunk = &b.0[first * row_bytes..(first + rows) * row_bytes];
            let b_chunk = self.upload(device, &name, b.1, b_chunk, &[rows, rank])?;
            add_scaled(client, chunk, &matmul(client, &b_chunk, &a_t)?, scale)?;
        }
        Ok(())
    }

    /// A linear layer whose output rows are held by `parts`
    /// (`(device, rows)`, in order, covering `0..out`).
    pub fn proj(
        &mut self,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
        parts: &[(usize, Range<usize>)],
    ) -> Result<Proj> {
        let parts = parts
            .iter()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(device, rows)| {
                Ok(ProjPart {
                    device: *device,
                    first: rows.start,
                    linear: self.linear_rows(*device, prefix, out, inp, bias, rows.clone())?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Proj { parts, out })
    }
}

/// A LoRA update's factors as raw checkpoint bytes: `a: [rank, inp]`,
/// `b: [out, rank]` (already cut to the slice being loaded).
struct Factors {
    a: (Vec<u8>, DType),
    b: (Vec<u8>, DType),
    rank: usize,
    inp: usize,
}

/// Columns `part` of a row-major `[_, cols]` matrix of `size`-byte elements.
fn columns(bytes: &[u8], cols: usize, size: usize, part: &Range<usize>) -> Vec<u8> {
    bytes
        .chunks_exact(cols * size)
        .flat_map(|row| &row[part.start * size..part.end * size])
        .copied()
        .collect()
}

/// The transpose of a row-major `[rows, cols]` matrix of `size`-byte elements.
fn transpose(bytes: &[u8], rows: usize, cols: usize, size: usize) -> Vec<u8> {
    let mut out = vec![0; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
            out[to..to + size].copy_from_slice(&bytes[from..from + size]);
        }
    }
    out
}

/// A linear layer whose output rows one or more devices hold: whole on one
/// device, or sliced by rows across a group (row split).
pub struct Proj {
    parts: Vec<ProjPart>,
    out: usize,
}

struct ProjPart {
    device: usize,
    first: usize,
    linear: Linear,
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
