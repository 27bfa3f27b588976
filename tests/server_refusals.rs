//! What `cleave serve` refuses, and that it goes on serving after: a chat
//! template that builds values past its memory bound or nests too deep
//! (rendered in a child process, so a 400, not a dead server), token
//! budgets and sampling values judged as the engine takes them, and the
//! request fields it does not implement.

use crate::common;

use std::time::{Duration, Instant};

use common::{copy_of, edit_json, post, Server};
use serde_json::{json, Value};

/// llama-tiny's template, preceded by branches that, for a first message
/// of 'strings', 'lists' or 'deep', build a string or a list of 2^40
/// pieces, or a list nested 100,000 deep.
const TEMPLATE: &str = "{% set c = messages[0]['content'] %}\
    {% if c == 'strings' %}{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}\
    {% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}\
    {% elif c == 'lists' %}{% set ns = namespace(l=[1, 2, 3, 4]) %}\
    {% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}\
    {% elif c == 'deep' %}{% set ns = namespace(l=[]) %}\
    {% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}\
    {% else %}{% for m in messages %}<|begin|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n{% endfor %}\
    <|begin|>assistant\n{% endif %}";

fn chat(content: Value) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 2})
}

#[test]
fn refused_requests_get_named_errors_and_the_server_serves_on() {
    let model = copy_of("llama-tiny");
    edit_json(&model.path().join("tokenizer_config.json"), |c| {
        c["chat_template"] = json!(TEMPLATE)
    });
    let server = Server::start(&["-m", model.path().to_str().unwrap()]);

    for (content, says) in [
        ("strings", "the chat template built more than its bound of"),
        ("lists", "the chat template built more than its bound of"),
        ("deep", "the chat template nested or recursed too deep"),
    ] {
        let started = Instant::now();
        let (status, _, answer) = post(&server, "/v1/chat/completions", &chat(json!(content)));
        assert_eq!(status, 400, "{content}: {answer}");
        assert_eq!(answer["error"]["param"], "messages", "{content}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{content}: {message}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{content}: {:?}",
            started.elapsed()
        );
    }
    let health = common::agent().get(&server.url("/health")).call().unwrap();
    assert_eq!(health.status().as_u16(), 200);

    let completion = |extra: Value| {
        let mut body = json!({"prompt": "The best way to", "max_tokens": 2});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let cases: [(&str, Value, u16, &str, &str); 11] = [
        (
            "/v1/completions",
            completion(json!({"max_tokens": 18446744073709551615u64})),
            400,
            "max_tokens",
            "max_tokens is 18446744073709551615",
        ),
        (
            "/v1/completions",
            completion(json!({"top_p": 1e-50})),
            400,
            "top_p",
            "top_p 1e-50 is not in (0, 1]",
        ),
        (
            "/v1/completions",
            completion(json!({"presence_penalty": 2.5})),
            400,
            "presence_penalty",
            "presence_penalty 2.5 is not between -2 and 2",
        ),
        (
            "/v1/completions",
            completion(json!({"repeat_penalty": 0})),
            400,
            "repeat_penalty",
            "is not a finite number above 0 (1 is off)",
        ),
        (
            "/v1/completions",
            completion(json!({"temperature": 1e39})),
            400,
            "temperature",
            "temperature 1e+39 is not between 0 and 2",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
            400,
            "tools",
            "start cleave serve with --tool-format",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}),
            400,
            "response_format",
            "response_format type 'xml' is not one of text, json_object, json_schema",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
            400,
            "tool_choice",
            "tool_choice asks for a call, but 'tools' declares none",
        ),
        (
            "/v1/chat/completions",
            chat(json!([{"type": "image_url", "image_url": {"url": "data:,"}}])),
            400,
            "messages[0].content",
            "content parts of type 'image_url' are not supported",
        ),
        (
            "/v1/completions",
            completion(json!({"model": "gpt-4o"})),
            404,
            "model",
            "the model 'gpt-4o' does not exist here",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
            404,
            "model",
            "the model 'gpt-4o' does not exist here",
        ),
    ];
    for (path, body, want, param, says) in cases {
        let (status, _, answer) = post(&server, path, &body);
        assert_eq!(status, want, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    let (_, _, answer) = post(&server, "/v1/completions", &completion(json!({"model": "gpt-4o"})));
    assert_eq!(answer["error"]["code"], "model_not_found", "{answer}");

    // After all that, both routes still answer.
    let (status, _, answer) = post(&server, "/v1/completions", &completion(json!({})));
    assert_eq!(status, 200, "{answer}");
    let (status, _, answer) = post(&server, "/v1/chat/completions", &chat(json!("Hi")));
    assert_eq!(status, 200, "{answer}");
    assert!(answer["choices"][0]["message"]["content"].is_string(), "{answer}");
}
