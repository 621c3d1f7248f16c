"""TFRecord interop with TensorFlow, both ways (not part of `make test`; needs bench/.venv
with tensorflow-cpu: scripts/setup_bench_venv.sh).

  tfrecord_interop.py fixture PATH
      Writes the committed fixture tests/fixtures/tf_written.tfrecord with TensorFlow's
      TFRecordWriter: 3 tf.Examples with `image_raw` (bytes), `label` (int64) and `x`
      (two floats); tests/pipeline.rs reads it and checks every value.
  tfrecord_interop.py read PATH... [--expect-records N]
      Reads TFRecord files written by est (`estc data convert`) with tf.data, checking
      both CRCs (TFRecordDataset verifies them), parses every tf.Example, and prints the
      feature names, kinds and counts.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402


def fixture(path):
    with tf.io.TFRecordWriter(path) as w:
        for i in range(3):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([i, i + 1, i + 2, 255])])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[7 * i - 3])),
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5 * i, -1.25])),
            }))
            w.write(ex.SerializeToString())


def read(paths, expect):
    n = 0
    kinds = {}
    for rec in tf.data.TFRecordDataset(paths):
        ex = tf.train.Example()
        ex.ParseFromString(rec.numpy())
        for k, f in ex.features.feature.items():
            kind = f.WhichOneof("kind")
            vals = getattr(f, kind).value
            kinds[k] = (kind, len(vals))
        n += 1
    print(f"{n} records")
    for k, (kind, length) in sorted(kinds.items()):
        print(f"  {k}: {kind} of {length}")
    if expect is not None and n != expect:
        print(f"expected {expect} records", file=sys.stderr)
        return 1
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixture")
    f.add_argument("path")
    r = sub.add_parser("read")
    r.add_argument("paths", nargs="+")
    r.add_argument("--expect-records", type=int)
    a = p.parse_args()
    if a.cmd == "fixture":
        fixture(a.path)
        return 0
    return read(a.paths, a.expect_records)


if __name__ == "__main__":
    sys.exit(main())
