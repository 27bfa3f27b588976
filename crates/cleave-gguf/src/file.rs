//! A GGUF file mapped into memory: its header, its tensors by GGUF name and
//! by transformers' name, in transformers' layout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::blocks::dequantize;
use crate::error::{GgufError, Result};
use crate::header::{parse, TensorInfo};
use crate::metadata::Metadata;
use crate::names::{hf_names, hf_shape, permuted_projection, stored_as, stored_row, HfNames, Projection, StoredAs};
use cleave_types::WeightType;

/// The model architectures cleave runs from GGUF: llama.cpp's
/// `general.architecture`, with Mixtral told apart from Llama by its
/// experts (llama.cpp runs both as `llama`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mixtral,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Phi3,
    Gemma2,
    Gemma3,
    Gemma4,
    GptOss,
    Qwen35,
    Qwen35Moe,
}

/// The architectures as `general.architecture` names them, each its own
/// metadata prefix; Mixtral is `llama` with experts.
const NAMED: [Architecture; 11] = [
    Architecture::Llama,
    Architecture::Qwen2,
    Architecture::Qwen3,
    Architecture::Qwen3Moe,
    Architecture::Phi3,
    Architecture::Gemma2,
    Architecture::Gemma3,
    Architecture::Gemma4,
    Architecture::GptOss,
    Architecture::Qwen35,
    Architecture::Qwen35Moe,
];

/// `general.architecture` values cleave reads.
pub const ARCHITECTURES: [&str; 11] = {
    let mut names = [""; 11];
    let mut i = 0;
    while i < NAMED.len() {
        names[i] = NAMED[i].key_prefix();
        i += 1;
    }
    names
};

impl Architecture {
    /// The prefix of the architecture's own metadata keys (`llama.block_count`).
    pub const fn key_prefix(self) -> &'static str {
        match self {
            Architecture::Llama | Architecture::Mixtral => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Phi3 => "phi3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Gemma4 => "gemma4",
            Architecture::GptOss => "gpt-oss",
            Architecture::Qwen35 => "qwen35",
            Architecture::Qwen35Moe => "qwen35moe",
        }
    }

    /// The architecture `general.architecture` names, `None` for one
    /// cleave does not read; `llama` with experts is Mixtral.
    fn of(metadata: &Metadata) -> Result<Option<Self>> {
        let name = metadata.str("general.architecture")?;
        let Some(&arch) = NAMED.iter().find(|a| a.key_prefix() == name) else {
            return Ok(None);
        };
        if arch == Architecture::Llama && metadata.opt_u64("llama.expert_count")?.unwrap_or(0) > 0 {
            return Ok(Some(Architecture::Mixtral));
        }
        Ok(Some(arch))
    }
}

/// Where a transformers tensor lies: the GGUF tensor, and which expert's
/// matrix of a stack of experts.
#[derive(Clone, Copy, Debug)]
struct Located {
    tensor: usize,
    expert: Option<usize>,
}

pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    alignment: usize,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_gguf_name: HashMap<String, usize>,
    by_hf_name: HashMap<String, Located>,
    /// `general.architecture` as cleave reads it, `None` when it does not.
    architecture: Option<Architecture>,
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
        // A file of an architecture cleave does not read opens, so that
        // its header can be shown; `architecture()` refuses it by name.
        let architecture = Architecture::of(&header.metadata).ok().flatten();
        let by_hf_name = match architecture {
            Some(arch) => transformers_names(path, arch, &header.tensors)?,
            None => HashMap::new(),
        };
        Ok(GgufFile {
            path: path.into(),
            map,
            version: header.version,
            alignment: header.alignment,
            metadata: header.metadata,
            tensors: header.tensors,
            by_gguf_name,
            by_hf_name,
            architecture,
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
        match self.architecture {
            Some(arch) => Ok(arch),
            // Read again for the error it gives, or the name it holds.
            None => Err(GgufError::Architecture {
                path: self.path.clone(),
                found: self.metadata.str("general.architecture")?.to_string(),
            }),
        }
    }

    /// Every tensor's transformers name (each expert's of a stack), in no
    /// particular order.
    pub fn hf_names(&self) -> Vec<String> {
        self.by_hf_name.keys().cloned().collect()
    }

    /// The transformers names of the GGUF tensor `gguf`: one, or one per
    /// expert of a stack, in expert order; none for a tensor transformers
    /// has no counterpart for.
    pub fn hf_names_of(&self, gguf: &str) -> Vec<String> {
        let mut names: Vec<(&String, Located)> = self
            .by_hf_name
            .iter()
            .filter(|(_, at)| self.tensors[at.tensor].name == gguf)
            .map(|(name, at)| (name, *at))
            .collect();
        names.sort_by_key(|(_, at)| at.expert);
        names.into_iter().map(|(name, _)| name.clone()).collect()
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
        let at = *self.by_hf_name.get(hf_name).ok_or_else(missing)?;
        let info = &self.tensors[at.tensor];
        let whole = self.tensor_data(&info.name).ok_or_else(missing)?;
        let (data, dims) = match at.expert {
            // `transformers_names` checked that a stack has two or three
            // dimensions (a stack of biases or of matrices), the experts
            // outermost.
            Some(expert) => {
                let (experts, each) = info.dims.split_last().expect("a stack has dimensions");
                let per_expert = info.bytes / experts;
                (&whole[expert * per_expert..(expert + 1) * per_expert], each)
            }
            None => (whole, &info.dims[..]),
        };
        let arch = self.architecture()?;
        let shape = hf_shape(arch, &info.name, dims.iter().rev().copied().collect());
        let permuted_heads = match permuted_projection(arch, &info.name) {
            Some(projection) => Some(self.permuted_heads(info, projection, shape[0])?),
            None => None,
        };
        Ok(HfTensor {
            path: &self.path,
            data,
            info,
            shape,
            permuted_heads,
            stored_as: stored_as(arch, &info.name),
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
    /// How the values are stored (`1 + w` for Gemma's norms, say).
    stored_as: StoredAs,
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

    /// Whether the stored values are transformers' own (not Gemma's norms
    /// plus one, say): where not, a reader takes
    /// [`HfTensor::dequantize`]'s values instead of the bytes as stored.
    pub fn stored_as_is(&self) -> bool {
        self.stored_as == StoredAs::Itself
    }

    /// Every value as f32, in transformers' layout.
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        let elements = self.shape.iter().product();
        let mut stored = self.alloc(elements)?;
        stored.resize(elements, 0.0);
        dequantize(self.ty(), self.data, &mut stored)?;
        match self.stored_as {
            StoredAs::Itself => {}
            StoredAs::PlusOne => stored.iter_mut().for_each(|v| *v -= 1.0),
            StoredAs::NegatedExp => {
                for v in &mut stored {
                    *v = (-*v).ln();
                    if !v.is_finite() {
                        return Err(GgufError::Tensor {
                            path: self.path.into(),
                            name: self.info.name.clone(),
                            reason: "holds a value that is not negative (it is -exp(A_log))".into(),
                        });
                    }
                }
            }
        }
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

/// Each tensor's transformers name(s) in a file of `arch`: a stack of
/// experts (three dimensions, or two for their biases, the experts
/// outermost) gives one per expert.
fn transformers_names(path: &Path, arch: Architecture, tensors: &[TensorInfo]) -> Result<HashMap<String, Located>> {
    let mut names = HashMap::new();
    for (tensor, info) in tensors.iter().enumerate() {
        let Some(hf) = hf_names(arch, &info.name) else { continue };
        let experts = match (&hf, info.dims.as_slice()) {
            (HfNames::One(_), _) => 0,
            (HfNames::Experts(_), &[_, _, experts]) if experts > 0 => experts,
            (HfNames::Experts(_), &[_, experts]) if experts > 0 && info.name.ends_with(".bias") => experts,
            (HfNames::Experts(_), _) => {
                return Err(GgufError::Tensor {
                    path: path.into(),
                    name: info.name.clone(),
                    reason: format!(
                        "a stack of experts needs three dimensions (two for biases), not {:?}",
                        info.dims
                    ),
                })
            }
        };
        for (name, expert) in hf.expand(experts) {
            names.insert(name, Located { tensor, expert });
        }
    }
    Ok(names)
}
