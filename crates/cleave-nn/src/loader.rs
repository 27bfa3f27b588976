//! Uploading checkpoint tensors to the devices a plan names (matrices in
//! their stored type: f32, f16, bf16 or GGUF blocks; vectors, convolution
//! kernels and LoRA factors widened to f32), and
//! [`Weights`], the view of a checkpoint that model code loads from: a name
//! prefix and a device, as candle's `VarBuilder` carries them.

use std::cell::RefCell;
use std::fmt::Display;
use std::ops::Range;
use std::sync::Arc;

use cleave_hf::{Checkpoint, LoraAdapter, LoraMode, TensorData};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{add_scaled, bf16_to_f32, f16_to_f32, matmul, Tensor, Weight, WeightType};

use crate::error::{ModelError, Result};
use crate::linear::{Linear, LowRank, Matrix, Proj, ProjPart};
use crate::placement::Placed;

/// Where a model's weights come from, each time a block is loaded (a
/// streamed block is loaded again for every pass): the checkpoint and the
/// LoRA adapters applied to it.
#[derive(Clone)]
pub struct WeightSource {
    pub checkpoint: Arc<Checkpoint>,
    pub adapters: Vec<LoraAdapter>,
    pub lora_mode: LoraMode,
}

impl WeightSource {
    /// The checkpoint's weights as they are.
    pub fn new(checkpoint: Arc<Checkpoint>) -> Self {
        WeightSource {
            checkpoint,
            adapters: Vec::new(),
            lora_mode: LoraMode::Auto,
        }
    }

    /// With `adapters` applied in `mode`.
    pub fn with_lora(mut self, adapters: &[LoraAdapter], mode: LoraMode) -> Self {
        self.adapters = adapters.to_vec();
        self.lora_mode = mode;
        self
    }

    /// A loader onto `devices` with the adapters applied in `mode`.
    pub fn loader<'a, R: Runtime>(
        &'a self,
        devices: &'a [Placed<R>],
        mode: LoraMode,
        progress: &'a mut dyn FnMut(u64),
    ) -> Loader<'a, R> {
        Loader::new(devices, &self.checkpoint, progress).with_lora(&self.adapters, mode)
    }
}

/// Reads tensors from a checkpoint and uploads each to the device of a
/// group that the plan gives it, refusing to go past a device's cap.
pub struct Loader<'a, R: Runtime> {
    devices: &'a [Placed<R>],
    checkpoint: &'a Checkpoint,
    progress: RefCell<&'a mut dyn FnMut(u64)>,
    adapters: &'a [LoraAdapter],
    lora_mode: LoraMode,
}

impl<'a, R: Runtime> Loader<'a, R> {
    /// `progress` is told the checkpoint bytes read after every tensor.
    pub fn new(devices: &'a [Placed<R>], checkpoint: &'a Checkpoint, progress: &'a mut dyn FnMut(u64)) -> Self {
        Loader {
            devices,
            checkpoint,
            progress: RefCell::new(progress),
            adapters: &[],
            lora_mode: LoraMode::Auto,
        }
    }

    /// The checkpoint's tensors as model code loads them: names from the
    /// root, uploaded to `device`.
    pub fn weights(&self, device: usize) -> Weights<'_, 'a, R> {
        Weights {
            loader: self,
            prefix: String::new(),
            device,
        }
    }

    /// Applies `adapters` to the linear layers they name, in `mode`.
    pub fn with_lora(mut self, adapters: &'a [LoraAdapter], mode: LoraMode) -> Self {
        self.adapters = adapters;
        self.lora_mode = mode;
        self
    }

    /// Fails, naming the tensor and element, when `bytes` hold a NaN or an
    /// infinity: at load, not as silent garbage in the logits.
    fn check_finite(&self, name: &str, dtype: WeightType, bytes: &[u8]) -> Result<()> {
        match dtype.first_non_finite(bytes) {
            Some(index) => Err(ModelError::NonFinite {
                what: format!("tensor '{name}' in {}", self.checkpoint.dir().display()),
                index,
                hint: ": the checkpoint is damaged",
            }),
            None => Ok(()),
        }
    }

    /// A float tensor widened to f32 on the device (vectors, tables the
    /// kernels read as f32, LoRA factors).
    fn upload(&self, device: usize, name: &str, dtype: WeightType, bytes: &[u8], shape: &[usize]) -> Result<Tensor> {
        self.check_finite(name, dtype, bytes)?;
        let placed = &self.devices[device];
        placed.reserve((shape.iter().product::<usize>() * size_of::<f32>()) as u64, name)?;
        let client = &placed.client;
        let widen = match dtype {
            // The mapped bytes need not be 4-aligned: copy, don't cast.
            WeightType::F32 => |client: &ComputeClient<R>, bytes: &[u8], shape: &[usize]| {
                Tensor::from_handle(cleave_shaders::profile::upload(client, bytes), shape)
            },
            WeightType::BF16 => bf16_to_f32,
            WeightType::F16 => f16_to_f32,
            other => {
                return Err(ModelError::Input(format!(
                    "tensor '{name}' in {} is {}, which cleave reads only as a matrix of whole blocks",
                    self.checkpoint.dir().display(),
                    other.name()
                )))
            }
        };
        placed.lasting(|| widen(client, bytes, shape))
    }

    /// Elements `range` of the 1-D tensor `name` (`len` long), on `device`.
    fn vector_part(&self, device: usize, name: &str, len: usize, range: Range<usize>) -> Result<Tensor> {
        let data = self.checkpoint.tensor(name, &[len])?;
        let size = data.dtype.block_bytes();
        let bytes = &data.bytes[range.start * size..range.end * size];
        let tensor = self.upload(device, name, data.dtype, bytes, &[range.len()])?;
        self.checkpoint.release(bytes);
        (self.progress.borrow_mut())(bytes.len() as u64);
        Ok(tensor)
    }

    /// A 1-D tensor of `len` elements, on `device`.
    fn vector(&self, device: usize, name: &str, len: usize) -> Result<Tensor> {
        self.vector_part(device, name, len, 0..len)
    }

    /// A 1-D tensor of `len` elements, in f32 on the host: values the host
    /// applies itself, which need no upload and no read back.
    fn host_vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let data = self.checkpoint.tensor(name, &[len])?;
        self.check_finite(name, data.dtype, &data.bytes)?;
        let values = data.to_f32_vec().ok_or_else(|| {
            ModelError::Input(format!(
                "tensor '{name}' in {} is {}: cleave reads it in f32, f16 or bf16",
                self.checkpoint.dir().display(),
                data.dtype.name()
            ))
        })?;
        self.checkpoint.release(&data.bytes);
        (self.progress.borrow_mut())(data.bytes.len() as u64);
        Ok(values)
    }

    /// The tensor `name`, stored with the shape `stored`, in f32 on
    /// `device` as `shape` (the same elements).
    fn small_tensor(&self, device: usize, name: &str, stored: &[usize], shape: &[usize]) -> Result<Tensor> {
        let data = self.checkpoint.tensor(name, stored)?;
        let tensor = self.upload(device, name, data.dtype, &data.bytes, shape)?;
        self.checkpoint.release(&data.bytes);
        (self.progress.borrow_mut())(data.bytes.len() as u64);
        Ok(tensor)
    }

    /// A convolution's `[out, inp, k, k]` weight in its stored type, as
    /// `[out, inp · k²]` rows in one buffer, on `device`.
    fn conv_weight(&self, device: usize, name: &str, (out, inp, k): (usize, usize, usize)) -> Result<Weight> {
        let data = self.checkpoint.tensor(name, &[out, inp, k, k])?;
        if data.dtype.block_len() > 1 {
            return Err(ModelError::Input(format!(
                "tensor '{name}' in {} is {}: cleave reads convolution weights in f32, f16 or bf16",
                self.checkpoint.dir().display(),
                data.dtype.name()
            )));
        }
        self.check_finite(name, data.dtype, &data.bytes)?;
        let placed = &self.devices[device];
        placed.reserve(data.bytes.len() as u64, name)?;
        let upload = || Weight::upload(&placed.client, &data.bytes, data.dtype, out, inp * k * k);
        let weight = placed.lasting(upload)??;
        self.checkpoint.release(&data.bytes);
        (self.progress.borrow_mut())(data.bytes.len() as u64);
        Ok(weight)
    }

    /// `bytes` holding `rows` rows of `cols` elements of `dtype`, uploaded
    /// as they are stored, in as many row chunks as the binding limit needs.
    fn upload_matrix(
        &self,
        device: usize,
        name: &str,
        dtype: WeightType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        self.check_finite(name, dtype, bytes)?;
        self.upload_checked_matrix(device, name, dtype, bytes, rows, cols)
    }

    /// [`Self::upload_matrix`] for bytes already checked to be finite.
    fn upload_checked_matrix(
        &self,
        device: usize,
        name: &str,
        dtype: WeightType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        let row_bytes = row_bytes(name, dtype, cols)?;
        let placed = &self.devices[device];
        placed.reserve(bytes.len() as u64, name)?;
        let rows_per_chunk = (placed.max_buffer() / row_bytes.max(1)).clamp(1, rows.max(1));
        let chunks = (0..rows)
            .step_by(rows_per_chunk)
            .map(|first| {
                let n = rows_per_chunk.min(rows - first);
                let chunk = &bytes[first * row_bytes..(first + n) * row_bytes];
                let weight = placed.lasting(|| Weight::upload(&placed.client, chunk, dtype, n, cols))??;
                Ok((first, weight))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Matrix { chunks, rows, cols })
    }

    /// Rows `part` of the `[rows, cols]` matrix `name`, on `device`.
    fn matrix_rows(&self, device: usize, name: &str, rows: usize, cols: usize, part: Range<usize>) -> Result<Matrix> {
        let data = self.checkpoint.tensor(name, &[rows, cols])?;
        let row_bytes = row_bytes(name, data.dtype, cols)?;
        let bytes = &data.bytes[part.start * row_bytes..part.end * row_bytes];
        let matrix = self.upload_matrix(device, name, data.dtype, bytes, part.len(), cols)?;
        self.checkpoint.release(bytes);
        (self.progress.borrow_mut())(bytes.len() as u64);
        Ok(matrix)
    }

    /// A `[rows, cols]` matrix, on `device`.
    fn matrix(&self, device: usize, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.matrix_rows(device, name, rows, cols, 0..rows)
    }

    /// Columns `part` of the `[rows, cols]` matrix `name`, gathered on the
    /// host (one slice's worth of memory) and uploaded to `device`. A part
    /// that cuts through a block type's blocks is taken from the tensor
    /// widened to f32.
    fn matrix_cols(&self, device: usize, name: &str, rows: usize, cols: usize, part: Range<usize>) -> Result<Matrix> {
        let mut data = self.checkpoint.tensor(name, &[rows, cols])?;
        let len = data.dtype.block_len();
        if !part.start.is_multiple_of(len) || !part.end.is_multiple_of(len) {
            data = self.checkpoint.tensor_widened(name, &[rows, cols])?;
        }
        let (len, size) = (data.dtype.block_len(), data.dtype.block_bytes());
        let blocks = part.start / len..part.end / len;
        let gathered = columns(&data.bytes, cols / len, size, &blocks);
        let matrix = self.upload_matrix(device, name, data.dtype, &gathered, rows, part.len())?;
        self.checkpoint.release(&data.bytes);
        (self.progress.borrow_mut())(gathered.len() as u64);
        Ok(matrix)
    }

    /// A linear layer `prefix.weight` (`[out, inp]`) with `prefix.bias` if
    /// asked, on `device`.
    fn linear(&self, device: usize, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        self.linear_rows(device, prefix, out, inp, bias, 0..out)
    }

    /// Output rows `part` of a linear layer (and of its bias), on `device`.
    fn linear_rows(
        &self,
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
                let b_rows = &b.bytes[part.start * r * b.dtype.block_bytes()..part.end * r * b.dtype.block_bytes()];
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

    /// Several linear layers over the same input, as few as their stored
    /// types allow: the output rows `part` of each `(prefix, out, part)`,
    /// each run of consecutive parts whose weights (and biases) share a
    /// type stacked in order in one matrix (and bias), so that one matmul
    /// computes the run. q, k and v are one layer, or two where a Q4_K_M
    /// file keeps v in Q6_K. Each layer comes with its count of rows.
    /// `None` where an adapter updates one of them.
    fn linear_stacked(
        &self,
        device: usize,
        parts: &[(String, usize, Range<usize>)],
        inp: usize,
        bias: bool,
    ) -> Result<Option<Vec<(Linear, usize)>>> {
        for (prefix, out, _) in parts {
            for adapter in self.adapters {
                if adapter.factors(prefix, *out, inp)?.is_some() {
                    return Ok(None);
                }
            }
        }
        let weights = self.tensors(parts, "weight", |out| vec![out, inp])?;
        let biases = if bias {
            Some(self.tensors(parts, "bias", |out| vec![out])?)
        } else {
            None
        };
        let mut layers = Vec::new();
        let mut start = 0;
        while start < parts.len() {
            let same_types = |i: usize| {
                weights[i].dtype == weights[start].dtype && biases.as_ref().is_none_or(|b| b[i].dtype == b[start].dtype)
            };
            let end = (start..parts.len()).find(|&i| !same_types(i)).unwrap_or(parts.len());
            let run_biases = biases.as_ref().map(|b| &b[start..end]);
            layers.push(self.stack_run(device, &parts[start..end], &weights[start..end], run_biases, inp)?);
            start = end;
        }
        Ok(Some(layers))
    }

    /// The rows `part` of each of `parts`, whose `weights` (and `biases`)
    /// share a type, stacked in order into one layer, with its rows.
    fn stack_run(
        &self,
        device: usize,
        parts: &[(String, usize, Range<usize>)],
        weights: &[TensorData],
        biases: Option<&[TensorData]>,
        inp: usize,
    ) -> Result<(Linear, usize)> {
        let name = parts
            .iter()
            .map(|(prefix, ..)| prefix.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        let dtype = weights[0].dtype;
        let row_bytes = row_bytes(&name, dtype, inp)?;
        let rows: usize = parts.iter().map(|(_, _, part)| part.len()).sum();
        // Each part's bytes in its tensor, for elements of `size` bytes.
        let slices = |size: usize| -> Vec<(usize, usize)> {
            parts
                .iter()
                .map(|(_, _, part)| (part.start * size, part.end * size))
                .collect()
        };
        let weight_slices = slices(row_bytes);
        let stacked = self.stack(parts, "weight", (weights, dtype), &weight_slices, &name)?;
        let weight = self.upload_checked_matrix(device, &name, dtype, &stacked, rows, inp)?;
        self.release_parts(weights, &weight_slices);
        let bias = match biases {
            Some(biases) => {
                let bias_type = biases[0].dtype;
                let bias_slices = slices(bias_type.block_bytes());
                let stacked = self.stack(parts, "bias", (biases, bias_type), &bias_slices, &name)?;
                let bias = self.upload(device, &name, bias_type, &stacked, &[rows])?;
                self.release_parts(biases, &bias_slices);
                Some(bias)
            }
            None => None,
        };
        let linear = Linear {
            weight,
            bias,
            low_rank: Vec::new(),
        };
        Ok((linear, rows))
    }

    /// The byte ranges `slices` of the tensors `prefix.suffix` of `parts`
    /// (`tensors`, all of `dtype`), each checked to be finite under its own
    /// name, one after another in one buffer allocated without aborting
    /// when memory is short (`name` says what for).
    fn stack(
        &self,
        parts: &[(String, usize, Range<usize>)],
        suffix: &str,
        (tensors, dtype): (&[TensorData], WeightType),
        slices: &[(usize, usize)],
        name: &str,
    ) -> Result<Vec<u8>> {
        let total = slices.iter().map(|(start, end)| end - start).sum();
        let mut stacked = Vec::new();
        stacked
            .try_reserve_exact(total)
            .map_err(|_| ModelError::Input(format!("no host memory for {total} bytes to stack {name}")))?;
        for (((prefix, ..), data), (start, end)) in parts.iter().zip(tensors).zip(slices) {
            let bytes = &data.bytes[*start..*end];
            self.check_finite(&format!("{prefix}.{suffix}"), dtype, bytes)?;
            stacked.extend_from_slice(bytes);
        }
        Ok(stacked)
    }

    /// Tells the checkpoint that the byte ranges `slices` of `tensors` were
    /// uploaded: their pages are released and the bytes counted.
    fn release_parts(&self, tensors: &[TensorData], slices: &[(usize, usize)]) {
        for (data, (start, end)) in tensors.iter().zip(slices) {
            self.checkpoint.release(&data.bytes[*start..*end]);
            (self.progress.borrow_mut())((end - start) as u64);
        }
    }

    /// The tensors `prefix.suffix` of `parts`, each of the shape `shape`
    /// gives for its `out`.
    fn tensors(
        &self,
        parts: &[(String, usize, Range<usize>)],
        suffix: &str,
        shape: impl Fn(usize) -> Vec<usize>,
    ) -> Result<Vec<TensorData<'_>>> {
        Ok(parts
            .iter()
            .map(|(prefix, out, _)| self.checkpoint.tensor(&format!("{prefix}.{suffix}"), &shape(*out)))
            .collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Input columns `part` of a linear layer's weight, without its bias:
    /// one device's term of a sum that an all-reduce completes.
    fn linear_cols(&self, device: usize, prefix: &str, out: usize, inp: usize, part: Range<usize>) -> Result<Linear> {
        let weight = self.matrix_cols(device, &format!("{prefix}.weight"), out, inp, part.clone())?;
        let mut linear = Linear::new(weight);
        for adapter in self.adapters {
            if let Some((a, b)) = adapter.factors(prefix, out, inp)? {
                let r = adapter.rank();
                // Input columns `part` take A's columns `part`, and all of B.
                let factors = Factors {
                    a: (columns(&a.bytes, inp, a.dtype.block_bytes(), &part), a.dtype),
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
        // A 16-bit or quantized weight would be rounded by a merge (and a
        // quantized one requantized): its update runs beside it.
        let stored = linear.weight.weight_type();
        let runtime = match self.lora_mode {
            LoraMode::Runtime => true,
            LoraMode::Direct if stored != WeightType::F32 => {
                return Err(ModelError::Input(format!(
                    "--lora-mode direct cannot merge into {prefix}, whose weight is {stored}: merging would round \
                     it to {stored}; use --lora-mode runtime (or auto)"
                )))
            }
            LoraMode::Direct => false,
            LoraMode::Auto => sliced || stored != WeightType::F32,
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
            &transpose(&a.0, rank, inp, a.1.block_bytes()),
            &[inp, rank],
        )?;
        let client = &self.devices[device].client;
        let row_bytes = rank * b.1.block_bytes();
        for (first, chunk) in &linear.weight.chunks {
            let rows = chunk.rows;
            let Some(chunk) = chunk.as_f32() else {
                return Err(ModelError::Input(format!("{name}: the weight is not f32")));
            };
            let chunk = &chunk;
            let b_chunk = &b.0[first * row_bytes..(first + rows) * row_bytes];
            let b_chunk = self.upload(device, &name, b.1, b_chunk, &[rows, rank])?;
            add_scaled(client, chunk, &matmul(client, &b_chunk, &a_t)?, scale)?;
        }
        Ok(())
    }

    /// A linear layer whose output rows are held by `parts`
    /// (`(device, rows)`, in order, covering `0..out`).
    fn proj(&self, prefix: &str, out: usize, inp: usize, bias: bool, parts: &[(usize, Range<usize>)]) -> Result<Proj> {
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

/// Whether a linear layer has a bias (`prefix.bias`) beside its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bias {
    Yes,
    No,
}

impl Bias {
    /// `Yes` where a config flag says the layer has one.
    pub fn when(present: bool) -> Self {
        if present {
            Bias::Yes
        } else {
            Bias::No
        }
    }
}

/// The tensors under a name prefix (`model.layers.3.self_attn`), loaded onto
/// one device: `w.pp("q_proj")` goes one name deeper, `w.on(d)` moves to
/// another device. Every name is the checkpoint's own; model code never
/// spells a full name.
pub struct Weights<'l, 'a, R: Runtime> {
    loader: &'l Loader<'a, R>,
    prefix: String,
    device: usize,
}

impl<'l, 'a, R: Runtime> Weights<'l, 'a, R> {
    /// The tensors under `prefix.name`, on the same device.
    pub fn pp(&self, name: impl Display) -> Weights<'l, 'a, R> {
        let prefix = self.name(name);
        Weights {
            loader: self.loader,
            prefix,
            device: self.device,
        }
    }

    /// The tensors under `prefix` where the checkpoint stores `prefix.probe`,
    /// else these: the `bert.` or `text_model.` that some checkpoints put
    /// before every name.
    pub fn pp_if_stored(&self, prefix: &str, probe: &str) -> Weights<'l, 'a, R> {
        let prefixed = self.pp(prefix);
        if prefixed.contains(probe) {
            prefixed
        } else {
            self.on(self.device)
        }
    }

    /// The same tensors, loaded onto `device`.
    pub fn on(&self, device: usize) -> Weights<'l, 'a, R> {
        Weights {
            loader: self.loader,
            prefix: self.prefix.clone(),
            device,
        }
    }

    pub fn device(&self) -> usize {
        self.device
    }

    /// The client of this device, for a kernel over what was loaded.
    pub fn client(&self) -> &ComputeClient<R> {
        &self.loader.devices[self.device].client
    }

    /// The full checkpoint name of `name` under this prefix.
    pub fn name(&self, name: impl Display) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.loader.checkpoint.contains(&self.name(name))
    }

    /// The 1-D tensor `name` of `len` elements.
    pub fn vector(&self, name: &str, len: usize) -> Result<Tensor> {
        self.loader.vector(self.device, &self.name(name), len)
    }

    /// The 1-D tensor `name` of `len` elements, in f32 on the host.
    pub fn host_vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.loader.host_vector(&self.name(name), len)
    }

    /// Elements `part` of the 1-D tensor `name` (`len` long).
    pub fn vector_part(&self, name: &str, len: usize, part: Range<usize>) -> Result<Tensor> {
        self.loader.vector_part(self.device, &self.name(name), len, part)
    }

    /// The tensor `name` of the shape `stored`, in f32 as `shape` (the
    /// same number of elements: a depthwise convolution's `[channels, 1,
    /// taps]` as `[channels, taps]`).
    pub fn tensor_as(&self, name: &str, stored: &[usize], shape: &[usize]) -> Result<Tensor> {
        if stored.iter().product::<usize>() != shape.iter().product::<usize>() {
            return Err(ModelError::Input(format!(
                "tensor '{}' of shape {stored:?} cannot be held as {shape:?}",
                self.name(name)
            )));
        }
        self.loader.small_tensor(self.device, &self.name(name), stored, shape)
    }

    /// The convolution weight `name`, `[out, inp, k, k]`, in its stored
    /// type as `[out, inp · k²]` rows.
    pub fn conv_weight(&self, name: &str, out: usize, inp: usize, k: usize) -> Result<Weight> {
        self.loader.conv_weight(self.device, &self.name(name), (out, inp, k))
    }

    /// The `[rows, cols]` matrix `name` (an embedding table).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.loader.matrix(self.device, &self.name(name), rows, cols)
    }

    /// The linear layer `name` (`name.weight`: `[out, inp]`, and `name.bias`
    /// if it has one).
    pub fn linear(&self, name: &str, out: usize, inp: usize, bias: Bias) -> Result<Linear> {
        self.loader
            .linear(self.device, &self.name(name), out, inp, bias == Bias::Yes)
    }

    /// Output rows `part` of the linear layer `name` (and of its bias).
    pub fn linear_rows(&self, name: &str, out: usize, inp: usize, bias: Bias, part: Range<usize>) -> Result<Linear> {
        self.loader
            .linear_rows(self.device, &self.name(name), out, inp, bias == Bias::Yes, part)
    }

    /// Input columns `part` of the linear layer `name`, without its bias:
    /// one device's term of a sum that an all-reduce completes.
    pub fn linear_cols(&self, name: &str, out: usize, inp: usize, part: Range<usize>) -> Result<Linear> {
        self.loader.linear_cols(self.device, &self.name(name), out, inp, part)
    }

    /// The output rows `part` of each linear layer `(name, out, part)`
    /// stacked into as few layers as their stored types allow, each with
    /// its rows; `None` where an adapter updates one of them (see
    /// `Loader::linear_stacked`).
    pub fn linear_stacked(
        &self,
        parts: &[(&str, usize, Range<usize>)],
        inp: usize,
        bias: Bias,
    ) -> Result<Option<Vec<(Linear, usize)>>> {
        let parts: Vec<(String, usize, Range<usize>)> = parts
            .iter()
            .map(|(name, out, part)| (self.name(name), *out, part.clone()))
            .collect();
        self.loader.linear_stacked(self.device, &parts, inp, bias == Bias::Yes)
    }

    /// The linear layer `name` with its output rows held by `parts`
    /// (`(device, rows)`, in order, covering `0..out`).
    pub fn proj(
        &self,
        name: &str,
        out: usize,
        inp: usize,
        bias: Bias,
        parts: &[(usize, Range<usize>)],
    ) -> Result<Proj> {
        self.loader.proj(&self.name(name), out, inp, bias == Bias::Yes, parts)
    }
}

/// A LoRA update's factors as raw checkpoint bytes: `a: [rank, inp]`,
/// `b: [out, rank]` (already cut to the slice being loaded).
struct Factors {
    a: (Vec<u8>, WeightType),
    b: (Vec<u8>, WeightType),
    rank: usize,
    inp: usize,
}

/// The bytes of one row of `cols` elements of `dtype`.
fn row_bytes(name: &str, dtype: WeightType, cols: usize) -> Result<usize> {
    dtype.row_bytes(cols).ok_or_else(|| {
        ModelError::Input(format!(
            "tensor '{name}': rows of {cols} {} values are not whole blocks of {}",
            dtype.name(),
            dtype.block_len()
        ))
    })
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
