//! Picking each sequence's next token on the device, so that a decode
//! step reads back one id per sequence rather than its logits.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{cube_grid, cube_index};
use crate::penalty::{append_picks_to, penalize, History};
use crate::sample::{sample, SampleRules};
use crate::{KernelError, Tensor};

/// Units per cube of [`argmax_rows`].
const PICK_UNITS: u32 = 256;

/// The bit set in a picked id where the row held a NaN or an infinity;
/// the rest of the word is the first such value's index. Vocabularies are
/// far below 2³¹.
pub const NON_FINITE: u32 = 1 << 31;

/// Whether `(value, index)` wins over `(best, at)`: the larger value, the
/// smaller index of equal ones (the first, as the host's argmax takes).
#[cube]
fn wins(value: f32, index: u32, best: f32, at: u32) -> bool {
    value > best || (value == best && index < at)
}

/// Logit `v` soft-capped (`cap · tanh(v / cap)`) where `softcap`: as
/// every pick, penalty and report takes a capping family's logits.
#[cube]
pub(crate) fn soft_capped(v: f32, cap: f32, #[comptime] softcap: bool) -> f32 {
    if softcap {
        f32::tanh(v / cap) * cap
    } else {
        v
    }
}

/// Logit `v` of column `j` of row `row` (of `rows`) as a pick sees it:
/// soft-capped (`cap · tanh(v / cap)`) where `softcap`, -∞ where `j` is
/// among the row's `width` banned ids or, where rows hold masks of
/// `words` words, outside its mask (both laid out as [`Banned`] says).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn capped_unless_banned(
    v: f32,
    j: u32,
    row: u32,
    rows: u32,
    banned: &Array<u32>,
    width: u32,
    words: u32,
    cap: f32,
    neg_inf: f32,
    #[comptime] softcap: bool,
) -> f32 {
    let mut v = soft_capped(v, cap, softcap);
    let at = row * width;
    let mut b = 0u32;
    while b < width {
        if banned[(at + b) as usize] == j {
            v = neg_inf;
        }
        b += 1;
    }
    if words > 0 {
        let word = banned[(rows * width + row * words + j / 32) as usize];
        if (word >> (j % 32)) & 1 == 0 {
            v = neg_inf;
        }
    }
    v
}

/// One cube per row of `logits` (f32 bits): the index of the row's largest value
/// (the first of equal ones), after the soft cap `cap · tanh(l / cap)`
/// where `softcap`, with the row's ids in `banned` taken as -∞ (see
/// [`capped_unless_banned`]).
/// A row holding a NaN or an infinity gets [`NON_FINITE`] with the first
/// one's index instead.
#[cube(launch)]
fn argmax_rows(
    logits: &Array<u32>,
    banned: &Array<u32>,
    out: &mut Array<u32>,
    rows: u32,
    cols: u32,
    width: u32,
    words: u32,
    cap: f32,
    neg_inf: f32,
    #[comptime] softcap: bool,
) {
    let row = cube_index();
    let mut best = SharedMemory::<f32>::new(PICK_UNITS as usize);
    let mut at = SharedMemory::<u32>::new(PICK_UNITS as usize);
    let mut bad = SharedMemory::<u32>::new(PICK_UNITS as usize);
    let lane = UNIT_POS_X;
    // Each unit's best over its columns, and its first non-finite one.
    let mut my_best = 0.0f32;
    // No column yet: an index past any vocabulary.
    let mut my_at = 0xffff_ffffu32;
    let mut my_bad = 0xffff_ffffu32;
    if row < rows {
        let mut j = lane;
        while j < cols {
            // Read as bits, and tested by them: WGSL may take floats to be
            // finite.
            let bits = logits[(row * cols + j) as usize];
            let mut v = f32::reinterpret(bits);
            if (bits & 0x7f80_0000) == 0x7f80_0000 && my_bad == 0xffff_ffffu32 {
                my_bad = j;
            }
            v = capped_unless_banned(v, j, row, rows, banned, width, words, cap, neg_inf, softcap);
            // The first column a unit sees is its best so far, whatever
            // its value (-∞ included).
            if my_at == 0xffff_ffffu32 || wins(v, j, my_best, my_at) {
                my_best = v;
                my_at = j;
            }
            j += PICK_UNITS;
        }
    }
    best[lane as usize] = my_best;
    at[lane as usize] = my_at;
    bad[lane as usize] = my_bad;
    sync_cube();
    let mut stride = CUBE_DIM_X / 2;
    while stride > 0 {
        if lane < stride {
            let other = lane + stride;
            let (v, i) = (best[other as usize], at[other as usize]);
            if i != 0xffff_ffffu32
                && (at[lane as usize] == 0xffff_ffffu32 || wins(v, i, best[lane as usize], at[lane as usize]))
            {
                best[lane as usize] = v;
                at[lane as usize] = i;
            }
            bad[lane as usize] = min(bad[lane as usize], bad[other as usize]);
        }
        sync_cube();
        stride /= 2;
    }
    if lane == 0 && row < rows {
        out[row as usize] = select(bad[0] == 0xffff_ffffu32, at[0], bad[0] | 0x8000_0000u32);
    }
}

/// The largest logit's index in each row of `logits: [rows, vocab]`, as
/// [`argmax_rows`] picks it, into `out` (one u32 a row).
pub fn argmax<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &Tensor,
    banned: &Banned,
    softcap: Option<f32>,
    out: &Picked,
) -> Result<(), KernelError> {
    let rows = logits.rows();
    check_shape(out.len == rows, "argmax", "out", &[out.len], || format!("[{rows}]"))?;
    banned.check(rows, logits.cols(), "argmax")?;
    crate::profile::launch(client, "argmax", || {
        argmax_rows::launch::<R>(
            client,
            cube_grid(rows),
            CubeDim::new_1d(PICK_UNITS),
            logits.words_arg(),
            banned.arg(),
            out.arg(),
            rows as u32,
            logits.cols() as u32,
            banned.width as u32,
            banned.words as u32,
            softcap.unwrap_or(1.0),
            // An argument, not a literal: not every shading language can
            // write an infinity.
            f32::NEG_INFINITY,
            softcap.is_some(),
        )
    });
    Ok(())
}

/// Each row's next token picked from `logits: [rows, vocab]` into `out`:
/// soft-capped where `softcap`, penalized where `history` holds penalties
/// (each pick then appended to its row's window), and the most likely
/// token taken ([`argmax`]) or one sampled where `sampling` holds rules
/// ([`crate::sample`]), never one `banned` holds its row from.
pub fn pick_tokens<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &Tensor,
    banned: &Banned,
    softcap: Option<f32>,
    (sampling, history): (Option<&SampleRules>, Option<&History>),
    out: &Picked,
) -> Result<(), KernelError> {
    let mut softcap = softcap;
    if let Some(history) = history {
        // The cap goes first, as the host applies it as it reads logits.
        penalize(client, logits, history, softcap)?;
        softcap = None;
    }
    match sampling {
        None => argmax(client, logits, banned, softcap, out)?,
        Some(rules) => sample(client, logits, banned, softcap, rules, out)?,
    }
    if let Some(history) = history {
        append_picks_to(client, out, history)?;
    }
    Ok(())
}

/// For each row, the token ids its pick never takes (as if their logits
/// were -∞), on a device: a table of `rows` rows of `width` ids, padded
/// with ids past any vocabulary; then, where a grammar holds a row to a
/// mask, `rows` rows of `words` words of allowed ids as bits (id `i` is
/// bit `i % 32` of word `i / 32`), every id allowed in a row without one.
#[derive(Clone, Debug)]
pub struct Banned {
    handle: cubecl::server::Handle,
    rows: usize,
    width: usize,
    /// Words of a row's mask: 0 where no row has one.
    words: usize,
}

impl Banned {
    /// `ids[r]`: the ids row `r` never takes.
    pub fn new<R: Runtime>(client: &ComputeClient<R>, ids: &[&[u32]]) -> Banned {
        Banned::masked(client, ids, &[], 0)
    }

    /// `ids[r]`: the ids row `r` never takes; `masks[r]`, where given, the
    /// only ids it may take over a vocabulary of `vocab` (a mask's missing
    /// words allow nothing, its words past the vocabulary are ignored). No
    /// mask at all, or `vocab` 0, is [`Banned::new`]'s table.
    pub fn masked<R: Runtime>(
        client: &ComputeClient<R>,
        ids: &[&[u32]],
        masks: &[Option<&[u32]>],
        vocab: usize,
    ) -> Banned {
        let width = ids.iter().map(|row| row.len()).max().unwrap_or(0);
        let words = match masks.iter().any(Option::is_some) {
            true => vocab.div_ceil(32),
            false => 0,
        };
        let mut table = vec![u32::MAX; (ids.len() * (width + words)).max(1)];
        for (r, row) in ids.iter().enumerate() {
            table[r * width..r * width + row.len()].copy_from_slice(row);
        }
        let masks_at = ids.len() * width;
        for (r, mask) in masks.iter().take(ids.len()).enumerate() {
            if let Some(mask) = mask {
                let row = &mut table[masks_at + r * words..][..words];
                row.fill(0);
                let given = mask.len().min(words);
                row[..given].copy_from_slice(&mask[..given]);
            }
        }
        Banned {
            handle: crate::profile::upload(client, u32::as_bytes(&table)),
            rows: ids.len(),
            width,
            words,
        }
    }

    /// Rows (sequences) it has ids for.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Fails unless it holds `rows` rows and, where it holds masks, masks
    /// over `cols` ids: what `op`'s logits are.
    pub(crate) fn check(&self, rows: usize, cols: usize, op: &'static str) -> Result<(), KernelError> {
        check_shape(self.rows == rows, op, "banned", &[self.rows], || format!("[{rows}]"))?;
        let words = cols.div_ceil(32);
        check_shape(
            self.words == 0 || self.words == words,
            op,
            "banned masks",
            &[self.rows, self.words],
            || format!("[{rows}, {words}]"),
        )
    }

    /// Ids a row (padded).
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Words of a row's mask, 0 where no row has one.
    pub(crate) fn words(&self) -> usize {
        self.words
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds `rows · (width + words)` words (one
        // when empty).
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), (self.rows * (self.width + self.words)).max(1)) }
    }
}

/// One picked id per row, on a device.
#[derive(Clone, Debug)]
pub struct Picked {
    handle: cubecl::server::Handle,
    len: usize,
}

impl Picked {
    pub fn new<R: Runtime>(client: &ComputeClient<R>, rows: usize) -> Picked {
        Picked {
            handle: crate::profile::empty(client, rows * size_of::<u32>()),
            len: rows,
        }
    }

    /// Rows (ids) it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn handle(&self) -> cubecl::server::Handle {
        self.handle.clone()
    }

    /// Waits for the device and reads the ids: each a token id, or
    /// [`NON_FINITE`] with the index of its row's first non-finite logit.
    pub fn read<R: Runtime>(&self, client: &ComputeClient<R>) -> Result<Vec<u32>, KernelError> {
        let bytes = crate::profile::read(client, &self.handle)?;
        Ok(u32::from_bytes(&bytes)[..self.len].to_vec())
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds `len` u32s (one when empty).
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.len.max(1)) }
    }
}
