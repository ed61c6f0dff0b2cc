# A single-node Slurm on this machine, from Debian's slurmctld, slurmd and munge, without
# systemd: one node named localhost (127.0.0.1) with this machine's cores, in a folder of
# its own. Sourced by the tests and scripts that run jobs under Slurm; needs root.
#
#   . scripts/slurm_local.sh
#   slurm_local_up DIR        # starts munged, slurmctld and slurmd; exports SLURM_CONF
#   srun -n 3 ...             # (sbatch, sinfo, ...)
#   slurm_local_down DIR      # stops them
#
# slurm_local_up returns non-zero, saying which step failed, where this machine cannot
# run Slurm (no root, a package missing, a daemon that does not come up).

slurm_local_down() {
  local dir=$1 pid
  for pid in slurmd slurmctld munged; do
    [ -f "$dir/$pid.pid" ] && kill "$(cat "$dir/$pid.pid")" 2>/dev/null
  done
  sleep 0.2
  for pid in slurmd slurmctld munged; do
    [ -f "$dir/$pid.pid" ] && kill -9 "$(cat "$dir/$pid.pid")" 2>/dev/null
    rm -f "$dir/$pid.pid"
  done
  return 0
}

slurm_local_up() {
  local dir=$1 cores i
  [ "$(id -u)" = 0 ] || { echo "a local Slurm needs root (slurmd runs jobs as their users)"; return 1; }
  for i in munged slurmctld slurmd srun; do
    command -v "$i" >/dev/null || [ -x "/usr/sbin/$i" ] ||
      { echo "$i is not installed (scripts/install-deps.sh installs it)"; return 1; }
  done
  mkdir -p "$dir/spool" "$dir/state" "$dir/munge"
  # At least 4 slots, so that a job step of 3 or 4 tasks fits on a 2-core machine (the
  # tasks then share the cores, as on any oversubscribed node).
  cores=$(( $(nproc) > 4 ? $(nproc) : 4 ))
  # munge: a key of this folder's own, its socket here too.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  /usr/sbin/munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" --force ||
    { echo "munged did not start ($dir/munged.log)"; return 1; }
  cat >"$dir/slurm.conf" <<EOF
ClusterName=dtrain
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
SlurmctldPort=$((6817 + RANDOM % 1000))
SlurmdPort=$((7817 + RANDOM % 1000))
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cores State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  export SLURM_CONF="$dir/slurm.conf"
  /usr/sbin/slurmctld -f "$SLURM_CONF" -i || { echo "slurmctld did not start ($dir/slurmctld.log)"; return 1; }
  /usr/sbin/slurmd -f "$SLURM_CONF" -N localhost || { echo "slurmd did not start ($dir/slurmd.log)"; return 1; }
  # The node is ready when sinfo shows it idle.
  for i in $(seq 1 100); do
    if sinfo -h -N -o %t 2>/dev/null | grep -q idle; then return 0; fi
    sleep 0.2
  done
  echo "the Slurm node did not become idle within 20 s ($dir/slurmctld.log, $dir/slurmd.log)"
  return 1
}
