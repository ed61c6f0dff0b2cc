"""Reads a dtrain run's TensorBoard folder with TensorBoard's own event reader (the
`tensorboard` package, where a machine has it): every scalar, histogram and text tag of
DIR/train (and DIR/validation where fit validated), and fails unless each run holds its
epochs' metrics.
Usage: python3 scripts/read-tensorboard-events.py DIR EPOCHS"""
import os
import sys

from tensorboard.backend.event_processing import event_accumulator

log_dir, epochs = sys.argv[1], int(sys.argv[2])
everything = {event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0, event_accumulator.TENSORS: 0}
ok = True
for run in ("train", "validation"):
    if run == "validation" and not os.path.isdir(f"{log_dir}/{run}"):
        continue
    acc = event_accumulator.EventAccumulator(f"{log_dir}/{run}", size_guidance=everything)
    acc.Reload()
    tags = acc.Tags()
    steps = [e.step for e in acc.Scalars("epoch_loss")] if "epoch_loss" in tags["scalars"] else []
    print(f"{run}: scalars {sorted(tags['scalars'])}, histograms {len(tags['histograms'])}, "
          f"tensors {sorted(tags['tensors'])}, epoch_loss at steps {steps}")
    ok &= steps == list(range(epochs))
    if run == "train":
        ok &= "run_config" in tags["tensors"]
sys.exit(0 if ok else 1)
