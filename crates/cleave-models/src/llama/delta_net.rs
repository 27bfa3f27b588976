//! A Gated DeltaNet layer (Qwen3.5's linear attention), as transformers'
//! `Qwen3_5GatedDeltaNet` computes it: q, k and v from one projection
//! through the causal convolution, the gated delta rule over each value
//! head's recurrent state, each head's output RMS-normed and gated by
//! `silu(z)`, then the output projection. Its per-sequence state is the
//! layer's [`RecurrentState`], on the block's home device.

use cleave_nn::{Input, PassRows, Placement, Proj, RecurrentState, Result, Store};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{causal_conv, gated_delta_rule, rms_norm, silu_mul, DeltaHeads, StateRoutes, Tensor};

/// A Gated DeltaNet layer's weights, whole on one device.
pub(super) struct GatedDeltaNet {
    pub heads: DeltaHeads,
    /// q, k and v side by side.
    pub qkv: Proj,
    pub z: Proj,
    pub b: Proj,
    pub a: Proj,
    pub out: Proj,
    /// `[channels, taps]`.
    pub conv: Tensor,
    pub a_log: Tensor,
    pub dt_bias: Tensor,
    /// `[value_dim]`.
    pub norm: Tensor,
}

impl GatedDeltaNet {
    /// Its output for the rows `input` on device `d`, each sequence's
    /// state in `state` carried on by the pass's `rows`; stored as `store`
    /// says.
    pub fn forward<R: Runtime>(
        &self,
        placement: &Placement<R>,
        d: usize,
        input: Input,
        (state, rows): (&RecurrentState, &PassRows),
        eps: f32,
        store: Store,
    ) -> Result<Option<Tensor>> {
        let client = placement.client(d);
        let x = input.values(client)?;
        let project = |proj: &Proj| proj.forward(placement, d, &x);
        let pass = state.pass(client, rows)?;
        let routes = StateRoutes::new(client, &pass.routes)?;
        let n = x.rows();
        let flat = |t: Tensor| t.reshape(&[n, t.cols()]);
        let qkv = causal_conv(client, &flat(project(&self.qkv)?), &self.conv, &pass.windows, &routes)?;
        let (a, b) = (flat(project(&self.a)?), flat(project(&self.b)?));
        let core = gated_delta_rule(
            client,
            self.heads,
            &qkv,
            (&a, &b),
            (&self.a_log, &self.dt_bias),
            &pass.states,
            &routes,
        )?;
        let DeltaHeads {
            value_heads, value_dim, ..
        } = self.heads;
        let normed = rms_norm(client, &core.reshape(&[n * value_heads, value_dim]), &self.norm, eps)?;
        let z = project(&self.z)?;
        let gated = silu_mul(client, &z, &normed.reshape(&z.shape))?;
        store.project(&self.out, placement, d, &gated)
    }
}
