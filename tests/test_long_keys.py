"""Long keys and --keys never crash ckptconv (issue #49 rows 2 and 3).

libstdc++'s std::regex recursed once per character of the subject: the
Megatron reader matched every torch_dist item name against
`(.+)/shard_...`, and --keys searched every dotted path, so a 28-40k
character key in a `.metadata` or a 100k-character key under
`--keys '.*weight$'` overflowed the stack (SIGSEGV, exit 139). Every pattern
now runs on core/linear_regex (a Pike VM: no recursion per character). Each
command must end with an exit code, 0 or a refusal (3), never a signal. The
subprocess timeouts are hang guards, not timings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

HANG_GUARD_S = 120
LONG_DCP_KEY = "a" * 40_000
LONG_PT_KEY = "x" * 99_994 + "weight"  # 100,000 characters


def _ends_cleanly(r, what: str) -> None:
    """Exit 0, or 3 with a message; a negative code is a signal (-11: SIGSEGV)."""
    assert r.returncode >= 0, f"{what}: killed by signal {-r.returncode}\n{r.stderr[-2000:]}"
    assert r.returncode in (0, 3), f"{what}: exit {r.returncode}\n{r.stderr[-2000:]}"
    if r.returncode == 3:
        assert r.stderr.strip(), f"{what}: exit 3 without a message"


def _torch_dist(path: Path, items: dict, megatron: bool) -> Path:
    """A torch_dist directory written by torch's own DCP writer in one process;
    with megatron, megatron-core's metadata.json beside it (as
    tests/test_megatron.py's hostile cases write it)."""
    dcp.save(dict(items), checkpoint_id=str(path), no_dist=True)
    if megatron:
        (path / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
                                            '"common_backend": "torch", "common_backend_version": 1}')
    return path


def _check_commands(run_ckptconv, src: Path, out: Path, extra=()) -> dict:
    """inspect, validate and consolidate -o x.pt on src; the consolidated state dict when written."""
    for args in (["inspect", src, *extra], ["inspect", src, "--json", *extra], ["validate", src]):
        _ends_cleanly(run_ckptconv(*args, timeout=HANG_GUARD_S), " ".join(map(str, args[:1] + args[2:])))
    target = out / "x.pt"
    r = run_ckptconv("consolidate", src, "-o", target, *extra, timeout=HANG_GUARD_S)
    _ends_cleanly(r, "consolidate")
    if r.returncode != 0:
        assert not target.exists()
        return {}
    return torch.load(target, weights_only=True)


@pytest.mark.parametrize("megatron", [False, True], ids=["dcp", "megatron"])
def test_40k_character_key_in_torch_dist_metadata(megatron, tmp_path, run_ckptconv):
    src = _torch_dist(tmp_path / "ckpt", {LONG_DCP_KEY: torch.arange(4.0), "b": torch.ones(2)}, megatron)
    assert (src / ".metadata").stat().st_size > 40_000
    r = run_ckptconv("inspect", src, timeout=HANG_GUARD_S)
    _ends_cleanly(r, "inspect")
    if r.returncode == 0:
        assert ("megatron-torch-dist" if megatron else ": dcp,") in r.stdout
        assert LONG_DCP_KEY in r.stdout
    out = tmp_path / "out"
    out.mkdir()
    got = _check_commands(run_ckptconv, src, out)
    if got:
        assert sorted(got) == sorted([LONG_DCP_KEY, "b"])
        assert torch.equal(got[LONG_DCP_KEY], torch.arange(4.0))
    # --keys searches the 40k-character path too.
    (out / "x.pt").unlink(missing_ok=True)
    got = _check_commands(run_ckptconv, src, out, ["--keys", "a+$"])
    if got:
        assert sorted(got) == [LONG_DCP_KEY]


def test_40k_character_sharded_object_key_in_megatron_torch_dist(tmp_path, run_ckptconv):
    """A sharded object's item, KEY/shard_<offsets>_<shape>: the reader splits
    its name (the pattern's first group is the 40k-character key)."""
    key = "k" * 40_000
    src = _torch_dist(tmp_path / "ckpt", {"w": torch.ones(3), f"{key}/shard_0_1": [None]}, megatron=True)
    r = run_ckptconv("inspect", src, "--json", timeout=HANG_GUARD_S)
    _ends_cleanly(r, "inspect")
    if r.returncode == 0:  # regrouped under its key
        assert [v["path"] for v in json.loads(r.stdout)["values"]] == [key]
    out = tmp_path / "out"
    out.mkdir()
    _check_commands(run_ckptconv, src, out)
    # A long name that is not a shard's stays a plain item.
    plain = _torch_dist(tmp_path / "plain", {"w": torch.ones(3), f"{key}/shard_x_1": [None]}, megatron=True)
    r = run_ckptconv("inspect", plain, "--json", timeout=HANG_GUARD_S)
    _ends_cleanly(r, "inspect (not a shard name)")
    if r.returncode == 0:
        assert [v["path"] for v in json.loads(r.stdout)["values"]] == [f"{key}/shard_x_1"]


@pytest.fixture
def long_key_pt(tmp_path) -> Path:
    src = tmp_path / "long.pt"
    torch.save({LONG_PT_KEY: torch.ones(3), "bias": torch.zeros(2)}, src)
    return src


def _listed(r) -> list[str]:
    return [t["path"] for t in json.loads(r.stdout)["tensors"]]


def test_keys_regex_on_a_100k_character_key(long_key_pt, tmp_path, run_ckptconv):
    r = run_ckptconv("inspect", long_key_pt, "--keys", ".*weight$", timeout=HANG_GUARD_S)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-2000:]}"
    assert LONG_PT_KEY in r.stdout and "bias" not in r.stdout
    r = run_ckptconv("inspect", long_key_pt, "--json", "--keys", ".*weight$", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _listed(r) == [LONG_PT_KEY]
    r = run_ckptconv("inspect", long_key_pt, "--json", "--keys", "^bias$|(x|y)*weight", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(_listed(r)) == sorted([LONG_PT_KEY, "bias"])
    r = run_ckptconv("inspect", long_key_pt, "--json", "--keys", "^(?!x)", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _listed(r) == ["bias"]
    r = run_ckptconv("consolidate", long_key_pt, "--keys", ".*weight$", "-o", tmp_path / "w.pt",
                     timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(torch.load(tmp_path / "w.pt", weights_only=True)) == [LONG_PT_KEY]
    r = run_ckptconv("diff", long_key_pt, tmp_path / "w.pt", "--keys", "weight$", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("pattern,message", [
    ("(", "unmatched '(' at offset 0"),
    ("a**", "nothing to repeat at offset 2"),
    (r"(a)\1", "backreferences are not supported"),
    ("(?<=a)b", "lookbehind"),
    ("(a{1000}){1000}", "the pattern is too large"),
    ("(" * 100_000, "parentheses nested deeper than 200"),
])
def test_bad_or_hostile_keys_pattern_is_a_usage_error(pattern, message, long_key_pt, run_ckptconv):
    r = run_ckptconv("inspect", long_key_pt, "--keys", pattern, timeout=HANG_GUARD_S)
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stderr[-2000:]}"
    assert "is not a valid regular expression: " in r.stderr and message in r.stderr


def test_dcp_file_names_still_read(tmp_path, run_ckptconv, testdata):
    """The file-name patterns moved off std::regex with the rest: a DCP
    directory's rank files and a folder of checkpoints read as before."""
    root = tmp_path / "run"
    shutil.copytree(testdata / "dcp" / "fsdp2_adamw_ws2", root / "step-7")
    shutil.copytree(testdata / "dcp" / "fsdp2_adamw_ws2", root / "step-12")
    r = run_ckptconv("inspect", root, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    assert "step-12" in r.stdout and "step-7" in r.stdout
    r = run_ckptconv("validate", root / "step-12", "--expect-world-size", "2", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stdout + r.stderr
