use anyhow::{bail, Result};
use cleave_hf::LoraMode;
use cleave_models::{EncoderDir, FluxDir, ENCODER_MODULES, FLUX_MODULES};
use cleave_plan::format_bytes;
use serde_json::json;

use cleave_source::{OllamaModel, Origin};

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

pub fn run(mut args: PlanArgs) -> Result<()> {
    let origin = setup::locate(&mut args.model.model, &args.model.source)?;
    let path = &args.model.model;
    // The precision decides the products' scratch, which the plan counts.
    cleave_shaders::set_precision(args.model.precision.map(Into::into));
    // A pipeline directory is planned module by module, an encoder
    // directory as its `te` module, anything else as a language model
    // (whose loader explains what is wrong with it).
    let plans = if path.join("model_index.json").is_file() {
        refuse_lora(&args.model, "a FLUX pipeline")?;
        let dir = FluxDir::open(path)?;
        let (height, width) = FLUX_PLAN_SIZE;
        FLUX_MODULES
            .iter()
            .map(|module| {
                let inventory = dir.inventory(module, (height, width), FLUX_PLAN_TEXT_TOKENS)?;
                let (plan, specs) = setup::plan(&args.model.placement, path, &FLUX_MODULES, &inventory)?;
                let about = format!("FLUX.1 pipeline, {width}x{height}, {FLUX_PLAN_TEXT_TOKENS} text tokens");
                Ok((plan, specs, about, Vec::new()))
            })
            .collect::<Result<Vec<_>>>()?
    } else if EncoderDir::recognizes(path) {
        refuse_lora(&args.model, "an encoder")?;
        let model = EncoderDir::open(path)?;
        let about = model.describe();
        let (plan, specs) = setup::plan(&args.model.placement, path, &ENCODER_MODULES, &model.inventory())?;
        vec![(plan, specs, about, Vec::new())]
    } else {
        let model = setup::open_model_dir(&args.model)?;
        // Refused here as `run` would refuse them.
        let adapters = setup::adapters(&args.model, &model)?;
        let (context, plan, specs) = setup::plan_llm(&args.model, &model, 1)?;
        let types: Vec<&str> = model.checkpoint.weight_types().iter().map(|ty| ty.name()).collect();
        let about = format!(
            "{}, context {context}, weights stored as {}",
            model.describe(),
            types.join(", ")
        );
        vec![(plan, specs, about, adapters)]
    };
    // How each device would form its prefill products: the devices are
    // opened (nothing is loaded) to ask whether they have matrix units.
    let plans = plans
        .into_iter()
        .map(|(plan, specs, about, adapters)| {
            let precisions = setup::product_precisions(&cleave_device::open_group(&specs)?);
            Ok((plan, precisions, about, adapters))
        })
        .collect::<Result<Vec<_>>>()?;
    match args.format {
        Format::Json => {
            let plans = plans
                .iter()
                .map(|(plan, precisions, _, adapters)| {
                    let mut json = serde_json::to_value(plan)?;
                    json["prefill_products"] = precisions
                        .iter()
                        .map(|(name, p)| json!({"device": name, "precision": p.precision.name(), "how": p.how}))
                        .collect();
                    if !adapters.is_empty() {
                        json["lora"] = adapters
                            .iter()
                            .map(|a| {
                                json!({"path": a.path, "rank": a.rank(), "scale": a.scale(), "updates": a.updates(),
                                       "bytes": a.bytes()})
                            })
                            .collect();
                    }
                    Ok(json)
                })
                .collect::<Result<Vec<_>>>()?;
            match plans.as_slice() {
                [plan] => outln!("{}", serde_json::to_string_pretty(plan)?)?,
                plans => outln!("{}", serde_json::to_string_pretty(plans)?)?,
            }
        }
        Format::Text => {
            for (plan, precisions, about, adapters) in &plans {
                let weights = format_bytes(plan.devices.iter().map(|d| d.weight_bytes).sum());
                outln!(
                    "{} ({about}): module {}, {weights} of weights",
                    path.display(),
                    plan.module
                )?;
                out!("{plan}")?;
                for (name, precision) in precisions {
                    outln!("{name}: {precision}")?;
                }
                for adapter in adapters {
                    outln!(
                        "LoRA adapter {}: {} updates of rank {}, scale {}, {} of factors, {}",
                        adapter.path.display(),
                        adapter.updates(),
                        adapter.rank(),
                        adapter.scale(),
                        format_bytes(adapter.bytes()),
                        lora_placement(args.model.lora_mode.into())
                    )?;
                }
            }
            if let Origin::Ollama(ollama) = &origin {
                outln!("{}", ollama_notes(ollama))?;
            }
        }
    }
    Ok(())
}

/// `--lora` is for language models: a pipeline or an encoder would be
/// planned, and later run, without it.
fn refuse_lora(args: &ModelArgs, what: &str) -> Result<()> {
    match args.lora.first() {
        Some(adapter) => bail!(
            "--lora {adapter}: adapters apply to language models; {} is {what}",
            args.model.display()
        ),
        None => Ok(()),
    }
}

/// Where an adapter's factors are held in `mode`, said with the plan:
/// beside a weight they take device memory its budgets do not count.
fn lora_placement(mode: LoraMode) -> &'static str {
    match mode {
        LoraMode::Direct => "merged into the weights at load",
        LoraMode::Runtime => "held beside the weights on their devices, in memory the budgets above do not count",
        LoraMode::Auto => {
            "merged into the f32 weights a device holds whole; beside any other (16-bit, quantized or split) \
             weight they take device memory the budgets above do not count"
        }
    }
}

/// What an ollama model's manifest sets besides its weights, and what
/// cleave makes of it.
fn ollama_notes(ollama: &OllamaModel) -> String {
    let mut notes = Vec::new();
    if ollama.has_template {
        notes.push("its Go chat template is not used (the GGUF's tokenizer.chat_template is)".to_string());
    }
    let params = serde_json::to_value(&ollama.params).unwrap_or_default();
    let set: Vec<String> = params
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !set.is_empty() {
        notes.push(format!(
            "parameters {} (cleave run takes those it has flags for in place of the flags not given, and refuses \
             what those flags would refuse)",
            set.join(" ")
        ));
    }
    match notes.is_empty() {
        true => "ollama model: no template or parameters".into(),
        false => format!("ollama model: {}", notes.join("; ")),
    }
}
