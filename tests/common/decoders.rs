//! The tiny decoder fixtures, as decoders.txt (beside this file) lists
//! them: the one table the tests that sweep the decoder families read.

use cleave_plan::SplitMode;

/// One fixture's line of the table.
#[derive(Clone, Debug)]
pub struct DecoderFixture {
    pub name: &'static str,
    pub family: &'static str,
    pub block: Block,
    /// `(devices, mode)` of each group tests/batch.rs decodes on.
    pub batch: Vec<(usize, SplitMode)>,
}

/// What a fixture's blocks hold beyond Llama's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// q, k and v stacked at load (with Qwen2's biases, Qwen3's head norms).
    Plain,
    /// Phi-3's fused projections.
    Fused,
    /// Gemma's four norms and two rotary tables.
    Norms,
    /// A mixture of experts.
    Experts,
    /// Gated DeltaNet layers, each with a recurrent state, among the
    /// attention layers.
    Hybrid,
    /// Those with a mixture of experts.
    HybridExperts,
    /// Gemma 4's: per-layer inputs, full layers with heads of their own
    /// size, layers reading an earlier layer's KV cache.
    Uneven,
    /// Those with experts beside the MLP.
    UnevenExperts,
}

impl Block {
    pub fn has_experts(self) -> bool {
        matches!(self, Block::Experts | Block::HybridExperts | Block::UnevenExperts)
    }

    /// Whether its blocks differ from one another, so that row and tensor
    /// split, which cut every block alike, do not cut them.
    pub fn is_uneven(self) -> bool {
        matches!(self, Block::Uneven | Block::UnevenExperts)
    }

    /// Whether some blocks are Gated DeltaNet layers, which tensor split
    /// does not cut.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Block::Hybrid | Block::HybridExperts)
    }
}

/// Every fixture of the table, in its order. A malformed line fails the
/// test that reads it, naming the line.
pub fn decoders() -> Vec<DecoderFixture> {
    include_str!("decoders.txt")
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|(i, line)| parse(line).unwrap_or_else(|| panic!("tests/common/decoders.txt:{}: {line:?}", i + 1)))
        .collect()
}

/// The first fixture of each family, standing for it.
pub fn one_per_family() -> Vec<DecoderFixture> {
    let mut firsts: Vec<DecoderFixture> = Vec::new();
    for fixture in decoders() {
        if !firsts.iter().any(|f| f.family == fixture.family) {
            firsts.push(fixture);
        }
    }
    firsts
}

fn parse(line: &'static str) -> Option<DecoderFixture> {
    let mut columns = line.split_whitespace();
    let (name, family, block) = (columns.next()?, columns.next()?, columns.next()?);
    let block = match block {
        "plain" => Block::Plain,
        "fused" => Block::Fused,
        "norms" => Block::Norms,
        "experts" => Block::Experts,
        "hybrid" => Block::Hybrid,
        "hybrid-experts" => Block::HybridExperts,
        "uneven" => Block::Uneven,
        "uneven-experts" => Block::UnevenExperts,
        _ => return None,
    };
    let batch = columns.collect::<Vec<_>>().join(" ");
    let batch = match batch.as_str() {
        "-" => Vec::new(),
        groups => groups.split(',').map(group).collect::<Option<_>>()?,
    };
    Some(DecoderFixture {
        name,
        family,
        block,
        batch,
    })
}

/// `"2 tensor"` as `(2, SplitMode::Tensor)`.
fn group(text: &str) -> Option<(usize, SplitMode)> {
    let (devices, mode) = text.trim().split_once(' ')?;
    let mode = match mode {
        "layer" => SplitMode::Layer,
        "row" => SplitMode::Row,
        "tensor" => SplitMode::Tensor,
        "expert" => SplitMode::Expert,
        _ => return None,
    };
    Some((devices.parse().ok()?, mode))
}
