//! cleave's integration tests, built as one binary (`cargo test --release
//! --test suite`, a file's tests picked by its name: `-- golden::`).
//!
//! Each file here is a module. Built as a binary of its own, each file
//! instantiated the whole stack, generic over the runtime, once more: about
//! 100 s of release compilation a file, most of a fresh build. fuzz.rs stays
//! apart: its global allocator counts every allocation of its process.

mod common;

mod batch;
mod cli;
mod decode_steps;
mod deploy;
mod embedding_server;
mod encoder;
mod errors;
mod experts;
mod flux_encoders;
mod flux_pipeline;
mod flux_transformer;
mod flux_vae;
mod gguf;
mod golden;
mod hostile_hub;
mod image_server;
mod lora;
mod model_names;
mod precision;
mod rope;
mod runtimes;
mod server;
mod server_refusals;
mod split;
mod streaming;

/// Cargo builds only the test targets a manifest lists where it turns
/// `autotests` off (here and in shaders/), so a file added to a tests/
/// folder but to neither its suite nor its manifest would never run.
#[test]
fn every_test_file_is_built() {
    let crates = [
        ("", include_str!("suite.rs"), include_str!("../Cargo.toml")),
        (
            "shaders",
            include_str!("../shaders/tests/suite.rs"),
            include_str!("../shaders/Cargo.toml"),
        ),
    ];
    let mut unbuilt = Vec::new();
    for (dir, suite, manifest) in crates {
        let modules: Vec<&str> = suite
            .lines()
            .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join("tests");
        for entry in std::fs::read_dir(&tests).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            let Some(stem) = name.strip_suffix(".rs") else { continue };
            if !modules.contains(&stem) && !manifest.contains(&format!("path = \"tests/{name}\"")) {
                unbuilt.push(tests.join(name));
            }
        }
    }
    assert!(unbuilt.is_empty(), "test files no test target builds: {unbuilt:?}");
}
