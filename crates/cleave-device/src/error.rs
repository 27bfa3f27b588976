use thiserror::Error;

#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("no device named '{name}'; devices on this machine: {available}")]
    Unknown { name: String, available: String },
    #[error("no compute device found (install a Vulkan, Metal or DX12 driver, or Mesa's lavapipe: apt-get install mesa-vulkan-drivers)")]
    NoneFound,
    #[error("could not open {name}: {reason}")]
    Open { name: String, reason: String },
    #[error("bad device spec '{spec}': {reason}")]
    Spec { spec: String, reason: String },
    #[error(
        "{name} is named twice in one group: logical devices of one CUDA GPU are not supported, since cubecl \
         drives each CUDA device through one client and stream that they would share (and NCCL, which sums \
         tensor split's partials, takes one rank per GPU); name each CUDA device once"
    )]
    CudaNamedTwice { name: String },
    #[error(
        "{what} cannot span runtimes, but {first} and {other} are driven by different ones: give them devices \
         of one runtime (a model's layer split may span runtimes)"
    )]
    MixedRuntimes { what: String, first: String, other: String },
    #[error("{name} is a {runtime} device, but this cleave was built without {runtime} (build it with --features {feature})")]
    NotBuilt {
        name: String,
        runtime: &'static str,
        feature: &'static str,
    },
}
