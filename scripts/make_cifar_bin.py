#!/usr/bin/env python3
"""Write CIFAR-10-shaped binary files for examples/resnet20.est.

CIFAR-10 itself cannot be downloaded here. These files have its binary format
(records of 3073 bytes: one label byte, then a 32x32 image as three planes of 1024
bytes, red, green and blue, each row-major), made from real images: the 8x8
handwritten digits of examples/data/digits_*.csv (scikit-learn's digits), scaled 3x to
24x24, put at a random place on a 32x32 background, in a random ink and paper colour,
with noise. The label is the digit, so a model has something real to learn, and the
random place and colours make cropping worth doing (the official recipe's flips mirror
the digits, which keep their labels).

Usage:
    python3 scripts/make_cifar_bin.py [OUT_DIR]

OUT_DIR defaults to examples/data/cifar. The output is deterministic: it writes
data_batch_1.bin (the first 320 training digits) and test_batch.bin (the first 160
test digits), CIFAR-10's file names.
"""

import csv
import random
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = REPO_ROOT / "examples" / "data"
SIDE = 32
SCALE = 3


def digits(path, count):
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        out = []
        for row in rows:
            if len(out) == count:
                break
            pixels = [int(row[f"p{i}"]) for i in range(64)]
            out.append((pixels, int(row["label"])))
        return out


def record(rng, pixels, label):
    ink = [rng.randint(140, 255) for _ in range(3)]
    paper = [rng.randint(0, 100) for _ in range(3)]
    size = 8 * SCALE
    top = rng.randint(0, SIDE - size)
    left = rng.randint(0, SIDE - size)
    planes = []
    for c in range(3):
        plane = bytearray(SIDE * SIDE)
        for y in range(SIDE):
            for x in range(SIDE):
                v = 0.0
                if top <= y < top + size and left <= x < left + size:
                    v = pixels[((y - top) // SCALE) * 8 + (x - left) // SCALE] / 16.0
                level = paper[c] + (ink[c] - paper[c]) * v + rng.gauss(0.0, 8.0)
                plane[y * SIDE + x] = max(0, min(255, int(round(level))))
        planes.append(bytes(plane))
    return bytes([label]) + b"".join(planes)


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA / "cifar"
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20)
    for name, source, count in [
        ("data_batch_1.bin", "digits_train.csv", 320),
        ("test_batch.bin", "digits_test.csv", 160),
    ]:
        records = [record(rng, p, l) for p, l in digits(DATA / source, count)]
        (out / name).write_bytes(b"".join(records))
        print(f"{out / name}: {len(records)} records of {len(records[0])} bytes")


if __name__ == "__main__":
    main()
