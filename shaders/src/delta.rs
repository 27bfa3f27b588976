//! The kernels of a Gated DeltaNet layer (Qwen3.5's linear attention): the
//! causal depthwise convolution over q, k and v with its rolling window,
//! and the gated delta rule over a recurrent state of `[key, value]` per
//! head. Both keep, per sequence, a state that does not grow with the
//! context, in a buffer of numbered states ([`StateRoutes`] says which
//! each sequence of a pass reads and writes).
//!
//! Each runs the recurrence one row after another, a unit per channel (the
//! convolution) or per value column of a head (the delta rule): a column's
//! update reads only that column of the state, so no unit waits for
//! another. A prompt's rows are many steps of the same recurrence in one
//! launch; transformers' chunked form computes the same sums in another
//! order.

use cubecl::prelude::*;

use crate::activation::activation;
use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{Activation, KernelError, Tensor};

/// A route's "none": no state to read (the sequence starts from zeros).
const NONE: u32 = u32::MAX;

/// u32s per sequence in a route table.
const ROUTE_WORDS: u32 = 7;

/// Where one sequence of a pass reads and writes its recurrent state:
/// its rows of the pass, the state it starts from (`None`: zeros), the
/// state it leaves its result in, and the ring it keeps recent positions'
/// states in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateRoute {
    pub first_row: usize,
    pub rows: usize,
    pub source: Option<usize>,
    pub dest: usize,
    pub ring: Option<StateRing>,
}

/// States `base..base + len`, position `p`'s state at `base + p % len`:
/// the last `len` positions' states of a sequence that may be cut back to
/// one of them (a speculative step's rejected drafts). A pass writes the
/// states of its last `len` positions, its first position `at` (modulo
/// `len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateRing {
    pub base: usize,
    pub len: usize,
    pub at: usize,
}

/// A pass's [`StateRoute`]s on a device.
pub struct StateRoutes {
    table: cubecl::server::Handle,
    seqs: usize,
    /// Rows the routes cover, and one past the highest state they name,
    /// checked against the tensors before a launch.
    rows: usize,
    states: usize,
}

impl StateRoutes {
    pub fn new<R: Runtime>(client: &ComputeClient<R>, routes: &[StateRoute]) -> Result<Self, KernelError> {
        let mut table = Vec::with_capacity(routes.len() * ROUTE_WORDS as usize);
        let (mut rows, mut states) = (0, 0);
        for r in routes {
            let ring = r.ring.filter(|ring| ring.len > 0);
            let words = [
                Some(r.first_row),
                Some(r.rows),
                r.source,
                Some(r.dest),
                ring.map(|ring| ring.base),
                Some(ring.map_or(0, |ring| ring.len)),
                Some(ring.map_or(0, |ring| ring.at % ring.len)),
            ]
            .map(|w| w.map_or(Some(NONE), |w| u32::try_from(w).ok().filter(|&w| w != NONE)));
            let highest = [r.source, Some(r.dest), ring.map(|ring| ring.base + ring.len - 1)];
            let highest = highest.into_iter().flatten().max().unwrap_or(0);
            let fits = words.iter().all(Option::is_some) && u32::try_from(highest).is_ok_and(|h| h != NONE);
            check_shape(fits, "state routes", "route", &[r.first_row, r.rows, highest], || {
                "rows and state numbers below 2^32 - 1".into()
            })?;
            table.extend(words.map(Option::unwrap_or_default));
            rows = rows.max(r.first_row + r.rows);
            states = states.max(highest + 1);
        }
        if table.is_empty() {
            // A zero-sized buffer is not allowed on every backend.
            table.push(0);
        }
        Ok(StateRoutes {
            table: crate::profile::upload(client, u32::as_bytes(&table)),
            seqs: routes.len(),
            rows,
            states,
        })
    }

    fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds ROUTE_WORDS u32s per sequence (one when
        // there are none).
        unsafe { ArrayArg::from_raw_parts(self.table.clone(), (self.seqs * ROUTE_WORDS as usize).max(1)) }
    }

    fn check(&self, op: &'static str, rows: usize, states: usize) -> Result<(), KernelError> {
        check_shape(
            self.rows <= rows && self.states <= states,
            op,
            "routes",
            &[self.rows, self.states],
            || format!("rows within the pass's {rows} and states below {states}"),
        )
    }
}

/// The `w`-th word of sequence `s`'s route.
#[cube]
fn route(routes: &Array<u32>, s: u32, w: u32) -> u32 {
    routes[(s * ROUTE_WORDS + w) as usize]
}

/// Where the state after `done` of a route's `rows` rows goes in its ring
/// (`NONE`, spelled out for cubecl: nowhere, the ring being shorter than
/// what is left of the pass, or absent).
#[cube]
fn ring_slot(routes: &Array<u32>, s: u32, done: u32, rows: u32) -> u32 {
    let len = route(routes, s, 5);
    let mut slot = 0xffff_ffffu32;
    if len > 0 && rows - done < len {
        slot = route(routes, s, 4) + (route(routes, s, 6) + done) % len;
    }
    slot
}

/// One unit per sequence and channel: `out[t] = silu(Σ_w weight[w] ·
/// in[t - taps + 1 + w])`, the inputs before the pass's first row read
/// from the sequence's window (the last `taps - 1` inputs, oldest first).
#[cube(launch)]
fn causal_conv_kernel<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    windows: &mut Array<F>,
    routes: &Array<u32>,
    out: &mut Array<F>,
    seqs: u32,
    channels: u32,
    #[comptime] taps: u32,
) {
    let unit = linear_pos() as u32;
    if unit < seqs * channels {
        let s = unit / channels;
        let c = unit % channels;
        let (first, rows) = (route(routes, s, 0), route(routes, s, 1));
        let (source, dest) = (route(routes, s, 2), route(routes, s, 3));
        let keep = comptime!(taps - 1);
        let window_len = keep * channels;
        let mut history = Array::<F>::new(comptime!((taps - 1) as usize));
        #[unroll]
        for w in 0..keep {
            history[w as usize] = F::new(0.0);
            if source != NONE {
                history[w as usize] = windows[(source * window_len + w * channels + c) as usize];
            }
        }
        let ring = ring_slot(routes, s, 0, rows);
        if ring != NONE {
            #[unroll]
            for w in 0..keep {
                windows[(ring * window_len + w * channels + c) as usize] = history[w as usize];
            }
        }
        for t in 0..rows {
            let at = ((first + t) * channels + c) as usize;
            let input = x[at];
            let mut sum = F::new(0.0);
            #[unroll]
            for w in 0..keep {
                sum += weight[(c * taps + w) as usize] * history[w as usize];
            }
            sum += weight[(c * taps + keep) as usize] * input;
            out[at] = activation::<F>(sum, Activation::Silu);
            #[unroll]
            for w in 1..keep {
                history[(w - 1) as usize] = history[w as usize];
            }
            history[(keep - 1) as usize] = input;
            let ring = ring_slot(routes, s, t + 1, rows);
            if ring != NONE {
                #[unroll]
                for w in 0..keep {
                    windows[(ring * window_len + w * channels + c) as usize] = history[w as usize];
                }
            }
        }
        #[unroll]
        for w in 0..keep {
            windows[(dest * window_len + w * channels + c) as usize] = history[w as usize];
        }
    }
}

/// `silu` of the causal depthwise convolution of `x: [rows, channels]` by
/// `weight: [channels, taps]` (PyTorch's `conv1d` with `groups =
/// channels` and `taps - 1` zeros of padding before, as transformers'
/// `causal_conv1d_fn`), each sequence's rows continuing from its window
/// in `windows: [states, taps - 1, channels]`, which is left holding its
/// last `taps - 1` inputs.
pub fn causal_conv<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    weight: &Tensor,
    windows: &Tensor,
    routes: &StateRoutes,
) -> Result<Tensor, KernelError> {
    let (rows, channels) = (x.rows(), x.cols());
    let taps = weight.cols();
    check_shape(
        weight.shape == [channels, taps] && taps >= 2,
        "causal_conv",
        "weight",
        &weight.shape,
        || format!("[{channels}, at least 2 taps]"),
    )?;
    let states = windows.shape.first().copied().unwrap_or(0);
    check_shape(
        windows.shape == [states, taps - 1, channels],
        "causal_conv",
        "windows",
        &windows.shape,
        || format!("[states, {}, {channels}]", taps - 1),
    )?;
    routes.check("causal_conv", rows, states)?;
    let out = Tensor::empty(client, &x.shape);
    let (count, dim) = grid_1d(routes.seqs * channels);
    crate::profile::launch(client, "causal_conv", || {
        causal_conv_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            x.arg(),
            weight.arg(),
            windows.arg(),
            routes.arg(),
            out.arg(),
            routes.seqs as u32,
            channels as u32,
            taps as u32,
        );
    });
    Ok(out)
}

/// The heads of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaHeads {
    pub key_heads: usize,
    pub key_dim: usize,
    pub value_heads: usize,
    pub value_dim: usize,
    /// The value heads' order: transformers' groups each key head's value
    /// heads together (value head h reads key head `h / (value_heads /
    /// key_heads)`); llama.cpp's converter tiles them (key head
    /// `h % key_heads`), reordering every tensor of value heads alike.
    pub tiled_values: bool,
}

impl DeltaHeads {
    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        match self.tiled_values {
            true => h % self.key_heads,
            false => h / (self.value_heads / self.key_heads),
        }
    }

    /// Columns of q, k and v side by side (the convolution's channels).
    pub fn qkv_width(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// f32s of one sequence's state: `[value_heads, key_dim, value_dim]`.
    pub fn state_len(&self) -> usize {
        self.value_heads * self.key_dim * self.value_dim
    }
}

/// `1 / √(Σ x² + 1e-6)` over `x[at..at + len]`: FLA's `l2norm`, as
/// transformers applies it to each head of q and k.
#[cube]
fn inverse_l2<F: Float>(x: &Array<F>, at: u32, len: u32) -> F {
    let mut sum = F::new(0.0);
    for i in 0..len {
        let v = x[(at + i) as usize];
        sum += v * v;
    }
    F::new(1.0) / F::sqrt(sum + F::new(1e-6))
}

/// Copies a column of `key_dim` values `value_dim` apart from `from` to
/// `to` in `states`.
#[cube]
fn copy_column<F: Float>(states: &mut Array<F>, from: u32, to: u32, key_dim: u32, value_dim: u32) {
    for i in 0..key_dim {
        states[(to + i * value_dim) as usize] = states[(from + i * value_dim) as usize];
    }
}

/// One unit per sequence, value head and value column. Per row: the
/// decay `exp(-exp(A_log) · softplus(a + dt_bias))` and the rate
/// `sigmoid(b)`; the column decayed, corrected towards `v` by the delta
/// rule along the (normed) key, and read by the (normed, scaled) query.
/// The column is updated where it ends, in the destination state: held in
/// registers, Qwen3.5's 128 values a column spill on sm_80 and sm_90, and
/// a warp's columns side by side are read as whole cache lines.
#[cube(launch)]
fn gated_delta_kernel<F: Float>(
    qkv: &Array<F>,
    a: &Array<F>,
    b: &Array<F>,
    a_log: &Array<F>,
    dt_bias: &Array<F>,
    states: &mut Array<F>,
    routes: &Array<u32>,
    out: &mut Array<F>,
    seqs: u32,
    key_heads: u32,
    value_heads: u32,
    value_dim: u32,
    key_dim: u32,
    tiled_values: u32,
) {
    let unit = linear_pos() as u32;
    let width = value_heads * value_dim;
    if unit < seqs * width {
        let s = unit / width;
        let h = (unit / value_dim) % value_heads;
        let j = unit % value_dim;
        // Each key head serves `value_heads / key_heads` consecutive value
        // heads (transformers' `repeat_interleave`), or every
        // `key_heads`-th one (llama.cpp's order): see `DeltaHeads`.
        let kh = (h / (value_heads / key_heads)) * (1 - tiled_values) + (h % key_heads) * tiled_values;
        let (first, rows) = (route(routes, s, 0), route(routes, s, 1));
        let (source, dest) = (route(routes, s, 2), route(routes, s, 3));
        let state_len = value_heads * key_dim * value_dim;
        let column = h * key_dim * value_dim + j;
        let at = dest * state_len + column;
        if source == NONE {
            for i in 0..key_dim {
                states[(at + i * value_dim) as usize] = F::new(0.0);
            }
        } else if source != dest {
            copy_column::<F>(states, source * state_len + column, at, key_dim, value_dim);
        }
        let ring = ring_slot(routes, s, 0, rows);
        if ring != NONE {
            copy_column::<F>(states, at, ring * state_len + column, key_dim, value_dim);
        }
        let qk_width = key_heads * key_dim;
        let row_width = 2 * qk_width + width;
        let neg_a = F::new(0.0) - F::exp(a_log[h as usize]);
        let query_scale = F::new(1.0) / F::sqrt(F::cast_from(key_dim));
        for t in 0..rows {
            let row = first + t;
            let q_at = row * row_width + kh * key_dim;
            let k_at = q_at + qk_width;
            let v = qkv[(row * row_width + 2 * qk_width + h * value_dim + j) as usize];
            let q_scale = inverse_l2::<F>(qkv, q_at, key_dim) * query_scale;
            let k_scale = inverse_l2::<F>(qkv, k_at, key_dim);
            // PyTorch's softplus: x itself past 20.
            let x = a[(row * value_heads + h) as usize] + dt_bias[h as usize];
            let mut softplus = x;
            if x <= F::new(20.0) {
                softplus = F::ln(F::new(1.0) + F::exp(x));
            }
            let decay = F::exp(neg_a * softplus);
            let rate = F::new(1.0) / (F::new(1.0) + F::exp(F::new(0.0) - b[(row * value_heads + h) as usize]));
            let mut recalled = F::new(0.0);
            for i in 0..key_dim {
                let decayed = states[(at + i * value_dim) as usize] * decay;
                recalled += decayed * qkv[(k_at + i) as usize] * k_scale;
            }
            let delta = (v - recalled) * rate;
            let mut read = F::new(0.0);
            for i in 0..key_dim {
                let cell = (at + i * value_dim) as usize;
                let updated = states[cell] * decay + qkv[(k_at + i) as usize] * k_scale * delta;
                states[cell] = updated;
                read += updated * qkv[(q_at + i) as usize] * q_scale;
            }
            out[(row * width + h * value_dim + j) as usize] = read;
            let ring = ring_slot(routes, s, t + 1, rows);
            if ring != NONE {
                copy_column::<F>(states, at, ring * state_len + column, key_dim, value_dim);
            }
        }
    }
}

/// The gated delta rule of transformers' `torch_recurrent_gated_delta_rule`
/// (with `use_qk_l2norm_in_kernel`) over `qkv: [rows, q | k | v]` (the
/// convolution's output), the gates' inputs `a` and `b` (`[rows,
/// value_heads]`) and the layer's `a_log` and `dt_bias`; each sequence's
/// rows continue from its state in `states: [states, value_heads,
/// key_dim, value_dim]`, which is left holding the state after its last
/// row. Returns the output, `[rows, value_heads · value_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule<R: Runtime>(
    client: &ComputeClient<R>,
    heads: DeltaHeads,
    qkv: &Tensor,
    (a, b): (&Tensor, &Tensor),
    (a_log, dt_bias): (&Tensor, &Tensor),
    states: &Tensor,
    routes: &StateRoutes,
) -> Result<Tensor, KernelError> {
    let rows = qkv.rows();
    let DeltaHeads {
        key_heads,
        key_dim,
        value_heads,
        value_dim,
        tiled_values,
    } = heads;
    let grouped = key_heads > 0 && value_heads.is_multiple_of(key_heads) && key_dim > 0 && value_dim > 0;
    check_shape(
        grouped && qkv.cols() == heads.qkv_width(),
        "gated_delta_rule",
        "qkv",
        &qkv.shape,
        || {
            format!(
                "[rows, {}], with value heads a multiple of key heads",
                heads.qkv_width()
            )
        },
    )?;
    for (what, t) in [("a", a), ("b", b)] {
        check_shape(
            t.rows() == rows && t.cols() == value_heads,
            "gated_delta_rule",
            what,
            &t.shape,
            || format!("[{rows}, {value_heads}]"),
        )?;
    }
    for (what, t) in [("A_log", a_log), ("dt_bias", dt_bias)] {
        check_shape(t.shape == [value_heads], "gated_delta_rule", what, &t.shape, || {
            format!("[{value_heads}]")
        })?;
    }
    let count = states.shape.first().copied().unwrap_or(0);
    check_shape(
        states.shape == [count, value_heads, key_dim, value_dim],
        "gated_delta_rule",
        "states",
        &states.shape,
        || format!("[states, {value_heads}, {key_dim}, {value_dim}]"),
    )?;
    routes.check("gated_delta_rule", rows, count)?;
    let out = Tensor::empty(client, &qkv.shape_with_cols(value_heads * value_dim));
    let (cubes, dim) = grid_1d(routes.seqs * value_heads * value_dim);
    crate::profile::launch(client, "gated_delta_rule", || {
        gated_delta_kernel::launch::<f32, R>(
            client,
            cubes,
            dim,
            qkv.arg(),
            a.arg(),
            b.arg(),
            a_log.arg(),
            dt_bias.arg(),
            states.arg(),
            routes.arg(),
            out.arg(),
            routes.seqs as u32,
            key_heads as u32,
            value_heads as u32,
            value_dim as u32,
            key_dim as u32,
            u32::from(tiled_values),
        );
    });
    Ok(out)
}
