"""Small hostile files that used to make ckptconv hang, crash or block
(issue table rows 2, 3 and 10): each is now a clear exit 3 that writes
nothing. The subprocess timeouts are hang guards, not timings."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pt_files import pt_with_data_pkl

import torch
import torch.distributed.checkpoint as dcp

HANG_GUARD_S = 120


def _only(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_shared_subtree_pickle_is_refused_by_every_walk(tmp_path, run_ckptconv):
    """a = ['lol']; 40 times a = [a, a]: 1.9 KB whose tree has 2^40 leaves."""
    a = ["lol"]
    for _ in range(40):
        a = [a, a]
    src = tmp_path / "bomb.pt"
    torch.save({"x": a}, src)
    assert src.stat().st_size < 4096
    out = tmp_path / "out"
    out.mkdir()
    for args in (["inspect", src], ["inspect", src, "--json"], ["validate", src],
                 ["consolidate", src, "-o", out / "x.safetensors"], ["consolidate", src, "-o", out / "x.pt"],
                 ["diff", src, src]):
        r = run_ckptconv(*args, timeout=HANG_GUARD_S)
        assert r.returncode == 3, f"{args[0]}: exit {r.returncode}\n{r.stderr}"
        assert "expands to more than" in r.stdout + r.stderr
    assert _only(out) == []


def test_shared_subtree_within_budget_still_reads(tmp_path, run_ckptconv):
    """Sharing itself is fine: 10 levels (1024 leaves) inspect and convert."""
    a = ["lol"]
    for _ in range(10):
        a = [a, a]
    src = tmp_path / "shared.pt"
    torch.save({"x": a, "w": torch.ones(2)}, src)
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "o.pt")
    assert r.returncode == 0, r.stderr
    assert torch.load(tmp_path / "o.pt", weights_only=True)["x"] == a


@pytest.mark.parametrize("length", [5_000, 50_000, 100_000])
def test_deep_planner_data_path_is_refused(length, tmp_path, run_ckptconv):
    src = tmp_path / "deep"
    dcp.save({"model": {"w": torch.arange(4.0)}}, checkpoint_id=str(src), no_dist=True)
    md_path = src / ".metadata"
    with open(md_path, "rb") as f:
        md = pickle.load(f)
    md.planner_data["model.w"] = tuple(["model"] * (length - 1) + ["w"])
    md_path.write_bytes(pickle.dumps(md))
    out = tmp_path / "out"
    out.mkdir()
    for args in (["inspect", src], ["validate", src], ["consolidate", src, "-o", out / "full.pt"],
                 ["reshard", src, "-o", out / "r", "--world-size", "2"]):
        r = run_ckptconv(*args, timeout=HANG_GUARD_S)
        assert r.returncode == 3, f"{args[0]}: exit {r.returncode}\n{r.stderr}"
        assert f"planner_data path has {length} elements" in r.stdout + r.stderr
    assert _only(out) == []


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize("where", ["src", "metadata", "distcp"])
def test_fifo_is_refused_without_blocking(where, tmp_path, run_ckptconv, testdata):
    if where == "src":
        src = tmp_path / "model.pt"
        _fifo(src)
        named = src
    else:
        src = tmp_path / "ckpt"
        shutil.copytree(testdata / "dcp" / "fsdp2_adamw_ws2", src)
        named = src / (".metadata" if where == "metadata" else "__1_0.distcp")
        named.unlink()
        _fifo(named)
    # A writer that never comes: if ckptconv opened the FIFO for reading it
    # would block until the hang guard fires.
    for args in (["inspect", src], ["validate", src], ["consolidate", src, "-o", tmp_path / "o.pt"]):
        r = run_ckptconv(*args, timeout=HANG_GUARD_S)
        assert r.returncode in (1, 3), f"{args[0]}: exit {r.returncode}\n{r.stderr}"
        if args[0] != "validate":
            assert r.returncode == 3
        assert "is a FIFO, not a regular file" in r.stdout + r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_device_and_directory_in_place_of_a_file_are_exit_3(tmp_path, run_ckptconv):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / ".metadata").mkdir()
    r = run_ckptconv("inspect", src, timeout=HANG_GUARD_S)
    assert r.returncode == 3, r.stderr
    assert "is a directory, not a regular file" in r.stderr
    r = run_ckptconv("inspect", "/dev/zero", timeout=HANG_GUARD_S)
    assert r.returncode == 3, r.stderr
    assert "is a character device" in r.stderr


def _zstd_bomb(gib: int = 1) -> bytes:
    """A zstd frame that declares no content size and inflates to `gib` GiB of zeros (about 32 KB)."""
    import zstandard
    c = zstandard.ZstdCompressor(level=19, write_content_size=False).compressobj()
    zeros = bytes(1 << 20)
    parts = [c.compress(zeros) for _ in range(gib << 10)]
    return b"".join(parts) + c.flush()


@pytest.mark.parametrize("item", ["model.w", "optim.param_groups.0.lr"])
def test_zstd_item_without_content_size_is_bounded(item, tmp_path, ckptconv, testdata):
    """Row 5: a zstd item is inflated only up to what it declares (its chunk's
    bytes plus the zip around them; 256 MiB for bytes items, whose size DCP does
    not record). Measured peak RSS stays far below the bomb's size."""
    src = tmp_path / "zstd"
    shutil.copytree(testdata / "dcp" / "zstd_ws1", src)
    md_path = src / ".metadata"
    with open(md_path, "rb") as f:
        md = pickle.load(f)
    bomb = _zstd_bomb(1)
    assert len(bomb) < 1 << 20
    index = next(i for i in md.storage_data if i.fqn.startswith(item))
    info = md.storage_data[index]
    assert info.transform_descriptors, "the fixture's items are zstd streams"
    distcp = src / info.relative_path
    offset = distcp.stat().st_size
    with open(distcp, "ab") as f:
        f.write(bomb)
    info.offset, info.length = offset, len(bomb)
    md_path.write_bytes(pickle.dumps(md))
    out = tmp_path / "out"
    out.mkdir()
    for args in (["validate", src], ["consolidate", src, "-o", out / "full.pt"]):
        res = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", str(ckptconv), *map(str, args)],
                             capture_output=True, text=True, timeout=HANG_GUARD_S)
        text = res.stdout + res.stderr
        assert res.returncode == 3, text
        assert "decompresses to more than" in text, text
        rss_kb = int(text.rsplit("maxrss_kb=", 1)[1].split()[0])
        assert rss_kb < 400 * 1024, f"{args[0]}: peak RSS {rss_kb} KB"
    assert _only(out) == []


def _safetensors_file(path: Path, header: dict, data: bytes) -> None:
    import json
    import struct
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def test_many_references_to_one_tensor_read_and_write_in_linear_time(tmp_path, run_ckptconv):
    """Row 7: a ckptconv.tree with 100,000 references to one tensor (3.7 MB)
    reads and writes back (before: 15-40 s, quadratic in the JSON object's
    members); every reference is the same tensor again in the output."""
    import json
    n = 100_000
    tree = {f"k{i}": {"__tensor__": "w"} for i in range(n)}
    src = tmp_path / "refs.safetensors"
    _safetensors_file(src, {"__metadata__": {"format": "pt", "ckptconv.tree": json.dumps(tree)},
                            "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                      torch.tensor([1.5, -2.0]).numpy().tobytes())
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "out.pt", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert len(out) == n and torch.equal(out["k99999"], torch.tensor([1.5, -2.0]))
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "out.safetensors", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr


def test_duplicate_tensor_name_in_a_safetensors_header_is_refused(tmp_path, run_ckptconv):
    """JSON allows a key twice; a safetensors header naming one tensor twice
    is corrupt (the spec's own parser refuses it)."""
    src = tmp_path / "dup.safetensors"
    body = '{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, ' \
           '"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
    raw = body.encode() + b" " * (-len(body) % 8)
    import struct
    src.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))
    r = run_ckptconv("inspect", src, timeout=HANG_GUARD_S)
    assert r.returncode == 3, r.stderr
    assert "'w'" in r.stderr


def test_stride_zero_view_of_4_tb_is_refused_before_writing(tmp_path, run_ckptconv):
    """Row 6: torch.save of torch.zeros(1).expand(2**40) is 1.6 KB and a valid
    checkpoint of a 4 TiB tensor. consolidate and reshard check the planned
    output against the free space where it goes (and --max-output-size) and
    refuse with exit 4 before writing anything."""
    src = tmp_path / "expanded.pt"
    torch.save({"w": torch.zeros(1).expand(2**40)}, src)
    assert src.stat().st_size < 4096
    r = run_ckptconv("validate", src, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stdout  # a stride-0 view is a valid checkpoint
    out = tmp_path / "out"
    out.mkdir()
    for args in (["consolidate", src, "-o", out / "full.pt"], ["consolidate", src, "-o", out / "full.safetensors"],
                 ["reshard", src, "-o", out / "r", "--world-size", "2", "--layout", "dcp"]):
        r = run_ckptconv(*args, timeout=HANG_GUARD_S)
        assert r.returncode == 4, f"{args[0]}: exit {r.returncode}\n{r.stderr}"
        assert "4.0 TiB" in r.stderr and "free; nothing was written" in r.stderr, r.stderr
    assert _only(out) == []


def test_finite_scan_of_a_stride_zero_view_reads_the_repeated_values_once(tmp_path, run_ckptconv):
    """validate --finite walked every logical element of an expanded tensor:
    a 2 KB file viewing 3 values as 2^40 x 3 took hours. A dimension viewed
    with stride 0 is scanned once and its counts multiplied: the NaN and Inf
    counts are the logical tensor's, as torch counts them on a smaller copy."""
    src = tmp_path / "expanded.pt"
    row = torch.tensor([[1.0, float("nan"), float("-inf")]])
    col = torch.tensor([[float("inf")], [2.0]])
    torch.save({"w": row.expand(2**40, 3), "c": col.expand(2, 2**38), "ok": torch.zeros(1).expand(2**41)}, src)
    assert src.stat().st_size < 4096
    small = {"w": row.expand(4, 3), "c": col.expand(2, 4)}
    assert int(small["w"].isnan().sum()) == 4 and int(small["c"].isinf().sum()) == 4
    r = run_ckptconv("validate", "--finite", "--json", src, timeout=HANG_GUARD_S)
    assert r.returncode == 1, r.stdout + r.stderr
    found = {n["key"]: (n["nan"], n["inf"]) for n in json.loads(r.stdout)["finite"]["nonfinite"]}
    assert found == {"w": (2**40, 2**40), "c": (0, 2**38)}, found


def test_max_output_size_refuses_a_larger_output(tmp_path, run_ckptconv, testdata):
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", out, "--max-output-size", "1K")
    assert r.returncode == 4, r.stderr
    assert "more than --max-output-size 1K" in r.stderr
    assert not out.exists()
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", out, "--max-output-size", "1M")
    assert r.returncode == 0, r.stderr


def _hdf5_dag(path: Path, depth: int, cycle: bool = False) -> None:
    """A file in ckptconv's HDF5 layout whose group at each level is hard-linked
    twice from the level above: `depth` groups that expand to 2**depth paths."""
    import h5py
    with h5py.File(path, "w") as f:
        f.attrs["ckptconv.layout_version"] = 1
        f.attrs["ckptconv.kind"] = "dict"
        f.attrs["ckptconv.keys"] = '["x"]'
        parent = f.create_group("x")
        top = parent
        for _ in range(depth):
            parent.attrs["ckptconv.kind"] = "dict"
            parent.attrs["ckptconv.keys"] = '["a", "b"]'
            child = parent.create_group("a")
            parent["b"] = child  # a second hard link to the same group
            parent = child
        parent.attrs["ckptconv.kind"] = "dict"
        parent.attrs["ckptconv.keys"] = '["v"]' if not cycle else '["up"]'
        if cycle:
            parent["up"] = top
        else:
            parent.attrs["v"] = "1"


def test_hdf5_groups_linked_twice_per_level_are_bounded(tmp_path, run_ckptconv):
    """Row 8: 40 levels of groups, each hard-linked twice (a few KB): read
    once per group, then refused by the expansion bound (exit 3) instead of
    2^40 traversals; a group that links to its ancestor is a cycle (exit 3)."""
    src = tmp_path / "dag.h5"
    _hdf5_dag(src, 40)
    for args in (["inspect", src], ["validate", src], ["consolidate", src, "-o", tmp_path / "o.pt"]):
        r = run_ckptconv(*args, timeout=HANG_GUARD_S)
        assert r.returncode == 3, f"{args[0]}: exit {r.returncode}\n{r.stderr}"
        assert "expands to more than" in r.stdout + r.stderr
    small = tmp_path / "small.h5"
    _hdf5_dag(small, 4)
    r = run_ckptconv("inspect", small, "--json", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    cyc = tmp_path / "cycle.h5"
    _hdf5_dag(cyc, 3, cycle=True)
    r = run_ckptconv("inspect", cyc, timeout=HANG_GUARD_S)
    assert r.returncode == 3 and "a cycle" in r.stderr, r.stderr


def test_hdf5_fixed_string_attribute_claiming_more_than_the_file_is_refused(tmp_path, run_ckptconv, ckptconv):
    """Row 9 (the attribute-size case): a fixed-length string attribute whose
    datatype claims 2 GiB in a 1 KB file is refused (exit 3) without
    allocating for it. Here libhdf5 already refuses the patched object
    header; read_string_attribute also checks the size against the file."""
    import h5py
    import numpy as np
    import struct
    src = tmp_path / "fixed.h5"
    with h5py.File(src, "w") as f:
        f.attrs["ckptconv.layout_version"] = 1
        f.attrs.create("ckptconv.kind", np.bytes_("dict"), dtype="S4")
        f.attrs.create("ckptconv.keys", np.bytes_('["zz"]'), dtype="S6")
        f.attrs.create("zz", np.bytes_("12345"), dtype="S5")
    r = run_ckptconv("inspect", src)
    assert r.returncode == 0 and "12345" in r.stdout, r.stderr
    data = bytearray(src.read_bytes())
    # The string datatype message of 'zz': class 3 version 1 (0x13), flags, then the size.
    at = data.index(bytes.fromhex("13010000") + struct.pack("<I", 5))
    data[at + 4:at + 8] = struct.pack("<I", 2**31 - 1)
    src.write_bytes(bytes(data))
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", str(ckptconv), "inspect", str(src)],
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 3, r.stderr
    assert "fixed.h5" in r.stderr
    assert int(r.stderr.rsplit("maxrss_kb=", 1)[1].split()[0]) < 256 * 1024


def _peak_rss(ckptconv: Path, *args) -> tuple[int, str, int]:
    res = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", str(ckptconv), *map(str, args)],
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    text = res.stdout + res.stderr
    return res.returncode, text, int(text.rsplit("maxrss_kb=", 1)[1].split()[0])


ROW4 = {
    # name: (pickle body between PROTO 2 and STOP, budget named in the refusal)
    "2MB_of_None": (b"N" * 2_000_000, "pickle-stack"),
    "2MB_of_empty_dict": (b"}" * 2_000_000, "pickle-stack"),
    "20MB_of_None": (b"N" * 20_000_000, "pickle-stack"),
    "50MB_of_DUP": (b"N" + b"2" * 50_000_000, "pickle-stack"),
}


@pytest.mark.parametrize("case", sorted(ROW4))
def test_pickle_of_cheap_opcodes_is_refused_naming_the_budget(case, tmp_path, ckptconv):
    """Row 4: each opcode used to cost a heap value (None too), and the
    2^28-value cap admitted about 100 GB. None, bools and small ints are now
    shared constants, the stack has its own budget and everything else counts
    against a memory budget scaled by the pickle's size (64 MiB + 128x)."""
    body, budget = ROW4[case]
    src = tmp_path / "cheap.pt"
    pt_with_data_pkl(src, b"\x80\x02" + body + b".")
    out = tmp_path / "out"
    out.mkdir()
    for args in (["inspect", src, "--json"], ["validate", src], ["consolidate", src, "-o", out / "o.pt"]):
        code, text, rss_kb = _peak_rss(ckptconv, *args)
        assert code == 3, f"{args[0]}: exit {code}\n{text}"
        assert f"the {budget} budget" in text and f"--limit {budget}=" in text, text
        assert "data.pkl" in text and "cheap.pt" in text, text
        # the bound: 2x the input + 64 MiB (a stack refusal) or the memory budget itself
        # bounded: 1M stack values, each at most a heap value (about 300 B)
        bound_kb = 400 * 1024
        assert rss_kb < bound_kb, f"{args[0]}: peak RSS {rss_kb} KB, bound {bound_kb} KB"
    assert _only(out) == []


def test_memory_budget_refuses_values_that_fit_on_no_stack(tmp_path, run_ckptconv, ckptconv):
    """A list of 10^6 empty dicts (2 MB) decodes to about 300 MB, under its
    default budget (64 MiB + 128 x 2 MB) and so read; a lower budget refuses
    it naming pickle-memory, at bounded RSS."""
    src = tmp_path / "dicts.pt"
    pt_with_data_pkl(src, b"\x80\x02]" + b"}a" * 1_000_000 + b".")
    code, text, rss_kb = _peak_rss(ckptconv, "validate", src)
    assert code == 0, text
    assert rss_kb < 800 * 1024, f"peak RSS {rss_kb} KB"  # decoded ~300 MB, plus the walks
    code, text, rss_kb = _peak_rss(ckptconv, "validate", src, "--limit", "pickle-memory=32M")
    assert code == 3 and "the pickle-memory budget" in text, text
    assert rss_kb < 100 * 1024, f"peak RSS {rss_kb} KB"


def test_list_of_ten_million_nones_costs_slots_not_values(tmp_path, ckptconv):
    """Appending None to a list costs one pointer: 10^7 of them (20 MB of
    pickle) read, where a heap value each used to cost 2.6 GB."""
    src = tmp_path / "nones.pt"
    pt_with_data_pkl(src, b"\x80\x02]" + b"Na" * 10_000_000 + b".")
    code, text, rss_kb = _peak_rss(ckptconv, "validate", src)
    assert code == 0, text
    assert rss_kb < 1200 * 1024, f"peak RSS {rss_kb} KB"


def test_limit_raises_a_budget_for_trusted_input(tmp_path, run_ckptconv):
    src = tmp_path / "stack.pt"
    pt_with_data_pkl(src, b"\x80\x02" + b"N" * 1_100_000 + b".")
    assert run_ckptconv("inspect", src).returncode == 3
    r = run_ckptconv("inspect", src, "--limit", "pickle-stack=2M")
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("inspect", src, "--limit", "pickle-stak=2M")
    assert r.returncode == 2 and "pickle-memory, pickle-stack, tree-values" in r.stderr


def test_real_100k_tensor_pickle_is_within_the_default_budgets(tmp_path, run_ckptconv):
    """The budgets' defaults against the largest real pickle we make: a
    100,000-tensor torch.save (9.6 MB of pickle, about 330 MB decoded)."""
    src = tmp_path / "big.pt"
    torch.save({f"layer{i}.w": torch.zeros(1) for i in range(100_000)}, src)
    r = run_ckptconv("inspect", src)
    assert r.returncode == 0, r.stderr
    assert "100000 tensors" in r.stdout
    # and the measured cost is within a factor ~2 of the default: half the budget refuses it
    r = run_ckptconv("inspect", src, "--limit", "pickle-memory=300M")
    assert r.returncode == 3 and "pickle-memory" in r.stderr


REGRESSIONS = Path(__file__).resolve().parent / "regressions"


@pytest.mark.parametrize("name", ["libhdf5-segv-H5HG_read.h5", "dims-overflow-bad_alloc.h5"])
def test_hdf5_mutant_that_crashed_is_a_clean_exit_3(name, tmp_path, run_ckptconv):
    """Row 9: single-bit mutants of a ckptconv .h5 that killed the tool
    (SIGSEGV inside libhdf5's H5HG_read) or made it exit 5 (a flipped
    dimension asked for a 2^60-byte row). The structure is now read first in
    a child process, and declared sizes are checked against the file."""
    src = REGRESSIONS / "hdf5_reader_fuzz" / name
    before = src.read_bytes()
    for args in (["inspect", src], ["validate", src], ["convert", src, "-o", tmp_path / "o.pt"]):
        r = run_ckptconv(*args, timeout=HANG_GUARD_S)
        # validate lists a corrupt file as a problem (exit 1); the others refuse it
        assert r.returncode == (1 if args[0] == "validate" else 3), f"{args[0]}: exit {r.returncode}\n{r.stderr}"
        assert name in r.stdout + r.stderr, r.stderr
    assert src.read_bytes() == before
    assert not any(tmp_path.iterdir())


def test_hdf5_mutant_that_makes_libhdf5_allocate_gigabytes_is_refused_in_bounded_memory(tmp_path, ckptconv):
    """Row 9, memory: a 30 KB mutant whose variable-length string attribute
    claims 7.5 GB made libhdf5 (H5T__conv_vlen) allocate and touch it: 20 s
    and 7.4 GB of RSS before the file was listed as a problem. The child that
    reads the file now has an address-space cap, so the allocation fails, and
    libhdf5's failure to allocate is reported as the budget it ran out of
    (Unsafe, exit 3 also from validate), not as "datatype conversion failed"."""
    src = REGRESSIONS / "hdf5_reader_fuzz" / "vlen-attribute-asks-7.5GB.h5"
    for args in (["inspect", src], ["validate", src], ["convert", src, "-o", tmp_path / "o.pt"]):
        code, text, rss_kb = _peak_rss(ckptconv, *args)
        assert code == 3, text
        assert "hdf5-memory budget" in text and "--limit hdf5-memory=" in text and src.name in text, text
        assert rss_kb < 256 * 1024, f"{args[0]}: {rss_kb} KB"
    assert not any(tmp_path.iterdir())


def test_hdf5_is_opened_by_libhdf5_only_in_the_child(tmp_path, ckptconv):
    """Row 9, by design: a libhdf5 memory error that does not crash must not
    reach the tool, so libhdf5 opens the file only in a forked child, which
    sends the structure and the tensor bytes. The tool's own one open is the
    regular-file check before detection (O_NONBLOCK, item 4); libhdf5 opens
    without O_NONBLOCK. The values still come out right."""
    import torch
    src, h5, out = tmp_path / "m.pt", tmp_path / "m.h5", tmp_path / "o.pt"
    sd = {"w": torch.arange(4096, dtype=torch.float32).reshape(64, 64), "n": {"b": torch.ones(3, dtype=torch.int8)}}
    torch.save(sd, src)
    assert subprocess.run([str(ckptconv), "-q", "convert", str(src), "-o", str(h5)]).returncode == 0
    log = tmp_path / "trace"
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat,clone,clone3", "-o", str(log),
                        str(ckptconv), "-q", "convert", str(h5), "-o", str(out)], capture_output=True, text=True)
    if "ptrace" in r.stderr:
        pytest.fail(f"strace cannot trace here (ptrace denied): {r.stderr}")
    assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines()
    tool = lines[0].split()[0]
    # children forked by the tool (a clone without CLONE_VM; threads share the VM). Under load the
    # child runs before its parent's clone returns, and strace splits the call in two lines:
    # "clone(... <unfinished ...>" with the flags, then "<... clone resumed>...) = PID".
    forked, pending = set(), {}
    for line in lines:
        pid = line.split()[0]
        if "clone(" in line or "clone3(" in line:
            pending[pid] = "CLONE_VM" not in line
        if pid in pending and "= " in line and "<unfinished" not in line:
            if pid == tool and pending.pop(pid):
                forked.add(line.rsplit("= ", 1)[1].split()[0])
            pending.pop(pid, None)
    opens = [(line.split()[0], "O_NONBLOCK" in line) for line in lines if f'"{h5}"' in line and "openat(" in line]
    assert forked and any(pid in forked for pid, _ in opens), lines
    assert all(pid in forked or nonblock for pid, nonblock in opens), opens
    back = torch.load(out, weights_only=True)
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["n"]["b"], sd["n"]["b"])


def test_hdf5_mutants_never_kill_the_tool(repo, ckptconv):
    """Row 9 in small: 150 single-bit mutants, each inspected and converted;
    no signal death, no hang, no internal error (the full campaign is
    tools/hdf5_mutants.py --count 10000)."""
    r = subprocess.run([sys.executable, str(repo / "tools" / "hdf5_mutants.py"),
                        "--count", "150", "--seed", "3", "--binary", str(ckptconv)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "150 single-bit mutants" in r.stdout


def test_hdf5_sparse_dataset_declaring_4_tb_is_refused(tmp_path, run_ckptconv):
    """Row 6 for HDF5: a chunked dataset of 2^40 bytes with no chunk written
    (a 10 KB file) would read as terabytes of fill values."""
    import h5py
    src = tmp_path / "sparse.h5"
    with h5py.File(src, "w") as f:
        f.attrs["ckptconv.layout_version"] = 1
        f.attrs["ckptconv.kind"] = "dict"
        f.attrs["ckptconv.keys"] = '["w"]'
        d = f.create_dataset("w", shape=(2**28, 1024), dtype="<f4", chunks=(1, 1024))
        d.attrs["dtype"] = "float32"
    assert src.stat().st_size < 65536
    r = run_ckptconv("convert", src, "-o", tmp_path / "o.pt", timeout=HANG_GUARD_S)
    assert r.returncode == 3, r.stderr
    assert "declares 1099511627776 bytes" in r.stderr and "dataset 'w'" in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("shape,says", [((2**61, 3), "has 6917529027641081856 elements, whose bytes overflow 64 bits"),
                                        ((2**62, 4), "has more than 2^63 - 1 elements")])
def test_hdf5_dataset_shape_past_64_bits_names_the_dataset(shape, says, tmp_path, run_ckptconv):
    """A sparse dataset whose bytes (or elements) pass 2^64 was refused with
    a bare "dataset size overflows 64 bits" / "element count overflows 64
    bits", naming no dataset."""
    import h5py
    src = tmp_path / "huge.h5"
    with h5py.File(src, "w") as f:
        f.attrs["ckptconv.layout_version"] = 1
        f.attrs["ckptconv.kind"] = "dict"
        f.attrs["ckptconv.keys"] = '["w"]'
        f.create_dataset("w", shape=shape, dtype="<f4", chunks=(1, shape[1])).attrs["dtype"] = "float32"
    r = run_ckptconv("convert", src, "-o", tmp_path / "o.pt", timeout=HANG_GUARD_S)
    assert r.returncode == 3 and f"huge.h5: dataset 'w': shape ({shape[0]}, {shape[1]}) {says}" in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_safetensors_and_dcp_shapes_past_64_bits_name_the_tensor(tmp_path, run_ckptconv):
    """A safetensors header's or DCP .metadata's shape whose bytes pass 2^64
    was a bare "tensor size overflows 64 bits" / "element count overflows 64
    bits" naming no tensor (safetensors' own reader says "overflow")."""
    import struct

    from safetensors import SafetensorError
    from safetensors.torch import load_file

    body = json.dumps({"a": {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]}}).encode()
    st = tmp_path / "huge.safetensors"
    st.write_bytes(struct.pack("<Q", len(body)) + body)
    with pytest.raises(SafetensorError, match="overflow"):
        load_file(st)
    r = run_ckptconv("validate", st)
    assert r.returncode == 1 and "tensor 'a': shape (4611686018427387904, 4) holds more than 2^64 bytes" in r.stdout, \
        r.stdout + r.stderr
    d = tmp_path / "dcp"
    dcp.save({"w": torch.arange(4.0)}, checkpoint_id=str(d), no_dist=True)
    md = pickle.loads((d / ".metadata").read_bytes())
    md.state_dict_metadata["w"].size = torch.Size([2**62, 4])
    (d / ".metadata").write_bytes(pickle.dumps(md))
    says = "tensor 'w' of shape (4611686018427387904, 4) has more than 2^63 - 1 elements"
    r = run_ckptconv("validate", d)
    assert r.returncode == 1 and says in r.stdout, r.stdout + r.stderr
    for cmd in (["inspect", d], ["convert", d, "-o", tmp_path / "o.pt"]):
        r = run_ckptconv(*cmd)
        assert r.returncode == 3 and says in r.stderr and str(d) in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_hdf5_external_link_is_refused_unless_follow_links(tmp_path, run_ckptconv):
    """Item 4: an external link reads another file, wherever it names."""
    import h5py
    import numpy as np
    other = tmp_path / "elsewhere.h5"
    with h5py.File(other, "w") as f:
        d = f.create_dataset("secret", data=np.arange(4, dtype="<f4"))
        d.attrs["dtype"] = "float32"
    src = tmp_path / "linked.h5"
    with h5py.File(src, "w") as f:
        f.attrs["ckptconv.layout_version"] = 1
        f.attrs["ckptconv.kind"] = "dict"
        f.attrs["ckptconv.keys"] = '["w"]'
        f["w"] = h5py.ExternalLink(str(other), "/secret")
    r = run_ckptconv("inspect", src)
    assert r.returncode == 3, r.stderr
    assert "external link" in r.stderr and "--follow-links" in r.stderr
    r = run_ckptconv("inspect", src, "--follow-links")
    assert r.returncode == 0, r.stderr
    assert "float32" in r.stdout


@pytest.mark.parametrize("which", ["distcp", "metadata", "rank_file"])
def test_symlink_leaving_the_checkpoint_directory_is_refused(which, tmp_path, run_ckptconv, testdata):
    """Item 4: a file of a checkpoint directory that is a symlink to a file
    outside it reads something the user did not give: exit 3 unless
    --follow-links. A symlink inside the directory is fine."""
    outside = tmp_path / "outside"
    outside.mkdir()
    if which == "rank_file":
        src = tmp_path / "ranks"
        shutil.copytree(testdata / "fsdp_st" / "adamw_ws2", src)
        victim = src / "model_rank1.pt"
    else:
        src = tmp_path / "dcp"
        shutil.copytree(testdata / "dcp" / "fsdp2_adamw_ws2", src)
        victim = src / (".metadata" if which == "metadata" else "__1_0.distcp")
    shutil.move(victim, outside / victim.name)
    victim.symlink_to(outside / victim.name)
    args = ["consolidate", src, "-o", tmp_path / "o.pt"] + (["--only", "model"] if which == "rank_file" else [])
    r = run_ckptconv(*args)
    assert r.returncode == 3, r.stderr
    assert "outside the checkpoint directory" in r.stderr and victim.name in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()
    r = run_ckptconv(*args, "--follow-links")
    assert r.returncode == 0, r.stderr
    # a symlink that stays inside is read without the flag
    (tmp_path / "o.pt").unlink()
    shutil.move(outside / victim.name, src / ("real_" + victim.name if which != "rank_file" else "copy.bin"))
    victim.unlink()
    victim.symlink_to(src / ("real_" + victim.name if which != "rank_file" else "copy.bin"))
    assert run_ckptconv(*args).returncode == 0


def _shared_tuple_key_dag(depth: int) -> bytes:
    """Protocol 2: {k: 1} where k = ('lol',) and `depth` times k = (k, k), the
    second k a memo BINGET: about 6 bytes per level, 2^depth leaves. No
    Python object can be pickled this way (hashing the key on save would
    take 2^depth steps), so it is assembled opcode by opcode."""
    out = b"\x80\x02}q\x00X\x03\x00\x00\x00lolq\x01\x85q\x020"  # {} memo0; ('lol',) memo2, POP
    for level in range(depth):
        prev = 2 + level
        out += b"h" + bytes([prev]) + b"h" + bytes([prev]) + b"\x86q" + bytes([prev + 1]) + b"0"  # TUPLE2, memo, POP
    return out + b"h" + bytes([2 + depth]) + b"K\x01s."  # the last key, SETITEM k: 1, STOP


@pytest.mark.parametrize("depth", [28, 40])
def test_dict_key_of_shared_tuples_is_refused_at_once_naming_the_budget(depth, tmp_path, run_ckptconv):
    """#37 row 1: a 1.3 KB .pt whose dict key is a shared-tuple DAG grew RSS ~4x
    per level (depth 28: 15 s, 2 GB). Keys are bounded before they are
    expanded, hashed or compared: exit 3 naming the pickle-memory budget."""
    src = tmp_path / "keys.pt"
    pt_with_data_pkl(src, _shared_tuple_key_dag(depth))
    assert src.stat().st_size < 4096
    for args in (["inspect", src], ["validate", src], ["consolidate", src, "-o", tmp_path / "o.pt"], ["diff", src, src]):
        r = run_ckptconv(*args, timeout=HANG_GUARD_S)
        said = r.stdout + r.stderr  # validate reports on stdout
        assert r.returncode == 3, f"{args[0]}: exit {r.returncode}\n{said}"
        assert "a dict key expands to more than" in said and "pickle-memory" in said, said
    assert not (tmp_path / "o.pt").exists()


def test_dict_key_of_a_few_shared_tuples_still_reads(tmp_path, run_ckptconv):
    """Sharing within a key is fine when it stays small: depth 6 (64 leaves)."""
    src = tmp_path / "keys.pt"
    pt_with_data_pkl(src, _shared_tuple_key_dag(6))
    r = run_ckptconv("inspect", src)
    assert r.returncode == 0, r.stderr


def test_hdf5_dict_listing_a_key_twice_is_an_input_fault(tmp_path, run_ckptconv, testdata):
    """#37 row 8: ckptconv.keys ["w", "w", "w"] validated (exit 0) and then
    failed to write as .h5 (exit 4, 'unable to create link'). A dict has each
    key once: exit 3, and validate reports it as a problem (exit 1)."""
    import h5py
    src = tmp_path / "twice.h5"
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", src, "--only", "model")
    assert r.returncode == 0, r.stderr
    with h5py.File(src, "r+") as f:
        first = json.loads(f.attrs["ckptconv.keys"])[0]
        f.attrs["ckptconv.keys"] = json.dumps([first, first, first])
    for args in (["validate", src], ["consolidate", src, "-o", tmp_path / "o.h5"], ["inspect", src]):
        r = run_ckptconv(*args)
        said = r.stdout + r.stderr
        assert r.returncode == (1 if args[0] == "validate" else 3), f"{args[0]}: {said}"
        assert "lists the key" in said and "twice" in said, said
    assert not (tmp_path / "o.h5").exists()


def test_a_key_with_a_nul_byte_is_escaped_in_hdf5(tmp_path, run_ckptconv):
    """torch.save keeps a key holding a NUL byte. HDF5 takes names as C
    strings, so 'a\\x00b' was created as 'a' (and a key starting with NUL as
    the empty name: exit 4). Escaped as %00, h5py reads each under its own
    name and the keys come back whole."""
    import h5py

    src = tmp_path / "s.pt"
    torch.save({"a\x00b": torch.ones(2), "\x00nul": torch.arange(3), "a": torch.zeros(1)}, src)
    out = tmp_path / "o.h5"
    r = run_ckptconv("convert", src, "-o", out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out, "r") as f:
        assert sorted(f.keys()) == ["%00nul", "a", "a%00b"]
        assert f["a%00b"][()].tolist() == [1.0, 1.0] and f["%00nul"][()].tolist() == [0, 1, 2]
    r = run_ckptconv("convert", out, "-o", tmp_path / "back.pt")
    assert r.returncode == 0, r.stderr
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert list(back) == ["a\x00b", "\x00nul", "a"]
    assert torch.equal(back["a\x00b"], torch.ones(2)) and torch.equal(back["\x00nul"], torch.arange(3))


def test_a_name_with_a_lone_surrogate_is_no_internal_error(tmp_path, run_ckptconv):
    """Python pickles a str holding a lone surrogate ('surrogatepass'), so
    torch.save keeps such a key; JSON cannot hold it. A safetensors output,
    inspect --json and diff --json had died with an internal error (exit 5)."""
    from safetensors.torch import save_file

    src = tmp_path / "s.pt"
    torch.save({"a\ud800b": torch.ones(2), "w": torch.zeros(3)}, src)
    with pytest.raises(Exception):
        save_file({"a\ud800b": torch.ones(2)}, tmp_path / "lib.safetensors")  # safetensors' own writer refuses it
    r = run_ckptconv("convert", src, "-o", tmp_path / "o.safetensors")
    assert r.returncode == 3 and "not valid UTF-8" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert not (tmp_path / "o.safetensors").exists()
    for cmd in (["convert", src, "-o", tmp_path / "o.h5"],  # names kept as JSON too
                ["reshard", src, "-o", tmp_path / "hf", "--world-size", "2", "--layout", "hf"]):
        r = run_ckptconv(*cmd)
        assert r.returncode == 3 and "not valid UTF-8" in r.stderr and "internal error" not in r.stderr, r.stderr
        assert not cmd[3].exists() and not list(tmp_path.glob("*tmp-*"))
    r = run_ckptconv("convert", src, "-o", tmp_path / "o.pt")  # .pt holds it, as torch does
    assert r.returncode == 0, r.stderr
    assert torch.equal(torch.load(tmp_path / "o.pt", weights_only=True)["a\ud800b"], torch.ones(2))
    r = run_ckptconv("inspect", src, "--json")
    assert r.returncode == 0, r.stderr
    paths = [t["path"] for t in json.loads(r.stdout)["tensors"]]
    assert "w" in paths and any(p[0] == "a" and p[-1] == "b" and "\ufffd" in p for p in paths), paths
    r = run_ckptconv("diff", src, src, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["equal"] is True, r.stdout + r.stderr


def test_a_tensor_named_metadata_is_refused_by_safetensors_outputs(tmp_path, run_ckptconv):
    """`__metadata__` is the one name a safetensors header reserves. A tensor
    under it replaced the header's metadata: the file was written with exit 0
    and every reader refused it (safetensors' load_file as ckptconv's own).
    safetensors' save_file writes such a file too; ckptconv refuses it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    save_file({"__metadata__": torch.ones(2)}, tmp_path / "lib.safetensors")
    with pytest.raises(SafetensorError):
        load_file(tmp_path / "lib.safetensors")
    src = tmp_path / "m.pt"
    torch.save({"__metadata__": torch.ones(2), "w": torch.zeros(3)}, src)
    for cmd in (["convert", src, "-o", tmp_path / "o.safetensors"],
                ["convert", src, "-o", tmp_path / "sharded.safetensors", "--max-shard-size", "8"],
                ["reshard", src, "-o", tmp_path / "hf", "--world-size", "2", "--layout", "hf"]):
        r = run_ckptconv(*cmd)
        assert r.returncode == 3 and "tensor '__metadata__'" in r.stderr and "reserves" in r.stderr, r.stderr
        assert not cmd[3].exists() and not list(tmp_path.glob("*tmp-*")), list(tmp_path.iterdir())
    assert not list(tmp_path.glob("sharded*"))
    nested = tmp_path / "nested.pt"  # a dotted path ending in the name is an ordinary name
    torch.save({"model": {"__metadata__": torch.ones(2)}}, nested)
    assert run_ckptconv("convert", nested, "-o", tmp_path / "n.safetensors").returncode == 0
    assert torch.equal(load_file(tmp_path / "n.safetensors")["model.__metadata__"], torch.ones(2))
    r = run_ckptconv("convert", src, "-o", tmp_path / "o.pt")  # .pt and .h5 hold it
    assert r.returncode == 0 and torch.equal(torch.load(tmp_path / "o.pt", weights_only=True)["__metadata__"],
                                             torch.ones(2))


@pytest.mark.parametrize("lead", [b" ", b"\n\t\r "])
def test_a_safetensors_header_starting_with_whitespace_is_read(lead, tmp_path, run_ckptconv):
    """safetensors parses the header with serde_json, which skips JSON
    whitespace before the '{': such a file loads there; ckptconv had called
    it 'not a recognised checkpoint file' (exit 3)."""
    import struct

    from safetensors.torch import load_file

    header = lead + json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    src = tmp_path / "lead.safetensors"
    src.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.5, -2.0))
    assert torch.equal(load_file(src)["w"], torch.tensor([1.5, -2.0]))
    assert run_ckptconv("validate", src).returncode == 0
    r = run_ckptconv("convert", src, "-o", tmp_path / "out.pt")
    assert r.returncode == 0, r.stderr
    assert torch.equal(torch.load(tmp_path / "out.pt", weights_only=True)["w"], torch.tensor([1.5, -2.0]))


def test_json_followed_by_a_nul_byte_is_not_valid(tmp_path, run_ckptconv):
    """nlohmann's lexer takes a NUL byte for the end of its input: a
    safetensors header '{...}' padded with NULs, or an index followed by NUL
    and anything, read and validated (VALID, exit 0) where safetensors and
    json.loads (transformers) refuse the file."""
    import struct

    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode() + b"\0\0"
    padded = tmp_path / "padded.safetensors"
    padded.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.0, 2.0))
    with pytest.raises(SafetensorError, match="trailing characters"):
        load_file(padded)
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, folder / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
    (folder / "model.safetensors.index.json").write_bytes(json.dumps(index).encode() + b"\0garbage")
    with pytest.raises(json.JSONDecodeError):
        json.loads((folder / "model.safetensors.index.json").read_text())
    for src, at in ((padded, len(header) - 2), (folder, len(json.dumps(index)))):
        r = run_ckptconv("validate", src)
        assert r.returncode != 0 and f"is not valid JSON: a NUL byte at offset {at}" in r.stdout, r.stdout + r.stderr
        r = run_ckptconv("convert", src, "-o", tmp_path / "out.pt")
        assert r.returncode == 3 and "a NUL byte" in r.stderr, r.stderr
        assert not (tmp_path / "out.pt").exists()
