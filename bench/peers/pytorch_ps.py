#!/usr/bin/python3
"""PyTorch parameter-server peer for bench_parameter_server: the seeds' large MLP
(Linear(1024,1024) relu -> Linear(1024,1024) relu -> Linear(1024,10), Adam lr 1e-3,
CrossEntropyLoss, batch 64) trained asynchronously over torch.distributed.rpc
(TensorPipe over 127.0.0.1): one ps process holds the model and the optimizer; each of N
worker processes x 1 thread pulls the parameters, computes the gradients of its batch and
pushes them, which the ps applies as they arrive (one at a time). Prints one JSON line with
the global samples/s over the timed steps.

Run with /usr/bin/python3 (Debian's python3-torch):
  /usr/bin/python3 bench/peers/pytorch_ps.py --workers 2 --steps 200
"""
import argparse
import json
import os
import socket
import threading
import time

_server = {}


def make_model():
    from torch import nn
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def ps_pull():
    """On the ps: the current parameters."""
    with _server["lock"]:
        return [p.detach().clone() for p in _server["model"].parameters()]


def ps_push(grads):
    """On the ps: applies one worker's gradients."""
    with _server["lock"]:
        for p, g in zip(_server["model"].parameters(), grads):
            p.grad = g
        _server["optimizer"].step()
        _server["pushes"] += 1


def process(rank, args, port, out):
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed.rpc as rpc
    from torch import nn

    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", num_worker_threads=8,
                                              rpc_timeout=120)
    if rank == 0:
        torch.manual_seed(0)
        _server["model"] = make_model()
        _server["optimizer"] = torch.optim.Adam(_server["model"].parameters(), lr=1e-3)
        _server["lock"] = threading.Lock()
        _server["pushes"] = 0
        rpc.init_rpc("ps", rank=0, world_size=args.workers + 1, rpc_backend_options=options)
    else:
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=args.workers + 1, rpc_backend_options=options)
        model = make_model()
        loss_fn = nn.CrossEntropyLoss()
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(args.batch * 16, 1024, generator=gen)
        y = torch.randint(0, 10, (args.batch * 16,), generator=gen)
        steps = args.steps // args.workers
        start = None
        for step in range(args.warmup + steps):
            if step == args.warmup:
                start = time.perf_counter()
            with torch.no_grad():
                for p, v in zip(model.parameters(), rpc.rpc_sync("ps", ps_pull)):
                    p.copy_(v)
            i = step % 16
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[i * args.batch:(i + 1) * args.batch]), y[i * args.batch:(i + 1) * args.batch])
            loss.backward()
            rpc.rpc_sync("ps", ps_push, args=([p.grad for p in model.parameters()],))
        out.put((steps * args.batch, time.perf_counter() - start))
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200, help="timed steps, over all workers")
    p.add_argument("--warmup", type=int, default=10, help="per worker")
    args = p.parse_args()
    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=process, args=(r, args, port, out)) for r in range(args.workers + 1)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=600) for _ in range(args.workers)]
    for proc in procs:
        proc.join(timeout=60)
    samples = sum(r[0] for r in results)
    seconds = max(r[1] for r in results)
    import torch
    print(json.dumps({"peer": "pytorch-rpc-ps", "torch": torch.__version__, "workers": args.workers,
                      "batch": args.batch, "samples_per_second": samples / seconds}))


if __name__ == "__main__":
    main()
