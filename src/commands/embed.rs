use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_models::{EncoderDir, ENCODER_MODULES};
use cleave_nn::Placed;
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;

use crate::output::outln;
use crate::{setup, Format, PlacementArgs, SourceArgs};

#[derive(clap::Args)]
pub struct EmbedArgs {
    /// Encoder directory (BERT in Hugging Face / sentence-transformers
    /// layout), or a Hugging Face repo `org/name[@revision]`.
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    placement: PlacementArgs,
    /// Texts to embed; without any, one per line from stdin.
    texts: Vec<String>,
    /// Print the cosine similarity of every pair instead of the embeddings.
    #[arg(long)]
    similarity: bool,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

struct Task<'a> {
    model: &'a EncoderDir,
    group: &'a DeviceGroup,
    plan: Plan,
    ids: &'a [Vec<u32>],
}

impl RuntimeTask for Task<'_> {
    type Output = Result<Vec<Vec<f32>>>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let bar = setup::load_bar(self.model.checkpoint.total_bytes());
        let devices = Placed::group(clients, self.group);
        let encoder = self.model.load(devices, self.plan, &mut |b| bar.inc(b))?;
        bar.finish_and_clear();
        Ok(encoder.embed(self.ids)?)
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    dot / (norm(a) * norm(b))
}

pub fn run(mut args: EmbedArgs) -> Result<()> {
    let texts = if args.texts.is_empty() {
        std::io::stdin().lock().lines().collect::<Result<Vec<_>, _>>()?
    } else {
        args.texts.clone()
    };
    if texts.is_empty() {
        bail!("nothing to embed: give texts as arguments or one per line on stdin");
    }
    setup::locate(&mut args.model, &args.source)?;
    let model = EncoderDir::open(&args.model).with_context(|| format!("cannot open model {}", args.model.display()))?;
    let ids = texts
        .iter()
        .map(|t| model.tokenizer.encode(t))
        .collect::<Result<Vec<_>, _>>()?;
    let (plan, group) = setup::place(&args.placement, &args.model, &ENCODER_MODULES, &model.inventory())?;
    let embeddings = group.run(Task {
        model: &model,
        group: &group,
        plan,
        ids: &ids,
    })?;
    let rows: Vec<Vec<f32>> = if args.similarity {
        embeddings
            .iter()
            .map(|a| embeddings.iter().map(|b| cosine(a, b)).collect())
            .collect()
    } else {
        embeddings
    };
    match (args.format, args.similarity) {
        (Format::Json, false) => outln!("{}", serde_json::json!({ "embeddings": rows }))?,
        (Format::Json, true) => outln!("{}", serde_json::json!({ "similarity": rows }))?,
        (Format::Text, _) => {
            for row in rows {
                let cells: Vec<String> = row.iter().map(|v| format!("{v:.4}")).collect();
                outln!("{}", cells.join(" "))?;
            }
        }
    }
    Ok(())
}
