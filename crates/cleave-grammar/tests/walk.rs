//! Grammars compiled against the demo model's vocabulary, walked token by
//! token: every walk ends in text the grammar describes.

use std::path::Path;

use cleave_grammar::{Constrainer, Constraint, Grammar, GrammarError};
use cleave_hf::Tokenizer;
use serde_json::json;

fn tokenizer() -> Tokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/fortune-llama-3m");
    Tokenizer::from_dir(&dir, &[]).expect("the demo model's tokenizer")
}

/// Takes allowed tokens, chosen by a small LCG from `seed`, until the
/// grammar is finished or an end-of-sequence id is taken; the text.
fn walk(tokenizer: &Tokenizer, mut constraint: Constraint, seed: u64) -> String {
    let mut state = seed;
    let mut ids = Vec::new();
    for _ in 0..400 {
        if constraint.is_finished() {
            break;
        }
        let words = constraint.allowed().unwrap();
        let allowed: Vec<u32> = (0..words.len() as u32 * 32)
            .filter(|&i| words[i as usize / 32] >> (i % 32) & 1 == 1)
            .collect();
        assert!(!allowed.is_empty(), "a step allowed nothing after {ids:?}");
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let id = allowed[(state >> 33) as usize % allowed.len()];
        constraint.accept(id).unwrap();
        if tokenizer.is_eos(id) {
            break;
        }
        ids.push(id);
    }
    tokenizer.decode(&ids).unwrap()
}

#[test]
fn every_walk_of_a_schema_is_json_of_that_shape() {
    let tokenizer = tokenizer();
    let constrainer = Constrainer::new(&tokenizer).unwrap();
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": false});
    for seed in 0..10 {
        let text = walk(
            &tokenizer,
            constrainer.compile(&Grammar::JsonSchema(schema.clone())).unwrap(),
            seed,
        );
        let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let object = value.as_object().unwrap();
        assert_eq!(object.len(), 3, "{text}");
        assert!(object["name"].as_str().unwrap().chars().count() <= 8, "{text}");
        assert!((0..=99).contains(&object["age"].as_i64().unwrap()), "{text}");
        assert!(
            object["tags"].as_array().unwrap().iter().all(|t| t == "a" || t == "b"),
            "{text}"
        );
    }
}

#[test]
fn every_walk_of_a_gbnf_grammar_is_one_of_its_strings() {
    let tokenizer = tokenizer();
    let constrainer = Constrainer::new(&tokenizer).unwrap();
    let gbnf = "root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3} \"!\"\n";
    for seed in 0..10 {
        let text = walk(
            &tokenizer,
            constrainer.compile(&Grammar::Gbnf(gbnf.into())).unwrap(),
            seed,
        );
        let (word, rest) = text.split_once(' ').unwrap_or_else(|| panic!("{text:?}"));
        assert!(word == "yes" || word == "no", "{text:?}");
        let digits = rest.strip_suffix('!').unwrap_or_else(|| panic!("{text:?}"));
        assert!(
            (1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
            "{text:?}"
        );
    }
}

#[test]
fn grammars_that_cannot_be_honoured_are_named() {
    let tokenizer = tokenizer();
    let constrainer = Constrainer::new(&tokenizer).unwrap();
    let err = |g: Grammar| constrainer.compile(&g).err().expect("an error").to_string();
    let schema = |s| err(Grammar::JsonSchema(s));
    assert!(schema(json!({"if": {"type": "string"}, "then": {"maxLength": 3}}))
        .contains(r#"Unimplemented keys: ["if", "then"]"#));
    assert!(schema(json!({"type": "strin"})).contains("Invalid type: strin"));
    // A remote reference is never fetched.
    let remote = schema(json!({"properties": {"a": {"$ref": "https://example.com/s.json"}}}));
    assert!(remote.contains("does not fetch"), "{remote}");
    assert!(schema(json!([1])).contains("a JSON schema is an object"));
    assert!(err(Grammar::Regex("a(".into())).contains("unclosed group"));
    assert!(err(Grammar::Lark("start: foo".into())).contains(r#"unknown name: "foo""#));
    assert!(err(Grammar::Gbnf("root ::= foo".into())).contains("rule 'foo' is used but never defined"));
    let nothing = constrainer.compile(&Grammar::Gbnf("root ::= [^\\x00-\\U0010FFFF]".into()));
    assert!(
        matches!(nothing, Err(GrammarError::MatchesNothing)),
        "{:?}",
        nothing.err()
    );
    let huge = "a".repeat(cleave_grammar::MAX_GRAMMAR_BYTES + 1);
    assert!(err(Grammar::Regex(huge)).contains("at most"));
}
