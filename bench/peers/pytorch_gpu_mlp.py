"""PyTorch's side of bench_gpu_mlp, on the same GPU: the seeds' large MLP (1024-1024-1024-10,
Adam, cross-entropy) trained eagerly and replayed as one CUDA graph per step, and the
GEMM-bound 8192-wide MLP in bfloat16 autocast. Prints one JSON line per measurement.

    python3 bench/peers/pytorch_gpu_mlp.py [--quick] [--compile]

Float32 products are exact float32 (TF32 off), as dtrain's are by default. --compile adds
torch.compile(mode="max-autotune-no-cudagraphs") (minutes of compilation on first use).
"""
import argparse
import json
import time

import torch
from torch import nn


def large_mlp(widths):
    layers = []
    for i in range(1, len(widths)):
        layers.append(nn.Linear(widths[i - 1], widths[i]))
        if i + 1 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).cuda()


def timed(step, steps, runs=5):
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    per_step = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        per_step.append((time.perf_counter() - start) / steps)
    per_step.sort()
    return per_step[len(per_step) // 2]


def eager(widths, batch, steps, autocast=False, compiled=False):
    torch.manual_seed(1)
    model = large_mlp(widths)
    if compiled:
        model = torch.compile(model, mode="max-autotune-no-cudagraphs")
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, widths[0], device="cuda")
    y = torch.randint(0, widths[-1], (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return timed(step, steps)


def graphed(widths, batch, steps):
    """The whole step (forward, backward, Adam) captured once and replayed, as PyTorch's
    CUDA graphs guide writes it."""
    torch.manual_seed(1)
    model = large_mlp(widths)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, widths[0], device="cuda")
    y = torch.randint(0, widths[-1], (batch,), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return timed(graph.replay, steps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    steps = 50 if args.quick else 200
    common = {"torch_version": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    widths = [1024, 1024, 1024, 10]
    for batch in (64, 512, 4096):
        for name, fn in (("eager", eager), ("cuda_graph", graphed)):
            s = fn(widths, batch, steps)
            print(json.dumps({"model": "seed_large", "mode": name, "batch": batch, "ms_per_step": s * 1e3,
                              "samples_per_second": batch / s, **common}), flush=True)
        if args.compile:
            s = eager(widths, batch, steps, compiled=True)
            print(json.dumps({"model": "seed_large", "mode": "compile", "batch": batch, "ms_per_step": s * 1e3,
                              "samples_per_second": batch / s, **common}), flush=True)
    batch = 2048 if args.quick else 8192
    s = eager([8192, 8192, 8192, 8192, 10], batch, 5 if args.quick else 20, autocast=True)
    flops = 0.0
    big = [8192, 8192, 8192, 8192, 10]
    for i in range(len(big) - 1):
        flops += 2.0 * batch * big[i] * big[i + 1] * (2 if i == 0 else 3)
    print(json.dumps({"model": "gemm_8192_bf16", "mode": "eager_autocast", "batch": batch, "ms_per_step": s * 1e3,
                      "tflops": flops / s * 1e-12, **common}), flush=True)


if __name__ == "__main__":
    main()
