"""Durability, seen through strace: without --no-fsync every output file is
fsynced before it is renamed into place, and the directory it is renamed
into after (so that a power loss keeps the output, not only its bytes); with
--no-fsync nothing is fsynced. The bytes are the same either way."""
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WS2 = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2"
ST2 = REPO / "testdata" / "fsdp_st" / "adamw_ws2"

# (command, source, output name, extra arguments)
CASES = [
    pytest.param("consolidate", WS2, "out.pt", [], id="consolidate-pt"),
    pytest.param("consolidate", WS2, "out.safetensors", [], id="consolidate-safetensors"),
    pytest.param("consolidate", WS2, "out.safetensors", ["--max-shard-size", "4K"], id="consolidate-sharded"),
    pytest.param("consolidate", WS2, "out.h5", [], id="consolidate-h5"),
    pytest.param("reshard", WS2, "out", ["--world-size", "3"], id="reshard-dcp"),
    pytest.param("reshard", ST2, "out", ["--world-size", "3"], id="reshard-rank-files"),
]

SYNC = re.compile(r"f(?:data)?sync\(\d+<([^>]*)>\)\s*=\s*0")
# rename(OLD, NEW), renameat(DIRFD, OLD, DIRFD, NEW), renameat2(..., FLAGS)
RENAME = re.compile(r'rename(?:at2?)?\((?:[^,"]*, )?"([^"]*)", (?:[^,"]*, )?"([^"]*)".*\)\s*=\s*0')


def synced_paths(ckptconv, args, cwd):
    """The paths fsynced (or fdatasynced) by a run, in order, each followed
    through the renames made after it: where those bytes are once published
    (a file is written and synced under a temporary name, then renamed,
    perhaps twice, and a directory's entries move with it)."""
    log = cwd.parent / (cwd.name + ".strace")
    # -s: whole paths (strace cuts strings at 32 characters by default, and a
    # cut rename would not be followed).
    r = subprocess.run(["strace", "-f", "-qq", "-s", "4096", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2",
                        "-y", "-o", str(log), str(ckptconv), *map(str, args)], cwd=cwd, capture_output=True, text=True)
    if "Operation not permitted" in r.stderr and "ptrace" in r.stderr:
        pytest.fail(f"strace cannot trace here (ptrace denied): {r.stderr}")
    assert r.returncode == 0, r.stderr
    events = []  # ("sync", path) or ("rename", old, new), absolute
    for line in log.read_text().splitlines():
        if m := SYNC.search(line):
            events.append(("sync", m.group(1)))
        elif m := RENAME.search(line):
            events.append(("rename", *(os.path.normpath(cwd / p) for p in m.groups())))
    synced = []
    for i, event in enumerate(events):
        if event[0] != "sync":
            continue
        path = event[1]
        for later in events[i + 1:]:
            if later[0] == "rename" and (path == later[1] or path.startswith(later[1] + "/")):
                path = later[2] + path[len(later[1]):]
        synced.append(path)
    return synced


def output_files(where):
    return sorted(str(p) for p in where.rglob("*") if p.is_file() and not p.name.endswith(".strace"))


@pytest.mark.parametrize("command,src,name,extra", CASES)
def test_every_output_file_and_its_directory_are_synced_unless_no_fsync(command, src, name, extra, tmp_path,
                                                                         ckptconv):
    durable, fast = tmp_path / "durable", tmp_path / "fast"
    durable.mkdir()
    fast.mkdir()
    synced = synced_paths(ckptconv, [command, src, "-o", name, "-q", *extra], durable)
    files = output_files(durable)
    assert files, "nothing was written"
    for f in files:
        assert f in synced, f"{f} was never fsynced: {synced}"
    # The directory the output was renamed into, after the rename (so last).
    assert synced[-1] == str(durable), synced
    if (durable / name).is_dir():
        assert str(durable / name) in synced, synced  # its entries, before it was renamed

    assert synced_paths(ckptconv, [command, src, "-o", name, "-q", "--no-fsync", *extra], fast) == []
    for f in files:
        g = fast / Path(f).relative_to(durable)
        if g.name == ".metadata":
            continue  # DCP's random save id differs on every run
        assert g.read_bytes() == Path(f).read_bytes(), g


@pytest.mark.parametrize("no_fsync", [[], ["--no-fsync"]], ids=["durable", "no-fsync"])
def test_the_finalizing_worker_syncs_what_it_publishes(no_fsync, tmp_path, ckptconv, run_ckptconv):
    r = run_ckptconv("consolidate", WS2, "-o", tmp_path / "out.pt", "--part", "0/2", *no_fsync)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.pt"
    synced = synced_paths(ckptconv, ["consolidate", WS2, "-o", out, "--part", "1/2", *no_fsync], tmp_path)
    assert out.is_file()
    if no_fsync:
        assert synced == []
    else:
        # The shared data file, synced in the parts folder, then renamed to OUT.
        assert str(out) in synced, synced
        assert synced[-1] == str(tmp_path), synced


def test_a_worker_writes_back_its_own_ranges_and_leaves_the_file_sync_to_the_finalizer(tmp_path, ckptconv):
    """#56: a worker that does not finalize sends its own byte ranges of the
    shared file to the disk and waits for them (sync_file_range), not an
    fdatasync of the whole file (which also flushed the other workers' bytes
    and committed the journal once more per worker), before its receipt is
    fsynced; the finalizer's fsync of the file is what publishes it."""
    log = tmp_path / "w0.strace"
    r = subprocess.run(["strace", "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync,sync_file_range", "-o", str(log),
                        str(ckptconv), "consolidate", str(WS2), "-o", "out.pt", "--part", "0/2"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wrote = int(re.search(r"wrote part 0/2 \(\d+ pieces, (\d+) bytes\)", r.stderr).group(1))
    assert wrote > 0
    lines = log.read_text().splitlines()
    waited = [(int(m.group(1)), int(m.group(2))) for line in lines
              if (m := re.search(r"sync_file_range\(\d+<[^>]*/data-0>, (\d+), (\d+), .*WAIT_AFTER", line))]
    assert waited and sum(n for _, n in waited) >= wrote, lines
    assert not [line for line in lines if re.search(r"f(data)?sync\(\d+<[^>]*/data-0>", line)], lines
    receipt = next(i for i, line in enumerate(lines) if re.search(r"fsync\(\d+<[^>]*part-0-of-2\.json", line))
    last_wait = max(i for i, line in enumerate(lines) if "WAIT_AFTER" in line)
    assert last_wait < receipt, lines
    one = tmp_path / "one.pt"
    assert subprocess.run([str(ckptconv), "-q", "consolidate", str(WS2), "-o", str(one)]).returncode == 0
    synced = synced_paths(ckptconv, ["consolidate", WS2, "-o", "out.pt", "--part", "1/2"], tmp_path)
    assert str(tmp_path / "out.pt") in synced, synced
    assert (tmp_path / "out.pt").read_bytes() == one.read_bytes()


@pytest.mark.parametrize("command,extra", [
    ("consolidate", ["-o", "full.pt"]), ("convert", ["-o", "full.h5"]),
    ("reshard", ["-o", "ws3", "--world-size", "3"]),
    ("reshard", ["-o", "ranks", "--world-size", "3", "--layout", "fsdp-sharded-tensor"]),
])
def test_no_fsync_is_accepted_by_every_writing_command(command, extra, tmp_path, run_ckptconv):
    """#30 row 5: --no-fsync on consolidate, convert, reshard (every layout) and finalize."""
    src = REPO / "testdata" / "pt" / "dtypes.pt" if command == "convert" else WS2
    r = run_ckptconv(command, src, *extra, "--no-fsync", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / extra[1]).exists()


def test_no_fsync_is_accepted_by_finalize(tmp_path, run_ckptconv):
    r = run_ckptconv("consolidate", WS2, "-o", "out.pt", "--part", "0/2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (folder,) = tmp_path.glob("out.pt.parts-*")
    (folder / "finalizing").touch()
    r = run_ckptconv("consolidate", WS2, "-o", "out.pt", "--part", "1/2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (folder / "finalizing").unlink()
    r = run_ckptconv("finalize", "out.pt", "--no-fsync", cwd=tmp_path)
    assert r.returncode == 0 and "finalized 2 parts" in r.stderr, r.stderr
