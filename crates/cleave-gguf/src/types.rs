//! ggml's tensor type ids: the types cleave reads are cleave-types'
//! [`WeightType`]s; every other id ggml defines is refused by its name.

use cleave_types::WeightType;

/// The type stored under `id`, or, when cleave cannot read it, ggml's name
/// for it where the id is one ggml defines.
pub fn ggml_type(id: u32) -> Result<WeightType, Option<&'static str>> {
    WeightType::from_ggml_id(id).ok_or_else(|| unsupported_name(id))
}

/// ggml's name for a type id cleave does not read (ggml.h's `ggml_type`;
/// the gaps are ids ggml retired).
fn unsupported_name(id: u32) -> Option<&'static str> {
    Some(match id {
        9 => "Q8_1",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        21 => "IQ3_S",
        22 => "IQ2_S",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        40 => "NVFP4",
        _ => return None,
    })
}
