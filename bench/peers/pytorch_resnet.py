"""The Fashion-MNIST ResNet of examples/fashion_mnist_resnet.cpp in PyTorch, timed on
random batches: samples/s of training steps (forward, backward, Adam), channels_last.
On a GPU (--device cuda) five runs of --steps steps, each ending with a wait for the GPU
(median), eager and, with --compile, torch.compile'd too: one JSON line each.

    python3 bench/peers/pytorch_resnet.py [--threads N] [--steps N] [--batch N] [--bf16] [--device cuda] [--compile]
"""
import argparse
import json
import time

import torch
import torch.nn as nn


def conv_bn(cin, cout, k, stride, relu):
    layers = [nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride, True), conv_bn(cout, cout, 3, 1, False))
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else conv_bn(cin, cout, 1, stride, False)

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        blocks, cin = [], 16
        for filters in (16, 32, 64):
            for b in range(2):
                blocks.append(Block(cin, filters, 2 if b == 0 and filters != 16 else 1))
                cin = filters
        self.net = nn.Sequential(conv_bn(1, 16, 3, 1, True), *blocks)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = self.net(x.view(-1, 1, 28, 28).contiguous(memory_format=torch.channels_last))
        return self.head(x.mean(dim=(2, 3)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--bf16", action="store_true", help="autocast to bfloat16 (PyTorch's mixed precision)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--compile", action="store_true", help="also time the torch.compile'd model (a GPU run)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    device = torch.device(a.device)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(a.batch, 784, device=device)
    y = torch.randint(0, 10, (a.batch,), device=device)

    def timed(model, mode):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.bf16):
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()

        for _ in range(a.warmup):
            step()
        runs = []
        for _ in range(5 if a.device == "cuda" else 1):
            if a.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(a.steps):
                step()
            if a.device == "cuda":
                torch.cuda.synchronize()
            runs.append((time.perf_counter() - start) / a.steps)
        seconds = sorted(runs)[len(runs) // 2]
        print(json.dumps({"peer": "pytorch", "torch": torch.__version__, "device": a.device, "mode": mode,
                          "threads": a.threads, "batch": a.batch, "bf16": a.bf16, "steps": a.steps,
                          "step_ms": seconds * 1e3, "samples_per_second": a.batch / seconds}), flush=True)

    model = ResNet().to(device=device, memory_format=torch.channels_last)
    timed(model, "eager")
    if a.compile:
        timed(torch.compile(ResNet().to(device=device, memory_format=torch.channels_last)), "torch.compile")


if __name__ == "__main__":
    main()
