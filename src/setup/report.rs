//! Telling the user where a model went: the placement in one line, the
//! plan's notes, and the precision of each group's products.

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_plan::{DevicePlan, Plan, SplitMode};
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::Precision;

/// Tells stderr the placement in one line, and what the plan notes.
pub fn announce(plan: &Plan) {
    eprintln!("{}", summary(plan));
    for note in &plan.notes {
        eprintln!("note: {note}");
    }
}

/// One line: which device runs what.
pub fn summary(plan: &Plan) -> String {
    // Each device's runtime where they differ: the activations cross
    // between runtimes through the host.
    let spans_runtimes = plan.devices.windows(2).any(|pair| pair[0].runtime != pair[1].runtime);
    let label = |d: &DevicePlan| match (&d.runtime, spans_runtimes) {
        (Some(runtime), true) => format!("{} ({runtime})", d.name),
        _ => d.name.clone(),
    };
    let parts: Vec<String> = plan
        .devices
        .iter()
        .filter(|d| d.is_used())
        .map(|d| {
            let mut part = format!("{} blocks {}..{}", label(d), d.blocks.start, d.blocks.end);
            for (on, what) in [(d.head, "head"), (d.tail, "tail")] {
                if on {
                    part.push_str(&format!(" +{what}"));
                }
            }
            part
        })
        .collect();
    match plan.mode {
        SplitMode::Layer => {
            let streamed: usize = plan.devices.iter().map(|d| d.streamed.len()).sum();
            let streaming = if streamed > 0 {
                format!(" ({streamed} blocks streamed from the host)")
            } else {
                String::new()
            };
            format!("{}: {}{streaming}", plan.module, parts.join(" | "))
        }
        mode => {
            let names: Vec<String> = plan.devices.iter().map(label).collect();
            let experts: Vec<String> = plan
                .devices
                .iter()
                .enumerate()
                .filter_map(|(i, d)| Some((i, d, d.experts.as_ref().filter(|s| !s.experts.is_empty())?)))
                .map(|(i, d, s)| {
                    let cached = if s.cached < s.experts.len() {
                        format!(", {} cached per block", s.cached)
                    } else {
                        String::new()
                    };
                    format!("#{i} {} experts {}..{}{cached}", d.name, s.experts.start, s.experts.end)
                })
                .collect();
            let experts = if experts.is_empty() {
                String::new()
            } else {
                format!(" ({})", experts.join(" | "))
            };
            format!(
                "{}: {mode} split over {}, main {}{experts}",
                plan.module,
                names.join("&"),
                names[0]
            )
        }
    }
}

/// Says on stderr how each device of `groups` forms prefill products, once
/// a device.
pub fn announce_precision(groups: &[DeviceGroup]) {
    let mut said = std::collections::BTreeSet::new();
    for (name, precision) in groups.iter().flat_map(product_precisions) {
        if said.insert(name.clone()) {
            eprintln!("{name}: {precision}");
        }
    }
}

/// How each member of `group` forms its prefill products, by name.
pub fn product_precisions(group: &DeviceGroup) -> Vec<(String, ProductPrecision)> {
    group
        .slots()
        .iter()
        .flat_map(|slot| slot.group.run(ProductPrecisions { group: &slot.group }))
        .collect()
}

/// How each member of a group of one runtime forms its prefill products.
struct ProductPrecisions<'a> {
    group: &'a DeviceGroup,
}

impl RuntimeTask for ProductPrecisions<'_> {
    type Output = Vec<(String, ProductPrecision)>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let precisions = clients.iter().map(ProductPrecision::of);
        self.group.names().into_iter().zip(precisions).collect()
    }
}

/// How a device forms prefill products: the precision, and how it gets
/// there on this device.
#[derive(Clone, Debug)]
pub struct ProductPrecision {
    pub precision: Precision,
    pub how: String,
}

impl ProductPrecision {
    pub fn of<R: Runtime>(client: &ComputeClient<R>) -> ProductPrecision {
        let precision = cleave_shaders::precision_for(client);
        let matrix_units = cleave_shaders::default_precision(client) == Precision::Fast;
        let how = match (precision, matrix_units) {
            (Precision::Fast, true) => format!(
                "16-bit inputs on matrix units by {}, f32 sums",
                cleave_shaders::matrix_unit_library(client)
            ),
            (Precision::Fast, false) => "16-bit inputs rounded, f32 sums (no matrix units)".into(),
            (Precision::Exact, _) => "f32 inputs and sums".into(),
        };
        ProductPrecision { precision, how }
    }
}

impl std::fmt::Display for ProductPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "prefill products {} ({})", self.precision.name(), self.how)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The placement line names each device's runtime where the group
    /// spans several, and only there.
    #[test]
    fn the_placement_line_names_runtimes_where_they_differ() {
        let device = |name: &str, runtime: &str, blocks| DevicePlan {
            name: name.into(),
            runtime: Some(runtime.into()),
            blocks,
            head: false,
            tail: false,
            weight_bytes: 0,
            kv_bytes: 0,
            compute_bytes: 0,
            budget_bytes: None,
            rows: Vec::new(),
            heads: None,
            streamed: 0..0,
            staging_bytes: 0,
            experts: None,
        };
        let plan = |second: &str| Plan {
            module: "llm".into(),
            mode: SplitMode::Layer,
            devices: vec![device("cuda0", "cuda", 0..2), device("vulkan1", second, 2..4)],
            notes: Vec::new(),
        };
        assert_eq!(
            summary(&plan("wgpu")),
            "llm: cuda0 (cuda) blocks 0..2 | vulkan1 (wgpu) blocks 2..4"
        );
        assert_eq!(summary(&plan("cuda")), "llm: cuda0 blocks 0..2 | vulkan1 blocks 2..4");
    }
}
