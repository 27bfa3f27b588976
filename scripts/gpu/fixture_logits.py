"""Runs `cleave logits` and `cleave run` (greedy) on every decoder family fixture on one device and compares
with the fixture's transformers references (f32, so cleave runs at --precision exact): the largest logit
difference over every position of each case, and whether the greedy ids match. Prints one line per fixture,
exits 1 if any misses.
Usage: fixture_logits.py CLEAVE FIXTURES_DIR DEVICE"""
import json, os, subprocess, sys

cleave, fixtures, device = sys.argv[1:4]
# The tests' table of decoder fixtures (tests/common/decoders.txt): the first column of each line.
TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests")
TABLE = os.path.join(TESTS, "common", "decoders.txt")
# The project's own fixtures (made by tests/fixtures/decoders/make.py) come before the shared folder's.
OWN = os.path.join(TESTS, "fixtures", "decoders")
FAMILIES = [line.split()[0] for line in open(TABLE) if line.strip() and not line.startswith("#")]
TOLERANCE = 1e-3  # the tiled kernels' sums run in another order than transformers'
failed = False
for family in FAMILIES:
    model = os.path.join(OWN, family)
    if not os.path.isdir(model):
        model = os.path.join(fixtures, family)
    if not os.path.isdir(model):
        continue
    reference = json.load(open(os.path.join(model, "reference.json")))
    worst, greedy_ok = 0.0, True
    for case in reference["cases"]:
        ids = case["input_ids"]
        p = subprocess.run([cleave, "logits", "-m", model, "--backend", device, "--precision", "exact",
                            "--ids", ",".join(map(str, ids))],
                           capture_output=True, text=True, timeout=120)
        if p.returncode:
            print(f"{family}: logits failed: {p.stderr.strip()[-300:]}")
            failed = True
            break
        rows = json.loads(p.stdout)["logits"]
        worst = max(worst, max(abs(a - b) for row, ref in zip(rows, case["logits"]) for a, b in zip(row, ref)))
        prompt = case["prompt"]
        n = len(case["greedy_new_ids"])
        p = subprocess.run([cleave, "run", "-m", model, "--backend", device, "--precision", "exact",
                            "-p", prompt, "-n", str(n), "--temp", "0",
                            "--ignore-eos", "--format", "json"], capture_output=True, text=True, timeout=120)
        if p.returncode:
            print(f"{family}: run failed: {p.stderr.strip()[-300:]}")
            failed, greedy_ok = True, False
            break
        greedy_ok &= json.loads(p.stdout)["new_ids"] == case["greedy_new_ids"]
    ok = worst <= TOLERANCE and greedy_ok
    failed |= not ok
    print(f"{family:18} max |logit - transformers| {worst:.2e}  greedy ids {'match' if greedy_ok else 'DIFFER'}  {'ok' if ok else 'MISS'}")
sys.exit(1 if failed else 0)
