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


def _run_once(ws: int, fn, args) -> list[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_entry, args=(r, ws, port, fn, args)) for r in range(ws)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return [p.exitcode for p in procs]


def spawn(ws: int, fn, *args) -> None:
    """Runs the job; once more when a worker was killed by a signal. Seen
    twice in about 40 clean CI runs of these jobs: a gloo worker of torch
    2.15 aborting ("terminate called without an active exception", SIGABRT)
    on a job that passes when rerun. A rerun repeats the whole job from the
    same files, and the caller asserts on the rerun's outputs only, so
    nothing wrong can pass (a deterministic failure fails the rerun too); a
    job in which no worker was killed by a signal (an exception, an
    assertion) is never retried."""
    for attempt in (1, 2):
        codes = _run_once(ws, fn, args)
        failed = [r for r, c in enumerate(codes) if c != 0]
        if not failed:
            return
        if attempt == 1 and any(codes[r] < 0 for r in failed):
            killed = {r: -codes[r] for r in failed if codes[r] < 0}
            print(f"resume_runner: exit codes {codes}, rank:signal {killed}; running the job once more",
                  file=sys.stderr)
            continue
        sys.exit(f"ranks {failed} failed (exit codes {[codes[r] for r in failed]})")
