"""safetensors (and HDF5) outputs of every fixture family, read back by the
libraries users read them with, and converted back to .pt."""
import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from state_compare import assert_same, cast_floats

REPO = Path(__file__).resolve().parent.parent
TD = REPO / "testdata"
DCP_DIRS = sorted({p.parent for p in (TD / "dcp").glob("*/.metadata")} |
                  {p.parent for p in (TD / "dcp").glob("*/__0.metadata")})
RANK_DIRS = sorted(p for fam in ("fsdp_st", "fsdp_dt") for p in (TD / fam).iterdir() if p.is_dir())
DTYPES_PT = TD / "pt" / "dtypes.pt"
# veRL's FSDP1 optimizer files hold flat parameters and cannot be consolidated; its model files can.
VERL = TD / "fsdp_dt" / "verl_flat_ws2"


def reference(src):
    if src == DTYPES_PT:
        return torch.load(src, weights_only=True)
    if src.parent.name == "dcp":
        return torch.load(src.parent / (src.name + ".ref.pt"), weights_only=True)
    if src == VERL:
        return torch.load(src / "model_full.pt", weights_only=True)
    return {"model": torch.load(src / "model_full.pt", weights_only=True),
            "optim": torch.load(src / "optim_full.pt", weights_only=True)}


SOURCES = [*DCP_DIRS, *RANK_DIRS, DTYPES_PT]
ids = lambda p: f"{p.parent.name}/{p.name}"  # noqa: E731


def source_args(src):
    return ["--only", "model"] if src == VERL else []


def safetensors_source(src, tmp_path):
    """(SRC, its reference) for safetensors, which has no complex128: the
    dtypes fixture is re-saved by torch without it."""
    ref = reference(src)
    if src != DTYPES_PT:
        return src, ref
    del ref["tensors"]["complex128"]
    torch.save(ref, tmp_path / "dtypes_no_c128.pt")
    return tmp_path / "dtypes_no_c128.pt", ref


def key_order_known(src):
    """As in test_dcp_consolidate: torch's reference of a per-rank-metadata DCP
    directory orders optimizer state keys differently from the saved state dict."""
    return not (src.parent.name == "dcp" and not (src / ".metadata").exists())


def is_container(v):
    return isinstance(v, (dict, list, tuple, torch.Tensor))


def leaves(v, path=""):
    """(dotted path, leaf) the way ckptconv names them (model/tree_walk.h):
    dicts and lists holding containers are walked, lists of plain values are one leaf."""
    join = lambda k: f"{path}.{k}" if path else str(k)  # noqa: E731
    if isinstance(v, dict) and v:
        for k, c in v.items():
            yield from leaves(c, join(k))
    elif isinstance(v, (list, tuple)) and any(is_container(i) for i in v):
        for i, c in enumerate(v):
            yield from leaves(c, join(i))
    else:
        yield path, v


def flat_tensors(sd):
    return {p: v for p, v in leaves(sd) if isinstance(v, torch.Tensor)}


def to_json(v):
    """model/value_json.h for plain values."""
    if isinstance(v, tuple):
        return {"__tuple__": [to_json(i) for i in v]}
    if isinstance(v, list):
        return [to_json(i) for i in v]
    if isinstance(v, dict):
        return {k: to_json(c) for k, c in v.items()}
    return v


def flat_values(sd):
    return {p: to_json(v) for p, v in leaves(sd) if not isinstance(v, torch.Tensor)}


def run_ok(run_ckptconv, *args):
    r = run_ckptconv(*map(str, args))
    assert r.returncode == 0, r.stderr
    return r


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, f.read(n)


def assert_tensors_equal(got, expected):
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert_same(got[k], v, k)


# ---- safetensors ---------------------------------------------------------------

@pytest.mark.parametrize("src", SOURCES, ids=ids)
def test_safetensors_loads_in_safetensors_equal_to_reference(src, tmp_path, run_ckptconv):
    out = tmp_path / "out.safetensors"
    path, ref = safetensors_source(src, tmp_path)
    run_ok(run_ckptconv, "consolidate", path, "-o", out, *source_args(src))
    assert_tensors_equal(load_file(out), flat_tensors(ref))
    from safetensors import safe_open
    with safe_open(out, framework="pt") as f:
        md = f.metadata()
    assert md["format"] == "pt"
    assert json.loads(md["ckptconv.values"]) == flat_values(ref)


@pytest.mark.parametrize("src", SOURCES, ids=ids)
def test_pt_to_safetensors_to_pt_round_trips(src, tmp_path, run_ckptconv):
    pt, st, back = tmp_path / "a.pt", tmp_path / "b.safetensors", tmp_path / "c.pt"
    path, ref = safetensors_source(src, tmp_path)
    run_ok(run_ckptconv, "consolidate", path, "-o", pt, *source_args(src))
    run_ok(run_ckptconv, "convert", pt, "-o", st)
    run_ok(run_ckptconv, "convert", st, "-o", back)
    assert_same(torch.load(back, weights_only=True), ref, key_order=key_order_known(src))


def test_safetensors_header_is_laid_out_like_safetensors_own_writer(tmp_path, run_ckptconv):
    from safetensors.torch import save_file

    src, _ = safetensors_source(DTYPES_PT, tmp_path)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    run_ok(run_ckptconv, "consolidate", src, "-o", ours)
    n, raw = header(ours)
    assert n % 8 == 0 and raw.rstrip(b" ").endswith(b"}")
    hdr = json.loads(raw)
    metadata = hdr.pop("__metadata__")
    save_file({k: v.contiguous() for k, v in load_file(ours).items()}, theirs, metadata=metadata)
    # Same tensor order, offsets and data bytes: safetensors sorts by dtype then
    # name. (Its __metadata__ key order comes from a hash map, so compare parsed.)
    n2, raw2 = header(theirs)
    hdr2 = json.loads(raw2)
    assert hdr2.pop("__metadata__") == metadata
    assert list(hdr.items()) == list(hdr2.items())
    assert n == n2 and ours.read_bytes()[8 + n:] == theirs.read_bytes()[8 + n2:]


def test_safetensors_refuses_a_dtype_it_lacks(tmp_path, run_ckptconv):
    out = tmp_path / "out.safetensors"
    r = run_ckptconv("consolidate", DTYPES_PT, "-o", out)
    assert r.returncode == 2
    assert "complex128" in r.stderr and "safetensors has no dtype" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_sharded_safetensors_load_through_the_index(tmp_path, run_ckptconv):
    src = TD / "dcp" / "fsdp2_adamw_ws3"
    out = tmp_path / "model.safetensors"
    run_ok(run_ckptconv, "consolidate", src, "-o", out, "--max-shard-size", "1K")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and not out.exists()
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    got = {}
    for name in files:
        part = load_file(tmp_path / name)
        assert all(index["weight_map"][k] == name for k in part)
        nbytes = sum(v.numel() * v.element_size() for v in part.values())
        assert nbytes <= 1024 or len(part) == 1
        got.update(part)
    ref = flat_tensors(reference(src))
    assert_tensors_equal(got, ref)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in ref.values())
    # The index as SRC: the shards are one checkpoint again, nesting and values included.
    run_ok(run_ckptconv, "convert", tmp_path / "model.safetensors.index.json", "-o", tmp_path / "back.pt")
    assert_same(torch.load(tmp_path / "back.pt", weights_only=True), reference(src))


def test_index_naming_a_file_outside_its_folder_is_refused(tmp_path, run_ckptconv):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"w": "../elsewhere.safetensors"}}))
    r = run_ckptconv("convert", index, "-o", tmp_path / "x.pt")
    assert r.returncode == 3
    assert "../elsewhere.safetensors" in r.stderr and "not a file beside the index" in r.stderr


def test_foreign_safetensors_file_converts_and_inspects(tmp_path, run_ckptconv):
    from safetensors.torch import save_file

    tensors = {"b.weight": torch.randn(3, 4), "a": torch.arange(6, dtype=torch.int16).reshape(2, 3),
               "h": torch.randn(5).to(torch.bfloat16)}
    st = tmp_path / "hf.safetensors"
    save_file(tensors, st, metadata={"format": "pt"})
    info = json.loads(run_ok(run_ckptconv, "inspect", st, "--json").stdout)
    assert {t["path"]: t["shape"] for t in info["tensors"]} == {k: list(v.shape) for k, v in tensors.items()}
    run_ok(run_ckptconv, "convert", st, "-o", tmp_path / "x.pt")
    assert_tensors_equal(torch.load(tmp_path / "x.pt", weights_only=True), tensors)


def test_null_metadata_reads_as_none(tmp_path, run_ckptconv):
    """safetensors reads "__metadata__": null as no metadata (an
    Option<HashMap>); ckptconv refused the file ("__metadata__ is not an
    object"), validate said INVALID."""
    from safetensors import safe_open

    body = json.dumps({"__metadata__": None, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    st = tmp_path / "null.safetensors"
    st.write_bytes(struct.pack("<Q", len(body)) + body + struct.pack("<2f", 1.5, -2.0))
    with safe_open(st, "pt") as f:
        assert f.metadata() is None and torch.equal(f.get_tensor("w"), torch.tensor([1.5, -2.0]))
    r = run_ckptconv("validate", st)
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr
    run_ok(run_ckptconv, "convert", st, "-o", tmp_path / "x.pt")
    assert_tensors_equal(torch.load(tmp_path / "x.pt", weights_only=True), load_file(st))


def corrupt_overlap(raw):
    hdr = json.loads(raw)
    names = [k for k in hdr if k != "__metadata__"]
    a, b = sorted(names, key=lambda k: hdr[k]["data_offsets"][0])[:2]
    hdr[b]["data_offsets"] = [hdr[b]["data_offsets"][0] - 4, hdr[b]["data_offsets"][1] - 4]
    return json.dumps(hdr).encode(), "overlap"


@pytest.mark.parametrize("case", ["overlap", "header_larger_than_file"])
def test_corrupt_safetensors_input_is_refused(case, tmp_path, run_ckptconv):
    st = tmp_path / "in.safetensors"
    run_ok(run_ckptconv, "consolidate", TD / "dcp" / "fsdp2_adamw_ws1", "-o", st)
    n, raw = header(st)
    data = st.read_bytes()[8 + n:]
    if case == "overlap":
        new, expect = corrupt_overlap(raw)
        st.write_bytes(struct.pack("<Q", len(new)) + new + data)
    else:
        st.write_bytes(struct.pack("<Q", len(data) + n + 1) + raw + data)
        expect = "larger than the file"
    r = run_ckptconv("convert", st, "-o", tmp_path / "x.pt")
    assert r.returncode == 3, r.stderr
    assert expect in r.stderr
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("ext", ["safetensors", "h5"])
def test_cast_output_goes_through_the_slab_path(ext, tmp_path, run_ckptconv):
    """--dtype and a tiny budget: tensors assembled in one-row slabs, cast, then written."""
    src = TD / "dcp" / "fsdp2_adamw_ws3"
    out = tmp_path / f"out.{ext}"
    run_ok(run_ckptconv, "consolidate", src, "-o", out, "--dtype", "bf16", "--optim-dtype", "bf16", "--memory-limit",
           "64")
    expected = cast_floats(reference(src), torch.bfloat16)
    if ext == "safetensors":
        assert_tensors_equal(load_file(out), flat_tensors(expected))
    else:
        import h5py

        with h5py.File(out, "r") as f:
            assert f["model/fc2.weight"].attrs["dtype"] == "bfloat16"
            assert_same(h5_state(f), expected)


# ---- HDF5 ----------------------------------------------------------------------

RAW_DTYPES = ("bfloat16", "complex32")


def h5_tensor(ds):
    """docs/hdf5-layout.md: the dataset as torch, dtype restored from the `dtype` attribute."""
    name = ds.attrs["dtype"]
    t = torch.from_numpy(ds[()]) if ds.shape != () else torch.tensor(ds[()])
    if name in RAW_DTYPES or name.startswith("float8"):
        t = t.view(getattr(torch, name))
    assert str(t.dtype) == f"torch.{name}", ds.name
    return t


def h5_state(group):
    """docs/hdf5-layout.md: the state dict an HDF5 file holds, read with h5py alone."""
    import h5py

    def child(name):
        if name in group:
            obj = group[name]
            return h5_state(obj) if isinstance(obj, h5py.Group) else h5_tensor(obj)
        return from_json(json.loads(group.attrs[name]))

    esc = lambda k: {".": "%2E", "": "%00"}.get(k, k.replace("%", "%25").replace("/", "%2F"))  # noqa: E731
    kind = group.attrs["ckptconv.kind"]
    if kind == "dict":
        return {k: child(esc(str(k))) for k in json.loads(group.attrs["ckptconv.keys"])}
    items = [child(str(i)) for i in range(int(group.attrs["ckptconv.length"]))]
    return items if kind == "list" else tuple(items)


def from_json(v):
    if isinstance(v, dict):
        if list(v) == ["__tuple__"]:
            return tuple(from_json(i) for i in v["__tuple__"])
        if list(v) == ["__float__"]:
            return float(v["__float__"])
        return {k: from_json(c) for k, c in v.items()}
    if isinstance(v, list):
        return [from_json(i) for i in v]
    return v


@pytest.mark.parametrize("src", SOURCES, ids=ids)
def test_hdf5_read_by_h5py_equals_reference(src, tmp_path, run_ckptconv):
    import h5py

    out = tmp_path / "out.h5"
    run_ok(run_ckptconv, "consolidate", src, "-o", out, *source_args(src))
    with h5py.File(out, "r") as f:
        assert f.attrs["ckptconv.layout_version"] == 1
        assert f.attrs["ckptconv.source_format"] in ("dcp", "fsdp-ranks", "pt")
        got = h5_state(f)
    assert_same(got, reference(src), key_order=key_order_known(src))


@pytest.mark.parametrize("src", SOURCES, ids=ids)
def test_pt_to_hdf5_to_pt_round_trips(src, tmp_path, run_ckptconv):
    pt, h5, back = tmp_path / "a.pt", tmp_path / "b.h5", tmp_path / "c.pt"
    run_ok(run_ckptconv, "consolidate", src, "-o", pt, *source_args(src))
    run_ok(run_ckptconv, "convert", pt, "-o", h5)
    run_ok(run_ckptconv, "convert", h5, "-o", back)
    assert_same(torch.load(back, weights_only=True), torch.load(pt, weights_only=True))


@pytest.mark.parametrize("extra", [[], ["--compression", "gzip"]], ids=["raw", "gzip"])
def test_hdf5_output_is_the_same_bytes_whenever_it_is_written(extra, tmp_path, run_ckptconv):
    """libhdf5 stamps object headers with the time by default; two runs a
    second apart gave different files (found by test_durability comparing a
    run with and without --no-fsync across a second boundary)."""
    import time

    src = TD / "dcp" / "fsdp2_adamw_ws2"
    run_ok(run_ckptconv, "consolidate", src, "-o", tmp_path / "a.h5", *extra)
    time.sleep(1.1)
    run_ok(run_ckptconv, "consolidate", src, "-o", tmp_path / "b.h5", *extra)
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()


def test_hdf5_gzip_compresses_and_reads_back(tmp_path, run_ckptconv):
    import h5py

    src = TD / "dcp" / "fsdp2_adamw_ws3"
    out = tmp_path / "out.h5"
    run_ok(run_ckptconv, "consolidate", src, "-o", out, "--compression", "gzip", "--memory-limit", "1")
    with h5py.File(out, "r") as f:
        ds = f["model/fc2.weight"]
        assert ds.compression == "gzip" and ds.shuffle and ds.chunks is not None
        assert_same(h5_state(f), reference(src))
    run_ok(run_ckptconv, "convert", out, "-o", tmp_path / "x.pt")
    assert_same(torch.load(tmp_path / "x.pt", weights_only=True), reference(src))


def test_hdf5_keys_with_slashes_are_escaped(tmp_path, run_ckptconv):
    import h5py

    sd = {"a/b": torch.arange(3), "%": {"x/y": 1.5, ".": torch.ones(2)}, "lst": [torch.zeros(1), 2]}
    pt = tmp_path / "k.pt"
    torch.save(sd, pt)
    run_ok(run_ckptconv, "convert", pt, "-o", tmp_path / "k.h5")
    with h5py.File(tmp_path / "k.h5", "r") as f:
        assert "a%2Fb" in f and "%25/%2E" in f
        assert_same(h5_state(f), sd)
    run_ok(run_ckptconv, "convert", tmp_path / "k.h5", "-o", tmp_path / "back.pt")
    assert_same(torch.load(tmp_path / "back.pt", weights_only=True), sd)


def test_hdf5_file_not_written_by_ckptconv_is_refused(tmp_path, run_ckptconv):
    import h5py

    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["w"] = [1.0, 2.0]
    r = run_ckptconv("convert", other, "-o", tmp_path / "x.pt")
    assert r.returncode == 3
    assert "not written by ckptconv" in r.stderr and "other.h5" in r.stderr


def test_hdf5_output_to_unwritable_location_fails_cleanly(tmp_path, run_ckptconv):
    """The destination's folder is a regular file: nothing can be created there (even as root)."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_bytes(b"x")
    r = run_ckptconv("consolidate", TD / "dcp" / "fsdp2_adamw_ws1", "-o", blocker / "out.h5")
    assert r.returncode == 4, r.stderr
    assert "out.h5" in r.stderr and "not_a_dir is a file, not a directory" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_a_dir"]


def test_hdf5_output_to_a_full_disk_fails_and_leaves_nothing(tmp_path, ckptconv):
    """A file-size limit (SIGXFSZ ignored, so writes fail with EFBIG) stands in for a full disk."""
    import subprocess

    out = tmp_path / "out.h5"
    r = subprocess.run(["bash", "-c", f"trap '' XFSZ; ulimit -f 16; exec '{ckptconv}' consolidate "
                        f"'{TD / 'dcp' / 'fsdp2_adamw_ws3'}' -o '{out}'"], capture_output=True, text=True)
    assert r.returncode == 4, r.stderr
    assert "out.h5" in r.stderr
    assert list(tmp_path.iterdir()) == []
