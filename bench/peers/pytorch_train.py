#!/usr/bin/python3
"""PyTorch peer benchmark for dtrain: trains one small MLP on CPU and prints one JSON line.

Models (all Adam lr 1e-3, CrossEntropyLoss on logits):
  seed_small     Linear(100,64) relu -> Linear(64,10); 1000 random samples, batch 32
  seed_large     Linear(1024,1024) relu -> Linear(1024,1024) relu -> Linear(1024,10);
                 10000 random samples, batch 64
  fashion_mnist  Linear(784,256) relu -> Linear(256,128) relu -> Linear(128,10);
                 Debian's dataset-fashion-mnist, batch 128, then test accuracy

Run with /usr/bin/python3 (Debian's python3-torch), e.g.
  /usr/bin/python3 bench/peers/pytorch_train.py --model seed_large --threads 2
"""
import argparse
import gzip
import json
import math
import os
import re
import resource
import statistics
import struct
import sys
import time

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
BATCH = {"seed_small": 32, "seed_large": 64, "fashion_mnist": 128}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(BATCH))
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    p.add_argument("--epochs", type=int, default=None,
                   help="fashion_mnist: epochs (default 5); synthetic: if given, "
                        "timed steps = epochs * full batches per epoch")
    p.add_argument("--steps", type=int, default=200, help="timed steps, synthetic models")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps, synthetic models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--autocast", choices=["none", "bf16"], default="none",
                   help="bf16: forward and loss under torch.autocast('cpu', torch.bfloat16), "
                        "PyTorch's mixed precision (float32 parameters)")
    args = p.parse_args()
    if args.threads < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--threads and --steps must be >= 1, --warmup >= 0")
    if args.epochs is not None and args.epochs < 1:
        p.error("--epochs must be >= 1")
    return args


ARGS = parse_args()

# Thread pools must be pinned before torch (and numpy) load their BLAS: OpenBLAS gets one
# thread so that only torch's OpenMP pool runs; two competing pools cost 1.5-2.5x.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(ARGS.threads)


def blas_library():
    """Path of the BLAS shared library torch actually loaded (from /proc/self/maps).

    Debian's libtorch links libblas.so.3, which resolves to OpenBLAS only when a
    libopenblas0 package is installed; otherwise it is the slow reference BLAS."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return "unknown"
    hits = sorted(p for p in paths if re.search(r"lib(open)?blas[^/]*\.so", p))
    return ";".join(hits) or "none"


def read_idx(path, magic):
    """Reads a gzip IDX file (big-endian magic, then one big-endian uint32 per dim)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    (got,) = struct.unpack_from(">I", data, 0)
    if got != magic:
        raise ValueError(f"{path}: magic 0x{got:08x}, expected 0x{magic:08x}")
    ndim = magic & 0xFF
    dims = struct.unpack_from(">" + "I" * ndim, data, 4)
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != math.prod(dims):
        raise ValueError(f"{path}: {arr.size} bytes of data for dims {dims}")
    return arr.reshape(dims)


def load_fashion(split):
    """Returns (x float32 [N,784] in [0,1], y int64 [N]) for split 'train' or 't10k'."""
    images = read_idx(f"{FASHION_DIR}/{split}-images-idx3-ubyte.gz", 0x00000803)
    labels = read_idx(f"{FASHION_DIR}/{split}-labels-idx1-ubyte.gz", 0x00000801)
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def mlp(sizes):
    """Linear layers of the given widths with relu between them (logits out)."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_step(model):
    """Returns step(x, y): one forward, backward and Adam update."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ARGS.autocast == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def run_synthetic(args, batch):
    n, sizes = (1000, [100, 64, 10]) if args.model == "seed_small" else \
        (10000, [1024, 1024, 1024, 10])
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(n, sizes[0], generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    model = mlp(sizes)
    step = make_step(model)

    # Cycle through the data in full batches (a partial last batch is dropped so every
    # timed step processes exactly `batch` samples).
    per_epoch = n // batch
    steps = args.steps if args.epochs is None else args.epochs * per_epoch

    def run(count, start):
        for i in range(start, start + count):
            b = (i % per_epoch) * batch
            step(x[b:b + batch], y[b:b + batch])

    run(args.warmup, 0)
    t0 = time.perf_counter()
    run(steps, args.warmup)
    elapsed = time.perf_counter() - t0
    return {"samples_per_second": steps * batch / elapsed, "steps": steps,
            "warmup": args.warmup, "elapsed_seconds": elapsed}


def run_fashion(args, batch):
    x, y = load_fashion("train")
    x_test, y_test = load_fashion("t10k")
    n = len(x)
    model = mlp([784, 256, 128, 10])
    step = make_step(model)
    gen = torch.Generator().manual_seed(args.seed)  # drives the per-epoch shuffles
    epochs = 5 if args.epochs is None else args.epochs

    epoch_seconds = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        perm = torch.randperm(n, generator=gen)
        for b in range(0, n, batch):  # last batch is partial (60000 = 468*128 + 96)
            idx = perm[b:b + batch]
            step(x[idx], y[idx])
        epoch_seconds.append(time.perf_counter() - t0)

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
        model.eval()
        correct = (model(x_test).argmax(dim=1) == y_test).sum().item()
    # Epoch 1 is warm-up; with a single epoch it is all there is.
    timed = epoch_seconds[1:] or epoch_seconds
    return {"samples_per_second": statistics.median([n / s for s in timed]),
            "test_accuracy": correct / len(x_test), "epoch_seconds": epoch_seconds,
            "epochs": epochs}


def main():
    args = ARGS
    torch.manual_seed(args.seed)  # parameter initialisation
    batch = BATCH[args.model]
    runner = run_fashion if args.model == "fashion_mnist" else run_synthetic
    result = {"model": args.model, "threads": torch.get_num_threads(), "batch_size": batch,
              "autocast": args.autocast}
    result.update(runner(args, batch))
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["torch_version"] = torch.__version__
    result["blas_library"] = blas_library()
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
