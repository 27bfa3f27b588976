//! Prefix reuse across requests, as llama-server's slots do it: a finished
//! sequence's cache stays in its slot, and a new prompt goes to the free
//! slot whose cached tokens share the longest prefix with it, which then
//! prefills only the rest. A slot that shares nothing with any new prompt
//! is the least recently used one, whose cache is the one given up.

/// What each slot's cache holds, and when each was last given a job.
pub struct Slots {
    /// The tokens in each slot's cache, in order (empty where nothing is
    /// known to be there).
    cached: Vec<Vec<u32>>,
    last_used: Vec<u64>,
    clock: u64,
}

/// Where a new prompt goes: its slot, and how many of its first tokens
/// that slot's cache already holds.
#[derive(Debug, PartialEq, Eq)]
pub struct Placement {
    pub slot: usize,
    pub reused: usize,
}

impl Slots {
    pub fn new(slots: usize) -> Self {
        Slots {
            cached: vec![Vec::new(); slots],
            last_used: vec![0; slots],
            clock: 0,
        }
    }

    /// The slot among `free` for `prompt`: the one whose cache shares the
    /// most of its first tokens (all but its last at most, which a pass
    /// must read to give the first token's logits), among those that
    /// `can_cut` back to the shared length (`can_cut(slot, len)`); the
    /// least recently used where none shares any.
    pub fn place(
        &mut self,
        free: impl IntoIterator<Item = usize>,
        prompt: &[u32],
        can_cut: impl Fn(usize, usize) -> bool,
    ) -> Option<Placement> {
        let most = prompt.len().saturating_sub(1);
        let placement = free
            .into_iter()
            .map(|slot| {
                let cached = &self.cached[slot];
                let shared = cached.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(most);
                let reused = match shared > 0 && can_cut(slot, shared) {
                    true => shared,
                    false => 0,
                };
                Placement { slot, reused }
            })
            .min_by_key(|p| (std::cmp::Reverse(p.reused), self.last_used[p.slot]))?;
        self.clock += 1;
        self.last_used[placement.slot] = self.clock;
        // Until the job hands it back, what the slot holds is the job's.
        self.cached[placement.slot].clear();
        Some(placement)
    }

    /// A job's slot is free again, its cache holding `cached` (empty
    /// where a failed pass left it unknown).
    pub fn release(&mut self, slot: usize, cached: Vec<u32>) {
        self.cached[slot] = cached;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_shared_prefix_wins_then_the_least_recently_used() {
        let mut slots = Slots::new(3);
        let anywhere = |_: usize, _: usize| true;
        // Nothing cached: the least recently used, the first of equals.
        assert_eq!(
            slots.place(0..3, &[1, 2], anywhere),
            Some(Placement { slot: 0, reused: 0 })
        );
        slots.release(0, vec![1, 2, 3, 4]);
        assert_eq!(
            slots.place(1..3, &[9], anywhere),
            Some(Placement { slot: 1, reused: 0 })
        );
        slots.release(1, vec![1, 2, 7]);
        // Slot 0 shares three tokens, slot 1 two, slot 2 none.
        assert_eq!(
            slots.place(0..3, &[1, 2, 3, 5], anywhere),
            Some(Placement { slot: 0, reused: 3 })
        );
        // A prompt the cache holds whole still reads its last token.
        slots.release(0, vec![1, 2, 3, 4]);
        assert_eq!(
            slots.place(0..3, &[1, 2, 3, 4], anywhere),
            Some(Placement { slot: 0, reused: 3 })
        );
        // A slot given a job holds nothing known until it is released.
        assert_eq!(
            slots.place(0..3, &[1, 2, 3, 4], anywhere),
            Some(Placement { slot: 1, reused: 2 })
        );
        // Nothing shared anywhere: slot 2, never used, then the oldest.
        slots.release(0, vec![5]);
        slots.release(1, vec![6]);
        assert_eq!(
            slots.place(0..3, &[8, 8], anywhere),
            Some(Placement { slot: 2, reused: 0 })
        );
        assert_eq!(
            slots.place(0..2, &[8, 8], anywhere),
            Some(Placement { slot: 0, reused: 0 })
        );
        assert_eq!(slots.place(std::iter::empty(), &[1], anywhere), None);
    }

    #[test]
    fn a_cache_that_cannot_be_cut_back_is_reused_only_whole() {
        let mut slots = Slots::new(2);
        slots.release(0, vec![1, 2, 3]);
        slots.release(1, vec![1, 2]);
        // A recurrent state goes on only from where it is.
        let only_whole = |slot: usize, len: usize| len >= [3, 2][slot];
        assert_eq!(
            slots.place(0..2, &[1, 2, 9, 9], only_whole),
            Some(Placement { slot: 1, reused: 2 })
        );
        slots.release(1, vec![1, 2]);
        assert_eq!(
            slots.place(0..2, &[1, 2, 3, 4], only_whole),
            Some(Placement { slot: 0, reused: 3 })
        );
        slots.release(0, vec![4, 4]);
        slots.release(1, vec![1, 2, 3]);
        let cut_nothing = |slot: usize, len: usize| len >= [2, 3][slot];
        // Neither can be reused: the least recently used goes.
        assert_eq!(
            slots.place(0..2, &[1, 2, 3], cut_nothing),
            Some(Placement { slot: 1, reused: 0 })
        );
    }
}
