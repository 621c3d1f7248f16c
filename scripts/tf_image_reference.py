#!/usr/bin/env python3
"""Write encoded images and TensorFlow's decodings of them, for tests/images.rs.

Usage:
    bench/.venv/bin/python scripts/tf_image_reference.py [OUT_DIR]

OUT_DIR defaults to tests/fixtures. Writes:
- images.tfrecord: two tf.Examples, each with the features `png_rgb`, `png_rgba`,
  `png_gray16` (a 16-bit grayscale PNG), `jpeg_rgb` (quality 90, 4:2:0) and `label`,
  encoded by TensorFlow (tf.io.encode_png, tf.io.encode_jpeg) from 12x12 images drawn
  from a seeded NumPy generator (smooth gradients with noise, so that JPEG keeps them
  close);
- tf_image_reference.json: for each example, what TensorFlow decodes: decode_png with
  3, 1 and 4 channels, the 16-bit PNG as uint8 with 1 channel, decode_jpeg with 3 and
  1 channels, and tf.image.resize (bilinear) to 7x9 of the decoded PNG and JPEG.

The PNGs are lossless, so their decodings are exact; TensorFlow's JPEG decoder
(libjpeg-turbo) and est's (zune-jpeg) may differ by a level or two.
"""

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

REPO_ROOT = Path(__file__).resolve().parent.parent
SIDE = 12


def image(rng, channels, top=255.0):
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float64) / (SIDE - 1)
    planes = []
    for _ in range(channels):
        a, b, c = rng.uniform(-1, 1, 3)
        plane = 0.5 + 0.35 * (a * x + b * y + c * x * y) + rng.normal(0, 0.03, (SIDE, SIDE))
        planes.append(np.clip(plane, 0, 1) * top)
    return np.stack(planes, axis=-1)


def flat(t):
    return [float(v) for v in np.asarray(t, dtype=np.float64).reshape(-1)]


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "tests" / "fixtures"
    rng = np.random.default_rng(7)
    examples, refs = [], []
    for label in range(2):
        rgb = image(rng, 3).round().astype(np.uint8)
        rgba = image(rng, 4).round().astype(np.uint8)
        gray16 = image(rng, 1, 65535.0).round().astype(np.uint16)
        enc = {
            "png_rgb": tf.io.encode_png(rgb).numpy(),
            "png_rgba": tf.io.encode_png(rgba).numpy(),
            "png_gray16": tf.io.encode_png(gray16).numpy(),
            "jpeg_rgb": tf.io.encode_jpeg(rgb, quality=90).numpy(),
        }
        feature = {k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v])) for k, v in enc.items()}
        feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
        examples.append(tf.train.Example(features=tf.train.Features(feature=feature)))
        png3 = tf.io.decode_png(enc["png_rgb"], channels=3)
        jpeg3 = tf.io.decode_jpeg(enc["jpeg_rgb"], channels=3)
        refs.append({
            "png3": flat(png3),
            "png1": flat(tf.io.decode_png(enc["png_rgb"], channels=1)),
            "png4": flat(tf.io.decode_png(enc["png_rgba"], channels=4)),
            "gray16": flat(tf.io.decode_png(enc["png_gray16"], channels=1, dtype=tf.uint8)),
            "jpeg3": flat(jpeg3),
            "jpeg1": flat(tf.io.decode_jpeg(enc["jpeg_rgb"], channels=1)),
            "resized": flat(tf.image.resize(png3, [7, 9], method="bilinear")),
            "jpeg_resized": flat(tf.image.resize(jpeg3, [7, 9], method="bilinear")),
        })
    out.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(out / "images.tfrecord")) as w:
        for e in examples:
            w.write(e.SerializeToString())
    doc = {"tensorflow": tf.__version__, "side": SIDE, "examples": refs}
    (out / "tf_image_reference.json").write_text(json.dumps(doc) + "\n")
    print(f"wrote {out / 'images.tfrecord'} and {out / 'tf_image_reference.json'}")


if __name__ == "__main__":
    main()
