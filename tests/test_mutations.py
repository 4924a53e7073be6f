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

pytest.importorskip("torch")


@pytest.mark.parametrize("family", ["pt", "dcp", "ranks", "zero", "safetensors", "hdf5"])
def test_damaged_inputs_are_refused_or_read_as_their_library_reads_them(family, ckptconv):
    result = mutate.campaign(family, count=15, seed=11, ckptconv=ckptconv, timeout=120)
    assert result["bad"] == [], result
    assert sum(result["counts"].values()) == 15
    assert result["counts"].get("refused", 0) > 0, result["counts"]
