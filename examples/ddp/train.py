#!/usr/bin/env python3
"""A small PyTorch DistributedDataParallel training run, written for torchrun.

It reads nothing but what torchrun (and gorun) give every rank: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, through
init_process_group's env:// method, and runs on CPUs with the gloo backend:

    torchrun --nproc-per-node 2 examples/ddp/train.py
    gorun -np 4 -hostfile hosts -x GLOO_SOCKET_IFNAME=eth0 python3 examples/ddp/train.py

Each rank trains the same small model on its own random batches for a few
steps. DistributedDataParallel averages the gradients across the ranks in
backward, so after every step each rank holds the same gradients, bit for bit
(gloo's allreduce gives every rank the same bytes), while its loss, of its own
batch, differs. Each rank prints one line per step with its loss and a
checksum of its gradients; with --out DIR it also writes them to
DIR/rank.N.json. Comparing the checksums across ranks checks that the ranks
really trained together.
"""

import argparse
import hashlib
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    ap.add_argument("--batch", type=int, default=16, help="examples per rank per step (default 16)")
    ap.add_argument("--out", help="also write each rank's losses and checksums to DIR/rank.N.json")
    args = ap.parse_args()

    torch.set_num_threads(1)  # several ranks share a host's cores
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    print(f"rank {rank} of {world}: local rank {local_rank}, host {socket.gethostname()}, "
          f"MASTER_ADDR={os.environ.get('MASTER_ADDR')} MASTER_PORT={os.environ.get('MASTER_PORT')}", flush=True)

    torch.manual_seed(0)  # the same start on every rank (DDP broadcasts rank 0's weights anyway)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches

    steps = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=data)
        y = torch.randint(0, 10, (args.batch,), generator=data)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        grads = torch.cat([p.grad.detach().flatten() for p in model.parameters()])
        checksum = hashlib.sha256(grads.numpy().tobytes()).hexdigest()[:16]
        print(f"rank {rank} step {step} loss {loss.item():.6f} grad_norm {grads.norm().item():.6f} "
              f"grad_sha256 {checksum}", flush=True)
        steps.append({"step": step, "loss": loss.item(), "grad_sha256": checksum})
        opt.step()

    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    final = hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]
    print(f"rank {rank} done: weights_sha256 {final}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank.{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": world, "steps": steps, "weights_sha256": final}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
