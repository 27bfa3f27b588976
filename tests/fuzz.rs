//! Mutation fuzzing of everything cleave parses from a file, a flag or a
//! request: the safetensors header, the shard index, config.json (and the
//! plan made from it), `--backend` specs, chat templates and request
//! bodies. Thousands of damaged inputs each, from a fixed seed (a failure
//! names its seed and input, so it replays): every one is taken or refused
//! with an error, none panics, none runs past a deadline, and none
//! allocates past a bound, which a counting allocator checks. Chat
//! templates that build without bound are rendered as the server renders
//! them, in a child process under its limits. The GGUF reader has its own
//! in cleave-gguf.

mod common;
#[path = "common/deadline.rs"]
mod deadline;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use common::fixture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

// ---------------------------------------------------------------------------
// Allocation bound

/// Records the largest single allocation each thread makes, so each target
/// can check its own inputs while the tests run in parallel.
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(new_size)));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// How long one input may take: every target takes milliseconds, so an
/// input past this hangs.
const DEADLINE: Duration = Duration::from_secs(30);

/// Runs `parse` on every input `make` draws, checking that none panics,
/// none runs past [`DEADLINE`] and none allocates more than `bound` bytes
/// at once. `parse` says whether it took the input: a target whose inputs
/// are all taken, or all refused, is not exercising its parser, and fails
/// too.
fn fuzz(
    target: &str,
    seed: u64,
    count: usize,
    bound: usize,
    mut make: impl FnMut(&mut StdRng) -> Vec<u8>,
    parse: impl Fn(&[u8]) -> bool + Send + 'static,
) {
    let worker = deadline::Worker::new(move |input: Vec<u8>| {
        LARGEST.with(|l| l.set(0));
        let outcome = catch_unwind(AssertUnwindSafe(|| parse(&input))).ok();
        (outcome, LARGEST.with(Cell::get))
    });
    let mut rng = StdRng::seed_from_u64(seed);
    let mut taken = 0;
    for case in 0..count {
        let input = make(&mut rng);
        let shown = String::from_utf8_lossy(&input[..input.len().min(600)]).into_owned();
        let (outcome, largest) = worker
            .run(input, DEADLINE)
            .unwrap_or_else(|why| panic!("{target}: case {case} (seed {seed}) {why} on input:\n{shown}"));
        let Some(took) = outcome else {
            panic!("{target}: case {case} (seed {seed}) panicked on input:\n{shown}");
        };
        assert!(
            largest <= bound,
            "{target}: case {case} (seed {seed}) allocated {largest} bytes at once (bound {bound}) on input:\n{shown}"
        );
        taken += usize::from(took);
    }
    eprintln!("{target}: {taken} of {count} inputs taken, the rest refused");
    assert!(0 < taken && taken < count, "{target}: {taken} of {count} taken");
}

#[test]
fn the_harness_catches_a_panic_a_hang_and_an_allocation_past_the_bound() {
    let big = catch_unwind(|| fuzz("big", 0, 2, 1 << 20, |_| vec![0], |_| vec![0u8; 2 << 20].len() > 1));
    assert!(big.is_err());
    let panics = catch_unwind(|| fuzz("panics", 0, 2, 1 << 20, |_| vec![0], |_| panic!("boom")));
    assert!(panics.is_err());
    let worker = deadline::Worker::new(|wait: Duration| std::thread::sleep(wait));
    assert!(worker.run(Duration::ZERO, Duration::from_secs(5)).is_ok());
    let hung = worker.run(Duration::from_secs(3600), Duration::from_millis(50));
    assert!(hung.unwrap_err().contains("still running after"));
}

// ---------------------------------------------------------------------------
// Mutations

/// Values that break parsers: huge, negative, fractional, non-finite in
/// spelling, wrong types, deep nesting.
const NASTY_JSON: [&str; 18] = [
    "0",
    "-1",
    "1e309",
    "-1e309",
    "0.5",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "1e10",
    "null",
    "true",
    "\"\"",
    "\"NaN\"",
    "[]",
    "{}",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    "\"../../../../etc/passwd\"",
];

/// One damage at the byte level: flips, overwrites, cuts, insertions.
fn mutate_bytes(rng: &mut StdRng, input: &mut Vec<u8>, within: usize) {
    let within = within.min(input.len()).max(1);
    let at = rng.random_range(0..within);
    let byte = at.min(input.len().saturating_sub(1));
    match rng.random_range(0..7) {
        0 if !input.is_empty() => input[byte] ^= 1 << rng.random_range(0..8),
        1 if !input.is_empty() => input[byte] = rng.random(),
        2 => input.truncate(at),
        3 => {
            let bytes: Vec<u8> = (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
            input.splice(at.min(input.len())..at.min(input.len()), bytes);
        }
        4 => {
            let end = (at + rng.random_range(1..32)).min(input.len());
            input.drain(at.min(end)..end);
        }
        5 => {
            let nasty = NASTY_JSON[rng.random_range(0..NASTY_JSON.len())].as_bytes();
            input.splice(at.min(input.len())..at.min(input.len()), nasty.iter().copied());
        }
        _ => {
            // A 0xFF run: all-ones lengths and counts.
            let end = (at + 8).min(input.len());
            input[at.min(end)..end].fill(0xFF);
        }
    }
}

/// One damage at the JSON level, `depth` levels down at most: a value
/// replaced by a nasty one, a key removed, a list grown.
fn mutate_json(rng: &mut StdRng, node: &mut Value, depth: usize) {
    if depth > 0 && rng.random_bool(0.7) {
        let child = match node {
            Value::Object(map) if !map.is_empty() => {
                let i = rng.random_range(0..map.len());
                map.values_mut().nth(i)
            }
            Value::Array(list) if !list.is_empty() => {
                let i = rng.random_range(0..list.len());
                list.get_mut(i)
            }
            _ => None,
        };
        if let Some(child) = child {
            return mutate_json(rng, child, depth - 1);
        }
    }
    match (rng.random_range(0..4), &mut *node) {
        (0, Value::Object(map)) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(rng.random_range(0..map.len()))
                .cloned()
                .unwrap_or_default();
            map.remove(&key);
        }
        (1, Value::Array(list)) => {
            let copies = rng.random_range(0..64);
            let item = list.first().cloned().unwrap_or(Value::Null);
            list.extend(std::iter::repeat_n(item, copies));
        }
        _ => {
            let nasty = NASTY_JSON[rng.random_range(0..NASTY_JSON.len())];
            *node = serde_json::from_str(nasty).unwrap_or(Value::Null);
        }
    }
}

/// `base` damaged 1 to 4 times, at the JSON level or (sometimes) the byte level.
fn damaged_json(rng: &mut StdRng, base: &Value) -> Vec<u8> {
    let mut value = base.clone();
    for _ in 0..rng.random_range(1..=4) {
        mutate_json(rng, &mut value, 4);
    }
    let mut bytes = value.to_string().into_bytes();
    if rng.random_bool(0.2) {
        let len = bytes.len();
        mutate_bytes(rng, &mut bytes, len);
    }
    bytes
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

// ---------------------------------------------------------------------------
// Targets

/// Everything an opened model directory leads to before a device: its
/// inventory for a few contexts, and plans on one and two members.
fn open_and_plan(dir: &Path) -> bool {
    let Ok(model) = cleave_models::ModelDir::open(dir) else {
        return false;
    };
    for context in [1, 512, 1 << 24, usize::MAX] {
        let inventory = model.inventory_for(context, 4);
        let members = [
            cleave_plan::Member {
                name: "a".into(),
                budget: Some(1 << 30),
                runtime: None,
            },
            cleave_plan::Member {
                name: "b".into(),
                budget: None,
                runtime: None,
            },
        ];
        for mode in [
            cleave_plan::SplitMode::Layer,
            cleave_plan::SplitMode::Row,
            cleave_plan::SplitMode::Tensor,
            cleave_plan::SplitMode::Expert,
        ] {
            let options = cleave_plan::PlanOptions {
                mode,
                ..Default::default()
            };
            let _ = cleave_plan::plan(&inventory, &members, None, &options);
        }
    }
    true
}

#[test]
fn damaged_safetensors_headers_are_refused_or_read() {
    let source = std::fs::read(fixture("llama-tiny").join("model.safetensors")).unwrap();
    let header_end = 8 + u64::from_le_bytes(source[..8].try_into().unwrap()) as usize;
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().to_path_buf();
    let path = folder.join("model.safetensors");
    fuzz(
        "safetensors header",
        1,
        6000,
        16 << 20,
        |rng| {
            let mut bytes = source.clone();
            for _ in 0..rng.random_range(1..=3) {
                mutate_bytes(rng, &mut bytes, header_end);
            }
            bytes
        },
        move |bytes| {
            std::fs::write(&path, bytes).unwrap();
            let Ok(checkpoint) = cleave_hf::Checkpoint::open(&folder) else {
                return false;
            };
            let names: Vec<String> = checkpoint.names().map(str::to_string).collect();
            for name in names {
                let _ = checkpoint.tensor(&name, &[64, 64]);
            }
            true
        },
    );
}

#[test]
fn damaged_shard_indexes_are_refused_or_read() {
    let source = fixture("llama-tiny-sharded");
    let dir = common::copy_dir(&source);
    let folder = dir.path().to_path_buf();
    let index_path = folder.join("model.safetensors.index.json");
    let index = read_json(&index_path);
    fuzz(
        "shard index",
        2,
        5000,
        16 << 20,
        |rng| damaged_json(rng, &index),
        move |bytes| {
            std::fs::write(&index_path, bytes).unwrap();
            cleave_hf::Checkpoint::open(&folder).is_ok()
        },
    );
}

#[test]
fn damaged_configs_are_refused_or_planned() {
    for (seed, name) in [(3, "llama-tiny"), (4, "qwen2-tiny")] {
        let dir = common::copy_of(name);
        let folder = dir.path().to_path_buf();
        let config_path = folder.join("config.json");
        let config = read_json(&config_path);
        fuzz(
            name,
            seed,
            3000,
            64 << 20,
            |rng| damaged_json(rng, &config),
            move |bytes| {
                std::fs::write(&config_path, bytes).unwrap();
                open_and_plan(&folder)
            },
        );
    }
}

#[test]
fn damaged_backend_specs_are_refused_or_parsed() {
    const PIECES: [&str; 22] = [
        "vulkan0",
        "vulkan1",
        "cuda0",
        "cpu",
        "llm",
        "diffusion",
        "te",
        "=",
        "&",
        ";",
        ",",
        ":",
        "64MiB",
        "1e99GiB",
        "18446744073709551616",
        "-1",
        "0",
        "",
        " ",
        "\u{0}",
        "ü",
        "::",
    ];
    fuzz(
        "--backend",
        5,
        20000,
        1 << 20,
        |rng| {
            let n = rng.random_range(0..12);
            (0..n)
                .map(|_| PIECES[rng.random_range(0..PIECES.len())])
                .collect::<String>()
                .into_bytes()
        },
        |bytes| {
            let spec = String::from_utf8_lossy(bytes);
            let _ = cleave_device::parse_bytes(&spec);
            cleave_device::parse_backend_spec(&spec).is_ok()
        },
    );
}

#[test]
fn random_chat_templates_compile_or_are_refused_and_render_within_bounds() {
    const PIECES: [&str; 30] = [
        "{%",
        "%}",
        "{{",
        "}}",
        " for m in messages ",
        " endfor ",
        " if ",
        " else ",
        " endif ",
        " set x = ",
        "m['content']",
        "m['role']",
        " ~ ",
        " + ",
        " * ",
        "'ab'",
        "99999999",
        "range(100000)",
        "range(-5)",
        "raise_exception('no')",
        "|join",
        "|length",
        ".strip()",
        ".split(' ')",
        "loop.index",
        "x",
        "messages",
        "bos_token",
        "(",
        ")",
    ];
    let messages = conversation();
    // minijinja lets one string repetition reach 100 MB; nothing else may.
    fuzz(
        "chat template",
        6,
        10000,
        256 << 20,
        |rng| {
            let n = rng.random_range(1..24);
            (0..n)
                .map(|_| PIECES[rng.random_range(0..PIECES.len())])
                .collect::<String>()
                .into_bytes()
        },
        move |bytes| {
            let source = String::from_utf8_lossy(bytes);
            let Ok(chat) = cleave_server::ChatTemplate::new(Some(&source), "<s>".into(), "</s>".into()) else {
                return false;
            };
            chat.render(&messages, None).is_ok()
        },
    );
}

fn conversation() -> Vec<cleave_server::Message> {
    vec![
        cleave_server::Message {
            role: "system".into(),
            content: "Be brief.".into(),
            ..Default::default()
        },
        cleave_server::Message {
            role: "user".into(),
            content: "Hi".into(),
            ..Default::default()
        },
    ]
}

#[test]
fn damaged_request_bodies_are_refused_or_parsed() {
    let bodies: Vec<Value> = [
        r#"{"prompt": "The best way to", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["\n", "."], "stream": true, "stream_options": {"include_usage": true}}"#,
        r#"{"prompt": [[1, 450, 1900]], "n": 1, "ignore_eos": true, "logprobs": null, "echo": false}"#,
        r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_completion_tokens": 4}"#,
        r#"{"prompt": "a red fox", "n": 2, "size": "512x512", "response_format": "b64_json", "seed": 7, "num_inference_steps": 4, "guidance_scale": 3.5, "max_sequence_length": 64}"#,
    ]
    .iter()
    .map(|b| serde_json::from_str(b).unwrap())
    .collect();
    fuzz(
        "request body",
        7,
        20000,
        1 << 20,
        |rng| {
            let base = &bodies[rng.random_range(0..bodies.len())];
            damaged_json(rng, base)
        },
        |bytes| {
            cleave_server::parse_request::<cleave_server::GenerationRequest>(bytes).is_ok()
                || cleave_server::parse_request::<cleave_server::ImageRequest>(bytes).is_ok()
        },
    );
}

/// Random templates that build strings and lists by doubling, repeating,
/// replacing, joining and nesting, in loops up to the step bound: rendered
/// as the server renders them, each in a child process under its memory
/// limit and deadline. Each renders, is refused, or is stopped by a bound
/// that its error names; never an unexplained failure, and never more
/// than the child's memory (the allocation bound here is the parent's).
#[test]
fn random_growing_chat_templates_render_or_are_stopped_by_a_named_bound() {
    const STATEMENTS: [&str; 14] = [
        "{% set ns.s = ns.s ~ ns.s %}",
        "{% set ns.l = ns.l + ns.l %}",
        "{% set ns.s = ns.s * 3 %}",
        "{% set ns.s = ns.s|replace('a', ns.s) %}",
        "{% set ns.l = [ns.l, ns.l] %}",
        "{% set ns.s = ns.l|join(ns.s) %}",
        "{% set ns.s = d(ns.s) %}",
        "{% set ns.s = ns.s ~ messages[0]['content'] %}",
        "{% set ns.s = ns.s|tojson %}",
        "{% set ns.l = ns.l + [ns.s] %}",
        "{{ ns.s|length }}",
        "{{ ns.l|length }}",
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
        "{{ ns.s[:64] }}",
    ];
    const LOOPS: [&str; 4] = ["2", "8", "40", "1000"];
    // Tighter than a server's, so that a template stopped by a bound is
    // stopped in milliseconds.
    let limits = cleave_server::RenderLimits {
        memory: 64 << 20,
        deadline: Duration::from_secs(2),
        at_once: 1,
    };
    let stopped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = stopped.clone();
    let messages = conversation();
    fuzz(
        "growing chat template",
        8,
        100,
        64 << 20,
        |rng| {
            let mut source =
                String::from("{% macro d(x) %}{{ x }}{{ x }}{% endmacro %}{% set ns = namespace(s='ab', l=[1, 2]) %}");
            for _ in 0..rng.random_range(1..5) {
                let statement = STATEMENTS[rng.random_range(0..STATEMENTS.len())];
                if rng.random_bool(0.6) {
                    let times = LOOPS[rng.random_range(0..LOOPS.len())];
                    source.push_str(&format!("{{% for i in range({times}) %}}{statement}{{% endfor %}}"));
                } else {
                    source.push_str(statement);
                }
            }
            source.push_str("{{ ns.s|length }} {{ ns.l|length }}");
            source.into_bytes()
        },
        move |bytes| {
            let source = String::from_utf8_lossy(bytes);
            let template = cleave_server::ChatTemplate::new(Some(&source), "<s>".into(), "</s>".into())
                .expect("the generated templates compile");
            let renderer = cleave_server::ChatRenderer::new(
                template,
                env!("CARGO_BIN_EXE_cleave").into(),
                vec!["render-chat".into()],
                limits,
            );
            match renderer.render(&messages, None) {
                Ok(_) => true,
                Err(e) if e.status.as_u16() == 400 => {
                    let bound = ["built more than its bound", "nested or recursed too deep", "past its"];
                    if bound.iter().any(|b| e.message.contains(b)) {
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    false
                }
                Err(e) => panic!("an unexplained failure ({}): {}", e.status, e.message),
            }
        },
    );
    let stopped = stopped.load(std::sync::atomic::Ordering::Relaxed);
    assert!(stopped > 0, "no template reached a bound");
    eprintln!("growing chat template: {stopped} stopped by a bound");
}
