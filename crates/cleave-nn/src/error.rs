use cleave_plan::format_bytes;
use thiserror::Error;

/// Everything that can go wrong loading a model onto devices or running it:
/// its files (`Read`), its placement, the kernels, or the input.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Read(#[from] cleave_hf::ReadError),
    #[error("the prompt is {tokens} tokens, but the context holds {context} (raise -c/--ctx-size, at most {max})")]
    PromptTooLong { tokens: usize, context: usize, max: usize },
    #[error("the prompt is empty: nothing to run")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenId { id: u32, vocab: usize },
    #[error("the latents hold {got} values, expected {channels} channels of {height}x{width} ({expected}), and neither side may be 0")]
    LatentShape {
        got: usize,
        channels: usize,
        height: usize,
        width: usize,
        expected: usize,
    },
    #[error(
        "out of memory on {device}: {what} needs {} more, {} of its {} cap already in use",
        format_bytes(*.needed), format_bytes(*.in_use), format_bytes(*.cap)
    )]
    OutOfMemory {
        device: String,
        what: String,
        needed: u64,
        in_use: u64,
        cap: u64,
    },
    #[error("{what} holds a non-finite value (NaN or infinity) at element {index}{hint}")]
    NonFinite {
        what: String,
        index: usize,
        hint: &'static str,
    },
    #[error("the logits are empty or hold NaN: no token can be picked")]
    NoToken,
    /// A grammar's mask could not be computed, or the sequence left it.
    #[error("constrained decoding failed: {0}")]
    Constraint(String),
    /// The caller asked to stop (a client that went away).
    #[error("cancelled")]
    Cancelled,
    #[error("invalid model input: {0}")]
    Input(String),
    #[error("device error: {0}")]
    Device(String),
    #[error(transparent)]
    Plan(#[from] cleave_plan::PlanError),
    #[error(transparent)]
    Kernel(#[from] cleave_shaders::KernelError),
}

impl ModelError {
    /// Whether the device or a kernel failed, rather than the input: what
    /// a server takes as a sign that the group cannot serve anymore.
    pub fn is_device_failure(&self) -> bool {
        matches!(self, ModelError::Device(_) | ModelError::Kernel(_))
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;
