//! The weight types cleave reads, in one table: the three float types and
//! llama.cpp's block layouts (ggml-common.h), each with the values and
//! bytes of one block, the id GGUF files store, the name safetensors
//! files give it, and where a block keeps its f16 scales. ggml keeps the
//! same facts in its `type_traits`; here the file readers and the kernels
//! all name a type by [`WeightType`] and read its facts from [`TYPES`].

/// Values per block of the k-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Values per block of the legacy quants (`QK4_0`, `QK8_0`).
pub const QK: usize = 32;

/// How a weight's values are stored. Every other type is refused by name
/// where a file holds it.
// Spelled as ggml spells them, so that Q4_K reads as the type it is.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    /// d (f16), 32 × i8; y = q·d.
    Q8_0,
    /// d (f16), 32 × 4 bits; y = (q − 8)·d.
    Q4_0,
    /// d, dmin (f16), 12 bytes of 6-bit scales and mins, 256 × 4 bits.
    Q4_K,
    /// As Q4_K with 32 bytes holding each value's fifth bit.
    Q5_K,
    /// 256 × (4 low + 2 high bits), 16 × i8 scales, d (f16).
    Q6_K,
    /// d, m (f16), 32 × 4 bits; y = q·d + m.
    Q4_1,
    /// d (f16), 32 fifth bits, 32 × 4 bits; y = (q − 16)·d.
    Q5_0,
    /// d, m (f16), 32 fifth bits, 32 × 4 bits; y = q·d + m.
    Q5_1,
    /// d (f16), 32 × 4-bit indices into a table of 16 non-linear levels.
    IQ4_NL,
    /// A power-of-two scale (e8m0), 32 × 4-bit FP4 (e2m1) values.
    MXFP4,
    /// 16 bytes of 4-bit scales and mins, 256 × 2 bits, d, dmin (f16).
    Q2_K,
    /// 256 high bits, 256 × 2 low bits, 16 packed 6-bit scales, d (f16).
    Q3_K,
    /// d (f16), 8 packed 6-bit scales, 256 × 4-bit indices into IQ4_NL's levels.
    IQ4_XS,
}

/// What one type is.
#[derive(Debug)]
pub struct TypeTraits {
    pub ty: WeightType,
    /// ggml's name, which cleave prints too.
    pub name: &'static str,
    /// Values in one block (1 for the float types): a row is a whole number
    /// of blocks.
    pub block_len: usize,
    /// Bytes of one block (ggml's `block_*` structs, which are packed).
    pub block_bytes: usize,
    /// The id GGUF files store (ggml.h's `ggml_type`).
    pub ggml_id: u32,
    /// The dtype name safetensors files give it, for the types they store.
    pub safetensors: Option<&'static str>,
    /// Where each block keeps its f16 scales (empty for the float types): a
    /// block whose scales are finite holds only finite values.
    pub scale_offsets: &'static [usize],
    /// Consecutive values of a row the kernels decode at once: the block
    /// types share a scale and a u32 word of quants across four values
    /// (every block length and sub-block is a multiple of four); the float
    /// types go one value at a time, since their rows may be any length.
    pub decode_group: u32,
}

/// Every type, in the order of [`WeightType`]'s variants.
pub const TYPES: [TypeTraits; 16] = [
    TypeTraits {
        ty: WeightType::F32,
        name: "F32",
        block_len: 1,
        block_bytes: 4,
        ggml_id: 0,
        safetensors: Some("F32"),
        scale_offsets: &[],
        decode_group: 1,
    },
    TypeTraits {
        ty: WeightType::F16,
        name: "F16",
        block_len: 1,
        block_bytes: 2,
        ggml_id: 1,
        safetensors: Some("F16"),
        scale_offsets: &[],
        decode_group: 1,
    },
    TypeTraits {
        ty: WeightType::BF16,
        name: "BF16",
        block_len: 1,
        block_bytes: 2,
        ggml_id: 30,
        safetensors: Some("BF16"),
        scale_offsets: &[],
        decode_group: 1,
    },
    TypeTraits {
        ty: WeightType::Q8_0,
        name: "Q8_0",
        block_len: QK,
        block_bytes: 2 + QK,
        ggml_id: 8,
        safetensors: None,
        scale_offsets: &[0],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q4_0,
        name: "Q4_0",
        block_len: QK,
        block_bytes: 2 + QK / 2,
        ggml_id: 2,
        safetensors: None,
        scale_offsets: &[0],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q4_K,
        name: "Q4_K",
        block_len: QK_K,
        block_bytes: 2 + 2 + 12 + QK_K / 2,
        ggml_id: 12,
        safetensors: None,
        scale_offsets: &[0, 2],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q5_K,
        name: "Q5_K",
        block_len: QK_K,
        block_bytes: 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
        ggml_id: 13,
        safetensors: None,
        scale_offsets: &[0, 2],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q6_K,
        name: "Q6_K",
        block_len: QK_K,
        block_bytes: QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        ggml_id: 14,
        safetensors: None,
        // d comes last, after the quants and the i8 scales.
        scale_offsets: &[QK_K / 2 + QK_K / 4 + QK_K / 16],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q4_1,
        name: "Q4_1",
        block_len: QK,
        block_bytes: 2 + 2 + QK / 2,
        ggml_id: 3,
        safetensors: None,
        scale_offsets: &[0, 2],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q5_0,
        name: "Q5_0",
        block_len: QK,
        block_bytes: 2 + 4 + QK / 2,
        ggml_id: 6,
        safetensors: None,
        scale_offsets: &[0],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q5_1,
        name: "Q5_1",
        block_len: QK,
        block_bytes: 2 + 2 + 4 + QK / 2,
        ggml_id: 7,
        safetensors: None,
        scale_offsets: &[0, 2],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::IQ4_NL,
        name: "IQ4_NL",
        block_len: QK,
        block_bytes: 2 + QK / 2,
        ggml_id: 20,
        safetensors: None,
        scale_offsets: &[0],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::MXFP4,
        name: "MXFP4",
        block_len: QK,
        block_bytes: 1 + QK / 2,
        ggml_id: 39,
        safetensors: None,
        // Its scale is a power of two that ggml widens to a finite f32
        // whatever its byte.
        scale_offsets: &[],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q2_K,
        name: "Q2_K",
        block_len: QK_K,
        block_bytes: QK_K / 16 + QK_K / 4 + 2 + 2,
        ggml_id: 10,
        safetensors: None,
        // d and dmin come last.
        scale_offsets: &[QK_K / 16 + QK_K / 4, QK_K / 16 + QK_K / 4 + 2],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::Q3_K,
        name: "Q3_K",
        block_len: QK_K,
        block_bytes: QK_K / 8 + QK_K / 4 + 12 + 2,
        ggml_id: 11,
        safetensors: None,
        scale_offsets: &[QK_K / 8 + QK_K / 4 + 12],
        decode_group: 4,
    },
    TypeTraits {
        ty: WeightType::IQ4_XS,
        name: "IQ4_XS",
        block_len: QK_K,
        block_bytes: 2 + 2 + QK_K / 64 + QK_K / 2,
        ggml_id: 23,
        safetensors: None,
        scale_offsets: &[0],
        decode_group: 4,
    },
];

/// IQ4_NL's 16 levels (ggml's `kvalues_iq4nl`), which IQ4_XS shares.
pub const IQ4_NL_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// FP4 (e2m1) values doubled, so that they are whole (ggml's
/// `kvalues_mxfp4`); MXFP4's scale is halved to match.
pub const MXFP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `GGML_E8M0_TO_FP32_HALF`: the f32 bits of half the power of two
/// an e8m0 byte stands for, `2^(e − 128)`, a subnormal below e = 2.
pub const fn e8m0_half_bits(e: u8) -> u32 {
    if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    }
}

impl WeightType {
    /// Every type, for code that must cover each (a kernel compiled per type).
    pub const ALL: [WeightType; 16] = {
        let mut all = [WeightType::F32; 16];
        let mut i = 0;
        while i < TYPES.len() {
            all[i] = TYPES[i].ty;
            i += 1;
        }
        all
    };

    /// This type's row of [`TYPES`].
    pub const fn traits(self) -> &'static TypeTraits {
        &TYPES[self as usize]
    }

    pub const fn name(self) -> &'static str {
        self.traits().name
    }

    /// Values in one block: a row is a whole number of blocks.
    pub const fn block_len(self) -> usize {
        self.traits().block_len
    }

    /// Bytes of one block (of one value, for the float types).
    pub const fn block_bytes(self) -> usize {
        self.traits().block_bytes
    }

    pub const fn is_float(self) -> bool {
        self.block_len() == 1
    }

    /// The type GGUF files store under `id`, if cleave reads it.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        TYPES.iter().find(|t| t.ggml_id == id).map(|t| t.ty)
    }

    /// The type safetensors names `name` ("F32", "BF16", ...), if cleave
    /// reads it.
    pub fn from_safetensors(name: &str) -> Option<Self> {
        TYPES.iter().find(|t| t.safetensors == Some(name)).map(|t| t.ty)
    }

    /// Bytes of a row of `cols` values; `None` unless they are whole blocks
    /// (or when the count overflows).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_len())
            .then(|| (cols / self.block_len()).checked_mul(self.block_bytes()))?
    }

    /// Bytes of `values` values, `None` unless they fill whole blocks (or
    /// the count overflows): a file's tensor sizes are u64.
    pub fn bytes_for(self, values: u64) -> Option<u64> {
        let block_len = self.block_len() as u64;
        values
            .is_multiple_of(block_len)
            .then(|| (values / block_len).checked_mul(self.block_bytes() as u64))?
    }

    /// The index of the first NaN or infinity among `bytes` (little-endian
    /// values of this type), if any: all exponent bits set, in one pass.
    /// For a block type, the first value of the first block whose f16
    /// scale is not finite (a finite scale keeps every value finite).
    pub fn first_non_finite(self, bytes: &[u8]) -> Option<usize> {
        let half_is_finite = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 != 0x7c00;
        match self {
            WeightType::F32 => bytes
                .chunks_exact(4)
                .position(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 == 0x7f80_0000),
            WeightType::F16 => bytes.chunks_exact(2).position(|b| !half_is_finite(b)),
            WeightType::BF16 => bytes
                .chunks_exact(2)
                .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80),
            _ => bytes
                .chunks_exact(self.block_bytes())
                .position(|block| {
                    let scales = self.traits().scale_offsets;
                    scales.iter().any(|&at| !half_is_finite(&block[at..at + 2]))
                })
                .map(|block| block * self.block_len()),
        }
    }
}

impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_of_the_table_is_its_variants() {
        for (i, traits) in TYPES.iter().enumerate() {
            assert_eq!(traits.ty as usize, i, "{}", traits.name);
            assert_eq!(traits.ty.name(), format!("{:?}", traits.ty));
            assert_eq!(WeightType::from_ggml_id(traits.ggml_id), Some(traits.ty));
        }
    }

    #[test]
    fn block_sizes_are_ggmls() {
        // ggml-common.h's static asserts on sizeof(block_*).
        let sizes: Vec<_> = WeightType::ALL.iter().map(|t| (t.name(), t.block_bytes())).collect();
        assert_eq!(
            sizes,
            [
                ("F32", 4),
                ("F16", 2),
                ("BF16", 2),
                ("Q8_0", 34),
                ("Q4_0", 18),
                ("Q4_K", 144),
                ("Q5_K", 176),
                ("Q6_K", 210),
                ("Q4_1", 20),
                ("Q5_0", 22),
                ("Q5_1", 24),
                ("IQ4_NL", 18),
                ("MXFP4", 17),
                ("Q2_K", 84),
                ("Q3_K", 110),
                ("IQ4_XS", 136)
            ]
        );
    }

    #[test]
    fn sizes_of_partial_blocks_and_overflows_are_refused() {
        assert_eq!(WeightType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(WeightType::Q4_K.row_bytes(100), None);
        assert_eq!(WeightType::F32.bytes_for(u64::MAX), None);
        assert_eq!(WeightType::Q8_0.bytes_for(33), None);
    }

    #[test]
    fn a_block_with_an_infinite_scale_is_found() {
        let mut blocks = vec![0u8; 2 * WeightType::Q6_K.block_bytes()];
        assert_eq!(WeightType::Q6_K.first_non_finite(&blocks), None);
        let d = WeightType::Q6_K.block_bytes() + 208;
        blocks[d..d + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
        assert_eq!(WeightType::Q6_K.first_non_finite(&blocks), Some(256));
    }
}
