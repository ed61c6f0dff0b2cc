#!/usr/bin/env bash
# The seeds' trade-off in numbers: the Fashion-MNIST example trained for EPOCHS epochs by
# 3 workers under MultiWorkerMirroredStrategy and under ParameterServerStrategy (1 ps;
# async, ssp:2, sync with 1 backup worker), first with equal workers, then with worker 2
# made 3x slower (--fault-slow worker:2:3x); one thread per process. Prints, per run, the
# global samples/s of the last epoch, the test accuracy and the wall time, from each
# run's --summary.
#
#   bench/straggler_strategies.sh [EPOCHS=2]
set -euo pipefail

epochs=${1:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
[ -x "$dtrain" ] || { echo "straggler_strategies.sh: build first (make build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # NAME SLOW LAUNCH_FLAGS... -- FIT_FLAGS...
  local name=$1 slow=$2
  shift 2
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  local fault=()
  [ "$slow" = yes ] && fault=(--fault-slow worker:2:3x)
  OMP_NUM_THREADS=1 "$dtrain" launch "${launch[@]}" fit "$here/examples/configs/fashion_mnist.json" --epochs "$epochs" \
    --threads 1 --verbose 0 --summary "$work/s.json" "${fault[@]}" "$@" >/dev/null 2>&1 || true
  /usr/bin/python3 "$here/bench/strategy_row.py" "$name" "$slow" "$work/s.json" wall
  rm -f "$work/s.json"
}

echo "| strategy | straggler | samples/s (last epoch) | test accuracy | wall s |"
echo "|---|---|---|---|---|"
for slow in no yes; do
  run "MultiWorkerMirroredStrategy" $slow --workers 3 -- --strategy multi_worker
  run "PS async" $slow --workers 3 --ps 1 -- --consistency async
  run "PS ssp(2)" $slow --workers 3 --ps 1 -- --consistency ssp:2
  run "PS sync, 1 backup" $slow --workers 3 --ps 1 -- --consistency sync:1
done
