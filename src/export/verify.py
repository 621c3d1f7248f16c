"""estc export --verify: runs an exported ONNX model with onnxruntime and compares it
with est's predictions. Written to a temporary directory by estc and run there with the
Python of EST_PYTHON (else bench/.venv/bin/python, else python3).

argv[1] is a manifest (JSON): {"model": PATH, "samples": [{"inputs": [[NAME, NPY]],
"outputs": [[NAME, NPY]]}]}. Each sample is one batch of the eval input and est's
predictions for it. The model runs on each batch whole and again split in two smaller
batches (so a second batch size is served), after onnx.checker's full check.

Prints one JSON object: the checker's verdict, onnxruntime's version, the model's
metadata and the shapes of its inputs and outputs, the batch sizes run, and per output the largest absolute difference and that difference relative to
the output's largest magnitude. Exit status 0; 3 when onnx or onnxruntime is missing;
4 when the checker or onnxruntime refuses the model.
"""

import json
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:
    print(json.dumps({"missing": str(e), "python": sys.executable}))
    sys.exit(3)


def main():
    with open(sys.argv[1]) as f:
        manifest = json.load(f)
    path = manifest["model"]
    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:  # the checker's own exception types vary by version
        print(json.dumps({"refused": "onnx.checker: %s" % e}))
        sys.exit(4)
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        print(json.dumps({"refused": "onnxruntime: %s" % e}))
        sys.exit(4)
    wanted = [i.name for i in sess.get_inputs()]
    names = [o.name for o in sess.get_outputs()]
    worst = {}
    sizes = set()
    for sample in manifest["samples"]:
        feeds = {n: np.load(p) for n, p in sample["inputs"] if n in wanted}
        expect = {n: np.load(p) for n, p in sample["outputs"]}
        rows = next(iter(feeds.values())).shape[0]
        runs = [(0, rows)]
        if rows > 1:
            half = rows // 2
            runs = [(0, rows), (0, half), (half, rows)]
        whole = {}
        parts = {n: [] for n in names}
        for k, (lo, hi) in enumerate(runs):
            sizes.add(hi - lo)
            got = sess.run(names, {n: v[lo:hi] for n, v in feeds.items()})
            for n, v in zip(names, got):
                if k == 0:
                    whole[n] = v
                else:
                    parts[n].append(v)
        for n in names:
            results = [whole[n]]
            if parts[n]:
                results.append(np.concatenate(parts[n], axis=0))
            want = expect[n]
            for got in results:
                if got.shape != want.shape:
                    print(json.dumps({"refused": "output %s has shape %s, est's %s" % (n, got.shape, want.shape)}))
                    sys.exit(4)
                a = got.astype(np.float64)
                b = want.astype(np.float64)
                diff = float(np.max(np.abs(a - b))) if a.size else 0.0
                scale = float(np.max(np.abs(b))) if b.size else 0.0
                rel = diff / scale if scale > 0 else diff
                w = worst.setdefault(n, {"max_abs": 0.0, "max_rel": 0.0})
                w["max_abs"] = max(w["max_abs"], diff)
                w["max_rel"] = max(w["max_rel"], rel)
    model = onnx.load(path)

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    print(json.dumps({
        "checker": "ok",
        "metadata": {p.key: p.value for p in model.metadata_props},
        "shapes": {v.name: dims(v) for v in list(model.graph.input) + list(model.graph.output)},
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "batch_sizes": sorted(sizes, reverse=True),
        "outputs": worst,
    }))


main()
