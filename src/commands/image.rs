use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use cleave_device::DeviceGroup;
use cleave_diffusion::image::RgbImage;
use cleave_engine::{generate_image, FluxPlacement, ImageProgress, ImageSettings};
use cleave_models::FluxDir;
use cleave_nn::ModelError;
use cleave_plan::Plan;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{parse, setup, PlacementArgs, PrecisionArg, SourceArgs};

#[derive(clap::Args)]
pub struct ImageArgs {
    /// A FLUX.1 pipeline directory as diffusers saves it (model_index.json,
    /// transformer/, vae/, text_encoder/, text_encoder_2/, tokenizer/,
    /// tokenizer_2/, scheduler/), or a Hugging Face repo
    /// `org/name[@revision]` holding one.
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    placement: PlacementArgs,
    /// The prompt.
    #[arg(short = 'p', long = "prompt", value_parser = parse::image_prompt)]
    prompt: String,
    /// Where to write the PNG.
    #[arg(short = 'o', long = "output", default_value = "output.png")]
    output: PathBuf,
    /// Image height in pixels (rounded down to a multiple of 16).
    #[arg(short = 'H', long, default_value_t = ImageSettings::DEFAULT_SIDE, value_parser = parse::image_side, allow_negative_numbers = true)]
    height: usize,
    /// Image width in pixels (rounded down to a multiple of 16).
    #[arg(short = 'W', long, default_value_t = ImageSettings::DEFAULT_SIDE, value_parser = parse::image_side, allow_negative_numbers = true)]
    width: usize,
    /// Denoising steps.
    #[arg(long, default_value_t = ImageSettings::DEFAULT_STEPS, value_parser = parse::steps, allow_negative_numbers = true)]
    steps: usize,
    /// Embedded guidance scale (FLUX.1-dev).
    #[arg(long, default_value_t = ImageSettings::DEFAULT_GUIDANCE, allow_negative_numbers = true, value_parser = parse::non_negative_within_f32)]
    guidance: f64,
    /// T5 tokens the prompt is padded or cut to.
    #[arg(long = "max-sequence-length", default_value_t = ImageSettings::MAX_T5_TOKENS, value_parser = parse::t5_tokens, allow_negative_numbers = true)]
    max_sequence_length: usize,
    /// Seed of the initial noise.
    #[arg(short = 's', long, default_value_t = 42, allow_negative_numbers = true, value_parser = parse::count::<u64>)]
    seed: u64,
    /// Where the noise comes from: `torch-cpu` draws exactly what
    /// `torch.randn(.., generator=torch.Generator("cpu").manual_seed(seed))`
    /// does, so a seed gives the image diffusers gives.
    #[arg(long, value_enum, default_value_t)]
    rng: Rng,
    /// The transformer's and the VAE's products (and attention's):
    /// `fast` rounds their inputs to the weights' 16-bit type and sums in
    /// f32, on matrix units where the device has them, as diffusers does
    /// in bf16 on GPUs; `exact` multiplies f32 inputs. f32 weights are
    /// multiplied exactly either way. Default: fast on devices with matrix
    /// units, else exact.
    #[arg(long = "precision", value_enum)]
    precision: Option<PrecisionArg>,
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
enum Rng {
    #[default]
    TorchCpu,
}

/// Runs the pipeline, each module on its own group, telling `bar` how far
/// it is.
fn draw(
    dir: &FluxDir,
    groups: &[DeviceGroup],
    plans: Vec<Plan>,
    settings: &ImageSettings,
    bar: &ProgressBar,
) -> Result<Vec<f32>, ModelError> {
    let mut placement = FluxPlacement::open(groups, plans)?;
    placement.arm_faults("0")?;
    let (image, _) = generate_image(dir, placement, settings, &mut |progress| match progress {
        ImageProgress::Encoded => {
            bar.set_message("denoising");
            ControlFlow::Continue(())
        }
        ImageProgress::Step { index, steps, .. } => {
            bar.set_length(steps as u64);
            bar.set_position(index as u64 + 1);
            ControlFlow::Continue(())
        }
    })?;
    Ok(image)
}

/// Fails before any work, not after it, when the PNG cannot be written
/// there: a missing or read-only folder, a directory under the name. The
/// file is opened for writing without truncating it, and removed again if
/// this made it.
fn check_writable(output: &Path) -> Result<()> {
    let folder = output.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(folder) = folder.filter(|f| !f.is_dir()) {
        bail!(
            "cannot write {}: {} is not a directory",
            output.display(),
            folder.display()
        );
    }
    if output.is_dir() {
        bail!("cannot write {}: it is a directory", output.display());
    }
    let existed = output.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    if !existed {
        let _ = std::fs::remove_file(output);
    }
    Ok(())
}

pub fn run(mut args: ImageArgs) -> Result<()> {
    check_writable(&args.output)?;
    setup::locate(&mut args.model, &args.source)?;
    let dir = FluxDir::open(&args.model).with_context(|| format!("cannot open pipeline {}", args.model.display()))?;
    let size = (args.height, args.width);
    let scale = dir.latents.pixels_per_patch();
    let (height, width) = (args.height / scale * scale, args.width / scale * scale);
    if height == 0 || width == 0 {
        bail!(
            "-H and -W must be at least {scale} pixels for this pipeline (got {}x{})",
            args.width,
            args.height
        );
    }
    if (height, width) != size {
        eprintln!("the image is {width}x{height}: sides are rounded down to a multiple of {scale}");
    }
    // The precision decides the products' scratch, which the plans count.
    cleave_shaders::set_precision(args.precision.map(Into::into));
    let mut plans = Vec::new();
    let mut groups = Vec::new();
    for (plan, specs) in setup::plan_pipeline(&args.placement, &dir, (height, width), args.max_sequence_length)? {
        plans.push(plan);
        groups.push(cleave_device::open_group(&specs)?);
    }
    setup::announce_precision(&groups);
    let settings = ImageSettings {
        prompt: args.prompt.clone(),
        height,
        width,
        steps: args.steps,
        guidance: args.guidance,
        max_sequence_length: args.max_sequence_length,
        seed: args.seed,
    };
    let bar = ProgressBar::new(args.steps as u64).with_style(
        ProgressStyle::with_template("{msg:>10} {bar:30} step {pos}/{len} {elapsed_precise} ({per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("encoding");
    let start = Instant::now();
    let decoded =
        draw(&dir, &groups, plans, &settings, &bar).with_context(|| format!("running {}", args.model.display()))?;
    bar.finish_and_clear();
    let image = RgbImage::from_decoded(&decoded, height, width).map_err(|e| anyhow!(e))?;
    let parameters = settings.parameters(&dir.name());
    image.write_png(&args.output, &parameters).map_err(|e| anyhow!(e))?;
    eprintln!(
        "{} ({width}x{height}, {} steps, seed {}) in {:.2} s",
        args.output.display(),
        settings.steps,
        settings.seed,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
