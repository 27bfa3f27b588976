#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU, CUDA 13, Python with
# torch and transformers, and no Rust: unpacks the bundle that bundle.sh
# made and runs, each step under a timeout, what only a GPU can show. First,
# on an otherwise idle GPU, the timings: `--profile` of a decode, decode and
# prefill speed of random-weight Llama shapes (this build, fast and exact,
# and the baseline build, interleaved), transformers on the same weights,
# the device's copy bandwidth and cubek's matrix-unit matmuls. Then, all at
# once: the kernel, weight and golden tests on cuda0, every family fixture
# through `cleave logits`/`run` on cuda0 and across runtimes (cuda0 beside
# vulkan0), and logical devices of one GPU.
#
#   bash check.sh BUNDLE_DIR OUT_DIR [STEPS]
#
# STEPS (default: all) is a comma-separated list of step names, to rerun
# some; SHAPES (default "1b 8b") the random models made and timed;
# BINARIES (default "cleave cleave-baseline") the builds timed, and
# EXACT_SHAPES (default: SHAPES) those also timed at --precision exact. Each step's
# output goes to OUT_DIR/log.txt, one line per step to OUT_DIR/summary.txt,
# speed rows to OUT_DIR/perf.jsonl.
set -uo pipefail
set -a
bundle=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
steps=${3:-all}
work=${WORK_DIR:-/tmp/cleave-gpu}
mkdir -p "$work/logs"
log=$out/log.txt
summary=$out/summary.txt
perf=$out/perf.jsonl
: >"$summary"

# The driver's libraries, and NVRTC from torch's environment (cudarc loads
# both at run time).
python=$(command -v python3)
nvrtc_dir=$("$python" -c 'import nvidia, os; print(os.path.join(os.path.dirname(nvidia.__file__), "cu13", "lib"))' 2>/dev/null)
LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${nvrtc_dir:-}:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
XDG_RUNTIME_DIR=$work/xdg
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
CLEAVE_SHARED=$work/shared
cleave=$work/cleave
shapes=${SHAPES:-1b 8b}

wanted() { [ "$steps" = all ] || [[ ",$steps," == *",$1,"* ]]; }

# step NAME SECONDS COMMAND...: runs COMMAND under a hard timeout (a
# function too, with the variables it reads: set -a exports them), its
# output into the log once it ends, and says how it ended.
step() {
    local name=$1 seconds=$2
    shift 2
    wanted "$name" || return 0
    local start=$SECONDS
    declare -F "$1" >/dev/null && export -f "$1"
    timeout -k 5 "$seconds" bash -c '"$@"' step "$@" >"$work/logs/$name" 2>&1
    local rc=$?
    local verdict=ok
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && verdict="TIMEOUT after ${seconds}s"
    [ $rc -ne 0 ] && [ "$verdict" = ok ] && verdict="FAILED (exit $rc)"
    { echo "=== $name: $verdict"; cat "$work/logs/$name"; } >>"$log"
    printf '%-28s %-22s %4ds\n' "$name" "$verdict" $((SECONDS - start)) | tee -a "$summary"
}

unpack() {
    for f in "$bundle"/*.xz; do xz -dc "$f" >"$work/$(basename "$f" .xz)"; done
    chmod +x "$work"/cleave* "$work"/test-* "$work"/bench-* 2>/dev/null
    mkdir -p "$CLEAVE_SHARED" && tar -xJf "$bundle/shared.tar.xz" -C "$CLEAVE_SHARED"
    cp -r "$bundle"/*.py "$bundle/demo" "$work/"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
}

# Random-weight Llama shapes (the demo model's tokenizer: vocabulary 2048).
models() {
    for shape in $shapes; do
        [ -d "$work/$shape" ] || "$python" "$work/make_random_llama.py" "$work/$shape" "$shape" "$work/demo"
    done
}

# Greedy, then sampled with penalties: both picked on the device.
profile() {
    for sampling in "--temp 0" "--temp 0.8 --top-k 40 --repeat-penalty 1.1"; do
        # shellcheck disable=SC2086 # the settings are several flags
        "$cleave" run -m "$work/1b" --backend cuda0 -p "The best way to" -n 64 --ignore-eos $sampling --profile
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
        "$cleave" run -m "$work/1b" --backend cuda0 -p "$prompt" -n 128 --ignore-eos --temp 0 $drafting \
            --format json | "$python" -c '
import json, sys
r = json.load(sys.stdin)
print(json.dumps({"drafting": sys.argv[1], "decode_tok_s": r["timings"]["generation_tokens_per_second"],
                  "speculation": r["speculation"]}))' "$drafting" | tee -a "$perf"
    done
}

# Decode and prefill tok/s, differences of runs (cleave_perf.py): each
# build in turn, this one also with exact prefill products.
speed() {
    local shape=$1 n=$2
    for name in ${BINARIES:-cleave cleave-baseline}; do
        [ -x "$work/$name" ] || continue
        "$python" "$work/cleave_perf.py" "$work/$name" "$work/$shape" "$name $shape" "$n" -- --backend cuda0 |
            tee -a "$perf"
        if [ "$name" = cleave ] && [[ " ${EXACT_SHAPES:-$shapes} " == *" $shape "* ]]; then
            "$python" "$work/cleave_perf.py" "$work/$name" "$work/$shape" "$name $shape exact" "$n" -- \
                --backend cuda0 --precision exact | tee -a "$perf"
        fi
    done
}

peer() {
    for shape in $shapes; do "$python" "$work/hf_peer.py" "$work/$shape" 512 64 | tee -a "$perf"; done
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

# Logical devices of one GPU: a clear answer, never a hang.
logical() {
    for mode in layer tensor; do
        "$cleave" run -m "$CLEAVE_SHARED/fixtures/llama-tiny" --backend 'cuda0&cuda0' --split-mode $mode \
            -p "The best way to" -n 8 --temp 0 || true
    done
}

step unpack 120 unpack
step devices 30 "$cleave" devices
step random-models 120 models
step profile-1b 90 profile
step speculation-1b 120 speculation
step speed-1b 200 speed 1b 128
step speed-8b 240 speed 8b 64
step transformers 200 peer
step bandwidth 60 bandwidth
step bench-cubek 210 env CLEAVE_BENCH_DEVICE=cuda0 "$work/bench-cubek"

# Correctness, all at once: each test binary on cuda0 in both kernel
# forms, every family fixture against transformers, logical devices.
for t in "$work"/test-*; do
    step "$(basename "$t")" 240 env CLEAVE_TEST_DEVICE=cuda0 "$t" --test-threads 4 &
done
step fixtures 200 "$python" "$work/fixture_logits.py" "$cleave" "$CLEAVE_SHARED/fixtures" cuda0 &
step logical-devices 60 logical &
wait
# One model across runtimes: the same GPU through CUDA and through Vulkan
# (or the software adapter beside it), layer split, every family fixture.
step mixed-runtimes 200 "$python" "$work/fixture_logits.py" "$cleave" "$CLEAVE_SHARED/fixtures" "cuda0&vulkan0" &
wait
echo "summary:" && cat "$summary"
