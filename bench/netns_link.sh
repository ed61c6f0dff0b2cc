#!/usr/bin/env bash
# The seeds' large MLP on 2 workers joined by an emulated link: two network namespaces
# connected by a veth pair whose ends are rate-limited with `tc qdisc ... tbf` (these
# kernels have tbf but no netem), created here and removed on exit. Runs
# bench_multi_worker once per setting (overlap on, overlap off, bf16 on the wire) and
# prints the chief's tables. Needs root (CAP_NET_ADMIN).
#
#   sudo bench/netns_link.sh [RATE] [extra bench_multi_worker flags...]   (RATE: 1gbit)
set -euo pipefail

rate=${1:-1gbit}
shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
bench="$here/build/release/bench/bench_multi_worker"
(cd "$here" && cmake --build --preset release --target bench_multi_worker >/dev/null)  # built on demand
. "$here/scripts/netns_pair.sh"
netns_bench_ready netns_link.sh "$bench"
a=dtrain_link_a b=dtrain_link_b
addr_a=169.254.77.1 addr_b=169.254.77.2 port=29400
trap 'netns_pair_down "$a" "$b"' EXIT
netns_pair_up "$a" "$b" "$addr_a" "$addr_b" "$rate" 50ms

cluster="{\"worker\": [\"$addr_a:$port\", \"$addr_b:$port\"]}"
run() {
  local pids=() out
  out=$(mktemp -d)
  for i in 0 1; do
    ns=$([ $i = 0 ] && echo "$a" || echo "$b")
    ip netns exec "$ns" env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      OMP_NUM_THREADS=1 DTRAIN_CLUSTER_TOKEN=netns-link "$bench" "$@" >"$out/$i.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  cat "$out/0.log"
  [ $failed = 0 ] || { echo "netns_link.sh: a worker failed:"; cat "$out/1.log"; }
  rm -rf "$out"
  echo
}

echo "== link: veth between two namespaces, tbf $rate each way"
run --steps 100 "$@"
run --steps 100 --no-overlap "$@"
run --steps 100 --compression bf16 "$@"
