//! The `cleave` binary end to end: what a user types, what they get back.

use crate::common;

use std::path::Path;

use common::{cleave, fixture, reference, shared_model};
use serde_json::Value;

fn run_ok(args: &[&str]) -> String {
    common::run_ok_with_stderr(args).0
}

fn json_of(args: &[&str]) -> Value {
    common::parse_json(args, &run_ok(args))
}

#[test]
fn run_greedy_json_matches_transformers() {
    common::greedy_run_matches_reference(&fixture("qwen2-tiny"), &[]);
    common::greedy_run_matches_reference(&fixture("gemma3-tiny"), &[]);
    common::greedy_run_matches_reference(&fixture("qwen3-moe-tiny"), &[]);
    common::greedy_run_matches_reference(&shared_model("fortune-llama-3m"), &[]);
}

/// The cases of a fixture of the demo model's greedy ids
/// (tests/fixtures/<name>/reference.json), each run by `cleave run` with
/// `extra` flags: its ids must be transformers', and each case comes back
/// with its run's JSON report.
fn demo_greedy_cases(name: &str, extra: &[&str]) -> Vec<(Value, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("tests/fixtures").join(name).join("reference.json");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let model = root.join("models/fortune-llama-3m");
    let ids = |v: &Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    let mut reports = Vec::new();
    for case in reference["cases"].as_array().unwrap() {
        let want = ids(&case["new_ids"]);
        let (n, penalty) = (want.len().to_string(), case["penalty"].to_string());
        let mut args = vec![
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            case["prompt"].as_str().unwrap(),
            "--temp",
            "0",
            "-n",
            &n,
            "--ignore-eos",
            "--repeat-penalty",
            &penalty,
            "--repeat-last-n",
            "256",
            "--format",
            "json",
        ];
        args.extend(extra);
        let out = json_of(&args);
        assert_eq!(ids(&out["prompt_ids"]), ids(&case["input_ids"]), "{case}");
        assert_eq!(ids(&out["new_ids"]), want, "{case}");
        reports.push((case.clone(), out));
    }
    reports
}

/// Greedy decoding under a repeat penalty against transformers'
/// `repetition_penalty` (tests/fixtures/repeat-penalty: the demo model,
/// every token of prompt and completion penalized, which a window longer
/// than both is). The smallest lead of a pick over the runner-up there is
/// 0.037, far past f32's differences, so the ids must match exactly.
#[test]
fn repeat_penalty_matches_transformers() {
    demo_greedy_cases("repeat-penalty", &[]);
}

/// Prompt lookup on prompts that repeat themselves
/// (tests/fixtures/speculative): transformers' greedy ids, plain and
/// under a repeat penalty, with drafts both kept and turned down. The
/// smallest lead of a pick over the runner-up there is 0.0088.
#[test]
fn prompt_lookup_gives_transformers_greedy_ids() {
    for (_, report) in demo_greedy_cases("speculative", &["--prompt-lookup", "--draft-max", "6"]) {
        let s = &report["speculation"];
        let (drafted, accepted) = (s["drafted"].as_u64().unwrap(), s["accepted"].as_u64().unwrap());
        assert!(accepted > 0 && accepted < drafted, "{s}");
    }
}

/// A draft model: the demo model drafting for itself, so that every
/// greedy draft of an unpenalized case is kept, which it is only where
/// its own cache holds what the model's does after each check. (The
/// draft model does not penalize, so under a penalty some are not.)
#[test]
fn a_draft_model_gives_transformers_greedy_ids() {
    let draft = shared_model("fortune-llama-3m");
    for (case, report) in demo_greedy_cases("speculative", &["--draft-model", draft.to_str().unwrap()]) {
        let s = &report["speculation"];
        assert!(s["drafted"].as_u64().unwrap() > 0, "{s}");
        if case["penalty"] == 1.0 {
            assert_eq!(s["accepted"], s["drafted"], "{s}");
        }
    }
}

/// A hybrid model (Qwen3.5's Gated DeltaNet layers, whose recurrent
/// state cannot forget rows as a KV cache does) gives transformers' greedy
/// ids under speculation: drafted by prompt lookup, by itself (every
/// draft kept) and by another hybrid model (most turned down, so both
/// models' states go back to a checkpoint of their rings step after
/// step).
#[test]
fn speculation_on_a_hybrid_model_gives_transformers_greedy_ids() {
    let (target, other) = (fixture("qwen3_5-tiny"), fixture("qwen3_5-moe-tiny"));
    lookup_and_self_drafting_give_the_reference(&target);
    let another = ["--draft-model", other.to_str().unwrap(), "--draft-max", "5"];
    let (out, _) = common::greedy_run_matches_reference(&target, &another);
    let s = &out["speculation"];
    let (drafted, accepted) = (s["drafted"].as_u64().unwrap(), s["accepted"].as_u64().unwrap());
    assert!(drafted > 0 && accepted < drafted, "{s}");
}

/// gpt-oss (sinks, sliding layers over a window of 8 keys, experts)
/// gives transformers' greedy ids under prompt lookup and drafting for
/// itself, every draft of which is kept.
#[test]
fn speculation_on_gpt_oss_gives_transformers_greedy_ids() {
    lookup_and_self_drafting_give_the_reference(&fixture("gpt-oss-tiny"));
}

/// Gemma 4 (per-layer inputs, layers reading earlier layers' KV caches,
/// whose drafts' rows the verify pass writes before they read them)
/// gives transformers' greedy ids under prompt lookup and drafting for
/// itself; the mixture beside its MLP likewise.
#[test]
fn speculation_on_gemma4_gives_transformers_greedy_ids() {
    lookup_and_self_drafting_give_the_reference(&fixture("gemma4-tiny"));
    lookup_and_self_drafting_give_the_reference(&fixture("gemma4-moe-tiny"));
}

/// `target`'s reference greedy ids under prompt lookup and drafting for
/// itself, which keeps every draft.
fn lookup_and_self_drafting_give_the_reference(target: &Path) {
    let lookup = ["--prompt-lookup", "--draft-max", "4"];
    let (out, _) = common::greedy_run_matches_reference(target, &lookup);
    assert!(out["speculation"]["drafted"].as_u64().is_some(), "{out}");
    let itself = ["--draft-model", target.to_str().unwrap(), "--draft-max", "3"];
    let (out, _) = common::greedy_run_matches_reference(target, &itself);
    let s = &out["speculation"];
    assert!(
        s["drafted"].as_u64().unwrap() > 0 && s["accepted"] == s["drafted"],
        "{s}"
    );
}

/// Sampling with speculation draws the very tokens plain sampling draws
/// from the same seed, with a top-k of 40 and with every token penalized,
/// drafted by prompt lookup or by a draft model (greedy, so some of its
/// drafts are turned down and its cache rewound). Both runs pick where
/// the device's kernel form picks: on the host on a device without
/// matrix units (lavapipe), on the device with them; that the device's
/// sampler picks what the host's does is checked in the tiled form on any
/// device by decode_steps.rs. At a low temperature the demo model repeats
/// itself enough to keep drafts, and the uniforms still decide picks: a pass
/// that drew one uniform for every drafted position, or left the
/// penalties' window where it was, fails here.
#[test]
fn speculation_samples_what_plain_decoding_samples() {
    let model = shared_model("fortune-llama-3m");
    let prompt = "A journey of a thousand miles begins with a single step. ".repeat(3) + "A journey";
    let penalized = ["--top-k", "0", "--repeat-penalty", "1.05", "--repeat-last-n", "256"];
    let draft_model = ["--draft-model", model.to_str().unwrap()];
    for extra in [&["--top-k", "40"][..], &penalized] {
        let run = |drafter: &[&str]| -> Value {
            let mut args = vec![
                "run",
                "-m",
                model.to_str().unwrap(),
                "-p",
                &prompt,
                "-n",
                "96",
                "--ignore-eos",
            ];
            args.extend(["--temp", "0.3", "-s", "5", "--format", "json"]);
            args.extend(extra);
            args.extend(drafter);
            json_of(&args)
        };
        let plain = run(&[]);
        for drafter in [&["--prompt-lookup"][..], &draft_model] {
            let speculative = run(drafter);
            assert_eq!(speculative["new_ids"], plain["new_ids"], "{extra:?} {drafter:?}");
            let s = &speculative["speculation"];
            let accepted = s["accepted"].as_u64().unwrap();
            assert!(
                accepted > 0 && accepted < s["drafted"].as_u64().unwrap(),
                "{extra:?} {drafter:?}: {s}"
            );
        }
    }
}

/// `--profile` of a greedy decode of the demo model: once warm, a step
/// launches its kernels, allocates nothing, writes nothing and reads back
/// the one id it picked; its kernels are timed one by one in the last
/// steps. With prompt lookup a step takes several tokens, and the figures
/// stay per token.
#[test]
fn profile_reports_a_decode_step_per_token() {
    let model = shared_model("fortune-llama-3m");
    let prompt = "A journey of a thousand miles begins with a single step. ".repeat(3) + "A journey";
    let run = |extra: &[&str]| -> Value {
        let mut args = vec!["run", "-m", model.to_str().unwrap(), "-p", &prompt, "-n", "48"];
        args.extend(["--temp", "0", "--ignore-eos", "--profile", "--format", "json"]);
        args.extend(extra);
        json_of(&args)["profile"].clone()
    };
    let number = |p: &Value, key: &str| p[key].as_f64().unwrap_or_else(|| panic!("{key} in {p}"));
    let plain = run(&[]);
    let per_token = &plain["per_token"];
    assert!(number(&plain, "steps") > 0.0, "{plain}");
    assert_eq!(plain["tokens"], plain["steps"], "{plain}");
    assert!(number(per_token, "launches") > 0.0, "{plain}");
    assert_eq!(number(per_token, "allocations"), 0.0, "{plain}");
    assert_eq!(number(per_token, "writes"), 0.0, "{plain}");
    assert_eq!(number(per_token, "reads"), 1.0, "{plain}");
    assert_eq!(number(per_token, "read_bytes"), 4.0, "{plain}");
    assert!(number(&plain, "timed_steps") > 0.0, "{plain}");
    let kernels = plain["kernels"].as_array().unwrap();
    assert!(kernels.iter().any(|k| k["kernel"] == "argmax"), "{plain}");
    let speculative = run(&["--prompt-lookup"]);
    assert!(
        number(&speculative, "tokens") > number(&speculative, "steps"),
        "drafts were kept: {speculative}"
    );
    // A step's one read serves every token it took.
    assert!(number(&speculative["per_token"], "reads") < 1.0, "{speculative}");
}

/// `cleave plan` says how each device would form its prefill products at
/// the precision asked for (by the flag or CLEAVE_PRECISION), and counts
/// that path's buffers: a bf16 model's plan at `fast` (its products'
/// inputs rounded, or packed for the matrix units) holds more compute than
/// at `exact`.
#[test]
fn plan_names_the_precision_and_counts_its_buffers() {
    let model = fixture("llama-tiny-bf16");
    let plan = |precision: &str| {
        let args = [
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--precision",
            precision,
            "--format",
            "json",
        ];
        json_of(&args)
    };
    let (exact, fast) = (plan("exact"), plan("fast"));
    for (plan, precision) in [(&exact, "exact"), (&fast, "fast")] {
        let products = &plan["prefill_products"][0];
        assert_eq!(products["device"], plan["devices"][0]["name"], "{plan}");
        assert_eq!(products["precision"], precision, "{plan}");
    }
    let compute = |plan: &Value| plan["devices"][0]["compute_bytes"].as_u64().unwrap();
    assert!(compute(&fast) > compute(&exact), "fast {fast}\nexact {exact}");
    // CLEAVE_PRECISION asks the same without the flag.
    let args = ["plan", "-m", model.to_str().unwrap(), "--format", "json"];
    let out = common::cleave()
        .args(args)
        .env("CLEAVE_PRECISION", "fast")
        .output()
        .expect("run cleave");
    let by_env = common::parse_json(&args, &String::from_utf8_lossy(&out.stdout));
    assert_eq!(by_env["prefill_products"][0]["precision"], "fast", "{by_env}");
    let text = run_ok(&["plan", "-m", model.to_str().unwrap(), "--precision", "exact"]);
    assert!(
        text.contains(": prefill products exact (f32 inputs and sums)"),
        "{text}"
    );
}

/// `cleave plan --lora` opens the adapter for the model as `run` does and
/// says what it holds: its updates, rank, scale and bytes, as the file has
/// them.
#[test]
fn plan_checks_and_counts_a_lora_adapter() {
    let (model, adapter) = (fixture("llama-tiny"), fixture("llama-tiny-lora"));
    let bytes = std::fs::read(adapter.join("adapter_model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors = file.tensors();
    let updates = tensors
        .iter()
        .filter(|(name, _)| name.ends_with(".lora_A.weight"))
        .count();
    let data: usize = tensors.iter().map(|(_, view)| view.data().len()).sum();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap()).unwrap();
    let args = [
        "plan",
        "-m",
        model.to_str().unwrap(),
        "--lora",
        adapter.to_str().unwrap(),
    ];
    let plan = json_of(&[&args[..], &["--format", "json"]].concat());
    let lora = &plan["lora"][0];
    assert_eq!(lora["updates"], updates, "{plan}");
    assert_eq!(lora["bytes"], data, "{plan}");
    assert_eq!(lora["rank"], config["r"], "{plan}");
    let scale = config["lora_alpha"].as_f64().unwrap() / config["r"].as_f64().unwrap();
    assert_eq!(lora["scale"].as_f64(), Some(scale), "{plan}");
    let text = run_ok(&args);
    assert!(
        text.contains(&format!(
            "LoRA adapter {}: {updates} updates of rank",
            adapter.display()
        )),
        "{text}"
    );
}

/// `cleave logits` against transformers' f32 (llama-tiny-bf16's first
/// prompt): the worst difference measured on lavapipe is 4.8e-6, as the
/// JSON carries every f32 exactly; the bound is golden's, with room for
/// other backends' summation orders.
const LOGITS_COMMAND_TOLERANCE: f32 = 1e-4;

#[test]
fn logits_command_matches_transformers() {
    let dir = fixture("llama-tiny-bf16");
    let reference = reference(&dir);
    let case = &reference.cases[0];
    let ids: Vec<String> = case.input_ids.iter().map(u32::to_string).collect();
    // The reference is f32 arithmetic: an f32 cache (bf16 weights default to f16).
    let out = json_of(&[
        "logits",
        "-m",
        dir.to_str().unwrap(),
        "--ids",
        &ids.join(","),
        "--cache-type",
        "f32",
    ]);
    let rows: Vec<Vec<f32>> = serde_json::from_value(out["logits"].clone()).unwrap();
    assert_eq!(rows.len(), case.logits.len());
    let worst = rows
        .iter()
        .zip(&case.logits)
        .enumerate()
        .map(|(pos, (got, want))| {
            let what = format!("cleave logits, position {pos}");
            common::max_diff(got, want, &what, LOGITS_COMMAND_TOLERANCE)
        })
        .fold(0.0, f32::max);
    eprintln!("cleave logits: worst difference {worst:e}");
}

/// With no `-m`, `cleave run` streams the demo model's greedy text: what
/// transformers picks for the prompt (its reference in shared/models).
#[test]
fn demo_model_is_the_default_and_streams_text() {
    const N: usize = 12;
    let dir = shared_model("fortune-llama-3m");
    let reference = reference(&dir);
    let case = reference
        .cases
        .iter()
        .find(|c| c.prompt == "The best way to")
        .expect("the demo prompt's reference");
    assert!(
        case.decisive_steps() >= N,
        "{:?}: a near tie in the first {N} steps",
        case.prompt
    );
    let tokenizer = cleave_hf::Tokenizer::from_dir(&dir, &[]).unwrap();
    let expected = tokenizer.decode(&case.greedy_new_ids[..N]).unwrap();
    let out = cleave()
        .args(["run", "-p", &case.prompt, "--temp", "0", "--ignore-eos"])
        .args(["-n", &N.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.strip_suffix('\n').unwrap_or(&text),
        expected,
        "the demo model's greedy text for {:?}",
        case.prompt
    );
    let stats = String::from_utf8_lossy(&out.stderr);
    for part in ["load", "prompt 5 tokens", "tok/s", "generated"] {
        assert!(stats.contains(part), "stats line lacks {part:?}: {stats}");
    }
}

/// A seed replays its text exactly, and both the seed and the temperature
/// matter: another seed, or temperature 0, gives other text.
#[test]
fn same_seed_same_text() {
    let ids = |temperature: &str, seed: &str| {
        let args = [
            "run",
            "-p",
            "Q: Why",
            "--temp",
            temperature,
            "-s",
            seed,
            "-n",
            "20",
            "--format",
            "json",
        ];
        json_of(&args)["new_ids"].clone()
    };
    let sampled = ids("0.9", "1234");
    assert_eq!(sampled, ids("0.9", "1234"), "the same seed");
    assert_ne!(sampled, ids("0.9", "1235"), "another seed");
    assert_ne!(sampled, ids("0", "1234"), "temperature 0");
}

#[test]
fn devices_lists_the_test_adapter() {
    let out = json_of(&["devices", "--format", "json"]);
    let devices = out["devices"].as_array().expect("devices array");
    assert!(!devices.is_empty(), "no devices: {out}");
    for d in devices {
        assert!(d["name"].as_str().is_some_and(|n| n.ends_with(char::is_numeric)), "{d}");
        assert!(d["backend"].is_string() && d["adapter"].is_string(), "{d}");
    }
    // The device the tests run on is listed, as the device layer sees it.
    let name = common::test_device_name();
    let info = cleave_device::list_devices()
        .into_iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("the test device {name} is not enumerated"));
    let want = serde_json::to_value(&info).unwrap();
    let listed = devices
        .iter()
        .find(|d| d["name"] == name.as_str())
        .unwrap_or_else(|| panic!("the test device {name} is not listed: {out}"));
    for key in ["backend", "adapter", "device_type"] {
        assert_eq!(listed[key], want[key], "{name}: {key}");
    }
    let text = run_ok(&["devices"]);
    assert!(
        text.lines().any(|l| l.contains(&name) && l.contains(&info.adapter)),
        "{name} ({}) is not listed: {text}",
        info.adapter
    );
}

/// The test adapter reports its memory (Vulkan: the budget extension,
/// else the device-local heap's size), and a plan with no caps gives each
/// logical device on it an equal share.
#[test]
fn device_memory_sizes_the_plan() {
    let name = common::test_device_name();
    let out = json_of(&["devices", "--format", "json"]);
    let device = out["devices"]
        .as_array()
        .and_then(|all| all.iter().find(|d| d["name"] == name.as_str()))
        .unwrap_or_else(|| panic!("{name} is not listed: {out}"));
    if !matches!(device["backend"].as_str(), Some("vulkan" | "cuda")) {
        return; // Metal, DX12 and WebGPU report no memory through wgpu
    }
    let total = device["total_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no total: {device}"));
    assert!(total >= 64 << 20, "{name} reports {total} bytes: {device}");
    let (free, exact) = match device["memory_source"].as_str() {
        Some("memory-budget" | "driver") => {
            let free = device["free_bytes"]
                .as_u64()
                .unwrap_or_else(|| panic!("no free: {device}"));
            assert!(free <= total, "{device}");
            (free, false)
        }
        Some("heap-size") => {
            assert!(device["free_bytes"].is_null(), "{device}");
            (total, true)
        }
        other => panic!("memory source {other:?}: {device}"),
    };
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortune-llama-3m");
    let group = format!("{name}&{name}");
    let plan = json_of(&[
        "plan",
        "-m",
        demo.to_str().unwrap(),
        "--backend",
        &group,
        "--format",
        "json",
    ]);
    let budgets: Vec<u64> = plan["devices"]
        .as_array()
        .expect("plan devices")
        .iter()
        .map(|d| {
            d["budget_bytes"]
                .as_u64()
                .unwrap_or_else(|| panic!("no budget: {plan}"))
        })
        .collect();
    assert_eq!(budgets.len(), 2, "{plan}");
    // Each member's runtime is named.
    let runtime = if name.starts_with("cuda") { "cuda" } else { "wgpu" };
    for device in plan["devices"].as_array().unwrap() {
        assert_eq!(device["runtime"], runtime, "{plan}");
    }
    for budget in budgets {
        // Free memory that moves between the two commands moves the share.
        let share = free / 2;
        match exact {
            true => assert_eq!(budget, share, "{plan}"),
            false => assert!(budget.abs_diff(share) <= share / 10, "{budget} against {share}: {plan}"),
        }
    }
}

/// `--expert-cache 1` over two logical devices: transformers' greedy ids,
/// the plan's experts per device in `cleave plan`, and the cache's hits
/// in the stats line and the JSON report.
#[test]
fn expert_cache_run_matches_transformers_and_reports_hits() {
    let dir = fixture("qwen3-moe-tiny");
    let device = common::test_device_name();
    let pair = format!("{device}&{device}");
    let placement = ["-m", dir.to_str().unwrap(), "--backend", &pair, "--expert-cache", "1"];
    let plan = run_ok(&[&["plan"][..], &placement].concat());
    assert!(plan.contains("expert split, main device #0"), "{plan}");
    assert!(
        plan.contains("#1 experts 4..8 of every block, 1 of them cached per block"),
        "{plan}"
    );
    let (json, stderr) = common::greedy_run_matches_reference(&dir, &placement[2..]);
    let uploads = &json["uploads"];
    assert!(uploads["expert_misses"].as_u64().unwrap() > 0, "{json}");
    assert!(uploads["uploaded_bytes"].as_u64().unwrap() > 0, "{json}");
    let rate = uploads["expert_hit_rate"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&rate), "{json}");
    assert!(
        stderr.contains("expert split over") && stderr.contains("1 cached per block"),
        "{stderr}"
    );
    assert!(
        stderr.contains("% hits") && stderr.contains("uploaded while running"),
        "{stderr}"
    );
}

/// `cleave bench` runs each test once untimed and then `-r` times, and
/// reports every timed run's tok/s, the mean and its deviation, with the
/// precision and how the products are formed at it.
#[test]
fn bench_reports_every_timed_run() {
    let out = run_ok(&["bench", "-p", "24", "-n", "4", "-r", "3", "--format", "json"]);
    let rows: Vec<Value> = out.lines().map(|line| common::parse_json(&["bench"], line)).collect();
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp24", "tg4"], "{out}");
    for (row, tokens) in rows.iter().zip([24, 4]) {
        assert_eq!(row["tokens"], tokens, "{row}");
        let samples: Vec<f64> = row["samples_tokens_per_second"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_f64().unwrap())
            .collect();
        assert_eq!(samples.len(), 3, "{row}");
        assert!(samples.iter().all(|&s| s.is_finite() && s > 0.0), "{row}");
        let mean = samples.iter().sum::<f64>() / 3.0;
        assert!(
            (row["mean_tokens_per_second"].as_f64().unwrap() - mean).abs() <= 1e-9 * mean,
            "{row}"
        );
        assert!(["exact", "fast"].contains(&row["precision"].as_str().unwrap()), "{row}");
        if row["precision"] == "exact" {
            assert_eq!(row["products"], "f32 inputs and sums", "{row}");
        }
        assert!(!row["devices"].as_array().unwrap().is_empty(), "{row}");
    }
}

/// `cleave bench --profile` says where a prompt pass's time went, in the
/// prompt test's object: the pass's launches, its one read (the id it
/// picked), and each kernel of a second, timed pass, the pick and
/// attention among them, launching as many kernels and summing to its
/// device time; and the device's memory after the pass, within what the
/// plan counts and what cubecl holds. The generation test has no profile.
#[test]
fn bench_profile_reports_a_prompt_pass() {
    let out = run_ok(&[
        "bench",
        "-p",
        "24",
        "-n",
        "2",
        "-r",
        "1",
        "--profile",
        "--format",
        "json",
    ]);
    let rows: Vec<Value> = out.lines().map(|line| common::parse_json(&["bench"], line)).collect();
    assert!(rows[1].get("profile").is_none(), "{out}");
    let profile = &rows[0]["profile"];
    let number = |key: &str| profile[key].as_f64().unwrap_or_else(|| panic!("{key} in {profile}"));
    assert!(number("launches") > 0.0, "{profile}");
    assert_eq!((number("reads"), number("read_bytes")), (1.0, 4.0), "{profile}");
    assert!(number("wall_us") >= number("host_us"), "{profile}");
    let kernels = profile["kernels"].as_array().unwrap();
    let names: Vec<&str> = kernels.iter().map(|k| k["kernel"].as_str().unwrap()).collect();
    assert!(names.contains(&"argmax") && names.contains(&"attention"), "{profile}");
    let summed = |key: &str| kernels.iter().map(|k| k[key].as_f64().unwrap()).sum::<f64>();
    assert_eq!(summed("launches_per_pass"), number("launches"), "{profile}");
    let device = number("device_us");
    assert!((summed("us_per_pass") - device).abs() <= 1e-6 * device, "{profile}");
    let memory = profile["memory"].as_array().unwrap();
    assert_eq!(memory.len(), 1, "{profile}");
    let bytes = |key: &str| memory[0][key].as_u64().unwrap_or_else(|| panic!("{key} in {profile}"));
    assert!(bytes("in_use_bytes") > 0, "{profile}");
    assert!(bytes("in_use_bytes") <= bytes("planned_bytes"), "{profile}");
    assert!(bytes("in_use_bytes") <= bytes("held_bytes"), "{profile}");
}

#[test]
fn help_lists_the_commands() {
    let help = run_ok(&["--help"]);
    insta::assert_snapshot!(help);
}

/// `--json-schema` and `--grammar` hold the text: a sampled run writes a
/// value of the schema's shape, a GBNF run one of the grammar's strings.
#[test]
fn run_holds_its_text_to_a_json_schema_or_a_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
            "lucky": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["name", "lucky"], "additionalProperties": false}"#,
    )
    .unwrap();
    let grammar = dir.path().join("answer.gbnf");
    std::fs::write(&grammar, "root ::= (\"yes\" | \"no\") \" \" [0-9]{2}\n").unwrap();
    let run = |flag: &str, file: &Path, seed: &str| {
        let args = [
            "run",
            "-p",
            "Your fortune:",
            "-n",
            "64",
            "-s",
            seed,
            "--format",
            "json",
            flag,
        ];
        json_of(&[&args[..], &[file.to_str().unwrap()]].concat())
    };
    for seed in ["1", "2", "3"] {
        let out = run("--json-schema", &schema, seed);
        assert_eq!(out["stop"], "eos", "{out}");
        let text = out["text"].as_str().unwrap();
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let object = value.as_object().unwrap();
        assert_eq!(object.len(), 2, "{text}");
        assert!(
            object["name"].as_str().is_some_and(|n| n.chars().count() <= 10),
            "{text}"
        );
        assert!(object["lucky"].as_u64().is_some_and(|l| (1..=9).contains(&l)), "{text}");

        let out = run("--grammar", &grammar, seed);
        let text = out["text"].as_str().unwrap();
        let (word, digits) = text.split_once(' ').unwrap_or_else(|| panic!("{text:?}"));
        assert!(matches!(word, "yes" | "no"), "{text:?}");
        assert!(
            digits.len() == 2 && digits.bytes().all(|b| b.is_ascii_digit()),
            "{text:?}"
        );
    }
}
