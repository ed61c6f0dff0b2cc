#!/usr/bin/env bash
# The seeds' large MLP on 2 processes x 1 thread, batch 64 per process (global 128):
# dtrain's MultiWorkerMirroredStrategy (bench_multi_worker under `dtrain launch`) against
# PyTorch DistributedDataParallel with the gloo backend (bench/peers/pytorch_ddp.py),
# taking turns ROUNDS times so that a slow spell of this machine hits both; prints each
# round and the medians of global samples/s.
#
#   bench/multi_worker_vs_ddp.sh [ROUNDS=5] [extra bench_multi_worker flags...]
set -euo pipefail

rounds=${1:-5}
shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
bench="$here/build/release/bench/bench_multi_worker"
(cd "$here" && cmake --build --preset release --target bench_multi_worker >/dev/null)  # built on demand
[ -x "$bench" ] || { echo "multi_worker_vs_ddp.sh: build first (make build)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null ||
  { echo "multi_worker_vs_ddp.sh: /usr/bin/python3 has no torch; run scripts/install-deps.sh --peers" >&2; exit 1; }

ours=() theirs=()
for r in $(seq "$rounds"); do
  d=$("$dtrain" launch --workers 2 -- "$bench" --steps 200 "$@" | sed -n 's/^\[worker:0\] MultiWorkerMirroredStrategy *[0-9.]* *//p')
  t=$(/usr/bin/python3 "$here/bench/peers/pytorch_ddp.py" --workers 2 --steps 200 |
    /usr/bin/python3 -c 'import json,sys; print(round(json.load(sys.stdin)["samples_per_second"]))')
  echo "round $r: dtrain $d samples/s, PyTorch DDP $t samples/s"
  ours+=("$d")
  theirs+=("$t")
done
source "$here/bench/median.sh"
m_ours=$(median "${ours[@]}")
m_theirs=$(median "${theirs[@]}")
echo "median: dtrain $m_ours samples/s, PyTorch DDP $m_theirs samples/s, ratio $(awk "BEGIN {printf \"%.2f\", $m_ours / $m_theirs}")"
