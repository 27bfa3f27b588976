//! The MLP of a block, dense or a mixture of experts (Mixtral, Qwen3-MoE).
//!
//! A mixture routes each row: the router's logits come back to the host
//! (rows × experts floats), where softmax, top-k and the renormalisation
//! run in f32 as transformers does them; then each expert that some row
//! chose runs over just those rows, and its output, times each row's
//! routing weight, is added into the rows. Experts no row chose do not
//! run, so a decode step of one token runs `top_k` experts. The experts
//! are taken in ascending order, the order in which transformers adds
//! their outputs.

use cleave_nn::{Linear, Placement, Proj, Result};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{add_rows_scaled, embedding, gated_mul, Activation, Tensor};

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
        x: &Tensor,
        activation: Activation,
    ) -> Result<Tensor> {
        let gate = self.gate.forward(placement, d, x)?;
        let up = self.up.forward(placement, d, x)?;
        let gated = gated_mul(placement.client(d), &gate, &up, activation)?;
        self.down.forward(placement, d, &gated)
    }
}

/// A block's MLP, or the experts that take its place.
pub(super) enum Ffn {
    Dense(Mlp),
    Experts(Moe),
}

impl Ffn {
    /// Its output for the rows `x` on device `d`.
    pub fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        x: &Tensor,
        activation: Activation,
    ) -> Result<Tensor> {
        match self {
            Ffn::Dense(mlp) => mlp.forward(placement, d, x, activation),
            Ffn::Experts(moe) => moe.forward(placement, d, x, activation),
        }
    }
}

/// Experts in place of a block's MLP, with their router.
pub(super) struct Moe {
    pub router: Linear,
    pub experts: Vec<Mlp>,
    pub routing: Experts,
}

/// The rows an expert runs over and the weight of its output in each.
#[derive(Debug, Default, PartialEq)]
struct Picks {
    rows: Vec<u32>,
    weights: Vec<f32>,
}

impl Moe {
    pub fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        x: &Tensor,
        activation: Activation,
    ) -> Result<Tensor> {
        let client = placement.client(d);
        let (rows, cols) = (x.rows(), x.cols());
        let flat = x.reshape(&[rows, cols]);
        let logits = self.router.forward(client, x)?.to_vec(client)?;
        let out = Tensor::from_f32(client, &vec![0.0; rows * cols], &[rows, cols]);
        for (expert, picks) in self.experts.iter().zip(route(&logits, self.routing)) {
            if picks.rows.is_empty() {
                continue;
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
            let output = expert.forward(placement, d, &input, activation)?;
            add_rows_scaled(client, &out, &output.reshape(&[n, cols]), &picks.rows, &picks.weights)?;
        }
        Ok(out.reshape(&x.shape))
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
