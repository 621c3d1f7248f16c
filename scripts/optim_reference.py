#!/usr/bin/env python3
"""Write reference optimiser trajectories and learning-rate schedules, computed with PyTorch.

Usage:
    bench/.venv/bin/python scripts/optim_reference.py [OUT]

OUT defaults to tests/fixtures/optim_reference.json under the repository root.

Optimisers: one float32 parameter vector w0 = [0.5, -1.0, 2.0, 0.1] and six steps
t = 0..5 whose gradient is set directly,
    g_t[i] = (i + 1) * 0.1 * (-1)^(t + i) + 0.05 * t   (float64, then cast to float32).
Each case starts again from w0 and records w after every step. The semantics are
torch.optim's (e.g. Adam's and RMSprop's eps is added outside the square root,
clip_grad_norm_ divides by norm + 1e-6).

Schedules: plain Python float64 at steps 0, 1, 50, 100, 250, 1000.

All floats written are exact: float32 results are written as the float64 number
equal to them, so parsing them as f32 or f64 gives the same bits. The output is
deterministic for a given torch version.
"""

import json
import math
import re
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "optim_reference.json"

W0 = [0.5, -1.0, 2.0, 0.1]
STEPS = 6
GRADS = [
    torch.tensor([(i + 1) * 0.1 * (-1) ** (t + i) + 0.05 * t for i in range(len(W0))],
                 dtype=torch.float64).to(torch.float32)
    for t in range(STEPS)
]

# name: (optimizer class, hyperparameters as passed, max_norm for clip_grad_norm_ or None)
CASES = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}, None),
    "momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, None),
    "nesterov": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}, None),
    "adam": (torch.optim.Adam, {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-7}, None),
    "adamw": (torch.optim.AdamW,
              {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-7, "weight_decay": 0.01}, None),
    "rmsprop": (torch.optim.RMSprop,
                {"lr": 0.01, "alpha": 0.9, "eps": 1e-7, "momentum": 0.0}, None),
    "rmsprop_momentum": (torch.optim.RMSprop,
                         {"lr": 0.01, "alpha": 0.9, "eps": 1e-7, "momentum": 0.5}, None),
    "sgd_clip": (torch.optim.SGD, {"lr": 0.1}, 0.2),
}

SCHEDULE_STEPS = [0, 1, 50, 100, 250, 1000]


def trajectory(cls, hyper, max_norm):
    w = torch.nn.Parameter(torch.tensor(W0, dtype=torch.float32))
    opt = cls([w], **hyper)
    out = []
    for g in GRADS:
        opt.zero_grad()
        w.grad = g.clone()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_([w], max_norm=max_norm)
        opt.step()
        out.append(w.detach().tolist())
    return out


def schedules():
    def exponential(step, lr, decay_steps, decay_rate, staircase=False):
        p = step / decay_steps
        return lr * decay_rate ** (math.floor(p) if staircase else p)

    def cosine(step, lr, decay_steps, alpha):
        frac = min(step, decay_steps) / decay_steps
        return lr * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * frac)) + alpha)

    def warmup(step, lr, warmup_steps):
        return lr * min(step / warmup_steps, 1.0)

    def polynomial(step, lr, decay_steps, end_lr, power):
        # tf.compat.v1.train.polynomial_decay without cycle
        frac = min(step, decay_steps) / decay_steps
        return (lr - end_lr) * (1 - frac) ** power + end_lr

    def piecewise(step, boundaries, values):
        # tf.compat.v1.train.piecewise_constant: values[i] while step <= boundaries[i]
        for b, v in zip(boundaries, values):
            if step <= b:
                return v
        return values[-1]

    table = {
        "exponential_decay": (exponential, {"lr": 0.1, "decay_steps": 100, "decay_rate": 0.96}),
        "exponential_decay_staircase": (exponential, {"lr": 0.1, "decay_steps": 100,
                                                      "decay_rate": 0.96, "staircase": True}),
        "cosine_decay": (cosine, {"lr": 0.1, "decay_steps": 250, "alpha": 0.1}),
        "linear_warmup": (warmup, {"lr": 0.1, "warmup_steps": 100}),
        "polynomial_decay": (polynomial, {"lr": 0.1, "decay_steps": 250, "end_lr": 0.001, "power": 2.0}),
        "piecewise_constant": (piecewise, {"boundaries": [50, 250], "values": [0.1, 0.01, 0.001]}),
    }
    return {
        name: {"args": args, "steps": SCHEDULE_STEPS,
               "values": [fn(s, **args) for s in SCHEDULE_STEPS]}
        for name, (fn, args) in table.items()
    }


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    optimizers = {}
    for name, (cls, hyper, max_norm) in CASES.items():
        shown = {k: list(v) if isinstance(v, tuple) else v for k, v in hyper.items()}
        if max_norm is not None:
            shown["max_norm"] = max_norm
        optimizers[name] = {"hyper": shown, "trajectory": trajectory(cls, hyper, max_norm)}
    doc = {
        "w0": W0,
        "grads": [g.tolist() for g in GRADS],
        "optimizers": optimizers,
        "schedules": schedules(),
        "generated_by": "scripts/optim_reference.py",
        "torch": torch.__version__,
    }
    text = json.dumps(doc, indent=2)
    # Keep innermost lists of numbers on one line.
    text = re.sub(r"\[\s*([^\[\]{}]*?)\s*\]",
                  lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
