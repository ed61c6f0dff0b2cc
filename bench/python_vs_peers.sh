#!/usr/bin/env bash
# dtrain from Python against the dtrain command and PyTorch eager, in one run, the programs
# alternating RUNS times (medians of samples/s):
#   - model.fit from Python against `dtrain fit` on the seeds' large MLP (same config);
#   - the seeds' custom loop (GradientTape + strategy.run) from Python against the same loop
#     in PyTorch eager (bench/peers/pytorch_train.py), on the small and the large MLP.
# Needs `scripts/install-deps.sh --peers` for PyTorch (skipped without it).
#   RUNS=5 THREADS=2 bench/python_vs_peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/${PRESET:-release}
runs=${RUNS:-3}
threads=${THREADS:-2}
py=/usr/bin/python3
export PYTHONPATH=$build/python OPENBLAS_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
have_torch=0
$py -c "import torch" 2>/dev/null && have_torch=1
for r in $(seq "$runs"); do
  "$build/dtrain" fit examples/configs/seed_large.json --epochs 3 --threads "$threads" --verbose 0 \
    --summary "$out/cli.json" >/dev/null
  $py -c "import json; print(json.dumps({'samples_per_second': json.load(open('$out/cli.json'))['samples_per_second']}))" >> "$out/cli_fit"
  $py bench/python_loops.py fit --threads "$threads" >> "$out/python_fit"
  for m in seed_small seed_large; do
    $py bench/python_loops.py loop --model "$m" --threads "$threads" >> "$out/python_loop_$m"
    if [ "$have_torch" = 1 ]; then
      $py bench/peers/pytorch_train.py --model "$m" --threads "$threads" >> "$out/torch_loop_$m"
    fi
  done
done
$py - "$out" "$threads" "$runs" <<'PY'
import json, statistics, sys, os
out, threads, runs = sys.argv[1], sys.argv[2], sys.argv[3]
def med(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    return statistics.median(json.loads(l)["samples_per_second"] for l in open(path) if l.strip())
print(f"samples/s, medians of {runs} runs, {threads} threads")
print("| what | dtrain | peer | ratio |")
print("|---|---|---|---|")
cli, fit = med("cli_fit"), med("python_fit")
print(f"| seed_large model.fit: Python vs the dtrain command | {fit:.0f} | {cli:.0f} | {fit / cli:.3f} |")
for m in ("seed_small", "seed_large"):
    mine, torch = med(f"python_loop_{m}"), med(f"torch_loop_{m}")
    peer = f"{torch:.0f}" if torch else "(no PyTorch)"
    ratio = f"{mine / torch:.2f}" if torch else "-"
    print(f"| {m} custom loop: dtrain (Python) vs PyTorch eager | {mine:.0f} | {peer} | {ratio} |")
PY
