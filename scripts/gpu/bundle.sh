#!/usr/bin/env bash
# Builds what the GPU check (check.sh) runs and packs it into one folder
# small enough to carry to a GPU machine without Rust (under 60 MiB): the
# cuda build of cleave, the kernel and golden test binaries, the reference
# fixtures, the demo model's tokenizer, and the Python helpers.
#
#   bash scripts/gpu/bundle.sh BUNDLE_DIR [BASELINE_COMMIT]
#
# With BASELINE_COMMIT, that commit's cleave is built too (in a git
# worktree, sharing the build's dependencies) and carried as
# cleave-baseline, so that the check times before and after in one run.
# CARGO_TARGET_DIR (default target/cuda) keeps the cuda build apart from
# the test build; CLEAVE_SHARED names the fixtures (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
bundle=$(mkdir -p "$1" && cd "$1" && pwd)
baseline=${2:-}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/cuda}
shared=${CLEAVE_SHARED:-$root/../shared}
rm -f "$bundle"/*

cargo build --release --features cuda --bin cleave
xz -T0 -6 -c "$CARGO_TARGET_DIR/release/cleave" >"$bundle/cleave.xz"

# Test binaries: the path of each is the last JSON line cargo prints for it.
test_binary() {
    cargo test --release --no-run --message-format=json "$@" |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}
for t in kernels weights; do
    exe=$(test_binary -p cleave-shaders --features cuda,cleave-device/cuda --test $t)
    xz -T0 -6 -c "$exe" >"$bundle/test-$t.xz"
done
exe=$(test_binary --features cuda --test golden)
xz -T0 -6 -c "$exe" >"$bundle/test-golden.xz"
exe=$(test_binary -p cleave-device --features cuda --lib)
xz -T0 -6 -c "$exe" >"$bundle/test-devices.xz"
# cubek's matmuls beside ours, 16-bit ones on the matrix units among them.
exe=$(cargo bench --no-run --message-format=json --features cubek,cuda --bench cubek |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cubek":
        print(m["executable"])')
xz -T0 -6 -c "$exe" >"$bundle/bench-cubek.xz"

if [ -n "$baseline" ]; then
    worktree=$(mktemp -d)
    git worktree add --detach "$worktree" "$baseline"
    (cd "$worktree" && cargo build --release --features cuda --bin cleave)
    xz -T0 -6 -c "$CARGO_TARGET_DIR/release/cleave" >"$bundle/cleave-baseline.xz"
    git worktree remove --force "$worktree"
    # The worktree's build left its own cleave in the shared target dir.
    cargo build --release --features cuda --bin cleave
fi

# The fixtures the tests and fixture_logits.py read (the 16-bit GGUF files
# left out: large, and their types covered by the safetensors fixtures).
tar -C "$shared" -cJf "$bundle/shared.tar.xz" --exclude '*-F16.gguf' --exclude '*-BF16.gguf' fixtures
mkdir -p "$bundle/demo"
cp models/fortune-llama-3m/{config.json,tokenizer.json,tokenizer_config.json} "$bundle/demo/"
cp scripts/gpu/*.py "$bundle/"
du -sh "$bundle"
