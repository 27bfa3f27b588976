use anyhow::Result;
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
    let (model, context, plan, _) = setup::plan(&args.model)?;
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
        Format::Text => {
            let c = &model.config;
            println!(
                "{} ({} blocks, hidden {}, vocab {}), context {context}: {} of weights",
                model.path.display(),
                c.layers,
                c.hidden_size,
                c.vocab_size,
                format_bytes(plan.devices.iter().map(|d| d.weight_bytes).sum()),
            );
            print!("{plan}");
        }
    }
    Ok(())
}
