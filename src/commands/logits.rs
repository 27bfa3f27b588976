use anyhow::{bail, Context, Result};
use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_hf::{LoraAdapter, LoraMode};
use cleave_models::ModelDir;
use cleave_nn::Logits;
use cleave_shaders::cubecl::prelude::*;

use cleave_plan::Plan;

use crate::output::outln;
use crate::{setup, ModelArgs};

#[derive(clap::Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Token ids, comma-separated (e.g. 0,17,42).
    #[arg(long, value_delimiter = ',', required = true)]
    ids: Vec<u32>,
}

struct Task<'a> {
    adapters: &'a [LoraAdapter],
    lora_mode: LoraMode,
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    plan: Plan,
    ids: &'a [u32],
    context: usize,
}

impl RuntimeTask for Task<'_> {
    type Output = Result<Vec<f32>>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let (model, _) = setup::load(
            clients,
            self.group,
            self.plan,
            self.model,
            (self.adapters, self.lora_mode),
        )?;
        let mut ctx = model.new_context(self.context)?;
        Ok(model.forward(&mut ctx, self.ids, Logits::All)?)
    }
}

pub fn run(mut args: LogitsArgs) -> Result<()> {
    if args.ids.is_empty() {
        bail!("--ids is empty: give at least one token id");
    }
    setup::locate(&mut args.model.model, &args.model.source)?;
    // The context holds the ids and no more, unless -c asks for more:
    // nothing is generated after them.
    match args.model.ctx_size.filter(|&c| c > 0) {
        Some(c) if c < args.ids.len() => bail!(
            "--ids holds {} ids, but -c/--ctx-size holds {c}: raise it or leave it out",
            args.ids.len()
        ),
        Some(_) => {}
        None => args.model.ctx_size = Some(args.ids.len()),
    }
    let model = setup::open_model(&args.model)?;
    let max = model.max_positions();
    if args.ids.len() > max {
        bail!(
            "--ids holds {} ids, past the {max} positions the model was trained for",
            args.ids.len()
        );
    }
    let (context, plan, group) = setup::place_llm(&args.model, &model)?;
    let adapters = setup::adapters(&args.model, &model)?;
    let logits = group
        .run(Task {
            adapters: &adapters,
            lora_mode: args.model.lora_mode.into(),
            model: &model,
            group: &group,
            plan,
            ids: &args.ids,
            context,
        })
        .with_context(|| format!("running {} on {}", args.model.model.display(), group.names().join("&")))?;
    let rows: Vec<&[f32]> = logits.chunks(model.vocab_size()).collect();
    outln!("{}", serde_json::to_string(&serde_json::json!({ "logits": rows }))?)?;
    Ok(())
}
