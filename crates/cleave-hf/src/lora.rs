//! LoRA adapters in PEFT's layout (adapter_config.json +
//! adapter_model.safetensors): low-rank updates `scale · B·A` to some of a
//! model's linear layers, merged into the weights at load ("direct") or
//! applied beside them at every matmul ("runtime").

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::checkpoint::Checkpoint;
use crate::checkpoint::TensorData;
use crate::error::{read_json, ReadError, Result};

/// When a low-rank update is merged into its weight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoraMode {
    /// Runtime for weights that are sliced across devices, direct otherwise.
    #[default]
    Auto,
    /// Merge into the weights at load: no cost per token.
    Direct,
    /// Keep A and B beside the weight and add `x·Aᵀ·Bᵀ` at every matmul.
    Runtime,
}

#[derive(Deserialize)]
struct AdapterConfig {
    peft_type: Option<String>,
    r: Option<usize>,
    lora_alpha: Option<f64>,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
}

/// One adapter, opened and checked.
#[derive(Clone)]
pub struct LoraAdapter {
    pub path: PathBuf,
    checkpoint: Arc<Checkpoint>,
    rank: usize,
    /// `lora_alpha / r` (or `/ sqrt(r)` with rsLoRA), times the user's scale.
    scale: f32,
}

impl LoraAdapter {
    /// Opens the adapter in `dir`, its update multiplied by `user_scale`.
    pub fn open(dir: &Path, user_scale: f32) -> Result<Self> {
        if !dir.is_dir() {
            return Err(ReadError::in_file(
                dir.to_path_buf(),
                "not a LoRA adapter directory (expected adapter_config.json and adapter_model.safetensors)",
            ));
        }
        let config_path = dir.join("adapter_config.json");
        let config: AdapterConfig = read_json(&config_path)?;
        let error = |field: &'static str, reason: &str| ReadError::Config {
            path: config_path.clone(),
            field,
            reason: reason.to_string(),
        };
        if config.peft_type.as_deref().is_some_and(|t| t != "LORA") {
            return Err(error("peft_type", "only LORA adapters are supported"));
        }
        if config.use_dora {
            return Err(error("use_dora", "DoRA adapters are not supported"));
        }
        if config.fan_in_fan_out {
            return Err(error(
                "fan_in_fan_out",
                "adapters for Conv1D layers (GPT-2 style) are not supported",
            ));
        }
        let rank = config
            .r
            .filter(|r| *r > 0)
            .ok_or_else(|| error("r", "missing or not positive"))?;
        let alpha = config.lora_alpha.unwrap_or(rank as f64);
        let base = if config.use_rslora {
            alpha / (rank as f64).sqrt()
        } else {
            alpha / rank as f64
        };
        let weights = dir.join("adapter_model.safetensors");
        if !weights.exists() {
            return Err(ReadError::Io {
                path: weights,
                reason: "missing (cleave reads LoRA weights from adapter_model.safetensors)".into(),
            });
        }
        Ok(LoraAdapter {
            path: dir.to_path_buf(),
            checkpoint: Arc::new(Checkpoint::open_file(&weights)?),
            rank,
            scale: (base * user_scale as f64) as f32,
        })
    }

    /// Makes each `(name, runs)` of `parts` stand for those runs of rows of
    /// the adapter's tensor `stored`, as [`Checkpoint::split_rows`]
    /// does for a model's fused weights: each part of a fused layer then
    /// finds its factors. Only on an adapter not yet shared (just opened).
    pub fn split_rows(&mut self, stored: &str, parts: &[(String, Vec<Range<usize>>)]) -> Result<()> {
        let path = self.path.clone();
        let checkpoint = Arc::get_mut(&mut self.checkpoint).ok_or_else(|| ReadError::Adapter {
            path,
            reason: "its tensors were split after the adapter was shared".into(),
        })?;
        checkpoint.split_rows(stored, parts);
        Ok(())
    }

    /// Fails unless every tensor of the adapter is a LoRA factor, each with
    /// its other factor, of a linear layer of the model in `base`: an
    /// update that named no layer, or a tensor cleave does not apply (PEFT's
    /// `modules_to_save`, a trained bias), would otherwise be left out
    /// silently, and the model would run as another. So would an update of
    /// a fused layer that `base` loads as its parts, unless the adapter's
    /// factors were split the same way.
    pub fn check_targets(&self, base: &Checkpoint) -> Result<()> {
        let refuse = |reason: String| {
            Err(ReadError::Adapter {
                path: self.path.clone(),
                reason,
            })
        };
        let mut names: Vec<&str> = self.checkpoint.names().collect();
        names.sort_unstable();
        let mut targets = Vec::new();
        for name in &names {
            let Some((target, factor)) = lora_factor(name) else {
                return refuse(format!(
                    "it holds '{name}', which is not a LoRA factor: cleave applies the lora_A and lora_B of \
                     linear layers only, not modules_to_save, trained biases or embedding updates"
                ));
            };
            let other = if factor == "A" { "B" } else { "A" };
            if !self.checkpoint.contains(&lora_factor_name(target, other)) {
                return refuse(format!("'{name}' has no lora_{other} beside it"));
            }
            if factor == "A" {
                targets.push(target);
            }
        }
        for target in &targets {
            for part in base.parts_of(&format!("{target}.weight")) {
                let part = part.strip_suffix(".weight").unwrap_or(part);
                if !self.checkpoint.contains(&lora_factor_name(part, "A")) {
                    return refuse(format!(
                        "it updates the fused layer '{target}', which the model loads as its parts \
                         ('{part}', ...): open the adapter for the model (ModelDir::open_adapter)"
                    ));
                }
            }
        }
        let foreign: Vec<&&str> = targets
            .iter()
            .filter(|t| !base.contains(&format!("{t}.weight")))
            .collect();
        match (targets.first(), foreign.first()) {
            (None, _) => {
                refuse("holds no lora_A tensors (PEFT names them base_model.model.<layer>.lora_A.weight)".into())
            }
            (Some(first), Some(_)) if foreign.len() == targets.len() => refuse(format!(
                "none of its {} low-rank updates names a layer of this model (the first is for '{first}'): \
                 it was made for another model",
                targets.len()
            )),
            (_, Some(stray)) => refuse(format!(
                "its update for '{stray}' names no layer of this model ({} of its {} updates do not): \
                 it was made for another model, or for one of more layers",
                foreign.len(),
                targets.len()
            )),
            (Some(_), None) => self.check_shapes(base, &targets),
        }
    }

    /// Fails unless each update's A is `[r, in]` and its B `[out, r]` for
    /// the `[out, in]` weight it updates, so that a mismatch is named
    /// before anything is loaded (by `cleave plan` too).
    fn check_shapes(&self, base: &Checkpoint, targets: &[&str]) -> Result<()> {
        for target in targets {
            let weight = format!("{target}.weight");
            let shape = base.shape(&weight).unwrap_or_default();
            let [out, inp] = shape[..] else {
                return Err(ReadError::Adapter {
                    path: self.path.clone(),
                    reason: format!("it updates '{weight}', which is not a matrix"),
                });
            };
            self.checkpoint
                .expect_shape(&lora_factor_name(target, "A"), &[self.rank, inp])?;
            self.checkpoint
                .expect_shape(&lora_factor_name(target, "B"), &[out, self.rank])?;
        }
        Ok(())
    }

    /// Low-rank updates the adapter holds (one per layer it updates).
    pub fn updates(&self) -> usize {
        self.checkpoint
            .names()
            .filter(|n| lora_factor(n).is_some_and(|(_, f)| f == "A"))
            .count()
    }

    /// Bytes of the adapter's factors as stored.
    pub fn bytes(&self) -> u64 {
        self.checkpoint.total_bytes()
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// A (`[r, inp]`) and B (`[out, r]`) of the update to the linear layer
    /// `prefix` (a base model name such as `model.layers.0.self_attn.q_proj`),
    /// if the adapter has one.
    pub fn factors(&self, prefix: &str, out: usize, inp: usize) -> Result<Option<(TensorData<'_>, TensorData<'_>)>> {
        if !self.checkpoint.contains(&lora_factor_name(prefix, "A")) {
            return Ok(None);
        }
        let a = self
            .checkpoint
            .tensor(&lora_factor_name(prefix, "A"), &[self.rank, inp])?;
        let b = self
            .checkpoint
            .tensor(&lora_factor_name(prefix, "B"), &[out, self.rank])?;
        Ok(Some((a, b)))
    }
}

/// PEFT's name of factor `factor` ("A" or "B") of the update to the linear
/// layer `target` (a base model name such as `model.layers.0.mlp.up_proj`).
pub fn lora_factor_name(target: &str, factor: &str) -> String {
    format!("base_model.model.{target}.lora_{factor}.weight")
}

/// The layer and the factor ("A" or "B") a tensor of `name` is, in PEFT's
/// naming ([`lora_factor_name`]); `None` for any other tensor.
fn lora_factor(name: &str) -> Option<(&str, &str)> {
    let (target, factor) = name
        .strip_prefix("base_model.model.")?
        .strip_suffix(".weight")?
        .rsplit_once(".lora_")?;
    matches!(factor, "A" | "B").then_some((target, factor))
}
