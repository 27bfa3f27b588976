//! Expert split: a mixture's experts are divided among the group by index,
//! a device holding the same experts of every block, in proportion to the
//! memory each has left (or to the user's ratios). Attention, the norms,
//! the router, the embeddings, the output head and the whole KV cache stay
//! on the main device (the first member), as vLLM's expert parallelism
//! keeps them beside each other.
//!
//! A device that cannot hold all of its experts keeps as many of each
//! block's as fit (or as many as the expert cache is given) and uploads the
//! others from the host when the router picks them, evicting the least
//! recently used: routing, not the block, decides what moves.

use std::ops::Range;

use serde::Serialize;

use crate::apportion::apportion;
use crate::layer::{build_empty, weights};
use crate::{check_budgets, format_bytes, Inventory, Member, Plan, PlanError, Residency, SplitMode, Streaming};

/// The experts a device holds in expert split: the same indices in every
/// block.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExpertSlice {
    #[serde(serialize_with = "crate::range_as_pair")]
    pub experts: Range<usize>,
    /// How many of them each block keeps on the device: all, unless the
    /// device is short of memory or the cache was given a size. The
    /// others are uploaded when routed.
    pub cached: usize,
}

pub(crate) fn plan_experts(
    inventory: &Inventory,
    members: &[Member],
    ratios: Option<&[f64]>,
    streaming: Streaming,
) -> Result<Plan, PlanError> {
    let unsupported = |reason: &str| PlanError::Unsupported {
        module: inventory.module.clone(),
        mode: SplitMode::Expert,
        reason: reason.into(),
    };
    let geometry = inventory
        .geometry
        .as_ref()
        .filter(|g| g.experts > 0)
        .ok_or_else(|| unsupported("its blocks have no experts"))?;
    if streaming.stream_blocks.is_some() {
        return Err(PlanError::Options(
            "--stream-layers streams whole blocks in layer split; expert split streams experts (--expert-cache)".into(),
        ));
    }
    match (streaming.residency, streaming.expert_cache) {
        (_, Some(0)) => {
            return Err(PlanError::Options(
                "an expert cache of 0 experts has none to run".into(),
            ))
        }
        (Residency::Device, Some(_)) => {
            return Err(PlanError::Options(
                "--expert-cache keeps experts on the host, which --residency device forbids".into(),
            ))
        }
        _ => {}
    }
    let count = geometry.experts;
    let per_expert = geometry.expert_bytes_over_blocks;
    let mut plan = build_empty(inventory, members, SplitMode::Expert);
    let blocks: u64 = inventory.block_bytes.iter().sum();
    let main = &mut plan.devices[0];
    main.weight_bytes = inventory.head_bytes + inventory.tail_bytes - inventory.tail_shared_with_head
        + blocks.saturating_sub(per_expert.saturating_mul(count as u64));
    main.kv_bytes = inventory.cache_bytes_of(0..inventory.block_bytes.len());

    // Experts each device could hold after what it holds anyway.
    let fit: Vec<usize> = plan
        .devices
        .iter()
        .map(|d| match d.budget_bytes {
            Some(budget) if per_expert > 0 => {
                let room = budget.saturating_sub(d.weight_bytes + d.kv_bytes + inventory.compute_bytes);
                usize::try_from(room / per_expert).unwrap_or(usize::MAX)
            }
            _ => usize::MAX,
        })
        .collect();
    let shares = match ratios {
        Some(_) => weights(inventory, members, ratios)?,
        None if members.iter().all(|m| m.budget.is_some()) => fit.iter().map(|&f| f as f64).collect(),
        None => vec![1.0; members.len()],
    };
    let may_stream = streaming.residency != Residency::Device;
    // Every expert resident where the memory allows it (the user's ratios
    // are taken as given); else each device owns a share by its memory and
    // caches what fits.
    let resident_caps = match ratios {
        Some(_) => vec![usize::MAX; members.len()],
        None => fit.clone(),
    };
    let streaming_caps: Vec<usize> = fit.iter().map(|&f| if f == 0 { 0 } else { usize::MAX }).collect();
    let owned = apportion(count, &shares, &resident_caps)
        .or_else(|| may_stream.then(|| apportion(count, &shares, &streaming_caps)).flatten())
        .ok_or_else(|| no_room(inventory, &plan, &fit, per_expert, may_stream))?;

    let mut start = 0;
    for (i, (d, &owned)) in plan.devices.iter_mut().zip(&owned).enumerate() {
        let cached = if may_stream {
            owned.min(fit[i]).min(streaming.expert_cache.unwrap_or(usize::MAX))
        } else {
            owned
        };
        if owned > 0 && cached == 0 {
            return Err(no_room(inventory, &plan, &fit, per_expert, may_stream));
        }
        d.experts = Some(ExpertSlice {
            experts: start..start + owned,
            cached,
        });
        start += owned;
        d.weight_bytes += cached as u64 * per_expert;
        if owned == 0 && i > 0 {
            d.blocks = 0..0;
        } else {
            d.compute_bytes = inventory.compute_bytes;
        }
    }
    check_budgets(&plan)?;
    Ok(plan)
}

/// The group has no room for the experts: each device's room, in experts.
fn no_room(inventory: &Inventory, plan: &Plan, fit: &[usize], per_expert: u64, may_stream: bool) -> PlanError {
    let room: Vec<String> = plan
        .devices
        .iter()
        .zip(fit)
        .map(|(d, &fit)| match fit {
            usize::MAX => format!("{} any number", d.name),
            fit => format!("{} {fit}", d.name),
        })
        .collect();
    let count = inventory.geometry.as_ref().map_or(0, |g| g.experts);
    let reason = if may_stream {
        "a device owning experts needs room for at least one"
    } else {
        "--residency auto would keep those that do not fit on the host"
    };
    PlanError::DoesNotFit {
        module: inventory.module.clone(),
        reason: format!(
            "in expert split the devices have room for {} of the {count} experts ({} each over every block, \
             after the main device's embeddings, attention and KV cache); {reason}",
            room.join(", "),
            format_bytes(per_expert),
        ),
    }
}
