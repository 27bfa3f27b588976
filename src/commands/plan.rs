use anyhow::Result;
use cleave_model::{BertConfig, EncoderDir, ModelDir, ENCODER_MODULES};
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
    let (plan, about) = if BertConfig::is_bert(&path.join("config.json")).unwrap_or(false) {
        let model = EncoderDir::open(path)?;
        let c = &model.config;
        let about = format!("BERT encoder, {} blocks, hidden {}", c.layers, c.hidden_size);
        let (plan, _) = setup::plan(&args.model.placement, path, &ENCODER_MODULES, &model.inventory())?;
        (plan, about)
    } else {
        let model = ModelDir::open(path)?;
        let (context, plan, _) = setup::plan_llm(&args.model, &model, 1)?;
        let c = &model.config;
        let about = format!(
            "{} blocks, hidden {}, vocab {}, context {context}",
            c.layers, c.hidden_size, c.vocab_size
        );
        (plan, about)
    };
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
