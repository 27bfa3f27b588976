//! Qwen3.5's fields of config.json, from what llama.cpp's converter
//! writes: which layers are Gated DeltaNet layers (`recurrent_layers`, or
//! every `full_attention_interval`-th layer full), their heads and
//! convolution (the `ssm.*` keys), and the full layers' partial rotary.

use serde_json::Value;

use super::{Fields, Shapes};
use crate::error::Result;
use crate::file::GgufFile;
use crate::metadata::Value as Meta;

impl GgufFile {
    pub(super) fn qwen35_fields(&self, shapes: &Shapes) -> Result<Fields> {
        let m = self.metadata();
        let arch = self.architecture()?;
        let key = |name: &str| format!("{}.{name}", arch.key_prefix());
        let layers = shapes.layers;
        self.check_layer_count(arch, layers)?;
        let recurrent_key = key("attention.recurrent_layers");
        let linear: Vec<bool> = match m.get(&recurrent_key) {
            // One flag a block, the multi-token prediction heads' after the model's.
            Some(Meta::Array(crate::Array::Bool(flags))) if flags.len() as u64 >= layers => {
                flags[..layers as usize].to_vec()
            }
            Some(_) => return Err(m.invalid(&recurrent_key, format!("is not a flag for each of the {layers} layers"))),
            None => {
                let interval_key = key("full_attention_interval");
                let interval = m.opt_u64(&interval_key)?.unwrap_or(4);
                if interval == 0 {
                    return Err(m.invalid(&interval_key, "must be positive"));
                }
                (0..layers).map(|l| (l + 1) % interval != 0).collect()
            }
        };
        let types: Vec<&str> = linear
            .iter()
            .map(|&l| if l { "linear_attention" } else { "full_attention" })
            .collect();
        let value_heads_key = key("ssm.time_step_rank");
        let value_heads = m.u64(&value_heads_key)?;
        let inner_key = key("ssm.inner_size");
        let inner = m.u64(&inner_key)?;
        if value_heads == 0 || inner % value_heads != 0 {
            return Err(m.invalid(
                &inner_key,
                format!("{inner} values do not split into {value_heads} value heads"),
            ));
        }
        let rotary = m.opt_u64(&key("rope.dimension_count"))?.unwrap_or(shapes.head_dim);
        let field = |name: &str| -> Result<Option<Value>> { Ok(Some(m.u64(&key(name))?.into())) };
        Ok(vec![
            ("layer_types", Some(types.into())),
            ("linear_conv_kernel_dim", field("ssm.conv_kernel")?),
            ("linear_key_head_dim", field("ssm.state_size")?),
            ("linear_num_key_heads", field("ssm.group_count")?),
            ("linear_num_value_heads", Some(value_heads.into())),
            ("linear_value_head_dim", Some((inner / value_heads).into())),
            (
                "partial_rotary_factor",
                Some((rotary as f64 / shapes.head_dim.max(1) as f64).into()),
            ),
        ])
    }
}
