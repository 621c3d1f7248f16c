#!/usr/bin/env python3
"""Training-speed peers (JAX, TensorFlow, PyTorch) for estc's training benchmarks.

Usage:
    bench/.venv/bin/python bench/peers_train.py
        --peer jax|tf|tf-xla|torch|torch-compile --model fc|cnn [--threads N]
        [--steps 200] [--warmup 20] [--batch 128] [--hidden W1,W2,...]

Peers:
    jax            one `jax.jit` train step (params pytree -> new params, loss),
                   params donated; lax.conv_general_dilated (NHWC/HWIO),
                   lax.reduce_window max pool, jax.random dropout (key split
                   inside the step).
    tf             one `tf.function(jit_compile=False)` train step over plain
                   tf.Variables with tf.GradientTape; tf.nn.conv2d (NHWC),
                   tf.nn.max_pool2d, tf.nn.dropout.
    tf-xla         the same with `jit_compile=True`.
    torch          PyTorch eager (NCHW, nn.Sequential,
                   torch.optim.SGD).
    torch-compile  the same model with `torch.compile` applied to the whole train
                   step (zero_grad, forward, loss, backward, optimizer.step).
                   Dynamo splits it at zero_grad, backward and the optimizer's
                   own graph breaks: forward+loss is one Inductor graph (its
                   backward compiled by AOTAutograd), the SGD update another.

Models (all weights Glorot-uniform, all biases zero, as in Keras's defaults;
float32; mean softmax cross-entropy over integer labels 0..9; plain SGD):
    fc   MLP 784-H...-10 with ReLU after every hidden layer, lr 0.1.
         Default hidden widths H = 256,256.
    cnn  The TensorFlow MNIST CNN: [B,28,28,1] (NHWC; [B,1,28,28] NCHW for the
         torch peers) -> conv5x5x32 same + bias + relu + maxpool2
         -> conv5x5x64 same + bias + relu + maxpool2 -> flatten 3136
         -> dense H... relu -> dropout 0.4 (training) -> dense 10, lr 0.05.
         Default hidden widths H = 128.
    --hidden overrides H (comma-separated widths) for every peer.

Threads: N threads means N cores. The process is pinned to the first N CPUs
it may run on (os.sched_setaffinity) before any framework is imported, and
each framework is told to use N intra-op threads: XLA_FLAGS
"--xla_cpu_multi_thread_eigen=<N > 1> intra_op_parallelism_threads=N" (jax;
XLA silently skips the second, dash-less token, so JAX's pool size really
comes from the affinity mask), tf.config.threading intra-op N / inter-op 1
(tf), torch.set_num_threads(N) and set_num_interop_threads(1) (torch).
OMP_NUM_THREADS and MKL_NUM_THREADS are set to N too.

Data is synthetic (features uniform in [0,1), float32; labels uniform in 0..9),
pre-generated as a pool of 10 batches, already framework-native tensors (device
arrays for JAX), that the steps cycle through, so no data loading is measured.

Measurement: the first step is timed on its own, from just before the call to
when its loss is ready, so it includes tracing/compilation
(`first_step_seconds`). It counts as the first of the --warmup untimed steps
(at least one step always runs untimed). Then --steps steps are timed with
time.perf_counter, synchronising on the last loss (block_until_ready / .numpy()
/ .item()) before the clock stops. Exactly one JSON line is printed on stdout
(everything else, including library chatter, goes to stderr):
    {"peer": ..., "model": ..., "threads": ..., "batch": ..., "steps": ...,
     "seconds": ..., "steps_per_sec": ..., "first_step_seconds": ...,
     "peak_rss_mb": ..., "final_loss": ...}
peak_rss_mb is VmHWM / 1024 of this process at the end (its own peak); final_loss is the
loss of the last timed step. If a peer cannot run (e.g. torch.compile has no
working compiler), the line is {"peer": ..., "model": ..., "threads": ...,
"batch": ..., "steps": ..., "error": "<message>"}; the exit status is then 0
for torch-compile (an optional peer) and 1 for the others.
"""

import argparse
import json
import math
import os
import resource


def peak_rss_kb():
    """This process's peak resident memory since it started (VmHWM of its own memory
    map). ru_maxrss would also count the peak of the process that spawned it: Linux
    carries the old map's peak over into the new one's at exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
import sys
import time
import traceback

POOL = 10
PEERS = ["jax", "tf", "tf-xla", "torch", "torch-compile"]
DROPOUT = 0.4
CLASSES = 10
SEED = 0


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def model_config(model, hidden):
    """Return (hidden widths, learning rate)."""
    if hidden is None:
        hidden = "256,256" if model == "fc" else "128"
    widths = [int(w) for w in hidden.split(",") if w.strip()]
    if not widths or any(w <= 0 for w in widths):
        raise SystemExit(f"--hidden: expected positive comma-separated widths, got {hidden!r}")
    return widths, (0.1 if model == "fc" else 0.05)


def pin_threads(threads):
    """Pin this process to `threads` CPUs (the first ones it is allowed on)."""
    allowed = sorted(os.sched_getaffinity(0))
    if threads > len(allowed):
        log(f"peers_train: --threads {threads} > {len(allowed)} usable CPUs; "
            f"pinning to all {len(allowed)}")
    os.sched_setaffinity(0, allowed[:threads])


def glorot_limit(fan_in, fan_out):
    return math.sqrt(6.0 / (fan_in + fan_out))


def dense_shapes(model, widths):
    """(fan_in, fan_out) of every dense layer."""
    dims = [784 if model == "fc" else 7 * 7 * 64] + widths + [CLASSES]
    return list(zip(dims[:-1], dims[1:]))


CONV_SHAPES = [(5, 5, 1, 32), (5, 5, 32, 64)]  # HWIO


# --------------------------------------------------------------------------- jax

def setup_jax(args, widths, lr):
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(SEED)
    params = {"conv": [], "dense": []}
    if args.model == "cnn":
        for (kh, kw, ci, co) in CONV_SHAPES:
            lim = glorot_limit(kh * kw * ci, kh * kw * co)
            params["conv"].append({
                "w": jnp.asarray(rng.uniform(-lim, lim, (kh, kw, ci, co)).astype(np.float32)),
                "b": jnp.zeros((co,), jnp.float32),
            })
    for fi, fo in dense_shapes(args.model, widths):
        lim = glorot_limit(fi, fo)
        params["dense"].append({
            "w": jnp.asarray(rng.uniform(-lim, lim, (fi, fo)).astype(np.float32)),
            "b": jnp.zeros((fo,), jnp.float32),
        })

    shape = (784,) if args.model == "fc" else (28, 28, 1)
    xs = [jax.device_put(rng.random((args.batch, *shape), dtype=np.float32)) for _ in range(POOL)]
    ys = [jax.device_put(rng.integers(0, CLASSES, (args.batch,)).astype(np.int32)) for _ in range(POOL)]

    dn = ("NHWC", "HWIO", "NHWC")

    def forward(p, x, key):
        h = x
        if args.model == "cnn":
            for c in p["conv"]:
                h = jax.lax.conv_general_dilated(h, c["w"], (1, 1), "SAME", dimension_numbers=dn)
                h = jax.nn.relu(h + c["b"])
                h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max,
                                          (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
            h = h.reshape(h.shape[0], -1)
        dense = p["dense"]
        for d in dense[:-1]:
            h = jax.nn.relu(h @ d["w"] + d["b"])
        if args.model == "cnn":
            keep = jax.random.bernoulli(key, 1.0 - DROPOUT, h.shape)
            h = jnp.where(keep, h / (1.0 - DROPOUT), 0.0)
        return h @ dense[-1]["w"] + dense[-1]["b"]

    def loss_fn(p, x, y, key):
        logp = jax.nn.log_softmax(forward(p, x, key))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def train_step(p, key, x, y):
        key, sub = jax.random.split(key)
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y, sub)
        p = jax.tree_util.tree_map(lambda w, g: w - lr * g, p, grads)
        return p, key, loss

    train_step = jax.jit(train_step, donate_argnums=(0, 1))
    state = {"params": params, "key": jax.random.key(SEED)}

    def step(i):
        state["params"], state["key"], loss = train_step(
            state["params"], state["key"], xs[i % POOL], ys[i % POOL])
        return loss

    def sync(loss):
        jax.block_until_ready(state["params"])
        return float(jax.block_until_ready(loss))

    return step, sync


# ---------------------------------------------------------------------------- tf

def setup_tf(args, widths, lr):
    import numpy as np
    import tensorflow as tf

    # Must come before any op runs.
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.random.set_seed(SEED)

    rng = np.random.default_rng(SEED)
    conv, dense = [], []
    if args.model == "cnn":
        for (kh, kw, ci, co) in CONV_SHAPES:
            lim = glorot_limit(kh * kw * ci, kh * kw * co)
            conv.append((
                tf.Variable(rng.uniform(-lim, lim, (kh, kw, ci, co)).astype(np.float32)),
                tf.Variable(tf.zeros((co,), tf.float32)),
            ))
    for fi, fo in dense_shapes(args.model, widths):
        lim = glorot_limit(fi, fo)
        dense.append((
            tf.Variable(rng.uniform(-lim, lim, (fi, fo)).astype(np.float32)),
            tf.Variable(tf.zeros((fo,), tf.float32)),
        ))
    variables = [v for layer in conv + dense for v in layer]

    shape = (784,) if args.model == "fc" else (28, 28, 1)
    xs = [tf.constant(rng.random((args.batch, *shape), dtype=np.float32)) for _ in range(POOL)]
    ys = [tf.constant(rng.integers(0, CLASSES, (args.batch,)).astype(np.int32)) for _ in range(POOL)]

    def forward(x):
        h = x
        if args.model == "cnn":
            for w, b in conv:
                h = tf.nn.relu(tf.nn.conv2d(h, w, strides=1, padding="SAME") + b)
                h = tf.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")
            h = tf.reshape(h, (tf.shape(h)[0], -1))
        for w, b in dense[:-1]:
            h = tf.nn.relu(tf.matmul(h, w) + b)
        if args.model == "cnn":
            h = tf.nn.dropout(h, rate=DROPOUT)
        w, b = dense[-1]
        return tf.matmul(h, w) + b

    @tf.function(jit_compile=(args.peer == "tf-xla"))
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = forward(x)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(lr * g)
        return loss

    def step(i):
        return train_step(xs[i % POOL], ys[i % POOL])

    def sync(loss):
        return float(loss.numpy())

    return step, sync


# ------------------------------------------------------------------------- torch

def setup_torch(args, widths, lr):
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(SEED)

    layers = []
    if args.model == "fc":
        shape, dims = (784,), [784] + widths
    else:
        shape, dims = (1, 28, 28), [7 * 7 * 64] + widths
        layers += [
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        ]
    for fi, fo in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(fi, fo), nn.ReLU()]
    if args.model == "cnn":
        layers.append(nn.Dropout(DROPOUT))
    layers.append(nn.Linear(dims[-1], CLASSES))
    net = nn.Sequential(*layers)

    def init_glorot(module):
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)

    net.apply(init_glorot)
    net.train()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(net.parameters(), lr=lr)

    xs = [torch.rand(args.batch, *shape, dtype=torch.float32) for _ in range(POOL)]
    ys = [torch.randint(0, CLASSES, (args.batch,)) for _ in range(POOL)]

    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    if args.peer == "torch-compile":
        train_step = torch.compile(train_step)

    def step(i):
        return train_step(xs[i % POOL], ys[i % POOL])

    def sync(loss):
        return float(loss.item())

    return step, sync


# -------------------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=PEERS, required=True)
    parser.add_argument("--model", choices=["fc", "cnn"], required=True)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", default=None,
                        help='comma-separated hidden dense widths (default "256,256" '
                             'for fc, "128" for cnn)')
    args = parser.parse_args()
    if args.threads < 1 or args.steps < 1 or args.batch < 1 or args.warmup < 0:
        parser.error("--threads, --steps and --batch must be >= 1, --warmup >= 0")
    widths, lr = model_config(args.model, args.hidden)

    # Only the final JSON line may reach stdout: keep a private handle on it and
    # send fd 1 (Python prints, C++ libraries, compiler subprocesses) to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    head = {
        "peer": args.peer,
        "model": args.model,
        "threads": args.threads,
        "batch": args.batch,
        "steps": args.steps,
    }

    def emit(record):
        out.write(json.dumps(record) + "\n")
        out.flush()

    # Environment before any framework import.
    pin_threads(args.threads)
    n = str(args.threads)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["OMP_NUM_THREADS"] = n
    os.environ["MKL_NUM_THREADS"] = n
    if args.peer == "jax":
        os.environ["JAX_PLATFORMS"] = "cpu"
        multi = "true" if args.threads > 1 else "false"
        flags = f"--xla_cpu_multi_thread_eigen={multi} intra_op_parallelism_threads={n}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()

    try:
        setup = {"jax": setup_jax, "tf": setup_tf, "tf-xla": setup_tf,
                 "torch": setup_torch, "torch-compile": setup_torch}[args.peer]
        step, sync = setup(args, widths, lr)

        start = time.perf_counter()
        first_loss = sync(step(0))
        first_step_seconds = time.perf_counter() - start
        log(f"peers_train: {args.peer}/{args.model} first step {first_step_seconds:.3f}s "
            f"loss {first_loss:.4f}")

        for i in range(1, max(args.warmup, 1)):
            loss = step(i)
        if args.warmup > 1:
            sync(loss)

        offset = max(args.warmup, 1)
        start = time.perf_counter()
        for i in range(offset, offset + args.steps):
            loss = step(i)
        final_loss = sync(loss)
        seconds = time.perf_counter() - start
        if not math.isfinite(final_loss):
            raise RuntimeError(f"non-finite final loss {final_loss}")
    except Exception as e:  # never leave without a JSON line
        traceback.print_exc(file=sys.stderr)
        msg = f"{type(e).__name__}: {e}".strip().splitlines()
        emit({**head, "error": msg[0] if msg else type(e).__name__})
        sys.exit(0 if args.peer == "torch-compile" else 1)

    emit({
        **head,
        "seconds": round(seconds, 6),
        "steps_per_sec": round(args.steps / seconds, 3),
        "first_step_seconds": round(first_step_seconds, 6),
        "peak_rss_mb": round(peak_rss_kb() / 1024, 1),
        "final_loss": round(final_loss, 6),
    })


if __name__ == "__main__":
    main()
