use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use cleave_device::{parse_bytes, MemberSpec};
use cleave_engine::{ImageSettings, ModuleResidency};
use cleave_models::{EncoderDir, FluxDir, ENCODER_MODULES, FLUX_MODULES, LLM_MODULES};
use cleave_plan::{format_bytes, Plan};
use cleave_server::{
    start_embedding_replica, start_image_replica, start_replica, ChatRenderer, ChatTemplate, ConnectionLimits,
    Dispatcher, RenderLimits,
};
use cleave_server::{
    EmbeddingReplicaConfig, EmbeddingService, ImageReplicaConfig, ImageService, ReplicaConfig, ServeOptions, Served,
    TextService, ToolFormat,
};
use cleave_source::Origin;

use crate::{parse, setup, ModelArgs, PrefillArgs};

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prefill: PrefillArgs,
    /// Device groups, one replica of the model each, separated by `;`:
    /// `cuda0&cuda1;cuda2&cuda3` (each group as --backend takes it; for a
    /// FLUX pipeline, per module: `diffusion=cuda0&cuda1,te=cuda2,...`).
    /// Default: one group, from --backend or the best devices.
    #[arg(long)]
    groups: Option<String>,
    /// Sequences each replica decodes together.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    parallel: usize,
    /// Requests each replica keeps waiting beyond those; more get 503.
    #[arg(long, default_value_t = 32, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    queue: usize,
    /// Address to listen on; 0.0.0.0 serves every network.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8080, allow_negative_numbers = true, value_parser = parse::count::<u16>)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 and /metrics.
    #[arg(long, env = "CLEAVE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Serve /metrics without the API key (for a scraper inside a trusted
    /// network).
    #[arg(long)]
    metrics_public: bool,
    /// Largest request body (e.g. 512KiB, 4MiB).
    #[arg(long, default_value = "4MiB")]
    max_body: String,
    /// Seconds a request's headers, and then its body, may take to arrive;
    /// a keep-alive connection idle this long is closed.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600), allow_negative_numbers = true)]
    read_timeout: u64,
    /// Connections open at once; one more gets 503 and is closed.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000), allow_negative_numbers = true)]
    max_connections: u64,
    /// Seconds running requests may go on after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = parse::count::<u64>)]
    shutdown_timeout: u64,
    /// The model's name in the API (default: its directory's name).
    #[arg(long)]
    alias: Option<String>,
    /// FLUX pipelines: the largest image a request may ask for, WIDTHxHEIGHT
    /// (the devices are planned for it).
    #[arg(long = "max-image-size", default_value = "1024x1024", value_parser = parse_image_size)]
    max_image_size: (usize, usize),
    /// FLUX pipelines: `loaded` keeps all four modules on their devices,
    /// `on-use` loads each just before it runs (as `cleave image` does),
    /// `auto` keeps them loaded when the devices have room for all of them.
    #[arg(long = "pipeline-modules", value_enum, default_value_t)]
    pipeline_modules: PipelineModules,
    /// How the model writes tool calls: `hermes` (`<tool_call>{...}</tool_call>`,
    /// Qwen's templates), `mistral` (`[TOOL_CALLS][{...}]`, Mistral 7B v0.3's
    /// and Nemo's) or `llama3-json` (`{"name", "parameters"}`, Llama 3's); by
    /// default read from its chat template.
    #[arg(long = "tool-format", value_enum)]
    tool_format: Option<ToolFormatArg>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ToolFormatArg {
    Hermes,
    Mistral,
    Llama3Json,
}

impl From<ToolFormatArg> for ToolFormat {
    fn from(format: ToolFormatArg) -> Self {
        match format {
            ToolFormatArg::Hermes => ToolFormat::Hermes,
            ToolFormatArg::Mistral => ToolFormat::Mistral,
            ToolFormatArg::Llama3Json => ToolFormat::Llama3Json,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
enum PipelineModules {
    #[default]
    Auto,
    Loaded,
    OnUse,
}

/// `--max-image-size`: `WIDTHxHEIGHT`, each side 16 to 16384 pixels.
fn parse_image_size(text: &str) -> Result<(usize, usize), String> {
    let (width, height) = text
        .split_once('x')
        .ok_or_else(|| format!("'{text}' is not WIDTHxHEIGHT (e.g. 1024x1024)"))?;
    let side = |s: &str| match crate::parse::image_side(s)? {
        v if v < 16 => Err(format!("{v} is less than 16 pixels")),
        v => Ok(v),
    };
    Ok((side(width)?, side(height)?))
}

pub fn run(mut args: ServeArgs) -> Result<()> {
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    // Each would start a server that refuses every request.
    if args.api_key.as_deref() == Some("") {
        bail!("--api-key (or CLEAVE_API_KEY) is empty: no request could match it; give a key or leave it out");
    }
    if args.alias.as_deref().is_some_and(|alias| alias.trim().is_empty()) {
        bail!("--alias is empty: give the name the API should serve the model by");
    }
    let spec = args.model.model.to_string_lossy().into_owned();
    // A model named rather than pointed to is served by its name.
    if !matches!(setup::locate(&mut args.model.model, &args.model.source)?, Origin::Path) {
        let name = spec.strip_prefix("ollama:").unwrap_or(&spec);
        args.alias.get_or_insert_with(|| name.to_string());
    }
    let max_body = parse_bytes(&args.max_body)
        .ok_or_else(|| anyhow!("--max-body: '{}' is not a size (e.g. 4MiB)", args.max_body))?;
    if max_body == 0 {
        bail!("--max-body is 0 bytes: every request has a body; give a size such as 4MiB");
    }
    let address = SocketAddr::new(args.host, args.port);
    let listener = TcpListener::bind(address).with_context(|| format!("cannot listen on {address}"))?;
    let specs: Vec<Option<String>> = match &args.groups {
        Some(groups) => groups.split(';').map(|g| Some(g.trim().to_string())).collect(),
        None => vec![args.model.placement.backend.clone()],
    };
    let cancel = Arc::new(AtomicBool::new(false));
    // A FLUX pipeline directory has model_index.json, a sentence
    // encoder's config names BERT; anything else is opened as a language
    // model.
    let (served, what) = if args.model.model.join("model_index.json").is_file() {
        serve_images(&args, specs, cancel)?
    } else if EncoderDir::recognizes(&args.model.model) {
        serve_embeddings(&args, specs, cancel)?
    } else {
        serve_text(&args, specs, cancel)?
    };
    let model_id = args.alias.clone().unwrap_or_else(|| {
        let path = args
            .model
            .model
            .canonicalize()
            .unwrap_or_else(|_| args.model.model.clone());
        path.file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned())
    });
    let options = ServeOptions {
        listener,
        api_key: args.api_key.clone(),
        metrics_public: args.metrics_public,
        max_body: usize::try_from(max_body).context("--max-body is larger than this machine's memory")?,
        body_timeout: Duration::from_secs(args.read_timeout),
        connections: ConnectionLimits {
            max_connections: args.max_connections as usize,
            header_timeout: Duration::from_secs(args.read_timeout),
        },
        shutdown_deadline: Duration::from_secs(args.shutdown_timeout),
        model_id: model_id.clone(),
    };
    cleave_server::serve(options, served, |address| {
        eprintln!("serving {model_id} on http://{address}/v1 ({what})");
    })
    .context("serving")?;
    eprintln!("stopped");
    Ok(())
}

/// A replica of the language model on each group; what the server serves,
/// and how it is served in words.
fn serve_text(args: &ServeArgs, specs: Vec<Option<String>>, cancel: Arc<AtomicBool>) -> Result<(Served, String)> {
    let model = Arc::new(setup::open_model(&args.model)?);
    let adapters = setup::adapters(&args.model, &model)?;
    let mut replicas = Vec::new();
    let mut context = usize::MAX;
    let elsewhere = setup::elsewhere(&args.model.placement, &specs, &args.model.model, &LLM_MODULES)?;
    for (i, (spec, elsewhere)) in specs.into_iter().zip(elsewhere).enumerate() {
        let mut group_args = args.model.clone();
        group_args.placement.backend = spec;
        group_args.placement.elsewhere = elsewhere;
        let (group_context, plan, members) = setup::plan_llm(&group_args, &model, args.parallel)?;
        let group = cleave_device::open_group(&members)?;
        let name = format!("{i}");
        eprintln!("group {name}: {}", setup::summary(&plan));
        let config = ReplicaConfig {
            name,
            group,
            plan,
            context: group_context,
            parallel: args.parallel,
            queue_limit: args.queue,
            adapters: adapters.clone(),
            lora_mode: args.model.lora_mode.into(),
            prefill: args.prefill.chunk(),
        };
        replicas.push(start_replica(model.clone(), config, cancel.clone()).map_err(|e| anyhow!(e))?);
        context = context.min(group_context);
    }
    let tokenizer = &model.tokenizer;
    let text = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id)).unwrap_or_default();
    let template = tokenizer.chat_template();
    if template.is_none() {
        eprintln!(
            "{} has no chat_template: chat messages reach the model as plain text, one per line",
            args.model.model.display()
        );
    }
    let template = ChatTemplate::new(
        template,
        text(tokenizer.bos_id()),
        text(tokenizer.eos_ids().first().copied()),
    )
    .map_err(|e| anyhow!("{}: {e}", args.model.model.display()))?;
    // Each conversation is rendered by a child process of this binary,
    // under a memory limit and a deadline.
    let program = std::env::current_exe().context("finding this program, to render chat templates with")?;
    let chat = ChatRenderer::new(template, program, vec!["render-chat".into()], RenderLimits::default());
    let what = format!(
        "{} group(s), {} sequences each, context {context}",
        replicas.len(),
        args.parallel
    );
    let dispatcher = Dispatcher { replicas, cancel };
    let mut service = TextService::new(model, context, chat, dispatcher);
    if let Some(format) = args.tool_format {
        service.tool_format = Some(format.into());
    }
    Ok((Served::Text(Box::new(service)), what))
}

/// A replica of the sentence encoder on each group; what the server
/// serves, and how in words.
fn serve_embeddings(args: &ServeArgs, specs: Vec<Option<String>>, cancel: Arc<AtomicBool>) -> Result<(Served, String)> {
    let path = &args.model.model;
    if !args.model.lora.is_empty() {
        bail!(
            "--lora applies to language models; {} is a sentence encoder",
            path.display()
        );
    }
    let dir = Arc::new(EncoderDir::open(path).with_context(|| format!("cannot open model {}", path.display()))?);
    let mut replicas = Vec::new();
    let elsewhere = setup::elsewhere(&args.model.placement, &specs, path, &ENCODER_MODULES)?;
    for (i, (spec, elsewhere)) in specs.into_iter().zip(elsewhere).enumerate() {
        let mut placement = args.model.placement.clone();
        placement.backend = spec;
        placement.elsewhere = elsewhere;
        let name = format!("{i}");
        let (plan, group) = setup::place(&placement, path, &ENCODER_MODULES, &dir.inventory())
            .with_context(|| format!("group {name}"))?;
        eprintln!("group {name}: {}", setup::summary(&plan));
        let config = EmbeddingReplicaConfig {
            name,
            group,
            plan,
            queue_limit: args.queue,
        };
        replicas.push(start_embedding_replica(dir.clone(), config, cancel.clone()).map_err(|e| anyhow!(e))?);
    }
    let what = format!(
        "{} group(s), embeddings of {} dimensions",
        replicas.len(),
        dir.config.hidden_size
    );
    let dispatcher = Dispatcher { replicas, cancel };
    Ok((Served::Embeddings(EmbeddingService { dir, dispatcher }), what))
}

/// A replica of the FLUX pipeline on each group (each module on the group
/// the spec gives it); what the server serves, and how in words.
fn serve_images(args: &ServeArgs, specs: Vec<Option<String>>, cancel: Arc<AtomicBool>) -> Result<(Served, String)> {
    let path = &args.model.model;
    if !args.model.lora.is_empty() {
        bail!(
            "--lora applies to language models; {} is a FLUX pipeline",
            path.display()
        );
    }
    let dir = Arc::new(FluxDir::open(path).with_context(|| format!("cannot open pipeline {}", path.display()))?);
    let (width, height) = args.max_image_size;
    let unit = dir.latents.pixels_per_patch();
    if width % unit != 0 || height % unit != 0 {
        bail!("--max-image-size {width}x{height}: both sides must be multiples of {unit} for this pipeline");
    }
    // The precision decides the products' scratch, which the plans count.
    cleave_shaders::set_precision(args.model.precision.map(Into::into));
    let mut replicas = Vec::new();
    let elsewhere = setup::elsewhere(&args.model.placement, &specs, path, &FLUX_MODULES)?;
    for (i, (spec, elsewhere)) in specs.into_iter().zip(elsewhere).enumerate() {
        let mut placement = args.model.placement.clone();
        placement.backend = spec;
        placement.elsewhere = elsewhere;
        let name = format!("{i}");
        eprintln!("group {name}:");
        // The plans make room for the longest prompt a request may ask for.
        let planned = setup::plan_pipeline(&placement, &dir, (height, width), ImageSettings::MAX_T5_TOKENS)
            .with_context(|| format!("group {name}, planned for images up to {width}x{height} (--max-image-size)"))?;
        let (residency, why) = module_residency(args.pipeline_modules, &planned, &placement)?;
        eprintln!("group {name}: {why}");
        let mut config = ImageReplicaConfig {
            name,
            groups: Vec::new(),
            plans: Vec::new(),
            residency,
            queue_limit: args.queue,
        };
        for (plan, members) in planned {
            config.groups.push(cleave_device::open_group(&members)?);
            config.plans.push(plan);
        }
        replicas.push(start_image_replica(dir.clone(), config, cancel.clone()).map_err(|e| anyhow!(e))?);
    }
    let what = format!("{} group(s), images up to {width}x{height}", replicas.len());
    let dispatcher = Dispatcher { replicas, cancel };
    Ok((
        Served::Images(ImageService {
            dir,
            dispatcher,
            max_size: (width, height),
        }),
        what,
    ))
}

/// Whether a replica keeps its pipeline's modules loaded, and why, in
/// words. `auto` keeps them when every device has room for the sum of what
/// the modules' plans put on it (each plan alone only has to fit while its
/// module runs): its share of the device, where other groups use it too.
fn module_residency(
    asked: PipelineModules,
    planned: &[(Plan, Vec<MemberSpec>)],
    placement: &crate::PlacementArgs,
) -> Result<(ModuleResidency, String)> {
    match asked {
        PipelineModules::Loaded => {
            return Ok((
                ModuleResidency::Loaded,
                "modules stay loaded (--pipeline-modules loaded)".into(),
            ))
        }
        PipelineModules::OnUse => {
            return Ok((
                ModuleResidency::OnUse,
                "each module loads just before use (--pipeline-modules on-use)".into(),
            ))
        }
        PipelineModules::Auto => {}
    }
    let mut needed: BTreeMap<String, u64> = BTreeMap::new();
    for device in planned.iter().flat_map(|(plan, _)| &plan.devices) {
        *needed.entry(device.name.clone()).or_default() += device.total_bytes();
    }
    let members: Vec<MemberSpec> = planned.iter().flat_map(|(_, members)| members.clone()).collect();
    // Other groups' logical devices on a device take their share of it.
    let sharers = |name: &str| 1 + placement.elsewhere.iter().filter(|other| *other == name).count() as u64;
    let room: BTreeMap<String, Option<u64>> = cleave_device::resolve_group(&members)?
        .into_iter()
        .map(|(info, _)| {
            let memory = info.free_bytes.or(info.total_bytes);
            let left_free = setup::left_free(placement, &info);
            let share = memory.map(|m| m.saturating_sub(left_free) / sharers(&info.name));
            (info.name, share)
        })
        .collect();
    let short = needed
        .iter()
        .filter_map(|(device, &bytes)| Some((device, bytes, room.get(device).copied().flatten()?)))
        .find(|(_, bytes, memory)| bytes > memory);
    Ok(match short {
        None => {
            let total: Vec<String> = needed
                .iter()
                .map(|(d, b)| format!("{} on {d}", format_bytes(*b)))
                .collect();
            (
                ModuleResidency::Loaded,
                format!("modules stay loaded ({})", total.join(", ")),
            )
        }
        Some((device, bytes, memory)) => (
            ModuleResidency::OnUse,
            format!(
                "each module loads just before use: all four need {} on {device}, which has {}",
                format_bytes(bytes),
                format_bytes(memory)
            ),
        ),
    })
}
