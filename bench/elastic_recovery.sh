#!/usr/bin/env bash
# Recovery of a 3-worker job (the seeds' large MLP, 40 batches) after worker 2 is killed
# with SIGKILL at batch 39, two ways, alternating, in one run:
#   elastic  `dtrain launch --workers 2:3`: the two left re-form and go on from their
#            commit in memory (committed after every batch here, as the disk run's backup
#            is taken right before the kill). Parts, from the survivors' own line:
#              notice    the kill's line -> the failure reaching fit (its monotonic stamp)
#              agree     the new round's members known
#              connect   the Gloo group over them formed
#              state     the commits compared (and sent where lacking), put back
#              first     the first batch after it trained
#   disk     `dtrain launch --workers 3 --max-restarts 1` with a backup after batch 39: the
#            launcher stops the job, starts it again, and it resumes from the backup file;
#            to the resumed chief's "40/40" line (its one batch left).
# Every output line is stamped on arrival (CLOCK_MONOTONIC, as the survivors' stamps).
#
#   bench/elastic_recovery.sh [ROUNDS=5]
set -euo pipefail

rounds=${1:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/release/dtrain"
[ -x "$dtrain" ] || { echo "elastic_recovery.sh: build first (make build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

stamp='import sys, time
for line in sys.stdin:
    print(f"{time.monotonic():.4f} {line}", end="", flush=True)'
job=(fit "$here/examples/configs/seed_large.json" --epochs 1 --steps-per-epoch 40 --verbose 2 --fault-kill worker:2:39)

for r in $(seq "$rounds"); do
  DTRAIN_ELASTIC_COMMIT_EVERY=1 "$dtrain" launch --workers 2:3 "${job[@]}" 2>&1 |
      /usr/bin/python3 -u -c "$stamp" > "$work/elastic.txt"
  rm -rf "$work/ckpt"
  "$dtrain" launch --workers 3 --max-restarts 1 "${job[@]}" --checkpoint-dir "$work/ckpt" --checkpoint-every 39 2>&1 |
      /usr/bin/python3 -u -c "$stamp" > "$work/disk.txt"
  /usr/bin/python3 - "$work/elastic.txt" "$work/disk.txt" "$r" <<'PY'
import re, sys
def lines(path):
    return [l.rstrip("\n").split(" ", 1) for l in open(path)]
def first(rows, pred, path, after=0.0):
    for t, text in rows:
        if float(t) >= after and pred(text):
            return float(t), text
    sys.exit("elastic_recovery.sh: missing a line in " + path + ":\n" + open(path).read())
e = lines(sys.argv[1])
kill, _ = first(e, lambda s: "SIGKILL" in s and "fault" in s, sys.argv[1])
_, change = first(e, lambda s: "elastic: round 1," in s, sys.argv[1], kill)
noticed = float(re.search(r"noticed at ([\d.]+) s", change).group(1))
agree, connect = (float(re.search(name + r" in (\d+) ms", change).group(1)) for name in ("agreed", "connected"))
settle = float(re.search(r"commit [^;]*?\((?:[\d.]+ MB, )?(\d+) ms\)", change).group(1))
restore = float(re.search(r"restored in (\d+) ms", change).group(1))
_, step_line = first(e, lambda s: "the first batch of round 1 ended" in s, sys.argv[1], kill)
after_notice = float(re.search(r"ended (\d+) ms after", step_line).group(1))
notice = 1e3 * (noticed - kill)
first_step = after_notice - agree - connect - settle - restore
d = lines(sys.argv[2])
dkill, _ = first(d, lambda s: "SIGKILL" in s and "fault" in s, sys.argv[2])
resumed, _ = first(d, lambda s: "[worker:0] 40/40 " in s, sys.argv[2], dkill)
print(f"round {sys.argv[3]}: elastic: notice {notice:.0f} ms, agree {agree:.0f} ms, connect {connect:.0f} ms, "
      f"state {settle + restore:.0f} ms, first step {first_step:.0f} ms, total {notice + after_notice:.0f} ms; "
      f"disk restart: total {1e3 * (resumed - dkill):.0f} ms")
PY
done | tee "$work/rounds.txt"
/usr/bin/python3 - "$work/rounds.txt" <<'PY'
import re, statistics, sys
rows = [list(map(float, re.findall(r"(\d+) ms", l))) for l in open(sys.argv[1])]
names = ["notice", "agree", "connect", "state", "first step", "elastic total", "disk restart total"]
med = [statistics.median(c) for c in zip(*rows)]
print("median: " + ", ".join(f"{n} {m:.0f} ms" for n, m in zip(names, med)) +
      f"; disk / elastic {med[6] / max(med[5], 1e-9):.1f}x")
PY
