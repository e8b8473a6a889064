"""What one Gloo collective costs on this machine, apart from any trainer: two local processes
(one thread each, as mltrain's ranks run), PyTorch's own Gloo, medians of 50 calls. Sizes are the
MLP's (535,818 parameters): its gradient all-reduced in fp32 (the default DDP path), the same in
fp64 (the exact sum of distributed.invariance: bitwise) and its 8 segment maxima all-gathered.
Run by scripts/bench/invariance.sh; alone: .venv/bin/python scripts/bench/gloo_floor.py"""
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PARAMS = 535_818


def rank_main(rank, port, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cases = [("all-reduce fp32 gradient", lambda: dist.all_reduce(g32)),
             ("all-reduce fp64 gradient", lambda: dist.all_reduce(g64)),
             ("all-gather 8 maxima", lambda: dist.all_gather(gathered, maxima))]
    g32 = torch.ones(PARAMS)
    g64 = torch.ones(PARAMS, dtype=torch.float64)
    maxima = torch.ones(8)
    gathered = [torch.empty(8), torch.empty(8)]
    for name, op in cases:
        for _ in range(5):
            op()
        times = []
        for _ in range(50):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            times.append(time.perf_counter() - t0)
        if rank == 0:
            out[name] = statistics.median(times)
    dist.destroy_process_group()


def main():
    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(rank_main, args=(port, out), nprocs=2)
    print(f"== PyTorch {torch.__version__} Gloo, 2 local ranks, 1 thread each (median of 50 calls)")
    for name, t in out.items():
        print(f"  {name:<26} {1e3 * t:6.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
