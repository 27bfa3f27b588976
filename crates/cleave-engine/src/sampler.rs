//! A sequence's sampling state, from which each pick's rule is made: the
//! most likely token, or sampling after the penalties, top-k, the
//! temperature and top-p, in that order (transformers'; llama.cpp cuts
//! top-p before the temperature). The device and the host pick by a rule
//! alike (`cleave_shaders::sample`), so a sequence may pick on either
//! side, step by step, and draw the same tokens.

use cleave_nn::PickRule;
pub use cleave_shaders::{Penalties, SamplerConfig};

/// A sequence's sampler: its settings, how many uniforms it has drawn
/// from its seed's stream, and the last ids its penalties look at.
pub struct Sampler {
    config: SamplerConfig,
    drawn: u32,
    window: Vec<u32>,
}

impl Sampler {
    /// A sampler for a sequence that starts with `prompt` (which its
    /// penalties count, as llama.cpp's do).
    pub fn new(config: SamplerConfig, prompt: &[u32]) -> Self {
        Sampler {
            window: config.penalties.window(prompt).to_vec(),
            config,
            drawn: 0,
        }
    }

    /// The rule by which a model picks this sequence's next token, never
    /// one of `banned`: on the device where it can, else on the host (see
    /// `cleave_nn::Context::pick`).
    pub fn rule(&self, banned: Vec<u32>) -> PickRule {
        PickRule {
            banned,
            sampler: self.config,
            drawn: self.drawn,
            window: self.window.clone(),
            bias: Vec::new(),
            logprobs: None,
            allowed: None,
        }
    }

    /// Takes `id`, picked by [`Sampler::rule`]: one uniform more drawn
    /// where it samples, and the penalties count `id` from now on.
    pub fn accept(&mut self, id: u32) {
        self.config.advance(&mut self.drawn, &mut self.window, id);
    }
}

#[cfg(test)]
mod tests {
    use cleave_shaders::argmax_on_host;

    use super::*;

    /// The next token as the host picks it, or `None` when `logits` is
    /// empty or holds a NaN.
    fn sample(s: &Sampler, logits: &[f32]) -> Option<u32> {
        s.rule(Vec::new()).pick_on_host(logits).ok()
    }

    /// The next token, taken: as a generation draws one after another.
    fn draw(s: &mut Sampler, logits: &[f32]) -> Option<u32> {
        let id = sample(s, logits)?;
        s.accept(id);
        Some(id)
    }

    fn sampler(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
        let config = SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed,
            penalties: Penalties::default(),
        };
        Sampler::new(config, &[])
    }

    /// llama.cpp's penalties: a repeated token's positive logit divided,
    /// a negative one multiplied, then lowered per occurrence and once for
    /// being there, over the prompt and what was generated, the last n
    /// only.
    #[test]
    fn penalties_count_the_last_n_of_prompt_and_generated_ids() {
        let penalties = Penalties {
            repeat: 2.0,
            frequency: 0.5,
            presence: 0.25,
            last_n: 3,
        };
        let mut logits = [4.0, -1.0, 3.0, 1.0];
        penalties.apply_on_host(&mut logits, &[0, 1, 0]);
        assert_eq!(
            logits,
            [4.0 / 2.0 - (2.0 * 0.5 + 0.25), -(1.0 * 2.0) - (0.5 + 0.25), 3.0, 1.0]
        );
        let config = SamplerConfig {
            temperature: 0.0,
            top_k: 40,
            top_p: 1.0,
            seed: 1,
            penalties,
        };
        // Token 0 leads until the penalties count it: the prompt's own 0
        // counts, and once three more ids came, it no longer does.
        let logits = [3.0, 2.0, 1.0, 0.5];
        let mut s = Sampler::new(config, &[5, 0]);
        assert_eq!(sample(&s, &logits), Some(1));
        for id in [2, 3, 2] {
            s.accept(id);
        }
        assert_eq!(sample(&s, &logits), Some(0));
        assert_eq!(sample(&Sampler::new(config, &[]), &logits), Some(0));
    }

    #[test]
    fn zero_temperature_is_argmax() {
        let logits = [0.1, 3.0, -1.0, 2.9];
        assert_eq!(sample(&sampler(0.0, 0, 1.0, 1), &logits), Some(1));
    }

    #[test]
    fn argmax_takes_the_first_of_equal_logits() {
        assert_eq!(argmax_on_host(&[1.0, 4.0, 4.0, -2.0]), Some(1));
        assert_eq!(argmax_on_host(&[f32::NEG_INFINITY; 3]), Some(0));
        assert_eq!(argmax_on_host(&[-1.0, f32::INFINITY, 0.0]), Some(1));
    }

    /// A NaN anywhere (a broken forward pass) picks no token, wherever it
    /// sits and whatever the sampling settings; so do no logits at all.
    #[test]
    fn nan_or_no_logits_pick_no_token() {
        for at in 0..4 {
            let mut logits = [0.1, 3.0, -1.0, 2.9];
            logits[at] = f32::NAN;
            assert_eq!(argmax_on_host(&logits), None, "NaN at {at}");
            for (temperature, top_k, top_p) in [(0.0, 0, 1.0), (0.8, 0, 1.0), (0.8, 2, 0.9), (0.8, 1, 1.0)] {
                assert_eq!(
                    sample(&sampler(temperature, top_k, top_p, 5), &logits),
                    None,
                    "NaN at {at}, temperature {temperature}, top-k {top_k}, top-p {top_p}"
                );
            }
        }
        assert_eq!(argmax_on_host(&[f32::NAN; 3]), None);
        assert_eq!(argmax_on_host(&[]), None);
        assert_eq!(sample(&sampler(0.8, 0, 1.0, 5), &[]), None);
    }

    #[test]
    fn top_k_one_is_argmax_at_any_temperature() {
        let logits = [0.1, 3.0, -1.0, 2.9];
        let mut s = sampler(5.0, 1, 1.0, 7);
        assert!((0..50).all(|_| draw(&mut s, &logits) == Some(1)));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Softmax ≈ [0.64, 0.24, 0.09, 0.03]: p = 0.8 keeps tokens 0 and 1.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let mut s = sampler(1.0, 0, 0.8, 3);
        let picks: Vec<u32> = (0..200).map(|_| draw(&mut s, &logits).unwrap()).collect();
        assert!(picks.iter().all(|&t| t < 2), "{picks:?}");
        assert!(picks.contains(&0) && picks.contains(&1));
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = sampler(0.9, 40, 0.95, seed);
            (0..30).map(|_| draw(&mut s, &logits).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }
}
