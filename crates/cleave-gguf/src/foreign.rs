//! A GGUF file as the loader reads a checkpoint: tensors by transformers'
//! name, in transformers' layout and row order. 16- and 32-bit tensors are
//! handed out as stored (rows gathered where llama.cpp permuted them);
//! block-quantized ones are dequantized to f32 on the host, since the
//! device kernels take f32, f16 and bf16 weights.

use std::borrow::Cow;
use std::path::Path;

use cleave_hf::{DType, ForeignTensors, ReadError, TensorData};

use crate::{GgmlType, GgufError, GgufFile, HfTensor};

impl From<GgufError> for ReadError {
    fn from(e: GgufError) -> Self {
        ReadError::Foreign(e.to_string())
    }
}

/// The element type a stored type is handed out in.
fn handed_out(ty: GgmlType) -> DType {
    match ty {
        GgmlType::F16 => DType::F16,
        GgmlType::BF16 => DType::BF16,
        _ => DType::F32,
    }
}

impl ForeignTensors for GgufFile {
    fn path(&self) -> &Path {
        GgufFile::path(self)
    }

    fn names(&self) -> Vec<String> {
        self.tensors().iter().filter_map(|t| crate::hf_name(&t.name)).collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.hf_tensor(name).ok().map(|t| t.shape)
    }

    fn read(&self, name: &str) -> cleave_hf::Result<TensorData<'_>> {
        let tensor = self.hf_tensor(name)?;
        let ty = tensor.ty();
        let dtype = handed_out(ty);
        let bytes = match ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => in_row_order(&tensor)?,
            _ => Cow::Owned(tensor.dequantize()?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        };
        Ok(TensorData { dtype, bytes })
    }

    fn total_bytes(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|t| {
                let size = match handed_out(t.ty) {
                    DType::F32 => 4,
                    DType::F16 | DType::BF16 => 2,
                };
                (t.elements() as u64).saturating_mul(size)
            })
            .fold(0, u64::saturating_add)
    }
}

/// The stored bytes of an unquantized tensor in transformers' row order:
/// borrowed when llama.cpp kept that order, gathered row by row otherwise.
fn in_row_order<'a>(tensor: &HfTensor<'a>) -> cleave_hf::Result<Cow<'a, [u8]>> {
    let rows = tensor.rows();
    if (0..rows).all(|r| tensor.stored_row(r) == r) {
        return Ok(Cow::Borrowed(tensor.data));
    }
    let mut gathered = Vec::with_capacity(tensor.data.len());
    for r in 0..rows {
        let row = tensor
            .row(r)
            .ok_or_else(|| ReadError::Foreign(format!("tensor '{}': row {r} is not whole", tensor.info.name)))?;
        gathered.extend_from_slice(row);
    }
    Ok(Cow::Owned(gathered))
}
