//! The log-probabilities a pick reports beside its token (OpenAI's
//! `logprobs`): the log-softmax of the model's logits as the head gave
//! them (soft-capped where the family caps), before any bias, penalty or
//! temperature, as vLLM reports them by default.

/// Most alternatives a pick reports (OpenAI's bound on `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A picked token's log-probability, and those of the most likely tokens
/// at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub id: u32,
    pub logprob: f32,
    /// The `top` most likely tokens, most likely first (the smaller id
    /// first among equal ones).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// `id`'s log-probability in a row of finite `logits`, and the `top`
    /// most likely tokens' (at most [`MAX_TOP_LOGPROBS`]). The sum is
    /// taken in f64 around the row's largest logit, so a vocabulary of
    /// 10⁵ tokens loses nothing to rounding that f32 would.
    pub fn of(logits: &[f32], id: u32, top: usize) -> TokenLogprobs {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let log_total = max + sum.ln();
        let logprob = |i: usize| (logits[i] as f64 - log_total) as f32;
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let top = top.min(MAX_TOP_LOGPROBS).min(logits.len());
        let first = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        if top > 0 && top < order.len() {
            order.select_nth_unstable_by(top - 1, first);
        }
        order.truncate(top);
        order.sort_unstable_by(first);
        TokenLogprobs {
            id,
            logprob: logits
                .get(id as usize)
                .map_or(f32::NEG_INFINITY, |_| logprob(id as usize)),
            top: order.into_iter().map(|i| (i as u32, logprob(i))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probabilities_sum_to_one_and_the_top_come_in_order() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let picked = TokenLogprobs::of(&logits, 4, 3);
        let total: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!((picked.logprob as f64 - (0.5 - total.ln())).abs() < 1e-6);
        let ids: Vec<u32> = picked.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 3, 0], "ties by the smaller id");
        let probability: f64 = (0..5)
            .map(|i| (TokenLogprobs::of(&logits, i, 0).logprob as f64).exp())
            .sum();
        assert!((probability - 1.0).abs() < 1e-6, "{probability}");
    }

    #[test]
    fn a_large_vocabulary_of_equal_logits_loses_nothing_to_rounding() {
        let logits = vec![30.0f32; 150_000];
        let picked = TokenLogprobs::of(&logits, 7, MAX_TOP_LOGPROBS + 5);
        let expected = -(150_000f64.ln()) as f32;
        assert!((picked.logprob - expected).abs() < 1e-6, "{}", picked.logprob);
        assert_eq!(picked.top.len(), MAX_TOP_LOGPROBS);
        assert_eq!(picked.top[0].0, 0);
    }
}
