//! The CUDA code of cleave's kernels, checked without a GPU: a runtime
//! that keeps what `cubecl-cuda` would compile, and the toolkit's NVRTC and
//! ptxas to build it.

pub mod gpu;
pub mod runtime;
pub mod toolkit;
