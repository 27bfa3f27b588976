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
use crate::{check_budgets, Inventory, Matmul, Member, Plan, PlanError, Role, SplitMode};

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
    let unsupported = |reason: &str| PlanError::Unsupported {
        module: inventory.module.clone(),
        mode,
        reason: reason.into(),
    };
    let geometry = inventory
        .geometry
        .as_ref()
        .ok_or_else(|| unsupported("its blocks are not made of attention heads and MLP rows"))?;
    if mode == SplitMode::Tensor && geometry.experts > 0 {
        return Err(unsupported(
            "a block's experts are not divided between devices (use layer or row split)",
        ));
    }
    if mode == SplitMode::Tensor && geometry.linear_blocks > 0 {
        let reason = format!(
            "{} of its blocks are Gated DeltaNet (linear-attention) layers, whose heads and recurrent state \
             are not divided between devices (use layer or row split)",
            geometry.linear_blocks
        );
        return Err(unsupported(&reason));
    }
    if geometry.uneven_blocks > 0 {
        let reason = format!(
            "{} of its blocks have attention heads of another size, or read another block's KV cache, and {mode} \
             split cuts every block alike (use layer split, or expert split for a mixture's experts)",
            geometry.uneven_blocks
        );
        return Err(unsupported(&reason));
    }
    let shares = weights(inventory, members, ratios)?;
    let mut plan = build_empty(inventory, members, mode);
    let layers = inventory.block_bytes.len() as u64;
    // Over every block: `rows` rows of `m`'s weight, and their bias in f32.
    let rows_bytes = |m: &Matmul, rows: usize| {
        let bias = if m.bias {
            layers * (rows * size_of::<f32>()) as u64
        } else {
            0
        };
        rows as u64 * m.row_bytes_over_blocks + bias
    };
    // Over every block: input columns `cols` of `m`'s weight as stored, no bias.
    let cols_bytes =
        |m: &Matmul, cols: usize| m.rows as u64 * m.row_bytes_over_blocks * cols as u64 / m.cols.max(1) as u64;
    // A device's slice of input columns: as stored, or in f32 where its
    // ends cut the stored blocks (as the loader then widens it).
    let slice_bytes = |m: &Matmul, cols: &Range<usize>| {
        if cuts_blocks(m, cols) {
            layers * (m.rows * cols.len() * size_of::<f32>()) as u64
        } else {
            cols_bytes(m, cols.len())
        }
    };
    // What leaves the main device, over every block: the sliced weights.
    let mut sliced = 0u64;
    match mode {
        SplitMode::Row => {
            for m in &geometry.matmuls {
                if m.rows < row_split_min || m.cols < row_split_min {
                    continue;
                }
                sliced += rows_bytes(m, m.rows);
                for (device, rows) in aligned_ranges(m.rows, &shares, ALIGN).into_iter().enumerate() {
                    if rows.is_empty() {
                        continue;
                    }
                    plan.devices[device].weight_bytes += rows_bytes(m, rows.len());
                    plan.devices[device].rows.push(RowSlice {
                        tensor: m.name.clone(),
                        rows,
                    });
                }
            }
            plan.devices[0].kv_bytes = inventory.cache_bytes_of(0..inventory.block_bytes.len());
        }
        SplitMode::Tensor => {
            let kv_counts = apportion(geometry.kv_heads, &shares, &vec![usize::MAX; shares.len()])
                .ok_or_else(|| PlanError::BadRatios(shares.clone()))?;
            let group = geometry.heads / geometry.kv_heads;
            // down_proj's input columns split on whole blocks (block
            // lengths and ALIGN are powers of two: the larger is a multiple
            // of the smaller).
            let down_block = geometry
                .matmuls
                .iter()
                .filter(|m| m.role == Role::Down)
                .map(|m| m.block_len)
                .max()
                .unwrap_or(1);
            let intermediate = aligned_ranges(geometry.intermediate, &shares, ALIGN.max(down_block));
            let mut kv_start = 0;
            // Per matmul: the devices whose column slice cuts its blocks.
            let mut cut: Vec<Vec<String>> = vec![Vec::new(); geometry.matmuls.len()];
            for (device, (&kv, cols)) in kv_counts.iter().zip(intermediate).enumerate() {
                let kv_heads = kv_start..kv_start + kv;
                kv_start += kv;
                let heads = kv_heads.start * group..kv_heads.end * group;
                let mut bytes = 0;
                for (m, cut) in geometry.matmuls.iter().zip(&mut cut) {
                    bytes += match m.role {
                        Role::Query => rows_bytes(m, heads.len() * geometry.head_dim),
                        Role::Key | Role::Value => rows_bytes(m, kv_heads.len() * geometry.head_dim),
                        Role::Gate | Role::Up => rows_bytes(m, cols.len()),
                        // Sliced by input columns; their bias stays on the main device.
                        Role::Output | Role::Down => {
                            let slice = match m.role {
                                Role::Output => heads.start * geometry.head_dim..heads.end * geometry.head_dim,
                                _ => cols.clone(),
                            };
                            if cuts_blocks(m, &slice) {
                                let name = &plan.devices[device].name;
                                cut.push(format!("{name} columns {}..{}", slice.start, slice.end));
                            }
                            slice_bytes(m, &slice)
                        }
                    };
                }
                if kv > 0 {
                    bytes += layers * geometry.per_head_shard_bytes;
                }
                let d = &mut plan.devices[device];
                d.weight_bytes += bytes;
                d.kv_bytes =
                    inventory.cache_bytes_of(0..inventory.block_bytes.len()) * kv as u64 / geometry.kv_heads as u64;
                d.heads = Some(HeadSlice {
                    heads,
                    kv_heads,
                    intermediate: cols,
                });
            }
            // The user should know when the bytes surprise: those slices
            // are held in f32.
            plan.notes = geometry
                .matmuls
                .iter()
                .zip(cut)
                .filter(|(_, cut)| !cut.is_empty())
                .map(|(m, cut)| {
                    format!(
                        "{}: {} cut its stored blocks of {} columns, so they are held in f32",
                        m.name,
                        cut.join(", "),
                        m.block_len
                    )
                })
                .collect();
            sliced = geometry
                .matmuls
                .iter()
                .map(|m| match m.role {
                    Role::Output | Role::Down => cols_bytes(m, m.cols),
                    _ => rows_bytes(m, m.rows),
                })
                .sum::<u64>()
                + layers * geometry.per_head_shard_bytes;
        }
        SplitMode::Layer | SplitMode::Expert => unreachable!("layer and expert split are planned by their own modules"),
    }
    let main = &mut plan.devices[0];
    main.weight_bytes += inventory.head_bytes + inventory.tail_bytes - inventory.tail_shared_with_head;
    main.weight_bytes += inventory.block_bytes.iter().sum::<u64>().saturating_sub(sliced);
    for d in plan.devices.iter_mut() {
        if d.is_used() {
            d.compute_bytes = inventory.compute_bytes;
        }
    }
    check_budgets(&plan)?;
    Ok(plan)
}

/// Whether input columns `cols` of `m` start or end inside a stored block.
fn cuts_blocks(m: &Matmul, cols: &Range<usize>) -> bool {
    !cols.is_empty() && (!cols.start.is_multiple_of(m.block_len) || !cols.end.is_multiple_of(m.block_len))
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
