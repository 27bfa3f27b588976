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

/// Logit `v` of column `j` as a pick sees it: soft-capped (`cap ·
/// tanh(v / cap)`) where `softcap`, -∞ where `j` is among the row's
/// `width` banned ids from `banned[at]`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn capped_unless_banned(
    v: f32,
    j: u32,
    banned: &Array<u32>,
    at: u32,
    width: u32,
    cap: f32,
    neg_inf: f32,
    #[comptime] softcap: bool,
) -> f32 {
    let mut v = v;
    if softcap {
        v = f32::tanh(v / cap) * cap;
    }
    let mut b = 0u32;
    while b < width {
        if banned[(at + b) as usize] == j {
            v = neg_inf;
        }
        b += 1;
    }
    v
}

/// One cube per row of `logits` (f32 bits): the index of the row's largest value
/// (the first of equal ones), after the soft cap `cap · tanh(l / cap)`
/// where `softcap`, with the ids in the row's row of `banned` (`width`
/// each) taken as -∞ (a generation that ignores end-of-sequence tokens).
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
            v = capped_unless_banned(v, j, banned, row * width, width, cap, neg_inf, softcap);
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
    check_shape(banned.rows == rows, "argmax", "banned", &[banned.rows], || {
        format!("[{rows}]")
    })?;
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
/// ([`crate::sample`]), never a `banned` one.
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
/// with ids past any vocabulary.
#[derive(Clone, Debug)]
pub struct Banned {
    handle: cubecl::server::Handle,
    rows: usize,
    width: usize,
}

impl Banned {
    /// `ids[r]`: the ids row `r` never takes.
    pub fn new<R: Runtime>(client: &ComputeClient<R>, ids: &[&[u32]]) -> Banned {
        let width = ids.iter().map(|row| row.len()).max().unwrap_or(0);
        let mut table = vec![u32::MAX; (ids.len() * width).max(1)];
        for (r, row) in ids.iter().enumerate() {
            table[r * width..r * width + row.len()].copy_from_slice(row);
        }
        Banned {
            handle: crate::profile::upload(client, u32::as_bytes(&table)),
            rows: ids.len(),
            width,
        }
    }

    /// Rows (sequences) it has ids for.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Ids a row (padded).
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds `rows · width` ids (one when empty).
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), (self.rows * self.width).max(1)) }
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
