#!/usr/bin/env bash
# The seeds' large MLP trained asynchronously by 2 workers and 1 ps, each process 1 thread,
# batch 64, Adam: dtrain's ParameterServerStrategy (bench_parameter_server under
# `dtrain launch --chief --workers 2 --ps 1`) against a PyTorch parameter server over
# torch.distributed.rpc (bench/peers/pytorch_ps.py), taking turns ROUNDS times; prints
# each round and the medians of global samples/s. dtrain runs twice a round: as it is (the
# tasks share this host, so values and gradients go through shared memory) and with
# `--shared-memory 0` (through gRPC messages, as between hosts).
#
#   bench/parameter_server_vs_rpc.sh [ROUNDS=5] [extra bench_parameter_server flags...]
set -euo pipefail

rounds=${1:-5}
shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
bench="$here/build/release/bench/bench_parameter_server"
(cd "$here" && cmake --build --preset release --target bench_parameter_server >/dev/null)  # built on demand
[ -x "$bench" ] || { echo "parameter_server_vs_rpc.sh: build first (make build)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null ||
  { echo "parameter_server_vs_rpc.sh: /usr/bin/python3 has no torch; run scripts/install-deps.sh --peers" >&2; exit 1; }

ours=() grpc=() theirs=()
run_ours() {
  OMP_NUM_THREADS=1 "$dtrain" launch --chief --workers 2 --ps 1 -- "$bench" --steps 200 "$@" |
    sed -n 's/^\[chief:0\] ParameterServerStrategy [a-z0-9()]* \([0-9]*\) samples.*/\1/p'
}
for r in $(seq "$rounds"); do
  d=$(run_ours "$@")
  g=$(run_ours --shared-memory 0 "$@")
  t=$(/usr/bin/python3 "$here/bench/peers/pytorch_ps.py" --workers 2 --steps 200 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; print(round(json.loads(sys.stdin.readlines()[-1])["samples_per_second"]))')
  echo "round $r: dtrain $d samples/s (gRPC only: $g), PyTorch RPC $t samples/s"
  ours+=("$d")
  grpc+=("$g")
  theirs+=("$t")
done
source "$here/bench/median.sh"
m_ours=$(median "${ours[@]}")
m_grpc=$(median "${grpc[@]}")
m_theirs=$(median "${theirs[@]}")
echo "median: dtrain $m_ours samples/s (gRPC only: $m_grpc), PyTorch RPC $m_theirs samples/s," \
  "ratio $(awk "BEGIN {printf \"%.2f\", $m_ours / $m_theirs}") ($(awk "BEGIN {printf \"%.2f\", $m_grpc / $m_theirs}") through gRPC)"
