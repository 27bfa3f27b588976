//! The rotation frequencies a config's rope parameters give, per table.

use super::{AttentionType, ModelConfig, RopeScaling};

impl ModelConfig {
    /// Which of [`ModelConfig::rope_tables`] layer `layer` uses in a pass
    /// whose positions end before `end`: the full layers' (every layer's,
    /// unless sliding layers have a base of their own or LongRoPE's long
    /// factors apply), the sliding layers', or LongRoPE's long ones.
    pub fn rope_table(&self, layer: usize, end: usize) -> usize {
        let local = self.local_rope_theta.is_some();
        match &self.rope_scaling {
            RopeScaling::LongRope { original_context, .. } if end > *original_context => 1 + usize::from(local),
            _ => usize::from(self.layer_types.of(layer) == AttentionType::Sliding && local),
        }
    }

    /// Each rotary table's frequencies (for each pair of dimensions of a
    /// head, as transformers computes them in f32) and the factor on its
    /// cos and sin: the full layers', then Gemma 3's sliding layers' (from
    /// their own base), then LongRoPE's long factors'.
    pub fn rope_tables(&self) -> Vec<(Vec<f32>, f32)> {
        let theta = self.rope_theta;
        let full = match self.full_heads {
            Some(full) => proportional(full.head_dim, self.rotary_dim, theta),
            None => frequencies(self.rotary_dim, theta, &self.rope_scaling),
        };
        let mut tables = vec![(full, 1.0)];
        tables.extend(
            self.local_rope_theta
                .map(|local| (frequencies(self.head_dim, local, &RopeScaling::None), 1.0)),
        );
        match &self.rope_scaling {
            RopeScaling::LongRope { long, attention, .. } => {
                tables[0].1 = *attention as f32;
                tables.push((per_frequency(self.rotary_dim, theta, long), *attention as f32));
            }
            RopeScaling::Yarn { attention, .. } => tables[0].1 = *attention as f32,
            _ => {}
        }
        tables
    }

    /// The rotation frequencies of the full layers (see
    /// [`ModelConfig::rope_tables`]).
    pub fn inv_freq(&self) -> Vec<f32> {
        self.rope_tables().swap_remove(0).0
    }
}

/// Gemma 4's proportional rope over heads of `head_dim`: the first
/// `rotated / 2` pairs (dimension `i` with `i + head_dim / 2`) turn at
/// `theta^(-2i / head_dim)`, the others not at all, as transformers'
/// `_compute_proportional_rope_parameters` computes them in f32.
fn proportional(head_dim: usize, rotated: usize, theta: f64) -> Vec<f32> {
    let base = theta as f32;
    (0..head_dim / 2)
        .map(|i| match i < rotated / 2 {
            true => 1.0 / base.powf((2 * i) as f32 / head_dim as f32),
            false => 0.0,
        })
        .collect()
}

/// The rotation frequency of each pair of `dim` dimensions for base
/// `theta`, scaled as `scaling` says, in f32 as transformers computes them.
fn frequencies(dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    let base = theta as f32;
    let plain = (0..dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / dim as f32));
    match *scaling {
        RopeScaling::None => plain.collect(),
        RopeScaling::Linear { factor } => plain.map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        } => {
            let (factor, low, high) = (factor as f32, low_freq_factor as f32, high_freq_factor as f32);
            let context = original_context as f32;
            let (low_wavelen, high_wavelen) = (context / low, context / high);
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (context / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        RopeScaling::LongRope { ref short, .. } => per_frequency(dim, theta, short),
        RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_context,
            truncate,
            ..
        } => {
            // transformers' `_compute_yarn_parameters`: the ramp's ends in
            // f64, the ramp and the blend in f32.
            let correction = |rotations: f64| {
                let d = dim as f64;
                d * (original_context / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
            if low == high {
                high += 0.001;
            }
            let (low, high, factor) = (low as f32, high as f32, factor as f32);
            (0..dim / 2)
                .map(|i| {
                    let position = base.powf((2 * i) as f32 / dim as f32);
                    let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    (1.0 / (factor * position)) * (1.0 - extrapolation) + (1.0 / position) * extrapolation
                })
                .collect()
        }
    }
}

/// LongRoPE's frequencies: `1 / (factors[i] · theta^(2i / dim))` in f32.
fn per_frequency(dim: usize, theta: f64, factors: &[f64]) -> Vec<f32> {
    let base = theta as f32;
    (0..dim / 2)
        .zip(factors)
        .map(|(i, &factor)| 1.0 / (factor as f32 * base.powf((2 * i) as f32 / dim as f32)))
        .collect()
}
