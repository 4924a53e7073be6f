"""Interrupting a job (Ctrl-C, Slurm's SIGTERM on preemption, a closed
terminal's SIGHUP) removes its temporary output, prints one line and exits
128 + the signal; each signal on each writer, under a pipe and under a pty.
After SIGKILL, which no process can catch, the next run writing the same
output removes the temporary output left behind and says so."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

WRITERS = {
    # name: (command after SRC, the temporary output's glob, the output)
    "pt": (["convert"], "out.pt.tmp-*", "out.pt"),
    "safetensors": (["convert"], "out.safetensors.tmp-*", "out.safetensors"),
    "hdf5": (["convert"], "out.h5.tmp-*", "out.h5"),
    "dcp": (["reshard", "--world-size", "2", "--layout", "dcp"], "out.tmp-*", "out"),
    "rank-files": (["reshard", "--world-size", "2", "--layout", "fsdp-dtensor"], "out.tmp-*", "out"),
}
SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


@pytest.fixture(scope="module")
def big_src(tmp_path_factory) -> Path:
    """400 MB in one tensor: long enough to be caught mid-write."""
    src = tmp_path_factory.mktemp("big") / "big.pt"
    torch.save({"w": torch.zeros(100_000_000)}, src)
    return src


def _command(ckptconv: Path, src: Path, writer: str, work: Path) -> list[str]:
    sub, _, out = WRITERS[writer]
    fast = ["--no-fsync"] if sub[0] == "convert" else []
    return [str(ckptconv), sub[0], str(src), "-o", str(work / out), *sub[1:], *fast]


def _wait_for(work: Path, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(work.glob(pattern)):
            return
        assert proc.poll() is None, "the job ended before its temporary output appeared"
        time.sleep(0.005)
    raise AssertionError("no temporary output appeared")


@pytest.mark.parametrize("how", ["pipe", "pty"])
@pytest.mark.parametrize("sig", list(SIGNALS), ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_signal_removes_the_temporary_output(writer, sig, how, big_src, tmp_path, ckptconv):
    work = tmp_path / "work"
    work.mkdir()
    _, temp_glob, out = WRITERS[writer]
    cmd = _command(ckptconv, big_src, writer, work)
    if how == "pty":
        master, slave = pty.openpty()
        proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
    else:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(work, temp_glob, proc)
        proc.send_signal(sig)
        if how == "pty":
            chunks = []
            while True:
                try:
                    data = os.read(master, 4096)
                except OSError:  # the pty closes when the process ends
                    break
                if not data:
                    break
                chunks.append(data)
            proc.wait(timeout=60)
            text = b"".join(chunks).decode(errors="replace")
        else:
            stdout, stderr = proc.communicate(timeout=60)
            text = stdout.decode() + stderr.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        if how == "pty":
            os.close(master)
    name = signal.Signals(sig).name
    assert proc.returncode == SIGNALS[sig], f"exit {proc.returncode}: {text}"
    lines = [l for l in text.replace("\r", "\n").splitlines() if "interrupted" in l]
    assert len(lines) == 1 and f"interrupted by {name}" in lines[0] and "nothing was written" in lines[0], text
    assert sorted(p.name for p in work.iterdir()) == [], f"left behind: {list(work.iterdir())}"
    assert not (work / out).exists()


@pytest.mark.parametrize("writer", ["pt", "dcp"])
def test_temporary_output_of_a_killed_run_is_removed_by_the_next(writer, big_src, tmp_path, ckptconv, run_ckptconv):
    work = tmp_path / "work"
    work.mkdir()
    _, temp_glob, out = WRITERS[writer]
    proc = subprocess.Popen(_command(ckptconv, big_src, writer, work), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_for(work, temp_glob, proc)
    proc.kill()
    proc.wait()
    stale = list(work.glob(temp_glob))
    assert len(stale) == 1
    r = run_ckptconv(*_command(ckptconv, big_src, writer, work)[1:])
    assert r.returncode == 0, r.stderr
    assert stale[0].name in r.stderr and "removed" in r.stderr, r.stderr
    assert sorted(p.name for p in work.iterdir()) == [out]


def test_temporary_output_of_a_live_run_is_left_alone(tmp_path, run_ckptconv, testdata):
    """The lock tells them apart: a run still writing holds an flock on its
    temporary output (here the test holds it), an unlocked one is stale."""
    import fcntl
    live, stale = tmp_path / "out.pt.tmp-Live01", tmp_path / "out.pt.tmp-Dead01"
    live.write_bytes(b"partial")
    stale.write_bytes(b"partial")
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = run_ckptconv("convert", testdata / "pt" / "dtypes.pt", "-o", tmp_path / "out.pt")
        assert r.returncode == 0, r.stderr
        assert live.exists() and not stale.exists()
        assert "out.pt.tmp-Dead01" in r.stderr and "Live01" not in r.stderr


@pytest.mark.parametrize("command", [["validate", "--finite"], ["diff"]])
def test_a_command_that_writes_nothing_says_so_when_interrupted(command, tmp_path, ckptconv):
    """validate and diff write nothing: interrupted, they said 'the temporary
    output was removed'. A view of 2^34 elements over a 1 MiB storage
    (strides (1, 1), overlapping rows) keeps them busy long enough to be
    caught: a stride-0 view no longer does, the finite scan reads its one
    repeated slice."""
    src = tmp_path / "wide.pt"
    torch.save({"w": torch.zeros(2**18).as_strided((2**17, 2**17), (1, 1))}, src)
    cmd = [str(ckptconv), command[0], str(src), *([str(src)] if command[0] == "diff" else []), *command[1:]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)
    assert proc.poll() is None, "the command ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    text = stdout.decode() + stderr.decode()
    assert proc.returncode == 130, text
    assert "interrupted by SIGINT: it writes nothing" in text and "temporary output" not in text, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wide.pt"]
