use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_engine::{
    generate, DecodeProfile, DraftModel, Drafter, Limits, Output, Penalties, PromptLookup, SamplerConfig, Speculation,
    SpeculationStats,
};
use cleave_grammar::{Constrainer, Constraint, Grammar, MAX_GRAMMAR_BYTES};
use cleave_hf::{LoraAdapter, LoraMode};
use cleave_models::{ModelDir, LLM_MODULES};
use cleave_nn::{Session, UploadStats};
use cleave_shaders::cubecl::prelude::*;
use serde_json::json;

use cleave_plan::Plan;
use cleave_source::OllamaParams;

use super::profile::{self, us};
use crate::output::{self, outln};
use crate::{parse, setup, Format, Given, ModelArgs, PrefillArgs};

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prefill: PrefillArgs,
    /// The prompt.
    #[arg(short = 'p', long = "prompt")]
    prompt: String,
    /// Tokens to generate at most (generation also stops at EOS).
    #[arg(short = 'n', long = "n-predict", default_value_t = 128, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    n_predict: usize,
    /// Sampling temperature; 0 always picks the most likely token.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true, value_parser = parse::non_negative_f32)]
    temperature: f32,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 40, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    top_k: usize,
    /// Sample among the most likely tokens whose probability adds up to p.
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true, value_parser = parse::probability)]
    top_p: f32,
    /// Divide a repeated token's logit by this (multiply a negative one),
    /// as llama.cpp does (1: off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = parse::positive_f32)]
    repeat_penalty: f32,
    /// Lower a token's logit this much for every time it occurs among the
    /// last tokens.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = parse::finite_f32)]
    frequency_penalty: f32,
    /// Lower a token's logit this much if it occurs among the last tokens.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = parse::finite_f32)]
    presence_penalty: f32,
    /// How many of the last tokens (prompt and generated) the penalties
    /// count; 0: none.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true, value_parser = parse::count::<usize>)]
    repeat_last_n: usize,
    /// Speculate by prompt lookup: the last few tokens are looked up
    /// earlier in the prompt and the text, and what followed them there is
    /// checked in the same pass as the next token. The text is the same as
    /// without, greedy or sampled; it comes faster where the text quotes
    /// the prompt, on a device whose pass of a few tokens costs about what
    /// one token's does (a GPU).
    #[arg(long)]
    prompt_lookup: bool,
    /// Speculate with a draft model: a smaller model of the same tokenizer
    /// (named as -m takes it), on the same devices in the memory the
    /// model leaves, decoding greedily a few tokens ahead; the model
    /// checks them in the same pass as its next token. The text is the
    /// same as without.
    #[arg(long = "draft-model", value_name = "DIR", conflicts_with = "prompt_lookup")]
    draft_model: Option<PathBuf>,
    /// Tokens a speculative step drafts at most.
    #[arg(long, default_value_t = 8, value_parser = parse::draft_tokens, allow_negative_numbers = true)]
    draft_max: usize,
    /// Hold the text to a JSON schema (a JSON file): every pick takes only
    /// a token that keeps the text a prefix of a value the schema
    /// validates, and the text ends with the value.
    #[arg(long = "json-schema", value_name = "FILE", conflicts_with_all = ["grammar", "prompt_lookup", "draft_model"])]
    json_schema: Option<PathBuf>,
    /// Hold the text to a grammar file: llama.cpp's GBNF, or llguidance's
    /// Lark after a first line `%llguidance {}`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt_lookup", "draft_model"])]
    grammar: Option<PathBuf>,
    /// Never stop at an end-of-sequence token: generate exactly -n tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Random seed (default: a fresh one, printed in the stats line).
    #[arg(short = 's', long, allow_negative_numbers = true, value_parser = parse::count::<u64>)]
    seed: Option<u64>,
    /// `text` streams the generated text; `json` prints one object at the end.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
    /// Report where the decode steps' time goes: per token, the launches,
    /// device allocations, reads and writes, the host's time issuing the
    /// step, and the device time of each kernel (timed over the last few
    /// steps, each launch waited for).
    #[arg(long)]
    profile: bool,
}

struct Task<'a> {
    adapters: &'a [LoraAdapter],
    /// The draft model and its plan, where one drafts.
    draft: Option<&'a (ModelDir, Plan)>,
    lora_mode: LoraMode,
    args: &'a RunArgs,
    model: &'a ModelDir,
    group: &'a DeviceGroup,
    plan: Plan,
    prompt_ids: &'a [u32],
    context: usize,
    seed: u64,
    /// The grammar the text must match, if any, compiled for the model.
    constraint: Option<Constraint>,
}

impl RuntimeTask for Task<'_> {
    type Output = Result<(Output, Duration, UploadStats)>;

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) -> Self::Output {
        let (model, load_time) = setup::load(
            clients.clone(),
            self.group,
            self.plan,
            self.model,
            (self.adapters, self.lora_mode),
        )?;
        let mut session = Session::new(model.as_ref(), self.context)?;
        let draft = match self.draft {
            Some((dir, plan)) => Some(setup::load(
                clients,
                self.group,
                plan.clone(),
                dir,
                (&[], self.lora_mode),
            )?),
            None => None,
        };
        let mut draft_session = match &draft {
            Some((draft, _)) => Some(Session::new(draft.as_ref(), self.context)?),
            None => None,
        };
        let sampler = SamplerConfig {
            temperature: self.args.temperature,
            top_k: self.args.top_k,
            top_p: self.args.top_p,
            seed: self.seed,
            penalties: Penalties {
                repeat: self.args.repeat_penalty,
                frequency: self.args.frequency_penalty,
                presence: self.args.presence_penalty,
                last_n: self.args.repeat_last_n,
            },
        };
        let streaming = matches!(self.args.format, Format::Text);
        // A failed write stops generation; the error is reported after it.
        let mut write_error = None;
        let mut print = |piece: &str| {
            if !streaming {
                return ControlFlow::Continue(());
            }
            match output::write(format_args!("{piece}")) {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    write_error = Some(e);
                    ControlFlow::Break(())
                }
            }
        };
        let limits = Limits {
            max_new_tokens: self.args.n_predict,
            ignore_eos: self.args.ignore_eos,
        };
        let mut lookup = PromptLookup::default();
        let banned = limits.banned(&self.model.tokenizer);
        let mut draft_model = draft_session.as_mut().map(|s| DraftModel::new(s, banned));
        let drafter: Option<&mut dyn Drafter> = match &mut draft_model {
            Some(draft) => Some(draft),
            None => self.args.prompt_lookup.then_some(&mut lookup),
        };
        let speculation = drafter.map(|drafter| Speculation {
            drafter,
            max_drafts: self.args.draft_max,
        });
        let output = generate(
            &mut session,
            &self.model.tokenizer,
            sampler,
            self.prompt_ids,
            limits,
            self.args.prefill.chunk(),
            self.args.profile,
            speculation,
            self.constraint,
            &mut print,
        )?;
        if let Some(e) = write_error {
            return Err(anyhow::Error::new(e).context("writing to stdout"));
        }
        if streaming {
            outln!()?;
        }
        let load_time = load_time + draft.map_or(Duration::ZERO, |(_, time)| time);
        Ok((output, load_time, model.upload_stats()))
    }
}

/// The grammar --json-schema or --grammar names, read and checked.
fn grammar(args: &RunArgs) -> Result<Option<Grammar>> {
    let read = |path: &Path, flag: &str| -> Result<String> {
        let context = || format!("reading {flag} {}", path.display());
        let size = std::fs::metadata(path).with_context(context)?.len();
        if size > MAX_GRAMMAR_BYTES as u64 {
            bail!("{flag} {}: {size} bytes, at most {MAX_GRAMMAR_BYTES}", path.display());
        }
        cleave_hf::read_regular_to_string(path).with_context(context)
    };
    if let Some(path) = &args.json_schema {
        let schema = serde_json::from_str(&read(path, "--json-schema")?)
            .with_context(|| format!("--json-schema {}: not JSON", path.display()))?;
        return Ok(Some(Grammar::JsonSchema(schema)));
    }
    match &args.grammar {
        Some(path) => Ok(Some(Grammar::llama_cpp(&read(path, "--grammar")?))),
        None => Ok(None),
    }
}

pub fn run(mut args: RunArgs, given: Given) -> Result<()> {
    let spec = args.model.model.display().to_string();
    if let cleave_source::Origin::Ollama(ollama) = setup::locate(&mut args.model.model, &args.model.source)? {
        take_ollama_params(&mut args, &spec, &ollama.params, &given)?;
    }
    let model = setup::open_model(&args.model)?;
    let (context, plan, group) = setup::place_llm(&args.model, &model)?;
    let adapters = setup::adapters(&args.model, &model)?;
    let prompt_ids = model.tokenizer.encode(&args.prompt)?;
    let constraint = match grammar(&args)? {
        Some(grammar) => {
            let constrainer = Constrainer::new(&model.tokenizer)?;
            Some(constrainer.compile(&grammar).context("compiling the grammar")?)
        }
        None => None,
    };
    let draft = match &args.draft_model {
        Some(path) => Some(open_draft(&args, path, (&model, &plan, context), &prompt_ids)?),
        None => None,
    };
    let seed = args.seed.unwrap_or_else(rand_seed);
    let devices = group.names().join("&");
    let (output, load_time, uploads) = group
        .run(Task {
            adapters: &adapters,
            draft: draft.as_ref(),
            lora_mode: args.model.lora_mode.into(),
            args: &args,
            model: &model,
            group: &group,
            plan,
            prompt_ids: &prompt_ids,
            context,
            seed,
            constraint,
        })
        .with_context(|| format!("running {} on {devices}", args.model.model.display()))?;
    let t = &output.timings;
    if let Format::Json = args.format {
        let mut report = json!({
            "prompt_ids": prompt_ids,
            "new_ids": output.new_ids,
            "text": output.text,
            "stop": output.stop.as_str(),
            "seed": seed,
            "devices": group.names(),
            "timings": {
                "load_ms": load_time.as_secs_f64() * 1e3,
                "prompt_tokens": t.prompt_tokens,
                "prompt_ms": t.prompt.as_secs_f64() * 1e3,
                "prompt_tokens_per_second": t.prompt_tokens_per_second(),
                "generated_tokens": t.generated_tokens,
                "generation_ms": t.generation.as_secs_f64() * 1e3,
                "generation_tokens_per_second": t.generation_tokens_per_second(),
            },
            "speculation": output.speculation.map(|s| json!({
                "steps": s.steps,
                "drafted": s.drafted,
                "accepted": s.accepted,
                "acceptance_rate": s.acceptance_rate(),
            })),
            "uploads": {
                "expert_hits": uploads.expert_hits,
                "expert_misses": uploads.expert_misses,
                "expert_hit_rate": uploads.expert_hit_rate(),
                "uploaded_bytes": uploads.uploaded_bytes,
            }
        });
        if let Some(profile) = &output.profile {
            report["profile"] = profile_json(profile);
        }
        outln!("{report}")?;
    } else if let Some(profile) = &output.profile {
        eprint!("{}", profile_text(profile));
    }
    eprintln!(
        "{devices} ({}) | load {:.2} s | prompt {} tokens, {:.1} tok/s | generated {} tokens, {:.1} tok/s{}{} | stop: {} | seed {seed}",
        group.members[0].info.adapter,
        load_time.as_secs_f64(),
        t.prompt_tokens,
        t.prompt_tokens_per_second(),
        t.generated_tokens,
        t.generation_tokens_per_second(),
        output.speculation.as_ref().map_or(String::new(), speculation_summary),
        uploads_summary(&uploads),
        output.stop.as_str(),
    );
    Ok(())
}

/// The draft model at `path`: checked against the model (its tokenizer
/// must be the model's), and planned on the model's group in the memory
/// that the model's `plan` leaves, with a cache of `context` positions.
fn open_draft(
    args: &RunArgs,
    path: &Path,
    (model, plan, context): (&ModelDir, &Plan, usize),
    prompt_ids: &[u32],
) -> Result<(ModelDir, Plan)> {
    let mut draft_args = args.model.clone();
    draft_args.model = path.to_path_buf();
    setup::locate(&mut draft_args.model, &args.model.source).context("--draft-model")?;
    draft_args.placement.taken = plan.devices.iter().map(|d| (d.name.clone(), d.total_bytes())).collect();
    let draft = setup::open_model(&draft_args).context("--draft-model")?;
    let named = path.display();
    if draft.vocab_size() != model.vocab_size() {
        bail!(
            "--draft-model {named} has a vocabulary of {} tokens, the model {}: a draft model must share the \
             model's tokenizer",
            draft.vocab_size(),
            model.vocab_size()
        );
    }
    if draft.tokenizer.encode(&args.prompt)? != prompt_ids {
        bail!("--draft-model {named} tokenizes the prompt differently: a draft model must share the model's tokenizer");
    }
    if context > draft.max_positions() {
        bail!(
            "--draft-model {named} knows {} positions, fewer than the context's {context} (set -c to {} or less)",
            draft.max_positions(),
            draft.max_positions()
        );
    }
    let inventory = draft.inventory_for(context, 1);
    let (draft_plan, _) = setup::plan(&draft_args.placement, &draft_args.model, &LLM_MODULES, &inventory)
        .with_context(|| format!("placing --draft-model {named} beside the model"))?;
    setup::announce(&draft_plan);
    Ok((draft, draft_plan))
}

/// A decode profile as a table on stderr.
fn profile_text(p: &DecodeProfile) -> String {
    let c = &p.counters;
    let tokens = p.tokens.max(1) as u64;
    let mut text = format!(
        "decode profile: {} steps counted ({} tokens, {:.2} a step), {} timed kernel by kernel\n\
         per token: {:.0} us wall, {:.0} us host issuing the step, {:.0} us waiting on reads\n\
         per token: {:.1} launches, {:.1} device allocations ({}), {:.1} reads ({}), {:.1} writes ({})\n",
        p.steps,
        p.tokens,
        p.tokens_per_step(),
        p.timed_steps,
        us(p.wall_per_token()),
        us(p.host_per_token()),
        us(c.read_wait) / tokens as f64,
        p.per_token(c.launches),
        p.per_token(c.allocations),
        cleave_plan::format_bytes(c.allocated_bytes / tokens),
        p.per_token(c.reads),
        cleave_plan::format_bytes(c.read_bytes / tokens),
        p.per_token(c.writes),
        cleave_plan::format_bytes(c.write_bytes / tokens),
    );
    if p.timed_steps > 0 {
        text.push_str(&profile::kernel_table(&p.kernels, p.timed_tokens, "token"));
    }
    text
}

/// A decode profile for `--format json`: per-token means, times in
/// microseconds.
fn profile_json(p: &DecodeProfile) -> serde_json::Value {
    let tokens = p.tokens.max(1) as f64;
    let c = &p.counters;
    json!({
        "steps": p.steps,
        "tokens": p.tokens,
        "timed_steps": p.timed_steps,
        "timed_tokens": p.timed_tokens,
        "per_token": {
            "wall_us": us(p.wall_per_token()),
            "host_us": us(p.host_per_token()),
            "read_wait_us": us(c.read_wait) / tokens,
            "launches": p.per_token(c.launches),
            "allocations": p.per_token(c.allocations),
            "allocated_bytes": c.allocated_bytes as f64 / tokens,
            "reads": p.per_token(c.reads),
            "read_bytes": c.read_bytes as f64 / tokens,
            "writes": p.per_token(c.writes),
            "write_bytes": c.write_bytes as f64 / tokens,
            "device_us": us(profile::device_time(&p.kernels, p.timed_tokens)),
        },
        "kernels": profile::kernels_json(&p.kernels, p.timed_tokens, "token"),
    })
}

/// How many drafted tokens were kept, for the stats line.
fn speculation_summary(s: &SpeculationStats) -> String {
    match s.acceptance_rate() {
        None => " | nothing drafted".into(),
        Some(rate) => format!(
            " | drafts {:.1}% kept ({} of {} in {} steps)",
            rate * 100.0,
            s.accepted,
            s.drafted,
            s.steps
        ),
    }
}

/// What was uploaded while running, for the stats line: the expert
/// cache's hits and the bytes, where anything went through a cache or was
/// streamed.
fn uploads_summary(uploads: &UploadStats) -> String {
    let mut summary = String::new();
    if let Some(rate) = uploads.expert_hit_rate() {
        summary.push_str(&format!(
            " | expert cache {:.1}% hits ({} of {})",
            rate * 100.0,
            uploads.expert_hits,
            uploads.expert_hits + uploads.expert_misses
        ));
    }
    if uploads.uploaded_bytes > 0 {
        summary.push_str(&format!(
            " | {} uploaded while running",
            cleave_plan::format_bytes(uploads.uploaded_bytes)
        ));
    }
    summary
}

/// An ollama model's parameters stand in for the flags the user did not
/// give, each judged by that flag's own parser as if it had been given:
/// a value the flag refuses is refused, naming the parameter and `model`.
/// stderr lists what was taken and what was not.
fn take_ollama_params(args: &mut RunArgs, model: &str, params: &OllamaParams, given: &Given) -> Result<()> {
    // (parameter, its value, the flag's id, the flag, what takes it).
    let table: [(&str, &Option<serde_json::Value>, &str, &str, Set); 10] = [
        (
            "temperature",
            &params.temperature,
            "temperature",
            "--temp",
            into(&mut args.temperature, parse::non_negative_f32),
        ),
        (
            "top_k",
            &params.top_k,
            "top_k",
            "--top-k",
            into(&mut args.top_k, parse::count),
        ),
        (
            "top_p",
            &params.top_p,
            "top_p",
            "--top-p",
            into(&mut args.top_p, parse::probability),
        ),
        (
            "repeat_penalty",
            &params.repeat_penalty,
            "repeat_penalty",
            "--repeat-penalty",
            into(&mut args.repeat_penalty, parse::positive_f32),
        ),
        (
            "frequency_penalty",
            &params.frequency_penalty,
            "frequency_penalty",
            "--frequency-penalty",
            into(&mut args.frequency_penalty, parse::finite_f32),
        ),
        (
            "presence_penalty",
            &params.presence_penalty,
            "presence_penalty",
            "--presence-penalty",
            into(&mut args.presence_penalty, parse::finite_f32),
        ),
        (
            "repeat_last_n",
            &params.repeat_last_n,
            "repeat_last_n",
            "--repeat-last-n",
            into(&mut args.repeat_last_n, parse::count),
        ),
        (
            "seed",
            &params.seed,
            "seed",
            "--seed",
            into(&mut args.seed, |v| parse::count(v).map(Some)),
        ),
        // `-c 0` is cleave's shorthand for the model's own context, which
        // an ollama model asks for by leaving num_ctx out.
        (
            "num_ctx",
            &params.num_ctx,
            "ctx_size",
            "-c",
            into(&mut args.model.ctx_size, |v| match parse::count(v)? {
                0 => Err("a context of 0 tokens holds no prompt".into()),
                n => Ok(Some(n)),
            }),
        ),
        (
            "num_predict",
            &params.num_predict,
            "n_predict",
            "-n",
            into(&mut args.n_predict, parse::count),
        ),
    ];
    let mut taken = Vec::new();
    let mut ollama_only = Vec::new();
    for (param, value, id, flag, mut set) in table {
        let Some(value) = value.as_ref().filter(|_| !given.by_user(id)) else {
            continue;
        };
        if let Some(meaning) = ollama_meaning(param, value) {
            ollama_only.push(format!("{param} {value} ({meaning})"));
            continue;
        }
        set(&value.to_string()).map_err(|e| {
            anyhow!("{model}: its parameter {param} {value} is refused, as {flag} {value} would be: {e}")
        })?;
        taken.push(format!("{param} {value}"));
    }
    let mut unused: Vec<String> = params.other.keys().cloned().collect();
    if !params.stop.is_empty() {
        unused.insert(0, "stop".into());
    }
    if !taken.is_empty() {
        eprintln!("ollama parameters taken: {}", taken.join(", "));
    }
    if !ollama_only.is_empty() {
        eprintln!(
            "ollama parameters not used (their flags have no such value): {}",
            ollama_only.join(", ")
        );
    }
    if !unused.is_empty() {
        eprintln!(
            "ollama parameters not used (cleave run has no flag for them): {}",
            unused.join(", ")
        );
    }
    Ok(())
}

/// Takes a flag's value, as its parser reads it, into the flag's field.
type Set<'a> = Box<dyn FnMut(&str) -> Result<(), String> + 'a>;

fn into<'a, T>(field: &'a mut T, parse: fn(&str) -> Result<T, String>) -> Set<'a> {
    Box::new(move |text| {
        *field = parse(text)?;
        Ok(())
    })
}

/// What ollama means by a value the matching flag has no way to say
/// (ollama's own defaults among them): such a parameter is left to the
/// flag's default, and said so, rather than refused.
fn ollama_meaning(param: &str, value: &serde_json::Value) -> Option<&'static str> {
    match (param, value.as_i64()?) {
        ("repeat_last_n", -1) => Some("the whole context"),
        ("num_predict", -1) => Some("no limit"),
        ("num_predict", -2) => Some("until the context is full"),
        ("seed", -1) => Some("a random seed, as without --seed"),
        _ => None,
    }
}

/// A seed for when none is given: different on every run.
fn rand_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    /// `cleave run -m ollama:tiny -p hi FLAGS`, after taking the model's
    /// parameters `params` (JSON).
    fn take(params: &str, flags: &[&str]) -> (RunArgs, Result<()>) {
        let argv = ["cleave", "-m", "ollama:tiny", "-p", "hi"].iter().chain(flags);
        let matches = Cli::command().try_get_matches_from(argv).unwrap();
        let mut args = Cli::from_arg_matches(&matches).unwrap().run;
        let params: OllamaParams = serde_json::from_str(params).unwrap();
        let result = take_ollama_params(&mut args, "ollama:tiny", &params, &Given(Some(&matches)));
        (args, result)
    }

    #[test]
    fn ollama_parameters_a_flag_would_refuse_are_refused_naming_them() {
        for (param, value, flag) in [
            ("temperature", "-1", "--temp"),
            ("temperature", "\"hot\"", "--temp"),
            ("top_p", "2", "--top-p"),
            ("top_p", "0", "--top-p"),
            ("top_k", "-1", "--top-k"),
            ("top_k", "2.5", "--top-k"),
            ("repeat_penalty", "0", "--repeat-penalty"),
            ("frequency_penalty", "1e+39", "--frequency-penalty"),
            ("repeat_last_n", "-2", "--repeat-last-n"),
            ("seed", "-5", "--seed"),
            ("num_ctx", "0", "-c"),
            ("num_predict", "-3", "-n"),
        ] {
            let (_, result) = take(&format!("{{\"{param}\": {value}}}"), &[]);
            let err = result.unwrap_err().to_string();
            let named = format!("ollama:tiny: its parameter {param} {value} is refused, as {flag} {value} would be: ");
            assert!(err.starts_with(&named), "{param} {value}: {err}");
        }
    }

    #[test]
    fn ollama_parameters_are_taken_unless_their_flag_is_given() {
        let (defaults, _) = take("{}", &[]);
        let params = r#"{"temperature": 0, "top_p": 2, "top_k": 7, "num_ctx": 256, "num_predict": -1, "seed": -1}"#;
        let (args, result) = take(params, &["--top-p", "0.5"]);
        result.unwrap();
        assert_eq!((args.temperature, args.top_k, args.model.ctx_size), (0.0, 7, Some(256)));
        // The user's --top-p stands, the model's invalid one unjudged.
        assert_eq!(args.top_p, 0.5);
        // ollama's "no limit" and "a random seed" leave the flags' defaults.
        assert_eq!((args.n_predict, args.seed), (defaults.n_predict, defaults.seed));
    }
}
