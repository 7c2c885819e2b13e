#!/usr/bin/env python3
"""Reads a gorun run directory with the formats' own Python libraries.

    python3 bench/gpu/interop.py RUN_DIR

The checkpoint named by RUN_DIR/latest is loaded with safetensors (model and
optimizer state): the metadata's preset is run.json's, the model's tensors
hold run.json's number of parameters, every value is finite. The event file
is read with TensorBoard's own event loader: every train/loss and train/lr
scalar of metrics.jsonl is there, at its step, with its value (float32),
every text (the sample translations) as the text plugin's summary, and the
hparams plugin's session start holds run.json's preset and world size.
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

    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    want, want_text = {}, {}
    for line in open(os.path.join(run, "metrics.jsonl")):
        r = json.loads(line)
        if r["kind"] == "train":
            for k in ("loss", "lr"):
                v = r["values"].get(k)
                if isinstance(v, (int, float)):
                    want[("train/" + k, r["step"])] = v
        for k, v in (r.get("text") or {}).items():
            want_text[(r["kind"] + "/" + k, r["step"])] = v
    got, got_text, hparams = {}, {}, None
    files = sorted(glob.glob(os.path.join(run, "events.out.tfevents.*")))
    if not files:
        fail("%s: no event file" % run)
    for path in files:
        for ev in event_file_loader.EventFileLoader(path).Load():
            for v in ev.summary.value:
                plugin = v.metadata.plugin_data.plugin_name
                if plugin == "text":
                    got_text[(v.tag, ev.step)] = tensor_util.make_ndarray(v.tensor).item().decode()
                elif plugin == "hparams":
                    pd = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
                    hparams = dict(pd.session_start_info.hparams)
                elif v.HasField("tensor"):
                    got[(v.tag, ev.step)] = float(tensor_util.make_ndarray(v.tensor))
                else:
                    got[(v.tag, ev.step)] = v.simple_value
    for key, v in sorted(want.items()):
        if key not in got:
            fail("%s: no %s at step %d in the event files" % (run, key[0], key[1]))
        if not math.isclose(got[key], v, rel_tol=1e-6, abs_tol=1e-12):
            fail("%s: %s at step %d is %r in the event file, %r in metrics.jsonl" % (run, key[0], key[1], got[key], v))
    print("interop: tensorboard read %d event file(s): all %d train/loss and train/lr scalars of metrics.jsonl, same steps and values" % (len(files), len(want)))
    for key, v in sorted(want_text.items()):
        if got_text.get(key) != v:
            fail("%s: text %s at step %d is %r in the event files, %r in metrics.jsonl" % (run, key[0], key[1], got_text.get(key), v))
    print("interop: tensorboard's text plugin data holds all %d texts of metrics.jsonl (sample translations)" % len(want_text))
    if hparams is None or hparams["preset"].string_value != info["preset"] or hparams["world_size"].number_value != info["world_size"]:
        fail("%s: hparams session start %r does not match run.json" % (run, hparams))
    print("interop: tensorboard's hparams plugin data: %d settings, preset %s, world size %d" % (len(hparams), info["preset"], info["world_size"]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: interop.py RUN_DIR")
    main(sys.argv[1])
