//! Model directories as Hugging Face and diffusers lay them out, and what
//! their config says they hold.

use std::path::Path;

use serde::Deserialize;

use crate::error::{read_json, ReadError, Result};

/// Fails unless `path` is a directory.
pub fn check_model_dir(path: &Path) -> Result<()> {
    if path.is_dir() {
        Ok(())
    } else {
        Err(ReadError::Io {
            path: path.to_path_buf(),
            reason: "not a model directory (expected config.json, tokenizer.json and safetensors weights)".into(),
        })
    }
}

/// The fields of a config.json (transformers) or a component config
/// (diffusers) that say which class wrote it.
#[derive(Deserialize)]
struct ClassFields {
    architectures: Option<Vec<String>>,
    #[serde(rename = "_class_name")]
    class_name: Option<String>,
    model_type: Option<String>,
}

/// What a config file says it describes: transformers' `architectures[0]`,
/// else diffusers' `_class_name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigClass {
    /// `None` when the file names no class.
    pub name: Option<String>,
    /// transformers' `model_type` (`bert`, `llama`, ...), if given.
    pub model_type: Option<String>,
}

impl ConfigClass {
    pub fn read(path: &Path) -> Result<Self> {
        let fields: ClassFields = read_json(path)?;
        let name = match fields.architectures {
            Some(list) => Some(list.into_iter().next().ok_or_else(|| ReadError::Config {
                path: path.to_path_buf(),
                field: "architectures",
                reason: "empty list".into(),
            })?),
            None => fields.class_name,
        };
        Ok(ConfigClass {
            name,
            model_type: fields.model_type,
        })
    }
}
