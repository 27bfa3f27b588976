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

    /// Whether it always picks the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.config.temperature <= 0.0
    }

    /// The next token, or `None` when `logits` is empty or holds a NaN.
    pub fn sample(&mut self, logits: &[f32]) -> Option<u32> {
        if self.is_greedy() {
            return argmax(logits);
        }
        if logits.is_empty() || logits.iter().any(|l| l.is_nan()) {
            return None;
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
                return Some(candidates[i].0);
            }
            r -= p;
        }
        Some(candidates[keep - 1].0)
    }
}

/// The index of the largest logit (the first, on ties), or `None` when
/// there is nothing to pick: no logits, or a NaN among them (a broken
/// forward pass must not pass for a token).
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            return None;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
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
        assert_eq!(sampler(0.0, 0, 1.0, 1).sample(&logits), Some(1));
    }

    #[test]
    fn argmax_takes_the_first_of_equal_logits() {
        assert_eq!(argmax(&[1.0, 4.0, 4.0, -2.0]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), Some(0));
        assert_eq!(argmax(&[-1.0, f32::INFINITY, 0.0]), Some(1));
    }

    /// A NaN anywhere (a broken forward pass) picks no token, wherever it
    /// sits and whatever the sampling settings; so do no logits at all.
    #[test]
    fn nan_or_no_logits_pick_no_token() {
        for at in 0..4 {
            let mut logits = [0.1, 3.0, -1.0, 2.9];
            logits[at] = f32::NAN;
            assert_eq!(argmax(&logits), None, "NaN at {at}");
            for (temperature, top_k, top_p) in [(0.0, 0, 1.0), (0.8, 0, 1.0), (0.8, 2, 0.9), (0.8, 1, 1.0)] {
                assert_eq!(
                    sampler(temperature, top_k, top_p, 5).sample(&logits),
                    None,
                    "NaN at {at}, temperature {temperature}, top-k {top_k}, top-p {top_p}"
                );
            }
        }
        assert_eq!(argmax(&[f32::NAN; 3]), None);
        assert_eq!(argmax(&[]), None);
        assert_eq!(sampler(0.8, 0, 1.0, 5).sample(&[]), None);
    }

    #[test]
    fn top_k_one_is_argmax_at_any_temperature() {
        let logits = [0.1, 3.0, -1.0, 2.9];
        let mut s = sampler(5.0, 1, 1.0, 7);
        assert!((0..50).all(|_| s.sample(&logits) == Some(1)));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Softmax ≈ [0.64, 0.24, 0.09, 0.03]: p = 0.8 keeps tokens 0 and 1.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let mut s = sampler(1.0, 0, 0.8, 3);
        let picks: Vec<u32> = (0..200).map(|_| s.sample(&logits).unwrap()).collect();
        assert!(picks.iter().all(|&t| t < 2), "{picks:?}");
        assert!(picks.contains(&0) && picks.contains(&1));
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = sampler(0.9, 40, 0.95, seed);
            (0..30).map(|_| s.sample(&logits).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }
}
