#!/usr/bin/env python3
"""Write scikit-learn's bundled 8x8 digits dataset as train/test CSV files.

The data ships inside the scikit-learn package (no download): 1797 samples,
64 pixel features with integer values 0..16, labels 0..9.

Usage:
    bench/.venv/bin/python scripts/make_digits_csv.py [OUT_DIR]

OUT_DIR defaults to examples/data under the repository root. The output is
deterministic: running the script twice produces byte-identical files.
"""

import sys
from pathlib import Path

from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

# The repository root is the parent of this script's directory (scripts/).
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "examples" / "data"

N_FEATURES = 64


def write_csv(path, X, y):
    """Write a header line p0..p63,label, then one row per sample, all integers."""
    header = ",".join([f"p{i}" for i in range(N_FEATURES)] + ["label"])
    lines = [header]
    for row, label in zip(X, y):
        # Pixel values are stored as floats 0.0..16.0; they are exact integers.
        lines.append(",".join([str(int(v)) for v in row] + [str(int(label))]))
    # Explicit "\n" line endings and UTF-8 so the bytes do not depend on the platform.
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")


def main():
    if len(sys.argv) > 2:
        sys.exit(f"usage: {sys.argv[0]} [OUT_DIR]")
    out_dir = Path(sys.argv[1]) if len(sys.argv) == 2 else DEFAULT_OUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)

    X, y = load_digits(return_X_y=True)
    assert X.shape == (1797, N_FEATURES), X.shape
    # Guard the integer conversion in write_csv: every pixel must be a whole number 0..16.
    assert ((X == X.astype(int)) & (X >= 0) & (X <= 16)).all()

    # Fixed 80/20 split, stratified by label so every digit keeps its share in both halves.
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.2, random_state=0, stratify=y
    )

    write_csv(out_dir / "digits_train.csv", X_train, y_train)
    write_csv(out_dir / "digits_test.csv", X_test, y_test)
    print(f"wrote {len(y_train)} train and {len(y_test)} test rows to {out_dir}")


if __name__ == "__main__":
    main()
