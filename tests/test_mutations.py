"""A small seeded sample of tools/mutate.py's campaign (the closing notes give
the long runs): one file of each fixture family damaged (bit flip,
truncation, duplicated or deleted bytes), then inspect, validate and
consolidate run on it. No command may die of a signal, hang, print non-UTF-8,
leave a partial output, or write an output that differs from the clean one
without the format's own library reading the same from the damaged input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import mutate  # noqa: E402


@pytest.mark.parametrize("family", ["pt", "dcp", "ranks", "zero", "safetensors", "hdf5"])
def test_damaged_inputs_are_refused_or_read_as_their_library_reads_them(family, ckptconv):
    result = mutate.campaign(family, count=15, seed=11, ckptconv=ckptconv, timeout=120)
    assert result["bad"] == [], result
    assert sum(result["counts"].values()) == 15
    assert result["counts"].get("refused", 0) > 0, result["counts"]


# The two cases of the 10,000-case DCP campaign (seed 2026) that were silent:
# a flipped bit in a .metadata memo index made a dict key refer to a
# ChunkStorageMetadata. torch's read_metadata raises TypeError (unhashable
# key); ckptconv now refuses it the same way instead of reading a tree torch
# never builds.
@pytest.mark.parametrize("offset, bit", [(6395, 7), (5086, 4)])
def test_a_metadata_memo_flip_that_torch_refuses_is_refused(offset, bit, tmp_path, run_ckptconv):
    import shutil
    import warnings
    from torch.distributed.checkpoint import FileSystemReader
    src = tmp_path / "ckpt"
    shutil.copytree(REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2", src)
    data = bytearray((src / ".metadata").read_bytes())
    data[offset] ^= 1 << bit
    (src / ".metadata").write_bytes(bytes(data))
    with warnings.catch_warnings(), pytest.raises(TypeError, match="unhashable"):
        warnings.simplefilter("ignore")
        FileSystemReader(str(src)).read_metadata()
    r = run_ckptconv("validate", src)
    assert r.returncode != 0 and "unhashable type (ChunkStorageMetadata)" in r.stdout + r.stderr, r.stdout
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3 and "unhashable" in r.stderr, r.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# The HDF5 cases of this session's 10,000-case campaign (seed 2026) that were
# silent or printed raw bytes: dimensions flipped past the dataspace's own
# maximum (473, 2788, 9751) or to 0 under a contiguous layout that stores
# more (6413), both of which h5py's newer libhdf5 refuses and Debian's 1.10
# reads; a flipped byte in the source_format attribute printed raw by
# inspect (6303). Replayed exactly: the same draws, only these cases run.
def test_the_hdf5_campaign_cases_that_were_silent_are_refused(ckptconv):
    cases = {473, 2788, 6303, 6413, 9751}
    result = mutate.campaign("hdf5", count=max(cases) + 1, seed=2026, ckptconv=ckptconv, timeout=120, only=cases)
    assert result["bad"] == [], result
    assert sum(result["counts"].values()) == len(cases), result["counts"]


def test_a_damaged_parts_folder_is_refused_or_finalized_to_the_single_process_bytes(ckptconv):
    """#37: one file of OUT.parts-*/ (a receipt, request.json, the shared data
    file) damaged before `ckptconv finalize OUT`: refused with nothing at OUT,
    or the very bytes one process writes (damage where the finalizer rewrites
    anyway). 2,000 cases (seed 12): 1,764 refused, 236 same."""
    result = mutate.parts_campaign(count=20, seed=11, ckptconv=ckptconv, timeout=120)
    assert result["bad"] == [], result
    assert sum(result["counts"].values()) == 20
    assert result["counts"].get("refused", 0) > 0, result["counts"]
