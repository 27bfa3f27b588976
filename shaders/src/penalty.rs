//! Repetition penalties (llama.cpp's `penalties` sampler) on the device:
//! each token among a sequence's last n (prompt and generated) has its
//! logit divided by the repeat penalty (multiplied where it is not
//! positive), then lowered by the frequency penalty per occurrence and
//! the presence penalty once. The device keeps each sequence's last n ids
//! itself, appending every pick, so that a decode step writes nothing.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::pick::{soft_capped, Picked};
use crate::{KernelError, Tensor};

/// The longest window the device penalizes over: every logit looks at
/// each id of its row's window.
pub const MAX_DEVICE_PENALTY_WINDOW: usize = 256;

/// Words before a row's window on the device: repeat, frequency and
/// presence penalties (f32 bits), the window's length, ids appended so
/// far, three unused.
const HEADER_WORDS: usize = 8;

/// A sequence's repetition penalties.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// Divides a repeated token's positive logit, multiplies a negative
    /// one (1: off).
    pub repeat: f32,
    /// Lowers a token's logit this much for every time it occurs.
    pub frequency: f32,
    /// Lowers a token's logit this much if it occurs at all.
    pub presence: f32,
    /// How many of the last tokens count (0: none).
    pub last_n: usize,
}

impl Default for Penalties {
    /// Off, over llama.cpp's window of 64 tokens.
    fn default() -> Self {
        Penalties {
            repeat: 1.0,
            frequency: 0.0,
            presence: 0.0,
            last_n: 64,
        }
    }
}

impl Penalties {
    /// Whether they change no logit.
    pub fn is_off(&self) -> bool {
        self.last_n == 0 || (self.repeat == 1.0 && self.frequency == 0.0 && self.presence == 0.0)
    }

    /// The ids of `history` (oldest first) these penalties look at: the
    /// last `last_n`, none where they are off.
    pub fn window<'h>(&self, history: &'h [u32]) -> &'h [u32] {
        match self.is_off() {
            true => &[],
            false => &history[history.len().saturating_sub(self.last_n)..],
        }
    }

    /// `logits` penalized for the ids of `window`, as the device does it.
    pub fn apply_on_host(&self, logits: &mut [f32], window: &[u32]) {
        let mut seen: Vec<u32> = window.to_vec();
        seen.sort_unstable();
        for run in seen.chunk_by(|a, b| a == b) {
            if let Some(l) = logits.get_mut(run[0] as usize) {
                *l = penalized(*l, run.len() as u32, self);
            }
        }
    }
}

/// A logit of a token that occurs `count` (> 0) times in the window.
fn penalized(logit: f32, count: u32, p: &Penalties) -> f32 {
    let scaled = if logit <= 0.0 {
        logit * p.repeat
    } else {
        logit / p.repeat
    };
    scaled - (count as f32 * p.frequency + p.presence)
}

/// One unit per logit of `logits` (f32 bits, in place): soft-capped where
/// `softcap`, then penalized by its row's header and window in `history`.
/// A NaN or an infinity is left as it is, for the pick to report.
#[cube(launch)]
fn penalize_rows(
    logits: &mut Array<u32>,
    history: &Array<u32>,
    rows: u32,
    cols: u32,
    stride: u32,
    cap: f32,
    #[comptime] softcap: bool,
) {
    let pos = linear_pos();
    if pos < (rows * cols) as usize {
        let bits = logits[pos];
        // Tested by their bits: WGSL may take floats to be finite.
        if (bits & 0x7f80_0000u32) != 0x7f80_0000u32 {
            let row = pos as u32 / cols;
            let id = pos as u32 % cols;
            let mut v = soft_capped(f32::reinterpret(bits), cap, softcap);
            let base = row * stride;
            let filled = min(history[(base + 4) as usize], history[(base + 3) as usize]);
            // Counted in f32, as the penalty takes it (exact: at most 256).
            let mut count = 0.0f32;
            for i in 0..filled {
                if history[(base + HEADER_WORDS as u32 + i) as usize] == id {
                    count += 1.0;
                }
            }
            if count > 0.0 {
                let repeat = f32::reinterpret(history[base as usize]);
                let frequency = f32::reinterpret(history[(base + 1) as usize]);
                let presence = f32::reinterpret(history[(base + 2) as usize]);
                let scaled = select(v <= 0.0, v * repeat, v / repeat);
                v = scaled - (count * frequency + presence);
            }
            logits[pos] = u32::reinterpret(v);
        }
    }
}

/// One unit per row: the row's pick appended to its window, the oldest id
/// giving way once the window is full.
#[cube(launch)]
fn append_picks(picked: &Array<u32>, history: &mut Array<u32>, rows: u32, stride: u32) {
    let row = ABSOLUTE_POS_X;
    if row < rows {
        let base = row * stride;
        let last_n = history[(base + 3) as usize];
        if last_n > 0 {
            let appended = history[(base + 4) as usize];
            history[(base + HEADER_WORDS as u32 + appended % last_n) as usize] = picked[row as usize];
            history[(base + 4) as usize] = appended + 1;
        }
    }
}

/// Each row's penalties and the window of ids they look at, on a device.
#[derive(Clone, Debug)]
pub struct History {
    handle: cubecl::server::Handle,
    rows: usize,
    /// Words a row takes: its header and the longest window.
    stride: usize,
}

impl History {
    /// `rows[r]`: row `r`'s penalties and its window (the last ids of its
    /// sequence, oldest first, at most `last_n`; none where they are off).
    /// Fails where a window is longer than the device takes.
    pub fn new<R: Runtime>(client: &ComputeClient<R>, rows: &[(Penalties, &[u32])]) -> Result<History, KernelError> {
        let longest = rows.iter().map(|(p, _)| p.last_n).max().unwrap_or(0);
        if longest > MAX_DEVICE_PENALTY_WINDOW {
            return Err(KernelError::Launch {
                op: "penalize",
                problem: format!(
                    "a window of {longest} tokens; the device penalizes over at most {MAX_DEVICE_PENALTY_WINDOW}"
                ),
            });
        }
        let stride = HEADER_WORDS + longest;
        let mut words = vec![0u32; (rows.len() * stride).max(1)];
        for (r, (penalties, window)) in rows.iter().enumerate() {
            let row = &mut words[r * stride..(r + 1) * stride];
            if penalties.is_off() {
                continue;
            }
            let window = penalties.window(window);
            row[..5].copy_from_slice(&[
                penalties.repeat.to_bits(),
                penalties.frequency.to_bits(),
                penalties.presence.to_bits(),
                penalties.last_n as u32,
                window.len() as u32,
            ]);
            row[HEADER_WORDS..][..window.len()].copy_from_slice(window);
        }
        Ok(History {
            handle: crate::profile::upload(client, u32::as_bytes(&words)),
            rows: rows.len(),
            stride,
        })
    }

    fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds `rows · stride` words (one when empty).
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), (self.rows * self.stride).max(1)) }
    }
}

/// `logits: [rows, vocab]` soft-capped where `softcap` (`cap · tanh(l /
/// cap)`) and penalized by `history`, in place.
pub fn penalize<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &Tensor,
    history: &History,
    softcap: Option<f32>,
) -> Result<(), KernelError> {
    let rows = logits.rows();
    check_shape(history.rows == rows, "penalize", "history", &[history.rows], || {
        format!("[{rows}]")
    })?;
    let (cubes, dim) = grid_1d(logits.len());
    crate::profile::launch(client, "penalize", || {
        penalize_rows::launch::<R>(
            client,
            cubes,
            dim,
            logits.words_arg(),
            history.arg(),
            rows as u32,
            logits.cols() as u32,
            history.stride as u32,
            softcap.unwrap_or(1.0),
            softcap.is_some(),
        )
    });
    Ok(())
}

/// Appends each row's pick in `picked` to its window in `history`.
pub fn append_picks_to<R: Runtime>(
    client: &ComputeClient<R>,
    picked: &Picked,
    history: &History,
) -> Result<(), KernelError> {
    let rows = history.rows;
    check_shape(picked.len() == rows, "append_picks", "picked", &[picked.len()], || {
        format!("[{rows}]")
    })?;
    let units = 64u32;
    crate::profile::launch(client, "append_picks", || {
        append_picks::launch::<R>(
            client,
            CubeCount::Static((rows as u32).div_ceil(units).max(1), 1, 1),
            CubeDim::new_1d(units),
            picked.arg(),
            history.arg(),
            rows as u32,
            history.stride as u32,
        )
    });
    Ok(())
}
