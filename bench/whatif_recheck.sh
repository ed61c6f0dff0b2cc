#!/usr/bin/env bash
# The doctor's model check again, on the runs bench/whatif_accuracy.sh kept with KEEP=DIR:
# per case the median error of the prediction and of the replay over its rounds, and how
# many cases land within 15%. A change to the model is checked on the same runs, in
# seconds, before the whole script measures new ones.
#
#   bench/whatif_recheck.sh DIR
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain=${DTRAIN:-$here/build/release/dtrain}
kept=${1:?usage: whatif_recheck.sh DIR (the KEEP of whatif_accuracy.sh)}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in "$kept"/*/; do
  what_if=()
  link=$(cat "$round/link")
  [ "$link" = - ] || what_if=(--what-if "link=$link")
  row=$("$dtrain" doctor --runs "$round/one.json,$round/many.json" "${what_if[@]}" | grep -A3 "^Model check" | tail -1)
  printf '%s\t%s\n' "$(cat "$round/case")" "$row" >>"$out"
done
python3 - "$out" <<'PY'
import statistics, sys
cases = {}
for line in open(sys.argv[1]):
    case, row = line.rstrip("\n").split("\t")
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    measured, predicted, replayed = float(cells[2]), float(cells[3]), cells[5]
    cases.setdefault(case, []).append((measured, predicted, float(replayed) if replayed != "-" else None))
predicted_errors, replayed_errors = [], []
for case, rounds in cases.items():
    measured = statistics.median(r[0] for r in rounds)
    predicted = (statistics.median(r[1] for r in rounds) - measured) / measured
    replays = [r[2] for r in rounds if r[2] is not None]
    replayed = (statistics.median(replays) - measured) / measured if len(replays) == len(rounds) else None
    predicted_errors.append(abs(predicted))
    if replayed is not None:
        replayed_errors.append(abs(replayed))
    shown = f"{replayed:+.1%}" if replayed is not None else "-"
    print(f"{case:<75} {len(rounds)} rounds  predicted {predicted:+.1%}  replayed {shown}")
def summary(errors):
    within = sum(e <= 0.15 for e in errors)
    return f"{within} of {len(errors)} within 15%, median miss {statistics.median(errors):.1%}" if errors else "none"
print(f"predicted: {summary(predicted_errors)}; replayed: {summary(replayed_errors)}")
PY
