//! A GGUF file as the loader reads a checkpoint: tensors by transformers'
//! name, in transformers' layout and row order, in their stored type (rows
//! gathered whole where llama.cpp permuted them), or widened to f32 for a
//! slice that cuts through blocks.

use std::borrow::Cow;
use std::path::Path;

use cleave_hf::{ForeignTensors, ReadError, TensorData};

use crate::{GgufError, GgufFile, HfTensor, WeightType};

impl From<GgufError> for ReadError {
    fn from(e: GgufError) -> Self {
        ReadError::Foreign(e.to_string())
    }
}

impl ForeignTensors for GgufFile {
    fn path(&self) -> &Path {
        GgufFile::path(self)
    }

    fn names(&self) -> Vec<String> {
        self.hf_names()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.hf_tensor(name).ok().map(|t| t.shape)
    }

    fn dtype(&self, name: &str) -> Option<WeightType> {
        self.hf_tensor(name).ok().map(|t| t.ty())
    }

    fn read(&self, name: &str) -> cleave_hf::Result<TensorData<'_>> {
        let tensor = self.hf_tensor(name)?;
        if tensor.stored_as_is() {
            as_stored(&tensor)
        } else {
            widened(&tensor)
        }
    }

    fn read_widened(&self, name: &str) -> cleave_hf::Result<TensorData<'_>> {
        let tensor = self.hf_tensor(name)?;
        if tensor.ty().is_float() && tensor.stored_as_is() {
            as_stored(&tensor)
        } else {
            widened(&tensor)
        }
    }

    fn total_bytes(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|t| t.bytes as u64)
            .fold(0, u64::saturating_add)
    }
}

/// The tensor in its stored type, in transformers' row order.
fn as_stored<'a>(tensor: &HfTensor<'a>) -> cleave_hf::Result<TensorData<'a>> {
    Ok(TensorData {
        dtype: tensor.ty(),
        bytes: in_row_order(tensor)?,
    })
}

/// The tensor as transformers' f32 values.
fn widened<'a>(tensor: &HfTensor<'a>) -> cleave_hf::Result<TensorData<'a>> {
    let values = tensor.dequantize()?;
    Ok(TensorData {
        dtype: WeightType::F32,
        bytes: Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
    })
}

/// The stored bytes of a tensor in transformers' row order: borrowed when
/// llama.cpp kept that order, gathered row by row (whole blocks) otherwise.
fn in_row_order<'a>(tensor: &HfTensor<'a>) -> cleave_hf::Result<Cow<'a, [u8]>> {
    let rows = tensor.rows();
    if (0..rows).all(|r| tensor.stored_row(r) == r) {
        return Ok(Cow::Borrowed(tensor.data));
    }
    let mut gathered = Vec::with_capacity(tensor.data.len());
    for r in 0..rows {
        let row = tensor
            .row(r)
            .ok_or_else(|| ReadError::Foreign(format!("tensor '{}': row {r} is not whole blocks", tensor.info.name)))?;
        gathered.extend_from_slice(row);
    }
    Ok(Cow::Owned(gathered))
}
