#!/usr/bin/env python3
"""Reads a gorun run directory with the formats' own Python libraries.

    python3 bench/gpu/interop.py RUN_DIR

The checkpoint named by RUN_DIR/latest is loaded with safetensors (model and
optimizer state): the metadata's preset is run.json's, the model's tensors
hold run.json's number of parameters, every value is finite. The event file
is read with TensorBoard's own event loader: every train/loss and train/lr
scalar of metrics.jsonl is there, at its step, with its value (float32).
Prints one line per check and exits 1 on the first failure. Runs where
safetensors and tensorboard are installed (the lent GPU machine's Python);
bench/gpu/run.sh calls it in its check group.
"""
import glob
import json
import math
import os
import sys


def fail(msg):
    print("interop: FAIL:", msg)
    sys.exit(1)


def main(run):
    info = json.load(open(os.path.join(run, "run.json")))
    ckpt = os.path.join(run, open(os.path.join(run, "latest")).read().strip())

    from safetensors import safe_open
    from safetensors.numpy import load_file
    import numpy as np

    model = os.path.join(ckpt, "model.safetensors")
    with safe_open(model, "np") as f:
        meta = f.metadata() or {}
    if meta.get("preset") != info["preset"]:
        fail("%s: metadata preset %r, run.json %r" % (model, meta.get("preset"), info["preset"]))
    tensors = load_file(model)
    n = sum(int(np.prod(t.shape)) for t in tensors.values())
    if n != info["params"]:
        fail("%s: %d values in %d tensors, run.json says %d parameters" % (model, n, len(tensors), info["params"]))
    for name, t in tensors.items():
        if not np.all(np.isfinite(t)):
            fail("%s: tensor %s has non-finite values" % (model, name))
    print("interop: safetensors read %s: %d tensors, %d parameters, preset %s" % (model, len(tensors), n, meta["preset"]))
    for other in sorted(glob.glob(os.path.join(ckpt, "*.safetensors"))):
        if other != model:
            ts = load_file(other)
            print("interop: safetensors read %s: %d tensors" % (other, len(ts)))

    from tensorboard.backend.event_processing import event_file_loader

    want = {}
    for line in open(os.path.join(run, "metrics.jsonl")):
        r = json.loads(line)
        if r["kind"] == "train":
            for k in ("loss", "lr"):
                v = r["values"].get(k)
                if isinstance(v, (int, float)):
                    want[("train/" + k, r["step"])] = v
    got = {}
    files = sorted(glob.glob(os.path.join(run, "events.out.tfevents.*")))
    if not files:
        fail("%s: no event file" % run)
    for path in files:
        for ev in event_file_loader.EventFileLoader(path).Load():
            for v in ev.summary.value:
                val = v.simple_value
                if v.HasField("tensor"):
                    from tensorboard.util import tensor_util
                    val = float(tensor_util.make_ndarray(v.tensor))
                got[(v.tag, ev.step)] = val
    for key, v in sorted(want.items()):
        if key not in got:
            fail("%s: no %s at step %d in the event files" % (run, key[0], key[1]))
        if not math.isclose(got[key], v, rel_tol=1e-6, abs_tol=1e-12):
            fail("%s: %s at step %d is %r in the event file, %r in metrics.jsonl" % (run, key[0], key[1], got[key], v))
    print("interop: tensorboard read %d event file(s): all %d train/loss and train/lr scalars of metrics.jsonl, same steps and values" % (len(files), len(want)))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: interop.py RUN_DIR")
    main(sys.argv[1])
