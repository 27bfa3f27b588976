//! The header of a GGUF file (version 3, little-endian): magic, version,
//! counts, the metadata key-value pairs, the tensor infos and where the
//! data section starts. Every count and length comes from the file, so
//! each is checked against the bytes that remain before anything is
//! allocated for it, and every size and offset is computed with checked
//! arithmetic.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::metadata::{Array, Metadata, Value, ValueType};
use cleave_types::WeightType;

const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;
/// `general.alignment` when the file does not set it (ggml's `GGUF_DEFAULT_ALIGNMENT`).
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are allowed this deep; a deeper nesting is a damaged
/// file, and refusing it keeps the recursion's stack bounded.
const MAX_ARRAY_DEPTH: usize = 8;
/// The fewest bytes of a metadata pair: key length, value type, a u8 value.
const MIN_PAIR_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes of a tensor info: name length, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// A tensor as the header describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml's `ne`: the contiguous dimension first (the reverse of the
    /// shape PyTorch would give).
    pub dims: Vec<usize>,
    pub ty: WeightType,
    /// Where the tensor's bytes start in the file (aligned).
    pub start: usize,
    /// Its bytes: whole blocks of `ty`.
    pub bytes: usize,
}

impl TensorInfo {
    pub fn elements(&self) -> usize {
        self.dims.iter().product()
    }
}

pub(crate) struct Header {
    pub version: u32,
    pub alignment: usize,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
}

/// Reads and checks the header of `bytes`, the whole file at `path`.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Header> {
    let mut r = Reader {
        path,
        bytes,
        pos: 0,
        part: "the header".into(),
    };
    let magic = r.take(4)?;
    if magic != MAGIC {
        return Err(GgufError::Magic {
            path: path.into(),
            found: magic.to_vec(),
        });
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(GgufError::Version {
            path: path.into(),
            version,
        });
    }
    let n_tensors = r.u64()?;
    let n_pairs = r.u64()?;
    let n_tensors = r.count(n_tensors, MIN_TENSOR_INFO_BYTES, "tensor infos")?;
    let n_pairs = r.count(n_pairs, MIN_PAIR_BYTES, "metadata pairs")?;

    let mut values = BTreeMap::new();
    for i in 0..n_pairs {
        r.part = format!("metadata pair {i}");
        let key = r.string()?;
        r.part = format!("the value of metadata key '{key}'");
        let ty = r.u32()?;
        let value = r.value(ty, 0)?;
        if values.insert(key.clone(), value).is_some() {
            return Err(r.malformed("the key appears twice"));
        }
    }
    let metadata = Metadata::new(path.into(), values);
    let alignment = alignment(&metadata)?;

    let mut infos = Vec::with_capacity(n_tensors);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        r.part = format!("tensor info {i} of {n_tensors}");
        let info = r.tensor_info()?;
        if !names.insert(info.name.clone()) {
            return Err(tensor_error(path, &info.name, "the name appears twice"));
        }
        infos.push(info);
    }
    r.part = "the padding before the tensor data".into();
    let data_start =
        align_up(r.pos as u64, alignment).ok_or_else(|| r.malformed(format!("aligning to {alignment} overflows")))?;
    let tensors = infos
        .into_iter()
        .map(|info| info.place(path, bytes.len() as u64, data_start, alignment))
        .collect::<Result<Vec<_>>>()?;
    check_disjoint(path, &tensors)?;
    Ok(Header {
        version,
        alignment: usize::try_from(alignment).map_err(|_| r.malformed("alignment past the address space"))?,
        metadata,
        tensors,
    })
}

/// Tensors that share bytes would read each other's data: a damaged or
/// made-up file, refused by the names of both.
fn check_disjoint(path: &Path, tensors: &[TensorInfo]) -> Result<()> {
    let mut by_start: Vec<&TensorInfo> = tensors.iter().collect();
    by_start.sort_by_key(|t| (t.start, t.bytes));
    for pair in by_start.windows(2) {
        let (first, next) = (pair[0], pair[1]);
        // Each tensor was checked to end inside the file: no overflow.
        let first_end = first.start + first.bytes;
        if first_end > next.start {
            return Err(tensor_error(
                path,
                &next.name,
                format!(
                    "its bytes {}..{} overlap those of tensor '{}' ({}..{first_end})",
                    next.start,
                    next.start + next.bytes,
                    first.name,
                    first.start
                ),
            ));
        }
    }
    Ok(())
}

fn alignment(metadata: &Metadata) -> Result<u64> {
    const KEY: &str = "general.alignment";
    match metadata.opt_u64(KEY)? {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(a) if a.is_power_of_two() => Ok(a),
        Some(a) => Err(metadata.invalid(KEY, format!("{a} is not a power of two"))),
    }
}

fn align_up(pos: u64, alignment: u64) -> Option<u64> {
    Some(pos.checked_add(alignment - 1)? / alignment * alignment)
}

fn tensor_error(path: &Path, name: &str, reason: impl Into<String>) -> GgufError {
    GgufError::Tensor {
        path: path.into(),
        name: name.to_string(),
        reason: reason.into(),
    }
}

/// A tensor info as read, before its offset is placed in the file.
struct RawTensorInfo {
    name: String,
    dims: Vec<usize>,
    ty: WeightType,
    offset: u64,
    bytes: u64,
}

impl RawTensorInfo {
    /// Checks that the tensor's data is aligned and lies inside the file of
    /// `file_len` bytes, whose data section starts at `data_start`.
    fn place(self, path: &Path, file_len: u64, data_start: u64, alignment: u64) -> Result<TensorInfo> {
        let fail = |reason: String| tensor_error(path, &self.name, reason);
        if !self.offset.is_multiple_of(alignment) {
            return Err(fail(format!(
                "its offset {} is not a multiple of the alignment {alignment}",
                self.offset
            )));
        }
        let start = data_start.checked_add(self.offset);
        match start.and_then(|s| Some((s, s.checked_add(self.bytes)?))) {
            Some((start, end)) if end <= file_len => Ok(TensorInfo {
                // Both fit in usize: they are within the mapped file.
                start: start as usize,
                bytes: self.bytes as usize,
                name: self.name,
                dims: self.dims,
                ty: self.ty,
            }),
            _ => Err(fail(format!(
                "its {} bytes at offset {} of the data section (which starts at byte {data_start}) lie past the end of the file ({file_len} bytes)",
                self.bytes, self.offset
            ))),
        }
    }
}

/// A cursor over the file's bytes. `part` says what is being read, for
/// errors.
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
    part: String,
}

impl<'a> Reader<'a> {
    fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn past_end(&self, needed: u64) -> GgufError {
        GgufError::Truncated {
            path: self.path.into(),
            part: self.part.clone(),
            needed,
            left: self.left(),
        }
    }

    fn malformed(&self, reason: impl Into<String>) -> GgufError {
        GgufError::Malformed {
            path: self.path.into(),
            part: self.part.clone(),
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.past_end(n));
        }
        // n is at most the bytes left, so it fits in usize.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let bytes = self.take(N as u64)?;
        let mut out = [0; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(u8::from_le_bytes(self.array()?))
    }
    fn i8(&mut self) -> Result<i8> {
        Ok(i8::from_le_bytes(self.array()?))
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn i16(&mut self) -> Result<i16> {
        Ok(i16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    fn f32(&mut self) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array()?))
    }
    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array()?))
    }
    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.malformed(format!("bool byte {other} is neither 0 nor 1"))),
        }
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| self.malformed(format!("a string that is not UTF-8 ({e})")))
    }

    /// `n` things of at least `min_bytes` each, which must fit in the bytes
    /// left: a count too large for the file is refused before anything is
    /// allocated for it.
    fn count(&self, n: u64, min_bytes: u64, what: &str) -> Result<usize> {
        match n.checked_mul(min_bytes) {
            Some(needed) if needed <= self.left() => Ok(n as usize),
            _ => Err(self.malformed(format!(
                "{n} {what} of at least {min_bytes} bytes each run past the end of the file ({} bytes left)",
                self.left()
            ))),
        }
    }

    fn value_type(&self, id: u32) -> Result<ValueType> {
        ValueType::from_id(id).ok_or_else(|| self.malformed(format!("unknown metadata value type {id}")))
    }

    fn value(&mut self, type_id: u32, depth: usize) -> Result<Value> {
        Ok(match self.value_type(type_id)? {
            ValueType::U8 => Value::U8(self.u8()?),
            ValueType::I8 => Value::I8(self.i8()?),
            ValueType::U16 => Value::U16(self.u16()?),
            ValueType::I16 => Value::I16(self.i16()?),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(self.i32()?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(self.i64()?),
            ValueType::F32 => Value::F32(self.f32()?),
            ValueType::F64 => Value::F64(self.f64()?),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string()?),
            ValueType::Array => Value::Array(self.array_value(depth)?),
        })
    }

    /// An array: element type, count, elements.
    fn array_value(&mut self, depth: usize) -> Result<Array> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.malformed(format!("arrays nested more than {MAX_ARRAY_DEPTH} deep")));
        }
        let ty = self.u32()?;
        let ty = self.value_type(ty)?;
        let n = self.u64()?;
        let n = self.count(n, ty.min_bytes(), "array elements")?;
        Ok(match ty {
            ValueType::U8 => Array::U8(self.many(n, Self::u8)?),
            ValueType::I8 => Array::I8(self.many(n, Self::i8)?),
            ValueType::U16 => Array::U16(self.many(n, Self::u16)?),
            ValueType::I16 => Array::I16(self.many(n, Self::i16)?),
            ValueType::U32 => Array::U32(self.many(n, Self::u32)?),
            ValueType::I32 => Array::I32(self.many(n, Self::i32)?),
            ValueType::U64 => Array::U64(self.many(n, Self::u64)?),
            ValueType::I64 => Array::I64(self.many(n, Self::i64)?),
            ValueType::F32 => Array::F32(self.many(n, Self::f32)?),
            ValueType::F64 => Array::F64(self.many(n, Self::f64)?),
            ValueType::Bool => Array::Bool(self.many(n, Self::bool)?),
            ValueType::String => Array::String(self.many(n, Self::string)?),
            ValueType::Array => Array::Array(self.many(n, |r| r.array_value(depth + 1))?),
        })
    }

    /// `n` values read one after another; `n` was checked by `count`.
    fn many<T>(&mut self, n: usize, mut read: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(read(self)?);
        }
        Ok(out)
    }

    /// Name, dims (`ne`), ggml type and offset into the data section.
    fn tensor_info(&mut self) -> Result<RawTensorInfo> {
        let name = self.string()?;
        if name.is_empty() {
            // What reading on past the last tensor info most often finds.
            return Err(self.malformed("a tensor with no name: does the header count more tensors than the file has?"));
        }
        self.part = format!("the tensor info of '{name}'");
        let n_dims = self.u32()?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(tensor_error(
                self.path,
                &name,
                format!("{n_dims} dimensions (ggml has 1 to {MAX_DIMS})"),
            ));
        }
        let dims = (0..n_dims).map(|_| self.u64()).collect::<Result<Vec<u64>>>()?;
        let type_id = self.u32()?;
        let offset = self.u64()?;
        let ty = crate::types::ggml_type(type_id).map_err(|known| GgufError::TensorType {
            path: self.path.into(),
            name: name.clone(),
            id: type_id,
            known,
        })?;
        let fail = |reason: String| tensor_error(self.path, &name, reason);
        if dims.contains(&0) {
            return Err(fail(format!("a dimension is 0 (ne = {dims:?})")));
        }
        if !dims[0].is_multiple_of(ty.block_len() as u64) {
            return Err(fail(format!(
                "its rows of {} values are not whole {ty} blocks of {}",
                dims[0],
                ty.block_len()
            )));
        }
        // llama.cpp quantizes matrices only, and ggml's element-wise
        // operations take their vectors (norms, biases) as floats, as
        // cleave's loaders do: a vector in blocks is refused here, where
        // `plan` sees it too.
        if dims.len() == 1 && ty.block_len() > 1 {
            let floats: Vec<&str> = WeightType::ALL
                .iter()
                .filter(|t| t.block_len() == 1)
                .map(|t| t.name())
                .collect();
            return Err(fail(format!(
                "a vector (ne = {dims:?}) stored as {ty} blocks: cleave reads 1-D tensors as {}",
                floats.join(", ")
            )));
        }
        let bytes = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| ty.bytes_for(n))
            .filter(|&b| b <= self.bytes.len() as u64)
            .ok_or_else(|| fail(format!("its size ({ty}, ne = {dims:?}) is larger than the file")))?;
        let dims = dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| fail("a dimension is past the address space".into()))?;
        Ok(RawTensorInfo {
            dims,
            name,
            ty,
            offset,
            bytes,
        })
    }
}
