use anyhow::Result;
use cleave_engine::{FluxDir, FLUX_MODULES};
use cleave_models::{EncoderDir, Family, ModelDir, ENCODER_MODULES};
use cleave_plan::format_bytes;

use crate::output::{out, outln};
use crate::{setup, Format, ModelArgs};

#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// A FLUX pipeline is planned for diffusers' default call: 1024×1024 pixels,
/// a T5 sequence of 512 tokens.
const FLUX_PLAN_SIZE: (usize, usize) = (1024, 1024);
const FLUX_PLAN_TEXT_TOKENS: usize = 512;

pub fn run(args: PlanArgs) -> Result<()> {
    let path = &args.model.model;
    // A pipeline directory is planned module by module, an encoder
    // directory as its `te` module, anything else as a language model
    // (whose loader explains what is wrong with it).
    let plans = if path.join("model_index.json").is_file() {
        let dir = FluxDir::open(path)?;
        let (height, width) = FLUX_PLAN_SIZE;
        FLUX_MODULES
            .iter()
            .map(|module| {
                let inventory = dir.inventory(module, (height, width), FLUX_PLAN_TEXT_TOKENS)?;
                let (plan, _) = setup::plan(&args.model.placement, path, &FLUX_MODULES, &inventory)?;
                let about = format!("FLUX.1 pipeline, {width}x{height}, {FLUX_PLAN_TEXT_TOKENS} text tokens");
                Ok((plan, about))
            })
            .collect::<Result<Vec<_>>>()?
    } else if Family::of_config(&path.join("config.json"), &[Family::Bert]).is_ok() {
        let model = EncoderDir::open(path)?;
        let c = &model.config;
        let about = format!("BERT encoder, {} blocks, hidden {}", c.layers, c.hidden_size);
        let (plan, _) = setup::plan(&args.model.placement, path, &ENCODER_MODULES, &model.inventory())?;
        vec![(plan, about)]
    } else {
        let model = ModelDir::open(path)?;
        let (context, plan, _) = setup::plan_llm(&args.model, &model, 1)?;
        let c = &model.config;
        let mut types: Vec<&str> = model
            .checkpoint
            .names()
            .filter_map(|name| model.checkpoint.dtype(name).map(|d| d.name()))
            .collect();
        types.sort_unstable();
        types.dedup();
        let about = format!(
            "{} blocks, hidden {}, vocab {}, context {context}, weights stored as {}",
            c.layers,
            c.hidden_size,
            c.vocab_size,
            types.join(", ")
        );
        vec![(plan, about)]
    };
    match args.format {
        Format::Json => match plans.as_slice() {
            [(plan, _)] => outln!("{}", serde_json::to_string_pretty(plan)?)?,
            plans => {
                let plans: Vec<_> = plans.iter().map(|(plan, _)| plan).collect();
                outln!("{}", serde_json::to_string_pretty(&plans)?)?
            }
        },
        Format::Text => {
            for (plan, about) in &plans {
                let weights = format_bytes(plan.devices.iter().map(|d| d.weight_bytes).sum());
                outln!(
                    "{} ({about}): module {}, {weights} of weights",
                    path.display(),
                    plan.module
                )?;
                out!("{plan}")?;
            }
        }
    }
    Ok(())
}
