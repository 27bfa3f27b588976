//! `cleave serve` on a sentence encoder (all-MiniLM-L6-v2): `/v1/embeddings`
//! gives sentence-transformers' embeddings (../shared/fixtures/
//! minilm-reference.json) for texts and for token ids, as floats and as
//! base64, to the official openai client too; bad inputs name their field,
//! and the text routes answer 404 saying what the server serves.

use crate::common;

use base64::Engine;
use common::{metric, minilm_dir, post, run_openai_script, shared_dir, Server};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct Case {
    sentence: String,
    input_ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn reference_path() -> std::path::PathBuf {
    shared_dir().join("fixtures/minilm-reference.json")
}

fn cases() -> Vec<Case> {
    #[derive(Deserialize)]
    struct Reference {
        cases: Vec<Case>,
    }
    let text = std::fs::read_to_string(reference_path()).unwrap();
    serde_json::from_str::<Reference>(&text).unwrap().cases
}

/// The embeddings of a 200 answer, in its order, decoded from base64
/// where they came so.
fn embeddings(answer: &Value) -> Vec<Vec<f32>> {
    let data = answer["data"].as_array().unwrap_or_else(|| panic!("no data: {answer}"));
    data.iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(
                (item["object"].as_str(), item["index"].as_u64()),
                (Some("embedding"), Some(i as u64))
            );
            match &item["embedding"] {
                Value::String(b64) => base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap()
                    .chunks(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                floats => serde_json::from_value(floats.clone()).unwrap(),
            }
        })
        .collect()
}

#[test]
fn embeddings_of_texts_and_ids_are_sentence_transformers() {
    let server = Server::start(&["-m", minilm_dir().to_str().unwrap()]);
    let cases = cases();
    let sentences: Vec<&str> = cases.iter().map(|c| c.sentence.as_str()).collect();
    let ids: Vec<&[u32]> = cases.iter().map(|c| c.input_ids.as_slice()).collect();
    let tokens: usize = ids.iter().map(|ids| ids.len()).sum();
    let (status, _, texts) = post(&server, "/v1/embeddings", &json!({"input": sentences}));
    assert_eq!(status, 200, "{texts}");
    assert_eq!(
        (texts["object"].as_str(), texts["usage"]["prompt_tokens"].as_u64()),
        (Some("list"), Some(tokens as u64))
    );
    let from_texts = embeddings(&texts);
    assert_eq!(from_texts.len(), cases.len());
    for (got, case) in from_texts.iter().zip(&cases) {
        common::max_diff(got, &case.embedding, &case.sentence, 1e-4);
    }
    // Token ids, one request each way, and base64: the same floats.
    let (status, _, from_ids) = post(
        &server,
        "/v1/embeddings",
        &json!({"input": ids, "encoding_format": "base64"}),
    );
    assert_eq!(status, 200, "{from_ids}");
    assert_eq!(
        embeddings(&from_ids),
        from_texts,
        "ids in base64 against texts in floats"
    );
    let (status, _, one) = post(&server, "/v1/embeddings", &json!({"input": sentences[1]}));
    assert_eq!(status, 200, "{one}");
    assert_eq!(
        embeddings(&one),
        [from_texts[1].clone()],
        "a sentence alone is what it is in a batch"
    );
    let inputs = metric(&server, "cleave_embedded_inputs_total{group=\"0\"}");
    assert_eq!(inputs, 2 * cases.len() as u64 + 1);

    for (body, param, says) in [
        (json!({"input": []}), "input", "give 1 to 2048"),
        (json!({"input": ["a", ""]}), "input", "input[1] is an empty text"),
        (
            json!({"input": [[1, 2], [99999999]]}),
            "input",
            "input[1]: token id 99999999 is outside the vocabulary",
        ),
        (
            json!({"input": [vec![101; 513]]}),
            "input",
            "holds 513 token ids: this encoder reads 1 to 512",
        ),
        (
            json!({"input": "a", "dimensions": 100}),
            "dimensions",
            "have 384 and cannot be shortened",
        ),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
            "not one of float, base64",
        ),
        (json!({"input": 5}), "input", "expected a string"),
    ] {
        let (status, _, answer) = post(&server, "/v1/embeddings", &body);
        assert_eq!(
            (status, answer["error"]["param"].as_str()),
            (400, Some(param)),
            "{body}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    let (status, _, answer) = post(&server, "/v1/completions", &json!({"prompt": "hi"}));
    assert_eq!(status, 404, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("is a sentence encoder") && message.contains("/v1/embeddings"),
        "{message}"
    );
}

#[test]
fn the_openai_client_gets_sentence_transformers_embeddings() {
    let server = Server::start(&["-m", minilm_dir().to_str().unwrap()]);
    run_openai_script(
        "openai_embeddings.py",
        &[&server.base, reference_path().to_str().unwrap()],
    );
}
