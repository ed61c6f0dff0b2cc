"""One row of the strategy tables (bench/straggler_strategies.sh, bench/narrow_link_strategies.sh)
from a `dtrain fit --summary` file: name, straggler, samples/s of the last epoch, test accuracy,
then the wall seconds ("wall") or the megabytes a worker moves a step, sent and received
("moved": all-reduce, a ring's 2(n-1)/n of the gradients each way; a ps, a pull and a push).

    python3 bench/strategy_row.py NAME STRAGGLER SUMMARY wall|moved
"""
import json
import sys

name, slow, path, last = sys.argv[1:]
try:
    s = json.load(open(path))
except Exception:
    print(f"| {name} | {slow} | failed | | |")
    sys.exit()
if last == "wall":
    tail = f"{s['wall_seconds']:.1f}"
elif "ps_phases" in s:
    p = s["ps_phases"]
    tail = f"{(p['shared_memory_bytes'] + p['message_bytes']) / max(1, p['steps']) / 1e6:.2f}"
else:
    n = s["workers"]
    tail = f"{2 * (n - 1) / n * s['gradient_bytes_per_step'] * 2 / 1e6:.2f}"
print(f"| {name} | {slow} | {s['epoch_samples_per_second'][-1]:.0f} | {s['test']['accuracy']:.4f} | {tail} |")
