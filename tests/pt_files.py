"""Editing real torch.save files record by record, for tests that need a
file torch wrote with one record changed (a hostile data.pkl, a damaged
format record, an added client_state entry). Not a test module."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Callable


def rewrite_records(pt: Path, change: Callable[[str, bytes], bytes]) -> None:
    """Rewrites the zip `pt` with every record's bytes passed through
    change(name, data); stored, as torch writes them."""
    with zipfile.ZipFile(pt) as z:
        records = [(info.filename, z.read(info)) for info in z.infolist()]
    with zipfile.ZipFile(pt, "w", compression=zipfile.ZIP_STORED) as out:
        for name, data in records:
            out.writestr(name, change(name, data))


def replace_record(pt: Path, suffix: str, data: bytes) -> None:
    """The record whose name ends with "/" + suffix gets `data` (it must exist)."""
    found = []

    def change(name: str, old: bytes) -> bytes:
        if name.endswith("/" + suffix):
            found.append(name)
            return data
        return old
    rewrite_records(pt, change)
    assert found, f"{pt} has no record {suffix}"


def pt_with_data_pkl(path: Path, data_pkl: bytes) -> None:
    """A real torch.save zip (of {'w': arange(4)}) whose data.pkl is `data_pkl`."""
    import torch
    torch.save({"w": torch.arange(4.0)}, path)
    replace_record(path, "data.pkl", data_pkl)
