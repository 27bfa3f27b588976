//! Layer split: contiguous ranges of blocks, one per device, in proportion
//! to the devices' budgets (or the user's ratios), the head with the first
//! block and the tail with the last, each block's KV cache beside it.

use crate::apportion::apportion;
use crate::{format_bytes, DevicePlan, Inventory, Member, Plan, PlanError, Residency, SplitMode, Streaming};

/// Places `inventory` on `members`.
///
/// Without `ratios`, blocks go in proportion to each device's budget left
/// after its compute buffers, and a device that cannot hold its share hands
/// the rest to the others. With `ratios` (llama.cpp's `--tensor-split`),
/// the split is the user's, and a device that cannot hold it is an error.
/// When the group cannot hold every block and `streaming` allows it, some
/// blocks' weights stay on the host and are streamed (see [`stream`]).
pub fn plan_layers(
    inventory: &Inventory,
    members: &[Member],
    ratios: Option<&[f64]>,
    streaming: Streaming,
) -> Result<Plan, PlanError> {
    let resident = |plan: Plan| match (streaming.residency, streaming.stream_blocks) {
        (_, Some(n)) => stream_last(plan, inventory, n),
        (Residency::Host | Residency::Disk, None) => stream_last(plan, inventory, inventory.block_bytes.len()),
        _ => Ok(plan),
    };
    match plan_resident(inventory, members, ratios) {
        Ok(plan) => resident(plan),
        Err(PlanError::DoesNotFit { .. }) if streaming.residency != Residency::Device && ratios.is_none() => {
            stream(inventory, members)
        }
        Err(e) => Err(e),
    }
}

/// Every block resident on a device.
fn plan_resident(inventory: &Inventory, members: &[Member], ratios: Option<&[f64]>) -> Result<Plan, PlanError> {
    if members.is_empty() {
        return Err(PlanError::EmptyGroup);
    }
    let blocks = inventory.block_bytes.len();
    let per_block = (0..blocks).map(|i| inventory.block_and_cache(i)).max().unwrap_or(0);
    let weights = weights(inventory, members, ratios)?;
    let mut caps: Vec<usize> = members
        .iter()
        .map(|m| match (ratios, m.budget) {
            (None, Some(budget)) if per_block > 0 => {
                (budget.saturating_sub(inventory.compute_bytes) / per_block) as usize
            }
            _ => usize::MAX,
        })
        .collect();
    loop {
        let counts = apportion(blocks, &weights, &caps).ok_or_else(|| does_not_fit(inventory, members))?;
        let plan = build(inventory, members, &counts);
        let over = plan
            .devices
            .iter()
            .position(|d| d.budget_bytes.is_some_and(|b| d.total_bytes() > b));
        match over {
            None => return Ok(plan),
            // The head or tail pushed a device over: give it fewer blocks.
            Some(i) if ratios.is_none() && counts[i] > 0 => {
                let device = &plan.devices[i];
                let excess = device.total_bytes() - device.budget_bytes.unwrap_or(0);
                let fewer = excess.div_ceil(per_block.max(1)).max(1) as usize;
                caps[i] = counts[i].saturating_sub(fewer);
            }
            Some(i) => return Err(PlanError::over_budget(&plan, &plan.devices[i])),
        }
    }
}

/// How strongly each device draws blocks (or slices).
pub(crate) fn weights(
    inventory: &Inventory,
    members: &[Member],
    ratios: Option<&[f64]>,
) -> Result<Vec<f64>, PlanError> {
    match ratios {
        Some(r) if r.len() != members.len() => Err(PlanError::RatioCount {
            given: r.len(),
            devices: members.len(),
        }),
        Some(r) => shares(r),
        // Memory left for blocks, when every device's memory is known.
        None if members.iter().all(|m| m.budget.is_some()) => Ok(members
            .iter()
            .map(|m| m.budget.unwrap_or(0).saturating_sub(inventory.compute_bytes) as f64)
            .collect()),
        None => Ok(vec![1.0; members.len()]),
    }
}

/// The user's ratios as shares that sum to 1, each judged as a ratio:
/// finite, not negative, not all zero. They are scaled by the largest
/// first, so that ratios near the largest f64 (`1e308,1`) neither sum to
/// infinity nor make a share of blocks or heads overflow its count.
fn shares(ratios: &[f64]) -> Result<Vec<f64>, PlanError> {
    let bad = || PlanError::BadRatios(ratios.to_vec());
    if ratios.iter().any(|r| !r.is_finite() || *r < 0.0) {
        return Err(bad());
    }
    let largest = ratios.iter().copied().fold(0.0, f64::max);
    if largest == 0.0 {
        return Err(bad());
    }
    let scaled: Vec<f64> = ratios.iter().map(|r| r / largest).collect();
    let sum: f64 = scaled.iter().sum();
    Ok(scaled.iter().map(|r| r / sum).collect())
}

/// A plan for the parallel modes before any bytes are counted: every
/// device takes part in every block; the first holds the head and tail.
pub(crate) fn build_empty(inventory: &Inventory, members: &[Member], mode: SplitMode) -> Plan {
    let blocks = inventory.block_bytes.len();
    Plan {
        module: inventory.module.clone(),
        mode,
        notes: Vec::new(),
        devices: members
            .iter()
            .enumerate()
            .map(|(i, m)| DevicePlan {
                name: m.name.clone(),
                runtime: m.runtime.clone(),
                blocks: 0..blocks,
                head: i == 0,
                tail: i == 0,
                weight_bytes: 0,
                kv_bytes: 0,
                compute_bytes: 0,
                budget_bytes: m.budget,
                rows: Vec::new(),
                heads: None,
                streamed: 0..0,
                staging_bytes: 0,
                experts: None,
            })
            .collect(),
    }
}

/// The plan for `counts[i]` consecutive blocks on device `i`.
fn build(inventory: &Inventory, members: &[Member], counts: &[usize]) -> Plan {
    let blocks = inventory.block_bytes.len();
    let mut start = 0;
    let devices = members
        .iter()
        .zip(counts)
        .map(|(member, &count)| {
            let range = start..start + count;
            start += count;
            let head = range.contains(&0);
            let tail = blocks > 0 && range.contains(&(blocks - 1));
            let mut weight_bytes: u64 = inventory.block_bytes[range.clone()].iter().sum();
            if head {
                weight_bytes += inventory.head_bytes;
            }
            if tail {
                weight_bytes += inventory.tail_bytes;
            }
            if head && tail {
                weight_bytes -= inventory.tail_shared_with_head;
            }
            let used = count > 0;
            DevicePlan {
                name: member.name.clone(),
                runtime: member.runtime.clone(),
                kv_bytes: inventory.cache_bytes_of(range.clone()),
                compute_bytes: if used { inventory.compute_bytes } else { 0 },
                blocks: range,
                head,
                tail,
                weight_bytes,
                budget_bytes: member.budget,
                rows: Vec::new(),
                heads: None,
                streamed: 0..0,
                staging_bytes: 0,
                experts: None,
            }
        })
        .collect();
    Plan {
        module: inventory.module.clone(),
        mode: SplitMode::Layer,
        devices,
        notes: Vec::new(),
    }
}

fn does_not_fit(inventory: &Inventory, members: &[Member]) -> PlanError {
    let weights: u64 = inventory.head_bytes + inventory.block_bytes.iter().sum::<u64>() + inventory.tail_bytes
        - inventory.tail_shared_with_head;
    let kv = inventory.cache_bytes_of(0..inventory.block_bytes.len());
    let budgets: Vec<String> = members
        .iter()
        .map(|m| format!("{} {}", m.name, m.budget.map_or("unknown".into(), format_bytes)))
        .collect();
    PlanError::DoesNotFit {
        module: inventory.module.clone(),
        reason: format!(
            "needs {} (weights {}, KV cache {}) plus {} of compute buffers per device used, but the group has: {}",
            format_bytes(weights + kv),
            format_bytes(weights),
            format_bytes(kv),
            format_bytes(inventory.compute_bytes),
            budgets.join(", ")
        ),
    }
}

/// One block's weights: the staging area a device that streams needs.
fn staging(inventory: &Inventory) -> u64 {
    inventory.block_bytes.iter().copied().max().unwrap_or(0)
}

/// Marks the last `n` blocks of `plan` as streamed: their weights leave
/// the devices, which keep their KV cache and gain a staging area.
fn stream_last(mut plan: Plan, inventory: &Inventory, n: usize) -> Result<Plan, PlanError> {
    let blocks = inventory.block_bytes.len();
    let first_streamed = blocks.saturating_sub(n);
    for d in plan.devices.iter_mut() {
        let start = d.blocks.start.max(first_streamed);
        if start < d.blocks.end {
            d.streamed = start..d.blocks.end;
            d.weight_bytes -= inventory.block_bytes[d.streamed.clone()].iter().sum::<u64>();
            d.staging_bytes = staging(inventory);
        }
    }
    Ok(plan)
}

/// Places every block on a device to run, but keeps only as many blocks'
/// weights resident as each device's budget allows after its KV cache,
/// compute buffers and a staging area; the rest are streamed.
fn stream(inventory: &Inventory, members: &[Member]) -> Result<Plan, PlanError> {
    let blocks = inventory.block_bytes.len();
    let staging = staging(inventory);
    // A device runs as many blocks as the largest cache fits.
    let kv = inventory.largest_cache();
    let weights = weights(inventory, members, None)?;
    // How many blocks each device can run at all: their KV cache must fit.
    let caps: Vec<usize> = members
        .iter()
        .map(|m| match m.budget {
            Some(budget) if kv > 0 => {
                let fixed = inventory.compute_bytes + staging + inventory.head_bytes.max(inventory.tail_bytes);
                (budget.saturating_sub(fixed) / kv) as usize
            }
            Some(budget) if budget < inventory.compute_bytes + staging => 0,
            _ => usize::MAX,
        })
        .collect();
    let counts = apportion(blocks, &weights, &caps).ok_or_else(|| does_not_fit(inventory, members))?;
    let mut plan = build(inventory, members, &counts);
    for d in plan.devices.iter_mut().filter(|d| !d.blocks.is_empty()) {
        let Some(budget) = d.budget_bytes else { continue };
        // Drop resident blocks from the end of the range until it fits.
        let mut resident = d.blocks.len();
        let fits = |resident: usize, d: &DevicePlan| {
            let streamed: u64 = inventory.block_bytes[d.blocks.start + resident..d.blocks.end]
                .iter()
                .sum();
            let staging = if resident < d.blocks.len() { staging } else { 0 };
            d.total_bytes() - streamed + staging <= budget
        };
        while resident > 0 && !fits(resident, d) {
            resident -= 1;
        }
        if !fits(resident, d) {
            return Err(does_not_fit(inventory, members));
        }
        if resident < d.blocks.len() {
            d.streamed = d.blocks.start + resident..d.blocks.end;
            d.weight_bytes -= inventory.block_bytes[d.streamed.clone()].iter().sum::<u64>();
            d.staging_bytes = staging;
        }
    }
    Ok(plan)
}
