#!/usr/bin/env python3
"""PyTorch eager training-speed peer for estc's training benchmarks.

Usage:
    bench/.venv/bin/python bench/torch_train.py --model fc|cnn [--threads N]
        [--steps 200] [--warmup 20] [--batch 128]

Models (all weights Glorot-uniform, all biases zero, as in Keras's defaults):
    fc   MLP 784-256-256-10, ReLU, softmax cross-entropy, plain SGD lr 0.1.
    cnn  The TensorFlow MNIST CNN: [B,1,28,28] (NCHW) -> conv5x5x32 same + relu
         + maxpool2 -> conv5x5x64 same + relu + maxpool2 -> flatten 3136
         -> dense 256 relu -> dense 256 relu -> dropout 0.4 (train mode)
         -> dense 10, softmax cross-entropy, plain SGD lr 0.05.

Data is synthetic (features uniform in [0,1), float32; labels uniform in 0..9),
pre-generated as a pool of 10 batches that the steps cycle through, so no data
loading is measured. A step is zero_grad, forward, loss, backward, optimizer.step.
After --warmup untimed steps, --steps steps are timed with time.perf_counter and
one JSON line is printed:
    {"peer": "pytorch-eager", "model": ..., "threads": ..., "batch": ...,
     "steps": ..., "seconds": ..., "steps_per_sec": ...}
"""

import argparse
import json
import time

import torch
from torch import nn

POOL = 10


def init_glorot(module):
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


def build(model):
    """Return (network, input shape of one example, learning rate)."""
    if model == "fc":
        net = nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(),
            nn.Linear(256, 256), nn.ReLU(),
            nn.Linear(256, 10),
        )
        return net, (784,), 0.1
    net = nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(7 * 7 * 64, 256), nn.ReLU(),
        nn.Linear(256, 256), nn.ReLU(),
        nn.Dropout(0.4),
        nn.Linear(256, 10),
    )
    return net, (1, 28, 28), 0.05


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["fc", "cnn"], required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    net, shape, lr = build(args.model)
    net.apply(init_glorot)
    net.train()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(net.parameters(), lr=lr)

    xs = [torch.rand(args.batch, *shape, dtype=torch.float32) for _ in range(POOL)]
    ys = [torch.randint(0, 10, (args.batch,)) for _ in range(POOL)]

    def step(i):
        opt.zero_grad()
        loss = loss_fn(net(xs[i % POOL]), ys[i % POOL])
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.steps):
        step(i)
    seconds = time.perf_counter() - start

    print(json.dumps({
        "peer": "pytorch-eager",
        "model": args.model,
        "threads": args.threads,
        "batch": args.batch,
        "steps": args.steps,
        "seconds": round(seconds, 6),
        "steps_per_sec": round(args.steps / seconds, 3),
    }))


if __name__ == "__main__":
    main()
