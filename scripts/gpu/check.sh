#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU, CUDA 13, Python with
# torch and transformers, and no Rust, from the repository's root (the
# scripts and the demo model's tokenizer come from the working tree):
# unpacks the bundle that bundle.sh made and runs, each step under a hard
# timeout, what only a GPU can show.
#
#   bash scripts/gpu/check.sh BUNDLE_DIR OUT_DIR [STEPS]
#
# STEPS (default: all, in this order) is a comma-separated list of step
# names; a step whose binary is not in the bundle is skipped. A device
# lease of 15 minutes fits two calls, each starting with `unpack` (times
# from an H200):
#
#   speed: unpack,devices,test-fast,random-models,bench-1b,bench-8b,
#       transformers,flux,flux-diffusers,bench-cubek,bandwidth   (about
#       6 minutes, `test-fast` first holding the fast products to the
#       rounded ones so that their timings mean something;
#       random models 28 s, bench-1b 22 s, bench-8b 99 s, transformers
#       48 s, diffusers 16 s, with two runs of `cleave bench` a shape;
#       now three)
#   kernels: unpack,devices,test-shaders   (in 8 processes at once: one
#       took over 5 minutes, compiling each kernel variant in turn)
#
# then, with the bundle's `golden` part: test-golden, test-devices,
# fixtures, mixed-runtimes; and profile-1b, speculation-1b,
# logical-devices. SHAPES (default "1b 8b") are the random models made,
# DEVICE (default cuda0) the device measured.
# Each step's output goes to OUT_DIR/log.txt, one line per step to
# OUT_DIR/summary.txt, speed rows (JSON) to OUT_DIR/perf.jsonl.
set -uo pipefail
set -a
bundle=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
steps=${3:-all}
repo=$(pwd)
scripts=$repo/scripts/gpu
work=${WORK_DIR:-/tmp/cleave-gpu}
mkdir -p "$work/logs"
log=$out/log.txt
summary=$out/summary.txt
perf=$out/perf.jsonl
touch "$summary"

# The driver's libraries, and NVRTC from torch's environment (cudarc loads
# both at run time).
python=$(command -v python3)
# `nvidia` is a namespace package: it has a path but no file.
nvrtc_dir=$("$python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${nvrtc_dir:-}:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
XDG_RUNTIME_DIR=$work/xdg
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
CLEAVE_SHARED=$work/shared
cleave=$work/cleave
shapes=${SHAPES:-1b 8b}
device=${DEVICE:-cuda0}

wanted() { [ "$steps" = all ] || [[ ",$steps," == *",$1,"* ]]; }

# step NAME SECONDS COMMAND...: runs COMMAND under a hard timeout (a
# function too, with the variables it reads: set -a exports them), its
# output into the log once it ends, and says how it ended. A step naming
# a binary that the bundle does not hold is skipped.
step() {
    local name=$1 seconds=$2 arg
    shift 2
    wanted "$name" || return 0
    for arg in "$@"; do
        if [[ $arg == "$work"/* ]] && [ ! -e "$arg" ]; then
            printf '%-20s %s\n' "$name" "skipped (no $(basename "$arg"))" | tee -a "$summary"
            return 0
        fi
    done
    local start=$SECONDS
    declare -F "$1" >/dev/null && export -f "$1"
    timeout -k 5 "$seconds" bash -o pipefail -c '"$@"' step "$@" >"$work/logs/$name" 2>&1
    local rc=$?
    local verdict=ok
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && verdict="TIMEOUT after ${seconds}s"
    [ $rc -ne 0 ] && [ "$verdict" = ok ] && verdict="FAILED (exit $rc)"
    { echo "=== $name: $verdict"; cat "$work/logs/$name"; } >>"$log"
    printf '%-20s %-22s %4ds\n' "$name" "$verdict" $((SECONDS - start)) | tee -a "$summary"
}

unpack() {
    tar -xJf "$bundle/bin.tar.xz" -C "$work" || return
    if [ -f "$bundle/shared.tar.xz" ]; then
        mkdir -p "$CLEAVE_SHARED" && tar -xJf "$bundle/shared.tar.xz" -C "$CLEAVE_SHARED" || return
        # The demo model's reference came in the bundle, its weights in the tree.
        ln -sf "$repo"/models/fortune-llama-3m/* "$CLEAVE_SHARED/models/fortune-llama-3m/"
    fi
    if [ -f "$bundle/diffusers.tar.xz" ]; then mkdir -p "$work/pylib" && tar -xJf "$bundle/diffusers.tar.xz" -C "$work/pylib"; fi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
}

# sharded N BINARY [ARG...]: the tests of a test BINARY on the device (ARG:
# its filters and skips) in N processes at once, a share of them each,
# their output prefixed with the process's number. A test process
# compiles each kernel variant with NVRTC on its device's one thread, so
# a single process takes the compile time of every variant in turn (more
# than 285 s for the kernel tests on an H200, on 16 test threads).
sharded() {
    local shards=$1 binary=$2 i j failed=0 tests pids=()
    shift 2
    mapfile -t tests < <("$binary" --list --format terse "$@" | sed -n 's/: test$//p')
    # A binary that cannot list its tests, or filters that match none, is
    # a failure, not an empty pass.
    if [ ${#tests[@]} -eq 0 ]; then
        echo "$binary listed no tests for: $*"
        return 1
    fi
    for ((i = 0; i < shards; i++)); do
        local mine=()
        for ((j = i; j < ${#tests[@]}; j += shards)); do mine+=("${tests[j]}"); done
        [ ${#mine[@]} -gt 0 ] || continue
        CLEAVE_TEST_DEVICE=$device "$binary" --exact --test-threads 2 "${mine[@]}" 2>&1 | sed -u "s/^/[$i] /" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || failed=1; done
    echo "${#tests[@]} tests in ${#pids[@]} processes"
    return $failed
}

# Random-weight Llama shapes (the demo model's tokenizer: vocabulary 2048).
models() {
    for shape in $shapes; do
        [ -d "$work/$shape" ] || "$python" "$scripts/make_random_llama.py" "$work/$shape" "$shape" "$repo/models/fortune-llama-3m"
    done
}

# `cleave bench` at each precision, `fast` with cuBLAS's products and with
# cubek's: a 512-token prompt in one pass, then N tokens one at a time
# (JSON rows, one a test, naming the products' library; the prompt's with
# where a pass's time goes, kernel by kernel).
bench() {
    local shape=$1 n=$2 run
    for run in "fast cublas" "fast cubek" "exact"; do
        # shellcheck disable=SC2086 # a precision, and a library for fast
        set -- $run
        CLEAVE_CUDA_PRODUCTS=${2:-} "$cleave" bench -m "$work/$shape" --backend "$device" -p 512 -n "$n" -r 5 \
            --precision "$1" --profile --format json | tee -a "$perf" || return
    done
}

peer() {
    for shape in $shapes; do "$python" "$scripts/hf_peer.py" "$work/$shape" 512 64 | tee -a "$perf" || return; done
}

# diffusers on the FLUX.1 blocks the flux step times (one double, one
# single, a 1024x1024 image's tokens).
flux_diffusers() {
    PYTHONPATH=$1 "$python" "$scripts/flux_peer.py" 1,1 5 | tee -a "$perf"
}

bandwidth() {
    "$python" -c '
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); s.record()
for _ in range(10): y.copy_(x)
e.record(); torch.cuda.synchronize()
print("copy bandwidth (read + write): %.0f GB/s" % (2 * 10 * x.numel() / (s.elapsed_time(e) / 1e3) / 1e9))'
}

# Greedy, then sampled with penalties: both picked on the device.
profile() {
    for sampling in "--temp 0" "--temp 0.8 --top-k 40 --repeat-penalty 1.1"; do
        # shellcheck disable=SC2086 # the settings are several flags
        "$cleave" run -m "$work/1b" --backend "$device" -p "The best way to" -n 64 --ignore-eos $sampling --profile ||
            return
    done
}

# Speculation on the 1B shape, 128 greedy tokens: plain, prompt lookup,
# and the model drafting for itself (every draft kept: the most a check
# in one pass can give, drafting included).
speculation() {
    local prompt drafting
    prompt=$(printf 'the best way to %.0s' {1..16})
    for drafting in "" "--prompt-lookup" "--draft-model $work/1b --draft-max 4" "--draft-model $work/1b --draft-max 8"; do
        # shellcheck disable=SC2086 # the drafting is several flags
        "$cleave" run -m "$work/1b" --backend "$device" -p "$prompt" -n 128 --ignore-eos --temp 0 $drafting \
            --format json | "$python" -c '
import json, sys
r = json.load(sys.stdin)
print(json.dumps({"drafting": sys.argv[1], "decode_tok_s": r["timings"]["generation_tokens_per_second"],
                  "speculation": r["speculation"]}))' "$drafting" | tee -a "$perf" || return
    done
}

# Logical devices of one GPU: a clear answer, never a hang.
logical() {
    for mode in layer tensor; do
        "$cleave" run --backend "$device&$device" --split-mode $mode -p "The best way to" -n 8 --temp 0 || true
    done
}

step unpack 60 unpack
step devices 30 "$cleave" devices
# The kernels first, at once: timings of wrong kernels are worth nothing.
# The GGUF fixtures' test reads the fixtures of the `golden` part.
[ -d "$CLEAVE_SHARED/fixtures" ] || no_fixtures="--skip gguf_fixture_tensors"
# Every variant (each weight type in every product): lavapipe in CI takes
# one of each layout.
# shellcheck disable=SC2086 # the skip is two words or none
CLEAVE_TEST_EVERY_VARIANT=1 step test-shaders 360 sharded 8 "$work/test-shaders" ${no_fixtures:-}
# Only the fast products' and attention's tests (the matrix units), where
# the whole suite does not run.
wanted test-shaders || CLEAVE_TEST_EVERY_VARIANT=1 step test-fast 150 sharded 4 "$work/test-shaders" fast_
step random-models 120 models
step bench-1b 150 bench 1b 128
step bench-8b 300 bench 8b 64
step transformers 200 peer
step flux 200 env CLEAVE_BENCH_DEVICE="$device" CLEAVE_BENCH_PASSES=6 "$work/bench-flux-block"
step flux-diffusers 150 flux_diffusers "$work/pylib"
step bench-cubek 300 env CLEAVE_BENCH_DEVICE="$device" "$work/bench-cubek"
step bandwidth 60 bandwidth
step profile-1b 90 profile
step speculation-1b 120 speculation
# The golden part, all at once: every family fixture against
# transformers (and that a load's weights and caches are buffers of their
# own size, which decides what a GPU holds beyond its plan), then across
# runtimes (the same GPU through CUDA and through Vulkan, or the software
# adapter beside it).
step test-golden 240 sharded 4 "$work/test-suite" golden:: split::weights_and_caches_reserve_what_they_use &
step test-devices 240 env CLEAVE_TEST_DEVICE="$device" "$work/test-devices" --test-threads 4 &
[ -d "$CLEAVE_SHARED/fixtures" ] && step fixtures 200 "$python" "$scripts/fixture_logits.py" "$cleave" "$CLEAVE_SHARED/fixtures" "$device" &
step logical-devices 60 logical &
wait
[ -d "$CLEAVE_SHARED/fixtures" ] && step mixed-runtimes 200 "$python" "$scripts/fixture_logits.py" "$cleave" "$CLEAVE_SHARED/fixtures" "$device&vulkan0"
echo "summary:" && cat "$summary"
