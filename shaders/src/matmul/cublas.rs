//! cuBLAS's products on CUDA devices: the prefill products of 16-bit
//! inputs at `fast` (f32 accumulation on the tensor cores), which NVIDIA's
//! library forms with the Hopper instructions (`wgmma`) that cubecl 0.10
//! cannot emit, so that cubek's matmul reaches about a third of the
//! tensor cores' speed there (docs/BENCHMARKS.md).
//!
//! A product is enqueued on the stream cubecl runs the device's kernels on
//! (the patched `GpuResource::stream`, vendor/README.md), right after the
//! blocking look-up of its operands: everything launched before it has
//! been issued to that stream by then, and everything after is issued
//! after it, so it is ordered with cubecl's kernels as one of them would
//! be, with no synchronization.
//!
//! Where cuBLAS is not found, or `CLEAVE_CUDA_PRODUCTS=cubek` asks for
//! cubek (to compare the two), cubek forms them as on other devices.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use cubecl::server::Handle;
use cudarc::cublas::{result as blas, sys};
use cudarc::driver::{result as driver, sys as driver_sys};

use crate::{KernelError, Tensor, WeightType};

/// Where the sums of `x · wᵀ` go: rows `row_stride` apart in `out`, from
/// its element `first`; added into what is there (`accumulate`: a block's
/// residual add) or written over it.
#[derive(Clone, Copy)]
pub(super) struct Sums<'a> {
    pub out: &'a Tensor,
    pub first: usize,
    pub row_stride: usize,
    pub accumulate: bool,
}

/// Whether `client`'s products go to cuBLAS: a CUDA device, a cuBLAS
/// library found, and cubek not asked for.
pub(super) fn forms_products<R: Runtime>(client: &ComputeClient<R>) -> bool {
    cuda(client).is_some() && chosen()
}

static CUBLAS_CHOSEN: OnceLock<bool> = OnceLock::new();

/// Whether cuBLAS forms the products of CUDA devices in this process.
pub(super) fn chosen() -> bool {
    *CUBLAS_CHOSEN.get_or_init(cublas_chosen)
}

/// Device bytes cuBLAS keeps on a device it forms products on, outside
/// cleave's buffers: its workspace, in a pool of its own. NVIDIA's size
/// for it on Hopper, the largest they give (4 MiB before Hopper); not
/// measured here.
pub(super) const WORKSPACE_BYTES: u64 = 32 << 20;

/// Why cuBLAS could not form a product, with what a user can do instead.
fn refused(problem: String) -> KernelError {
    KernelError::Launch {
        op: "matmul",
        problem: format!("{problem} (CLEAVE_CUDA_PRODUCTS=cubek forms the products with cubek instead)"),
    }
}

fn cublas_chosen() -> bool {
    let asked = std::env::var("CLEAVE_CUDA_PRODUCTS").unwrap_or_default();
    // SAFETY: only looks for the library on the loader's path.
    asked != "cubek" && unsafe { sys::is_culib_present() }
}

fn cuda<R: Runtime>(client: &ComputeClient<R>) -> Option<&ComputeClient<CudaRuntime>> {
    (client as &dyn Any).downcast_ref::<ComputeClient<CudaRuntime>>()
}

/// `x · wᵀ` for 16-bit `x: [m, k]` (packed two to a word) and `w: [n, k]`
/// of type `half`, into `sums` as f32, by cuBLAS on `client`'s stream.
/// Only where [`forms_products`].
pub(super) fn half_product<R: Runtime>(
    client: &ComputeClient<R>,
    (x, w, half): (&Tensor, &Handle, WeightType),
    (m, n, k): (usize, usize, usize),
    sums: Sums,
) -> Result<(), KernelError> {
    let client = cuda(client).ok_or_else(|| refused("cuBLAS serves CUDA devices only".into()))?;
    let gemm = Gemm::new((m, n, k), sums.row_stride).ok_or_else(|| {
        refused(format!(
            "[{m}, {k}] x [{n}, {k}] (rows {} apart) is past what cuBLAS's 32-bit sizes hold",
            sums.row_stride
        ))
    })?;
    let input_type = match half {
        WeightType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        _ => sys::cudaDataType::CUDA_R_16F,
    };
    // Looking the operands up waits until cubecl has issued all that came
    // before to the stream it names, and keeps them alive meanwhile.
    let lookup = |handle: &Handle| client.get_resource(handle.clone()).map_err(KernelError::from_device);
    let (x, w, out) = (lookup(&x.handle)?, lookup(w)?, lookup(&sums.out.handle)?);
    let stream = out.resource().stream;
    let out_ptr = out.resource().ptr + (sums.first * size_of::<f32>()) as u64;
    let beta = if sums.accumulate { 1.0f32 } else { 0.0 };
    crate::profile::launch(client, "cublas_gemm", || {
        let handles = cublas_handles();
        let mut handles = handles.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: the pointers are live device buffers of the sizes the
        // shapes say (the caller checked them), held by the look-ups until
        // the product is enqueued; later use of them is ordered after it
        // on the same stream. The handle is used under the lock only.
        unsafe {
            let handle = handle_for(&mut handles, stream)?;
            blas::set_stream(handle, stream as sys::cudaStream_t).map_err(|e| refused(format!("cuBLAS: {e:?}")))?;
            blas::gemm_ex(
                handle,
                gemm.op_a,
                gemm.op_b,
                gemm.m,
                gemm.n,
                gemm.k,
                (&1.0f32 as *const f32).cast::<c_void>(),
                w.resource().ptr as *const c_void,
                input_type,
                gemm.lda,
                x.resource().ptr as *const c_void,
                input_type,
                gemm.ldb,
                (&beta as *const f32).cast::<c_void>(),
                out_ptr as *mut c_void,
                sys::cudaDataType::CUDA_R_32F,
                gemm.ldc,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .map_err(|e| refused(format!("cuBLAS refused [{m}, {k}] x [{n}, {k}] in {half}: {e:?}")))
        }
    })
}

/// A cuBLAS handle, made in one CUDA context and used under a lock.
struct CublasHandle(sys::cublasHandle_t);

// SAFETY: a handle may be used from any thread whose current context is
// its own; `handle_for` makes it current, under the lock.
unsafe impl Send for CublasHandle {}

/// The handles, one per CUDA context (device), made as first needed and
/// kept for the process: cuBLAS's own workspace lives with each.
fn cublas_handles() -> &'static Mutex<HashMap<usize, CublasHandle>> {
    static HANDLES: OnceLock<Mutex<HashMap<usize, CublasHandle>>> = OnceLock::new();
    HANDLES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The handle for `stream`'s context, made current on this thread (cubecl
/// runs each device's server on a thread of its own, so this one may have
/// none current).
///
/// # Safety
/// `stream` must be a live CUDA stream.
unsafe fn handle_for(
    handles: &mut HashMap<usize, CublasHandle>,
    stream: driver_sys::CUstream,
) -> Result<sys::cublasHandle_t, KernelError> {
    let mut context = std::ptr::null_mut();
    driver_sys::cuStreamGetCtx(stream, &mut context)
        .result()
        .map_err(|e| refused(format!("finding the CUDA context of cubecl's stream: {e:?}")))?;
    driver::ctx::set_current(context)
        .map_err(|e| refused(format!("making the device's CUDA context current: {e:?}")))?;
    if let Some(handle) = handles.get(&(context as usize)) {
        return Ok(handle.0);
    }
    let handle = blas::create_handle().map_err(|e| refused(format!("starting cuBLAS: {e:?}")))?;
    handles.insert(context as usize, CublasHandle(handle));
    Ok(handle)
}

/// cuBLAS's column-major `C = op(A) · op(B)` arguments that form the
/// row-major `out[m, n] = x[m, k] · w[n, k]ᵀ`, `out`'s rows `row_stride`
/// apart: seen column-major, `out` is `C[n, m]`, `w` is `[k, n]` (so
/// `op(A) = wᵀ`, `[n, k]`) and `x` is `[k, m]` (`op(B) = x`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gemm {
    pub op_a: sys::cublasOperation_t,
    pub op_b: sys::cublasOperation_t,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
}

impl Gemm {
    /// The arguments, or `None` past cuBLAS's 32-bit sizes.
    pub(crate) fn new((m, n, k): (usize, usize, usize), row_stride: usize) -> Option<Gemm> {
        let int = |v: usize| i32::try_from(v).ok();
        Some(Gemm {
            op_a: sys::cublasOperation_t::CUBLAS_OP_T,
            op_b: sys::cublasOperation_t::CUBLAS_OP_N,
            m: int(n)?,
            n: int(m)?,
            k: int(k)?,
            lda: int(k)?,
            ldb: int(k)?,
            ldc: int(row_stride)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BLAS's `C = alpha · op(A) · op(B) + beta · C` over column-major
    /// buffers, as its reference implementation defines it.
    fn blas_gemm(g: &Gemm, a: &[f32], b: &[f32], (alpha, beta): (f32, f32), c: &mut [f32]) {
        let transposed = |op| op == sys::cublasOperation_t::CUBLAS_OP_T;
        let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
        let (lda, ldb, ldc) = (g.lda as usize, g.ldb as usize, g.ldc as usize);
        let a_at = |i: usize, l: usize| match transposed(g.op_a) {
            true => a[l + i * lda],
            false => a[i + l * lda],
        };
        let b_at = |l: usize, j: usize| match transposed(g.op_b) {
            true => b[j + l * ldb],
            false => b[l + j * ldb],
        };
        for j in 0..n {
            for i in 0..m {
                let s: f32 = (0..k).map(|l| a_at(i, l) * b_at(l, j)).sum();
                c[i + j * ldc] = alpha * s + beta * c[i + j * ldc];
            }
        }
    }

    /// The arguments form `x · wᵀ` into row-major rows of a wider output,
    /// written over or added in, with the reference BLAS.
    #[test]
    fn cublas_arguments_form_x_times_w_transposed() {
        let (m, n, k, row_stride, first) = (5, 3, 4, 7, 2);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.91).cos()).collect();
        let before: Vec<f32> = (0..m * row_stride).map(|i| i as f32).collect();
        let gemm = Gemm::new((m, n, k), row_stride).unwrap();
        for accumulate in [false, true] {
            let mut out = before.clone();
            let beta = if accumulate { 1.0 } else { 0.0 };
            blas_gemm(&gemm, &w, &x, (1.0, beta), &mut out[first..]);
            for (at, (&got, &was)) in out.iter().zip(&before).enumerate() {
                let (row, col) = (at / row_stride, at % row_stride);
                let expected = match col.checked_sub(first).filter(|&j| j < n) {
                    Some(j) => {
                        let s: f32 = (0..k).map(|l| x[row * k + l] * w[j * k + l]).sum();
                        if accumulate {
                            was + s
                        } else {
                            s
                        }
                    }
                    None => was,
                };
                assert!(
                    (got - expected).abs() < 1e-5,
                    "{accumulate}: out[{row}][{col}] {got} != {expected}"
                );
            }
        }
    }

    #[test]
    fn sizes_past_32_bits_are_refused() {
        assert!(Gemm::new((1 << 31, 8, 8), 8).is_none());
        assert!(Gemm::new((8, 8, 8), 1 << 31).is_none());
        assert!(Gemm::new((8, 8, 8), 8).is_some());
    }
}
