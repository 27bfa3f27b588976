//! Uploading checkpoint tensors to a device as f32.

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{add_bias, bf16_to_f32, embedding, f16_to_f32, matmul_into, Tensor};

use crate::checkpoint::{Checkpoint, DType, TensorData};
use crate::error::Result;
use crate::placement::Placed;

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
}

impl Linear {
    pub fn forward<R: Runtime>(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor> {
        let out = Tensor::empty(client, &[x.rows(), self.weight.rows]);
        for (first, chunk) in &self.weight.chunks {
            matmul_into(client, x, chunk, &out, *first)?;
        }
        if let Some(bias) = &self.bias {
            add_bias(client, &out, bias)?;
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
}

impl<'a, R: Runtime> Loader<'a, R> {
    /// `progress` is told the checkpoint bytes read after every tensor.
    pub fn new(devices: &'a [Placed<R>], checkpoint: &'a Checkpoint, progress: &'a mut dyn FnMut(u64)) -> Self {
        Loader {
            devices,
            checkpoint,
            progress,
        }
    }

    fn upload(&self, device: usize, name: &str, data: &TensorData, bytes: &[u8], shape: &[usize]) -> Result<Tensor> {
        let placed = &self.devices[device];
        placed.reserve((shape.iter().product::<usize>() * size_of::<f32>()) as u64, name)?;
        let client = &placed.client;
        Ok(match data.dtype {
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

    /// A 1-D tensor of `len` elements, on `device`.
    pub fn vector(&mut self, device: usize, name: &str, len: usize) -> Result<Tensor> {
        let data = self.checkpoint.tensor(name, &[len])?;
        let tensor = self.upload(device, name, &data, data.bytes, &[len])?;
        (self.progress)(data.bytes.len() as u64);
        Ok(tensor)
    }

    /// A `[rows, cols]` matrix on `device`, in as many row chunks as the
    /// binding limit needs.
    pub fn matrix(&mut self, device: usize, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let data = self.checkpoint.tensor(name, &[rows, cols])?;
        let row_bytes = cols * data.dtype.size();
        let rows_per_chunk = (self.devices[device].max_buffer() / (cols * size_of::<f32>())).clamp(1, rows);
        let chunks = (0..rows)
            .step_by(rows_per_chunk)
            .map(|first| {
                let n = rows_per_chunk.min(rows - first);
                let bytes = &data.bytes[first * row_bytes..(first + n) * row_bytes];
                Ok((first, self.upload(device, name, &data, bytes, &[n, cols])?))
            })
            .collect::<Result<Vec<_>>>()?;
        (self.progress)(data.bytes.len() as u64);
        Ok(Matrix { chunks, rows, cols })
    }

    /// A linear layer `prefix.weight` (`[out, in]`) with `prefix.bias` if
    /// asked, on `device`.
    pub fn linear(&mut self, device: usize, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        let weight = self.matrix(device, &format!("{prefix}.weight"), out, inp)?;
        let bias = if bias {
            Some(self.vector(device, &format!("{prefix}.bias"), out)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}
