"""Error messages name each path once. Over a corruption matrix (a flipped
pickle byte in a DCP item and in a rank file, a flipped tensor byte, a
truncated .distcp and rank file, a deleted rank, a hostile global), every
line validate reports and every error consolidate prints names each file of
the checkpoint at most once — at its most precise (a byte range inside it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_validate import copy_of, dcp_item, flip_byte, record_offset


def _flip_dcp_value(d: Path) -> None:
    name, off, length = dcp_item(d, "optim.param_groups.0.lr")
    flip_byte(d / name, off + length // 2)


def _flip_dcp_tensor(d: Path) -> None:
    name, off, length = dcp_item(d, "model.fc1.weight")
    data = (d / name).read_bytes()[off:off + length]
    doff, _ = record_offset(data, "/data/0")
    flip_byte(d / name, off + doff)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_rank_pickle(d: Path) -> None:
    f = d / "optim_rank1.pt"
    off, size = record_offset(f.read_bytes(), "data.pkl")
    flip_byte(f, off + size // 2)


def _hostile_global(d: Path) -> None:
    f = d / "model_world_size_2_rank_1.pt"
    data = f.read_bytes()
    flip_byte(f, data.index(b"DTensor") + 1)


CORRUPTIONS = {
    "dcp_value_byte": ("dcp/fsdp2_adamw_ws2", _flip_dcp_value),
    "dcp_tensor_byte": ("dcp/fsdp2_adamw_ws2", _flip_dcp_tensor),
    "dcp_truncated": ("dcp/fsdp2_adamw_ws3", lambda d: _truncate(d / "__2_0.distcp")),
    "dcp_deleted_rank": ("dcp/fsdp2_adamw_ws4", lambda d: (d / "__3_0.distcp").unlink()),
    "rank_pickle_byte": ("fsdp_st/adamw_ws2", _flip_rank_pickle),
    "rank_truncated": ("fsdp_st/adamw_ws2", lambda d: _truncate(d / "optim_rank1.pt")),
    "rank_deleted": ("fsdp_st/adamw_ws3", lambda d: (d / "model_rank2.pt").unlink()),
    "rank_hostile_global": ("fsdp_dt/adamw_ws2", _hostile_global),
}


def _repeated_paths(text: str, d: Path) -> list[str]:
    """Paths of files under d that `text` names more than once."""
    names = {str(p) for p in d.iterdir()} | {str(d / n) for n in ("__3_0.distcp", "model_rank2.pt")}
    return [p for p in names if len(re.findall(re.escape(p) + r"(?![\w.])", text)) > 1]


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_each_path_named_once(case, tmp_path, run_ckptconv):
    rel, corrupt = CORRUPTIONS[case]
    d = copy_of(rel, tmp_path)
    corrupt(d)
    r = run_ckptconv("validate", d, "--json")
    assert r.returncode in (1, 3), r.stderr
    report = json.loads(r.stdout)
    assert report["problems"], "the corruption went unnoticed"
    for p in report["problems"]:
        assert not _repeated_paths(p["message"], d), p["message"]
    # consolidate does not check CRCs (a flipped tensor byte is copied as it
    # is): where it fails, its error too names each path once.
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "out.pt")
    assert r.returncode in (0, 3), r.stderr
    for line in r.stderr.splitlines():
        assert not _repeated_paths(line, d), line
