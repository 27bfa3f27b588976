//! Picking the next token from logits: greedy, or temperature sampling
//! after top-k and top-p filtering (llama.cpp's order).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// 0 or below: always the most likely token.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1: all).
    pub top_p: f32,
    pub seed: u64,
}

pub struct Sampler {
    config: SamplerConfig,
    rng: StdRng,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Self {
        Sampler {
            rng: StdRng::seed_from_u64(config.seed),
            config,
        }
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.config.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut candidates: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        // Most likely first; ties broken by id so that a seed replays exactly.
        candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.config.top_k > 0 {
            candidates.truncate(self.config.top_k);
        }
        let probs = softmax(&candidates, self.config.temperature);
        let keep = nucleus(&probs, self.config.top_p);
        let total: f32 = probs[..keep].iter().sum();
        let mut r = self.rng.random::<f32>() * total;
        for (i, p) in probs[..keep].iter().enumerate() {
            if r < *p {
                return candidates[i].0;
            }
            r -= p;
        }
        candidates[keep - 1].0
    }
}

/// The index of the largest logit (the first, on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |best, (i, &l)| {
                if l > best.1 {
                    (i, l)
                } else {
                    best
                }
            },
        )
        .0 as u32
}

/// Probabilities of sorted candidates at `temperature`.
fn softmax(candidates: &[(u32, f32)], temperature: f32) -> Vec<f32> {
    let max = candidates[0].1;
    let exps: Vec<f32> = candidates
        .iter()
        .map(|(_, l)| ((l - max) / temperature).exp())
        .collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// How many of the sorted `probs` the top-p cut keeps (at least one).
fn nucleus(probs: &[f32], top_p: f32) -> usize {
    if top_p >= 1.0 {
        return probs.len();
    }
    let mut mass = 0.0;
    for (i, p) in probs.iter().enumerate() {
        mass += p;
        if mass >= top_p {
            return i + 1;
        }
    }
    probs.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
        Sampler::new(SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed,
        })
    }

    #[test]
    fn zero_temperature_is_argmax() {
        let logits = [0.1, 3.0, -1.0, 2.9];
        assert_eq!(sampler(0.0, 0, 1.0, 1).sample(&logits), 1);
    }

    #[test]
    fn top_k_one_is_argmax_at_any_temperature() {
        let logits = [0.1, 3.0, -1.0, 2.9];
        let mut s = sampler(5.0, 1, 1.0, 7);
        assert!((0..50).all(|_| s.sample(&logits) == 1));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Softmax ≈ [0.64, 0.24, 0.09, 0.03]: p = 0.8 keeps tokens 0 and 1.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let mut s = sampler(1.0, 0, 0.8, 3);
        let picks: Vec<u32> = (0..200).map(|_| s.sample(&logits)).collect();
        assert!(picks.iter().all(|&t| t < 2), "{picks:?}");
        assert!(picks.contains(&0) && picks.contains(&1));
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = sampler(0.9, 40, 0.95, seed);
            (0..30).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }
}
