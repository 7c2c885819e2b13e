#!/usr/bin/python3
"""SGEMM GFLOP/s of numpy (Debian's OpenBLAS) and PyTorch (Debian's 1.13) on
the shapes of bench/sgemm_test.go, for docs/sgemm.md.

Run:  OMP_NUM_THREADS=2 /usr/bin/python3 bench/peers/sgemm_peers.py [repeats]
Prints one line per shape and library: the median GFLOP/s of `repeats`
timings (default 5), each timing at least 0.2 s of back-to-back calls.
"""
import os
import statistics
import sys
import time

import numpy as np
import torch

THREADS = int(os.environ.get("OMP_NUM_THREADS", "2"))
torch.set_num_threads(THREADS)

# name, batch, transA, transB, m, n, k  (same list as bench/sgemm_test.go)
SHAPES = [
    ("sq512", 1, False, False, 512, 512, 512),
    ("sq1024", 1, False, False, 1024, 1024, 1024),
    ("sq2048", 1, False, False, 2048, 2048, 2048),
    ("proj_XW_1024x512x512", 1, False, False, 1024, 512, 512),
    ("ffn1_XW_1024x2048x512", 1, False, False, 1024, 2048, 512),
    ("ffn2_XW_1024x512x2048", 1, False, False, 1024, 512, 2048),
    ("dX_dYWt_1024x512x2048", 1, False, True, 1024, 512, 2048),
    ("dW_XtdY_512x2048x1024", 1, True, False, 512, 2048, 1024),
    ("attn_QKt_256x32x32x64", 256, False, True, 32, 32, 64),
    ("attn_PV_256x32x64x32", 256, False, False, 32, 64, 32),
    ("logits_HEt_1024x32768x512", 1, False, True, 1024, 32768, 512),
]


def operands(lib, batch, ta, tb, m, n, k):
    rng = np.random.default_rng(1)
    ashape = (k, m) if ta else (m, k)
    bshape = (n, k) if tb else (k, n)
    if batch > 1:
        ashape, bshape = (batch,) + ashape, (batch,) + bshape
    a = rng.random(ashape, dtype=np.float32) - 0.5
    b = rng.random(bshape, dtype=np.float32) - 0.5
    if lib == "torch":
        a, b = torch.from_numpy(a), torch.from_numpy(b)
        # Transposed views: the libraries pass transpose flags to the GEMM.
        opa = a.transpose(-1, -2) if ta else a
        opb = b.transpose(-1, -2) if tb else b
        out = torch.empty((batch, m, n) if batch > 1 else (m, n))
        return lambda: torch.matmul(opa, opb, out=out)
    opa = np.swapaxes(a, -1, -2) if ta else a
    opb = np.swapaxes(b, -1, -2) if tb else b
    out = np.empty((batch, m, n) if batch > 1 else (m, n), dtype=np.float32)
    return lambda: np.matmul(opa, opb, out=out)


def gflops(fn, flops, repeats):
    fn()
    rates = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= 0.2:
                break
        rates.append(flops * calls / elapsed / 1e9)
    return statistics.median(rates)


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print(f"# threads {THREADS}, numpy {np.__version__}, torch {torch.__version__}, median of {repeats}")
    for name, batch, ta, tb, m, n, k in SHAPES:
        flops = 2.0 * m * n * k * batch
        for lib in ("numpy", "torch"):
            rate = gflops(operands(lib, batch, ta, tb, m, n, k), flops, repeats)
            print(f"{name:28s} {lib:6s} {rate:8.1f} GFLOP/s", flush=True)


if __name__ == "__main__":
    main()
