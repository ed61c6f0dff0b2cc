#!/usr/bin/env bash
# How many closures a parameter server sustains when they compute nothing: two workers
# each pull and push a model of 1 MB, then of 16 MB (bench_parameter_server --push-only
# under `dtrain launch --chief --workers 2 --ps 1`), beside the loopback bandwidth that
# `dtrain probe-link` measures between two processes in the same run. ROUNDS rounds,
# taking turns; prints each round and the medians.
#
#   bench/ps_push_throughput.sh [ROUNDS=3] [extra bench_parameter_server flags...]
# (`--shared-memory 0`: through gRPC messages, as between hosts.)
set -euo pipefail

rounds=${1:-3}
shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
bench="$here/build/release/bench/bench_parameter_server"
(cd "$here" && cmake --build --preset release --target bench_parameter_server >/dev/null)  # built on demand
[ -x "$bench" ] || { echo "ps_push_throughput.sh: build first (make build)" >&2; exit 1; }
source "$here/bench/median.sh"

one=() sixteen=() one_mb=() sixteen_mb=() link=()
for r in $(seq "$rounds"); do
  line1=$(OMP_NUM_THREADS=1 "$dtrain" launch --chief --workers 2 --ps 1 -- "$bench" --push-only 1 --steps 400 --warmup 20 "$@" |
    sed -n 's/^\[chief:0\] \(ParameterServerStrategy push-only.*\)/\1/p')
  line16=$(OMP_NUM_THREADS=1 "$dtrain" launch --chief --workers 2 --ps 1 -- "$bench" --push-only 16 --steps 60 --warmup 5 "$@" |
    sed -n 's/^\[chief:0\] \(ParameterServerStrategy push-only.*\)/\1/p')
  probe=$(OMP_NUM_THREADS=1 "$dtrain" launch --workers 2 probe-link 2>&1 |
    sed -n 's/^\[worker:0\] link between 2 workers: .*(\([0-9.]*\) GB\/s) per direction.*/\1/p')
  echo "round $r: $line1 | $line16 | loopback link $probe GB/s per direction"
  one+=("$(sed 's/.*: \([0-9.]*\) closures.*/\1/' <<<"$line1")")
  one_mb+=("$(sed 's/.*closures\/s, \([0-9]*\) MB.*/\1/' <<<"$line1")")
  sixteen+=("$(sed 's/.*: \([0-9.]*\) closures.*/\1/' <<<"$line16")")
  sixteen_mb+=("$(sed 's/.*closures\/s, \([0-9]*\) MB.*/\1/' <<<"$line16")")
  link+=("$probe")
done
echo "median: 1 MB model $(median "${one[@]}") closures/s ($(median "${one_mb[@]}") MB/s both ways)," \
  "16 MB model $(median "${sixteen[@]}") closures/s ($(median "${sixteen_mb[@]}") MB/s);" \
  "loopback $(median "${link[@]}") GB/s per direction"
