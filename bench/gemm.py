"""numpy's fp32 GEMM (OpenBLAS in the PyPI wheel) on n x n x n, the peer of
benches/gemm.rs: prints one JSON line with the median seconds of `--reps` products
(each followed by a sum, as est's graph reduces its product to one value)."""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--n", type=int, default=1024)
ap.add_argument("--reps", type=int, default=20)
a = ap.parse_args()
for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[k] = str(a.threads)
import numpy as np  # noqa: E402  (after the thread counts are set)

rng = np.random.default_rng(0)
x = rng.standard_normal((a.n, a.n), dtype=np.float32)
w = rng.standard_normal((a.n, a.n), dtype=np.float32)
for _ in range(3):
    float((x @ w).sum())
times = []
for _ in range(a.reps):
    t = time.perf_counter()
    float((x @ w).sum())
    times.append(time.perf_counter() - t)
times.sort()
blas = "unknown"
try:
    cfg = np.show_config(mode="dicts")
    blas = cfg["Build Dependencies"]["blas"]["name"]
except Exception:  # older numpy: no dict mode
    pass
print(json.dumps({"median_seconds": times[len(times) // 2], "blas": blas, "numpy": np.__version__}))
sys.stdout.flush()
