//! Weights that keep the type their checkpoint stores them in: f32, f16 or
//! bf16 from safetensors, or one of llama.cpp's block layouts from GGUF.
//!
//! A [`Weight`] is a row-major matrix whose rows are the checkpoint's bytes
//! as they are, back to back, in one buffer read as u32 words: WGSL has no
//! 8- or 16-bit storage on every device and no bf16 at all, so kernels pull
//! bytes and halves out of words with integer operations (see `decode`).

use std::ops::Range;

use cubecl::prelude::*;
use cubecl::server::Handle;

pub use cleave_types::WeightType;

use crate::workspace::Lease;
use crate::{KernelError, Tensor};

/// A matrix `[rows, cols]` (`nn.Linear`'s `[out, in]`) whose rows are
/// stored as the checkpoint stores them, in one device buffer.
///
/// Cloning is cheap: it shares the buffer.
#[derive(Clone, Debug)]
pub struct Weight {
    /// The rows' bytes back to back, padded with zeros to whole u32 words.
    pub handle: Handle,
    pub rows: usize,
    pub cols: usize,
    pub ty: WeightType,
    /// A workspace buffer's lease, for an f32 tensor seen as a weight.
    lease: Lease,
}

impl Weight {
    /// A weight of its own buffer `handle`, which holds its rows.
    fn in_buffer(handle: Handle, rows: usize, cols: usize, ty: WeightType) -> Self {
        Weight {
            handle,
            rows,
            cols,
            ty,
            lease: Lease::default(),
        }
    }

    /// Uploads `bytes`, `rows` rows of `cols` values of `ty` back to back.
    pub fn upload<R: Runtime>(
        client: &ComputeClient<R>,
        bytes: &[u8],
        ty: WeightType,
        rows: usize,
        cols: usize,
    ) -> Result<Weight, KernelError> {
        let total = stored_bytes("Weight::upload", ty, rows, cols)?;
        if bytes.len() != total {
            return Err(weight_error(
                "Weight::upload",
                format!(
                    "{} bytes given for {rows} rows of {cols} {ty} values, which take {total}",
                    bytes.len()
                ),
            ));
        }
        // Whole words, so that a kernel may read the word holding the last
        // byte; a zero-sized buffer is not allowed on every backend.
        let padded = total.div_ceil(4).max(1) * 4;
        let handle = if padded == total {
            crate::profile::upload(client, bytes)
        } else {
            let mut words = Vec::with_capacity(padded);
            words.extend_from_slice(bytes);
            words.resize(padded, 0);
            crate::profile::upload(client, &words)
        };
        Ok(Weight::in_buffer(handle, rows, cols, ty))
    }

    /// Uploads rows `rows` of a matrix of `cols` values of `ty` whose rows
    /// are `bytes`, back to back: one device's part of a row-split weight.
    pub fn upload_rows<R: Runtime>(
        client: &ComputeClient<R>,
        bytes: &[u8],
        ty: WeightType,
        cols: usize,
        rows: Range<usize>,
    ) -> Result<Weight, KernelError> {
        let row_bytes = stored_bytes("Weight::upload_rows", ty, 1, cols)?;
        let slice = rows
            .start
            .checked_mul(row_bytes)
            .zip(rows.end.checked_mul(row_bytes))
            .and_then(|(start, end)| bytes.get(start..end))
            .ok_or_else(|| {
                weight_error(
                    "Weight::upload_rows",
                    format!(
                        "rows {rows:?} of {cols} {ty} values ({row_bytes} bytes each) are not within {} bytes",
                        bytes.len()
                    ),
                )
            })?;
        Weight::upload(client, slice, ty, rows.len(), cols)
    }

    /// An uninitialised weight of `rows` rows of `cols` values of `ty` (a
    /// KV cache, written before it is read).
    pub fn empty<R: Runtime>(
        client: &ComputeClient<R>,
        ty: WeightType,
        rows: usize,
        cols: usize,
    ) -> Result<Weight, KernelError> {
        let total = stored_bytes("empty", ty, rows, cols)?;
        let handle = crate::profile::empty(client, total.div_ceil(4) * 4);
        Ok(Weight::in_buffer(handle, rows, cols, ty))
    }

    /// An f32 tensor as a weight, sharing its buffer: its last dimension
    /// is the columns.
    pub fn from_tensor(tensor: Tensor) -> Weight {
        Weight {
            rows: tensor.rows(),
            cols: tensor.cols(),
            ty: WeightType::F32,
            lease: tensor.lease(),
            handle: tensor.handle,
        }
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        // `upload` checked that the rows are whole blocks and the total fits.
        self.cols / self.ty.block_len() * self.ty.block_bytes()
    }

    /// Bytes the rows take on the device, padding not counted.
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes()
    }

    /// The buffer as `len` u32 words, for a kernel argument.
    pub(crate) fn words_arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer was allocated with the rows' bytes rounded up
        // to whole words, at least one.
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.bytes().div_ceil(4).max(1)) }
    }

    /// The same buffer as an f32 tensor `[rows, cols]`, for an F32 weight.
    pub fn as_f32(&self) -> Option<Tensor> {
        (self.ty == WeightType::F32).then(|| self.as_f32_tensor())
    }

    /// The same buffer as an f32 tensor `[rows, cols]`; only for F32.
    pub(crate) fn as_f32_tensor(&self) -> Tensor {
        debug_assert_eq!(self.ty, WeightType::F32);
        Tensor::from_handle(self.handle.clone(), &[self.rows, self.cols]).with_lease(self.lease.clone())
    }
}

/// Bytes of `rows` rows of `cols` values of `ty`, checked to be whole
/// blocks and to be addressable by the kernels' u32 byte offsets.
fn stored_bytes(op: &'static str, ty: WeightType, rows: usize, cols: usize) -> Result<usize, KernelError> {
    let row_bytes = ty.row_bytes(cols).ok_or_else(|| {
        weight_error(
            op,
            format!("rows of {cols} {ty} values are not whole blocks of {}", ty.block_len()),
        )
    })?;
    match row_bytes.checked_mul(rows) {
        // Kernels address bytes with u32 offsets, one word past the last.
        Some(total) if total <= u32::MAX as usize - 8 => Ok(total),
        _ => Err(weight_error(
            op,
            format!("{rows} rows of {cols} {ty} values do not fit one buffer addressed by u32 byte offsets"),
        )),
    }
}

fn weight_error(op: &'static str, problem: String) -> KernelError {
    KernelError::Weight { op, problem }
}
