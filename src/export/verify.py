"""estc export --verify: runs an exported ONNX model with onnxruntime and compares it
with est's predictions. Written to a temporary directory by estc and run there with the
Python of EST_PYTHON (else bench/.venv/bin/python, else python3).

argv[1] is a manifest (JSON): {"model": PATH, "samples": [{"inputs": [[NAME, NPY]],
"outputs": [[NAME, NPY]]}]}. Each sample is one batch of the eval input and est's
predictions for it. The model runs on each batch whole and again at a second size (in
two halves; a batch of one row, twice over), after onnx.checker's full check.

Prints one JSON object: the checker's verdict, onnxruntime's version, the model's
metadata and the shapes of its inputs and outputs, the batch sizes run, and per output the largest absolute difference, that difference relative to
the output's largest magnitude and the batch sizes it was compared at (integer and boolean outputs must be equal, NaN must
be where est has NaN; anything else counts as 1e300). Exit status 0; 3 when onnx or onnxruntime is missing;
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


BIG = 1e300  # a difference JSON can carry: NaN where est has a number, or infinities


def refuse(why):
    print(json.dumps({"refused": why}))
    sys.exit(4)


def difference(have, want):
    """The largest absolute difference, and it relative to est's largest magnitude.
    Integers and booleans must be equal (any difference counts as BIG); a NaN must be
    where est has one."""
    if want.size == 0:
        return 0.0, 0.0
    if want.dtype.kind in "biu":
        same = np.array_equal(have, want)
        return (0.0, 0.0) if same else (BIG, BIG)
    a = have.astype(np.float64)
    b = want.astype(np.float64)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return BIG, BIG
    both = ~np.isnan(b)
    if not both.any():
        return 0.0, 0.0
    a, b = a[both], b[both]
    same = a == b  # equal infinities too
    diff = np.where(same, 0.0, np.abs(a - b))
    largest = float(np.max(diff))
    finite = np.abs(b[np.isfinite(b)])
    scale = float(np.max(finite)) if finite.size else 0.0
    rel = largest / scale if scale > 0 else largest
    clip = lambda x: x if np.isfinite(x) else BIG
    return clip(largest), clip(rel)


def main():
    with open(sys.argv[1]) as f:
        manifest = json.load(f)
    path = manifest["model"]
    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:  # the checker's own exception types vary by version
        refuse("onnx.checker: %s" % e)
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        refuse("onnxruntime: %s" % e)
    wanted = [i.name for i in sess.get_inputs()]
    names = [o.name for o in sess.get_outputs()]
    worst = {}
    sizes = set()
    for sample in manifest["samples"]:
        feeds = {n: np.load(p) for n, p in sample["inputs"] if n in wanted}
        expect = {n: np.load(p) for n, p in sample["outputs"]}
        rows = next(iter(feeds.values())).shape[0]
        # the batch whole, and at a second size: in two halves, or one row twice
        if rows > 1:
            h = rows // 2
            second = ([{n: v[:h] for n, v in feeds.items()},
                       {n: v[h:] for n, v in feeds.items()}], expect)
        else:
            twice = lambda d: {n: np.concatenate([v, v], axis=0) for n, v in d.items()}
            second = ([twice(feeds)], twice(expect))
        for batches, want in [([feeds], expect), second]:
            got = {n: [] for n in names}
            for batch in batches:
                size = next(iter(batch.values())).shape[0]
                sizes.add(size)
                try:
                    out = sess.run(names, batch)
                except Exception as e:
                    refuse("onnxruntime failed at batch size %d: %s" % (size, e))
                for n, v in zip(names, out):
                    got[n].append(v)
            for n in names:
                have = np.concatenate(got[n], axis=0)
                if have.shape != want[n].shape:
                    refuse("output %s has shape %s, est's %s" % (n, have.shape, want[n].shape))
                w = worst.setdefault(n, {"max_abs": 0.0, "max_rel": 0.0, "sizes": []})
                abs_, rel = difference(have, want[n])
                w["max_abs"] = max(w["max_abs"], abs_)
                w["max_rel"] = max(w["max_rel"], rel)
                for v in got[n]:
                    if v.shape[0] not in w["sizes"]:
                        w["sizes"].append(int(v.shape[0]))
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
