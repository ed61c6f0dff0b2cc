"""The transformer encoder of bench/transformer.cpp in PyTorch: 4 nn.TransformerEncoderLayer
(256 wide, 4 heads, 1024-wide ReLU feed-forward, post-norm, no dropout), a mean over
positions and 10 classes, on random [batch, length, 256] inputs: samples/s of training
steps (forward, backward, Adam); then attention alone at the same shapes
(scaled_dot_product_attention where this PyTorch has it, else softmax(q·kᵀ·scale)·v, which
is what its nn.MultiheadAttention computes).

    python3 bench/peers/pytorch_transformer.py [--threads N] [--length 128] [--batch 8] [--steps 10]
                                               [--device cuda [--compile]]

On a GPU only the step: five runs of --steps steps, each ending with a wait for the GPU
(median), eager and, with --compile, torch.compile'd too: one JSON line each.
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def gpu_steps(a):
    device = torch.device("cuda")
    x = torch.rand(a.batch, a.length, 256, device=device) * 2 - 1
    y = torch.randint(0, 10, (a.batch,), device=device)

    def timed(mode):
        layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True)
        encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(device)
        head = nn.Linear(256, 10).to(device)
        opt = torch.optim.Adam(list(encoder.parameters()) + list(head.parameters()), lr=1e-3)

        def forward(inputs):
            return head(encoder(inputs).mean(dim=1))

        run = torch.compile(forward) if mode == "torch.compile" else forward

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(run(x), y)
            loss.backward()
            opt.step()

        for _ in range(a.warmup):
            step()
        runs = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step()
            torch.cuda.synchronize()
            runs.append((time.perf_counter() - t0) / a.steps)
        step_s = sorted(runs)[2]
        print(json.dumps({"peer": "pytorch", "bench": "transformer_step", "torch": torch.__version__, "device": "cuda",
                          "mode": mode, "batch": a.batch, "length": a.length, "step_ms": step_s * 1e3,
                          "samples_per_second": a.batch / step_s}), flush=True)

    timed("eager")
    if a.compile:
        timed("torch.compile")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--compile", action="store_true", help="also time the torch.compile'd model (a GPU run)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.device == "cuda":
        gpu_steps(a)
        return
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    head = nn.Linear(256, 10)
    params = list(encoder.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    x = torch.rand(a.batch, a.length, 256) * 2 - 1
    y = torch.randint(0, 10, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(head(encoder(x).mean(dim=1)), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    step_s = times[len(times) // 2]
    print(json.dumps({"peer": "pytorch", "bench": "transformer_step", "torch": torch.__version__, "threads": a.threads,
                      "batch": a.batch, "length": a.length, "samples_per_second": a.batch / step_s}))

    q, k, v = (torch.rand(a.batch, 4, a.length, 64) for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(True)

    def per_call(fn, reps=10):
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps

    def attention(q, k, v):
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, scale=0.125)
        return torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1) @ v

    with torch.no_grad():
        forward = per_call(lambda: attention(q, k, v))
    dout = torch.rand(a.batch, 4, a.length, 64)
    both = per_call(lambda: attention(q, k, v).backward(dout))
    print(json.dumps({"peer": "pytorch", "bench": "attention", "length": a.length, "forward_ms": forward * 1e3,
                      "forward_backward_ms": both * 1e3}))


if __name__ == "__main__":
    main()
