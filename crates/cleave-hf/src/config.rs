//! What every config.json reader shares: the checks that name the file and
//! the field, and the shapes transformers writes some fields in.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{ReadError, Result};

/// An integer or a list of them (`eos_token_id` is either).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    pub fn ids(&self) -> Vec<u32> {
        match self {
            OneOrMany::One(id) => vec![*id],
            OneOrMany::Many(ids) => ids.clone(),
        }
    }
}

/// Checks a config file's fields, naming the file and the field in errors.
pub struct Validator<'a> {
    pub path: &'a Path,
}

impl Validator<'_> {
    pub fn error(&self, field: &'static str, reason: impl Into<String>) -> ReadError {
        ReadError::Config {
            path: PathBuf::from(self.path),
            field,
            reason: reason.into(),
        }
    }

    pub fn required<T>(&self, value: Option<T>, field: &'static str) -> Result<T> {
        value.ok_or_else(|| self.error(field, "missing"))
    }

    pub fn positive(&self, value: Option<usize>, field: &'static str) -> Result<usize> {
        match self.required(value, field)? {
            0 => Err(self.error(field, "must be positive")),
            n => Ok(n),
        }
    }

    /// `value`, which must be one of `supported`.
    pub fn supported<'v>(&self, field: &'static str, value: &'v str, supported: &[&str]) -> Result<&'v str> {
        if supported.contains(&value) {
            Ok(value)
        } else {
            Err(self.error(
                field,
                format!("'{value}' is not supported (supported: {})", supported.join(", ")),
            ))
        }
    }

    /// Fails (naming `field`, the divisor's) unless `divisor` divides
    /// `dividend`, the value of `of`.
    pub fn divides(&self, field: &'static str, divisor: usize, of: &str, dividend: usize) -> Result<()> {
        if dividend.is_multiple_of(divisor) {
            Ok(())
        } else {
            Err(self.error(field, format!("{divisor} does not divide {of} ({dividend})")))
        }
    }
}
