"""Stand-in torch for bench/gpu/run.sh's dry run (bench/gpu/testdata/dryrun/README.md).

The scripts run.sh calls import torch only after argparse has taken their
arguments: reaching this import means the arguments were good. It records
the script and its arguments, writes one JSON line where --json FILE asks
for it (torch_transformer.py --sweep), and exits 0.
"""
import json
import os
import sys

_script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "-c"
_args = sys.argv[1:]
with open(os.environ.get("GORUN_DRYRUN_LOG", os.devnull), "a") as _f:
    _f.write("torch %s %s\n" % (_script, " ".join(_args)))
if "--json" in _args:
    with open(_args[_args.index("--json") + 1], "a") as _f:
        _f.write(json.dumps({"dry_run": True, "script": _script, "args": _args}) + "\n")
print("stand-in torch: %s %s" % (_script, " ".join(_args)), flush=True)
sys.exit(0)
