"""Integrity (#18): inputs whose format records say "read me differently" are
refused instead of read as the usual case, so no command returns exit 0 with
wrong values; and an output may never be, contain or lie inside an input."""

from __future__ import annotations

import pickle
import re
import shutil
import zipfile
from pathlib import Path

import pytest
from pt_files import pt_with_data_pkl, replace_record, save_big_endian

import torch
import torch.distributed.checkpoint as dcp

COMMANDS = ("inspect", "validate", "consolidate")


def _run_all(run_ckptconv, src: Path, tmp_path: Path) -> list:
    out = []
    for cmd in COMMANDS:
        args = [cmd, src] + (["-o", tmp_path / "out.pt"] if cmd == "consolidate" else [])
        out.append(run_ckptconv(*args))
    assert not (tmp_path / "out.pt").exists()
    return out


@pytest.mark.parametrize("record, value, says", [
    ("byteorder", b"middle", "byteorder 'middle' is neither 'little' nor 'big'"),
    (".format_version", b"999", ".format_version '999'"),
    ("version", b"999\n", "archive version '999'"),
])
def test_format_records_torch_would_read_differently_are_refused(record, value, says, tmp_path, run_ckptconv):
    pt = tmp_path / "in.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3)}, pt)
    replace_record(pt, record, value)
    for r in _run_all(run_ckptconv, pt, tmp_path):
        assert r.returncode == 3, r.stdout + r.stderr
        assert says in r.stdout + r.stderr and str(pt) in r.stdout + r.stderr


def test_big_byteorder_is_what_torch_byte_swaps(tmp_path):
    """The control: torch reads a file marked big-endian by swapping, so
    reading its bytes as little-endian would give other values."""
    pt = tmp_path / "in.pt"
    torch.save({"w": torch.tensor([1.0, 2.0])}, pt)
    replace_record(pt, "byteorder", b"big")
    got = torch.load(pt, weights_only=True)["w"]
    assert not torch.equal(got, torch.tensor([1.0, 2.0]))


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        elif isinstance(v, torch.Tensor):
            yield f"{prefix}{k}", v


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))


def test_big_endian_pt_reads_as_torch_reads_it(tmp_path, run_ckptconv, testdata):
    """Row 1: a torch.save file with byteorder 'big' (what torch writes on
    s390x) holds byte-reversed elements, which torch.load swaps back; so does
    ckptconv, for every dtype (complex per float, one-byte types untouched),
    views sharing a storage, a transposed view, 0-dim and empty tensors, and
    every output and command that reads values. torch swaps a storage by the
    dtype of its class, and UntypedStorage (uint16/32/64, float8) counts as
    uint8: those bytes are read as stored, by torch and by ckptconv."""
    original = torch.load(testdata / "pt" / "dtypes.pt", weights_only=True)
    be = tmp_path / "be.pt"
    save_big_endian(original, be)
    want = dict(_flat(torch.load(be, weights_only=True)))
    assert all(_bits_equal(want[k], v) for k, v in _flat(original))  # the control: torch reads it back swapped
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", be, "-o", out)
    assert r.returncode == 0, r.stderr
    got = dict(_flat(torch.load(out, weights_only=True)))
    assert got.keys() == want.keys()
    for k in want:
        assert _bits_equal(got[k], want[k]), k
    h5 = tmp_path / "out.h5"
    assert run_ckptconv("consolidate", be, "-o", h5).returncode == 0
    assert run_ckptconv("diff", be, testdata / "pt" / "dtypes.pt").returncode == 0
    assert run_ckptconv("diff", h5, testdata / "pt" / "dtypes.pt").returncode == 0
    r = run_ckptconv("validate", be, "--finite")
    assert r.returncode == 0, r.stdout + r.stderr
    cast = tmp_path / "bf16.pt"
    assert run_ckptconv("consolidate", be, "-o", cast, "--dtype", "bf16").returncode == 0
    got = dict(_flat(torch.load(cast, weights_only=True)))
    for k, v in want.items():
        assert _bits_equal(got[k], v.to(torch.bfloat16) if v.is_floating_point() else v), k


def test_dcp_metadata_of_an_unknown_version_is_refused(tmp_path, run_ckptconv):
    d = tmp_path / "ck"
    dcp.save({"w": torch.arange(4.0)}, checkpoint_id=str(d), no_dist=True)
    md = pickle.loads((d / ".metadata").read_bytes())
    md.version = "999"
    (d / ".metadata").write_bytes(pickle.dumps(md))
    for r in _run_all(run_ckptconv, d, tmp_path):
        assert r.returncode == 3, r.stdout + r.stderr
        assert "DCP metadata version '999'" in r.stdout + r.stderr


def test_big_endian_hdf5_dataset_is_refused(tmp_path, run_ckptconv, testdata):
    import h5py
    import numpy as np
    h5 = tmp_path / "le.h5"
    assert run_ckptconv("convert", testdata / "pt" / "dtypes.pt", "-o", h5).returncode == 0
    be = tmp_path / "be.h5"
    shutil.copy(h5, be)
    with h5py.File(be, "r+") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and o.dtype == np.float32 else None)
        name = names[0]
        data, attrs = f[name][()], dict(f[name].attrs)
        del f[name]
        f.create_dataset(name, data=data.astype(">f4"))
        for k, v in attrs.items():
            f[name].attrs[k] = v
        assert f[name].dtype.byteorder == ">"
    for r in _run_all(run_ckptconv, be, tmp_path):
        assert r.returncode == 3, r.stdout + r.stderr
        assert "big-endian float32 data is not supported" in r.stdout + r.stderr


def _tree_digest(root: Path) -> dict:
    import hashlib
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", ["metadata", "parent", "itself", "via_symlink", "same_file", "rank_dir"])
def test_output_that_is_contains_or_lies_inside_an_input_is_refused(case, tmp_path, run_ckptconv, testdata):
    """Row 8: `consolidate ck -o ck/.metadata --force` overwrote the input's
    .metadata, `reshard ck/step -o ck --force` deleted the source."""
    ck = tmp_path / "ck"
    step = ck / "step"
    shutil.copytree(testdata / "dcp" / "fsdp2_adamw_ws2", step)
    shutil.copytree(testdata / "fsdp_st" / "adamw_ws2", tmp_path / "ranks")
    shutil.copy(testdata / "pt" / "dtypes.pt", tmp_path / "d.pt")
    (tmp_path / "link").symlink_to(ck)
    args = {
        "metadata": ["consolidate", step, "-o", step / ".metadata", "--format", "pt"],
        "parent": ["reshard", step, "-o", ck, "--world-size", "2"],
        "itself": ["reshard", step, "-o", step, "--world-size", "3"],
        "via_symlink": ["consolidate", tmp_path / "link" / "step", "-o", step / "full.pt"],
        "same_file": ["convert", tmp_path / "d.pt", "-o", tmp_path / "d.pt"],
        "rank_dir": ["reshard", tmp_path / "ranks", "-o", tmp_path, "--world-size", "2"],
    }[case]
    before = _tree_digest(tmp_path)
    for extra in ([], ["--force"]):
        r = run_ckptconv(*args, *extra)
        assert r.returncode == 2, r.stderr
        if extra or "output exists" not in r.stderr:  # without --force an existing directory stops it first
            assert "the input" in r.stderr and "write it elsewhere" in r.stderr, r.stderr
    assert _tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["pt", "safetensors", "h5", "reshard"])
def test_legal_249_character_output_name(kind, tmp_path, run_ckptconv, testdata):
    """Row 11: OUT.tmp-XXXXXX exceeded NAME_MAX (exit 4) for names over 244 bytes."""
    src = testdata / "dcp" / "fsdp2_adamw_ws2"
    if kind == "reshard":
        out = tmp_path / ("d" * 249)
        r = run_ckptconv("reshard", src, "-o", out, "--world-size", "2")
        assert r.returncode == 0, r.stderr
        assert (out / ".metadata").is_file()
    else:
        out = tmp_path / ("m" * (249 - len(kind) - 1) + "." + kind)
        assert len(out.name) == 249
        r = run_ckptconv("consolidate", src, "-o", out)
        assert r.returncode == 0, r.stderr
        assert out.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temp left


def test_failures_the_input_causes_are_exit_3(tmp_path, run_ckptconv):
    """Row 12: 3 for anything the input caused, 4 only for output failures,
    5 only for bugs (these were 5 and 2)."""
    # collections.OrderedDict.__new__ with kwargs (NEWOBJ_EX, protocol 4)
    odict = tmp_path / "newobj_ex.pt"
    pt_with_data_pkl(odict, b"\x80\x04\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93)}\x8c\x01a\x94K\x01s\x92.")
    bare = tmp_path / "bare.pt"
    torch.save(torch.arange(6.0), bare)
    cases = [(["inspect", odict], "OrderedDict.__new__"),
             (["consolidate", odict, "-o", tmp_path / "a.pt"], "OrderedDict.__new__"),
             (["convert", bare, "-o", tmp_path / "b.h5"], "HDF5 output needs a dict or list")]
    for args, says in cases:
        r = run_ckptconv(*args)
        assert r.returncode == 3 and says in r.stderr, (args, r.returncode, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.pt", "newobj_ex.pt"]


def test_sharded_safetensors_output_appears_whole_or_not_at_all(tmp_path, ckptconv):
    """Row 9: a small first shard and a large second one under a file-size
    limit (SIGXFSZ ignored: writes fail with EFBIG, as on a full disk). The
    first shard used to stay in place; now no file of the output does."""
    import subprocess
    src = tmp_path / "in.pt"
    torch.save({"a": torch.arange(8.0), "b": torch.zeros(64 * 1024)}, src)  # b: 256 KiB
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "m.safetensors"
    r = subprocess.run(["bash", "-c", f"trap '' XFSZ; ulimit -f 64; exec '{ckptconv}' convert '{src}' -o '{out}' "
                        "--max-shard-size 1K"], capture_output=True, text=True)
    assert r.returncode == 4, r.stderr
    assert "m-00002-of-00002.safetensors" in r.stderr
    assert list(out_dir.iterdir()) == []
    # without the limit the same command writes both shards and the index
    r = subprocess.run([str(ckptconv), "convert", str(src), "-o", str(out), "--max-shard-size", "1K"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["m-00001-of-00002.safetensors",
                                                         "m-00002-of-00002.safetensors", "m.safetensors.index.json"]


def _flip_inside(path: Path, pattern: bytes) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(pattern)
    assert at >= 0 and data.find(pattern, at + 1) < 0, "pattern not found once"
    data[at + len(pattern) // 2] ^= 0x01
    path.write_bytes(bytes(data))


MARK = torch.arange(64.0) + 1234.5  # its first 32 bytes occur once in a file, inside the tensor's record


@pytest.mark.parametrize("kind", ["pt", "dcp", "ranks"])
def test_a_flipped_byte_in_a_tensor_is_caught_by_consolidate_and_reshard(kind, tmp_path, run_ckptconv, testdata):
    """Rows 4-5: consolidate, convert and reshard check the CRC-32 of every
    source record they read (validate did, they copied the corruption and its
    stale CRC into the output with exit 0); --no-verify skips the check."""
    pattern = MARK.numpy().tobytes()[:32]
    if kind == "pt":
        src = tmp_path / "in.pt"
        torch.save({"w": MARK, "v": torch.arange(3.0)}, src)
        victim = src
    elif kind == "dcp":
        src = tmp_path / "ck"
        dcp.save({"w": MARK, "v": torch.arange(3.0)}, checkpoint_id=str(src), no_dist=True)
        victim = next(src.glob("*.distcp"))
    else:
        src = tmp_path / "ranks"
        shutil.copytree(testdata / "fsdp_st" / "adamw_ws2", src)
        victim = src / "model_rank1.pt"
        pattern = None
    if pattern is None:  # the rank file: flip inside its first storage record
        with zipfile.ZipFile(victim) as z:
            info = next(i for i in z.infolist() if "/data/" in i.filename)
        data = bytearray(victim.read_bytes())
        h = info.header_offset  # the local header's own name and extra lengths (torch pads the extra field)
        start = h + 30 + int.from_bytes(data[h + 26:h + 28], "little") + int.from_bytes(data[h + 28:h + 30], "little")
        data[start] ^= 0x01
        victim.write_bytes(bytes(data))
    else:
        _flip_inside(victim, pattern)
    out = tmp_path / "out"
    out.mkdir()
    # The last two gather and cast: the record's CRC-32 is summed piece by
    # piece as it is gathered (exec/tensor_copy's PieceCrcs), not re-read.
    for args in (["consolidate", src, "-o", out / "a.pt"], ["consolidate", src, "-o", out / "a.safetensors"],
                 ["reshard", src, "-o", out / "d", "--world-size", "2", "--layout", "dcp"],
                 ["consolidate", src, "-o", out / "c.pt", "--dtype", "bf16"],
                 ["consolidate", src, "-o", out / "f.pt", "--finite"]):
        r = run_ckptconv(*args)
        assert r.returncode == 3, (args, r.stderr)
        assert "fails its CRC-32" in r.stderr and victim.name in r.stderr, r.stderr
        if kind == "ranks":
            assert "(rank 1)" in r.stderr
    assert list(out.iterdir()) == []
    # A --part worker: the parts of split records are summed as they are
    # copied (RecordVerifier::add_piece) and checked before the receipt.
    r = run_ckptconv("reshard", src, "-o", out / "p", "--world-size", "3", "--layout", "dcp", "--part", "0/1")
    assert r.returncode == 3 and "fails its CRC-32" in r.stderr, r.stderr
    assert not (out / "p").exists() and not list(out.glob("p.parts-*/part-*.json"))  # no receipt vouches for it
    r = run_ckptconv("consolidate", src, "-o", out / "b.pt", "--no-verify")
    assert r.returncode == 0, r.stderr


def test_a_corrupt_data_pkl_is_exit_3_not_laundered(tmp_path, run_ckptconv):
    """Row 5: a data.pkl failing its CRC was decoded and its output validated clean."""
    src = tmp_path / "in.pt"
    torch.save({"w": torch.arange(3.0), "note": "abcdefgh"}, src)
    _flip_inside(src, b"abcdefgh")
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "o.pt")
    assert r.returncode == 3 and "data.pkl" in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()


def _stored_zip(records: list[tuple[str, bytes]], overlap: tuple[str, str] | None = None) -> bytes:
    """A stored (uncompressed) zip of `records`, written by hand. With
    overlap=(outer, inner), record `inner` (local header and data) is laid
    out inside the data of record `outer`, so the two share bytes."""
    import struct
    import zlib

    def local(name: bytes, data: bytes) -> bytes:
        return struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, zlib.crc32(data), len(data), len(data),
                           len(name), 0) + name + data

    body, central, offsets = b"", [], {}
    inner = dict(records)[overlap[1]] if overlap else None
    for name, data in records:
        if overlap and name == overlap[1]:
            continue
        n = name.encode()
        if overlap and name == overlap[0]:
            data = local(overlap[1].encode(), inner)  # the inner record is this record's data
            offsets[overlap[1]] = len(body) + 30 + len(n)
        offsets[name] = len(body)
        body += local(n, data)
        central.append((n, data if not (overlap and name == overlap[0]) else data))
    if overlap:
        central.append((overlap[1].encode(), inner))
    cd = b""
    for n, data in central:
        cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0, zlib.crc32(data), len(data),
                          len(data), len(n), 0, 0, 0, 0, 0, offsets[n.decode()]) + n
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), len(cd), len(body), 0)
    return body + cd + eocd


def test_dcp_items_sharing_bytes_and_zip_records_sharing_bytes_are_refused(tmp_path, run_ckptconv):
    """Row 6: two DCP items pointing at the same stored bytes (consolidate wrote
    the rows twice with exit 0), and a .pt whose records share bytes: every
    command refuses them (exit 3), validate reports them (exit 1 or 3)."""
    d = tmp_path / "ck"
    dcp.save({"a": torch.arange(4.0), "b": torch.arange(4.0) + 10}, checkpoint_id=str(d), no_dist=True)
    md = pickle.loads((d / ".metadata").read_bytes())
    keys = sorted(md.storage_data, key=lambda k: k.fqn)
    md.storage_data[keys[1]] = md.storage_data[keys[0]]  # b's item now reads a's bytes
    (d / ".metadata").write_bytes(pickle.dumps(md))
    pt = tmp_path / "overlap.pt"
    import io
    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        records = [(i.filename, z.read(i)) for i in z.infolist()]
    data_pkl = next(n for n, _ in records if n.endswith("/data.pkl"))
    data_0 = next(n for n, _ in records if n.endswith("/data/0"))
    pt.write_bytes(_stored_zip(records, overlap=(data_pkl, data_0)))
    for src, says in ((d, "overlap those of"), (pt, "shares bytes with record")):
        for cmd in ("consolidate", "inspect", "validate"):
            args = [cmd, src] + (["-o", tmp_path / "o.pt"] if cmd == "consolidate" else [])
            r = run_ckptconv(*args)
            assert r.returncode in ((1, 3) if cmd == "validate" else (3,)), (cmd, src, r.stdout, r.stderr)
            assert says in r.stdout + r.stderr, (cmd, src, r.stdout + r.stderr)
    assert not (tmp_path / "o.pt").exists()


def test_planner_data_path_naming_another_key_is_refused(tmp_path, run_ckptconv):
    """Row 6: a planner_data path that does not match its key (torch's own
    loader refuses it) was read, the value placed where the path said."""
    d = tmp_path / "ck"
    dcp.save({"model": {"w": torch.arange(4.0), "v": torch.arange(2.0)}}, checkpoint_id=str(d), no_dist=True)
    md = pickle.loads((d / ".metadata").read_bytes())
    md.planner_data["model.w"] = ("model", "x")
    (d / ".metadata").write_bytes(pickle.dumps(md))
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")
    assert r.returncode == 3 and "the planner_data path of 'model.w' names 'model.x'" in r.stderr, r.stderr
    r = run_ckptconv("validate", d)
    assert r.returncode == 1 and "names 'model.x', another key" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("at, bit, says", [(32, 1, "coordinate off the chunk grid"),
                                           (6, 1, "chunk index holds 3 chunks where its extent needs 1")])
def test_hdf5_corrupt_chunk_index_is_refused(at, bit, says, tmp_path, run_ckptconv, ckptconv):
    """Found by tools/mutate.py: Debian's libhdf5 1.10 read damaged chunk
    indexes into other values with exit 0 (h5py's newer libhdf5 refuses them:
    'bad coordinate offset'). Uncompressed outputs are contiguous now, so the
    file is the gzip-compressed (chunked) output of the mutation tool's
    fixture; the offsets are in its chunk B-tree node (a node's entry count,
    the first key's coordinate), counted from the node's signature."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import mutate
    h5 = tmp_path / "model.h5"
    r = run_ckptconv("convert", mutate.SIMPLE_PT, "--keys", r"^model\.", "--compression", "gzip", "-o", h5, "-q")
    assert r.returncode == 0, r.stderr
    data = bytearray(h5.read_bytes())
    # the node both offsets are in: "TREE", then its type, 1 for raw data chunks
    node = next(m.start() for m in re.finditer(b"TREE", data) if data[m.start() + 4] == 1)
    data[node + at] ^= 1 << bit
    h5.write_bytes(bytes(data))
    r = run_ckptconv("consolidate", h5, "-o", tmp_path / "o.safetensors")
    assert r.returncode == 3 and says in r.stderr, r.stderr
    assert not (tmp_path / "o.safetensors").exists()
