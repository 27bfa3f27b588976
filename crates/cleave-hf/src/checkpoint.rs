//! The weights of a model directory: `model.safetensors`, or shards listed
//! by `model.safetensors.index.json`, memory-mapped and never copied whole;
//! or a file of another format (GGUF) that a reader of its own presents
//! by transformers' names ([`ForeignTensors`]).

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::error::{read_json, ReadError, Result};
use crate::part::{mxfp4_blocks, Cut, Elements};
pub use cleave_types::WeightType;

/// One tensor's bytes: straight from the mapped file, or made from what a
/// foreign file stores.
pub struct TensorData<'a> {
    pub dtype: WeightType,
    pub bytes: Cow<'a, [u8]>,
}

/// Tensors of a file in another format, by transformers' names and in
/// transformers' layout, as a reader of that format presents them.
pub trait ForeignTensors: Send + Sync {
    /// The file, for messages.
    fn path(&self) -> &Path;
    /// Every tensor's transformers name.
    fn names(&self) -> Vec<String>;
    /// The shape of `name` in transformers' layout (`[out, in]`), if the
    /// file has it.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// The type `name` is stored in, if the file has it.
    fn dtype(&self, name: &str) -> Option<WeightType>;
    /// The elements of `name` as stored (a block type stays in blocks).
    fn read(&self, name: &str) -> Result<TensorData<'_>>;
    /// The elements of `name` as f32: for a slice that cuts through blocks.
    fn read_widened(&self, name: &str) -> Result<TensorData<'_>>;
    /// Bytes `read` hands out over all tensors: what loading reads.
    fn total_bytes(&self) -> u64;
}

impl TensorData<'_> {
    /// The elements as f32 on the host (for small tables the host uses);
    /// `None` for a block type.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        Some(match self.dtype {
            WeightType::F32 => self
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            WeightType::F16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            WeightType::BF16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => return None,
        })
    }
}

/// A shard's bytes: mapped from the file (kept open, to notice it
/// shrinking), or read into host memory.
enum Bytes {
    Mapped(Mmap, File),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m, _) => m,
            Bytes::Owned(v) => v,
        }
    }
}

struct Shard {
    path: PathBuf,
    mmap: Bytes,
    /// Where the data section starts: after the 8-byte length and the header.
    data_start: usize,
    metadata: Metadata,
}

impl Shard {
    fn open(path: PathBuf) -> Result<Self> {
        let invalid = |reason: String| ReadError::Safetensors {
            path: path.clone(),
            reason,
        };
        let file = crate::file::open_regular(&path).map_err(|e| ReadError::in_file(path.clone(), e))?;
        // SAFETY: the mapping is read-only; like every engine that maps
        // checkpoints, we assume the file is not modified while we run.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| invalid(e.to_string()))?;
        // Checks the header and that the file holds every byte it promises,
        // so a truncated download fails here, by name.
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| invalid(describe(e, &mmap)))?;
        Ok(Shard {
            path,
            mmap: Bytes::Mapped(mmap, file),
            data_start: 8 + header_len,
            metadata,
        })
    }

    /// Fails, naming the file, when a mapped file no longer holds `end`
    /// bytes: reading a mapped page past the end of a file that shrank
    /// under us (a checkpoint replaced while blocks stream from it) would
    /// kill the process with SIGBUS instead.
    fn check_holds(&self, end: usize) -> Result<()> {
        let Bytes::Mapped(_, file) = &self.mmap else {
            return Ok(());
        };
        let len = file
            .metadata()
            .map_err(|e| ReadError::in_file(self.path.clone(), e))?
            .len();
        if len < end as u64 {
            return Err(ReadError::in_file(
                self.path.clone(),
                format!("the file shrank to {len} bytes while in use (the weights need {end}): was it replaced?"),
            ));
        }
        Ok(())
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.metadata.info(name)
    }
}

/// The stored tensors a part is cut from.
enum Source {
    /// One tensor.
    Tensor(String),
    /// An MXFP4 stack in the published gpt-oss layout (see
    /// [`Checkpoint::cut_mxfp4`]): its codes and its exponents, cut alike
    /// and joined into llama.cpp's blocks.
    Mxfp4 { blocks: String, scales: String },
}

/// A part of stored tensors ([`Checkpoint::cut`]), found within them:
/// `stored_shape` is the cut tensor's (an MXFP4 stack's scales').
struct PartOf<'a> {
    source: &'a Source,
    cut: &'a Cut,
    stored_shape: Vec<usize>,
    /// The part's own shape.
    shape: Vec<usize>,
}

/// The type of a safetensors dtype, if cleave reads it: by the name the
/// header spells it with ("BF16", safetensors' `Display`), which the table
/// keeps.
fn float_dtype(dtype: Dtype) -> Option<WeightType> {
    WeightType::from_safetensors(&dtype.to_string())
}

fn describe(error: safetensors::SafeTensorError, file: &[u8]) -> String {
    use safetensors::SafeTensorError as E;
    let file_len = file.len();
    match error {
        E::MetadataIncompleteBuffer => {
            format!("the file is {file_len} bytes, which does not match its header (truncated or corrupt download?)")
        }
        E::HeaderTooSmall => format!("the file is only {file_len} bytes, too short for a header"),
        // safetensors' own messages for these leave the tensor unnamed.
        E::TensorInvalidInfo | E::ValidationOverflow | E::MisalignedSlice => {
            misdescribed_tensor(file).unwrap_or_else(|| error.to_string())
        }
        other => other.to_string(),
    }
}

/// The first tensor, in the order of its data, whose shape and type do not
/// match the bytes its `data_offsets` give it, and how: found again here
/// because safetensors' validation does not say which tensor failed.
fn misdescribed_tensor(file: &[u8]) -> Option<String> {
    let header_len = usize::try_from(u64::from_le_bytes(file.get(..8)?.try_into().ok()?)).ok()?;
    let header: HashMap<String, serde_json::Value> =
        serde_json::from_slice(file.get(8..8usize.checked_add(header_len)?)?).ok()?;
    let mut tensors: Vec<(String, TensorInfo)> = header
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .filter_map(|(name, info)| Some((name, serde_json::from_value(info).ok()?)))
        .collect();
    tensors.sort_by_key(|(_, info)| info.data_offsets);
    tensors.into_iter().find_map(|(name, info)| {
        let (start, end) = info.data_offsets;
        let bits = info
            .shape
            .iter()
            .try_fold(info.dtype.bitsize(), |bits, &dim| bits.checked_mul(dim));
        let described = match bits {
            None => "overflows".to_string(),
            Some(bits) if bits % 8 != 0 => format!("is {bits} bits, not whole bytes"),
            Some(bits) if end.checked_sub(start) == Some(bits / 8) => return None,
            Some(bits) => format!("is {} bytes", bits / 8),
        };
        Some(format!(
            "tensor '{name}': shape {:?} of {:?} {described}, but its data_offsets [{start}, {end}] give it {} bytes",
            info.shape,
            info.dtype,
            end.saturating_sub(start)
        ))
    })
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

/// All tensors of a model directory.
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<Shard>,
    /// Tensor name to the shard that holds it.
    index: HashMap<String, usize>,
    /// The file of another format the tensors come from instead of shards.
    foreign: Option<Box<dyn ForeignTensors>>,
    /// Names that stand for a part of a stored tensor ([`Cut`]): the parts
    /// of a fused projection (Phi-3's `qkv_proj` as `q_proj`, `k_proj`,
    /// `v_proj`; Qwen3.5's `q_proj`, each head's query rows then its
    /// gate's, as the two), one expert's weights of a stack of them.
    parts: HashMap<String, (Source, Cut)>,
    /// The stored name of each tensor renamed by [`Checkpoint::rename_prefix`].
    stored_names: HashMap<String, String>,
}

impl Checkpoint {
    /// One safetensors file on its own (a LoRA adapter's weights).
    pub fn open_file(path: &Path) -> Result<Self> {
        let shard = Shard::open(path.to_path_buf())?;
        let index = shard.metadata.tensors().into_keys().map(|name| (name, 0)).collect();
        Ok(Checkpoint {
            dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
            shards: vec![shard],
            index,
            foreign: None,
            parts: HashMap::new(),
            stored_names: HashMap::new(),
        })
    }

    /// The tensors of a file of another format.
    pub fn foreign(tensors: Box<dyn ForeignTensors>) -> Self {
        Checkpoint {
            dir: tensors.path().to_path_buf(),
            shards: Vec::new(),
            index: tensors.names().into_iter().map(|name| (name, 0)).collect(),
            foreign: Some(tensors),
            parts: HashMap::new(),
            stored_names: HashMap::new(),
        }
    }

    /// Makes each `(name, runs)` of `parts` stand for those runs of rows
    /// of the stored tensor `stored` (`[rows, cols]`), one after another: a
    /// fused projection loads as its parts, with no copy where a part is
    /// one run (the stacked parts of Phi-3's `qkv_proj`), copied out where
    /// its runs interleave with another's (each head's query rows, then
    /// its gate's, of Qwen3.5's `q_proj`). Does nothing when `stored` is
    /// absent.
    pub fn split_rows(&mut self, stored: &str, parts: &[(String, Vec<Range<usize>>)]) {
        for (name, runs) in parts {
            self.cut(stored, name, Cut::rows(runs.clone()));
        }
    }

    /// Makes `name` stand for the part `cut` of the stored tensor
    /// `stored` (copied out where it is not one run of its bytes). Does
    /// nothing when `stored` is absent.
    pub fn cut(&mut self, stored: &str, name: &str, cut: Cut) {
        if self.contains(stored) {
            self.parts
                .insert(name.to_string(), (Source::Tensor(stored.to_string()), cut));
        }
    }

    /// Makes `name` stand for MXFP4 rows (in llama.cpp's blocks) cut
    /// alike from an MXFP4 stack as the published gpt-oss checkpoints
    /// store it: `blocks` (uint8 `[.., rows, groups, 16]`, two 4-bit codes
    /// a byte) and `scales` (uint8 `[.., rows, groups]`, an exponent a
    /// group of 32). Does nothing unless both are stored.
    pub fn cut_mxfp4(&mut self, (blocks, scales): (&str, &str), name: &str, cut: Cut) {
        if self.contains(blocks) && self.contains(scales) {
            let source = Source::Mxfp4 {
                blocks: blocks.to_string(),
                scales: scales.to_string(),
            };
            self.parts.insert(name.to_string(), (source, cut));
        }
    }

    /// Makes every tensor stored under `from` answer to the name with `to`
    /// in its place (a multimodal checkpoint's `model.language_model.`
    /// read as a language model's `model.`); the stored names no longer
    /// answer. Does nothing for a file of another format.
    pub fn rename_prefix(&mut self, from: &str, to: &str) {
        if self.foreign.is_some() {
            return;
        }
        let renamed: Vec<String> = self.index.keys().filter(|n| n.starts_with(from)).cloned().collect();
        for stored in renamed {
            if let Some(shard) = self.index.remove(&stored) {
                let name = format!("{to}{}", &stored[from.len()..]);
                self.index.insert(name.clone(), shard);
                self.stored_names.insert(name, stored);
            }
        }
    }

    /// The names that stand for rows of the stored tensor `stored`.
    pub fn parts_of(&self, stored: &str) -> Vec<&str> {
        self.parts
            .iter()
            .filter(|(_, (of, _))| matches!(of, Source::Tensor(of) if of == stored))
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// The weights of a model directory: transformers' `model.safetensors`
    /// (or its shard index), else diffusers' `diffusion_pytorch_model.*`.
    pub fn open(dir: &Path) -> Result<Self> {
        let stem = ["model", "diffusion_pytorch_model"]
            .into_iter()
            .find(|stem| {
                dir.join(format!("{stem}.safetensors.index.json")).exists()
                    || dir.join(format!("{stem}.safetensors")).exists()
            })
            .unwrap_or("model");
        let index_path = dir.join(format!("{stem}.safetensors.index.json"));
        let single = dir.join(format!("{stem}.safetensors"));
        let (shards, index) = if index_path.exists() {
            let map: ShardIndex = read_json(&index_path)?;
            let files: BTreeSet<&String> = map.weight_map.values().collect();
            // A shard is a file beside the index, never a path out of the
            // directory (`../../etc/passwd`).
            let plain = |f: &str| Path::new(f).file_name().and_then(|n| n.to_str()) == Some(f);
            if let Some(bad) = files.iter().find(|f| !plain(f)) {
                return Err(ReadError::in_file(
                    index_path,
                    format!("shard '{bad}' is not a file name in the model directory"),
                ));
            }
            let shards = files
                .iter()
                .map(|f| Shard::open(dir.join(f)))
                .collect::<Result<Vec<_>>>()?;
            let position = |file: &String| files.iter().position(|f| *f == file).unwrap_or(0);
            let index = map
                .weight_map
                .iter()
                .map(|(name, file)| (name.clone(), position(file)))
                .collect();
            (shards, index)
        } else if single.exists() {
            let shard = Shard::open(single)?;
            let index = shard.metadata.tensors().into_keys().map(|name| (name, 0)).collect();
            (vec![shard], index)
        } else {
            return Err(ReadError::NoWeights { dir: dir.to_path_buf() });
        };
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            shards,
            index,
            foreign: None,
            parts: HashMap::new(),
            stored_names: HashMap::new(),
        })
    }

    /// Reads every file into host memory, so that blocks streamed from the
    /// host never touch the disk again (`--residency host`).
    pub fn read_into_memory(&mut self) {
        for shard in &mut self.shards {
            if let Bytes::Mapped(map, _) = &shard.mmap {
                shard.mmap = Bytes::Owned(map.to_vec());
            }
        }
    }

    /// Tells the OS that `bytes` (a tensor just uploaded) will not be read
    /// again soon, so its pages leave this process's resident memory now
    /// instead of piling up to the model's size while it loads. They stay
    /// in the page cache and fault back in if the tensor is read again.
    pub fn release(&self, bytes: &[u8]) {
        #[cfg(unix)]
        for shard in &self.shards {
            if let Bytes::Mapped(map, _) = &shard.mmap {
                let start = map.as_ptr() as usize;
                let at = bytes.as_ptr() as usize;
                if at >= start && at + bytes.len() <= start + map.len() {
                    // SAFETY: the mapping is shared and read-only, so the
                    // dropped pages read back from the file unchanged.
                    let _ = unsafe {
                        map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at - start, bytes.len())
                    };
                }
            }
        }
        #[cfg(not(unix))]
        let _ = bytes;
    }

    /// The directory (or file) the checkpoint was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes of tensor data in all files: what loading reads.
    pub fn total_bytes(&self) -> u64 {
        if let Some(foreign) = &self.foreign {
            return foreign.total_bytes();
        }
        self.shards.iter().map(|s| (s.mmap.len() - s.data_start) as u64).sum()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name) || self.parts.contains_key(name)
    }

    /// The types weights are stored in, each once, by name: those of the
    /// stored tensors, and of the parts cut from them (MXFP4 experts
    /// joined from bytes).
    pub fn weight_types(&self) -> Vec<WeightType> {
        let stored = self.names().filter_map(|name| self.dtype(name));
        let parts = self.parts.keys().filter_map(|name| self.dtype(name));
        let mut types: Vec<WeightType> = stored.chain(parts).collect();
        types.sort_unstable_by_key(|ty| ty.name());
        types.dedup();
        types
    }

    /// The names of every tensor, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Fails unless the checkpoint has `name` with `shape`, without reading
    /// its elements (which, for a foreign file, may mean converting them).
    pub fn expect_shape(&self, name: &str, shape: &[usize]) -> Result<()> {
        if let Some(part) = self.part(name) {
            return self.expect_part_shape(name, &part?.shape, shape);
        }
        let (path, got) = match &self.foreign {
            Some(foreign) => (&self.dir, foreign.shape(name).ok_or_else(|| self.missing(name))?),
            None => {
                let (shard, info) = self.located(name)?;
                (&shard.path, info.shape.clone())
            }
        };
        if got != shape {
            return Err(ReadError::TensorShape {
                name: name.to_string(),
                path: path.clone(),
                got,
                expected: shape.to_vec(),
            });
        }
        Ok(())
    }

    /// The part `name` stands for, which must lie within its stored
    /// tensor.
    fn part(&self, name: &str) -> Option<Result<PartOf<'_>>> {
        let (source, cut) = self.parts.get(name)?;
        Some(self.part_shape(name, source, cut).map(|(stored_shape, shape)| PartOf {
            source,
            cut,
            stored_shape,
            shape,
        }))
    }

    /// The shape of the tensor `source` cuts from (an MXFP4 stack's
    /// scales) and of the part `name`, which `cut` takes of it.
    fn part_shape(&self, name: &str, source: &Source, cut: &Cut) -> Result<(Vec<usize>, Vec<usize>)> {
        let stored_shape = |stored: &str| match &self.foreign {
            Some(foreign) => foreign.shape(stored).ok_or_else(|| self.missing(stored)),
            None => self.located(stored).map(|(_, info)| info.shape.clone()),
        };
        let (stored, shape) = match source {
            Source::Tensor(stored) => (stored, stored_shape(stored)?),
            Source::Mxfp4 { blocks, scales } => {
                let (codes, exponents) = (stored_shape(blocks)?, stored_shape(scales)?);
                if codes.len() != exponents.len() + 1
                    || codes[..exponents.len()] != exponents[..]
                    || codes.last() != Some(&16)
                {
                    return Err(ReadError::in_file(
                        self.dir.clone(),
                        format!(
                            "MXFP4 blocks '{blocks}' {codes:?} and scales '{scales}' {exponents:?} disagree: the \
                             blocks must have the scales' shape and 16 bytes more"
                        ),
                    ));
                }
                (scales, exponents)
            }
        };
        let part = cut
            .shape(&shape)
            .map_err(|reason| self.bad_part(name, stored, &shape, reason))?;
        Ok(match (source, &part[..]) {
            (Source::Tensor(_), _) => (shape, part),
            (Source::Mxfp4 { .. }, &[rows, groups]) => (shape, vec![rows, groups * 32]),
            (Source::Mxfp4 { .. }, _) => {
                let reason = "an MXFP4 part is a matrix".to_string();
                return Err(self.bad_part(name, stored, &shape, reason));
            }
        })
    }

    fn bad_part(&self, name: &str, stored: &str, shape: &[usize], reason: String) -> ReadError {
        ReadError::in_file(
            self.dir.clone(),
            format!("tensor '{name}' is a part of '{stored}' {shape:?}, but {reason}"),
        )
    }

    fn expect_part_shape(&self, name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
        if got != expected {
            return Err(ReadError::TensorShape {
                name: name.to_string(),
                path: self.dir.clone(),
                got: got.to_vec(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }

    fn missing(&self, name: &str) -> ReadError {
        ReadError::MissingTensor {
            name: name.to_string(),
            dir: self.dir.clone(),
        }
    }

    /// The shard holding `name`, and its entry there.
    fn located(&self, name: &str) -> Result<(&Shard, &TensorInfo)> {
        let shard = self
            .index
            .get(name)
            .and_then(|&i| self.shards.get(i))
            .ok_or_else(|| self.missing(name))?;
        let stored = self.stored_names.get(name).map_or(name, String::as_str);
        // The index may name a shard that does not hold the tensor.
        let info = shard.info(stored).ok_or_else(|| ReadError::Safetensors {
            path: shard.path.clone(),
            reason: format!("the shard index puts tensor '{name}' in this shard, which does not hold it"),
        })?;
        Ok((shard, info))
    }

    /// The type `name` is stored in, if the checkpoint has it in a type
    /// cleave reads.
    pub fn dtype(&self, name: &str) -> Option<WeightType> {
        let stored = match self.parts.get(name) {
            Some((Source::Mxfp4 { .. }, _)) => return Some(WeightType::MXFP4),
            Some((Source::Tensor(stored), _)) => stored.as_str(),
            None => name,
        };
        match &self.foreign {
            Some(foreign) => foreign.dtype(stored),
            None => self.located(stored).ok().and_then(|(_, info)| float_dtype(info.dtype)),
        }
    }

    /// The shape `name` is stored with, if the checkpoint has it.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        if let Some(Ok(part)) = self.part(name) {
            return Some(part.shape);
        }
        match &self.foreign {
            Some(foreign) => foreign.shape(name),
            None => self.located(name).ok().map(|(_, info)| info.shape.clone()),
        }
    }

    /// Bytes the loader puts on a device for the tensor `name` and every
    /// float tensor under `name.`: matrices (2-D) and convolution kernels
    /// (4-D) as stored, everything else (vectors) widened to f32; integer buffers
    /// (`position_ids`) are not loaded. How a module whose every tensor
    /// under a prefix goes to one device counts its bytes.
    pub fn device_bytes(&self, name: &str) -> u64 {
        let under = format!("{name}.");
        self.names()
            .filter(|n| (*n == name || n.starts_with(&under)) && self.dtype(n).is_some())
            .filter_map(|n| Some((n, self.shape(n)?)))
            .map(|(n, shape)| match shape[..] {
                [rows, cols] => self.matrix_bytes(n, rows, cols),
                // A convolution's weight, kept in its type as `[out, in · k²]`.
                [out, inp, kh, kw] => self.matrix_bytes(n, out, inp.saturating_mul(kh).saturating_mul(kw)),
                _ => shape.iter().fold(4u64, |bytes, &d| bytes.saturating_mul(d as u64)),
            })
            .fold(0, u64::saturating_add)
    }

    /// Bytes the loader puts on a device for the `[rows, cols]` matrix
    /// `name`: its rows as stored, or in f32 where the type is unknown
    /// (the tensor is missing, and loading will say so).
    pub fn matrix_bytes(&self, name: &str, rows: usize, cols: usize) -> u64 {
        let row = self
            .dtype(name)
            .and_then(|d| d.row_bytes(cols))
            .unwrap_or(cols.saturating_mul(4));
        (row as u64).saturating_mul(rows as u64)
    }

    /// The tensor called `name`, which must have `shape`, as f32 or a 16-bit
    /// float: a block type widened to f32, for a slice that cuts blocks.
    pub fn tensor_widened(&self, name: &str, shape: &[usize]) -> Result<TensorData<'_>> {
        match &self.foreign {
            Some(foreign) if !self.parts.contains_key(name) => {
                self.expect_shape(name, shape)?;
                foreign.read_widened(name)
            }
            _ => self.tensor(name, shape),
        }
    }

    /// The elements of `part`, the part `name` stands for.
    fn part_data(&self, name: &str, part: &PartOf) -> Result<TensorData<'_>> {
        let PartOf {
            source,
            cut,
            stored_shape,
            ..
        } = part;
        let failed = |stored: &str, reason| self.bad_part(name, stored, stored_shape, reason);
        match source {
            Source::Tensor(stored) => {
                let whole = self.tensor(stored, stored_shape)?;
                let elements = Elements::Typed(whole.dtype);
                let bytes = cut
                    .bytes(stored_shape, elements, whole.bytes)
                    .map_err(|r| failed(stored, r))?;
                Ok(TensorData {
                    dtype: whole.dtype,
                    bytes,
                })
            }
            Source::Mxfp4 { blocks, scales } => {
                // 16 bytes of codes for each exponent.
                let mut code_shape = stored_shape.clone();
                if let Some(groups) = code_shape.last_mut() {
                    *groups *= 16;
                }
                let codes = Cow::Borrowed(self.stored_bytes(blocks)?);
                let codes = cut
                    .bytes(&code_shape, Elements::Bytes, codes)
                    .map_err(|r| failed(blocks, r))?;
                let exponents = Cow::Borrowed(self.stored_bytes(scales)?);
                let exponents = cut
                    .bytes(stored_shape, Elements::Bytes, exponents)
                    .map_err(|r| failed(scales, r))?;
                Ok(TensorData {
                    dtype: WeightType::MXFP4,
                    bytes: Cow::Owned(mxfp4_blocks(&codes, &exponents)),
                })
            }
        }
    }

    /// The bytes of the uint8 tensor `name` of a safetensors file.
    fn stored_bytes(&self, name: &str) -> Result<&[u8]> {
        let (shard, info) = self.located(name)?;
        if info.dtype != Dtype::U8 {
            return Err(ReadError::TensorDtype {
                name: name.to_string(),
                path: shard.path.clone(),
                dtype: format!("{:?} (MXFP4 blocks and scales are U8)", info.dtype),
            });
        }
        let (start, end) = info.data_offsets;
        shard.check_holds(shard.data_start + end)?;
        Ok(&shard.mmap[shard.data_start + start..shard.data_start + end])
    }

    /// The tensor called `name`, which must have `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<TensorData<'_>> {
        if let Some(part) = self.part(name) {
            let part = part?;
            self.expect_part_shape(name, &part.shape, shape)?;
            return self.part_data(name, &part);
        }
        self.expect_shape(name, shape)?;
        if let Some(foreign) = &self.foreign {
            return foreign.read(name);
        }
        let (shard, info) = self.located(name)?;
        let dtype = float_dtype(info.dtype).ok_or_else(|| ReadError::TensorDtype {
            name: name.to_string(),
            path: shard.path.clone(),
            dtype: format!("{:?}", info.dtype),
        })?;
        let (start, end) = info.data_offsets;
        shard.check_holds(shard.data_start + end)?;
        Ok(TensorData {
            dtype,
            bytes: Cow::Borrowed(&shard.mmap[shard.data_start + start..shard.data_start + end]),
        })
    }
}
