#!/usr/bin/python3
"""PyTorch peer for dtrain's checkpoint benchmark: torch.save and torch.load of the seeds'
large MLP with Adam after one step (weights and both moments, about 25 MB), in the same
folder dtrain's benchmark writes to. Prints one JSON line: save_ms (torch.save alone, as
users call it), save_fsync_ms (torch.save, then fsync of the file: what a crash-safe save
pays), load_ms (torch.load plus load_state_dict), and the state's size. Medians of 9.

  /usr/bin/python3 bench/peers/pytorch_checkpoint.py [FOLDER]
"""
import json
import os
import statistics
import sys
import time

import torch


def median_ms(fn, samples=9):
    fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    path = os.path.join(folder, "torch_checkpoint.pt")
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}

    def save():
        torch.save(state, path)

    def save_fsync():
        torch.save(state, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def load():
        loaded = torch.load(path)
        model.load_state_dict(loaded["model"])
        opt.load_state_dict(loaded["optimizer"])

    result = {"save_ms": median_ms(save), "save_fsync_ms": median_ms(save_fsync), "load_ms": median_ms(load),
              "state_mb": os.path.getsize(path) / 1e6, "torch_version": torch.__version__}
    os.remove(path)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
