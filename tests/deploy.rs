//! deploy/kubernetes/cleave.yaml against the Kubernetes API's schemas
//! (kubernetes-validate, strict: no unknown field), and against `cleave
//! serve`: its arguments are flags the command takes, its probes ask the
//! port it listens on, and the pod's grace period outlasts the drain.

use crate::common;

use std::path::PathBuf;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/cleave.yaml")
}

/// The value after `key:` on the first line that starts with it.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|line| line.trim().strip_prefix(key)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {key} in the manifest"))
        .trim()
}

#[test]
fn the_kubernetes_manifest_meets_the_api_schemas() {
    let out = std::process::Command::new(common::kubernetes_python())
        .args(["-m", "kubernetes_validate", "--strict", "--no-warn"])
        .arg(manifest())
        .output()
        .expect("run kubernetes-validate");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    for kind in ["deployment/cleave", "service/cleave", "poddisruptionbudget/cleave"] {
        assert!(report.contains(&format!("passed for resource {kind}")), "{report}");
    }
}

#[test]
fn the_kubernetes_manifest_runs_cleave_serve_as_its_probes_and_drain_expect() {
    let text = std::fs::read_to_string(manifest()).unwrap();
    // Written as a JSON list, so that this reads it without a YAML parser.
    let args: Vec<String> = serde_json::from_str(field(&text, "args")).expect("args as a one-line list");
    let flag = |name: &str| -> &str {
        let at = args
            .iter()
            .position(|a| a == name)
            .unwrap_or_else(|| panic!("no {name} in {args:?}"));
        &args[at + 1]
    };
    // clap parses every flag and value before it answers --help.
    let out = common::cleave().args(&args).arg("--help").output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(field(&text, "containerPort"), flag("--port"));
    assert_eq!(
        text.matches("path: /health").count(),
        3,
        "startup, readiness and liveness ask /health"
    );
    let grace: u64 = field(&text, "terminationGracePeriodSeconds").parse().unwrap();
    let drain: u64 = flag("--shutdown-timeout").parse().unwrap();
    let pause: u64 = field(&text, "seconds").parse().unwrap();
    // A request still running at the deadline gets 2 s to be told.
    assert!(
        grace > pause + drain + 2,
        "grace {grace} s: the drain takes {pause} + {drain} + 2 s"
    );
}
