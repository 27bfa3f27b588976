//! cleave's placement planner: a pure function from a module's tensor
//! inventory and a device group's budgets to a [`Plan`] saying which device
//! holds which blocks, the head and the tail, and how many bytes each needs.
//!
//! Nothing here touches a device, so every placement can be printed, diffed
//! and snapshot-tested.

mod apportion;
mod bytes;
mod expert;
mod fit;
mod layer;
mod parallel;

pub use bytes::format_bytes;
pub use expert::ExpertSlice;
pub use fit::{fit, FitRequest, Fitted};
pub use layer::plan_layers;
pub use parallel::{aligned_ranges, HeadSlice, RowSlice, ALIGN};

use std::ops::Range;

use serde::Serialize;
use thiserror::Error;

/// How a module is divided among a group's devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// Contiguous ranges of blocks, one per device.
    #[default]
    Layer,
    /// Big matmul weights sliced by output rows across the group.
    Row,
    /// Attention heads and MLP columns across the group, with all-reduce.
    Tensor,
    /// A mixture of experts' experts across the group; the rest of every
    /// block on the main device.
    Expert,
}

impl SplitMode {
    /// Whether a group spanning runtimes can run a model split this way,
    /// each runtime's devices holding a part of their own: layer split
    /// hands whole activations from one runtime's blocks to the next,
    /// expert split sends a routed expert's rows to the runtime that owns
    /// it. Row and tensor split sum partial results of every projection
    /// across the group, which would cross the host several times a block.
    pub fn may_span_runtimes(self) -> bool {
        matches!(self, SplitMode::Layer | SplitMode::Expert)
    }
}

impl std::fmt::Display for SplitMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SplitMode::Layer => "layer",
            SplitMode::Row => "row",
            SplitMode::Tensor => "tensor",
            SplitMode::Expert => "expert",
        })
    }
}

/// Where block weights may live when the group's memory is short.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Residency {
    /// On the devices if they fit, else stream as few blocks as needed.
    #[default]
    Auto,
    /// On the devices, or an error saying how much is missing.
    Device,
    /// Stream blocks from host memory (a copy of the checkpoint's bytes).
    Host,
    /// Stream blocks from the memory-mapped checkpoint file.
    Disk,
}

/// How weights may stay off the devices: whole blocks in layer split,
/// experts in expert split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streaming {
    pub residency: Residency,
    /// Stream exactly this many blocks (the last ones); with `Host` or
    /// `Disk` and no count, every block is streamed.
    pub stream_blocks: Option<usize>,
    /// Expert split: keep at most this many of a device's experts of each
    /// block resident, uploading the others when routed (default: as many
    /// as fit).
    pub expert_cache: Option<usize>,
}

/// What a matmul weight does in a block: tensor split slices each kind its
/// own way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Query,
    Key,
    Value,
    /// Attention's output projection.
    Output,
    Gate,
    Up,
    Down,
}

/// A 2-D matmul weight of a block, `[rows (out), cols (in)]`, by its name
/// inside the block (`self_attn.q_proj`).
#[derive(Clone, Debug)]
pub struct Matmul {
    pub name: String,
    pub role: Role,
    pub rows: usize,
    pub cols: usize,
    pub bias: bool,
    /// The bytes one of its rows takes on a device, summed over every
    /// block: `blocks · cols · 4` in f32, less where the checkpoint keeps
    /// 16-bit or quantized weights (which may differ between blocks).
    pub row_bytes_over_blocks: u64,
    /// Values per stored block along a row: 1 for f32 and 16-bit floats,
    /// 32 or 256 for llama.cpp's blocks (the largest over the blocks). A
    /// slice of input columns that cuts a block is held widened to f32.
    pub block_len: usize,
}

/// The shape of a block, for the modes that divide blocks themselves.
#[derive(Clone, Debug)]
pub struct BlockGeometry {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub matmuls: Vec<Matmul>,
    /// Bytes of a block that every device computing some of its heads
    /// holds a whole copy of (Qwen3's per-head norms of q and k).
    pub per_head_shard_bytes: u64,
    /// Experts in place of each block's MLP (0: a dense MLP). Their
    /// projections are among `matmuls`; tensor split does not divide them.
    pub experts: usize,
    /// Bytes of one expert (the largest) summed over every block: what
    /// expert split places, an expert index at a time.
    pub expert_bytes_over_blocks: u64,
    /// Blocks of a hybrid model whose mixer is a linear-attention layer
    /// with a recurrent state (Qwen3.5's Gated DeltaNet), kept whole
    /// beside the block: tensor split does not cut them.
    pub linear_blocks: usize,
    /// Blocks whose attention differs from the first attention block's:
    /// heads of another size (Gemma 4's full layers), or none of their own
    /// keys and values (a layer reading another's KV cache). Row and
    /// tensor split cut every block alike, so they do not cut these.
    pub uneven_blocks: usize,
}

/// What a module is made of, in bytes as it will sit on a device.
#[derive(Clone, Debug)]
pub struct Inventory {
    /// The module's name in device specs (`llm`, `te`, ...).
    pub module: String,
    /// Embeddings and input projections: on the device of the first block.
    pub head_bytes: u64,
    /// Weights of each repeated block.
    pub block_bytes: Vec<u64>,
    /// Final norm and output head: on the device of the last block.
    pub tail_bytes: u64,
    /// Bytes of the tail that are the head's own tensor (a tied output head):
    /// stored once when head and tail share a device.
    pub tail_shared_with_head: u64,
    /// Each block's cache for the requested context and sequences: its KV
    /// cache, or a linear-attention layer's recurrent state (which does not
    /// grow with the context). Empty for a module without caches.
    pub cache_bytes: Vec<u64>,
    /// Activation and scratch buffers each device needs while running.
    pub compute_bytes: u64,
    /// The block's matmuls and heads; `None` where only layer split applies.
    pub geometry: Option<BlockGeometry>,
}

impl Inventory {
    /// Bytes of the caches of `blocks`.
    pub fn cache_bytes_of(&self, blocks: std::ops::Range<usize>) -> u64 {
        self.cache_bytes.get(blocks).map_or(0, |caches| caches.iter().sum())
    }

    /// Bytes of the largest block's cache.
    pub fn largest_cache(&self) -> u64 {
        self.cache_bytes.iter().copied().max().unwrap_or(0)
    }

    /// Bytes of block `i`'s weights and cache.
    fn block_and_cache(&self, i: usize) -> u64 {
        self.block_bytes[i] + self.cache_bytes.get(i).copied().unwrap_or(0)
    }
}

/// One device of a group, as the planner sees it.
#[derive(Clone, Debug)]
pub struct Member {
    pub name: String,
    /// Bytes this device may use; `None` when the backend reports no memory
    /// and the user gave no cap (then the device is assumed large enough).
    pub budget: Option<u64>,
    /// The runtime that drives it ("cuda", "wgpu"), where known: a layer
    /// split hands the activations over through the host where it changes.
    pub runtime: Option<String>,
}

/// The placement of one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DevicePlan {
    pub name: String,
    /// The member's runtime, where the planner was told it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The blocks it runs, `[start, end)` (in JSON: `[start, end]`).
    #[serde(serialize_with = "range_as_pair")]
    pub blocks: Range<usize>,
    pub head: bool,
    pub tail: bool,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub compute_bytes: u64,
    pub budget_bytes: Option<u64>,
    /// Row split: the rows of each sliced weight it holds.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<RowSlice>,
    /// Tensor split: the heads and MLP columns it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<HeadSlice>,
    /// The blocks of `blocks` whose weights stay off the device and are
    /// uploaded into a staging area just before they run.
    #[serde(serialize_with = "range_as_pair", skip_serializing_if = "Range::is_empty")]
    pub streamed: Range<usize>,
    /// The staging area for streamed blocks (one block's weights).
    #[serde(skip_serializing_if = "is_zero")]
    pub staging_bytes: u64,
    /// Expert split: the experts of every block it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<ExpertSlice>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl DevicePlan {
    /// Whether the device holds anything at all.
    pub fn is_used(&self) -> bool {
        !self.blocks.is_empty() || self.head || self.tail
    }

    pub fn total_bytes(&self) -> u64 {
        self.weight_bytes + self.kv_bytes + self.compute_bytes + self.staging_bytes
    }
}

pub(crate) fn range_as_pair<S: serde::Serializer>(range: &Range<usize>, s: S) -> Result<S::Ok, S::Error> {
    [range.start, range.end].serialize(s)
}

/// One shard of a block: the device it runs on and, where the block is cut
/// across devices (tensor split), the heads and MLP columns it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockShard {
    pub device: usize,
    /// `None`: every head and column.
    pub slice: Option<HeadSlice>,
}

/// Where every part of one module lives.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub module: String,
    pub mode: SplitMode,
    pub devices: Vec<DevicePlan>,
    /// What a user should know of this placement that the table does not
    /// show (a slice held in another type than the checkpoint's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// How to place a module, beyond the group and its ratios.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    pub mode: SplitMode,
    /// Row split: weights with fewer rows or columns stay whole.
    pub row_split_min: usize,
    /// Layer split: whether and how blocks may be streamed from the host.
    pub streaming: Streaming,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            mode: SplitMode::Layer,
            row_split_min: 256,
            streaming: Streaming::default(),
        }
    }
}

/// Places `inventory` on `members` as `options` say. In row and tensor
/// split the first member is the main device.
pub fn plan(
    inventory: &Inventory,
    members: &[Member],
    ratios: Option<&[f64]>,
    options: &PlanOptions,
) -> Result<Plan, PlanError> {
    if options.mode != SplitMode::Expert && options.streaming.expert_cache.is_some() {
        return Err(PlanError::Options(format!(
            "--expert-cache is for expert split, not {} split (--split-mode expert)",
            options.mode
        )));
    }
    let streaming = options.streaming;
    if streaming.stream_blocks.is_some() && streaming.residency == Residency::Device {
        return Err(PlanError::Options(
            "--stream-layers streams blocks from the host, which --residency device refuses".into(),
        ));
    }
    let streams_blocks =
        streaming.stream_blocks.is_some() || matches!(streaming.residency, Residency::Host | Residency::Disk);
    if matches!(options.mode, SplitMode::Row | SplitMode::Tensor) && streams_blocks {
        return Err(PlanError::Options(format!(
            "blocks are streamed (--stream-layers, --residency host or disk) in layer split, not {} split",
            options.mode
        )));
    }
    match options.mode {
        SplitMode::Layer => plan_layers(inventory, members, ratios, options.streaming),
        _ if members.is_empty() => Err(PlanError::EmptyGroup),
        SplitMode::Expert => expert::plan_experts(inventory, members, ratios, options.streaming),
        mode => parallel::plan_parallel(inventory, members, ratios, mode, options.row_split_min),
    }
}

impl Plan {
    /// Index of the device that runs block `block`.
    pub fn device_of_block(&self, block: usize) -> usize {
        self.devices.iter().position(|d| d.blocks.contains(&block)).unwrap_or(0)
    }

    /// Where block `block` runs and its residual stream lives: the device
    /// its range is on in layer split, the main device in row and tensor
    /// split (whose shards reach the other devices themselves).
    pub fn home_of_block(&self, block: usize) -> usize {
        match self.mode {
            SplitMode::Layer => self.device_of_block(block),
            SplitMode::Row | SplitMode::Tensor | SplitMode::Expert => 0,
        }
    }

    /// Expert split: the device holding expert `expert` of every block.
    pub fn expert_owner(&self, expert: usize) -> Option<usize> {
        self.devices
            .iter()
            .position(|d| d.experts.as_ref().is_some_and(|s| s.experts.contains(&expert)))
    }

    /// The shards block `block` runs as, each on its device: in tensor
    /// split each device's share of the heads and MLP columns (a device
    /// with neither left out); in the other modes one shard on the
    /// block's home holding all of it (row split slices its projections
    /// by [`DevicePlan::rows`] within that shard).
    pub fn block_shards(&self, block: usize) -> Vec<BlockShard> {
        if self.mode != SplitMode::Tensor {
            let device = self.home_of_block(block);
            return vec![BlockShard { device, slice: None }];
        }
        let holds = |s: &HeadSlice| !s.heads.is_empty() || !s.intermediate.is_empty();
        self.devices
            .iter()
            .enumerate()
            .filter_map(|(device, d)| {
                let slice = d.heads.clone().filter(holds)?;
                Some(BlockShard {
                    device,
                    slice: Some(slice),
                })
            })
            .collect()
    }

    /// Whether the experts of every block are placed on the devices that
    /// own them (expert split) rather than beside their router.
    pub fn places_experts(&self) -> bool {
        self.devices.iter().any(|d| d.experts.is_some())
    }

    /// Whether block `block`'s weights are streamed rather than resident.
    pub fn is_streamed(&self, block: usize) -> bool {
        self.devices.iter().any(|d| d.streamed.contains(&block))
    }

    /// The part of this plan that `members` (places in the group) hold,
    /// as a plan of its own over just them: what one runtime's part of a
    /// model loads (layer split, whose parts are runs of blocks).
    pub fn part(&self, members: Range<usize>) -> Plan {
        Plan {
            module: self.module.clone(),
            mode: self.mode,
            devices: self.devices[members].to_vec(),
            notes: Vec::new(),
        }
    }

    /// The blocks this plan's devices hold (resident or streamed), which
    /// layer split keeps in one run.
    pub fn blocks(&self) -> Range<usize> {
        let held = self.devices.iter().map(|d| &d.blocks).filter(|b| !b.is_empty());
        let start = held.clone().map(|b| b.start).min().unwrap_or(0);
        let end = held.map(|b| b.end).max().unwrap_or(start);
        start..end
    }

    /// Whether a device of this plan holds the head (the embedding).
    pub fn has_head(&self) -> bool {
        self.devices.iter().any(|d| d.head)
    }

    /// Whether a device of this plan holds the tail (the last norm and
    /// the output head).
    pub fn has_tail(&self) -> bool {
        self.devices.iter().any(|d| d.tail)
    }

    pub fn head_device(&self) -> usize {
        self.devices.iter().position(|d| d.head).unwrap_or(0)
    }

    pub fn tail_device(&self) -> usize {
        self.devices.iter().position(|d| d.tail).unwrap_or(0)
    }
}

impl std::fmt::Display for Plan {
    /// A table, one row per device, as `cleave plan` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.mode != SplitMode::Layer {
            writeln!(f, "{} split, main device #0", self.mode)?;
        }
        // The runtime column where the planner knows them.
        let runtime = |runtime: &str| match self.devices.iter().any(|d| d.runtime.is_some()) {
            true => format!("{runtime:<8} "),
            false => String::new(),
        };
        writeln!(
            f,
            "{:<4} {:<12} {}{:<10} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "#",
            "device",
            runtime("runtime"),
            "blocks",
            "holds",
            "weights",
            "kv cache",
            "compute",
            "budget",
            "free after"
        )?;
        for (i, d) in self.devices.iter().enumerate() {
            let blocks = match (d.blocks.is_empty(), d.streamed.is_empty()) {
                (true, _) => "-".to_string(),
                (false, true) => format!("{}..{}", d.blocks.start, d.blocks.end),
                (false, false) => format!("{}..{}*", d.blocks.start, d.blocks.end),
            };
            let holds: Vec<&str> = [(d.head, "head"), (d.tail, "tail")]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, what)| *what)
                .collect();
            let holds = if holds.is_empty() {
                "-".to_string()
            } else {
                holds.join("+")
            };
            let budget = d.budget_bytes.map_or("-".into(), format_bytes);
            let free = d
                .budget_bytes
                .map_or("-".into(), |b| format_bytes(b.saturating_sub(d.total_bytes())));
            writeln!(
                f,
                "{:<4} {:<12} {}{:<10} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10}",
                i,
                d.name,
                runtime(d.runtime.as_deref().unwrap_or("-")),
                blocks,
                holds,
                format_bytes(d.weight_bytes),
                format_bytes(d.kv_bytes),
                format_bytes(d.compute_bytes),
                budget,
                free
            )?;
        }
        for (i, d) in self.devices.iter().enumerate() {
            if !d.streamed.is_empty() {
                writeln!(
                    f,
                    "#{i} streams blocks {}..{} from the host through {} of staging",
                    d.streamed.start,
                    d.streamed.end,
                    format_bytes(d.staging_bytes)
                )?;
            }
            if !d.rows.is_empty() {
                let slices: Vec<String> = d
                    .rows
                    .iter()
                    .map(|s| format!("{} {}..{}", s.tensor, s.rows.start, s.rows.end))
                    .collect();
                writeln!(f, "#{i} rows of every block: {}", slices.join(", "))?;
            }
            if let Some(slice) = d.experts.as_ref().filter(|s| !s.experts.is_empty()) {
                write!(
                    f,
                    "#{i} experts {}..{} of every block",
                    slice.experts.start, slice.experts.end
                )?;
                if slice.cached < slice.experts.len() {
                    write!(
                        f,
                        ", {} of them cached per block, the others uploaded from the host when routed",
                        slice.cached
                    )?;
                }
                writeln!(f)?;
            }
            if let Some(h) = &d.heads {
                writeln!(
                    f,
                    "#{i} heads {}..{} (kv {}..{}), mlp columns {}..{} of every block",
                    h.heads.start,
                    h.heads.end,
                    h.kv_heads.start,
                    h.kv_heads.end,
                    h.intermediate.start,
                    h.intermediate.end
                )?;
            }
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

/// Fails if a device of `plan` would hold more than its budget, saying
/// what it would hold.
pub(crate) fn check_budgets(plan: &Plan) -> Result<(), PlanError> {
    match plan
        .devices
        .iter()
        .find(|d| d.budget_bytes.is_some_and(|b| d.total_bytes() > b))
    {
        Some(d) => Err(PlanError::over_budget(plan, d)),
        None => Ok(()),
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum PlanError {
    #[error("{module} does not fit: {reason}")]
    DoesNotFit { module: String, reason: String },
    #[error("--tensor-split has {given} ratios but the group has {devices} devices")]
    RatioCount { given: usize, devices: usize },
    #[error("--tensor-split ratios must be finite and at least 0, not all 0, got {0:?}")]
    BadRatios(Vec<f64>),
    #[error("a device group needs at least one device")]
    EmptyGroup,
    /// Options that do not go together, named as the flags that set them.
    #[error("{0}")]
    Options(String),
    #[error("{module} cannot be split in {mode} mode: {reason}")]
    Unsupported {
        module: String,
        mode: SplitMode,
        reason: String,
    },
}

impl PlanError {
    /// `device` of `plan` would need more than its budget: what it would
    /// hold, part by part.
    pub(crate) fn over_budget(plan: &Plan, device: &DevicePlan) -> PlanError {
        let split = match plan.mode {
            SplitMode::Layer => String::new(),
            mode => format!("in {mode} split "),
        };
        PlanError::DoesNotFit {
            module: plan.module.clone(),
            reason: format!(
                "{split}{} would need {} (weights {}, KV cache {}, compute {}) but has {}",
                device.name,
                format_bytes(device.total_bytes()),
                format_bytes(device.weight_bytes),
                format_bytes(device.kv_bytes),
                format_bytes(device.compute_bytes),
                format_bytes(device.budget_bytes.unwrap_or(0)),
            ),
        }
    }
}
