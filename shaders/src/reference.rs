//! Plain-Rust twins of every kernel: slow, obvious, and the yardstick the
//! kernel tests measure against.

/// `x · wᵀ` for `x: [m, k]`, `w: [n, k]`.
pub fn matmul(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for r in 0..m {
        for c in 0..n {
            out[r * n + c] = (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum();
        }
    }
    out
}

pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let cols = weight.len();
    x.chunks(cols)
        .flat_map(|row| {
            let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
            let inv = 1.0 / (mean_sq + eps).sqrt();
            row.iter().zip(weight).map(move |(v, w)| v * inv * w)
        })
        .collect()
}

/// Each row's most likely id as the host's greedy pick takes it: the first
/// of the largest values after the soft cap `cap · tanh(l / cap)`, the
/// row's `banned` ids taken as -∞; a row with a NaN or an infinity gives
/// `NON_FINITE` with the first one's index.
pub fn argmax(logits: &[f32], cols: usize, banned: &[&[u32]], softcap: Option<f32>) -> Vec<u32> {
    logits
        .chunks(cols)
        .zip(banned)
        .map(|(row, banned)| {
            if let Some(bad) = row.iter().position(|v| !v.is_finite()) {
                return crate::NON_FINITE | bad as u32;
            }
            let value = |j: usize| match banned.contains(&(j as u32)) {
                true => f32::NEG_INFINITY,
                false => softcap.map_or(row[j], |cap| (row[j] / cap).tanh() * cap),
            };
            (1..row.len()).fold(0, |best, j| if value(j) > value(best) { j } else { best }) as u32
        })
        .collect()
}

/// The log-probability of `id` in a row of `logits` (soft-capped where
/// `softcap`) and the `top` most likely tokens' (the smaller id first among
/// equal ones), by a log-softmax in f64.
pub fn logprobs(logits: &[f32], id: u32, top: usize, softcap: Option<f32>) -> (f32, Vec<(u32, f32)>) {
    let capped: Vec<f64> = logits
        .iter()
        .map(|&l| softcap.map_or(l, |cap| (l / cap).tanh() * cap) as f64)
        .collect();
    let max = capped.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let total = max + capped.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
    let mut order: Vec<usize> = (0..capped.len()).collect();
    order.sort_by(|&a, &b| capped[b].total_cmp(&capped[a]).then(a.cmp(&b)));
    let ranked = order
        .into_iter()
        .take(top)
        .map(|j| (j as u32, (capped[j] - total) as f32));
    ((capped[id as usize] - total) as f32, ranked.collect())
}

pub fn softmax_rows(x: &mut [f32], cols: usize) {
    for row in x.chunks_mut(cols) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row
            .iter_mut()
            .map(|v| {
                *v = (*v - max).exp();
                *v
            })
            .sum();
        row.iter_mut().for_each(|v| *v /= sum);
    }
}

/// Rotates the first `2 * half` dimensions of each head of `x: [rows, heads
/// * head_dim]` in place, row `r` at `positions[r]`, by the angles of the
/// table `RopeTable` holds (the kernel's input).
pub fn rope(x: &mut [f32], inv_freq: &[f32], heads: usize, positions: &[u32]) {
    let half = inv_freq.len();
    let head_dim = x.len() / (positions.len() * heads).max(1);
    let longest = positions.iter().map(|&p| p as usize + 1).max().unwrap_or(0);
    let (cos, sin) = crate::rope::rope_table(inv_freq, longest, 1.0);
    for (head_row, head) in x.chunks_mut(head_dim).enumerate() {
        let pos = positions[head_row / heads] as usize;
        for i in 0..half {
            let (c, s) = (cos[pos * half + i], sin[pos * half + i]);
            let (x1, x2) = (head[i], head[i + half]);
            head[i] = x1 * c - x2 * s;
            head[i + half] = x2 * c + x1 * s;
        }
    }
}

/// Grouped-query attention of `q: [rows, heads * head_dim]` over
/// `k`, `v: [keys, kv_heads * head_dim]`, where row `s` sees key `t` if
/// `visible(s, t)`, with `bias: [heads, rows, keys]` added to the scaled
/// scores if given, and each head's logit of `sinks` joining its softmax
/// (and dropped after it, as transformers' gpt-oss does) if given.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: crate::AttentionShape,
    visible: impl Fn(usize, usize) -> bool,
    (bias, sinks): (Option<&[f32]>, Option<&[f32]>),
) -> Vec<f32> {
    let crate::AttentionShape {
        heads,
        kv_heads,
        head_dim,
        scale,
        softcap,
        ..
    } = shape;
    let rows = q.len() / (heads * head_dim);
    let keys = k.len() / (kv_heads * head_dim);
    let group = heads / kv_heads;
    let mut out = vec![0.0; q.len()];
    for s in 0..rows {
        for h in 0..heads {
            let kv_h = h / group;
            let qv = &q[(s * heads + h) * head_dim..][..head_dim];
            let mut p: Vec<f32> = (0..keys)
                .map(|t| {
                    if !visible(s, t) {
                        return f32::NEG_INFINITY;
                    }
                    let kv = &k[(t * kv_heads + kv_h) * head_dim..][..head_dim];
                    let added = bias.map_or(0.0, |b| b[(h * rows + s) * keys + t]);
                    let score = qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale;
                    softcap.map_or(score, |cap| (score / cap).tanh() * cap) + added
                })
                .chain(sinks.map(|sinks| sinks[h]))
                .collect();
            let cols = p.len();
            softmax_rows(&mut p, cols);
            // The sink, past the keys, weighs no value.
            for d in 0..head_dim {
                out[(s * heads + h) * head_dim + d] = p[..keys]
                    .iter()
                    .enumerate()
                    .map(|(t, pt)| pt * v[(t * kv_heads + kv_h) * head_dim + d])
                    .sum();
            }
        }
    }
    out
}

pub fn gelu(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| 0.5 * v * (1.0 + erf(v as f64 / std::f64::consts::SQRT_2) as f32))
        .collect()
}

pub fn quick_gelu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| v / (1.0 + (-1.702 * v).exp())).collect()
}

/// `gelu_tanh(gate) * up`, computed in f64.
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = g as f64;
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            (0.5 * g * (1.0 + inner.tanh()) * u as f64) as f32
        })
        .collect()
}

/// erf in f64, from its Taylor series for |x| < 2.5 and the continued
/// fraction of erfc beyond: far more precise than the f32 kernel it checks.
fn erf(x: f64) -> f64 {
    let ax = x.abs();
    let value = if ax < 2.5 {
        // Taylor: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = ax;
        let mut sum = ax;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -ax * ax / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // Continued fraction for erfc, evaluated backwards.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        1.0 - (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f)
    };
    value.copysign(x)
}

pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32) -> Vec<f32> {
    let cols = weight.len();
    x.chunks(cols)
        .flat_map(|row| {
            let mean = row.iter().sum::<f32>() / cols as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cols as f32;
            let inv = 1.0 / (var + eps).sqrt();
            row.iter()
                .zip(weight.iter().zip(bias))
                .map(move |(v, (w, b))| (v - mean) * inv * w + b)
        })
        .collect()
}

pub fn silu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v / (1.0 + (-v).exp())).collect()
}

pub fn sigmoid(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect()
}

/// The causal depthwise convolution of `crate::causal_conv`, in f64, for
/// one sequence: `x: [rows, channels]` after the `window` of `taps - 1`
/// earlier inputs (`[taps - 1, channels]`, oldest first), `weight:
/// [channels, taps]`. Returns the silu of the output and the new window.
pub fn causal_conv(x: &[f32], weight: &[f32], window: &[f32], channels: usize) -> (Vec<f32>, Vec<f32>) {
    let taps = weight.len() / channels;
    let mut inputs: Vec<f64> = window.iter().chain(x).map(|&v| v as f64).collect();
    let rows = x.len() / channels;
    let mut out = vec![0.0; x.len()];
    for t in 0..rows {
        for c in 0..channels {
            let sum: f64 = (0..taps)
                .map(|w| weight[c * taps + w] as f64 * inputs[(t + w) * channels + c])
                .sum();
            out[t * channels + c] = (sum / (1.0 + (-sum).exp())) as f32;
        }
    }
    let window = inputs.split_off(inputs.len() - window.len());
    (out, window.into_iter().map(|v| v as f32).collect())
}

/// The gated delta rule of `crate::gated_delta_rule`, in f64, for one
/// sequence: `qkv: [rows, q | k | v]`, `a`, `b`: `[rows, value_heads]`,
/// from `state: [value_heads, key_dim, value_dim]`. Returns the output
/// (`[rows, value_heads · value_dim]`) and the state after the last row.
pub fn gated_delta_rule(
    heads: crate::DeltaHeads,
    qkv: &[f32],
    (a, b): (&[f32], &[f32]),
    (a_log, dt_bias): (&[f32], &[f32]),
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let crate::DeltaHeads {
        key_dim,
        value_heads,
        value_dim,
        ..
    } = heads;
    let qk = heads.key_heads * key_dim;
    let width = heads.qkv_width();
    let rows = qkv.len() / width;
    let mut s: Vec<f64> = state.iter().map(|&v| v as f64).collect();
    let mut out = vec![0.0; rows * value_heads * value_dim];
    let normed = |x: &[f32]| {
        let inv = 1.0 / (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() + 1e-6).sqrt();
        x.iter().map(|&v| v as f64 * inv).collect::<Vec<f64>>()
    };
    for t in 0..rows {
        let row = &qkv[t * width..(t + 1) * width];
        for h in 0..value_heads {
            let kh = heads.key_head(h);
            let q: Vec<f64> = normed(&row[kh * key_dim..(kh + 1) * key_dim])
                .into_iter()
                .map(|v| v / (key_dim as f64).sqrt())
                .collect();
            let k = normed(&row[qk + kh * key_dim..qk + (kh + 1) * key_dim]);
            let v = &row[2 * qk + h * value_dim..2 * qk + (h + 1) * value_dim];
            let x = (a[t * value_heads + h] + dt_bias[h]) as f64;
            let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
            let decay = (-(a_log[h] as f64).exp() * softplus).exp();
            let rate = 1.0 / (1.0 + (-(b[t * value_heads + h] as f64)).exp());
            let head = &mut s[h * key_dim * value_dim..(h + 1) * key_dim * value_dim];
            for j in 0..value_dim {
                let recalled: f64 = (0..key_dim)
                    .map(|i| {
                        head[i * value_dim + j] *= decay;
                        head[i * value_dim + j] * k[i]
                    })
                    .sum();
                let delta = (v[j] as f64 - recalled) * rate;
                let read: f64 = (0..key_dim)
                    .map(|i| {
                        head[i * value_dim + j] += k[i] * delta;
                        head[i * value_dim + j] * q[i]
                    })
                    .sum();
                out[(t * value_heads + h) * value_dim + j] = read as f32;
            }
        }
    }
    (out, s.into_iter().map(|v| v as f32).collect())
}

/// `gelu_tanh(x)`, computed in f64.
pub fn gelu_tanh(x: &[f32]) -> Vec<f32> {
    gelu_tanh_mul(x, &vec![1.0; x.len()])
}

/// `x · (1 + scale) + shift`, per column.
pub fn modulate(x: &[f32], shift: &[f32], scale: &[f32]) -> Vec<f32> {
    x.chunks(shift.len())
        .flat_map(|row| {
            row.iter()
                .zip(shift.iter().zip(scale))
                .map(|(v, (sh, sc))| v * (1.0 + sc) + sh)
        })
        .collect()
}

/// `x += gate · y`, per column.
pub fn add_gated(x: &mut [f32], y: &[f32], gate: &[f32]) {
    for (row, y_row) in x.chunks_mut(gate.len()).zip(y.chunks(gate.len())) {
        for ((v, w), g) in row.iter_mut().zip(y_row).zip(gate) {
            *v += g * w;
        }
    }
}

/// Rotates interleaved pairs of `x: [rows, heads * 2 * half]` in place by
/// the tables `cos`, `sin: [rows, half]`.
pub fn rope_pairs(x: &mut [f32], cos: &[f32], sin: &[f32], heads: usize, half: usize) {
    for (head_row, head) in x.chunks_mut(2 * half).enumerate() {
        let row = head_row / heads;
        for i in 0..half {
            let (c, s) = (cos[row * half + i], sin[row * half + i]);
            let (re, im) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = re * c - im * s;
            head[2 * i + 1] = im * c + re * s;
        }
    }
}

pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter().zip(up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect()
}

/// gpt-oss's clamped SwiGLU of `gate` and `up`, in f64 as transformers'
/// `_apply_gate` writes it: `(clamp(up, ±7) + 1) · g · sigmoid(1.702 g)`
/// for `g = min(gate, 7)`.
pub fn clamped_swiglu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let (limit, alpha) = (crate::SWIGLU_LIMIT as f64, crate::SWIGLU_ALPHA as f64);
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = (g as f64).min(limit);
            let u = (u as f64).clamp(-limit, limit) + 1.0;
            (u * g / (1.0 + (-alpha * g).exp())) as f32
        })
        .collect()
}

/// `a += b`.
pub fn add_assign(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(v, w)| *v += w);
}

/// `a += scale · b`.
pub fn add_scaled(a: &mut [f32], b: &[f32], scale: f32) {
    a.iter_mut().zip(b).for_each(|(v, w)| *v += w * scale);
}

/// `x = x · scale + shift`.
pub fn scale_shift(x: &mut [f32], scale: f32, shift: f32) {
    x.iter_mut().for_each(|v| *v = *v * scale + shift);
}

/// `dst[rows[i]] += weights[i] · src[i]`, rows `cols` wide.
pub fn add_rows_scaled(dst: &mut [f32], src: &[f32], rows: &[u32], weights: &[f32], cols: usize) {
    for ((row, &to), &w) in src.chunks(cols).zip(rows).zip(weights) {
        let dst = &mut dst[to as usize * cols..][..cols];
        dst.iter_mut().zip(row).for_each(|(d, s)| *d += s * w);
    }
}

pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
}

pub fn embedding(table: &[f32], cols: usize, ids: &[u32]) -> Vec<f32> {
    ids.iter()
        .flat_map(|&id| table[id as usize * cols..][..cols].iter().copied())
        .collect()
}

pub fn bf16_to_f32(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

pub fn f16_to_f32(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// `nn.Conv2d(in, out, k, padding=k // 2)` on `x: [in, h, w]` with
/// `weight: [out, in, k, k]`, summed in f64.
pub fn conv2d(x: &[f32], weight: &[f32], bias: &[f32], channels: usize, h: usize, w: usize, k: usize) -> Vec<f32> {
    let out_channels = bias.len();
    let pad = (k / 2) as isize;
    let mut out = vec![0.0; out_channels * h * w];
    for o in 0..out_channels {
        for y in 0..h {
            for col in 0..w {
                let mut acc = bias[o] as f64;
                for c in 0..channels {
                    for ky in 0..k {
                        for kx in 0..k {
                            let (iy, ix) = (y as isize + ky as isize - pad, col as isize + kx as isize - pad);
                            if (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix) {
                                let v = x[(c * h + iy as usize) * w + ix as usize];
                                acc += v as f64 * weight[((o * channels + c) * k + ky) * k + kx] as f64;
                            }
                        }
                    }
                }
                out[(o * h + y) * w + col] = acc as f32;
            }
        }
    }
    out
}

/// `nn.GroupNorm(groups, channels, eps)` on `x: [channels, plane]`, then
/// SiLU if `silu`; statistics in f64.
pub fn group_norm(x: &[f32], weight: &[f32], bias: &[f32], groups: usize, eps: f32, silu: bool) -> Vec<f32> {
    let channels = weight.len();
    let plane = x.len() / channels;
    let group_len = plane * channels / groups;
    x.chunks(group_len)
        .enumerate()
        .flat_map(|(g, group)| {
            let n = group_len as f64;
            let mean = group.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = group.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let inv = 1.0 / (var + eps as f64).sqrt();
            group.iter().enumerate().map(move |(i, &v)| {
                let c = g * channels / groups + i / plane;
                let y = ((v as f64 - mean) * inv) as f32 * weight[c] + bias[c];
                if silu {
                    y / (1.0 + (-y).exp())
                } else {
                    y
                }
            })
        })
        .collect()
}

/// `[c, h, w]` → `[c, 2h, 2w]`, nearest.
pub fn upsample_nearest2x(x: &[f32], c: usize, h: usize, w: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(4 * x.len());
    for ch in 0..c {
        for y in 0..2 * h {
            for col in 0..2 * w {
                out.push(x[(ch * h + y / 2) * w + col / 2]);
            }
        }
    }
    out
}

/// `[rows, cols]` → `[cols, rows]`.
pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols * rows).map(|i| x[(i % rows) * cols + i / rows]).collect()
}
