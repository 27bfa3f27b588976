//! The kernels' tests, built as one binary (`cargo test --release -p
//! cleave-shaders --test suite`, a file's tests picked by its name:
//! `-- weights::`): built alone, each file instantiated every kernel and
//! the runtime again, most of the crate's test build. cuda_kernels.rs
//! stays apart: it is built with the `cuda` feature only.

// `kernel_tests!` comes from here.
#[macro_use]
mod common;

mod kernels;
mod kv;
mod weights;
