#!/usr/bin/env bash
# Builds what the GPU check (check.sh) runs and packs it into one folder to
# carry to a GPU machine without Rust. The working tree travels beside it
# (the scripts, the demo model's tokenizer), and the two together must stay
# under the 64 MiB a device call carries, so the bundle holds the parts it
# is asked for:
#
#   bash scripts/gpu/bundle.sh BUNDLE_DIR [PART...]
#
#   speed      (default) the cuda build of cleave (`cleave bench` on random
#              Llama shapes), the flux_block and cubek benches, and
#              diffusers (no pipelines) for flux_peer.py
#   kernels    (default) cleave-shaders' test binary (kernels, weights)
#   golden     the integration test binary (for its golden tests), the
#              device tests, and the reference fixtures (for
#              fixture_logits.py; 14 MiB compressed)
#   baseline=COMMIT   that commit's cleave as cleave-baseline (a git
#              worktree sharing the build's dependencies)
#
# Binaries are stripped and compressed together. CARGO_TARGET_DIR (default
# target/cuda) keeps the cuda build apart from the test build;
# CLEAVE_SHARED names the fixtures (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
bundle=$(mkdir -p "$1" && cd "$1" && pwd)
shift
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(speed kernels)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/cuda}
shared=${CLEAVE_SHARED:-$root/../shared}
rm -rf "${bundle:?}"/*

# pack NAME PATH: the binary at PATH, stripped, as NAME in the bundle's
# one archive of binaries (written at the end).
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pack() {
    cp "$2" "$stage/$1" && strip "$stage/$1"
}

# The executable cargo builds for a test or bench target: the last JSON
# line it prints for it.
executable() {
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1" | tail -1
}
test_binary() { local name=$1; shift; cargo test --release --no-run --message-format=json "$@" | executable "$name"; }
bench_binary() { cargo bench --no-run --message-format=json --bench "$1" "${@:2}" | executable "$1"; }

cargo build --release --features cuda --bin cleave
pack cleave "$CARGO_TARGET_DIR/release/cleave"

for part in "${parts[@]}"; do
    case $part in
    speed)
        pack bench-flux-block "$(bench_binary flux_block --features cuda)"
        # cubek's matmuls beside ours, 16-bit ones on the matrix units among them.
        pack bench-cubek "$(bench_binary cubek --features cubek,cuda)"
        # diffusers for flux_peer.py (the GPU machine has torch and its
        # other needs), without its pipelines: 1 MiB instead of 6.
        wheel=$(mktemp -d)
        python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheel" diffusers==0.42.1
        (cd "$wheel" && python3 -m zipfile -e diffusers-*.whl site &&
            rm -rf site/diffusers/pipelines/*/ site/diffusers/modular_pipelines site/diffusers/commands &&
            tar -C site -cJf "$bundle/diffusers.tar.xz" diffusers)
        rm -rf "$wheel"
        ;;
    kernels)
        pack test-shaders "$(test_binary suite -p cleave-shaders --features cuda,cleave-device/cuda --test suite)"
        ;;
    golden)
        pack test-suite "$(test_binary suite --features cuda --test suite)"
        pack test-devices "$(test_binary cleave_device -p cleave-device --features cuda --lib)"
        # The 16-bit GGUF files left out: large, and their types covered
        # by the safetensors fixtures. So are the fixtures that neither the
        # golden tests, the pool test (the LoRA adapter), fixture_logits.py
        # nor the kernels' GGUF test read.
        # The demo model's reference goes; check.sh links its weights from
        # the tree.
        tar -C "$shared" -cJf "$bundle/shared.tar.xz" --exclude '*-F16.gguf' --exclude '*-BF16.gguf' \
            --exclude fixtures/flux-tiny --exclude fixtures/minilm-reference.json \
            fixtures models/fortune-llama-3m/reference.json
        ;;
    baseline=*)
        worktree=$(mktemp -d)
        git worktree add --detach "$worktree" "${part#baseline=}"
        (cd "$worktree" && cargo build --release --features cuda --bin cleave)
        pack cleave-baseline "$CARGO_TARGET_DIR/release/cleave"
        git worktree remove --force "$worktree"
        # The worktree's build left its own cleave in the shared target dir.
        cargo build --release --features cuda --bin cleave
        ;;
    *)
        echo "bundle.sh: unknown part $part (speed, kernels, golden, baseline=COMMIT)" >&2
        exit 2
        ;;
    esac
done

# One solid archive, its window wider than any binary: they share most of
# their code (cubecl, the kernels), so each compresses against the others
# (the default four binaries: 16 MiB).
tar -C "$stage" -cf - . | xz -T1 -9e --lzma2=preset=9e,dict=256MiB >"$bundle/bin.tar.xz"

# What a device call carries: the tracked files and the bundle.
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
packed=$(du -cb "$bundle"/* | tail -1 | cut -f1)
ls -l "$bundle"
echo "bundle $((packed >> 20)) MiB + working tree $((tree >> 20)) MiB = $(((packed + tree) >> 20)) MiB (at most 64)"
if [ $((packed + tree)) -gt $((63 << 20)) ]; then
    echo "bundle.sh: too large to carry: ask for fewer parts" >&2
    exit 1
fi
