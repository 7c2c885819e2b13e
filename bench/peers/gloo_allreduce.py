#!/usr/bin/env python3
"""Allreduce bus bandwidth of torch.distributed's gloo backend (plain TCP): the
peer that gorun's allreduce-perf -S is compared with (bench/peers/multihost_busbw.sh,
bench/gpu/run.sh's net group).

    gloo_allreduce.py --np 4 [--budget 3] [--sizes 1048576 16777216]   # ranks on loopback
    RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p gloo_allreduce.py ...  # one rank (torchrun's variables)

For each size, float32 SUM, in place (torch.distributed has no out-of-place
allreduce): one call checked against the expected sum, then warm-up calls for
at least 0.5 s; then samples, each after a barrier, of enough calls to last
2 ms or more, as many samples as fit the budget (5 to 100). A sample's time
per call is the slowest rank's. Printed per size, as OpenMPI's peer prints:

    bytes np calls_per_sample samples median_us algbw busbw best_busbw

busbw = algbw * 2(n-1)/n, GB = 1e9 bytes; median and best over the samples.
"""
import argparse
import math
import os
import socket
import statistics
import subprocess
import sys
import time


def slowest(dist, torch, seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def measure(dist, torch, x, budget):
    """Returns the per-call times (s) of the samples, each the slowest rank's."""
    per_call, spent, calls = 0.0, 0.0, 1
    while spent < 0.5:  # warm-up, doubling the calls per round
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(x)
        d = slowest(dist, torch, time.perf_counter() - t0)
        spent += d
        per_call = d / calls
        calls = min(calls * 2, 64)
    inner = max(1, min(1000, math.ceil(2e-3 / per_call)))
    samples = max(5, min(100, int(budget / (per_call * inner))))
    times = []
    for _ in range(samples):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(inner):
            dist.all_reduce(x)
        times.append(slowest(dist, torch, (time.perf_counter() - t0) / inner))
    return inner, times


def rank_main(budget, sizes):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=n)
    if rank == 0:
        print(f"# torch {torch.__version__} gloo, np {n}, {budget} s per size", flush=True)
        print("%12s %4s %6s %7s %11s %8s %8s %10s" % ("bytes", "np", "calls", "samples", "median_us", "algbw", "busbw", "best_busbw"), flush=True)
    for size in sizes:
        x = torch.full((size // 4,), float(rank + 1))
        dist.all_reduce(x)
        want = n * (n + 1) / 2
        if x[0].item() != want or x[-1].item() != want:
            sys.exit(f"gloo_allreduce.py: rank {rank}: {size} bytes: got {x[0].item()}, want {want}")
        x.zero_()
        inner, times = measure(dist, torch, x, budget)
        med, best = statistics.median_low(times), min(times)
        bus = 2 * (n - 1) / n
        if rank == 0:
            print("%12d %4d %6d %7d %11.1f %8.3f %8.3f %10.3f" % (size, n, inner, len(times), med * 1e6, size / med / 1e9, size / med / 1e9 * bus, size / best / 1e9 * bus), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def launch(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.np):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.np), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        cmd = [sys.executable, __file__, "--budget", str(args.budget), "--sizes", *map(str, args.sizes)]
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.monotonic() + args.timeout
    rc = 0
    for p in procs:
        try:
            rc = rc or p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit(f"gloo_allreduce.py: np {args.np}: no result within {args.timeout:.0f} s")
    sys.exit(rc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=2, help="ranks to start on loopback (ignored when RANK is set)")
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of samples per size")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 16 << 20, 64 << 20, 256 << 20])
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    if any(s <= 0 or s % 4 for s in args.sizes):
        ap.error("--sizes: want positive multiples of 4 bytes")
    if "RANK" in os.environ:
        rank_main(args.budget, args.sizes)
    else:
        launch(args)


if __name__ == "__main__":
    main()
