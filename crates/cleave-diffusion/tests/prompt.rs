//! Token ids of both prompts against the ids FluxPipeline fed its text encoders.

mod common;

use cleave_diffusion::prompt::PromptTokenizer;

fn max_sequence_length() -> usize {
    common::reference_json()["pipeline_call"]["max_sequence_length"]
        .as_u64()
        .expect("max_sequence_length") as usize
}

#[test]
fn clip_ids_match_reference() {
    let tokenizer = PromptTokenizer::clip(&common::fixture_dir().join("tokenizer")).expect("clip tokenizer");
    assert_eq!(tokenizer.max_length(), 77);
    for p in 0..2 {
        let expected = common::tensor(&format!("p{p}.clip_input_ids"));
        assert_eq!(expected.shape, [1, 77]);
        assert_eq!(
            tokenizer.encode(&common::prompt(p)).expect("encode"),
            expected.i64s(),
            "p{p}"
        );
    }
}

#[test]
fn t5_ids_match_reference_including_truncation() {
    let tokenizer =
        PromptTokenizer::t5(&common::fixture_dir().join("tokenizer_2"), max_sequence_length()).expect("t5 tokenizer");
    let reference = common::reference_json();
    for p in 0..2 {
        let expected = common::tensor(&format!("p{p}.t5_input_ids"));
        assert_eq!(expected.shape, [1, max_sequence_length()]);
        assert_eq!(
            tokenizer.encode(&common::prompt(p)).expect("encode"),
            expected.i64s(),
            "p{p}"
        );
    }
    // p1 is the prompt that overflows: its ids must end in EOS, not in a cut-off word.
    assert_eq!(reference["prompts"][1]["t5_truncated"], true);
}
