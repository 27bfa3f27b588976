//! ggml's tensor types: the ids a GGUF file stores, and the block layout of
//! each type cleave reads.

/// Values per block of the k-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Values per block of the legacy quants (`QK4_0`, `QK8_0`).
pub const QK: usize = 32;

/// The ggml tensor types cleave reads. Every other type is refused by name.
// Spelled as ggml spells them, so that Q4_K reads as the type it is.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl GgmlType {
    /// The type stored under `id`, or, when cleave cannot read it, ggml's
    /// name for it where the id is one ggml defines.
    pub fn from_id(id: u32) -> Result<Self, Option<&'static str>> {
        match id {
            0 => Ok(GgmlType::F32),
            1 => Ok(GgmlType::F16),
            30 => Ok(GgmlType::BF16),
            8 => Ok(GgmlType::Q8_0),
            2 => Ok(GgmlType::Q4_0),
            12 => Ok(GgmlType::Q4_K),
            13 => Ok(GgmlType::Q5_K),
            14 => Ok(GgmlType::Q6_K),
            other => Err(unsupported_name(other)),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
        }
    }

    /// Values in one block: a row's length along `ne[0]` is a multiple of it.
    pub const fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q8_0 | GgmlType::Q4_0 => QK,
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => QK_K,
        }
    }

    /// Bytes of one block (ggml's `block_*` structs, which are packed).
    pub const fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            // d (f16), 32 × i8
            GgmlType::Q8_0 => 2 + QK,
            // d (f16), 32 × 4 bits
            GgmlType::Q4_0 => 2 + QK / 2,
            // d, dmin (f16), 12 bytes of 6-bit scales and mins, 256 × 4 bits
            GgmlType::Q4_K => 2 + 2 + 12 + QK_K / 2,
            // as Q4_K, plus the fifth bit of each value
            GgmlType::Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            // low 4 bits, high 2 bits, 16 × i8 scales, d (f16)
            GgmlType::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }

    /// Bytes of `elements` values, `None` unless they fill whole blocks (or
    /// the count overflows).
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let block_len = self.block_len() as u64;
        if !elements.is_multiple_of(block_len) {
            return None;
        }
        (elements / block_len).checked_mul(self.block_bytes() as u64)
    }
}

/// ggml's name for a type id cleave does not read (ggml.h's `ggml_type`;
/// the gaps are ids ggml retired).
fn unsupported_name(id: u32) -> Option<&'static str> {
    Some(match id {
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
