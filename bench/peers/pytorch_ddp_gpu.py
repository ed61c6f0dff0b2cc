"""PyTorch DDP's side of gpu-check's two GPU workers: two processes training on the one GPU
with DistributedDataParallel over gloo (NCCL refuses two ranks on one GPU), the Fashion-MNIST
config's MLP (784-256-128-10, Adam at 1e-3, cross-entropy), 64 rows each a step (the
config's global batch of 128), on random data of Fashion-MNIST's shape copied from pinned
host memory each step, the loss read each step as fit reads it. Prints one JSON line: the
steady steps' samples/s over both processes (the median of three timed runs).

    python3 bench/peers/pytorch_ddp_gpu.py [--steps 100]
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

ROWS = 64  # per process and step


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, steps, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(rank)
    xs = torch.rand(steps, ROWS, 784, generator=g).pin_memory()
    ys = torch.randint(0, 10, (steps, ROWS), generator=g).pin_memory()

    def run(n):
        for i in range(n):
            x = xs[i % steps].cuda(non_blocking=True)
            y = ys[i % steps].cuda(non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            loss.item()

    run(20)
    rates = []
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        run(steps)
        torch.cuda.synchronize()
        dist.barrier()
        rates.append(world * ROWS * steps / (time.perf_counter() - start))
    if rank == 0:
        results.put(sorted(rates)[1])
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(worker, args=(2, free_port(), a.steps, results), nprocs=2, start_method="spawn")
    print(json.dumps({"peer": "pytorch DDP gloo, 2 processes on cuda:0", "global_batch": 2 * ROWS,
                      "samples_per_second": results.get(timeout=10)}))


if __name__ == "__main__":
    main()
