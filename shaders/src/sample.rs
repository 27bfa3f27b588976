//! Sampling each sequence's next token on the device, as the host sampler
//! ([`sample_on_host`]) samples it: the top-k logits sorted, a softmax at
//! the temperature, the top-p cut, and a seeded uniform drawn by a
//! counter-based generator both sides compute alike ([`uniform`]). A
//! decode step that samples thus reads back one id per sequence, as a
//! greedy one does, instead of its logits.
//!
//! The top k of a row are found in passes: each cube sorts a chunk of
//! [`CHUNK`] candidates in shared memory (a bitonic sort) and keeps its
//! first k, until one chunk is left; the last pass's k are the row's, in
//! order. Candidates are ordered by value, then by id (the first of equal
//! ones, as the host's greedy pick takes them), each value as a key whose
//! unsigned order is the values' order.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{cube_grid, cube_index};
use crate::penalty::{Penalties, MAX_DEVICE_PENALTY_WINDOW};
use crate::pick::{capped_unless_banned, Banned, Picked, NON_FINITE};
use crate::{KernelError, Tensor};

/// Candidates one cube sorts: 8 KiB of keys and ids in shared memory,
/// well within WebGPU's 16 KiB.
const CHUNK: u32 = 1024;

/// Units per cube of the sorting passes: each moves four candidates.
const SORT_UNITS: u32 = 256;

/// The largest top-k sampled on the device: a quarter of a chunk, so that
/// every pass leaves at most a quarter of the candidates it took.
pub const MAX_DEVICE_TOP_K: usize = 256;

/// An empty candidate's id (past a row's end); its key is 0, below every
/// value's.
const EMPTY: u32 = 0xffff_ffff;

/// The key of a NaN or an infinity among the logits: above every finite
/// value's, so that the first such one (the smallest id) comes first and
/// the pick reports it, as the greedy pick does.
const FLAGGED: u32 = 0xffff_ffff;

/// Words of a row's rule on the device: seed (low, high), uniforms drawn,
/// top-k, temperature and top-p (f32 bits), two unused.
const RULE_WORDS: usize = 8;

/// How a sequence samples its next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 or below: always the most likely token.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1: all).
    pub top_p: f32,
    pub seed: u64,
    /// Applied to the logits first, greedy or not.
    pub penalties: Penalties,
}

impl SamplerConfig {
    /// Always the most likely token, unpenalized.
    pub fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            top_k: 1,
            top_p: 1.0,
            seed: 0,
            penalties: Penalties::default(),
        }
    }

    /// Whether it always picks the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Whether the device can pick as it asks: greedy or with a top-k of
    /// at most [`MAX_DEVICE_TOP_K`] (all tokens need the host's full
    /// sort), penalties over at most [`MAX_DEVICE_PENALTY_WINDOW`] tokens.
    pub fn fits_device(&self) -> bool {
        let window = self.penalties.is_off() || self.penalties.last_n <= MAX_DEVICE_PENALTY_WINDOW;
        window && (self.is_greedy() || (1..=MAX_DEVICE_TOP_K).contains(&self.top_k))
    }

    /// A sequence's state moved past its pick `id`, as the device moves it:
    /// one uniform more `drawn` where it samples, `id` at the end of its
    /// penalty `window` (the oldest id giving way) where it penalizes.
    pub fn advance(&self, drawn: &mut u32, window: &mut Vec<u32>, id: u32) {
        if !self.is_greedy() {
            *drawn += 1;
        }
        if !self.penalties.is_off() {
            window.push(id);
            let excess = window.len().saturating_sub(self.penalties.last_n);
            window.drain(..excess);
        }
    }
}

/// Whether `client`'s device samples tokens itself: GPUs do, rather than
/// send their logits back and wait; CPU adapters (those that run the unit
/// form, see `choice.rs`) do not, for there reading the logits back is a
/// copy in memory, and the sort's barriers cost more than the host's sort
/// (docs/BENCHMARKS.md). [`crate::with_kernels`] imposes either.
pub fn samples_on_device<R: Runtime>(client: &ComputeClient<R>) -> bool {
    crate::choice::kernels_for(client) == crate::Kernels::Tiled
}

/// A 32-bit integer hash with full avalanche (Chris Wellons' `lowbias32`).
#[cube]
fn mix(x: u32) -> u32 {
    let mut x = x ^ (x >> 16);
    x *= 0x7feb_352du32;
    x ^= x >> 15;
    x *= 0x846c_a68bu32;
    x ^ (x >> 16)
}

/// The `counter`th uniform in [0, 1) of the stream `seed`, 24 bits: what
/// [`uniform`] gives, on the device.
#[cube]
fn uniform_at(seed_low: u32, seed_high: u32, counter: u32) -> f32 {
    let bits = mix(mix(mix(counter ^ 0x9e37_79b9u32) ^ seed_low) ^ seed_high) >> 8;
    f32::cast_from(bits) * (1.0 / 16_777_216.0)
}

/// The `counter`th uniform in [0, 1) of the stream `seed`: a hash of the
/// two, so that the device draws the very number the host would without
/// keeping a generator's state.
fn uniform(seed: u64, counter: u32) -> f32 {
    let mix = |x: u32| {
        let mut x = x ^ (x >> 16);
        x = x.wrapping_mul(0x7feb_352d);
        x ^= x >> 15;
        x = x.wrapping_mul(0x846c_a68b);
        x ^ (x >> 16)
    };
    let bits = mix(mix(mix(counter ^ 0x9e37_79b9) ^ seed as u32) ^ (seed >> 32) as u32) >> 8;
    bits as f32 * (1.0 / 16_777_216.0)
}

/// The index of the largest logit (the first, on ties), or `None` when
/// there is nothing to pick: no logits, or a NaN among them (a broken
/// forward pass must not pass for a token).
pub fn argmax_on_host(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            return None;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// The next token as the device picks it from `logits` (after any soft
/// cap and ban) for a sequence whose last ids are `history`, with the
/// `drawn`th uniform of `config.seed`; `None` when `logits` is empty or
/// holds a NaN.
///
/// The penalties first, for the ids of their window; then the most likely
/// token where the sampler is greedy. Else most likely first (ties by id,
/// so that a seed replays exactly), the top k kept, the softmax at the
/// temperature over them, the smallest prefix whose probability reaches
/// top-p (transformers' order: top-p cuts the distribution the temperature
/// made, where llama.cpp cuts it before the temperature), then the uniform
/// scaled to that prefix's mass picks one, each sum taken in that order: the kernels compute the
/// same values the same way.
pub fn sample_on_host(logits: &[f32], config: &SamplerConfig, drawn: u32, history: &[u32]) -> Option<u32> {
    if logits.is_empty() || logits.iter().any(|l| l.is_nan()) {
        return None;
    }
    let mut penalized;
    let mut logits = logits;
    if !config.penalties.is_off() {
        penalized = logits.to_vec();
        config
            .penalties
            .apply_on_host(&mut penalized, config.penalties.window(history));
        logits = &penalized;
    }
    if config.is_greedy() {
        return argmax_on_host(logits);
    }
    let mut candidates: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
    // No NaN is left, so `partial_cmp` orders every pair (and takes -0 and
    // +0 as one value, as the greedy pick does).
    let order = |a: &(u32, f32), b: &(u32, f32)| {
        let by_value = b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal);
        by_value.then(a.0.cmp(&b.0))
    };
    if (1..candidates.len()).contains(&config.top_k) {
        candidates.select_nth_unstable_by(config.top_k - 1, order);
        candidates.truncate(config.top_k);
    }
    candidates.sort_unstable_by(order);
    let max = candidates[0].1;
    let exps: Vec<f32> = candidates
        .iter()
        .map(|(_, l)| ((l - max) / config.temperature).exp())
        .collect();
    let sum = exps.iter().fold(0.0, |s, e| s + e);
    let probs: Vec<f32> = exps.iter().map(|e| e / sum).collect();
    let keep = nucleus(&probs, config.top_p);
    let total = probs[..keep].iter().fold(0.0, |s, p| s + p);
    let mut r = uniform(config.seed, drawn) * total;
    for (i, p) in probs[..keep].iter().enumerate() {
        if r < *p {
            return Some(candidates[i].0);
        }
        r -= p;
    }
    Some(candidates[keep - 1].0)
}

/// How many of the sorted `probs` the top-p cut keeps (at least one).
fn nucleus(probs: &[f32], top_p: f32) -> usize {
    if top_p >= 1.0 {
        return probs.len();
    }
    let mut mass = 0.0;
    for (i, p) in probs.iter().enumerate() {
        mass += p;
        if mass >= top_p {
            return i + 1;
        }
    }
    probs.len()
}

/// f32 bits as a key whose unsigned order is the values' order.
#[cube]
fn order_key(bits: u32) -> u32 {
    select(
        (bits & 0x8000_0000u32) != 0,
        bits ^ 0xffff_ffffu32,
        bits | 0x8000_0000u32,
    )
}

/// The value whose [`order_key`] is `key`.
#[cube]
pub(crate) fn value_of(key: u32) -> f32 {
    f32::reinterpret(select(
        (key & 0x8000_0000u32) != 0,
        key ^ 0x8000_0000u32,
        key ^ 0xffff_ffffu32,
    ))
}

/// Whether candidate a goes before candidate b: the larger value, the
/// smaller id of equal ones.
#[cube]
fn before(key_a: u32, id_a: u32, key_b: u32, id_b: u32) -> bool {
    key_a > key_b || (key_a == key_b && id_a < id_b)
}

/// Sorts the cube's first `span` candidates in shared memory (a power of
/// two no larger than [`CHUNK`], past its `entries` candidates all empty),
/// first to last by [`before`]: a bitonic sort, whose blocks alternate
/// direction until the last merge. A chunk of few candidates (the last
/// passes') sorts only the span they need.
#[cube]
fn sort_chunk(keys: &mut SharedMemory<u32>, ids: &mut SharedMemory<u32>, entries: u32) {
    let mut span = 2u32;
    while span < entries {
        span *= 2;
    }
    let mut size = 2u32;
    while size <= span {
        let mut stride = size / 2;
        while stride > 0 {
            let mut p = UNIT_POS_X;
            while p < span / 2 {
                // The pair (i, i + stride) with bit `stride` clear in i.
                let i = 2 * stride * (p / stride) + p % stride;
                let j = i + stride;
                let key_i = keys[i as usize];
                let id_i = ids[i as usize];
                let key_j = keys[j as usize];
                let id_j = ids[j as usize];
                let forward = (i & size) == 0;
                let swap = select(
                    forward,
                    before(key_j, id_j, key_i, id_i),
                    before(key_i, id_i, key_j, id_j),
                );
                if swap {
                    keys[i as usize] = key_j;
                    ids[i as usize] = id_j;
                    keys[j as usize] = key_i;
                    ids[j as usize] = id_i;
                }
                p += SORT_UNITS;
            }
            sync_cube();
            stride /= 2;
        }
        size *= 2;
    }
}

/// A pass's end, once every unit has put its candidates in shared memory:
/// the chunk's `entries` candidates sorted, and its first `k` kept at the
/// cube's place in the outputs where `keep` (the cube's row exists).
#[cube]
fn sort_and_keep(
    keys: &mut SharedMemory<u32>,
    ids: &mut SharedMemory<u32>,
    entries: u32,
    keep: bool,
    keys_out: &mut Array<u32>,
    ids_out: &mut Array<u32>,
    k: u32,
) {
    sync_cube();
    sort_chunk(keys, ids, entries);
    if keep {
        let at = cube_index() * k;
        let mut t = UNIT_POS_X;
        while t < k {
            keys_out[(at + t) as usize] = keys[t as usize];
            ids_out[(at + t) as usize] = ids[t as usize];
            t += SORT_UNITS;
        }
    }
}

/// The first pass: cube `row · chunks + chunk` keys its chunk of the row's
/// logits (f32 bits), soft-capped where `softcap`, its `banned` ids (and
/// those outside its mask) as -∞ and a NaN or infinity as [`FLAGGED`],
/// and keeps its first `k`.
#[cube(launch)]
fn top_k_logits(
    logits: &Array<u32>,
    banned: &Array<u32>,
    keys_out: &mut Array<u32>,
    ids_out: &mut Array<u32>,
    rows: u32,
    cols: u32,
    width: u32,
    words: u32,
    chunks: u32,
    k: u32,
    cap: f32,
    neg_inf: f32,
    #[comptime] softcap: bool,
) {
    let cube = cube_index();
    let row = cube / chunks;
    let chunk = cube % chunks;
    let mut keys = SharedMemory::<u32>::new(CHUNK as usize);
    let mut ids = SharedMemory::<u32>::new(CHUNK as usize);
    let mut t = UNIT_POS_X;
    while t < CHUNK {
        let j = chunk * CHUNK + t;
        // Empty unless the row has a candidate here (`EMPTY`, written out:
        // a variable starts from a literal).
        let mut key = 0u32;
        let mut id = 0xffff_ffffu32;
        if row < rows && j < cols {
            id = j;
            // Tested by their bits: WGSL may take floats to be finite.
            let bits = logits[(row * cols + j) as usize];
            key = 0xffff_ffffu32; // FLAGGED
            if (bits & 0x7f80_0000u32) != 0x7f80_0000u32 {
                let v = f32::reinterpret(bits);
                let v = capped_unless_banned(v, j, row, rows, banned, width, words, cap, neg_inf, softcap);
                // -0 and +0 are one value, as the host compares them.
                let v = select(v == 0.0, 0.0, v);
                key = order_key(u32::reinterpret(v));
            }
        }
        keys[t as usize] = key;
        ids[t as usize] = id;
        t += SORT_UNITS;
    }
    let entries = min(CHUNK, cols - min(cols, chunk * CHUNK));
    sort_and_keep(&mut keys, &mut ids, entries, row < rows, keys_out, ids_out, k);
}

/// A later pass: cube `row · chunks + chunk` sorts its chunk of the row's
/// `len` candidates left by the pass before and keeps its first `k`.
#[cube(launch)]
fn top_k_merge(
    keys_in: &Array<u32>,
    ids_in: &Array<u32>,
    keys_out: &mut Array<u32>,
    ids_out: &mut Array<u32>,
    rows: u32,
    len: u32,
    chunks: u32,
    k: u32,
) {
    let cube = cube_index();
    let row = cube / chunks;
    let chunk = cube % chunks;
    let mut keys = SharedMemory::<u32>::new(CHUNK as usize);
    let mut ids = SharedMemory::<u32>::new(CHUNK as usize);
    let mut t = UNIT_POS_X;
    while t < CHUNK {
        let j = chunk * CHUNK + t;
        // Empty unless the row has a candidate here (`EMPTY`, written out:
        // a variable starts from a literal).
        let mut key = 0u32;
        let mut id = 0xffff_ffffu32;
        if row < rows && j < len {
            key = keys_in[(row * len + j) as usize];
            id = ids_in[(row * len + j) as usize];
        }
        keys[t as usize] = key;
        ids[t as usize] = id;
        t += SORT_UNITS;
    }
    let entries = min(CHUNK, len - min(len, chunk * CHUNK));
    sort_and_keep(&mut keys, &mut ids, entries, row < rows, keys_out, ids_out, k);
}

/// The softmax's weight of the candidate with key `key`, before it is
/// divided by the weights' sum.
#[cube]
fn weight(key: u32, max: f32, temperature: f32) -> f32 {
    f32::exp((value_of(key) - max) / temperature)
}

/// The probability of the candidate with key `key`.
#[cube]
fn probability(key: u32, max: f32, temperature: f32, sum: f32) -> f32 {
    weight(key, max, temperature) / sum
}

/// One unit per row: its pick from its `k` sorted candidates as
/// [`sample_on_host`] makes it (the first where its rule is greedy), the
/// first candidate's id with [`NON_FINITE`] where the logits held a NaN or
/// an infinity. A sampling row's count of uniforms drawn moves on by one.
#[cube(launch)]
fn sample_sorted(keys: &Array<u32>, ids: &Array<u32>, rules: &mut Array<u32>, out: &mut Array<u32>, rows: u32, k: u32) {
    let row = ABSOLUTE_POS_X;
    if row < rows {
        let first = row * k;
        let rule = row * RULE_WORDS as u32;
        let top = keys[first as usize];
        let mut pick = ids[first as usize];
        let temperature = f32::reinterpret(rules[(rule + 4) as usize]);
        if top == FLAGGED {
            pick |= NON_FINITE;
        } else if temperature > 0.0 {
            // Its own top-k of the row's k, less any empty candidates.
            let top_k = min(rules[(rule + 3) as usize], k);
            let mut n = 0u32;
            while n < top_k && ids[(first + n) as usize] != EMPTY {
                n += 1;
            }
            let max = value_of(top);
            let mut sum = 0.0f32;
            for i in 0..n {
                sum += weight(keys[(first + i) as usize], max, temperature);
            }
            let top_p = f32::reinterpret(rules[(rule + 5) as usize]);
            let mut keep = n;
            if top_p < 1.0 {
                let mut mass = 0.0f32;
                let mut i = 0u32;
                while i < n && keep == n {
                    mass += probability(keys[(first + i) as usize], max, temperature, sum);
                    if mass >= top_p {
                        keep = i + 1;
                    }
                    i += 1;
                }
            }
            let mut total = 0.0f32;
            for i in 0..keep {
                total += probability(keys[(first + i) as usize], max, temperature, sum);
            }
            let drawn = rules[(rule + 2) as usize];
            rules[(rule + 2) as usize] = drawn + 1;
            let mut r = uniform_at(rules[rule as usize], rules[(rule + 1) as usize], drawn) * total;
            pick = ids[(first + keep - 1) as usize];
            let mut chosen = false;
            for i in 0..keep {
                if !chosen {
                    let p = probability(keys[(first + i) as usize], max, temperature, sum);
                    if r < p {
                        pick = ids[(first + i) as usize];
                        chosen = true;
                    } else {
                        r -= p;
                    }
                }
            }
        }
        out[row as usize] = pick;
    }
}

/// Each row's sampling rule on a device (greedy rows among them), with
/// the count of uniforms it has drawn, which every pick moves on.
#[derive(Clone, Debug)]
pub struct SampleRules {
    handle: cubecl::server::Handle,
    rows: usize,
    /// The largest top-k of a sampling row (1 where all are greedy).
    top_k: usize,
}

impl SampleRules {
    /// `rules[r]`: row `r`'s sampler and the uniforms it has drawn. Fails
    /// where a sampling row's top-k is not one the device samples (see
    /// [`SamplerConfig::fits_device`]).
    pub fn new<R: Runtime>(
        client: &ComputeClient<R>,
        rules: &[(SamplerConfig, u32)],
    ) -> Result<SampleRules, KernelError> {
        let mut words = vec![0u32; (rules.len() * RULE_WORDS).max(1)];
        let mut top_k = 1;
        for (row, (config, drawn)) in rules.iter().enumerate() {
            if !config.fits_device() {
                return Err(KernelError::Launch {
                    op: "sample",
                    problem: format!(
                        "row {row} asks for top-k {}; the device samples a top-k of 1 to {MAX_DEVICE_TOP_K}",
                        config.top_k
                    ),
                });
            }
            let greedy = config.is_greedy();
            if !greedy {
                top_k = top_k.max(config.top_k);
            }
            let temperature = if greedy { 0.0 } else { config.temperature };
            words[row * RULE_WORDS..][..6].copy_from_slice(&[
                config.seed as u32,
                (config.seed >> 32) as u32,
                *drawn,
                config.top_k as u32,
                temperature.to_bits(),
                config.top_p.to_bits(),
            ]);
        }
        Ok(SampleRules {
            handle: crate::profile::upload(client, u32::as_bytes(&words)),
            rows: rules.len(),
            top_k,
        })
    }

    fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds `rows · RULE_WORDS` words (one when empty).
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), (self.rows * RULE_WORDS).max(1)) }
    }
}

/// A pass's candidates on the device: `len` keys and ids a row.
pub(crate) struct Candidates {
    keys: cubecl::server::Handle,
    ids: cubecl::server::Handle,
    len: usize,
    // Held until the passes that use the buffers are queued.
    _leases: [crate::workspace::Lease; 2],
}

impl Candidates {
    fn new<R: Runtime>(client: &ComputeClient<R>, rows: usize, len: usize) -> Candidates {
        let bytes = rows * len * size_of::<u32>();
        let (keys, key_lease) = crate::workspace::take(client, bytes);
        let (ids, id_lease) = crate::workspace::take(client, bytes);
        Candidates {
            keys,
            ids,
            len,
            _leases: [key_lease, id_lease],
        }
    }

    pub(crate) fn args<R: Runtime>(&self, rows: usize) -> (ArrayArg<R>, ArrayArg<R>) {
        let len = (rows * self.len).max(1);
        // SAFETY: each buffer holds `rows · len` words.
        unsafe {
            (
                ArrayArg::from_raw_parts(self.keys.clone(), len),
                ArrayArg::from_raw_parts(self.ids.clone(), len),
            )
        }
    }
}

/// Each row of `logits: [rows, vocab]` sampled as its row of `rules` says
/// (after the soft cap `cap · tanh(l / cap)` where `softcap`, never an id
/// `banned` holds it from), into `out`: one id a row, or [`NON_FINITE`]
/// with the index of the row's first NaN or infinity.
pub fn sample<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &Tensor,
    banned: &Banned,
    softcap: Option<f32>,
    rules: &SampleRules,
    out: &Picked,
) -> Result<(), KernelError> {
    let rows = logits.rows();
    let expected = || format!("[{rows}]");
    check_shape(out.len() == rows, "sample", "out", &[out.len()], expected)?;
    check_shape(rules.rows == rows, "sample", "rules", &[rules.rows], expected)?;
    let k = rules.top_k;
    let kept = top_k(client, logits, banned, softcap, k)?;
    let (keys, ids) = kept.args(rows);
    let units = 64u32;
    crate::profile::launch(client, "sample_sorted", || {
        sample_sorted::launch::<R>(
            client,
            CubeCount::Static((rows as u32).div_ceil(units).max(1), 1, 1),
            CubeDim::new_1d(units),
            keys,
            ids,
            rules.arg(),
            out.arg(),
            rows as u32,
            k as u32,
        )
    });
    Ok(())
}

/// Each row's `k` (1 to [`MAX_DEVICE_TOP_K`]) largest logits of `logits:
/// [rows, vocab]`, in order (soft-capped where `softcap`, `banned` ones as
/// -∞, a NaN or an infinity first as [`FLAGGED`]), as keys and ids.
pub(crate) fn top_k<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &Tensor,
    banned: &Banned,
    softcap: Option<f32>,
    k: usize,
) -> Result<Candidates, KernelError> {
    let (rows, cols) = (logits.rows(), logits.cols());
    banned.check(rows, cols, "top_k")?;
    let chunk = CHUNK as usize;
    let mut chunks = cols.div_ceil(chunk).max(1);
    let mut kept = Candidates::new(client, rows, chunks * k);
    let (keys, ids) = kept.args(rows);
    crate::profile::launch(client, "top_k_logits", || {
        top_k_logits::launch::<R>(
            client,
            cube_grid(rows * chunks),
            CubeDim::new_1d(SORT_UNITS),
            logits.words_arg(),
            banned.arg(),
            keys,
            ids,
            rows as u32,
            cols as u32,
            banned.width() as u32,
            banned.words() as u32,
            chunks as u32,
            k as u32,
            softcap.unwrap_or(1.0),
            // An argument, not a literal: not every shading language can
            // write an infinity.
            f32::NEG_INFINITY,
            softcap.is_some(),
        )
    });
    while chunks > 1 {
        chunks = kept.len.div_ceil(chunk);
        let next = Candidates::new(client, rows, chunks * k);
        let (keys_in, ids_in) = kept.args(rows);
        let (keys, ids) = next.args(rows);
        crate::profile::launch(client, "top_k_merge", || {
            top_k_merge::launch::<R>(
                client,
                cube_grid(rows * chunks),
                CubeDim::new_1d(SORT_UNITS),
                keys_in,
                ids_in,
                keys,
                ids,
                rows as u32,
                kept.len as u32,
                chunks as u32,
                k as u32,
            )
        });
        kept = next;
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The distribution [`sample_on_host`]'s doc states, in f64: the
    /// penalties (llama.cpp's: a repeated token's logit divided by
    /// `repeat` where positive and multiplied where not, then lowered by
    /// `frequency` a time and `presence` once), the top k, the softmax at
    /// the temperature over them, and the smallest prefix whose
    /// probability reaches top-p, renormalized. Also the probability the
    /// prefix ends at, to keep settings away from the cut.
    fn stated_distribution(logits: &[f32], config: &SamplerConfig, window: &[u32]) -> (Vec<f64>, f64) {
        let p = &config.penalties;
        let mut l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        for (id, logit) in l.iter_mut().enumerate() {
            let count = window.iter().filter(|&&w| w as usize == id).count();
            if count > 0 {
                let repeat = f64::from(p.repeat);
                let scaled = if *logit <= 0.0 {
                    *logit * repeat
                } else {
                    *logit / repeat
                };
                *logit = scaled - (count as f64 * f64::from(p.frequency) + f64::from(p.presence));
            }
        }
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
        if config.top_k > 0 {
            order.truncate(config.top_k);
        }
        let max = l[order[0]];
        let exps: Vec<f64> = order
            .iter()
            .map(|&i| ((l[i] - max) / f64::from(config.temperature)).exp())
            .collect();
        let sum: f64 = exps.iter().sum();
        let (mut mass, mut keep) = (0.0, order.len());
        for (n, e) in exps.iter().enumerate() {
            mass += e / sum;
            if mass >= f64::from(config.top_p) {
                keep = n + 1;
                break;
            }
        }
        let kept: f64 = exps[..keep].iter().sum();
        let mut distribution = vec![0.0; l.len()];
        for (n, &i) in order[..keep].iter().enumerate() {
            distribution[i] = exps[n] / kept;
        }
        (distribution, mass)
    }

    /// Pearson's statistic of `counts` against `expected` probabilities,
    /// bins expected fewer than 5 times pooled, as a z-score (Wilson and
    /// Hilferty's cube root of chi-squared over its degrees of freedom).
    fn chi_squared_z(counts: &[u64], expected: &[f64], draws: u64) -> f64 {
        let (mut statistic, mut bins) = (0.0, 0usize);
        let (mut pooled_count, mut pooled_expected) = (0.0, 0.0);
        for (&count, &p) in counts.iter().zip(expected) {
            let e = p * draws as f64;
            if e == 0.0 {
                continue;
            }
            if e < 5.0 {
                pooled_count += count as f64;
                pooled_expected += e;
                continue;
            }
            statistic += (count as f64 - e).powi(2) / e;
            bins += 1;
        }
        if pooled_expected > 0.0 {
            statistic += (pooled_count - pooled_expected).powi(2) / pooled_expected;
            bins += 1;
        }
        let df = (bins - 1) as f64;
        let spread = 2.0 / (9.0 * df);
        ((statistic / df).cbrt() - (1.0 - spread)) / spread.sqrt()
    }

    /// 100,000 draws of the host's sampler (each with the next uniform of
    /// its seed, as a sequence draws them) follow the distribution its doc
    /// states, at temperatures 0.3, 0.8 and 1.5, under top-k 40, top-p 0.9
    /// and both with the penalties: no token outside the kept prefix is
    /// ever drawn, and chi-squared over the kept ones stays under a z of
    /// 4.75 (a chance of about one in a million for a right sampler).
    #[test]
    fn draws_follow_the_stated_distribution() {
        // 64 logits spread over about 8 nats, some negative.
        let mut state = 0x2545_f491_u32;
        let logits: Vec<f32> = (0..64)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / 16_777_216.0 * 8.0 - 3.0
            })
            .collect();
        let window = [3, 3, 7, 12, 12, 12, 40];
        let penalties = Penalties {
            repeat: 1.3,
            frequency: 0.2,
            presence: 0.1,
            last_n: 64,
        };
        let draws = 100_000u32;
        for temperature in [0.3, 0.8, 1.5] {
            for (top_k, top_p, penalties) in [
                (40, 1.0, Penalties::default()),
                (0, 0.9, Penalties::default()),
                (40, 0.9, penalties),
            ] {
                let config = SamplerConfig {
                    temperature,
                    top_k,
                    top_p,
                    seed: 1234,
                    penalties,
                };
                let what = format!("temperature {temperature}, top-k {top_k}, top-p {top_p}, {penalties:?}");
                let (expected, cut_at) = stated_distribution(&logits, &config, &window);
                assert!(
                    top_p >= 1.0 || (cut_at - f64::from(top_p)).abs() > 1e-5,
                    "{what}: at the cut"
                );
                let mut counts = vec![0u64; logits.len()];
                for drawn in 0..draws {
                    counts[sample_on_host(&logits, &config, drawn, &window).unwrap() as usize] += 1;
                }
                for (id, (&count, &p)) in counts.iter().zip(&expected).enumerate() {
                    assert!(
                        p > 0.0 || count == 0,
                        "{what}: token {id} drawn {count} times, outside the kept set"
                    );
                }
                let z = chi_squared_z(&counts, &expected, u64::from(draws));
                assert!(z < 4.75, "{what}: chi-squared z {z:.2}");
            }
        }
    }
}
