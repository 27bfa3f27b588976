//! Activation functions: each formula is written once as a `#[cube]`
//! function, applied in place by [`activate`] or to the gate of a gated
//! MLP by [`silu_mul`] and [`gelu_tanh_mul`] ([`gated_product`]: how
//! the gate meets the up projection); the VAE's group norm fuses SiLU
//! through the same function.

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{KernelError, Tensor};

/// An element-wise activation, chosen when the kernel is compiled.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Activation {
    /// `x · sigmoid(x)` (Llama's MLP, the timestep embedding of diffusion
    /// models, the VAE).
    Silu,
    /// GELU with the exact erf: PyTorch's default GELU, BERT's "gelu".
    Gelu,
    /// CLIP's "quick_gelu": `x · sigmoid(1.702 x)`.
    QuickGelu,
    /// GELU with the tanh approximation: transformers' "gelu_new",
    /// PyTorch's `gelu(approximate="tanh")`.
    GeluTanh,
    /// `1 / (1 + e^-x)`: the gates of Qwen3.5's attention output and
    /// shared expert.
    Sigmoid,
    /// gpt-oss's clamped SwiGLU: the gate clamped above at
    /// [`SWIGLU_LIMIT`] times `sigmoid(SWIGLU_ALPHA · gate)`, and, in a gated
    /// MLP, `clamp(up, ±SWIGLU_LIMIT) + 1` in place of `up`.
    ClampedSwiGlu,
}

/// gpt-oss's `swiglu_limit` (both published sizes).
pub const SWIGLU_LIMIT: f32 = 7.0;
/// gpt-oss's `alpha` of its SwiGLU, fixed in transformers' modeling file.
pub const SWIGLU_ALPHA: f32 = 1.702;

impl Activation {
    /// Every activation, for code that must cover each (a kernel compiled
    /// per activation).
    pub const ALL: [Activation; 6] = [
        Activation::Silu,
        Activation::Gelu,
        Activation::QuickGelu,
        Activation::GeluTanh,
        Activation::Sigmoid,
        Activation::ClampedSwiGlu,
    ];
}

/// `activation(x)`.
#[cube]
pub(crate) fn activation<F: Float>(x: F, #[comptime] act: Activation) -> F {
    match act {
        Activation::Silu => silu_of::<F>(x),
        Activation::Gelu => gelu_of::<F>(x),
        Activation::QuickGelu => quick_gelu_of::<F>(x),
        Activation::GeluTanh => gelu_tanh_of::<F>(x),
        Activation::Sigmoid => F::new(1.0) / (F::new(1.0) + F::exp(-x)),
        Activation::ClampedSwiGlu => {
            let gate = F::min(x, F::new(SWIGLU_LIMIT));
            gate / (F::new(1.0) + F::exp(-gate * F::new(SWIGLU_ALPHA)))
        }
    }
}

/// A gated MLP's `activation(gate) · up`, `up` clamped and shifted by one
/// for gpt-oss's SwiGLU.
#[cube]
pub(crate) fn gated_product<F: Float>(gate: F, up: F, #[comptime] act: Activation) -> F {
    let up = match act {
        Activation::ClampedSwiGlu => F::clamp(up, F::new(-SWIGLU_LIMIT), F::new(SWIGLU_LIMIT)) + F::new(1.0),
        _ => up,
    };
    activation::<F>(gate, act) * up
}

#[cube]
fn silu_of<F: Float>(x: F) -> F {
    x / (F::new(1.0) + F::exp(-x))
}

#[cube]
fn gelu_of<F: Float>(x: F) -> F {
    F::new(0.5) * x * (F::new(1.0) + F::erf(x * F::new(std::f32::consts::FRAC_1_SQRT_2)))
}

#[cube]
fn quick_gelu_of<F: Float>(x: F) -> F {
    x / (F::new(1.0) + F::exp(F::new(-1.702) * x))
}

#[cube]
fn gelu_tanh_of<F: Float>(x: F) -> F {
    let inner = F::new(0.797_884_6) * (x + F::new(0.044715) * x * x * x);
    F::new(0.5) * x * (F::new(1.0) + F::tanh(inner))
}

#[cube(launch)]
fn activate_kernel<F: Float>(x: &mut Array<F>, len: u32, #[comptime] act: Activation) {
    let i = linear_pos();
    if i < len as usize {
        x[i] = activation::<F>(x[i], act);
    }
}

/// `out = activation(gate) · up`.
#[cube(launch)]
fn gated_kernel<F: Float>(gate: &Array<F>, up: &Array<F>, out: &mut Array<F>, len: u32, #[comptime] act: Activation) {
    let i = linear_pos();
    if i < len as usize {
        out[i] = gated_product::<F>(gate[i], up[i], act);
    }
}

/// `activation(gate) · up`, the activation chosen by the caller (a gated
/// MLP whose config names it).
pub fn gated_mul<R: Runtime>(
    client: &ComputeClient<R>,
    gate: &Tensor,
    up: &Tensor,
    activation: Activation,
) -> Result<Tensor, KernelError> {
    gated(client, gate, up, activation, "gated_mul")
}

/// `x = activation(x)` in place.
pub fn activate<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, activation: Activation) -> Result<(), KernelError> {
    let (count, dim) = grid_1d(x.len());
    crate::profile::launch(client, "activate", || {
        activate_kernel::launch::<f32, R>(client, count, dim, x.arg(), x.len() as u32, activation);
    });
    Ok(())
}

fn gated<R: Runtime>(
    client: &ComputeClient<R>,
    gate: &Tensor,
    up: &Tensor,
    activation: Activation,
    op: &'static str,
) -> Result<Tensor, KernelError> {
    check_shape(up.shape == gate.shape, op, "up", &up.shape, || {
        format!("{:?}", gate.shape)
    })?;
    let out = Tensor::empty(client, &gate.shape);
    let (count, dim) = grid_1d(out.len());
    crate::profile::launch(client, "gated", || {
        gated_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            gate.arg(),
            up.arg(),
            out.arg(),
            out.len() as u32,
            activation,
        );
    });
    Ok(out)
}

/// `silu(gate) · up`, the gated activation of Llama's MLP.
pub fn silu_mul<R: Runtime>(client: &ComputeClient<R>, gate: &Tensor, up: &Tensor) -> Result<Tensor, KernelError> {
    gated(client, gate, up, Activation::Silu, "silu_mul")
}

/// `gelu_tanh(gate) · up`, with the tanh approximation of GELU
/// (transformers' "gelu_new"): T5's gated-gelu FFN.
pub fn gelu_tanh_mul<R: Runtime>(client: &ComputeClient<R>, gate: &Tensor, up: &Tensor) -> Result<Tensor, KernelError> {
    gated(client, gate, up, Activation::GeluTanh, "gelu_tanh_mul")
}
