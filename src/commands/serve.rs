use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cleave_device::parse_bytes;
use cleave_server::{start_replica, ChatTemplate, ConnectionLimits, Dispatcher, ReplicaConfig, ServeOptions};

use crate::{setup, ModelArgs, PrefillArgs};

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prefill: PrefillArgs,
    /// Device groups, one replica of the model each, separated by `;`:
    /// `cuda0&cuda1;cuda2&cuda3` (each group as --backend takes it).
    /// Default: one group, from --backend or the best devices.
    #[arg(long)]
    groups: Option<String>,
    /// Sequences each replica decodes together.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests each replica keeps waiting beyond those; more get 503.
    #[arg(long, default_value_t = 32)]
    queue: usize,
    /// Address to listen on; 0.0.0.0 serves every network.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8080)]
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
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    read_timeout: u64,
    /// Connections open at once; one more gets 503 and is closed.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,
    /// Seconds running requests may go on after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10)]
    shutdown_timeout: u64,
    /// The model's name in the API (default: its directory's name).
    #[arg(long)]
    alias: Option<String>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    let max_body = parse_bytes(&args.max_body)
        .ok_or_else(|| anyhow!("--max-body: '{}' is not a size (e.g. 4MiB)", args.max_body))?;
    let address = SocketAddr::new(args.host, args.port);
    let listener = TcpListener::bind(address).with_context(|| format!("cannot listen on {address}"))?;
    let model = Arc::new(setup::open_model(&args.model)?);
    let adapters = setup::adapters(&args.model)?;
    let specs: Vec<Option<String>> = match &args.groups {
        Some(groups) => groups.split(';').map(|g| Some(g.trim().to_string())).collect(),
        None => vec![args.model.placement.backend.clone()],
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let mut replicas = Vec::new();
    let mut context = usize::MAX;
    for (i, spec) in specs.into_iter().enumerate() {
        let mut group_args = args.model.clone();
        group_args.placement.backend = spec;
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
    let chat = ChatTemplate::new(
        template,
        text(tokenizer.bos_id()),
        text(tokenizer.eos_ids().first().copied()),
    )
    .map_err(|e| anyhow!("{}: {e}", args.model.model.display()))?;
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
        context,
    };
    let groups = replicas.len();
    let dispatcher = Dispatcher { replicas, cancel };
    cleave_server::serve(options, model.clone(), chat, dispatcher, |address| {
        eprintln!(
            "serving {model_id} on http://{address}/v1 ({groups} group(s), {} sequences each, context {context})",
            args.parallel
        );
    })
    .context("serving")?;
    eprintln!("stopped");
    Ok(())
}
