"""The tf.data peer of `cargo bench --bench input`.

  tfdata_input.py write PATH [--records N]
      Writes N MNIST-shaped tf.Examples (784-byte `image_raw`, int64 `label`) to the
      TFRecord file PATH with TensorFlow's own writer.
  tfdata_input.py run PATH --threads T [--cache] [--batches B] [--warmup W]
      Runs TFRecordDataset -> map(parse, num_parallel_calls=AUTOTUNE) -> batch(128,
      drop_remainder=True) (with `.cache()` after the map, `--shuffle` then
      `.shuffle(10000)`, and `.repeat()`), skips W
      batches, times B batches, and prints one JSON object with records/sec.

The thread count caps tf.data's private thread pool and TensorFlow's op pools.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def write(path, records):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(20261121)
    images = rng.integers(0, 256, size=(records, 784), dtype=np.uint8)
    labels = rng.integers(0, 10, size=records)
    with tf.io.TFRecordWriter(path) as w:
        for img, lab in zip(images, labels):
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[img.tobytes()])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(lab)])),
                    }
                )
            )
            w.write(ex.SerializeToString())


def run(path, threads, cache, batches, warmup, shuffle=False):
    import tensorflow as tf

    if os.environ.get("TFDATA_OP_THREADS", "1") == "1":
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    spec = {
        "image_raw": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(rec):
        f = tf.io.parse_single_example(rec, spec)
        image = tf.cast(tf.io.decode_raw(f["image_raw"], tf.uint8), tf.float32) / 255.0
        return tf.reshape(image, [784]), tf.cast(f["label"], tf.int32)

    ds = tf.data.TFRecordDataset(path).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        ds = ds.cache()
    if shuffle:
        ds = ds.shuffle(10000, seed=1)
    ds = ds.repeat().batch(128, drop_remainder=True)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    ds = ds.with_options(opts)
    it = iter(ds)
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        x, y = next(it)
    dt = time.perf_counter() - t0
    assert tuple(x.shape) == (128, 784) and tuple(y.shape) == (128,)
    print(json.dumps({"records_per_sec": batches * 128 / dt, "seconds": dt, "batches": batches}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("path")
    w.add_argument("--records", type=int, default=60000)
    r = sub.add_parser("run")
    r.add_argument("path")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--cache", action="store_true")
    r.add_argument("--shuffle", action="store_true", help="shuffle(10000) after the cache")
    r.add_argument("--batches", type=int, default=469)
    r.add_argument("--warmup", type=int, default=20)
    a = p.parse_args()
    if a.cmd == "write":
        write(a.path, a.records)
    else:
        run(a.path, a.threads, a.cache, a.batches, a.warmup, a.shuffle)


if __name__ == "__main__":
    sys.exit(main())
