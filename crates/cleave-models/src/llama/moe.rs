//! The MLP of a block, dense or a mixture of experts (Mixtral, Qwen3-MoE,
//! Qwen3.5-MoE with its shared expert, gpt-oss), or both side by side
//! (Gemma 4).
//!
//! A mixture routes each row: the router's logits come back to the host
//! (rows × experts floats), where softmax, top-k and the renormalisation
//! run in f32 as transformers does them; then each expert that some row
//! chose runs over just those rows, and its output, times each row's
//! routing weight, is added into the rows. Experts no row chose do not
//! run, so a decode step of one token runs `top_k` experts. The experts
//! are taken in ascending order, the order in which transformers adds
//! their outputs.
//!
//! In expert split an expert runs on the device that owns it: the rows
//! routed to it are copied there and its output comes back, so a device
//! receives only the rows of its own experts, and the sum is taken at
//! home in the same order as on one device. A device that cannot hold
//! all its experts keeps the most recently used in an [`ExpertCache`].
//! Experts held by devices of another runtime ([`ExpertsElsewhere`]) get
//! their rows, and give their output back, through the host.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use cleave_nn::{HostRows, Input, Linear, ModelError, Part, Placement, Proj, Result, Store, UploadCounters};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{add_assign, add_rows_scaled, embedding, rms_norm, Activation, Tensor};

use super::config::Experts;

/// A gated MLP: `down(act(gate(x)) · up(x))`.
pub(super) struct Mlp {
    pub gate: Proj,
    pub up: Proj,
    pub down: Proj,
}

impl Mlp {
    pub fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        input: Input,
        activation: Activation,
    ) -> Result<Tensor> {
        self.down
            .forward(placement, d, &self.gated(placement, d, input, activation)?)
    }

    /// `act(gate(x)) · up(x)`: the down projection's input.
    fn gated<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        input: Input,
        activation: Activation,
    ) -> Result<Tensor> {
        self.gate.gated(placement, d, input, &self.up, activation)
    }
}

/// A block's MLP, or the experts that take its place, or both side by
/// side.
pub(super) enum Ffn {
    Dense(Mlp),
    Experts(Box<Moe>),
    Beside(Box<BesideMlp>),
}

/// Gemma 4's experts beside its MLP, at the block's home: the MLP over
/// the block's normed input and the experts over the residual stream
/// normed by their own norm, routed by it normed plainly and scaled, each
/// output normed before their sum.
pub(super) struct BesideMlp {
    pub mlp: Mlp,
    pub moe: Moe,
    /// The router's input norm: `router.scale / √hidden` (as one weight).
    pub router_norm: Tensor,
    pub experts_in: Tensor,
    pub mlp_out: Tensor,
    pub experts_out: Tensor,
    pub eps: f32,
}

impl BesideMlp {
    fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        input: Input,
        (activation, fetch): (Activation, &ExpertFetch),
    ) -> Result<Tensor> {
        let client = placement.client(d);
        let mlp = self.mlp.forward(placement, d, input, activation)?;
        let out = rms_norm(client, &mlp, &self.mlp_out, self.eps)?;
        let residual = input.x;
        let routed_by = rms_norm(client, residual, &self.router_norm, self.eps)?;
        let experts_in = rms_norm(client, residual, &self.experts_in, self.eps)?;
        let experts = self
            .moe
            .forward(placement, d, (&experts_in, &routed_by), activation, fetch)?;
        add_assign(client, &out, &rms_norm(client, &experts, &self.experts_out, self.eps)?)?;
        Ok(out)
    }
}

impl Ffn {
    /// Its output for the rows `input` on device `d`, stored as `store`
    /// says (a dense MLP adds as its down projection stores; experts'
    /// outputs are summed first); experts a device's cache lacks come from
    /// `fetch`.
    pub fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        input: Input,
        (activation, fetch): (Activation, &ExpertFetch),
        store: Store,
    ) -> Result<Option<Tensor>> {
        match self {
            Ffn::Dense(mlp) => {
                let gated = mlp.gated(placement, d, input, activation)?;
                store.project(&mlp.down, placement, d, &gated)
            }
            Ffn::Experts(moe) => {
                let x = input.values(placement.client(d))?;
                let out = moe.forward(placement, d, (&x, &x), activation, fetch)?;
                store.put(placement, d, out)
            }
            Ffn::Beside(beside) => {
                let out = beside.forward(placement, d, input, (activation, fetch))?;
                store.put(placement, d, out)
            }
        }
    }
}

/// Experts in place of a block's MLP, with their router.
pub(super) struct Moe {
    pub router: Linear,
    pub experts: ExpertWeights,
    pub routing: Experts,
    pub shared: Option<SharedExpert>,
    /// Each expert's factor of its routing weights (Gemma 4's
    /// `per_expert_scale`).
    pub expert_scales: Option<Vec<f32>>,
}

/// An expert every row runs through beside its routed ones, on the
/// block's home device, its output weighed by `sigmoid(gate(x))`.
pub(super) struct SharedExpert {
    pub mlp: Mlp,
    /// `[1, hidden]`.
    pub gate: Linear,
}

/// Where a block's experts are.
pub(super) enum ExpertWeights {
    /// Every expert beside its block, on its home device (layer and row
    /// split).
    Beside(Vec<Mlp>),
    /// Expert split: each device's experts, in its cache.
    Placed(Vec<ExpertCache>),
}

/// How block `layer` loads an expert its device's cache lacks
/// (`load(expert, device)`), where hits and misses are counted, and the
/// experts held on other runtimes.
pub(super) struct ExpertFetch<'a> {
    pub layer: usize,
    pub load: &'a dyn Fn(usize, usize) -> Result<Mlp>,
    pub counters: &'a UploadCounters,
    pub elsewhere: &'a [Box<dyn ExpertsElsewhere>],
}

/// Experts of every block held by devices of another runtime than the
/// model's main device (expert split across runtimes).
pub(crate) trait ExpertsElsewhere: Part {
    /// Whether it holds expert `expert` (of every block).
    fn holds(&self, expert: usize) -> bool;

    /// Expert `expert` of block `layer` over `rows`, run where it is held.
    fn forward(&self, layer: usize, expert: usize, rows: HostRows, activation: Activation) -> Result<HostRows>;
}

/// The experts of one block that one device owns, at most `capacity` of
/// them resident: a routed expert that is not is uploaded before it runs,
/// in place of the least recently used.
pub(super) struct ExpertCache {
    pub device: usize,
    pub owned: Range<usize>,
    capacity: usize,
    /// Resident experts, the least recently used first.
    resident: Mutex<Vec<(usize, Arc<Mlp>)>>,
}

impl ExpertCache {
    /// A cache holding `resident` (the first experts it owns) and room for
    /// no more than those.
    pub fn new(device: usize, owned: Range<usize>, resident: Vec<(usize, Mlp)>) -> Self {
        ExpertCache {
            device,
            owned,
            capacity: resident.len(),
            resident: Mutex::new(resident.into_iter().map(|(e, mlp)| (e, Arc::new(mlp))).collect()),
        }
    }

    /// Expert `expert`'s weights on this cache's device, uploaded now if
    /// they are not resident.
    pub(super) fn get(&self, expert: usize, fetch: &ExpertFetch) -> Result<Arc<Mlp>> {
        let mut resident = self
            .resident
            .lock()
            .map_err(|_| ModelError::Device("an expert cache was poisoned by a failed pass".into()))?;
        if let Some(at) = resident.iter().position(|(e, _)| *e == expert) {
            let entry = resident.remove(at);
            let mlp = entry.1.clone();
            resident.push(entry);
            fetch.counters.expert_hit();
            return Ok(mlp);
        }
        fetch.counters.expert_miss();
        // Evicted first, so that the upload reuses its memory.
        if resident.len() >= self.capacity && !resident.is_empty() {
            resident.remove(0);
        }
        let mlp = Arc::new((fetch.load)(expert, self.device)?);
        resident.push((expert, mlp.clone()));
        Ok(mlp)
    }
}

/// The rows an expert runs over and the weight of its output in each.
#[derive(Debug, Default, PartialEq)]
struct Picks {
    rows: Vec<u32>,
    weights: Vec<f32>,
}

impl Moe {
    /// The experts' output for the rows `x`, each routed by its row of
    /// `routed_by` (`x` itself but in Gemma 4).
    pub fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        (x, routed_by): (&Tensor, &Tensor),
        activation: Activation,
        fetch: &ExpertFetch,
    ) -> Result<Tensor> {
        let client = placement.client(d);
        let (rows, cols) = (x.rows(), x.cols());
        let flat = x.reshape(&[rows, cols]);
        let logits = self.router.forward(client, routed_by)?.to_vec(client)?;
        let out = Tensor::from_f32(client, &vec![0.0; rows * cols], &[rows, cols]);
        for (expert, mut picks) in route(&logits, self.routing).into_iter().enumerate() {
            if picks.rows.is_empty() {
                continue;
            }
            if let Some(scale) = self.expert_scales.as_ref().map(|s| s[expert]) {
                picks.weights.iter_mut().for_each(|w| *w *= scale);
            }
            let n = picks.rows.len();
            let input = Tensor::empty(client, &[n, cols]);
            embedding(client, &flat, 0, &picks.rows, &input)?;
            // Rows of a decode step of several sequences stay `[n, 1,
            // cols]`, so that each is computed exactly as alone.
            let input = if x.shape.len() == 3 {
                input.reshape(&[n, 1, cols])
            } else {
                input
            };
            let output = self.run_expert(placement, d, expert, input, activation, fetch)?;
            add_rows_scaled(client, &out, &output.reshape(&[n, cols]), &picks.rows, &picks.weights)?;
        }
        if let Some(shared) = &self.shared {
            // Each row's weight in f32 on the host, as the routed ones'.
            let gates = shared.gate.forward(client, x)?.to_vec(client)?;
            let weights: Vec<f32> = gates.iter().map(|g| 1.0 / (1.0 + (-g).exp())).collect();
            let output = shared.mlp.forward(placement, d, Input::plain(x), activation)?;
            let every_row: Vec<u32> = (0..rows as u32).collect();
            add_rows_scaled(client, &out, &output.reshape(&[rows, cols]), &every_row, &weights)?;
        }
        Ok(out.reshape(&x.shape))
    }

    /// Expert `expert` over `input` (on device `d`), run where it is held;
    /// its output on `d`.
    fn run_expert<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        expert: usize,
        input: Tensor,
        activation: Activation,
        fetch: &ExpertFetch,
    ) -> Result<Tensor> {
        let caches = match &self.experts {
            ExpertWeights::Beside(experts) => {
                return experts[expert].forward(placement, d, Input::plain(&input), activation);
            }
            ExpertWeights::Placed(caches) => caches,
        };
        if let Some(cache) = caches.iter().find(|c| c.owned.contains(&expert)) {
            let mlp = cache.get(expert, fetch)?;
            let input = placement.copy_to(&input, d, cache.device);
            let output = mlp.forward(placement, cache.device, Input::plain(&input), activation)?;
            return Ok(placement.copy_to(&output, cache.device, d));
        }
        let part = fetch
            .elsewhere
            .iter()
            .find(|part| part.holds(expert))
            .ok_or_else(|| ModelError::Device(format!("the expert-split plan gives expert {expert} no device")))?;
        let client = placement.client(d);
        let rows = HostRows::read(client, &input)?;
        Ok(part.forward(fetch.layer, expert, rows, activation)?.upload(client))
    }
}

/// Each expert's rows and weights from the router's logits (`[rows,
/// experts]`): softmax in f32, the `top_k` largest (the lower expert
/// first on a tie), divided by their sum where `renormalize`.
fn route(logits: &[f32], routing: Experts) -> Vec<Picks> {
    let mut picks: Vec<Picks> = (0..routing.count).map(|_| Picks::default()).collect();
    for (row, logits) in logits.chunks(routing.count).enumerate() {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let sum: f32 = exp.iter().sum();
        let probs: Vec<f32> = exp.iter().map(|e| e / sum).collect();
        let mut order: Vec<usize> = (0..routing.count).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let top = &order[..routing.top_k];
        let total: f32 = top.iter().map(|&e| probs[e]).sum();
        for &e in top {
            let weight = if routing.renormalize {
                probs[e] / total
            } else {
                probs[e]
            };
            picks[e].rows.push(row as u32);
            picks[e].weights.push(weight);
        }
    }
    picks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_each_row_to_its_top_experts() {
        let routing = Experts {
            count: 4,
            width: 8,
            top_k: 2,
            renormalize: false,
        };
        // Row 0 prefers experts 2 then 0; row 1 experts 1 then 2.
        let logits = [1.0, -1.0, 2.0, 0.0, 0.0, 3.0, 1.0, -2.0];
        let picks = route(&logits, routing);
        let softmax = |row: &[f32]| {
            let sum: f32 = row.iter().map(|v| v.exp()).sum();
            row.iter().map(|v| v.exp() / sum).collect::<Vec<f32>>()
        };
        let (p0, p1) = (softmax(&logits[..4]), softmax(&logits[4..]));
        assert_eq!(picks[0].rows, [0]);
        assert_eq!(picks[1].rows, [1]);
        assert_eq!(picks[2].rows, [0, 1]);
        assert!(picks[3].rows.is_empty());
        assert!((picks[2].weights[0] - p0[2]).abs() < 1e-6);
        assert!((picks[2].weights[1] - p1[2]).abs() < 1e-6);

        let renormalized = route(
            &logits,
            Experts {
                renormalize: true,
                ..routing
            },
        );
        let w = &renormalized[2].weights;
        assert!((w[0] - p0[2] / (p0[2] + p0[0])).abs() < 1e-6);
        assert!((renormalized[0].weights[0] + w[0] - 1.0).abs() < 1e-6);
    }
}
