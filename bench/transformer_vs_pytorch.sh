#!/usr/bin/env bash
# A 4-layer, 256-wide, 4-head transformer encoder's training steps at sequence lengths 128
# and 512 (batch 8, 2 threads): dtrain (bench_transformer) against PyTorch's
# nn.TransformerEncoderLayer (bench/peers/pytorch_transformer.py), taking turns ROUNDS
# times; prints each round and the medians of samples/s, then attention alone (forward,
# and forward + backward) against the matmuls it contains, and its memory at length 4096.
#
#   bench/transformer_vs_pytorch.sh [ROUNDS=3]
set -euo pipefail

rounds=${1:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
bench="$here/build/release/bench/bench_transformer"
(cd "$here" && cmake --build --preset release --target bench_transformer >/dev/null)  # built on demand
/usr/bin/python3 -c "import torch" 2>/dev/null ||
  { echo "transformer_vs_pytorch.sh: /usr/bin/python3 has no torch; run scripts/install-deps.sh --peers" >&2; exit 1; }
cd "$here"
source bench/median.sh
# The peer without the OpenBLAS settings these machines may carry, which slow it.
peer() { env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /usr/bin/python3 bench/peers/pytorch_transformer.py "$@"; }
field() { /usr/bin/python3 -c "import json,sys
found = [json.loads(l) for l in sys.stdin if l.startswith('{')]
print(round(next(j['$2'] for j in found if j.get('bench') == '$1'), 2))"; }

for length in 128 512; do
  steps=$([ "$length" = 512 ] && echo 4 || echo 10)
  ours=() theirs=()
  for r in $(seq "$rounds"); do
    out=$("$bench" --threads 2 --length "$length" --steps "$steps")
    d=$(echo "$out" | field transformer_step samples_per_second)
    t=$(peer --threads 2 --length "$length" --steps "$steps" | field transformer_step samples_per_second)
    echo "length $length round $r: dtrain $d samples/s, PyTorch $t samples/s"
    ours+=("$d")
    theirs+=("$t")
  done
  echo "length $length median: dtrain $(median "${ours[@]}"), PyTorch $(median "${theirs[@]}") samples/s," \
       "ratio $(awk "BEGIN {printf \"%.2f\", $(median "${ours[@]}") / $(median "${theirs[@]}")}")"
  echo "$out" | grep -E '"bench":"attention' || true
  peer --threads 2 --length "$length" --steps 1 --warmup 0 | grep '"attention"' || true
done
