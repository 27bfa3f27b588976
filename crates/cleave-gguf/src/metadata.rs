//! GGUF metadata: the typed values of the key-value section, and getters
//! that name the file and key when a value is missing or of another type.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::{GgufError, Result};

/// The value types of GGUF metadata, by the id the file stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub(crate) fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        [U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64]
            .get(usize::try_from(id).ok()?)
            .copied()
    }

    /// The fewest bytes a value of this type takes in the file: a string or
    /// an array is at least its length field (and an array's element type),
    /// so a count of values can be checked against the bytes left before
    /// anything is allocated for them.
    pub(crate) fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 4 + 8,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// An array value, stored by element type, so that a large array (a
/// vocabulary, its scores) takes no more memory than its bytes in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Value {
    /// How errors name the type of a value.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "a u8",
            Value::I8(_) => "an i8",
            Value::U16(_) => "a u16",
            Value::I16(_) => "an i16",
            Value::U32(_) => "a u32",
            Value::I32(_) => "an i32",
            Value::U64(_) => "a u64",
            Value::I64(_) => "an i64",
            Value::F32(_) => "an f32",
            Value::F64(_) => "an f64",
            Value::Bool(_) => "a bool",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
        }
    }

    /// An integer of any width that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(v) => Some(v),
            _ => None,
        }
    }

    /// An array of integers of any width, none negative.
    pub fn as_u64s(&self) -> Option<Vec<u64>> {
        fn all<T: Copy>(values: &[T]) -> Option<Vec<u64>>
        where
            u64: TryFrom<T>,
        {
            values.iter().map(|&v| u64::try_from(v).ok()).collect()
        }
        match self {
            Value::Array(Array::U8(v)) => all(v),
            Value::Array(Array::U16(v)) => all(v),
            Value::Array(Array::U32(v)) => all(v),
            Value::Array(Array::U64(v)) => all(v),
            Value::Array(Array::I8(v)) => all(v),
            Value::Array(Array::I16(v)) => all(v),
            Value::Array(Array::I32(v)) => all(v),
            Value::Array(Array::I64(v)) => all(v),
            _ => None,
        }
    }

    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Value::Array(Array::String(v)) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32s(&self) -> Option<&[f32]> {
        match self {
            Value::Array(Array::F32(v)) => Some(v),
            _ => None,
        }
    }

    pub fn as_i32s(&self) -> Option<&[i32]> {
        match self {
            Value::Array(Array::I32(v)) => Some(v),
            _ => None,
        }
    }
}

/// A hyperparameter of every layer: one value, or one a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PerLayer {
    All(u64),
    Each(Vec<u64>),
}

impl PerLayer {
    /// Layer `layer`'s value (the one value for a layer past the array's,
    /// which [`Metadata::opt_per_layer`] checked holds one a layer).
    pub fn at(&self, layer: usize) -> u64 {
        match self {
            PerLayer::All(v) => *v,
            PerLayer::Each(each) => each.get(layer).or(each.last()).copied().unwrap_or(0),
        }
    }

    /// The value every layer has, if they agree.
    pub fn uniform(&self) -> Option<u64> {
        match self {
            PerLayer::All(v) => Some(*v),
            PerLayer::Each(each) => each.iter().all(|v| Some(v) == each.first()).then(|| self.at(0)),
        }
    }
}

/// The metadata of one file, by key.
#[derive(Debug)]
pub struct Metadata {
    path: PathBuf,
    values: BTreeMap<String, Value>,
}

impl Metadata {
    pub(crate) fn new(path: PathBuf, values: BTreeMap<String, Value>) -> Self {
        Metadata { path, values }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    /// Every key and value, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key` as `pick` reads it; `None` when the key is absent,
    /// an error naming `expected` when it holds another type.
    pub fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        pick: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.values.get(key) {
            None => Ok(None),
            Some(value) => pick(value).map(Some).ok_or_else(|| GgufError::KeyType {
                path: self.path.clone(),
                key: key.to_string(),
                expected,
                found: value.type_name(),
            }),
        }
    }

    /// `value`, or an error naming the missing key.
    pub fn required<T>(&self, key: &str, value: Option<T>) -> Result<T> {
        value.ok_or_else(|| GgufError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
        })
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", Value::as_str)
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.required(key, self.opt_str(key)?)
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    pub fn u64(&self, key: &str) -> Result<u64> {
        self.required(key, self.opt_u64(key)?)
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a float", Value::as_f64)
    }

    /// A float that must be positive and finite where present (epsilons,
    /// rope bases and factors): a NaN or an infinity would otherwise reach
    /// config.json as `null` and be replaced by the default without a word.
    pub fn opt_positive_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.opt_f64(key)? {
            Some(v) if !(v.is_finite() && v > 0.0) => {
                Err(self.invalid(key, format!("{v} is not a positive finite number")))
            }
            value => Ok(value),
        }
    }

    /// A value llama.cpp reads per layer (`get_key_or_arr`): one integer
    /// for every layer, or an array of one a layer, checked to hold
    /// `layers` of them.
    pub fn opt_per_layer(&self, key: &str, layers: u64) -> Result<Option<PerLayer>> {
        let Some(value) = self.values.get(key) else {
            return Ok(None);
        };
        if let Some(v) = value.as_u64() {
            return Ok(Some(PerLayer::All(v)));
        }
        let each = self.required(key, self.typed(key, "an integer or an array of them", Value::as_u64s)?)?;
        if each.len() as u64 != layers {
            return Err(self.invalid(key, format!("{} values for {layers} layers", each.len())));
        }
        Ok(Some(PerLayer::Each(each)))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", Value::as_bool)
    }

    pub fn opt_strings(&self, key: &str) -> Result<Option<&[String]>> {
        self.typed(key, "an array of strings", Value::as_strings)
    }

    pub fn strings(&self, key: &str) -> Result<&[String]> {
        self.required(key, self.opt_strings(key)?)
    }

    pub fn opt_f32s(&self, key: &str) -> Result<Option<&[f32]>> {
        self.typed(key, "an array of f32", Value::as_f32s)
    }

    pub fn opt_i32s(&self, key: &str) -> Result<Option<&[i32]>> {
        self.typed(key, "an array of i32", Value::as_i32s)
    }

    /// An error about the value of `key`.
    pub fn invalid(&self, key: &str, reason: impl Into<String>) -> GgufError {
        GgufError::KeyValue {
            path: self.path.clone(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}
