"""What the resume checks (tests/reshard_resume*.py) share.

spawn(ws, fn, *args) runs fn(rank, ws, *args) in ws fresh processes joined
in a gloo process group on CPU (tools/make_checkpoints.py's _entry), and
exits with a message naming the ranks that failed. Unlike
torch.multiprocessing.spawn, the parent never imports torch: an import costs
seconds of CPU, paid only by the workers.

train(model, optim, rank) takes the three steps both runs of a check take,
on the same batches, and returns their losses.
"""
import multiprocessing
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
    corpus()._entry(rank, ws, port, fn, args)


STEPS = 3


def train(model, optim, rank: int):
    import torch
    losses = []
    for step in range(STEPS):
        optim.zero_grad(set_to_none=True)
        loss = model(corpus().batch(100 + step, rank))
        loss.backward()
        optim.step()
        losses.append(loss.detach().clone())
    return torch.stack(losses)


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
