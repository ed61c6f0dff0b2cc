#!/usr/bin/env bash
# Two workers joined by a narrow emulated link are diagnosed communication-bound, that
# cause named first, in every one of 10 runs (RUNS; 2 under a sanitizer, tests/CMakeLists.txt).
#
# The workers run in two network namespaces made here, joined by a veth pair whose ends
# are rate-limited with `tc qdisc ... tbf` (20 Mbit/s each way); the addresses exist only
# inside the namespaces, which are removed on exit. `dtrain doctor --runs` then reads the
# chief's summary. Where namespaces cannot be made (no root, no iproute2), the test is
# skipped (exit 77) with a message saying why.
#
#   tests/cli/narrow_link_test.sh DTRAIN_BINARY [RUNS] [JOB]   (10 runs unless given; JOB: mlp,
#   the default, or transformer: examples/configs/char_lm.json, 1.9 MB of gradients a step,
#   on a text file written here)
set -euo pipefail

dtrain=$1
skip() {
  echo "SKIPPED: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null && command -v tc >/dev/null || skip "ip and tc (iproute2) are not installed"

. "$(dirname "$0")/../../scripts/netns_pair.sh"
tag=$$
netns_pair_session dtrain_narrow
addr_a=169.254.78.1 addr_b=169.254.78.2 port=29410
why=$(netns_pair_up "$a" "$b" "$addr_a" "$addr_b" 20mbit) || skip "$why"

if [ "${3:-mlp}" = transformer ]; then
  # The character model's transformer (two blocks of causal attention, 128 wide): 1.9 MB of
  # gradients per step, about 0.8 s on the wire at 20 Mbit/s, at a batch of 16 windows.
  for i in $(seq 1 200); do echo "the narrow link carries every gradient of attention, line $i"; done >"$dir/text.txt"
  python3 - "$(dirname "$0")/../../examples/configs/char_lm.json" "$dir/text.txt" >"$dir/job.json" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
config["data"] = {"source": "text", "files": [sys.argv[2]], "length": 64, "held_out": 0}
config.update(epochs=2, batch_size=16, seed=1)
print(json.dumps(config))
EOF
  steps=3
else
  # A 256-wide MLP: 0.54 MB of gradients per step, about 0.2 s on the wire at 20 Mbit/s,
  # far more than its compute.
  cat >"$dir/job.json" <<'EOF'
{"model": {"input_shape": [256], "layers": [
   {"class_name": "Dense", "config": {"units": 256, "activation": "relu"}},
   {"class_name": "Dense", "config": {"units": 256, "activation": "relu"}},
   {"class_name": "Dense", "config": {"units": 10}}]},
 "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
 "optimizer": {"name": "sgd", "learning_rate": 0.01},
 "data": {"source": "synthetic", "samples": 512, "features": 256, "classes": 10},
 "epochs": 2, "batch_size": 64, "seed": 1}
EOF
  steps=5
fi

cluster="{\"worker\": [\"$addr_a:$port\", \"$addr_b:$port\"]}"
# The cause must be named first in every one of the runs, each a fresh pair of workers.
runs=${2:-10}
for run in $(seq 1 $runs); do
  rm -f "$dir/two.json"
  for i in 0 1; do
    ns=$([ $i = 0 ] && echo "$a" || echo "$b")
    ip netns exec "$ns" env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      OMP_NUM_THREADS=1 DTRAIN_CLUSTER_TOKEN="narrow-$tag-$run" \
      timeout 60 "$dtrain" fit "$dir/job.json" --strategy multi_worker --steps-per-epoch $steps --collective-timeout 60 \
      --verbose 0 --summary "$dir/two.json" >"$dir/worker-$i.log" 2>&1 &
    pids+=($!)
  done
  failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  pids=()
  if [ $failed != 0 ]; then
    echo "FAILED: run $run: a worker did not finish:"
    cat "$dir"/worker-*.log
    exit 1
  fi

  # Two namespaces stand for two hosts: the workers must not find each other's memory.
  grep -q '"transport": *"TCP (no shared memory: worker:1: not on worker:0.s host' "$dir/two.json" || {
    echo "FAILED: run $run: workers in two network namespaces did not keep to TCP:"
    grep '"transport"' "$dir/two.json"
    exit 1
  }
  "$dtrain" doctor --runs "$dir/two.json" >"$dir/doctor.txt"
  # The first finding under the diagnosis is the cause.
  first=$(sed -n '/^Diagnosis/,$p' "$dir/doctor.txt" | grep -m1 '^- ' || true)
  case "$first" in
    "- communication-bound: "*) echo "run $run of $runs: ${first:0:100}..." ;;
    *)
      cat "$dir/doctor.txt"
      echo "FAILED: run $run: a 20 Mbit/s link was not named first (the first finding: '$first')"
      exit 1
      ;;
  esac
  if grep -q -- "- input-bound" "$dir/doctor.txt"; then
    cat "$dir/doctor.txt"
    echo "FAILED: run $run: the narrow link was blamed on the input"
    exit 1
  fi
done
echo "PASSED: the narrow link is named first, communication-bound, in $runs of $runs runs"
