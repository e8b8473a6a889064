"""The doctor's faults under torchrun (scripts/bench/doctor.sh): PyTorch DDP over Gloo with the
default process-group timeout, the same MLP shape and batch as the doctor test, and the same faults,
injected by FAULT=<kind>:<rank>:<step> (silent, kill, stop, mismatch, slow, loader_stall). It prints
one line per step on rank 0; the script around it records what torchrun reports and when."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    dist.init_process_group("gloo")  # torchrun's env://, the default timeout
    rank = dist.get_rank()
    kind, frank, fstep = (os.environ.get("FAULT", "none:-1:-1").split(":") + ["", ""])[:3]
    frank, fstep = int(frank), int(fstep)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    opt = torch.optim.Adam(ddp.parameters(), 1e-3)
    x = torch.randn(32, 784)
    y = torch.randint(0, 10, (32,))
    slow = 0.0
    for step in range(1, 257):
        t0 = time.time()
        mine = rank == frank and step == fstep
        if mine and kind == "loader_stall":
            print(f"[fault] rank {rank} (pid {os.getpid()}) at step {step}: {kind}", flush=True)
            time.sleep(10**6)
        loss = nn.functional.cross_entropy(ddp(x), y)
        if mine and kind == "silent":
            print(f"[fault] rank {rank} (pid {os.getpid()}) at step {step}: {kind}", flush=True)
            time.sleep(10**6)
        if mine and kind in ("kill", "stop"):
            print(f"[fault] rank {rank} (pid {os.getpid()}) at step {step}: {kind}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        if mine and kind == "mismatch":  # a collective of another size than the others'
            print(f"[fault] rank {rank} (pid {os.getpid()}) at step {step}: {kind}", flush=True)
            dist.all_reduce(torch.zeros(1000))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == frank and kind == "slow" and step >= fstep:
            if step == fstep:
                print(f"[fault] rank {rank} (pid {os.getpid()}) at step {step}: {kind}", flush=True)
            slow = slow or (time.time() - t0)
            time.sleep(slow)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
