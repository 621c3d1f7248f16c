#!/usr/bin/env python3
"""Write reference outputs of TensorFlow's ops for tests/ops.rs.

Usage:
    bench/.venv/bin/python scripts/tf_ops_reference.py [OUT]

OUT defaults to tests/fixtures/tf_ops_reference.json under the repository root.

The inputs are what tests/ops.rs's program computes in its input pipeline and model,
in float32:
    grid(shape, i)[a, b, c] = sin(a * 0.37 + b * 0.71 + c * 1.3 + i * 0.5)
    x = the batch of grid([6, 5, 3], i) for i = 0..3, shape [4, 6, 5, 3].
Each output is TensorFlow's op (tf 2.x) on them, flattened, per example where the op
keeps the batch axis first. Grouped convolution has no CPU kernel in TensorFlow, so its
reference is a convolution per group, joined (what Keras's Conv2D(groups=) computes).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf


def grid(shape, i):
    a, b, c = np.meshgrid(*[np.arange(n, dtype=np.float32) for n in shape], indexing="ij")
    f = np.float32
    return np.sin(a * f(0.37) + b * f(0.71) + c * f(1.3) + f(i) * f(0.5)).astype(np.float32)


def sines(shape, a, b):
    """reshape(sin(iota(n) * a + b), shape) * 0.5, as tests/ops.rs's `sines`."""
    n = int(np.prod(shape))
    f = np.float32
    v = np.sin(np.arange(n, dtype=np.float32) * f(a) + f(b)).astype(np.float32) * f(0.5)
    return v.reshape(shape)


def recurrent():
    """Keras's LSTM and GRU (reset_after) over fixed weights: x[i][t, f] = sin(t * 0.37 +
    f * 0.71 + i * 0.5), lengths [5, 2, 4, 1]. The LSTM's bias gets est's forget_bias of
    1 on its forget gate. Masked sequences output zeros from their length on (TF 1's
    dynamic_rnn; Keras repeats the last output, so its outputs are zeroed here)."""
    x = np.stack([grid([5, 3, 1], i)[:, :, 0] for i in range(4)])
    lengths = np.array([5, 2, 4, 1])
    mask = tf.sequence_mask(lengths, 5)
    u = 4
    lk, lr, lb = sines([3, 4 * u], 0.7, 0.3), sines([u, 4 * u], 0.45, 1.1), sines([4 * u], 0.9, 0.2)
    gk, gr, gb = sines([3, 3 * u], 0.6, 0.5), sines([u, 3 * u], 0.35, 0.8), sines([2, 3 * u], 0.8, 0.1)
    keras_lb = lb.copy()
    keras_lb[u:2 * u] += 1.0
    out = {}
    for name, layer, weights in [
        ("lstm", tf.keras.layers.LSTM(u, return_sequences=True, return_state=True), [lk, lr, keras_lb]),
        ("gru", tf.keras.layers.GRU(u, return_sequences=True, return_state=True, reset_after=True), [gk, gr, gb]),
    ]:
        layer.build((4, 5, 3))
        layer.set_weights(weights)
        seq = layer(tf.constant(x))[0]
        masked, h = layer(tf.constant(x), mask=mask)[:2]
        out[name + "_seq"] = seq
        out[name + "_masked"] = masked * tf.cast(mask, tf.float32)[:, :, None]
        out[name + "_last"] = h
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests/fixtures/tf_ops_reference.json")
    x = tf.constant(np.stack([grid([6, 5, 3], i) for i in range(4)]))
    flat = tf.reshape(x, [4, 90])
    ct_filter = tf.tile(tf.reshape(grid([3, 3, 2], 1), [3, 3, 2, 1]), [1, 1, 1, 3])
    dw_filter = tf.reshape(grid([3, 3, 6], 2), [3, 3, 3, 2])
    gc_filter = tf.reshape(grid([3, 3, 6], 3), [3, 3, 1, 6])
    gc2_filter = tf.reshape(grid([3, 3, 12], 4), [3, 3, 3, 4])
    x6 = tf.tile(x, [1, 1, 1, 2])

    def grouped(x, w, groups, strides=1, padding="SAME"):
        xs = tf.split(x, groups, axis=3)
        ws = tf.split(w, groups, axis=3)
        return tf.concat([tf.nn.conv2d(a, b, strides, padding) for a, b in zip(xs, ws)], axis=3)

    targets = tf.cast(tf.abs(tf.reduce_sum(x, axis=[1, 2, 3])) * 10.0, tf.int32) % 3
    values, indices = tf.math.top_k(flat, k=3)
    outs = {
        "rev": tf.reverse(x, [1, 2]),
        "tiled": tf.tile(x, [1, 2, 1, 2]),
        "cs": tf.math.cumsum(x, axis=2),
        "cse": tf.math.cumsum(x, axis=1, exclusive=True, reverse=True),
        "tk": values,
        "tki": indices,
        "ein": tf.einsum("bhwc,bhvc->bwv", x, x),
        "ein_dense": tf.einsum("bhwc,cd->bhwd", x, dw_filter[0, 0]),
        "rs": tf.image.resize(x, [9, 4]),
        "rs_down": tf.image.resize(x, [4, 3]),
        "rsn": tf.image.resize(x, [9, 4], method="nearest"),
        "ct": tf.nn.conv2d_transpose(x, ct_filter, [4, 12, 10, 2], strides=2, padding="SAME"),
        "ct_valid": tf.nn.conv2d_transpose(x, ct_filter, [4, 13, 11, 2], strides=2, padding="VALID"),
        "dw": tf.nn.depthwise_conv2d(x, dw_filter, [1, 2, 2, 1], "SAME"),
        "dw_valid": tf.nn.depthwise_conv2d(x, dw_filter, [1, 1, 1, 1], "VALID", dilations=[2, 1]),
        "gc": grouped(x, gc_filter, 3),
        "gc2": grouped(x6, gc2_filter, 2, strides=2, padding="VALID"),
        "itk": tf.cast(tf.math.in_top_k(targets, flat, 10), tf.float32),
        "pis": tf.image.per_image_standardization(x),
        "fl": tf.image.flip_left_right(x),
        "pad_reflect": tf.pad(x, [[0, 0], [2, 1], [1, 3], [0, 0]], mode="REFLECT"),
    }
    outs.update(recurrent())
    ref = {}
    for name, v in outs.items():
        v = np.asarray(v)
        # the shortest decimal that reads back as the same float32
        ref[name] = [[float(str(np.float32(e))) for e in row.reshape(-1)] for row in v]
    # the gaps between a row's top values, so that the test knows the order is not a tie
    gaps = np.diff(-np.sort(-flat.numpy(), axis=1)[:, :4], axis=1)
    assert np.all(np.abs(gaps) > 1e-4), gaps
    ref["_tensorflow"] = tf.__version__
    with open(out, "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
