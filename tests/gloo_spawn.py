"""Process groups for the resume checks (tests/reshard_resume*.py).

spawn(ws, fn, *args) runs fn(rank, ws, *args) in ws fresh processes joined
in a gloo process group on CPU, and exits with a message naming the ranks
that failed. Unlike torch.multiprocessing.spawn, the parent never imports
torch: an import costs seconds of CPU, paid only by the workers.
"""
import multiprocessing
import os
import socket
import sys
from pathlib import Path

TOOLS = str(Path(__file__).resolve().parent.parent / "tools")


def corpus():
    """tools/make_checkpoints.py: the corpus model, optimizer, batches and FSDP wrappers."""
    if TOOLS not in sys.path:
        sys.path.insert(0, TOOLS)
    import make_checkpoints
    return make_checkpoints


def _entry(rank: int, ws: int, port: int, fn, args) -> None:
    import torch
    import torch.distributed as dist
    corpus()._quiet()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    try:
        fn(rank, ws, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(ws: int, fn, *args) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_entry, args=(r, ws, port, fn, args)) for r in range(ws)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        sys.exit(f"ranks {failed} failed (exit codes {[procs[r].exitcode for r in failed]})")
