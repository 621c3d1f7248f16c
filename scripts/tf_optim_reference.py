#!/usr/bin/env python3
"""Write reference optimiser trajectories computed with TensorFlow itself.

Usage:
    bench/.venv/bin/python scripts/tf_optim_reference.py [OUT]

OUT defaults to tests/fixtures/tf_optim_reference.json under the repository root.

The same problem as scripts/optim_reference.py (PyTorch's references): one float32
parameter vector w0 = [0.5, -1.0, 2.0, 0.1] and six steps t = 0..5 whose gradient is
set directly,
    g_t[i] = (i + 1) * 0.1 * (-1)^(t + i) + 0.05 * t   (float64, then cast to float32).
Each case starts again from w0 and records w after every step.

The optimisers whose update TensorFlow defines differently from PyTorch (or that
PyTorch lacks):
- Keras 3's Adagrad (epsilon inside the square root) and Ftrl (TensorFlow's
  FTRL-Proximal, with l1, l2, l2 shrinkage and beta);
- TF1's tf.compat.v1.train.RMSPropOptimizer (the mean square starts at 1, epsilon
  inside the square root, the learning rate inside the momentum) and AdamOptimizer
  (epsilon-hat: the bias corrections folded into the learning rate);
- BERT's AdamWeightDecayOptimizer (google-research/bert, optimization.py): Adam without
  bias correction, the decay added to the update; it is not part of TensorFlow, so its
  update rule is written here with TensorFlow ops, as BERT's apply_gradients does.

All floats written are exact float32 values written as float64.
"""

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "tf_optim_reference.json"

W0 = [0.5, -1.0, 2.0, 0.1]
STEPS = 6
GRADS = [
    np.array([(i + 1) * 0.1 * (-1) ** (t + i) + 0.05 * t for i in range(len(W0))],
             dtype=np.float64).astype(np.float32)
    for t in range(STEPS)
]


def keras_case(make):
    w = tf.Variable(np.array(W0, dtype=np.float32))
    opt = make()
    out = []
    for g in GRADS:
        opt.apply_gradients([(tf.constant(g), w)])
        out.append([float(x) for x in w.numpy()])
    return out


def bert_adam_weight_decay(lr, weight_decay, beta1, beta2, epsilon, decay):
    """BERT's AdamWeightDecayOptimizer.apply_gradients, for one variable."""
    w = tf.Variable(np.array(W0, dtype=np.float32))
    m = tf.Variable(tf.zeros_like(w))
    v = tf.Variable(tf.zeros_like(w))
    out = []
    for g in GRADS:
        g = tf.constant(g)
        next_m = tf.multiply(beta1, m) + tf.multiply(1.0 - beta1, g)
        next_v = tf.multiply(beta2, v) + tf.multiply(1.0 - beta2, tf.square(g))
        update = next_m / (tf.sqrt(next_v) + epsilon)
        if decay:
            update += weight_decay * w
        w.assign(w - lr * update)
        m.assign(next_m)
        v.assign(next_v)
        out.append([float(x) for x in w.numpy()])
    return out


CASES = {
    "adagrad": lambda: keras_case(lambda: tf.keras.optimizers.Adagrad(
        learning_rate=0.1, initial_accumulator_value=0.1, epsilon=1e-7)),
    "ftrl": lambda: keras_case(lambda: tf.keras.optimizers.Ftrl(
        learning_rate=0.1, learning_rate_power=-0.5, initial_accumulator_value=0.1,
        l1_regularization_strength=0.01, l2_regularization_strength=0.01)),
    "ftrl_shrinkage": lambda: keras_case(lambda: tf.keras.optimizers.Ftrl(
        learning_rate=0.1, learning_rate_power=-0.5, initial_accumulator_value=0.1,
        l1_regularization_strength=0.001, l2_regularization_strength=0.02,
        l2_shrinkage_regularization_strength=0.01, beta=0.5)),
    "ftrl_power": lambda: keras_case(lambda: tf.keras.optimizers.Ftrl(
        learning_rate=0.05, learning_rate_power=-0.25, initial_accumulator_value=0.2)),
    "tf_rmsprop": lambda: keras_case(lambda: tf.compat.v1.train.RMSPropOptimizer(
        0.01, decay=0.9, momentum=0.0, epsilon=1e-10)),
    "tf_rmsprop_momentum": lambda: keras_case(lambda: tf.compat.v1.train.RMSPropOptimizer(
        0.01, decay=0.9, momentum=0.5, epsilon=1e-3)),
    "tf_adam": lambda: keras_case(lambda: tf.compat.v1.train.AdamOptimizer(
        0.01, beta1=0.9, beta2=0.999, epsilon=1e-8)),
    "tf_adam_large_epsilon": lambda: keras_case(lambda: tf.compat.v1.train.AdamOptimizer(
        0.01, beta1=0.8, beta2=0.99, epsilon=0.1)),
    "bert_adamw": lambda: bert_adam_weight_decay(0.01, 0.01, 0.9, 0.999, 1e-6, True),
    "bert_adamw_excluded": lambda: bert_adam_weight_decay(0.01, 0.01, 0.9, 0.999, 1e-6, False),
}


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    doc = {
        "tensorflow": tf.__version__,
        "w0": W0,
        "grads": [[float(x) for x in g] for g in GRADS],
        "optimizers": {name: {"trajectory": case()} for name, case in CASES.items()},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
