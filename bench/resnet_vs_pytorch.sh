#!/usr/bin/env bash
# The Fashion-MNIST ResNet (examples/configs/fashion_mnist_resnet.json), batch 128, training
# steps on 1 and 2 threads, float32 and each one's bfloat16 mixed precision: dtrain
# (bench_resnet) against PyTorch (bench/peers/pytorch_resnet.py, channels_last), taking
# turns ROUNDS times; prints each round and the medians of samples/s. Then the per-layer
# roofline on 2 threads: each convolution's time inside the step (oneDNN's own timing of
# each execution) against the same convolution run hot in a loop, and the resident memory
# after 100 and 1000 steps.
#
#   bench/resnet_vs_pytorch.sh [ROUNDS=3]
set -euo pipefail

rounds=${1:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
bench="$here/build/release/bench/bench_resnet"
(cd "$here" && cmake --build --preset release --target bench_resnet >/dev/null)  # built on demand
[ -x "$bench" ] || { echo "resnet_vs_pytorch.sh: build first (make build)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null ||
  { echo "resnet_vs_pytorch.sh: /usr/bin/python3 has no torch; run scripts/install-deps.sh --peers" >&2; exit 1; }
cd "$here"
source bench/median.sh
# The first step measurement's $1, reading the whole output (so the writer never meets a closed pipe).
field() { /usr/bin/python3 -c "import json,sys
found = [json.loads(l) for l in sys.stdin if l.startswith('{')]
print(round(next(j['$1'] for j in found if j.get('bench', 'resnet_step') == 'resnet_step' and '$1' in j)))"; }

for threads in 1 2; do
  for precision in f32 bf16; do
    flag=$([ "$precision" = bf16 ] && echo --bf16 || true)
    # PyTorch's bfloat16 convolutions run at a few samples/s on CPUs without AVX-512 BF16:
    # fewer steps there keep the run short.
    peer_steps=$([ "$precision" = bf16 ] && echo "--steps 4 --warmup 1" || echo "--steps 20")
    ours=() theirs=()
    for r in $(seq "$rounds"); do
      d=$("$bench" --threads "$threads" --steps 20 $flag | field samples_per_second)
      t=$(/usr/bin/python3 bench/peers/pytorch_resnet.py --threads "$threads" $peer_steps $flag | field samples_per_second)
      echo "threads $threads $precision round $r: dtrain $d samples/s, PyTorch $t samples/s"
      ours+=("$d")
      theirs+=("$t")
    done
    m_ours=$(median "${ours[@]}")
    m_theirs=$(median "${theirs[@]}")
    echo "threads $threads $precision median: dtrain $m_ours, PyTorch $m_theirs samples/s, ratio $(awk "BEGIN {printf \"%.2f\", $m_ours / $m_theirs}")"
  done
done

# The roofline: oneDNN's verbose log times every primitive inside the 20 timed steps (and the
# 5 warm-up ones); the hot figures come from the same run.
log=$(mktemp)
ONEDNN_VERBOSE=1 "$bench" --threads 2 --steps 20 > "$log"
/usr/bin/python3 - "$log" <<'PY'
import collections, json, re, sys
inside = collections.defaultdict(float)
hot, step = [], None
for line in open(sys.argv[1]):
    if line.startswith('onednn_verbose,exec') and ',convolution,' in line:
        f = line.strip().split(',')
        m = re.search(r'mb(\d+)_ic(\d+)oc(\d+)_ih(\d+)', f[-2])
        if m:
            inside[(int(m.group(2)), int(m.group(3)), int(m.group(4)), f[5])] += float(f[-1]) / 25  # ms per step
    elif line.startswith('{'):
        j = json.loads(line)
        if j['bench'] == 'resnet_conv_hot':
            hot.append(j)
        elif j['bench'] == 'resnet_conv_hot_total':
            step = j
total_inside = sum(inside.values())
print(f"convolutions inside the step: {total_inside:.1f} ms a step; run hot: {step['conv_hot_ms']:.1f} ms; "
      f"hot / inside {step['conv_hot_ms'] / total_inside:.2f}; step {step['step_ms']:.1f} ms, "
      f"convolutions hot = {100 * step['conv_share_of_step']:.0f}% of it")
PY
rm -f "$log"
"$bench" --threads 2 --steps 5 --rss-steps 1000 | grep resident_memory
