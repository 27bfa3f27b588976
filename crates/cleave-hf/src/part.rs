//! Parts of a stored tensor that load as tensors of their own: the parts
//! of a fused projection (Phi-3's `qkv_proj` as `q_proj`, `k_proj` and
//! `v_proj`), or one expert's weights out of a stack of every expert's
//! (gpt-oss's `gate_up_proj`, `[experts, in, 2 · out]`, the gate's and the
//! up projection's columns interleaved).

use std::borrow::Cow;
use std::ops::Range;

use cleave_types::WeightType;

/// Which elements of a stored tensor a part is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// Entry `e` of a stored stack `[count, ..]` (one expert's matrix of
    /// `[experts, a, b]`, or its vector of `[experts, a]`); the stored
    /// matrix itself where `None`.
    pub entry: Option<usize>,
    /// The matrix is stored `[in, out]`, transposed from a linear layer's
    /// `[out, in]`: its rows here are the stored columns.
    pub transposed: bool,
    /// The rows it takes, in order.
    pub rows: Rows,
}

/// Rows of a matrix that a part takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Runs of rows, one after another.
    Runs(Vec<Range<usize>>),
    /// Every `step`-th row from `first` on (one of interleaved parts).
    Every { first: usize, step: usize },
}

impl Cut {
    /// Runs of rows of a stored matrix.
    pub fn rows(runs: Vec<Range<usize>>) -> Self {
        Cut {
            entry: None,
            transposed: false,
            rows: Rows::Runs(runs),
        }
    }

    /// The part's shape, cut from a tensor stored with shape `stored`, or
    /// why it does not lie within that tensor.
    pub(crate) fn shape(&self, stored: &[usize]) -> Result<Vec<usize>, String> {
        let matrix = self.matrix(stored)?;
        let rows = self.rows.count(matrix.rows)?;
        Ok(match matrix.vector {
            true => vec![rows],
            false => vec![rows, matrix.cols],
        })
    }

    /// The part's elements out of `bytes`, those of a tensor of
    /// `elements` stored with shape `stored`: borrowed where they are one
    /// run of the stored bytes, else copied out.
    pub(crate) fn bytes<'a>(
        &self,
        stored: &[usize],
        elements: Elements,
        bytes: Cow<'a, [u8]>,
    ) -> Result<Cow<'a, [u8]>, String> {
        let matrix = self.matrix(stored)?;
        // The rows and columns as stored, before any transposition.
        let (stored_rows, stored_cols) = match self.transposed {
            true => (matrix.cols, matrix.rows),
            false => (matrix.rows, matrix.cols),
        };
        let partial = || format!("rows of {stored_cols} {elements} elements are not whole blocks");
        let stored_row = elements.row_bytes(stored_cols).ok_or_else(partial)?;
        let entry_bytes = stored_row * stored_rows;
        let start = self.entry.unwrap_or(0) * entry_bytes;
        let entry = slice(bytes, start..start + entry_bytes);
        let (entry, row_bytes) = match self.transposed {
            false => (entry, stored_row),
            true => {
                let element = elements
                    .row_bytes(1)
                    .ok_or_else(|| format!("{elements} blocks cannot be transposed"))?;
                (
                    Cow::Owned(transpose(&entry, stored_rows, stored_cols, element)),
                    element * stored_rows,
                )
            }
        };
        let runs = self.rows.runs(matrix.rows);
        Ok(match runs.as_slice() {
            [rows] => slice(entry, rows.start * row_bytes..rows.end * row_bytes),
            runs => Cow::Owned(
                runs.iter()
                    .flat_map(|rows| &entry[rows.start * row_bytes..rows.end * row_bytes])
                    .copied()
                    .collect(),
            ),
        })
    }

    /// The matrix the rows are taken from.
    fn matrix(&self, stored: &[usize]) -> Result<Matrix, String> {
        let (rows, cols, vector) = match (self.entry, stored) {
            (None, &[rows, cols]) => (rows, cols, false),
            (Some(e), &[count, ..]) if e >= count => return Err(format!("it has no entry {e}")),
            (Some(_), &[_, rows]) => (rows, 1, true),
            (Some(_), &[_, rows, cols]) => (rows, cols, false),
            _ => return Err("it is not a matrix or a stack of them".into()),
        };
        Ok(match (self.transposed, vector) {
            (true, true) => return Err("a stack of vectors cannot be transposed".into()),
            (true, false) => Matrix {
                rows: cols,
                cols: rows,
                vector,
            },
            (false, _) => Matrix { rows, cols, vector },
        })
    }
}

/// What a stored tensor's elements are: of a weight type, or plain bytes
/// (the published MXFP4 layout's codes and exponents).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Elements {
    Typed(WeightType),
    Bytes,
}

impl Elements {
    fn row_bytes(self, cols: usize) -> Option<usize> {
        match self {
            Elements::Typed(ty) => ty.row_bytes(cols),
            Elements::Bytes => Some(cols),
        }
    }
}

impl std::fmt::Display for Elements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Elements::Typed(ty) => write!(f, "{ty}"),
            Elements::Bytes => f.write_str("U8"),
        }
    }
}

/// Rows of MXFP4 in llama.cpp's blocks (each group of 32 elements its
/// exponent byte, then 16 bytes of 4-bit codes, element `j` in the low
/// nibble of byte `j` and element `j + 16` in its high one: ggml's
/// `block_mxfp4`), from the published gpt-oss layout: `blocks`, 16 bytes a
/// group, element `2j` in the low nibble of byte `j` and `2j + 1` in its
/// high one, and `scales`, one exponent byte a group. Both lay their codes
/// and exponents the same way (FP4 E2M1 codes; exponent + 127), so only the
/// nibbles move.
pub(crate) fn mxfp4_blocks(blocks: &[u8], scales: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(scales.len() * 17);
    for (group, &scale) in blocks.chunks_exact(16).zip(scales) {
        let code = |k: usize| (group[k / 2] >> (4 * (k % 2))) & 0x0f;
        out.push(scale);
        out.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
    }
    out
}

/// A matrix a part's rows are taken from: `[rows, cols]`, or a vector of
/// `rows` (one column).
struct Matrix {
    rows: usize,
    cols: usize,
    vector: bool,
}

impl Rows {
    /// Rows taken of a matrix of `total`, or why they do not lie within.
    fn count(&self, total: usize) -> Result<usize, String> {
        match *self {
            Rows::Runs(ref runs) => match runs.iter().find(|rows| rows.end > total) {
                Some(rows) => Err(format!("rows {rows:?} are past its {total}")),
                None => Ok(runs.iter().map(Range::len).sum()),
            },
            Rows::Every { first, step } if step == 0 || first >= total.min(step) => {
                Err(format!("every {step}-th row from {first} is not a part of its {total}"))
            }
            Rows::Every { first, step } => Ok((total - first).div_ceil(step)),
        }
    }

    /// The rows taken, as runs, of a matrix of `total` (counted already).
    fn runs(&self, total: usize) -> Vec<Range<usize>> {
        match *self {
            Rows::Runs(ref runs) => runs.clone(),
            Rows::Every { first, step } => (first..total).step_by(step).map(|r| r..r + 1).collect(),
        }
    }
}

fn slice(bytes: Cow<'_, [u8]>, range: Range<usize>) -> Cow<'_, [u8]> {
    match bytes {
        Cow::Borrowed(b) => Cow::Borrowed(&b[range]),
        Cow::Owned(b) => Cow::Owned(b[range].to_vec()),
    }
}

/// `[rows, cols]` elements of `element` bytes as `[cols, rows]`.
fn transpose(bytes: &[u8], rows: usize, cols: usize, element: usize) -> Vec<u8> {
    let mut out = vec![0; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let from = (r * cols + c) * element;
            let to = (c * rows + r) * element;
            out[to..to + element].copy_from_slice(&bytes[from..from + element]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
        values.into_iter().flat_map(f32::to_le_bytes).collect()
    }

    #[test]
    fn an_experts_interleaved_columns_load_as_its_rows() {
        // Two experts of [in 2, out 2 · 3]: element (e, i, o) = 100e + 10i + o.
        let stored = [2, 2, 6];
        let values = (0..2).flat_map(|e| (0..2).flat_map(move |i| (0..6).map(move |o| (100 * e + 10 * i + o) as f32)));
        let bytes = f32_bytes(values);
        let up_of_expert_1 = Cut {
            entry: Some(1),
            transposed: true,
            rows: Rows::Every { first: 1, step: 2 },
        };
        assert_eq!(up_of_expert_1.shape(&stored).unwrap(), [3, 2]);
        let got = up_of_expert_1
            .bytes(&stored, Elements::Typed(WeightType::F32), Cow::Borrowed(&bytes))
            .unwrap();
        // Row o of the part is stored column 2o + 1, over both inputs.
        assert_eq!(*got, f32_bytes([101.0, 111.0, 103.0, 113.0, 105.0, 115.0]));

        // Its bias: the odd entries of row 1 of `[experts, 2 · out]`.
        let bias = Cut {
            entry: Some(1),
            transposed: false,
            rows: Rows::Every { first: 1, step: 2 },
        };
        let bias_bytes = f32_bytes((0..12).map(|v| v as f32));
        assert_eq!(bias.shape(&[2, 6]).unwrap(), [3]);
        let got = bias
            .bytes(&[2, 6], Elements::Typed(WeightType::F32), Cow::Borrowed(&bias_bytes))
            .unwrap();
        assert_eq!(*got, f32_bytes([7.0, 9.0, 11.0]));
    }

    #[test]
    fn one_run_of_rows_is_borrowed() {
        let bytes = f32_bytes((0..12).map(|v| v as f32));
        let got = Cut::rows(std::iter::once(1..3).collect())
            .bytes(&[4, 3], Elements::Typed(WeightType::F32), Cow::Borrowed(&bytes))
            .unwrap();
        assert!(matches!(got, Cow::Borrowed(_)));
        assert_eq!(*got, f32_bytes((3..9).map(|v| v as f32)));
    }

    #[test]
    fn mxfp4_codes_move_to_ggml_nibbles() {
        // Group codes 0..32 (mod 16) as the published layout packs them.
        let codes: Vec<u8> = (0..32).map(|k| k % 16).collect();
        let published: Vec<u8> = codes.chunks(2).map(|pair| pair[0] | (pair[1] << 4)).collect();
        let got = mxfp4_blocks(&published, &[130]);
        assert_eq!(got[0], 130);
        for j in 0..16 {
            assert_eq!(got[1 + j], codes[j] | (codes[j + 16] << 4), "byte {j}");
        }
    }

    #[test]
    fn a_cut_past_its_tensor_says_why() {
        let past = |cut: Cut, stored: &[usize]| cut.shape(stored).unwrap_err();
        assert!(past(Cut::rows(std::iter::once(2..5).collect()), &[4, 3]).contains("past"));
        let entry = Cut {
            entry: Some(2),
            ..Cut::rows(std::iter::once(0..1).collect())
        };
        assert!(past(entry, &[2, 4, 3]).contains("no entry 2"));
        let every = Cut {
            rows: Rows::Every { first: 2, step: 2 },
            ..Cut::rows(Vec::new())
        };
        assert!(past(every, &[4, 3]).contains("every 2-th"));
    }
}
