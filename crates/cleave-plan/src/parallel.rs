//! Row split and tensor split: every block runs on the group's main
//! device, and its big matmul weights are divided among all members.
//!
//! - Row split slices each eligible 2-D weight by output rows; the input
//!   goes to every member, each computes its rows, the main device gathers.
//! - Tensor split (Megatron) gives each member whole attention heads (by
//!   KV head, so GQA groups stay together) with their KV cache, and a range
//!   of MLP intermediate columns: q/k/v and gate/up are sliced by rows, o
//!   and down by input columns, and the partial sums are all-reduced.

use std::ops::Range;

use serde::Serialize;

use crate::apportion::apportion;
use crate::layer::{build_empty, weights};
use crate::{format_bytes, Inventory, Member, Plan, PlanError, Role, SplitMode};

/// Slices start on multiples of this many rows (columns), as GPU kernels
/// and quantization blocks like them.
pub const ALIGN: usize = 32;

/// Rows of one sliced weight that a device holds (the same in every block).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RowSlice {
    pub tensor: String,
    #[serde(serialize_with = "crate::range_as_pair")]
    pub rows: Range<usize>,
}

/// The heads and MLP columns a device holds in tensor split.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeadSlice {
    #[serde(serialize_with = "crate::range_as_pair")]
    pub heads: Range<usize>,
    #[serde(serialize_with = "crate::range_as_pair")]
    pub kv_heads: Range<usize>,
    #[serde(serialize_with = "crate::range_as_pair")]
    pub intermediate: Range<usize>,
}

/// Cuts `0..len` into consecutive ranges in proportion to `shares`, each
/// boundary on a multiple of `align` (the last range takes the rest).
pub fn aligned_ranges(len: usize, shares: &[f64], align: usize) -> Vec<Range<usize>> {
    let total: f64 = shares.iter().sum();
    let mut start = 0;
    let mut cumulative = 0.0;
    shares
        .iter()
        .enumerate()
        .map(|(i, share)| {
            cumulative += share;
            let end = if i + 1 == shares.len() {
                len
            } else {
                let exact = len as f64 * cumulative / total;
                (((exact / align as f64).round() as usize) * align).clamp(start, len)
            };
            let range = start..end;
            start = end;
            range
        })
        .collect()
}

pub(crate) fn plan_parallel(
    inventory: &Inventory,
    members: &[Member],
    ratios: Option<&[f64]>,
    mode: SplitMode,
    row_split_min: usize,
) -> Result<Plan, PlanError> {
    let geometry = inventory.geometry.as_ref().ok_or_else(|| PlanError::Unsupported {
        module: inventory.module.clone(),
        mode,
    })?;
    let shares = weights(inventory, members, ratios)?;
    let mut plan = build_empty(inventory, members, mode);
    let layers = inventory.block_bytes.len() as u64;
    let f32s = |n: usize| (n * size_of::<f32>()) as u64;
    // What stays on the main device: everything but the sliced weights.
    let mut sliced_per_block = 0u64;
    match mode {
        SplitMode::Row => {
            for m in &geometry.matmuls {
                if m.rows < row_split_min || m.cols < row_split_min {
                    continue;
                }
                sliced_per_block += f32s(m.rows * (m.cols + usize::from(m.bias)));
                for (device, rows) in aligned_ranges(m.rows, &shares, ALIGN).into_iter().enumerate() {
                    if rows.is_empty() {
                        continue;
                    }
                    plan.devices[device].weight_bytes += layers * f32s(rows.len() * (m.cols + usize::from(m.bias)));
                    plan.devices[device].rows.push(RowSlice {
                        tensor: m.name.clone(),
                        rows,
                    });
                }
            }
            plan.devices[0].kv_bytes = inventory.kv_bytes_per_block * layers;
        }
        SplitMode::Tensor => {
            let kv_counts = apportion(geometry.kv_heads, &shares, &vec![usize::MAX; shares.len()])
                .ok_or_else(|| PlanError::BadRatios(shares.clone()))?;
            let group = geometry.heads / geometry.kv_heads;
            let intermediate = aligned_ranges(geometry.intermediate, &shares, ALIGN);
            let mut kv_start = 0;
            for (device, (&kv, cols)) in kv_counts.iter().zip(intermediate).enumerate() {
                let kv_heads = kv_start..kv_start + kv;
                kv_start += kv;
                let heads = kv_heads.start * group..kv_heads.end * group;
                let mut bytes = 0;
                for m in &geometry.matmuls {
                    let part = match m.role {
                        Role::Query => heads.len() * geometry.head_dim,
                        Role::Key | Role::Value => kv_heads.len() * geometry.head_dim,
                        Role::Gate | Role::Up => cols.len(),
                        // Sliced by input columns; their bias stays on the main device.
                        Role::Output => {
                            bytes += f32s(m.rows * heads.len() * geometry.head_dim);
                            continue;
                        }
                        Role::Down => {
                            bytes += f32s(m.rows * cols.len());
                            continue;
                        }
                    };
                    bytes += f32s(part * (m.cols + usize::from(m.bias)));
                }
                if kv > 0 {
                    bytes += geometry.per_head_shard_bytes;
                }
                let d = &mut plan.devices[device];
                d.weight_bytes += layers * bytes;
                d.kv_bytes = inventory.kv_bytes_per_block * layers * kv as u64 / geometry.kv_heads as u64;
                d.heads = Some(HeadSlice {
                    heads,
                    kv_heads,
                    intermediate: cols,
                });
            }
            sliced_per_block = geometry
                .matmuls
                .iter()
                .map(|m| {
                    f32s(
                        m.rows * m.cols
                            + if matches!(m.role, Role::Output | Role::Down) {
                                0
                            } else {
                                usize::from(m.bias) * m.rows
                            },
                    )
                })
                .sum::<u64>()
                + geometry.per_head_shard_bytes;
        }
        SplitMode::Layer => unreachable!("layer split is planned by plan_layers"),
    }
    let main = &mut plan.devices[0];
    main.weight_bytes += inventory.head_bytes + inventory.tail_bytes - inventory.tail_shared_with_head;
    main.weight_bytes += inventory.block_bytes.iter().map(|b| b - sliced_per_block).sum::<u64>();
    for d in plan.devices.iter_mut() {
        if d.is_used() {
            d.compute_bytes = inventory.compute_bytes;
        }
    }
    if let Some(d) = plan
        .devices
        .iter()
        .find(|d| d.budget_bytes.is_some_and(|b| d.total_bytes() > b))
    {
        return Err(PlanError::DoesNotFit {
            module: inventory.module.clone(),
            reason: format!(
                "in {mode} split {} would need {} but has {}",
                d.name,
                format_bytes(d.total_bytes()),
                format_bytes(d.budget_bytes.unwrap_or(0))
            ),
        });
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::aligned_ranges;

    #[test]
    fn ranges_are_aligned_and_cover_everything() {
        assert_eq!(
            aligned_ranges(192, &[1.0, 1.0, 1.0], 32),
            vec![0..64, 64..128, 128..192]
        );
        assert_eq!(aligned_ranges(176, &[1.0, 1.0], 32), vec![0..96, 96..176]);
        assert_eq!(aligned_ranges(64, &[1.0, 1.0, 1.0], 32), vec![0..32, 32..32, 32..64]);
        assert_eq!(aligned_ranges(100, &[3.0, 1.0], 1), vec![0..75, 75..100]);
        assert_eq!(aligned_ranges(100, &[0.0, 1.0], 32), vec![0..0, 0..100]);
    }
}
