#!/usr/bin/python3
"""PyTorch DistributedDataParallel peer for bench_multi_worker: the seeds' large MLP
(Linear(1024,1024) relu -> Linear(1024,1024) relu -> Linear(1024,10), Adam lr 1e-3,
CrossEntropyLoss) on N processes x 1 thread with the gloo backend over 127.0.0.1,
batch 64 per process; prints one JSON line with the global samples/s (median step).

Run with /usr/bin/python3 (Debian's python3-torch):
  /usr/bin/python3 bench/peers/pytorch_ddp.py --workers 2 --steps 200
"""
import argparse
import json
import os
import socket
import statistics
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per process")
    p.add_argument("--steps", type=int, default=200, help="timed steps")
    p.add_argument("--warmup", type=int, default=20)
    return p.parse_args()


def worker(rank, args, port, out):
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch * 16, 1024, generator=gen)
    y = torch.randint(0, 10, (args.batch * 16,), generator=gen)
    times = []
    last = time.perf_counter()
    for step in range(args.warmup + args.steps):
        i = step % 16
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x[i * args.batch:(i + 1) * args.batch]), y[i * args.batch:(i + 1) * args.batch])
        loss.backward()
        opt.step()
        now = time.perf_counter()
        if step >= args.warmup:
            times.append(now - last)
        last = now
    if rank == 0:
        step = statistics.median(times)
        out.put({"peer": "pytorch-ddp-gloo", "torch": torch.__version__, "workers": args.workers,
                 "batch_per_worker": args.batch, "step_ms": step * 1e3,
                 "samples_per_second": args.workers * args.batch / step})
    dist.destroy_process_group()


def main():
    args = parse_args()
    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, port, out)) for r in range(args.workers)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
