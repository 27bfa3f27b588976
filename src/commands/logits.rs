use anyhow::{bail, Context, Result};
use cleave_device::RuntimeTask;
use cleave_model::{Logits, ModelDir};
use cleave_shaders::cubecl::prelude::*;

use crate::{progress, ModelArgs};

#[derive(clap::Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Token ids, comma-separated (e.g. 0,17,42).
    #[arg(long, value_delimiter = ',', required = true)]
    ids: Vec<u32>,
}

struct Task<'a> {
    model: &'a ModelDir,
    ids: &'a [u32],
    context: usize,
}

impl RuntimeTask for Task<'_> {
    type Output = Result<Vec<f32>>;

    fn run<R: Runtime>(self, client: ComputeClient<R>) -> Self::Output {
        let (llama, _) = progress::load(client, self.model)?;
        let mut ctx = llama.new_context(self.context);
        Ok(llama.forward(&mut ctx, self.ids, Logits::All)?)
    }
}

pub fn run(args: LogitsArgs) -> Result<()> {
    if args.ids.is_empty() {
        bail!("--ids is empty: give at least one token id");
    }
    let (model, device) = progress::open(&args.model)?;
    let context = progress::context_size(&args.model, &model).max(args.ids.len());
    let logits = device
        .run(Task {
            model: &model,
            ids: &args.ids,
            context,
        })
        .with_context(|| {
            format!(
                "running {} on {}",
                args.model.model.display(),
                device.info.name
            )
        })?;
    let rows: Vec<&[f32]> = logits.chunks(model.config.vocab_size).collect();
    println!(
        "{}",
        serde_json::to_string(&serde_json::json!({ "logits": rows }))?
    );
    Ok(())
}
