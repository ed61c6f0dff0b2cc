#!/usr/bin/env bash
# How well the doctor's what-if model predicts a run at 2 workers from the run at one
# worker and the measured link, on a link emulated between two network namespaces (veth,
# tbf at RATE each way). Per round: the seeds' large MLP at 1 worker (64 rows per step),
# at 2 workers in the namespaces (128 rows), and `dtrain probe-link` between them; then
# `dtrain doctor --runs` with the probe's link prints the model check. Needs root.
#
#   bench/doctor_model.sh [RATE ...]   (default: 1gbit 200mbit), ROUNDS=3
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
config="$here/examples/configs/seed_large.json"
. "$here/scripts/netns_pair.sh"
netns_bench_ready doctor_model.sh "$dtrain"
a=dtrain_model_a b=dtrain_model_b
addr_a=169.254.79.1 addr_b=169.254.79.2 port=29420
dir=$(mktemp -d)
trap 'netns_pair_down "$a" "$b"; rm -rf "$dir"' EXIT
cluster="{\"worker\": [\"$addr_a:$port\", \"$addr_b:$port\"]}"

# Runs "$@" once per worker, worker i in namespace i.
on_both() {
  local pids=() i ns token="model-$RANDOM"
  for i in 0 1; do
    ns=$([ $i = 0 ] && echo "$a" || echo "$b")
    ip netns exec "$ns" env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      OMP_NUM_THREADS=1 DTRAIN_CLUSTER_TOKEN="$token" "$@" >"$dir/out-$i.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  [ $failed = 0 ] || { cat "$dir"/out-*.log; exit 1; }
}

for rate in ${@:-1gbit 200mbit}; do
  netns_pair_up "$a" "$b" "$addr_a" "$addr_b" "$rate"
  echo "== link: tbf $rate each way"
  for round in $(seq "${ROUNDS:-3}"); do
    OMP_NUM_THREADS=1 "$dtrain" fit "$config" --strategy mirrored --replicas 1 --batch-size 64 --epochs 2 \
      --steps-per-epoch 40 --verbose 0 --summary "$dir/one.json" >/dev/null
    on_both "$dtrain" fit "$config" --strategy multi_worker --replicas 1 --batch-size 128 --epochs 2 \
      --steps-per-epoch 40 --verbose 0 --summary "$dir/two.json"
    on_both "$dtrain" probe-link --output "$dir/link.json"
    link=$(grep -o 'link=[^ ]*' "$dir/out-0.log")
    echo "round $round: probe $(grep -o 'link between.*message' "$dir/out-0.log")"
    "$dtrain" doctor --runs "$dir/one.json,$dir/two.json" --what-if "$link" >"$dir/doctor.txt"
    grep -A3 "^Model check" "$dir/doctor.txt" | tail -1
  done
  netns_pair_down "$a" "$b"
done
