"""A --part run's folder (OUT.parts-<plan>/) sits beside OUT, where a link
or a file can be planted before the workers run or between them and the
finalizer (#37 rows 2-4). None of it may write through a link, write
anywhere but OUT, or publish bytes whose CRC-32 in the archive lies: each is
exit 3 naming what was refused, nothing is published, and every input and
every other file keeps its bytes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DCP = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): _sha(p) for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def job(tmp_path):
    """A private copy of the source (the attacks aim at its files) and a work folder."""
    src = tmp_path / "src"
    shutil.copytree(DCP, src)
    work = tmp_path / "job"
    work.mkdir()
    return src, work


def _parts_folder(run_ckptconv, src: Path, work: Path, out: str) -> str:
    """The parts folder's name for this plan: made by a real worker, then removed."""
    r = run_ckptconv("consolidate", src, "-o", out, "--part", "0/2", cwd=work)
    assert r.returncode == 0, r.stderr
    (folder,) = work.glob(out + ".parts-*")
    shutil.rmtree(folder)
    return folder.name


def _unfinalized(run_ckptconv, src: Path, work: Path, out: str, *extra) -> Path:
    """Both parts written, finalizing left undone (the elected worker 'died')."""
    r = run_ckptconv("consolidate", src, "-o", out, *extra, "--part", "0/2", cwd=work)
    assert r.returncode == 0, r.stderr
    (folder,) = work.glob(out + ".parts-*")
    (folder / "finalizing").touch()
    r = run_ckptconv("consolidate", src, "-o", out, *extra, "--part", "1/2", cwd=work)
    assert r.returncode == 0 and "another worker is finalizing" in r.stderr, r.stderr
    (folder / "finalizing").unlink()
    return folder


@pytest.mark.parametrize("plant,says", [("symlink", "data-0: a symbolic link"),
                                         ("hard link", "data-0: a file with 2 links")])
def test_a_link_planted_as_a_shared_file_is_refused_and_the_input_keeps_its_bytes(plant, says, job, run_ckptconv):
    """data-0 -> src/__0_0.distcp (or a second name of it) would have been
    written through by part 0."""
    src, work = job
    name = _parts_folder(run_ckptconv, src, work, "out.pt")
    before = _tree(src)
    folder = work / name
    folder.mkdir()
    victim = src / "__0_0.distcp"
    if plant == "symlink":
        (folder / "data-0").symlink_to(victim)
    else:
        os.link(victim, folder / "data-0")
    r = run_ckptconv("consolidate", src, "-o", "out.pt", "--part", "0/2", cwd=work)
    assert r.returncode == 3, r.stderr
    assert says in r.stderr and "refused" in r.stderr, r.stderr
    assert _tree(src) == before
    assert not (work / "out.pt").exists()


def test_a_parts_folder_that_is_a_symlink_is_refused_and_its_target_untouched(job, run_ckptconv, tmp_path):
    src, work = job
    name = _parts_folder(run_ckptconv, src, work, "out.pt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (work / name).symlink_to(elsewhere, target_is_directory=True)
    for part in ("0/2", "1/2", "finalize"):
        r = run_ckptconv("consolidate", src, "-o", "out.pt", "--part", part, cwd=work)
        assert r.returncode == 3 and f"{name}: a symbolic link" in r.stderr, (part, r.stderr)
    r = run_ckptconv("finalize", "out.pt", cwd=work)
    assert r.returncode == 3 and f"{name}: a symbolic link" in r.stderr, r.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert (elsewhere / "keep.txt").read_text() == "mine"
    assert not (work / "out.pt").exists()


def test_a_symlinked_receipt_is_refused(job, run_ckptconv, tmp_path):
    src, work = job
    folder = _unfinalized(run_ckptconv, src, work, "out.pt")
    receipt = folder / "part-1-of-2.json"
    moved = tmp_path / "receipt.json"
    shutil.move(receipt, moved)
    receipt.symlink_to(moved)
    r = run_ckptconv("finalize", "out.pt", cwd=work)
    assert r.returncode == 3 and "part-1-of-2.json: a symbolic link" in r.stderr, r.stderr
    assert not (work / "out.pt").exists()


def test_finalize_refuses_a_request_naming_another_output(job, run_ckptconv):
    """finalize B.pt, whose request.json names A.pt with force: A.pt keeps its bytes."""
    src, work = job
    folder = _unfinalized(run_ckptconv, src, work, "b.pt")
    (work / "a.pt").write_bytes(b"precious")
    req = json.loads((folder / "request.json").read_text())
    req["output"] = "a.pt"
    req["common"]["force"] = True
    (folder / "request.json").write_text(json.dumps(req))
    r = run_ckptconv("finalize", "b.pt", cwd=work)
    assert r.returncode == 3, r.stderr
    assert f"its output is {work / 'a.pt'}, not {work / 'b.pt'}" in r.stderr, r.stderr
    assert (work / "a.pt").read_bytes() == b"precious"
    assert not (work / "b.pt").exists()


def test_finalize_refuses_a_request_whose_folder_does_not_hold_its_output(job, run_ckptconv):
    """-o DIR/: the request names the folder (its side files are copied on
    finalize); one naming another folder is refused, and nothing is written
    into either."""
    src, work = job
    folder = _unfinalized(run_ckptconv, src, work, "b.pt")
    req = json.loads((folder / "request.json").read_text())
    req["folder"] = "elsewhere/"
    (folder / "request.json").write_text(json.dumps(req))
    r = run_ckptconv("finalize", "b.pt", cwd=work)
    assert r.returncode == 3, r.stderr
    assert "request.json: its folder elsewhere/ does not hold its output b.pt; refused" in r.stderr, r.stderr
    assert not (work / "b.pt").exists() and not (work / "elsewhere").exists()


def test_finalize_takes_force_from_its_own_command_line_only(job, run_ckptconv):
    src, work = job
    folder = _unfinalized(run_ckptconv, src, work, "b.pt")
    req = json.loads((folder / "request.json").read_text())
    req["common"]["force"] = True
    (folder / "request.json").write_text(json.dumps(req))
    (work / "b.pt").write_bytes(b"precious")
    r = run_ckptconv("finalize", "b.pt", cwd=work)
    assert r.returncode == 2 and "output exists (use --force" in r.stderr, r.stderr
    assert (work / "b.pt").read_bytes() == b"precious"
    r = run_ckptconv("finalize", "b.pt", "--force", cwd=work)
    assert r.returncode == 0 and "finalized 2 parts" in r.stderr, r.stderr
    assert (work / "b.pt").read_bytes() != b"precious"


def test_finalize_refuses_a_request_whose_options_changed(job, run_ckptconv):
    """A request.json edited after the parts were written (here --keys) is not the
    plan the receipts were made for."""
    src, work = job
    folder = _unfinalized(run_ckptconv, src, work, "b.pt")
    req = json.loads((folder / "request.json").read_text())
    req["common"]["keys"] = "^model\\."
    (folder / "request.json").write_text(json.dumps(req))
    r = run_ckptconv("finalize", "b.pt", cwd=work)
    assert r.returncode == 3 and "no part of this plan has been written" in r.stderr, r.stderr
    assert not (work / "b.pt").exists()


@pytest.mark.parametrize("fmt", ["pt", "dcp"])
def test_a_forged_receipt_crc_is_refused_before_publishing(fmt, job, run_ckptconv, ckptconv):
    src, work = job
    if fmt == "pt":
        folder = _unfinalized(run_ckptconv, src, work, "out.pt")
        out = work / "out.pt"
    else:
        import subprocess
        extra = ["--world-size", "3", "--layout", "dcp"]
        for i in range(2):
            token = list(work.glob("out.parts-*"))
            if token:
                (token[0] / "finalizing").touch()
            r = subprocess.run([str(ckptconv), "reshard", str(src), "-o", "out", *extra, "--part", f"{i}/2"],
                               cwd=work, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
        (folder,) = work.glob("out.parts-*")
        (folder / "finalizing").unlink()
        out = work / "out"
    receipt = folder / "part-1-of-2.json"
    rec = json.loads(receipt.read_text())
    rec["pieces"][0][3] ^= 1
    receipt.write_text(json.dumps(rec))
    r = run_ckptconv("finalize", out.name, cwd=work)
    assert r.returncode == 3, r.stderr
    assert "part-1-of-2.json: the CRC-32 it gives" in r.stderr and "rerun part 1" in r.stderr, r.stderr
    assert not out.exists()
