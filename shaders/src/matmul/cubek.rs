//! cubek's matmul as cleave's products take it: f32 on its unit-tiled
//! form, 16-bit inputs on its matrix-unit (cmma) forms.

use cubecl::prelude::*;

use crate::{KernelError, Tensor, WeightType};

/// Whether [`half_product`] forms `x · wᵀ` over `(m, n, k)` as its
/// transpose `w · xᵀ`: for many rows by few outputs (a convolution's
/// pixels by its channels, FLUX's last projection). There cubek 0.2 takes
/// its 32-row instruction and stages 512 rows a cube: more than the 256 a
/// tensor-memory copy moves, which CUDA refuses only on its device thread
/// after `launch_ref` has returned `Ok` (so nothing can fall back), and,
/// without those copies, more sums than a warp's registers hold (it
/// spills). The transpose is few rows by many columns, which it tiles 8 by
/// 32 within both limits (the CUDA kernel check holds it to them).
pub(super) fn transposes(m: usize, n: usize) -> bool {
    m >= 4 * n
}

/// `out = x · wᵀ` for 16-bit `x: [m, k]` (packed two to a word) and `w:
/// [n, k]` of type `half`, into f32 `out`, on the matrix units by cubek:
/// with the Hopper tensor-memory copies where the device has them (the
/// fastest measured, docs/BENCHMARKS.md), else double-buffered. `out` is
/// `[m, n]`, or `[n, m]` where the product [`transposes`].
pub(super) fn half_product<R: Runtime>(
    client: &ComputeClient<R>,
    (x, w, half): (&Tensor, &cubecl::server::Handle, WeightType),
    (m, n, k): (usize, usize, usize),
    out: &Tensor,
) -> Result<(), KernelError> {
    use cubek_matmul::definition::{MatmulElems, MatmulGlobalElems};
    use cubek_matmul::launch::{launch_ref, Strategy};
    use cubek_matmul::routines::BlueprintStrategy;
    use cubek_std::InputBinding;

    let ty = match half {
        WeightType::BF16 => half::bf16::as_type_native_unchecked().storage_type(),
        _ => half::f16::as_type_native_unchecked().storage_type(),
    };
    let binding = |handle: &cubecl::server::Handle, shape: [usize; 2], strides: [usize; 2]| TensorBinding::<R> {
        handle: handle.clone().binding(),
        shape: shape.as_slice().into(),
        strides: strides.as_slice().into(),
        runtime: std::marker::PhantomData,
    };
    // The left operand's rows are the output's rows; both operands are
    // read along k, the right one as a column-major `[k, columns]`.
    let ((lhs, rows), (rhs, columns)) = match transposes(m, n) {
        false => ((&x.handle, m), (w, n)),
        true => ((w, n), (&x.handle, m)),
    };
    let tma = !client.properties().features.tma.is_empty();
    let strategies = [
        tma.then(|| Strategy::SpecializedTmaCmma(BlueprintStrategy::default())),
        Some(Strategy::DoubleCyclicCmma(BlueprintStrategy::default())),
    ];
    let mut refusal = String::new();
    for strategy in strategies.into_iter().flatten() {
        let lhs = InputBinding::new(binding(lhs, [rows, k], [k, 1]), ty);
        // A row-major `[columns, k]` is the `[k, columns]` right-hand side
        // in column-major order: the same bytes.
        let rhs = InputBinding::new(binding(rhs, [k, columns], [1, k]), ty);
        let mut types = MatmulElems::from_globals(&MatmulGlobalElems {
            lhs: ty,
            rhs: ty,
            out: f32::as_type_native_unchecked().storage_type(),
        });
        let launched = crate::profile::launch(client, "cubek_cmma", || {
            launch_ref(
                &strategy,
                client,
                lhs,
                rhs,
                binding(&out.handle, [rows, columns], [columns, 1]),
                &mut types,
            )
        });
        match launched {
            Ok(()) => return Ok(()),
            Err(e) => refusal = format!("{e:?}"),
        }
    }
    Err(KernelError::Launch {
        op: "matmul",
        problem: format!("cubek's matrix-unit matmul refused [{m}, {k}] x [{n}, {k}] in {half}: {refusal}"),
    })
}

/// `out = x · wᵀ` for f32 `x: [m, k]`, `w: [n, k]` and `out: [m, n]`, by
/// cubek's unit-tiled matmul (`w` read in place as the column-major `[k,
/// n]` right-hand side).
pub(super) fn product<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
) -> Result<(), KernelError> {
    use cubek_matmul::definition::MatmulElems;
    use cubek_matmul::launch::{launch_ref, Strategy};
    use cubek_matmul::routines::BlueprintStrategy;
    use cubek_std::InputBinding;

    let (m, k, n) = (x.rows(), x.cols(), w.rows());
    let binding = |t: &Tensor, shape: [usize; 2], strides: [usize; 2]| TensorBinding::<R> {
        handle: t.handle.clone().binding(),
        shape: shape.as_slice().into(),
        strides: strides.as_slice().into(),
        runtime: std::marker::PhantomData,
    };
    let f32_type = f32::as_type_native_unchecked();
    let lhs = InputBinding::new(binding(x, [m, k], [k, 1]), f32_type.storage_type());
    let rhs = InputBinding::new(binding(w, [k, n], [1, k]), f32_type.storage_type());
    let mut types = MatmulElems::from_single_dtype(f32_type);
    let strategy = Strategy::SimpleUnit(BlueprintStrategy::default());
    let launched = crate::profile::launch(client, "cubek_matmul", || {
        launch_ref(&strategy, client, lhs, rhs, binding(out, [m, n], [n, 1]), &mut types)
    });
    launched.map_err(|e| KernelError::Launch {
        op: "matmul",
        problem: format!("cubek's matmul refused [{m}, {k}] x [{n}, {k}]: {e:?}"),
    })
}
