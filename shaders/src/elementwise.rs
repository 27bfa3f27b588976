//! Element-wise arithmetic (residuals, biases, scaled updates), row and
//! column copies, and the embedding gather.

use std::ops::Range;

use cubecl::prelude::*;

use crate::error::check_shape;
use crate::grid::{grid_1d, linear_pos};
use crate::{KernelError, Tensor};

#[cube(launch)]
fn add_assign_kernel<F: Float>(a: &mut Array<F>, b: &Array<F>, len: u32) {
    let i = linear_pos();
    if i < len as usize {
        a[i] += b[i];
    }
}

#[cube(launch)]
fn add_scaled_kernel<F: Float>(a: &mut Array<F>, b: &Array<F>, scale: f32, len: u32) {
    let i = linear_pos();
    if i < len as usize {
        a[i] += b[i] * F::cast_from(scale);
    }
}

#[cube(launch)]
fn scale_shift_kernel<F: Float>(x: &mut Array<F>, scale: f32, shift: f32, len: u32) {
    let i = linear_pos();
    if i < len as usize {
        x[i] = x[i] * F::cast_from(scale) + F::cast_from(shift);
    }
}

#[cube(launch)]
fn add_rows_scaled_kernel<F: Float>(
    dst: &mut Array<F>,
    src: &Array<F>,
    rows: &Array<u32>,
    weights: &Array<F>,
    cols: u32,
    len: u32,
) {
    let i = linear_pos();
    if i < len as usize {
        let r = (i as u32 / cols) as usize;
        let to = rows[r];
        let at = (to * cols + i as u32 % cols) as usize;
        dst[at] += src[i] * weights[r];
    }
}

#[cube(launch)]
fn add_bias_kernel<F: Float>(x: &mut Array<F>, bias: &Array<F>, len: u32, cols: u32) {
    let i = linear_pos();
    if i < len as usize {
        x[i] += bias[(i as u32 % cols) as usize];
    }
}

#[cube(launch)]
fn copy_kernel<F: Float>(src: &Array<F>, dst: &mut Array<F>, src_offset: u32, dst_offset: u32, len: u32) {
    let i = linear_pos();
    if i < len as usize {
        dst[dst_offset as usize + i] = src[src_offset as usize + i];
    }
}

#[cube(launch)]
fn copy_columns_kernel<F: Float>(
    src: &Array<F>,
    dst: &mut Array<F>,
    cols: u32,
    src_cols: u32,
    src_offset: u32,
    dst_cols: u32,
    dst_offset: u32,
    len: u32,
) {
    let i = linear_pos();
    if i < len as usize {
        let row = i as u32 / cols;
        let col = i as u32 % cols;
        dst[(row * dst_cols + dst_offset + col) as usize] = src[(row * src_cols + src_offset + col) as usize];
    }
}

#[cube(launch)]
fn embedding_kernel<F: Float>(
    table: &Array<F>,
    ids: &Array<u32>,
    out: &mut Array<F>,
    first_row: u32,
    table_rows: u32,
    cols: u32,
    len: u32,
) {
    let i = linear_pos();
    if i < len as usize {
        let col = i as u32 % cols;
        let id = ids[(i as u32 / cols) as usize];
        // A table stored in row chunks fills only the rows it holds.
        if id >= first_row && id < first_row + table_rows {
            out[i] = table[((id - first_row) * cols + col) as usize];
        }
    }
}

/// `a += b`, element-wise (the residual connection).
pub fn add_assign<R: Runtime>(client: &ComputeClient<R>, a: &Tensor, b: &Tensor) -> Result<(), KernelError> {
    check_shape(b.shape == a.shape, "add", "b", &b.shape, || format!("{:?}", a.shape))?;
    let (count, dim) = grid_1d(a.len());
    crate::profile::launch(client, "add_assign", || {
        add_assign_kernel::launch::<f32, R>(client, count, dim, a.arg(), b.arg(), a.len() as u32);
    });
    Ok(())
}

/// `a += scale · b`, element-wise (a low-rank update merged or applied).
pub fn add_scaled<R: Runtime>(
    client: &ComputeClient<R>,
    a: &Tensor,
    b: &Tensor,
    scale: f32,
) -> Result<(), KernelError> {
    check_shape(b.shape == a.shape, "add_scaled", "b", &b.shape, || {
        format!("{:?}", a.shape)
    })?;
    let (count, dim) = grid_1d(a.len());
    crate::profile::launch(client, "add_scaled", || {
        add_scaled_kernel::launch::<f32, R>(client, count, dim, a.arg(), b.arg(), scale, a.len() as u32);
    });
    Ok(())
}

/// `x = x · scale + shift`, element-wise, in place (Gemma's embeddings
/// scaled by √hidden; its norm weights used as `1 + w`).
pub fn scale_shift<R: Runtime>(
    client: &ComputeClient<R>,
    x: &Tensor,
    scale: f32,
    shift: f32,
) -> Result<(), KernelError> {
    let (count, dim) = grid_1d(x.len());
    crate::profile::launch(client, "scale_shift", || {
        scale_shift_kernel::launch::<f32, R>(client, count, dim, x.arg(), scale, shift, x.len() as u32);
    });
    Ok(())
}

/// `dst[rows[i]] += weights[i] · src[i]` for each row `i` of `src`: an
/// expert's output added into the rows of the tokens routed to it. The
/// rows must differ (each is written by one unit).
pub fn add_rows_scaled<R: Runtime>(
    client: &ComputeClient<R>,
    dst: &Tensor,
    src: &Tensor,
    rows: &[u32],
    weights: &[f32],
) -> Result<(), KernelError> {
    let cols = src.cols();
    check_shape(
        rows.len() == src.rows() && weights.len() == src.rows(),
        "add_rows_scaled",
        "rows / weights",
        &[rows.len(), weights.len()],
        || format!("one each per source row ({})", src.rows()),
    )?;
    let mut sorted = rows.to_vec();
    sorted.sort_unstable();
    check_shape(
        dst.cols() == cols
            && sorted.windows(2).all(|w| w[0] != w[1])
            && sorted.last().is_none_or(|&r| (r as usize) < dst.rows()),
        "add_rows_scaled",
        "dst",
        &dst.shape,
        || format!("[> each row named, {cols}], and no row named twice"),
    )?;
    if rows.is_empty() {
        return Ok(());
    }
    let rows = crate::profile::upload(client, u32::as_bytes(rows));
    let weights = crate::profile::upload(client, f32::as_bytes(weights));
    let (count, dim) = grid_1d(src.len());
    crate::profile::launch(client, "add_rows_scaled", || {
        add_rows_scaled_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            dst.arg(),
            src.arg(),
            // SAFETY: both buffers were just created with one entry per row of `src`.
            unsafe { ArrayArg::from_raw_parts(rows, src.rows()) },
            unsafe { ArrayArg::from_raw_parts(weights, src.rows()) },
            cols as u32,
            src.len() as u32,
        );
    });
    Ok(())
}

/// `x[r, c] += bias[c]` for every row `r`.
pub fn add_bias<R: Runtime>(client: &ComputeClient<R>, x: &Tensor, bias: &Tensor) -> Result<(), KernelError> {
    let cols = x.cols();
    check_shape(bias.shape == [cols], "add_bias", "bias", &bias.shape, || {
        format!("[{cols}]")
    })?;
    let (count, dim) = grid_1d(x.len());
    crate::profile::launch(client, "add_bias", || {
        add_bias_kernel::launch::<f32, R>(client, count, dim, x.arg(), bias.arg(), x.len() as u32, cols as u32);
    });
    Ok(())
}

/// Copies `rows` rows of `src`, starting at row `src_row`, into `dst` from
/// row `dst_row` on. Both are seen as matrices with the same row width.
pub fn copy_rows<R: Runtime>(
    client: &ComputeClient<R>,
    src: &Tensor,
    src_row: usize,
    dst: &Tensor,
    dst_row: usize,
    rows: usize,
) -> Result<(), KernelError> {
    let cols = src.cols();
    check_shape(
        dst.cols() == cols && dst_row + rows <= dst.rows(),
        "copy_rows",
        "dst",
        &dst.shape,
        || format!("[>= {}, {cols}]", dst_row + rows),
    )?;
    check_shape(src_row + rows <= src.rows(), "copy_rows", "src", &src.shape, || {
        format!("[>= {}, {cols}]", src_row + rows)
    })?;
    let len = rows * cols;
    let (count, dim) = grid_1d(len);
    crate::profile::launch(client, "copy", || {
        copy_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            src.arg(),
            dst.arg(),
            (src_row * cols) as u32,
            (dst_row * cols) as u32,
            len as u32,
        );
    });
    Ok(())
}

/// Writes `src: [rows, n]` into columns `offset..offset + n` of `dst:
/// [rows, m]`: how a row-split weight's slices assemble one output.
pub fn copy_columns<R: Runtime>(
    client: &ComputeClient<R>,
    src: &Tensor,
    dst: &Tensor,
    offset: usize,
) -> Result<(), KernelError> {
    copy_column_range(client, (src, 0), (dst, offset), src.cols(), "copy_columns")
}

/// Columns `columns` of `src: [.., m]`, in a tensor of their own of
/// `src`'s shape but the last dimension: one layer's share of rows that
/// hold every layer's values side by side.
pub fn columns_of<R: Runtime>(
    client: &ComputeClient<R>,
    src: &Tensor,
    columns: Range<usize>,
) -> Result<Tensor, KernelError> {
    let mut shape = src.shape.clone();
    check_shape(columns.end <= src.cols(), "columns_of", "src", &src.shape, || {
        format!("[.., >= {}]", columns.end)
    })?;
    if let Some(last) = shape.last_mut() {
        *last = columns.len();
    }
    let out = Tensor::empty(client, &shape);
    copy_column_range(client, (src, columns.start), (&out, 0), columns.len(), "columns_of")?;
    Ok(out)
}

/// Copies `cols` columns of each row of `src` from column `src_offset`
/// into `dst` from column `dst_offset`.
fn copy_column_range<R: Runtime>(
    client: &ComputeClient<R>,
    (src, src_offset): (&Tensor, usize),
    (dst, dst_offset): (&Tensor, usize),
    cols: usize,
    op: &'static str,
) -> Result<(), KernelError> {
    check_shape(
        dst.rows() == src.rows() && dst.cols() >= dst_offset + cols,
        op,
        "dst",
        &dst.shape,
        || format!("[{}, >= {}]", src.rows(), dst_offset + cols),
    )?;
    let len = src.rows() * cols;
    if len == 0 {
        return Ok(());
    }
    let (count, dim) = grid_1d(len);
    crate::profile::launch(client, op, || {
        copy_columns_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            src.arg(),
            dst.arg(),
            cols as u32,
            src.cols() as u32,
            src_offset as u32,
            dst.cols() as u32,
            dst_offset as u32,
            len as u32,
        );
    });
    Ok(())
}

/// Gathers rows of an embedding table into `out: [ids.len(), cols]`.
///
/// `table` holds rows `first_row..first_row + table.rows()` of the full
/// table; ids outside that range are left for the other chunks to fill.
pub fn embedding<R: Runtime>(
    client: &ComputeClient<R>,
    table: &Tensor,
    first_row: usize,
    ids: &[u32],
    out: &Tensor,
) -> Result<(), KernelError> {
    let cols = table.cols();
    check_shape(out.shape == [ids.len(), cols], "embedding", "out", &out.shape, || {
        format!("[{}, {cols}]", ids.len())
    })?;
    let ids_handle = crate::profile::upload(client, u32::as_bytes(ids));
    let len = out.len();
    let (count, dim) = grid_1d(len);
    crate::profile::launch(client, "embedding", || {
        embedding_kernel::launch::<f32, R>(
            client,
            count,
            dim,
            table.arg(),
            // SAFETY: the buffer was just created from `ids`.
            unsafe { ArrayArg::from_raw_parts(ids_handle, ids.len()) },
            out.arg(),
            first_row as u32,
            table.rows() as u32,
            cols as u32,
            len as u32,
        );
    });
    Ok(())
}
