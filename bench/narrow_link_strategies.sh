#!/usr/bin/env bash
# The seeds' trade-off on a narrow network: each task on its own emulated host (a network
# namespace joined to a switch by a link of RATE each way, tbf; scripts/netns_pair.sh),
# the Fashion-MNIST example trained by 3 workers under MultiWorkerMirroredStrategy and
# under ParameterServerStrategy (1 ps, and the chief on a host of its own; async, ssp:2,
# sync with 1 backup worker), with equal workers and with worker 2 made 3x slower. Every
# process is one thread. Prints, per run, the global samples/s of the last epoch, the test
# accuracy, and the bytes a worker sends and receives a step (all-reduce: a ring's 2(n-1)/n
# of the gradients; ps: a pull of the weights and a push of the gradients). Needs root.
#
#   sudo bench/narrow_link_strategies.sh [RATE=100mbit] [EPOCHS=2] [STEPS_PER_EPOCH=60]
set -euo pipefail

rate=${1:-100mbit}
epochs=${2:-2}
steps=${3:-60}
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
. "$here/scripts/netns_pair.sh"
netns_bench_ready narrow_link_strategies.sh "$dtrain"
hub=dtrain_star_hub
hosts=(dtrain_star_w0 dtrain_star_w1 dtrain_star_w2 dtrain_star_ps dtrain_star_chief)
work=$(mktemp -d)
trap 'netns_star_down "$hub" "${hosts[@]}"; rm -rf "$work"' EXIT
netns_star_up "$hub" "$rate" "${hosts[@]}"
addr() { echo "169.254.78.$(($1 + 1)):29500"; }  # of hosts[i]
workers="[\"$(addr 0)\", \"$(addr 1)\", \"$(addr 2)\"]"

# run NAME SLOW CLUSTER TASKS FIT_FLAGS...: TASKS is "type:index:host ...", the first
# writes the summary.
run() {
  local name=$1 slow=$2 cluster=$3 tasks=$4
  shift 4
  local fault=() pids=() first=1 t type index host extra
  [ "$slow" = yes ] && fault=(--fault-slow worker:2:3x)
  for t in $tasks; do
    IFS=: read -r type index host <<<"$t"
    extra=()
    [ $first = 1 ] && extra=(--summary "$work/s.json")
    first=0
    ip netns exec "${hosts[$host]}" env \
      TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"$type\", \"index\": $index}}" \
      OMP_NUM_THREADS=1 DTRAIN_CLUSTER_TOKEN=narrow-link \
      timeout 900 "$dtrain" fit "$here/examples/configs/fashion_mnist.json" --epochs "$epochs" \
      --steps-per-epoch "$steps" --threads 1 --verbose 0 "${fault[@]}" "${extra[@]}" "$@" \
      >"$work/$type$index.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  /usr/bin/python3 "$here/bench/strategy_row.py" "$name" "$slow" "$work/s.json" moved
  rm -f "$work/s.json"
}

ps_cluster="{\"chief\": [\"$(addr 4)\"], \"worker\": $workers, \"ps\": [\"$(addr 3)\"]}"
ps_tasks="chief:0:4 worker:0:0 worker:1:1 worker:2:2 ps:0:3"
echo "links: $rate each way; $epochs epochs of $steps steps"
echo "| strategy | straggler | samples/s (last epoch) | test accuracy | MB a worker moves a step |"
echo "|---|---|---|---|---|"
for slow in no yes; do
  run "MultiWorkerMirroredStrategy" $slow "{\"worker\": $workers}" "worker:0:0 worker:1:1 worker:2:2" \
    --strategy multi_worker
  run "PS async" $slow "$ps_cluster" "$ps_tasks" --strategy parameter_server --consistency async
  run "PS ssp(2)" $slow "$ps_cluster" "$ps_tasks" --strategy parameter_server --consistency ssp:2
  run "PS sync, 1 backup" $slow "$ps_cluster" "$ps_tasks" --strategy parameter_server --consistency sync:1
done
