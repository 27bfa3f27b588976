//! `FlowMatchEulerDiscreteScheduler` as `FluxPipeline` drives it: resolution-dependent shift `mu`,
//! the sigma schedule, the timesteps handed to the transformer, and the Euler step.
//!
//! The arithmetic follows diffusers' dtypes so the numbers match, not just approximately: `mu` is a
//! Python float (f64); the pipeline's `np.linspace(1, 1/n, n)` is f64 but the scheduler narrows it to
//! f32 before shifting, and numpy then shifts in f32 (Python scalars do not widen an f32 array);
//! sigmas, timesteps and the step are f32 torch tensors.

use std::path::Path;

use serde::Deserialize;

use crate::config::{read_json, ConfigFileError};

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error(transparent)]
    File(#[from] ConfigFileError),
    #[error("scheduler config field `{field}`: {problem}")]
    InvalidField { field: &'static str, problem: String },
    #[error("scheduler config field `{field}` = {value} is not supported (FluxPipeline's scheduler does not use it)")]
    Unsupported { field: &'static str, value: String },
    #[error("num_inference_steps must be at least 1")]
    NoSteps,
    #[error("step index {index} is past the last of {steps} steps")]
    StepOutOfRange { index: usize, steps: usize },
    #[error("latents have {latents} values but the velocity has {velocity}")]
    LengthMismatch { latents: usize, velocity: usize },
}

/// `scheduler/scheduler_config.json` as written: every key optional, defaults applied in
/// [`SchedulerConfig::from_raw`] from the scheduler's `__init__` signature.
#[derive(Debug, Default, Deserialize)]
struct RawSchedulerConfig {
    num_train_timesteps: Option<u32>,
    shift: Option<f64>,
    use_dynamic_shifting: Option<bool>,
    base_shift: Option<f64>,
    max_shift: Option<f64>,
    base_image_seq_len: Option<u32>,
    max_image_seq_len: Option<u32>,
    invert_sigmas: Option<bool>,
    shift_terminal: Option<f64>,
    use_karras_sigmas: Option<bool>,
    use_exponential_sigmas: Option<bool>,
    use_beta_sigmas: Option<bool>,
    time_shift_type: Option<String>,
    stochastic_sampling: Option<bool>,
}

/// How sigmas are bent towards the noisy end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shifting {
    /// `shift·σ / (1 + (shift − 1)·σ)` with a fixed shift (FLUX.1-schnell: 1, i.e. none).
    Static { shift: f64 },
    /// Exponential time shift with `mu` interpolated from the image token count (FLUX.1-dev).
    Dynamic {
        base_shift: f64,
        max_shift: f64,
        base_image_seq_len: u32,
        max_image_seq_len: u32,
    },
}

/// A validated scheduler config, restricted to the options `FluxPipeline` can meet.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    pub num_train_timesteps: u32,
    pub shifting: Shifting,
}

impl SchedulerConfig {
    /// Loads and validates `scheduler_config.json`.
    pub fn from_file(path: &Path) -> Result<Self, SchedulerError> {
        Self::from_raw(read_json(path)?)
    }

    fn from_raw(raw: RawSchedulerConfig) -> Result<Self, SchedulerError> {
        reject_flag("invert_sigmas", raw.invert_sigmas)?;
        reject_flag("use_karras_sigmas", raw.use_karras_sigmas)?;
        reject_flag("use_exponential_sigmas", raw.use_exponential_sigmas)?;
        reject_flag("use_beta_sigmas", raw.use_beta_sigmas)?;
        reject_flag("stochastic_sampling", raw.stochastic_sampling)?;
        // diffusers tests `if self.config.shift_terminal:`, so 0 counts as unset.
        if let Some(terminal) = raw.shift_terminal.filter(|&t| t != 0.0) {
            return Err(SchedulerError::Unsupported {
                field: "shift_terminal",
                value: terminal.to_string(),
            });
        }

        let num_train_timesteps = raw.num_train_timesteps.unwrap_or(1000);
        if num_train_timesteps == 0 {
            return Err(invalid("num_train_timesteps", "must be positive"));
        }
        let shifting = if raw.use_dynamic_shifting.unwrap_or(false) {
            match raw.time_shift_type.as_deref().unwrap_or("exponential") {
                "exponential" => {}
                other => {
                    return Err(SchedulerError::Unsupported {
                        field: "time_shift_type",
                        value: other.into(),
                    })
                }
            }
            let base_image_seq_len = raw.base_image_seq_len.unwrap_or(256);
            let max_image_seq_len = raw.max_image_seq_len.unwrap_or(4096);
            if max_image_seq_len == base_image_seq_len {
                return Err(invalid("max_image_seq_len", "must differ from base_image_seq_len"));
            }
            Shifting::Dynamic {
                base_shift: finite("base_shift", raw.base_shift.unwrap_or(0.5))?,
                max_shift: finite("max_shift", raw.max_shift.unwrap_or(1.15))?,
                base_image_seq_len,
                max_image_seq_len,
            }
        } else {
            let shift = finite("shift", raw.shift.unwrap_or(1.0))?;
            if shift <= 0.0 {
                return Err(invalid("shift", "must be positive"));
            }
            Shifting::Static { shift }
        };
        Ok(Self {
            num_train_timesteps,
            shifting,
        })
    }

    /// The schedule `FluxPipeline` sets for `num_inference_steps` steps over `image_seq_len` packed
    /// image tokens (`(H/16)·(W/16)`).
    pub fn schedule(&self, num_inference_steps: usize, image_seq_len: usize) -> Result<Schedule, SchedulerError> {
        if num_inference_steps == 0 {
            return Err(SchedulerError::NoSteps);
        }
        let base = flux_base_sigmas(num_inference_steps);
        let mut sigmas: Vec<f32> = match self.shifting {
            Shifting::Static { shift } => {
                // numpy rounds the Python floats `shift` and `shift - 1` to f32 separately.
                let (shift_f32, shift_minus_one) = (shift as f32, (shift - 1.0) as f32);
                base.iter()
                    .map(|&s| shift_f32 * s / (1.0 + shift_minus_one * s))
                    .collect()
            }
            Shifting::Dynamic {
                base_shift,
                max_shift,
                base_image_seq_len,
                max_image_seq_len,
            } => {
                let mu = calculate_shift(
                    image_seq_len,
                    base_image_seq_len,
                    max_image_seq_len,
                    base_shift,
                    max_shift,
                );
                base.iter().map(|&s| exponential_time_shift(mu, s)).collect()
            }
        };
        let scale = self.num_train_timesteps as f32;
        let timesteps = sigmas.iter().map(|&s| s * scale).collect();
        sigmas.push(0.0);
        Ok(Schedule { sigmas, timesteps })
    }
}

fn reject_flag(field: &'static str, value: Option<bool>) -> Result<(), SchedulerError> {
    match value {
        Some(true) => Err(SchedulerError::Unsupported {
            field,
            value: "true".into(),
        }),
        _ => Ok(()),
    }
}

fn finite(field: &'static str, value: f64) -> Result<f64, SchedulerError> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(invalid(field, "must be finite"))
    }
}

fn invalid(field: &'static str, problem: &str) -> SchedulerError {
    SchedulerError::InvalidField {
        field,
        problem: problem.into(),
    }
}

/// FLUX's resolution-dependent shift (`pipeline_flux.calculate_shift`), in f64 like the Python
/// floats it is computed from: a line through `(base_seq_len, base_shift)` and
/// `(max_seq_len, max_shift)`, evaluated at `image_seq_len` (not clamped).
pub fn calculate_shift(
    image_seq_len: usize,
    base_seq_len: u32,
    max_seq_len: u32,
    base_shift: f64,
    max_shift: f64,
) -> f64 {
    let m = (max_shift - base_shift) / (f64::from(max_seq_len) - f64::from(base_seq_len));
    let b = base_shift - m * f64::from(base_seq_len);
    image_seq_len as f64 * m + b
}

/// `np.linspace(1.0, 1/n, n)` (f64: `i·step + start`, last element set to `stop`) narrowed to f32
/// as `set_timesteps(sigmas=...)` does.
fn flux_base_sigmas(n: usize) -> Vec<f32> {
    let start = 1.0f64;
    let stop = 1.0 / n as f64;
    if n == 1 {
        return vec![start as f32];
    }
    let step = (stop - start) / (n - 1) as f64;
    (0..n)
        .map(|i| if i == n - 1 { stop } else { i as f64 * step + start } as f32)
        .collect()
}

/// `exp(mu) / (exp(mu) + (1/t − 1)^1)` evaluated as numpy does on an f32 array: `exp(mu)` is
/// rounded to f32 and every operation is f32.
fn exponential_time_shift(mu: f64, t: f32) -> f32 {
    let e = mu.exp() as f32;
    e / (e + (1.0 / t - 1.0))
}

/// The embedded-guidance input of FLUX.1-dev's transformer: `torch.full([1], guidance_scale)` in f32
/// (the transformer scales it by 1000 internally, like the timestep).
pub fn guidance_input(guidance_scale: f64) -> f32 {
    guidance_scale as f32
}

/// Sigmas and timesteps of one sampling run.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// One per step plus the terminal 0.
    sigmas: Vec<f32>,
    /// `sigma · num_train_timesteps` for each step (no terminal entry).
    timesteps: Vec<f32>,
}

impl Schedule {
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    pub fn timesteps(&self) -> &[f32] {
        &self.timesteps
    }

    pub fn num_steps(&self) -> usize {
        self.timesteps.len()
    }

    /// The timestep FluxPipeline passes to the transformer at step `index`: `t / 1000` in f32. The
    /// pipeline divides by the literal 1000, not by `num_train_timesteps`.
    pub fn transformer_timestep(&self, index: usize) -> Result<f32, SchedulerError> {
        const PIPELINE_TIMESTEP_SCALE: f32 = 1000.0;
        let t = self.timesteps.get(index).ok_or_else(|| self.out_of_range(index))?;
        Ok(t / PIPELINE_TIMESTEP_SCALE)
    }

    /// The Euler step `x ← x + (σ[i+1] − σ[i])·v`, in f32 with the difference rounded first, as the
    /// scheduler's tensor arithmetic does.
    pub fn step(&self, index: usize, latents: &mut [f32], velocity: &[f32]) -> Result<(), SchedulerError> {
        if latents.len() != velocity.len() {
            return Err(SchedulerError::LengthMismatch {
                latents: latents.len(),
                velocity: velocity.len(),
            });
        }
        if index >= self.num_steps() {
            return Err(self.out_of_range(index));
        }
        let dt = self.sigmas[index + 1] - self.sigmas[index];
        for (x, v) in latents.iter_mut().zip(velocity) {
            *x += dt * v;
        }
        Ok(())
    }

    fn out_of_range(&self, index: usize) -> SchedulerError {
        SchedulerError::StepOutOfRange {
            index,
            steps: self.num_steps(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> RawSchedulerConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn unsupported_options_name_their_field() {
        let err = SchedulerConfig::from_raw(raw(r#"{"use_karras_sigmas": true}"#)).unwrap_err();
        assert!(
            matches!(
                err,
                SchedulerError::Unsupported {
                    field: "use_karras_sigmas",
                    ..
                }
            ),
            "{err}"
        );
        let err = SchedulerConfig::from_raw(raw(r#"{"shift_terminal": 0.1}"#)).unwrap_err();
        assert!(
            matches!(
                err,
                SchedulerError::Unsupported {
                    field: "shift_terminal",
                    ..
                }
            ),
            "{err}"
        );
        let err = SchedulerConfig::from_raw(raw(r#"{"use_dynamic_shifting": true, "time_shift_type": "linear"}"#))
            .unwrap_err();
        assert!(
            matches!(
                err,
                SchedulerError::Unsupported {
                    field: "time_shift_type",
                    ..
                }
            ),
            "{err}"
        );
        let err = SchedulerConfig::from_raw(raw(r#"{"shift": -1.0}"#)).unwrap_err();
        assert!(
            matches!(err, SchedulerError::InvalidField { field: "shift", .. }),
            "{err}"
        );
    }

    #[test]
    fn missing_keys_take_diffusers_defaults() {
        let config = SchedulerConfig::from_raw(RawSchedulerConfig::default()).unwrap();
        assert_eq!(
            config,
            SchedulerConfig {
                num_train_timesteps: 1000,
                shifting: Shifting::Static { shift: 1.0 }
            }
        );
    }

    #[test]
    fn step_checks_index_and_lengths() {
        let config = SchedulerConfig::from_raw(RawSchedulerConfig::default()).unwrap();
        let schedule = config.schedule(2, 4).unwrap();
        let mut latents = vec![0.0; 3];
        assert!(matches!(
            schedule.step(2, &mut latents, &[0.0; 3]),
            Err(SchedulerError::StepOutOfRange { .. })
        ));
        assert!(matches!(
            schedule.step(0, &mut latents, &[0.0; 2]),
            Err(SchedulerError::LengthMismatch { .. })
        ));
        assert!(matches!(config.schedule(0, 4), Err(SchedulerError::NoSteps)));
    }
}
