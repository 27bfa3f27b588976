use anyhow::Result;
use cleave_model::{BertConfig, EncoderDir, ModelDir, ENCODER_MODULES, LLM_MODULES};
use cleave_plan::format_bytes;

use crate::{setup, Format, ModelArgs};

#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

pub fn run(args: PlanArgs) -> Result<()> {
    let path = &args.model.model;
    // An encoder directory is planned as its `te` module, anything else as
    // a language model (whose loader explains what is wrong with it).
    let (inventory, modules, about) = if BertConfig::is_bert(&path.join("config.json")).unwrap_or(false) {
        let model = EncoderDir::open(path)?;
        let c = &model.config;
        let about = format!("BERT encoder, {} blocks, hidden {}", c.layers, c.hidden_size);
        (model.inventory(), &ENCODER_MODULES[..], about)
    } else {
        let model = ModelDir::open(path)?;
        let context = setup::context_size(&args.model, &model);
        let c = &model.config;
        let about = format!(
            "{} blocks, hidden {}, vocab {}, context {context}",
            c.layers, c.hidden_size, c.vocab_size
        );
        (model.inventory(context), &LLM_MODULES[..], about)
    };
    let (plan, _) = setup::plan(&args.model.placement, path, modules, &inventory)?;
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
        Format::Text => {
            let weights = format_bytes(plan.devices.iter().map(|d| d.weight_bytes).sum());
            println!(
                "{} ({about}): module {}, {weights} of weights",
                path.display(),
                plan.module
            );
            print!("{plan}");
        }
    }
    Ok(())
}
