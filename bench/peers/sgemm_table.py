#!/usr/bin/python3
"""Turns the output of the SGEMM benchmarks into the markdown table of
docs/sgemm.md: median GFLOP/s per shape for gorun, gonum (same go test run)
and, if given, numpy/torch (bench/peers/sgemm_peers.py), with ratios. The
go file may hold several runs and several peers files may be given: every
cell is the median of all the samples it gets.

  for r in 1 2 3 4 5; do
    go test -run '^$' -bench 'Sgemm$' -benchtime 1s ./bench/ >> go.txt
    OMP_NUM_THREADS=2 /usr/bin/python3 bench/peers/sgemm_peers.py 1 > peers_$r.txt
  done
  python3 bench/peers/sgemm_table.py go.txt peers_*.txt
"""
import re
import statistics
import sys
from collections import defaultdict


def main():
    runs = defaultdict(list)
    order = []
    for line in open(sys.argv[1]):
        m = re.match(r"BenchmarkSgemm/(\S+)/impl=(\w+)-\d+\s+\d+\s+([\d.]+) GFLOP/s", line)
        if m:
            shape, impl, rate = m.group(1), m.group(2), float(m.group(3))
            if shape not in order:
                order.append(shape)
            runs[shape, impl].append(rate)
    samples = defaultdict(list)
    for path in sys.argv[2:]:
        for line in open(path):
            m = re.match(r"(\S+)\s+(numpy|torch)\s+([\d.]+) GFLOP/s", line)
            if m:
                samples[m.group(1), m.group(2)].append(float(m.group(3)))
    peers = {k: statistics.median(v) for k, v in samples.items()}
    med = {k: statistics.median(v) for k, v in runs.items()}
    head = "| shape | gorun | gonum | gorun/gonum |"
    rule = "|---|---:|---:|---:|"
    if peers:
        head += " numpy | torch | gorun/numpy | gorun/torch |"
        rule += "---:|---:|---:|---:|"
    print(head)
    print(rule)
    for s in order:
        g, o = med.get((s, "gorun")), med.get((s, "gonum"))
        if g is None or o is None:
            continue
        row = f"| {s} | {g:.1f} | {o:.1f} | {g / o:.1f}x |"
        if peers:
            n, t = peers.get((s, "numpy")), peers.get((s, "torch"))
            row += f" {n:.1f} | {t:.1f} | {g / n:.2f}x | {g / t:.2f}x |"
        print(row)
    counts = sorted({len(v) for v in runs.values()} | {len(v) for v in samples.values()})
    print(f"\n(medians of {counts} samples per cell)")


if __name__ == "__main__":
    main()
