//! `cleave serve` from the outside, with a real HTTP client: answers that
//! match transformers and `cleave run`, streams, two groups serving at
//! once without mixing sequences, and the abuse a public endpoint meets
//! (disconnects, a full queue, bad keys, oversized and malformed bodies).

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    agent, fixture, metric, post, reference, run_openai_script, shared_model, test_device_name, wait_until, Server,
};
use serde_json::{json, Value};

fn completion_text(server: &Server, body: &Value) -> String {
    let (status, _, json) = post(server, "/v1/completions", body);
    assert_eq!(status, 200, "{json}");
    json["choices"][0]["text"].as_str().unwrap().to_string()
}

/// The text `cleave run ARGS --format json` generates.
fn cleave_run_text(args: &[&str]) -> String {
    let out = common::cleave()
        .arg("run")
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    run["text"].as_str().unwrap().to_string()
}

/// An open stream: the response body, read an event at a time.
struct Stream {
    lines: Box<dyn BufRead + Send>,
}

impl Stream {
    fn open(server: &Server, path: &str, body: &Value) -> Stream {
        let response = agent().post(&server.url(path)).send_json(body).expect("stream request");
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response.headers().get("content-type").unwrap().to_str().unwrap();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        Stream {
            lines: Box::new(BufReader::new(response.into_body().into_reader())),
        }
    }

    /// The next `data:` payload, or None when the connection ends.
    fn next_data(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return Some(data.to_string());
            }
        }
    }

    /// Every chunk up to `[DONE]`: the text they carry and the finish reason.
    fn finish(mut self) -> (String, String) {
        let (mut text, mut finish) = (String::new(), String::new());
        loop {
            let data = self.next_data().expect("the stream ended before [DONE]");
            if data == "[DONE]" {
                assert!(self.next_data().is_none(), "nothing follows [DONE]");
                return (text, finish);
            }
            let (piece, reason) = Self::chunk(&data);
            text.push_str(&piece);
            if let Some(reason) = reason {
                finish = reason;
            }
        }
    }

    /// The `usage` the stream reports (`stream_options.include_usage`):
    /// read up to `[DONE]`, it must come in exactly one chunk.
    fn usage(mut self) -> Value {
        let mut usage = Vec::new();
        while let Some(data) = self.next_data().filter(|d| d != "[DONE]") {
            let chunk: Value = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
            usage.extend(chunk.get("usage").filter(|u| !u.is_null()).cloned());
        }
        assert_eq!(usage.len(), 1, "usage in one chunk: {usage:?}");
        usage.remove(0)
    }

    /// The text of the next `chunks` chunks, none of them the last.
    fn read_text(&mut self, chunks: usize) -> String {
        (0..chunks)
            .map(|_| {
                let data = self.next_data().expect("the stream ended early");
                let (piece, reason) = Self::chunk(&data);
                assert!(reason.is_none(), "the stream finished early: {data}");
                piece
            })
            .collect()
    }

    /// A chunk's text (completion or chat) and finish reason, if any.
    fn chunk(data: &str) -> (String, Option<String>) {
        let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        assert!(chunk.get("error").is_none(), "{chunk}");
        let choice = &chunk["choices"][0];
        let text = [&choice["text"], &choice["delta"]["content"]]
            .iter()
            .filter_map(|piece| piece.as_str())
            .collect();
        (text, choice["finish_reason"].as_str().map(str::to_string))
    }
}

fn demo() -> String {
    shared_model("fortune-llama-3m").to_str().unwrap().to_string()
}

#[test]
fn completions_match_transformers_greedy_and_stream_the_same_text() {
    let model = demo();
    let server = Server::start(&["-m", &model]);
    let case = &reference(&shared_model("fortune-llama-3m")).cases[0];
    assert!(
        case.greedy_text_is_decisive(),
        "{:?}: a near tie; its text cannot be compared",
        case.prompt
    );
    let body = json!({
        "prompt": case.prompt,
        "max_tokens": case.greedy_new_ids.len(),
        "temperature": 0,
        "ignore_eos": true,
    });
    let (status, _, json) = post(&server, "/v1/completions", &body);
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["object"], "text_completion");
    assert_eq!(json["choices"][0]["text"], case.greedy_text.as_str());
    assert_eq!(json["choices"][0]["finish_reason"], "length");
    assert_eq!(json["usage"]["prompt_tokens"], case.input_ids.len());
    assert_eq!(json["usage"]["completion_tokens"], case.greedy_new_ids.len());

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (text, finish) = Stream::open(&server, "/v1/completions", &streaming).finish();
    assert_eq!(text, case.greedy_text);
    assert_eq!(finish, "length");

    let (status, _, models) = {
        let mut r = agent().get(&server.url("/v1/models")).call().unwrap();
        (r.status().as_u16(), (), r.body_mut().read_json::<Value>().unwrap())
    };
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "fortune-llama-3m");
}

#[test]
fn sampled_completions_equal_cleave_run_with_the_same_seed() {
    let model = demo();
    let server = Server::start(&["-m", &model]);
    let text = completion_text(
        &server,
        &json!({"prompt": "Computers are", "max_tokens": 20, "seed": 7, "temperature": 0.9, "top_p": 0.95, "top_k": 40}),
    );
    let run = cleave_run_text(&[
        "-m",
        &model,
        "-p",
        "Computers are",
        "-n",
        "20",
        "-s",
        "7",
        "--temp",
        "0.9",
        "--top-p",
        "0.95",
        "--top-k",
        "40",
    ]);
    assert_eq!(text, run);
}

/// A greedy completion of `case`'s prompt gives the text of
/// transformers' greedy ids up to the reference's first near tie (at
/// least [`common::MIN_DECISIVE_STEPS`] of them), decoded by the model's
/// tokenizer.
fn greedy_completion_matches(server: &Server, dir: &std::path::Path, case: &common::Case, what: &str) {
    let decisive = case.decisive_steps();
    assert!(
        decisive >= common::MIN_DECISIVE_STEPS,
        "{what}: the reference decides only {decisive} steps"
    );
    let body = json!({
        "prompt": case.prompt,
        "max_tokens": decisive,
        "temperature": 0,
        "ignore_eos": true,
    });
    let tokenizer = cleave_hf::Tokenizer::from_dir(dir, &[]).unwrap();
    let expected = tokenizer.decode(&case.greedy_new_ids[..decisive]).unwrap();
    assert_eq!(completion_text(server, &body), expected, "{what}");
}

/// A greedy chat answer to `messages`, and the prompt's tokens the
/// server counted.
fn greedy_chat(server: &Server, messages: &Value, max_tokens: usize) -> (String, u64) {
    let body = json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true});
    let (status, _, chat) = post(server, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant", "{chat}");
    let content = chat["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    (content, chat["usage"]["prompt_tokens"].as_u64().unwrap())
}

/// The newer families serve like the first: greedy completions give
/// transformers' text, and a chat answer is the completion of the prompt
/// the fixtures' template writes.
#[test]
fn gemma_and_mixtures_of_experts_are_served() {
    for name in [
        "gemma3-tiny",
        "gemma4-tiny",
        "gemma4-moe-tiny",
        "mixtral-tiny",
        "qwen3-moe-tiny",
    ] {
        let dir = fixture(name);
        let server = Server::start(&["-m", dir.to_str().unwrap()]);
        let case = reference(&dir).cases.remove(0);
        greedy_completion_matches(&server, &dir, &case, name);
        let messages = json!([{"role": "user", "content": case.prompt}]);
        let (content, prompt_tokens) = greedy_chat(&server, &messages, 8);
        // The fixtures' template: `<|begin|>ROLE\nCONTENT<|end|>\n` a
        // message, then the assistant's header.
        let rendered = format!("<|begin|>user\n{}<|end|>\n<|begin|>assistant\n", case.prompt);
        let body = json!({"prompt": rendered, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
        let (status, _, completion) = post(&server, "/v1/completions", &body);
        assert_eq!(status, 200, "{completion}");
        assert_eq!(content, completion["choices"][0]["text"], "{name}: chat and completion");
        assert_eq!(prompt_tokens, completion["usage"]["prompt_tokens"], "{name}");
    }
}

/// The published chat templates' prompts tokenize as transformers'
/// `apply_chat_template(tokenize=True)` tokenizes them: the special
/// tokens they write parsed, no BOS added (tests/fixtures/chat-templates,
/// by the llama-tiny tokenizer).
#[test]
fn rendered_chats_tokenize_as_transformers_does() {
    let tokenizer = cleave_hf::Tokenizer::from_dir(&fixture("llama-tiny"), &[]).unwrap();
    let published = published_chats();
    let rendered: Vec<&Value> = published.iter().filter(|c| c.get("rendered").is_some()).collect();
    assert_eq!(rendered.len(), 20);
    for case in rendered {
        let ids = tokenizer.encode_rendered(case["rendered"].as_str().unwrap()).unwrap();
        assert_eq!(json!(ids), case["ids"], "{} {}", case["template"], case["conversation"]);
    }
}

/// The cases of tests/fixtures/chat-templates/published.json.
fn published_chats() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat-templates/published.json"
    );
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    reference["cases"].as_array().unwrap().clone()
}

/// A copy of the llama-tiny fixture whose chat template is the published
/// `template` of tests/fixtures/chat-templates/published.
fn llama_tiny_with_published_template(template: &str) -> tempfile::TempDir {
    let dir = common::copy_of("llama-tiny");
    let source = std::fs::read_to_string(format!(
        "{}/tests/fixtures/chat-templates/published/{template}.jinja",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    common::edit_json(&dir.path().join("tokenizer_config.json"), |c| {
        c["chat_template"] = json!(source)
    });
    dir
}

/// A model served with a published template (Qwen2.5's, which writes no
/// BOS, and Gemma 3's, which does) counts the prompt tokens transformers
/// gives the conversation, and answers as a completion of those ids does.
#[test]
fn a_published_template_serves_transformers_prompt() {
    for template in ["Qwen2.5-7B-Instruct", "gemma-3-4b-it"] {
        let case = published_chats()
            .into_iter()
            .find(|c| c["template"] == template && c["conversation"] == "with a system message")
            .unwrap();
        let dir = llama_tiny_with_published_template(template);
        let server = Server::start(&["-m", dir.path().to_str().unwrap()]);
        let (content, prompt_tokens) = greedy_chat(&server, &case["messages"], 6);
        let ids = case["ids"].as_array().unwrap();
        assert_eq!(prompt_tokens, ids.len() as u64, "{template}");
        let body = json!({"prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": true});
        assert_eq!(content, completion_text(&server, &body), "{template}");
    }
}

/// A mixture of experts served with a cache of one expert per block gives
/// transformers' text, and /metrics counts the cache's hits and misses and
/// the bytes it uploaded.
#[test]
fn expert_cache_hits_and_uploads_are_in_the_metrics() {
    let dir = fixture("qwen3-moe-tiny");
    let server = Server::start(&["-m", dir.to_str().unwrap(), "--expert-cache", "1"]);
    greedy_completion_matches(&server, &dir, &reference(&dir).cases.remove(0), "--expert-cache 1");
    let hits = metric(&server, "cleave_expert_cache_hits_total{group=\"0\"}");
    let misses = metric(&server, "cleave_expert_cache_misses_total{group=\"0\"}");
    assert!(hits > 0 && misses > 0, "hits {hits}, misses {misses}");
    assert!(metric(&server, "cleave_uploaded_bytes_total{group=\"0\"}") > 0);
}

#[test]
fn chat_renders_the_models_template() {
    let dir = fixture("llama-tiny");
    let server = Server::start(&["-m", dir.to_str().unwrap()]);
    let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Computers are"}]);
    let (status, _, chat) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    // The template of llama-tiny's tokenizer_config.json, written out.
    let rendered = "<|begin|>system\nBe brief.<|end|>\n<|begin|>user\nComputers are<|end|>\n<|begin|>assistant\n";
    let (_, _, plain) = post(
        &server,
        "/v1/completions",
        &json!({"prompt": rendered, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(chat["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"]);
    assert_eq!(chat["choices"][0]["message"]["content"], plain["choices"][0]["text"]);

    let mut stream = json!({"messages": messages, "max_tokens": 12, "temperature": 0, "stream": true});
    stream["stream_options"] = json!({"include_usage": true});
    let (text, _) = Stream::open(&server, "/v1/chat/completions", &stream).finish();
    assert_eq!(text, chat["choices"][0]["message"]["content"].as_str().unwrap());
}

/// Eight streams at once over two groups of two sequences each: every
/// answer is the one that prompt and seed give alone, and both groups work.
#[test]
fn concurrent_streams_on_two_groups_do_not_mix() {
    let model = demo();
    let device = test_device_name();
    let groups = format!("{device};{device}");
    let server = Server::start(&["-m", &model, "--groups", &groups, "--parallel", "2"]);
    let prompts = [
        "The best way to",
        "Computers are",
        "A friend is",
        "Never",
        "Life is",
        "The meaning of",
        "You will",
        "Love",
    ];
    let body = |i: usize| json!({"prompt": prompts[i], "max_tokens": 16, "seed": i, "temperature": 1.0});
    let alone: Vec<String> = (0..prompts.len()).map(|i| completion_text(&server, &body(i))).collect();
    let server = std::sync::Arc::new(server);
    let together: Vec<String> = (0..prompts.len())
        .map(|i| {
            let server = server.clone();
            let mut request = body(i);
            request["stream"] = json!(true);
            thread::spawn(move || Stream::open(&server, "/v1/completions", &request).finish().0)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert_eq!(together, alone);
    for group in ["0", "1"] {
        let prompt_tokens = metric(&server, &format!("cleave_prompt_tokens_total{{group=\"{group}\"}}"));
        assert!(prompt_tokens > 0, "group {group} served nothing");
    }
}

/// A client that goes away mid-stream frees its slot at once: the
/// sequence stops (it never finishes, so no tokens are counted for it) and
/// the next request gets the slot.
#[test]
fn a_disconnect_frees_the_slot() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--parallel", "1"]);
    let body = json!({"prompt": "The best way to", "max_tokens": 500, "ignore_eos": true, "stream": true});
    let mut stream = Stream::open(&server, "/v1/completions", &body);
    stream.next_data().expect("a first chunk");
    assert_eq!(metric(&server, "cleave_active_sequences{group=\"0\"}"), 1);
    drop(stream);
    wait_until("the slot to be freed", || {
        metric(&server, "cleave_active_sequences{group=\"0\"}") == 0
    });
    assert_eq!(metric(&server, "cleave_generated_tokens_total{group=\"0\"}"), 0);
    let text = completion_text(&server, &json!({"prompt": "Never", "max_tokens": 4}));
    assert!(!text.is_empty());
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--parallel", "1", "--queue", "1"]);
    let body = json!({"prompt": "The best way to", "max_tokens": 500, "ignore_eos": true, "stream": true});
    let mut running = Stream::open(&server, "/v1/completions", &body);
    running.next_data().expect("a first chunk");
    // Its headers come back once it is queued.
    let waiting = Stream::open(&server, "/v1/completions", &body);
    assert_eq!(metric(&server, "cleave_queue_depth{group=\"0\"}"), 1);
    let (status, retry, json) = post(&server, "/v1/completions", &json!({"prompt": "Never", "max_tokens": 4}));
    assert_eq!(status, 503, "{json}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(json["error"]["code"], "server_overloaded");
    drop((running, waiting));
}

#[test]
fn the_api_key_is_required_on_v1() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--api-key", "sesame"]);
    let request = |key: Option<&str>| {
        let mut r = agent().get(&server.url("/v1/models"));
        if let Some(key) = key {
            r = r.header("Authorization", &format!("Bearer {key}"));
        }
        let mut response = r.call().unwrap();
        (
            response.status().as_u16(),
            response.body_mut().read_to_string().unwrap(),
        )
    };
    let (status, body) = request(None);
    assert_eq!(status, 401);
    assert!(body.contains("invalid_api_key"), "{body}");
    assert_eq!(request(Some("open")).0, 401);
    assert_eq!(request(Some("sesame")).0, 200);
    let health = agent().get(&server.url("/health")).call().unwrap();
    assert_eq!(health.status().as_u16(), 200, "/health needs no key");
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_lives_on() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--max-body", "2KiB"]);
    let raw = |body: &str| {
        let mut response = agent().post(&server.url("/v1/completions")).send(body).unwrap();
        let status = response.status().as_u16();
        (status, response.body_mut().read_json::<Value>().unwrap())
    };
    let huge = format!("{{\"prompt\": \"{}\"}}", "a".repeat(4096));
    let cases: [(&str, u16, &str); 11] = [
        (&huge, 413, "larger than 2048 bytes"),
        ("{\"prompt\": \"hi\"", 400, "not a valid JSON"),
        ("{\"prompt\": \"hi\", \"max_tokens\": \"ten\"}", 400, "'max_tokens'"),
        (
            "{\"prompt\": \"hi\", \"max_tokens\": 100000}",
            400,
            "passes the context",
        ),
        ("{\"prompt\": \"hi\", \"temperature\": 7}", 400, "temperature"),
        ("{\"prompt\": []}", 400, "the prompt is empty"),
        ("{\"prompt\": [[1], [2]]}", 400, "not a batch of token-id lists"),
        (
            "{\"prompt\": 7}",
            400,
            "expected a string, a list of one string, or token ids",
        ),
        (
            "{\"prompt\": \"hi\", \"logprobs\": 21}",
            400,
            "logprobs is 21: at most 20",
        ),
        ("{\"prompt\": \"hi\", \"echo\": true}", 400, "does not implement 'echo'"),
        (
            "{\"prompt\": \"hi\", \"logit_bias\": {\"99999\": 5}}",
            400,
            "outside the vocabulary",
        ),
    ];
    for (body, status, says) in cases {
        let (got, json) = raw(body);
        assert_eq!(got, status, "{json}");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
        assert!(json["error"]["type"].is_string());
    }
    // A prompt longer than the context (512) names the field it came in.
    let (status, _, json) = post(
        &server,
        "/v1/completions",
        &json!({"prompt": "Never say never. ".repeat(110)}),
    );
    assert_eq!(status, 400, "{json}");
    assert_eq!(json["error"]["code"], "context_length_exceeded");
    assert_eq!(json["error"]["param"], "prompt");
    // A batch of one id list is that prompt.
    let (status, _, json) = post(
        &server,
        "/v1/completions",
        &json!({"prompt": [[1, 450, 1900]], "max_tokens": 2}),
    );
    assert_eq!(
        (status, json["usage"]["prompt_tokens"].as_u64()),
        (200, Some(3)),
        "{json}"
    );
    let (status, _, json) = post(&server, "/v1/chat/completions", &json!({"messages": []}));
    assert_eq!((status, json["error"]["param"].as_str()), (400, Some("messages")));
    let missing = agent().get(&server.url("/v2/nothing")).call().unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    assert!(!completion_text(&server, &json!({"prompt": "Never", "max_tokens": 3})).is_empty());
}

/// Each row of `cleave logits` for `ids`, as log-probabilities (f64).
fn log_softmax_rows(model: &str, ids: &[u32]) -> Vec<Vec<f64>> {
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let out = common::cleave()
        .args(["logits", "-m", model, "--ids", &ids.join(",")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let logits: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows: Vec<Vec<f32>> = serde_json::from_value(logits["logits"].clone()).unwrap();
    rows.iter().map(|row| log_softmax(row)).collect()
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let total = max + row.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    row.iter().map(|&l| l as f64 - total).collect()
}

/// The `n` largest of `values`, largest first.
fn largest(values: &[f64], n: usize) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    sorted.truncate(n);
    sorted
}

fn assert_close(got: &Value, expected: f64, what: &str) {
    let got = got.as_f64().unwrap_or_else(|| panic!("{what}: {got} is not a number"));
    assert!((got - expected).abs() < 1e-4, "{what}: {got} against {expected}");
}

/// A greedy completion's log-probabilities, its own and its five likeliest
/// alternatives', are the log-softmax of `cleave logits` at each position
/// (the first also of transformers' logits); a chat's, streamed or not,
/// are the same tokens'; a bias moves the pick but not what is reported.
#[test]
fn logprobs_are_the_log_softmax_of_the_models_logits() {
    let model = demo();
    let server = Server::start(&["-m", &model]);
    let case = &reference(&shared_model("fortune-llama-3m")).cases[0];
    let steps = 6;
    assert!(
        case.decisive_steps() >= steps,
        "the reference's first steps are near ties"
    );
    let body =
        json!({"prompt": case.input_ids, "max_tokens": steps, "temperature": 0, "ignore_eos": true, "logprobs": 5});
    let (status, _, json) = post(&server, "/v1/completions", &body);
    assert_eq!(status, 200, "{json}");
    let logprobs = &json["choices"][0]["logprobs"];
    let ids = [&case.input_ids[..], &case.greedy_new_ids[..steps - 1]].concat();
    let rows = log_softmax_rows(&model, &ids);
    let transformers = log_softmax(case.logits.last().unwrap());
    for step in 0..steps {
        let row = &rows[case.input_ids.len() - 1 + step];
        let picked = case.greedy_new_ids[step] as usize;
        assert_close(&logprobs["token_logprobs"][step], row[picked], &format!("token {step}"));
        let mut top: Vec<f64> = logprobs["top_logprobs"][step]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .collect();
        top.sort_by(|a, b| b.total_cmp(a));
        // Alternatives whose text is the same are one key of the dict.
        assert!((1..=5).contains(&top.len()), "{logprobs}");
        for (got, expected) in top.iter().zip(largest(row, 5)) {
            assert_close(&json!(got), expected, &format!("an alternative of token {step}"));
        }
    }
    assert_close(
        &logprobs["token_logprobs"][0],
        transformers[case.greedy_new_ids[0] as usize],
        "transformers",
    );
    let offsets: Vec<usize> = serde_json::from_value(logprobs["text_offset"].clone()).unwrap();
    let tokens: Vec<String> = serde_json::from_value(logprobs["tokens"].clone()).unwrap();
    assert_eq!(tokens.concat(), json["choices"][0]["text"].as_str().unwrap());
    assert_eq!(offsets[0], 0);
    assert_eq!(offsets[steps - 1], tokens[..steps - 1].concat().chars().count());

    // The chat API's form, whole and streamed: the same tokens, each the
    // likeliest of its three alternatives.
    let chat = json!({"messages": [{"role": "user", "content": case.prompt}], "max_tokens": 5, "temperature": 0,
        "ignore_eos": true, "logprobs": true, "top_logprobs": 3});
    let (status, _, whole) = post(&server, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{whole}");
    let content = whole["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 5, "{whole}");
    for token in &content {
        assert_eq!(token["top_logprobs"].as_array().unwrap().len(), 3, "{token}");
        assert_eq!(
            token["logprob"], token["top_logprobs"][0]["logprob"],
            "greedy takes the likeliest"
        );
        assert_eq!(json!(token["token"].as_str().unwrap().as_bytes()), token["bytes"]);
    }
    let text: String = content.iter().map(|t| t["token"].as_str().unwrap()).collect();
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    let mut streaming = chat.clone();
    streaming["stream"] = json!(true);
    let mut stream = Stream::open(&server, "/v1/chat/completions", &streaming);
    let mut streamed = Vec::new();
    while let Some(data) = stream.next_data().filter(|d| d != "[DONE]") {
        let chunk: Value = serde_json::from_str(&data).unwrap();
        if let Some(tokens) = chunk["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(tokens.iter().cloned());
        }
    }
    assert_eq!(streamed, content, "the stream's tokens are the whole answer's");

    // A bias of -100 on the likeliest token makes the pick the next one;
    // the reported log-probabilities are the model's, unbiased.
    let first = case.greedy_new_ids[0];
    let second = (0..transformers.len())
        .filter(|&i| i != first as usize)
        .max_by(|&a, &b| transformers[a].total_cmp(&transformers[b]))
        .unwrap();
    let biased = json!({"prompt": case.input_ids, "max_tokens": 1, "temperature": 0, "logprobs": 1,
        "logit_bias": {(first.to_string()): -100}});
    let (status, _, json) = post(&server, "/v1/completions", &biased);
    assert_eq!(status, 200, "{json}");
    let logprobs = &json["choices"][0]["logprobs"];
    assert_close(
        &logprobs["token_logprobs"][0],
        rows[case.input_ids.len() - 1][second],
        "the biased pick",
    );
    let alternatives = logprobs["top_logprobs"][0].as_object().unwrap();
    let likeliest = alternatives.values().next().unwrap();
    assert_close(
        likeliest,
        rows[case.input_ids.len() - 1][first as usize],
        "the unbiased likeliest",
    );
    assert_ne!(logprobs["tokens"][0], alternatives.keys().next().unwrap().as_str());

    let (status, _, json) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": chat["messages"], "logprobs": true, "top_logprobs": 100}),
    );
    assert_eq!(
        (status, json["error"]["param"].as_str()),
        (400, Some("top_logprobs")),
        "{json}"
    );
}

/// A greedy completion of the token ids `prompt`: its text, how many of
/// its first tokens came from a slot's cache, and its first token's
/// log-probability.
fn greedy_ids_completion(server: &Server, prompt: &[u32], max_tokens: usize) -> (String, u64, f64) {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true, "logprobs": 0});
    let (status, _, json) = post(server, "/v1/completions", &body);
    assert_eq!(status, 200, "{json}");
    let choice = &json["choices"][0];
    (
        choice["text"].as_str().unwrap().to_string(),
        json["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        choice["logprobs"]["token_logprobs"][0].as_f64().unwrap(),
    )
}

/// Checks that a greedy completion of `case`'s prompt on `server` gives
/// transformers' first `steps` greedy ids and, within 1e-4, the
/// log-probability transformers gives the first, having read `cached` of
/// its tokens from a slot's cache.
fn reads_its_reference_from_the_cache(
    server: &Server,
    dir: &std::path::Path,
    case: &common::Case,
    steps: usize,
    cached: usize,
) {
    let tokenizer = cleave_hf::Tokenizer::from_dir(dir, &[]).unwrap();
    let expected = tokenizer.decode(&case.greedy_new_ids[..steps]).unwrap();
    let first = log_softmax(case.logits.last().unwrap())[case.greedy_new_ids[0] as usize];
    let (text, reused, logprob) = greedy_ids_completion(server, &case.input_ids, steps);
    assert_eq!((text, reused), (expected, cached as u64), "{}", dir.display());
    assert!(
        (logprob - first).abs() < 1e-4,
        "{}: {logprob} against transformers' {first}",
        dir.display()
    );
}

/// A prompt whose first tokens a free slot's cache holds prefills only
/// the rest (`cached_tokens`, /metrics) and still gives transformers'
/// greedy ids and first log-probability: a KV cache cut back to the 1,900
/// tokens it shares (llama-long-tiny's 1,981-token prompt), and a hybrid
/// model's recurrent state, which is reused only where it goes on from
/// where it stands (qwen3_5-tiny), a prompt that would cut it back being
/// read whole.
#[test]
fn a_prompt_sharing_a_cached_prefix_prefills_only_the_rest() {
    let dir = fixture("llama-long-tiny");
    let server = Server::start(&["-m", dir.to_str().unwrap(), "-c", "2100", "--parallel", "2"]);
    let case = reference(&dir).cases.remove(0);
    let steps = case.decisive_steps().min(16);
    assert!(steps >= 8, "the reference decides only {steps} steps");
    let shared = 1900;
    let mut other: Vec<u32> = case.input_ids[..shared].to_vec();
    other.extend((1..=40).map(|i| (case.input_ids[shared] + i) % 512));
    assert_eq!(greedy_ids_completion(&server, &other, 2).1, 0, "nothing cached yet");
    reads_its_reference_from_the_cache(&server, &dir, &case, steps, shared);
    // The same prompt again: all but its last token, which gives the
    // first token's logits.
    let all_but_last = case.input_ids.len() - 1;
    reads_its_reference_from_the_cache(&server, &dir, &case, steps, all_but_last);
    let reused = metric(&server, "cleave_prompt_tokens_reused_total{group=\"0\"}");
    assert_eq!(reused, (shared + all_but_last) as u64);

    let dir = fixture("qwen3_5-tiny");
    let server = Server::start(&["-m", dir.to_str().unwrap(), "--parallel", "1"]);
    let case = reference(&dir).cases.remove(3);
    let steps = case.decisive_steps().min(8);
    assert!(steps >= 4, "the reference decides only {steps} steps");
    // One token generated and not fed back: the state stands right after
    // the prompt's first tokens.
    let start = case.input_ids.len() - 5;
    greedy_ids_completion(&server, &case.input_ids[..start], 1);
    reads_its_reference_from_the_cache(&server, &dir, &case, steps, start);
    // Now the state stands past the prompt: it cannot go back.
    reads_its_reference_from_the_cache(&server, &dir, &case, steps, 0);
}

/// SIGTERM: no new connections, the running stream finishes, exit 0.
#[cfg(unix)]
#[test]
fn sigterm_lets_running_streams_finish_then_exits_zero() {
    let model = demo();
    // A deadline no loaded CI machine reaches: the stream must finish.
    let mut server = Server::start(&["-m", &model, "--shutdown-timeout", "120"]);
    let body = json!({"prompt": "The best way to", "max_tokens": 40, "ignore_eos": true, "stream": true});
    let mut stream = Stream::open(&server, "/v1/completions", &body);
    stream.next_data().expect("a first chunk");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (_, finish) = stream.finish();
    assert_eq!(finish, "length");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the server did not exit");
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

/// A Python with the `openai` package: CLEAVE_OPENAI_PYTHON, else a venv
/// in the user's cache (made on first use, `pip install openai` from PyPI).
#[test]
fn the_official_openai_python_client_is_served() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--api-key", "sesame", "--parallel", "2"]);
    run_openai_script("openai_client.py", &[&server.base, "sesame"]);
}

/// Structured outputs through the official openai client: 20 answers held
/// to JSON schemas validate against them (Python's jsonschema), greedy and
/// sampled, whole and streamed; GBNF, regex and choice answers are among
/// their strings; an unsupported schema, a grammar that matches nothing or
/// is not GBNF, and two constraints at once are 400s naming the field.
#[test]
fn structured_answers_validate_against_their_schemas() {
    let server = Server::start(&["-m", &demo()]);
    run_openai_script("openai_structured.py", &[&server.base]);
}

/// Tool calls through the official openai client, on a model under
/// Qwen2.5's published template (Hermes' form) and under Mistral Nemo's
/// (`[TOOL_CALLS]`): a named function and `required` give calls whose
/// arguments validate against its schema, greedy and sampled; streamed
/// deltas reassemble to the same call; the call goes back through the
/// template; a call and its result in the conversation take transformers'
/// prompt tokens; the Responses API gives the same calls as items; bad
/// tools are named 400s.
#[test]
fn tool_calls_validate_and_round_trip_through_the_template() {
    for template in ["Qwen2.5-7B-Instruct", "Mistral-Nemo-Instruct-2407"] {
        let case = published_chats()
            .into_iter()
            .find(|c| c["template"] == template && c["conversation"] == "with tools")
            .unwrap();
        let dir = llama_tiny_with_published_template(template);
        // The template's tool instructions take more than the fixture's 256
        // positions; rotary positions need no weights.
        common::edit_json(&dir.path().join("config.json"), |c| {
            c["max_position_embeddings"] = json!(2048)
        });
        let server = Server::start(&["-m", dir.path().to_str().unwrap(), "-c", "2048"]);
        run_openai_script("openai_tools.py", &[&server.base, &case.to_string()]);
    }
}

/// A model under gpt-oss's harmony template reads a chat's answer by its
/// channels: held by a regex to an answer that writes the analysis
/// channel and then the final one, it gives the final channel as the
/// content and the analysis as `reasoning_content`, whole and streamed,
/// no marker left in either; a named function's call, held to harmony's
/// syntax, is the answer's call, whole and streamed; the Responses API's
/// message is the final channel.
#[test]
fn harmony_answers_are_read_by_channel() {
    let dir = llama_tiny_with_published_template("gpt-oss-120b");
    // The template's system message takes more than the fixture's 256
    // positions; rotary positions need no weights.
    common::edit_json(&dir.path().join("config.json"), |c| {
        c["max_position_embeddings"] = json!(2048)
    });
    let server = Server::start(&["-m", dir.path().to_str().unwrap(), "-c", "2048"]);
    let answer =
        "<|channel|>analysis<|message|>Weighing it.<|end|><|start|>assistant<|channel|>final<|message|>Hi there";
    let regex: String = answer
        .chars()
        .flat_map(|c| match "\\.^$|?*+()[]{}".contains(c) {
            true => vec!['\\', c],
            false => vec![c],
        })
        .collect();
    let body = json!({
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 300,
        "temperature": 0,
        "structured_outputs": {"regex": regex},
    });
    let (status, _, reply) = common::post(&server, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let message = &reply["choices"][0]["message"];
    assert_eq!(
        (&message["content"], &message["reasoning_content"]),
        (&json!("Hi there"), &json!("Weighing it."))
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let mut stream = Stream::open(&server, "/v1/chat/completions", &streamed);
    let (mut content, mut reasoning) = (String::new(), String::new());
    while let Some(data) = stream.next_data().filter(|d| d != "[DONE]") {
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        content.push_str(delta["content"].as_str().unwrap_or_default());
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
    }
    assert_eq!((content.as_str(), reasoning.as_str()), ("Hi there", "Weighing it."));

    // A named function: the call is held to harmony's syntax and read
    // back as the answer's call, whole and streamed.
    // gpt-oss's template writes each function's description; a random
    // model's free string or extra keys would not end, a choice of two
    // does.
    let city = json!({"type": "string", "enum": ["Bern", "Basel"]});
    let parameters =
        json!({"type": "object", "properties": {"city": city}, "required": ["city"], "additionalProperties": false});
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
        "parameters": parameters}}]);
    let call = json!({
        "messages": [{"role": "user", "content": "Weather in Bern?"}],
        "max_tokens": 300,
        "temperature": 0,
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    });
    let (status, _, reply) = common::post(&server, "/v1/chat/completions", &call);
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let function = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(function["name"], "get_weather", "{reply}");
    let arguments: Value = serde_json::from_str(function["arguments"].as_str().unwrap()).unwrap();
    assert!(
        ["Bern", "Basel"].contains(&arguments["city"].as_str().unwrap()),
        "{arguments}"
    );
    let mut streamed_call = call.clone();
    streamed_call["stream"] = json!(true);
    let mut stream = Stream::open(&server, "/v1/chat/completions", &streamed_call);
    let mut names = Vec::new();
    while let Some(data) = stream.next_data().filter(|d| d != "[DONE]") {
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        assert!(!delta["content"].as_str().unwrap_or_default().contains("<|"), "{chunk}");
        if let Some(calls) = delta["tool_calls"].as_array() {
            names.extend(calls.iter().map(|c| c["function"]["name"].clone()));
        }
    }
    assert_eq!(names, [json!("get_weather")]);

    // The Responses API takes no regex: a JSON string held to one value
    // writes the final channel inside its quotes.
    let schema = json!({"type": "json_schema", "name": "said", "schema": {"const": "<|channel|>final<|message|>Hi"}});
    let response = json!({"input": "Hello", "max_output_tokens": 300, "temperature": 0, "text": {"format": schema}});
    let (status, _, reply) = common::post(&server, "/v1/responses", &response);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["output"][0]["content"][0]["text"], "Hi\"", "{reply}");
}

/// The official openai client's Responses API gets the chat API's
/// answers, whole and streamed as typed events.
#[test]
fn the_openai_clients_responses_are_the_chats_answers() {
    let server = Server::start(&["-m", &demo()]);
    run_openai_script("openai_responses.py", &[&server.base]);
    let (status, _, json) = post(
        &server,
        "/v1/responses",
        &json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}),
    );
    assert_eq!(
        (status, json["error"]["param"].as_str()),
        (400, Some("input")),
        "{json}"
    );
}

#[test]
fn metrics_count_unknown_paths_as_one_label_and_need_the_key_when_one_is_set() {
    let model = demo();
    let get = |server: &Server, path: &str, key: Option<&str>| {
        let mut r = agent().get(&server.url(path));
        if let Some(key) = key {
            r = r.header("Authorization", &format!("Bearer {key}"));
        }
        let mut response = r.call().unwrap();
        (
            response.status().as_u16(),
            response.body_mut().read_to_string().unwrap(),
        )
    };
    let server = Server::start(&["-m", &model, "--api-key", "sesame"]);
    for path in ["/a%22b%5Cc", "/made/up/1", "/made/up/2"] {
        assert_eq!(get(&server, path, Some("sesame")).0, 404, "{path}");
    }
    assert_eq!(get(&server, "/metrics", None).0, 401);
    let (status, text) = get(&server, "/metrics", Some("sesame"));
    assert_eq!(status, 200);
    assert!(text.contains("path=\"other\",status=\"404\"} 3"), "{text}");
    assert!(!text.contains("made") && !text.contains("a%22b"), "{text}");
    drop(server);

    let server = Server::start(&["-m", &model, "--api-key", "sesame", "--metrics-public"]);
    assert_eq!(get(&server, "/metrics", None).0, 200);
    assert_eq!(get(&server, "/v1/models", None).0, 401);
}

#[test]
fn an_announced_body_past_the_limit_is_refused_before_it_is_sent() {
    use std::io::{Read, Write};
    let model = demo();
    let server = Server::start(&["-m", &model, "--max-body", "2KiB"]);
    let address = server.base.trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Headers only: the 64 MiB never come.
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: 67108864\r\n\r\n"
    )
    .unwrap();
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).expect("an answer before any body byte");
    assert_eq!(&answer, b"HTTP/1.1 413");
}

/// Sends `body` to /v1/completions in chunks of 512 bytes with no
/// Content-Length (`Transfer-Encoding: chunked`), without the closing
/// chunk when `finished` is false, and returns the status line of the
/// answer.
fn post_chunked(server: &Server, body: &[u8], finished: bool) -> String {
    use std::io::Write;
    let mut stream = connect(server);
    let host = server.base.trim_start_matches("http://");
    let mut request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.chunks(512) {
        request.extend(format!("{:x}\r\n", chunk.len()).bytes());
        request.extend(chunk);
        request.extend(b"\r\n");
    }
    if finished {
        request.extend(b"0\r\n\r\n");
    }
    stream.write_all(&request).unwrap();
    let answer = BufReader::new(stream).lines().next();
    answer.and_then(Result::ok).unwrap_or_default()
}

/// A body sent in chunks announces no length, so the limit is enforced
/// while it is read: past `--max-body` it gets 413 without the rest being
/// waited for, while one within the limit is served.
#[test]
fn a_chunked_body_past_the_limit_gets_413() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--max-body", "2KiB"]);
    let small = json!({"prompt": "Never", "max_tokens": 2}).to_string();
    assert_eq!(post_chunked(&server, small.as_bytes(), true), "HTTP/1.1 200 OK");
    let large = json!({"prompt": "a ".repeat(1500), "max_tokens": 2}).to_string();
    assert!(large.len() > 2048);
    assert_eq!(
        post_chunked(&server, large.as_bytes(), false),
        "HTTP/1.1 413 Payload Too Large"
    );
    assert!(!completion_text(&server, &json!({"prompt": "Never", "max_tokens": 3})).is_empty());
}

/// After requests of every kind (completions and chat, streamed and not,
/// text and token-id prompts, greedy and sampled, stopped by length or a
/// stop string), the token counters of /metrics are the sums of the
/// `usage` they reported.
#[test]
fn the_token_counters_are_the_sums_of_the_reported_usage() {
    let dir = fixture("llama-tiny");
    let server = Server::start(&["-m", dir.to_str().unwrap(), "--parallel", "2"]);
    let chat = json!([{"role": "user", "content": "Computers are"}]);
    let requests = [
        (
            "/v1/completions",
            json!({"prompt": "The quick brown fox", "max_tokens": 9, "ignore_eos": true}),
        ),
        // Greedy, so that it surely meets a stop: sampled, one seed in
        // about 400 goes 40 tokens without either letter.
        (
            "/v1/completions",
            json!({"prompt": "Every program", "max_tokens": 40, "stop": ["e", "a"], "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [0, 300, 301, 302], "max_tokens": 5, "seed": 3}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "A journey", "max_tokens": 12, "temperature": 1.5, "seed": 1}),
        ),
        ("/v1/chat/completions", json!({"messages": chat, "max_tokens": 7})),
    ];
    let (mut prompt, mut completion, mut cached) = (0, 0, 0);
    let mut finish_reasons = std::collections::BTreeSet::new();
    for (path, body) in &requests {
        let (status, _, json) = post(&server, path, body);
        assert_eq!(status, 200, "{json}");
        finish_reasons.insert(json["choices"][0]["finish_reason"].as_str().unwrap().to_string());
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        // The stream repeats the prompt, which a slot's cache now holds.
        let usage = Stream::open(&server, path, &streamed).usage();
        for usage in [&json["usage"], &usage] {
            prompt += usage["prompt_tokens"].as_u64().unwrap();
            completion += usage["completion_tokens"].as_u64().unwrap();
            cached += usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        }
    }
    assert_eq!(finish_reasons, ["length", "stop"].map(String::from).into());
    assert!(cached > 0, "no prompt was read from a cache");
    assert_eq!(metric(&server, "cleave_prompt_tokens_total{group=\"0\"}"), prompt);
    assert_eq!(
        metric(&server, "cleave_prompt_tokens_reused_total{group=\"0\"}"),
        cached
    );
    assert_eq!(
        metric(&server, "cleave_generated_tokens_total{group=\"0\"}"),
        completion
    );
    // The same under vLLM's names, as routers read them.
    let model = "{model_name=\"llama-tiny\"}";
    assert_eq!(
        metric(&server, &format!("vllm:prefix_cache_queries_total{model}")),
        prompt
    );
    assert_eq!(metric(&server, &format!("vllm:prefix_cache_hits_total{model}")), cached);
    assert_eq!(metric(&server, &format!("vllm:num_requests_running{model}")), 0);
    assert_eq!(metric(&server, &format!("vllm:num_requests_waiting{model}")), 0);
}

/// While a stream runs, the routers' families count it, and the share of
/// the KV cache it holds.
#[test]
fn a_running_stream_is_counted_under_the_names_routers_read() {
    let server = Server::start(&["-m", &demo(), "--parallel", "2"]);
    let body = json!({"prompt": "The best way to", "max_tokens": 200, "ignore_eos": true, "stream": true});
    let mut stream = Stream::open(&server, "/v1/completions", &body);
    stream.read_text(4);
    let model = "{model_name=\"fortune-llama-3m\"}";
    assert_eq!(metric(&server, &format!("vllm:num_requests_running{model}")), 1);
    let page = agent()
        .get(&server.url("/metrics"))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    for name in ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"] {
        let usage: f64 = page
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{model} ")))
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{page}"))
            .parse()
            .unwrap();
        // The prompt and the tokens fed back so far, of 2 slots of 512
        // positions.
        assert!((7.0 / 1024.0..0.5).contains(&usage), "{name}: {usage}");
    }
}

/// A raw connection to the server, for what no HTTP client sends.
fn connect(server: &Server) -> std::net::TcpStream {
    let address = server.base.trim_start_matches("http://");
    let stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream
}

/// Reads what the server sends until it closes the connection, and how
/// long that took.
fn read_until_closed(mut stream: std::net::TcpStream) -> (String, Duration) {
    let start = Instant::now();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    (String::from_utf8_lossy(&answer).into_owned(), start.elapsed())
}

#[test]
fn slow_and_silent_connections_are_closed_after_the_read_timeout() {
    use std::io::Write;
    let model = demo();
    let server = Server::start(&["-m", &model, "--read-timeout", "1"]);
    // Connected, silent: closed once the first request's headers are late.
    let idle = connect(&server);
    // Half a request line and a header, then nothing.
    let mut partial = connect(&server);
    write!(partial, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n").unwrap();
    // Whole headers that promise a body that never comes.
    let mut bodiless = connect(&server);
    write!(
        bodiless,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"pro"
    )
    .unwrap();
    for (what, stream, answer) in [
        ("idle", idle, ""),
        ("partial headers", partial, ""),
        ("no body", bodiless, "HTTP/1.1 408"),
    ] {
        let (got, took) = read_until_closed(stream);
        assert!(got.starts_with(answer), "{what}: {got}");
        assert!(took < Duration::from_secs(10), "{what}: closed after {took:?}");
    }
    // A keep-alive connection idle past the timeout is closed too.
    let mut kept = connect(&server);
    write!(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (got, took) = read_until_closed(kept);
    assert!(
        got.starts_with("HTTP/1.1 200") && got.contains("\"status\":\"ok\""),
        "{got}"
    );
    assert!(took < Duration::from_secs(10), "kept alive for {took:?}");
}

#[test]
fn connections_past_the_cap_get_503_and_freed_places_are_reused() {
    use std::io::Write;
    let model = demo();
    let server = Server::start(&["-m", &model, "--max-connections", "2"]);
    let held = [connect(&server), connect(&server)];
    let mut third = connect(&server);
    write!(third, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (got, _) = read_until_closed(third);
    assert!(
        got.starts_with("HTTP/1.1 503") && got.contains("too_many_connections"),
        "{got}"
    );
    drop(held);
    wait_until("a freed connection place", || {
        agent()
            .get(&server.url("/health"))
            .call()
            .is_ok_and(|r| r.status().as_u16() == 200)
    });
}

#[cfg(unix)]
#[test]
fn sigterm_does_not_wait_for_idle_or_half_sent_connections() {
    use std::io::Write;
    let model = demo();
    let mut server = Server::start(&["-m", &model, "--shutdown-timeout", "120", "--read-timeout", "3"]);
    let _idle = connect(&server);
    let mut partial = connect(&server);
    write!(partial, "POST /v1/completions HTTP/1.1\r\n").unwrap();
    // Let the server take both connections before the signal.
    assert_eq!(
        agent().get(&server.url("/health")).call().unwrap().status().as_u16(),
        200
    );
    let start = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the server waited for its deadline"
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_prompt_far_past_the_context_is_refused_by_its_length_before_tokenizing() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--max-body", "8MiB"]);
    let huge = "word ".repeat(800_000);
    let (status, _, json) = post(&server, "/v1/completions", &json!({"prompt": huge}));
    assert_eq!(status, 400, "{json}");
    assert_eq!(json["error"]["code"], "context_length_exceeded");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("the prompt is 4000000 bytes"), "{message}");
    let (status, _, json) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": huge}]}),
    );
    assert_eq!(
        (status, json["error"]["param"].as_str()),
        (400, Some("messages")),
        "{json}"
    );
}

/// The demo model with another chat template in its tokenizer_config.json.
fn demo_with_chat_template(template: &str) -> tempfile::TempDir {
    let dir = common::copy_dir(std::path::Path::new(&demo()));
    let config_path = dir.path().join("tokenizer_config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["chat_template"] = json!(template);
    std::fs::write(&config_path, config.to_string()).unwrap();
    dir
}

#[test]
fn a_runaway_chat_template_is_stopped_and_the_server_answers_on() {
    let endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let dir = demo_with_chat_template(endless);
    let server = Server::start(&["-m", dir.path().to_str().unwrap()]);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (status, _, json) = post(&server, "/v1/chat/completions", &chat);
    assert_eq!(
        (status, json["error"]["param"].as_str()),
        (400, Some("messages")),
        "{json}"
    );
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("ran past its bound"), "{message}");
    assert!(!completion_text(&server, &json!({"prompt": "Never", "max_tokens": 2})).is_empty());
}

/// The processes whose parent is `pid` (the server's chat renderings).
#[cfg(target_os = "linux")]
fn children_of(pid: u32) -> usize {
    let pid = pid.to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path().join("stat")).ok())
        // "PID (NAME) STATE PPID ...", where NAME may hold anything.
        .filter(|stat| {
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1));
            parent == Some(pid.as_str())
        })
        .count()
}

/// SIGTERM with more slow chat renderings than run at once: the waiting
/// ones are answered 503 at once, the running ones when the deadline
/// passes, and the server exits soon after, not once every template has
/// had its turn.
#[cfg(target_os = "linux")]
#[test]
fn sigterm_answers_queued_and_running_chat_renderings_503_within_the_deadline() {
    use std::io::Write;
    // Each replace takes milliseconds and few steps: the rendering runs
    // until its own deadline of 10 s.
    let slow = "{% set s = 'x' * 4000000 %}{% for i in range(100000) %}{% set t = s.replace('x', 'yy') %}{% endfor %}";
    let dir = demo_with_chat_template(slow);
    let deadline = 3;
    let mut server = Server::start(&[
        "-m",
        dir.path().to_str().unwrap(),
        "--shutdown-timeout",
        &deadline.to_string(),
    ]);
    // The server renders as many at once as there are cores.
    let at_once = thread::available_parallelism().unwrap().get();
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    let clients: Vec<_> = (0..at_once + 3)
        .map(|_| {
            let mut stream = connect(&server);
            write!(
                stream,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            stream
        })
        .collect();
    let pid = server.child.id();
    wait_until("the renderings to start", || children_of(pid) == at_once);
    // Connections are taken in order: this one answered, all the others
    // were taken before it.
    assert_eq!(
        agent().get(&server.url("/health")).call().unwrap().status().as_u16(),
        200
    );
    thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let readers: Vec<_> = clients
        .into_iter()
        .map(|stream| thread::spawn(move || (read_until_closed(stream).0, signalled.elapsed())))
        .collect();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(deadline + 4),
            "the server did not exit within its deadline of {deadline} s"
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let mut answered_at_once = 0;
    for reader in readers {
        let (answer, took) = reader.join().unwrap();
        assert!(answer.starts_with("HTTP/1.1 503"), "after {took:?}: {answer}");
        let json = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        let json: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {answer}"));
        assert_eq!(
            (&json["error"]["type"], &json["error"]["code"]),
            (&json!("server_error"), &json!("shutting_down")),
            "{json}"
        );
        if took < Duration::from_secs(deadline) {
            answered_at_once += 1;
        }
    }
    assert!(answered_at_once >= 3, "{answered_at_once} answered before the deadline");
}

/// A long prompt that arrives while another stream runs is read a chunk
/// per step between that stream's tokens: the stream's text is the one it
/// gets alone, and the long prompt's completion is `cleave run`'s with the
/// same chunks.
#[test]
fn a_long_prompt_arriving_mid_stream_changes_neither_text() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--parallel", "2", "--prefill-chunk", "32"]);
    let short =
        json!({"prompt": "The best way to", "max_tokens": 60, "temperature": 0, "ignore_eos": true, "stream": true});
    let (alone, _) = Stream::open(&server, "/v1/completions", &short).finish();
    let mut stream = Stream::open(&server, "/v1/completions", &short);
    let mut text = stream.read_text(4);
    // About 450 tokens: fifteen chunks, read between the stream's steps.
    let prompt = "Never say never. ".repeat(90);
    let long = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let long_text = std::thread::scope(|s| {
        let long = s.spawn(|| completion_text(&server, &long));
        text.push_str(&stream.finish().0);
        long.join().unwrap()
    });
    assert_eq!(text, alone, "the running stream changed when a long prompt arrived");
    let run = cleave_run_text(&[
        "-m",
        &model,
        "-p",
        &prompt,
        "-n",
        "8",
        "--temp",
        "0",
        "--ignore-eos",
        "--prefill-chunk",
        "32",
    ]);
    assert_eq!(long_text, run);
}

/// A job counts against the queue from the moment it is taken until it
/// ends, its prefill included: `--parallel 1 --queue 2` admits three.
#[test]
fn a_request_in_prefill_still_counts_against_the_queue() {
    let model = demo();
    let server = Server::start(&["-m", &model, "--parallel", "1", "--queue", "2"]);
    // About 450 tokens: a prefill long enough to be caught in.
    let long = json!({"prompt": "Never say never. ".repeat(90), "max_tokens": 40, "ignore_eos": true, "stream": true});
    let short = json!({"prompt": "The best way to", "max_tokens": 40, "ignore_eos": true, "stream": true});
    let streams = [
        Stream::open(&server, "/v1/completions", &long),
        Stream::open(&server, "/v1/completions", &short),
        Stream::open(&server, "/v1/completions", &short),
    ];
    let (status, _, json) = post(&server, "/v1/completions", &json!({"prompt": "Never", "max_tokens": 2}));
    assert_eq!(status, 503, "a fourth request was admitted: {json}");
    for stream in streams {
        assert_eq!(stream.finish().1, "length");
    }
}

/// A device that fails mid-run fails its group's requests with a 500;
/// the group takes no more, and the other group serves the rest.
#[test]
fn a_failed_device_fails_its_groups_requests_and_the_other_group_serves() {
    let model = demo();
    let device = test_device_name();
    let groups = format!("{device};{device}");
    let server = Server::start_with_env(
        &["-m", &model, "--groups", &groups],
        &[("CLEAVE_INJECT_FAULT", "group=0,device=0,launch=3")],
    );
    let body = json!({"prompt": "The best way to", "max_tokens": 4});
    // Both groups are idle: the first request goes to group 0.
    let (status, _, json) = post(&server, "/v1/completions", &body);
    assert_eq!(status, 500, "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("launch failed (injected fault)"), "{message}");
    let health = agent()
        .get(&server.url("/health"))
        .call()
        .unwrap()
        .body_mut()
        .read_json::<Value>()
        .unwrap();
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(metric(&server, "cleave_group_up{group=\"0\"}"), 0);
    for _ in 0..3 {
        assert!(!completion_text(&server, &body).is_empty());
    }
    assert_eq!(metric(&server, "cleave_group_up{group=\"1\"}"), 1);
}

/// A model whose generation_config.json lists several end-of-sequence ids
/// (as Llama 3's does: `<|end_of_text|>`, `<|eom_id|>`, `<|eot_id|>`)
/// stops at any of them, in `run` and in `serve`: here at the first
/// reference greedy id made an end of sequence.
#[test]
fn a_list_of_eos_ids_ends_run_and_serve() {
    let dir = common::copy_of("llama-tiny");
    let case = reference(dir.path()).cases.remove(0);
    let (stop_at, eos) = (10, case.greedy_new_ids[10]);
    assert!(
        !case.greedy_new_ids[..stop_at].contains(&eos) && stop_at < case.decisive_steps(),
        "{:?}",
        case.greedy_new_ids
    );
    common::edit_json(&dir.path().join("generation_config.json"), |c| {
        c["eos_token_id"] = json!([1, eos])
    });
    let model = dir.path().to_str().unwrap();
    let out = common::cleave()
        .args([
            "run",
            "-m",
            model,
            "-p",
            &case.prompt,
            "--temp",
            "0",
            "-n",
            "24",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["new_ids"], json!(case.greedy_new_ids[..stop_at]), "{run}");
    assert_eq!(run["stop"], "eos", "{run}");

    let server = Server::start(&["-m", model]);
    let body = json!({"prompt": case.prompt, "max_tokens": 24, "temperature": 0});
    let (status, _, completion) = post(&server, "/v1/completions", &body);
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop", "{completion}");
    assert_eq!(completion["usage"]["completion_tokens"], stop_at, "{completion}");
    assert_eq!(completion["choices"][0]["text"], run["text"], "{completion}");
}
