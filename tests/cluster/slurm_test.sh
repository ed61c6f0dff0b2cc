#!/usr/bin/env bash
# A real single-node Slurm (scripts/slurm_local.sh: Debian's slurmctld, slurmd and munge)
# runs `srun -n 3 dtrain fit --cluster slurm` as a multi-worker job (3 workers) and as a
# parameter-server job (a chief, a ps and a worker); each must end well, its summary naming
# the cluster the resolver made. Skipped (exit 77), saying why, where Slurm cannot run here
# (no root, Slurm not installed: scripts/install-deps.sh installs it).
#
#   tests/cluster/slurm_test.sh DTRAIN_BINARY
set -euo pipefail
dtrain=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/scripts/slurm_local.sh"
dir=$(mktemp -d)
trap 'slurm_local_down "$dir"; rm -rf "$dir"' EXIT
why=$(slurm_local_up "$dir") || { echo "SKIPPED: $why"; exit 77; }
export SLURM_CONF="$dir/slurm.conf"

cat >"$dir/job.json" <<'JSON'
{"model": {"input_shape": [8], "layers": [
   {"class_name": "Dense", "config": {"units": 16, "activation": "relu"}},
   {"class_name": "Dense", "config": {"units": 3}}]},
 "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
 "optimizer": {"name": "sgd", "learning_rate": 0.1},
 "data": {"source": "synthetic", "samples": 600, "features": 8, "classes": 3, "labels": "teacher"},
 "epochs": 3, "batch_size": 48, "seed": 1}
JSON

# A base port whose next 3 ports no socket holds, below the kernel's ephemeral range (where
# the jobs' own connections take their local ports from).
free_ports() {
  local low p
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range
  for _ in $(seq 100); do
    p=$((10000 + RANDOM % (low - 10000 - 3)))
    command -v ss >/dev/null || { echo "$p"; return; }  # unchecked: a port taken is retried below
    [[ -z $(ss -Htan "( sport >= :$p and sport <= :$((p + 2)) )") ]] && { echo "$p"; return; }
  done
  echo "no 3 free ports in a row below $low" >&2
  return 1
}

run() {  # NAME SRUN_ARGS... -- DTRAIN_ARGS...
  local name=$1 port attempt
  shift
  # Another program may take a port between the check and the bind; then another base.
  for attempt in 1 2 3; do
    port=$(free_ports)
    timeout 240 srun --kill-on-bad-exit=1 "$@" --cluster-port "$port" --summary "$dir/$name.json" \
      >"$dir/$name.log" 2>&1 && return
    grep -q "is the port in use?" "$dir/$name.log" || break
    echo "$name: a port of $port..$((port + 2)) was taken meanwhile; another try"
  done
  cat "$dir/$name.log"
  echo "FAILED: $name: srun ended with an error (above)"
  exit 1
}

run multi_worker -n 3 "$dtrain" fit "$dir/job.json" --strategy multi_worker --cluster slurm --verbose 1
grep -q '"workers": 3' "$dir/multi_worker.json" ||
  { cat "$dir/multi_worker.log"; echo "FAILED: the multi-worker job's summary does not say 3 workers"; exit 1; }
for i in 0 1 2; do
  grep -q "(3 workers, this is worker $i)" "$dir/multi_worker.log" ||
    { cat "$dir/multi_worker.log"; echo "FAILED: no task was worker $i of 3"; exit 1; }
done
echo "srun -n 3: a multi-worker job of 3 workers trained"

run parameter_server -n 3 "$dtrain" fit "$dir/job.json" --strategy parameter_server --cluster slurm \
  --cluster-jobs chief:1,ps:1,worker:1 --verbose 1
grep -q '"strategy": "ParameterServerStrategy"' "$dir/parameter_server.json" ||
  { cat "$dir/parameter_server.log"; echo "FAILED: the parameter-server job wrote no summary"; exit 1; }
echo "srun -n 3: a parameter-server job (chief, ps, worker) trained"
echo "PASSED"
