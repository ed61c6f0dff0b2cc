#!/usr/bin/env bash
# Recovery time of a 2-worker job (the seeds' large MLP) under
# `dtrain launch --max-restarts 1` after one worker is killed with SIGKILL: from the kill to
# the first batch trained after the restart, in its parts. Every output line is stamped
# when it arrives; the parts are the gaps between these lines:
#   kill       "(fault) ... SIGKILL"                    worker 1, just before raise()
#   detection  "... stopping the other tasks"           the launcher saw the death
#   restart    "... restarting the job"                 the others are stopped; new tasks start
#   restore    "BackupAndRestore: resuming from"        new processes up, rendezvous, model built, backup read
#   first step "40/40 - ..." epoch line of the resumed chief: the one batch left trained
# The backup is saved after batch 39 of 40 and the kill comes at batch 39, so the resumed
# run has exactly one batch to train before its epoch line. Prints each round's parts and
# their medians.
#
#   bench/checkpoint_recovery.sh [ROUNDS=5]
set -euo pipefail

rounds=${1:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
[ -x "$dtrain" ] || { echo "checkpoint_recovery.sh: build first (make build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

stamp='import sys, time
for line in sys.stdin:
    print(f"{time.monotonic():.4f} {line}", end="", flush=True)'

for r in $(seq "$rounds"); do
  rm -rf "$work/ckpt"
  "$dtrain" launch --workers 2 --max-restarts 1 fit "$here/examples/configs/seed_large.json" \
      --epochs 1 --steps-per-epoch 40 --verbose 2 --checkpoint-dir "$work/ckpt" --checkpoint-every 39 \
      --fault-kill worker:1:39 2>&1 | /usr/bin/python3 -u -c "$stamp" > "$work/log.txt"
  /usr/bin/python3 - "$work/log.txt" "$r" <<'EOF'
import sys
lines = [l.rstrip("\n").split(" ", 1) for l in open(sys.argv[1])]
def first(pred, after=0.0):
    for t, text in lines:
        if float(t) >= after and pred(text):
            return float(t)
    sys.exit("checkpoint_recovery.sh: missing a line; the log:\n" + open(sys.argv[1]).read())
kill = first(lambda s: "SIGKILL" in s and "fault" in s)
detected = first(lambda s: "stopping the other tasks" in s, kill)
restart = first(lambda s: "restarting the job" in s, detected)
restored = first(lambda s: "resuming from" in s, restart)
stepped = first(lambda s: "[worker:0] 40/40 " in s, restored)
print(f"round {sys.argv[2]}: detection {1e3*(detected-kill):.0f} ms, stop+restart {1e3*(restart-detected):.0f} ms, "
      f"start+rendezvous+restore {1e3*(restored-restart):.0f} ms, first step {1e3*(stepped-restored):.0f} ms, "
      f"total {1e3*(stepped-kill):.0f} ms")
EOF
done | tee "$work/rounds.txt"
/usr/bin/python3 - "$work/rounds.txt" <<'EOF'
import re, statistics, sys
rows = [list(map(float, re.findall(r"(\d+) ms", l))) for l in open(sys.argv[1])]
names = ["detection", "stop+restart", "start+rendezvous+restore", "first step", "total"]
print("median: " + ", ".join(f"{n} {statistics.median(c):.0f} ms" for n, c in zip(names, zip(*rows))))
EOF
