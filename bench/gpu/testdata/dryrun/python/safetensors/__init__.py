"""Stand-in safetensors for bench/gpu/run.sh's dry run (bench/gpu/testdata/dryrun/README.md).

bench/gpu/interop.py reads RUN_DIR/run.json and RUN_DIR/latest before it
imports safetensors: reaching this import means the run directory is as
interop.py expects. It records that and exits 0.
"""
import os
import sys

with open(os.environ.get("GORUN_DRYRUN_LOG", os.devnull), "a") as _f:
    _f.write("safetensors %s %s\n" % (os.path.basename(sys.argv[0]), " ".join(sys.argv[1:])))
print("stand-in safetensors: %s read its run directory" % os.path.basename(sys.argv[0]), flush=True)
sys.exit(0)
