//! Each row's log-probabilities on the device (OpenAI's `logprobs`), so
//! that a step reporting them reads back a few words a row rather than its
//! logits: the row's log-normalizer (its largest logit, then the sum of the
//! exponentials below it), the most likely tokens by the sampler's sort
//! ([`crate::sample`]'s top-k passes) and the picked token's logit, all
//! soft-capped where the family caps and taken before any bias, penalty or
//! temperature, as the host reports them.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{cube_grid, cube_index};
use crate::pick::{soft_capped, Banned, Picked};
use crate::reduce::{reduce, Max, Sum};
use crate::sample::{top_k, value_of, MAX_DEVICE_TOP_K};
use crate::{KernelError, Tensor};

/// Units per cube of [`log_totals`].
const TOTAL_UNITS: u32 = 256;

/// Words of a row's report before its top tokens: the log-normalizer and
/// the pick's log-probability (f32 bits).
const HEAD_WORDS: usize = 2;

/// The logit `bits` as the report takes it (see [`soft_capped`]).
#[cube]
fn capped(bits: u32, cap: f32, #[comptime] softcap: bool) -> f32 {
    soft_capped(f32::reinterpret(bits), cap, softcap)
}

/// One cube per row of `logits` (f32 bits): `max + ln Σ exp(l - max)` over
/// the row's (capped) logits, at the head of the row's report in `out`.
#[cube(launch)]
fn log_totals(
    logits: &Array<u32>,
    out: &mut Array<u32>,
    rows: u32,
    cols: u32,
    stride: u32,
    cap: f32,
    #[comptime] softcap: bool,
) {
    let row = cube_index();
    let lane = UNIT_POS_X;
    let mut partial = SharedMemory::<f32>::new(TOTAL_UNITS as usize);
    // A cube past the rows (of a grid's second dimension) reads the last.
    let at = min(row, rows - 1) * cols;
    // Every unit holds a column (the vocabulary is far wider than the cube).
    let mut top = capped(logits[(at + min(lane, cols - 1)) as usize], cap, softcap);
    let mut j = lane;
    while j < cols && row < rows {
        top = f32::max(top, capped(logits[(at + j) as usize], cap, softcap));
        j += TOTAL_UNITS;
    }
    partial[lane as usize] = top;
    sync_cube();
    reduce::<f32, Max>(&mut partial, 0);
    let max = partial[0];
    sync_cube();
    let mut sum = 0.0f32;
    let mut j = lane;
    while j < cols && row < rows {
        sum += f32::exp(capped(logits[(at + j) as usize], cap, softcap) - max);
        j += TOTAL_UNITS;
    }
    partial[lane as usize] = sum;
    sync_cube();
    reduce::<f32, Sum>(&mut partial, 0);
    if lane == 0 && row < rows {
        out[(row * stride) as usize] = u32::reinterpret(max + f32::ln(partial[0]));
    }
}

/// One unit per row: the pick's log-probability and the `top` most likely
/// tokens' (from the row's first `top` sorted candidates of `k`), each
/// logit less the row's log-normalizer, into the row's report.
#[cube(launch)]
fn gather_reports(
    logits: &Array<u32>,
    picked: &Array<u32>,
    keys: &Array<u32>,
    ids: &Array<u32>,
    out: &mut Array<u32>,
    rows: u32,
    cols: u32,
    stride: u32,
    k: u32,
    top: u32,
    cap: f32,
    #[comptime] softcap: bool,
) {
    let row = ABSOLUTE_POS_X;
    if row < rows {
        let base = row * stride;
        let total = f32::reinterpret(out[base as usize]);
        // A flagged pick (a NaN among the logits, `NON_FINITE`) is reported
        // as an error, not with these words.
        let id = min(picked[row as usize] & 0x7fff_ffffu32, cols - 1);
        out[(base + 1) as usize] = u32::reinterpret(capped(logits[(row * cols + id) as usize], cap, softcap) - total);
        for t in 0..top {
            out[(base + 2 + t) as usize] = ids[(row * k + t) as usize];
            out[(base + 2 + top + t) as usize] = u32::reinterpret(value_of(keys[(row * k + t) as usize]) - total);
        }
    }
}

/// Each row's log-probability report on a device, as
/// [`logprob_reports`] writes it: the log-normalizer, the pick's
/// log-probability, then `top` ids and their log-probabilities.
#[derive(Clone, Debug)]
pub struct LogprobReports {
    handle: cubecl::server::Handle,
    rows: usize,
    top: usize,
    /// No id banned, for the top tokens' sort.
    unbanned: Banned,
}

/// One row's report, read back.
#[derive(Clone, Debug, PartialEq)]
pub struct LogprobReport {
    pub logprob: f32,
    /// The most likely tokens, most likely first (the smaller id first
    /// among equal ones).
    pub top: Vec<(u32, f32)>,
}

impl LogprobReports {
    /// Room for `rows` reports of the `top` most likely tokens each (at
    /// most [`MAX_DEVICE_TOP_K`]).
    pub fn new<R: Runtime>(client: &ComputeClient<R>, rows: usize, top: usize) -> Result<LogprobReports, KernelError> {
        if top > MAX_DEVICE_TOP_K {
            return Err(KernelError::Launch {
                op: "logprobs",
                problem: format!("the top {top} tokens; the device sorts at most {MAX_DEVICE_TOP_K}"),
            });
        }
        let words = (rows * (HEAD_WORDS + 2 * top)).max(1);
        Ok(LogprobReports {
            handle: crate::profile::empty(client, words * size_of::<u32>()),
            rows,
            top,
            unbanned: Banned::new(client, &vec![&[][..]; rows]),
        })
    }

    /// Tokens each report ranks.
    pub fn top(&self) -> usize {
        self.top
    }

    fn stride(&self) -> usize {
        HEAD_WORDS + 2 * self.top
    }

    /// Waits for the device and reads each row's report.
    pub fn read<R: Runtime>(&self, client: &ComputeClient<R>) -> Result<Vec<LogprobReport>, KernelError> {
        let bytes = crate::profile::read(client, &self.handle)?;
        let words = u32::from_bytes(&bytes);
        Ok(words
            .chunks(self.stride())
            .take(self.rows)
            .map(|row| {
                let (ids, logprobs) = row[HEAD_WORDS..].split_at(self.top);
                LogprobReport {
                    logprob: f32::from_bits(row[1]),
                    top: ids
                        .iter()
                        .zip(logprobs)
                        .map(|(&id, &l)| (id, f32::from_bits(l)))
                        .collect(),
                }
            })
            .collect())
    }

    fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds `rows · stride` words (one when empty).
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), (self.rows * self.stride()).max(1)) }
    }
}

/// Each row's report of `logits: [rows, vocab]` (soft-capped where
/// `softcap`) for the ids in `picked`, into `reports`. `top` is at most the
/// vocabulary: past it a row has no more tokens to rank.
pub fn logprob_reports<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &Tensor,
    softcap: Option<f32>,
    picked: &Picked,
    reports: &LogprobReports,
) -> Result<(), KernelError> {
    let (rows, cols) = (logits.rows(), logits.cols());
    if rows == 0 {
        return Ok(());
    }
    let expected = || format!("[{rows}]");
    check_shape(picked.len() == rows, "logprobs", "picked", &[picked.len()], expected)?;
    check_shape(reports.rows == rows, "logprobs", "reports", &[reports.rows], expected)?;
    check_shape(reports.top <= cols, "logprobs", "top", &[reports.top], || {
        format!("at most {cols}")
    })?;
    let stride = reports.stride() as u32;
    let cap = softcap.unwrap_or(1.0);
    crate::profile::launch(client, "log_totals", || {
        log_totals::launch::<R>(
            client,
            cube_grid(rows),
            CubeDim::new_1d(TOTAL_UNITS),
            logits.words_arg(),
            reports.arg(),
            rows as u32,
            cols as u32,
            stride,
            cap,
            softcap.is_some(),
        )
    });
    // The sort takes at least one candidate a row.
    let k = reports.top.max(1);
    let sorted = top_k(client, logits, &reports.unbanned, softcap, k)?;
    let (keys, ids) = sorted.args(rows);
    let units = 64u32;
    crate::profile::launch(client, "gather_reports", || {
        gather_reports::launch::<R>(
            client,
            CubeCount::Static((rows as u32).div_ceil(units).max(1), 1, 1),
            CubeDim::new_1d(units),
            logits.words_arg(),
            picked.arg(),
            keys,
            ids,
            reports.arg(),
            rows as u32,
            cols as u32,
            stride,
            k as u32,
            reports.top as u32,
            cap,
            softcap.is_some(),
        )
    });
    Ok(())
}
