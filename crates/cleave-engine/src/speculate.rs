//! Speculative decoding: tokens drafted cheaply, from the context itself
//! or by a small model of the same vocabulary, then checked by the model
//! in one pass. The pass picks after each drafted token by the sequence's
//! own rule (its sampler moved past the drafts before it), and a draft is
//! kept while it is the very token picked there: the text is the one
//! plain decoding gives, greedy or sampled, seed for seed. llama.cpp's
//! server checks its drafts the same way.

use cleave_nn::{CausalLm, ModelError, PickRule};

/// Proposes the tokens likely to come next.
pub trait Drafter {
    /// Up to `max` tokens likely to follow `ids` (the prompt and every
    /// token generated so far); none where it has no guess.
    fn draft(&mut self, ids: &[u32], max: usize) -> Result<Vec<u32>, ModelError>;

    /// Readies it to draft up to `max` tokens a step (a draft model's
    /// caches keep what rewinding that far needs).
    fn prepare(&mut self, _max: usize) {}
}

/// How a generation speculates: who drafts, and how many tokens a step
/// checks at most (`cleave_nn::MAX_DRAFTS` keeps the check in the decode
/// form).
pub struct Speculation<'d> {
    pub drafter: &'d mut dyn Drafter,
    pub max_drafts: usize,
}

/// What speculation did over a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Steps that checked drafts.
    pub steps: usize,
    pub drafted: usize,
    /// Drafts that were the model's own pick.
    pub accepted: usize,
}

impl SpeculationStats {
    /// The share of drafted tokens kept (`None` before any draft).
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }
}

/// Prompt lookup (vLLM's n-gram drafter, llama.cpp's lookup decoding):
/// the last few tokens are looked up earlier in the context, and what
/// followed them there is the draft. It costs no model, and pays where
/// the output quotes its input: code edits, summaries that cite, chats
/// that repeat names.
#[derive(Clone, Copy, Debug)]
pub struct PromptLookup {
    /// The longest tail looked up first, down to the shortest.
    pub max_ngram: usize,
    pub min_ngram: usize,
}

impl Default for PromptLookup {
    /// Tails of 4 down to 2 tokens: a single token matches too often to
    /// guess well.
    fn default() -> Self {
        PromptLookup {
            max_ngram: 4,
            min_ngram: 2,
        }
    }
}

impl Drafter for PromptLookup {
    fn draft(&mut self, ids: &[u32], max: usize) -> Result<Vec<u32>, ModelError> {
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            let Some(tail_start) = ids.len().checked_sub(n) else {
                continue;
            };
            let tail = &ids[tail_start..];
            // The latest earlier occurrence: the most recent text is the
            // likeliest to be repeated.
            if let Some(start) = (0..tail_start).rev().find(|&s| &ids[s..s + n] == tail) {
                let follows = &ids[start + n..];
                return Ok(follows[..follows.len().min(max)].to_vec());
            }
        }
        Ok(Vec::new())
    }
}

/// A draft model: a smaller model of the same vocabulary, decoding
/// greedily ahead of the one it drafts for. It keeps its own cache of the
/// sequence and rewinds it to what the checked pass kept.
pub struct DraftModel<'m> {
    model: &'m mut dyn CausalLm,
    /// The ids its cache holds.
    cached: Vec<u32>,
    /// How it picks: the most likely id, never one of those the model
    /// never picks.
    rule: PickRule,
}

impl<'m> DraftModel<'m> {
    /// A drafter that never drafts `banned` (the end-of-sequence ids of a
    /// generation that ignores them).
    pub fn new(model: &'m mut dyn CausalLm, banned: Vec<u32>) -> Self {
        DraftModel {
            model,
            cached: Vec::new(),
            rule: PickRule::greedy(banned),
        }
    }
}

impl Drafter for DraftModel<'_> {
    fn prepare(&mut self, max: usize) {
        // It rewinds past the drafts of its last step that were not kept.
        self.model.keep_history(max);
    }

    fn draft(&mut self, ids: &[u32], max: usize) -> Result<Vec<u32>, ModelError> {
        // Its cache holds the sequence up to where a check last differed
        // from the drafts; at least the last id goes in again, to pick
        // after it.
        let same = self.cached.iter().zip(ids).take_while(|(a, b)| a == b).count();
        let keep = same.min(ids.len().saturating_sub(1));
        self.model.truncate(keep);
        self.cached.truncate(keep);
        // Each draft but the last goes through the model.
        let room = (self.model.capacity() + 1).saturating_sub(ids.len());
        let max = max.min(room);
        if max == 0 {
            return Ok(Vec::new());
        }
        let greedy = std::slice::from_ref(&self.rule);
        let mut drafts = self.model.forward_pick(&ids[keep..], greedy)?;
        self.cached.extend_from_slice(&ids[keep..]);
        while drafts.len() < max {
            let last = drafts[drafts.len() - 1];
            drafts.extend(self.model.forward_pick(&[last], greedy)?);
            self.cached.push(last);
        }
        Ok(drafts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_lookup_continues_the_latest_match_of_the_longest_tail() {
        let mut lookup = PromptLookup::default();
        // "1 2 3" occurred twice: the later one is followed by 7 8.
        let ids = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 0, 1, 2, 3];
        assert_eq!(lookup.draft(&ids, 8).unwrap(), [7, 8, 0, 1, 2, 3]);
        assert_eq!(lookup.draft(&ids, 2).unwrap(), [7, 8]);
        // "6 2 3" never occurred before; its tail "2 3" did.
        let ids = [1, 2, 3, 4, 6, 2, 3];
        assert_eq!(lookup.draft(&ids, 8).unwrap(), [4, 6, 2, 3]);
        // A single repeated token is no guess.
        assert!(lookup.draft(&[5, 1, 6, 1], 8).unwrap().is_empty());
        assert!(lookup.draft(&[1], 8).unwrap().is_empty());
        assert!(lookup.draft(&[], 8).unwrap().is_empty());
    }
}
