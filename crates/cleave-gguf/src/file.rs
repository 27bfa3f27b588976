//! A GGUF file mapped into memory: its header, its tensors by GGUF name and
//! by transformers' name, in transformers' layout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::blocks::dequantize;
use crate::error::{GgufError, Result};
use crate::header::{parse, TensorInfo};
use crate::metadata::Metadata;
use crate::names::{hf_name, permuted_projection, stored_row, Projection};
use cleave_types::WeightType;

/// The model architectures cleave runs from GGUF (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
}

impl Architecture {
    /// The prefix of the architecture's own metadata keys (`llama.block_count`).
    pub fn key_prefix(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }
}

pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    alignment: usize,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_gguf_name: HashMap<String, usize>,
    by_hf_name: HashMap<String, usize>,
}

impl GgufFile {
    /// Maps the file and reads its header: every tensor's type, shape and
    /// place in the file is checked here, before anything is read from it.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |e: std::io::Error| GgufError::Io {
            path: path.into(),
            reason: e.to_string(),
        };
        let file = cleave_hf::open_regular(path).map_err(io)?;
        // SAFETY: the mapping is read-only; like every engine that maps
        // checkpoints, we assume the file is not modified while we run.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = parse(path, &map)?;
        let by_gguf_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let by_hf_name = header
            .tensors
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((hf_name(&t.name)?, i)))
            .collect();
        Ok(GgufFile {
            path: path.into(),
            map,
            version: header.version,
            alignment: header.alignment,
            metadata: header.metadata,
            tensors: header.tensors,
            by_gguf_name,
            by_hf_name,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of each tensor's data in the file (`general.alignment`).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Every tensor, in the file's order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor llama.cpp names `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_gguf_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of the tensor llama.cpp names `name`, as stored.
    pub fn tensor_data(&self, name: &str) -> Option<&[u8]> {
        let info = self.tensor(name)?;
        // The header checked that every tensor lies inside the file.
        self.map.get(info.start..info.start + info.bytes)
    }

    /// `general.architecture`, if cleave runs it.
    pub fn architecture(&self) -> Result<Architecture> {
        match self.metadata.str("general.architecture")? {
            "llama" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            other => Err(GgufError::Architecture {
                path: self.path.clone(),
                found: other.to_string(),
            }),
        }
    }

    /// Whether a tensor transformers would call `hf_name` is stored.
    pub fn contains_hf(&self, hf_name: &str) -> bool {
        self.by_hf_name.contains_key(hf_name)
    }

    /// The tensor transformers calls `hf_name`, with its shape in
    /// transformers' order and the row order to undo.
    pub fn hf_tensor(&self, hf_name: &str) -> Result<HfTensor<'_>> {
        let missing = || GgufError::MissingTensor {
            path: self.path.clone(),
            name: hf_name.to_string(),
        };
        let info = self
            .by_hf_name
            .get(hf_name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(missing)?;
        let data = self.tensor_data(&info.name).ok_or_else(missing)?;
        let shape: Vec<usize> = info.dims.iter().rev().copied().collect();
        let permuted_heads = match (self.architecture()?, permuted_projection(&info.name)) {
            (Architecture::Llama, Some(projection)) => Some(self.permuted_heads(info, projection, shape[0])?),
            _ => None,
        };
        Ok(HfTensor {
            path: &self.path,
            data,
            info,
            shape,
            permuted_heads,
        })
    }

    /// The tensor transformers calls `hf_name` as f32 values in
    /// transformers' layout (row-major over its shape, rows in
    /// transformers' order).
    pub fn dequantize_tensor(&self, hf_name: &str) -> Result<Vec<f32>> {
        self.hf_tensor(hf_name)?.dequantize()
    }

    /// The head count the rows of a query or key projection of `rows` rows
    /// were permuted by, checked to divide them into pairs of halves.
    fn permuted_heads(&self, info: &TensorInfo, projection: Projection, rows: usize) -> Result<usize> {
        let arch = self.architecture()?.key_prefix();
        let heads_key = format!("{arch}.attention.head_count");
        let heads = self.metadata.u64(&heads_key)?;
        let heads = match projection {
            Projection::Query => heads,
            Projection::Key => self
                .metadata
                .opt_u64(&format!("{arch}.attention.head_count_kv"))?
                .unwrap_or(heads),
        };
        match usize::try_from(heads) {
            Ok(h) if h > 0 && rows.is_multiple_of(2 * h) => Ok(h),
            _ => Err(GgufError::Tensor {
                path: self.path.clone(),
                name: info.name.clone(),
                reason: format!("its {rows} rows do not split into {heads} heads of pairs of halves"),
            }),
        }
    }
}

/// A tensor under its transformers name.
#[derive(Debug)]
pub struct HfTensor<'a> {
    path: &'a Path,
    pub info: &'a TensorInfo,
    /// transformers' shape: `ne` reversed (a matrix is `[out, in]`).
    pub shape: Vec<usize>,
    /// The bytes as stored: whole blocks of `info.ty`, rows in stored order.
    pub data: &'a [u8],
    /// The head count llama.cpp's converter permuted the rows by, if it did.
    permuted_heads: Option<usize>,
}

impl HfTensor<'_> {
    pub fn ty(&self) -> WeightType {
        self.info.ty
    }

    /// Rows along the first dimension of `shape`.
    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    /// Values in one row (the product of the other dimensions; 1 for a
    /// vector, whose rows are its values).
    pub fn row_len(&self) -> usize {
        self.shape[1..].iter().product()
    }

    /// Where transformers' row `row` is stored: itself, except in the
    /// query and key projections of llama-architecture files.
    pub fn stored_row(&self, row: usize) -> usize {
        match self.permuted_heads {
            Some(heads) => stored_row(row, self.rows(), heads),
            None => row,
        }
    }

    /// The stored bytes of transformers' row `row`, for a caller that
    /// gathers rows without widening them; `None` past the last row or when
    /// a row is not whole blocks (a quantized vector).
    pub fn row(&self, row: usize) -> Option<&[u8]> {
        let ty = self.ty();
        if row >= self.rows() || !self.row_len().is_multiple_of(ty.block_len()) {
            return None;
        }
        let row_bytes = self.row_len() / ty.block_len() * ty.block_bytes();
        let start = self.stored_row(row) * row_bytes;
        self.data.get(start..start + row_bytes)
    }

    /// Every value as f32, in transformers' layout.
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        let elements = self.info.elements();
        let mut stored = self.alloc(elements)?;
        stored.resize(elements, 0.0);
        dequantize(self.ty(), self.data, &mut stored)?;
        if self.permuted_heads.is_none() {
            return Ok(stored);
        }
        let row_len = self.row_len();
        let mut out = self.alloc(elements)?;
        for row in 0..self.rows() {
            let start = self.stored_row(row) * row_len;
            out.extend_from_slice(&stored[start..start + row_len]);
        }
        Ok(out)
    }

    /// An empty vector with room for `n` values: the header bounded `n` by
    /// the file's size, and a machine without the memory gets an error, not
    /// an abort.
    fn alloc(&self, n: usize) -> Result<Vec<f32>> {
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|e| GgufError::Tensor {
            path: self.path.into(),
            name: self.info.name.clone(),
            reason: format!("cannot allocate {n} f32 values: {e}"),
        })?;
        Ok(v)
    }
}
