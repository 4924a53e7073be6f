"""ckptconv validate: clean fixtures of every family are valid; a corruption
matrix over copies of them (never testdata/ itself), each a named case that
asserts the exit code and that the report names the exact file, rank and key;
the --json report checked against docs/schema/validate.schema.json."""
from __future__ import annotations

import io
import json
import pickle
import shutil
import struct
import zipfile
from pathlib import Path

import jsonschema
import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
TD = REPO / "testdata"
SCHEMA = json.loads((REPO / "docs" / "schema" / "validate.schema.json").read_text())
INSPECT_SCHEMA = json.loads((REPO / "docs" / "schema" / "inspect.schema.json").read_text())
NAN32 = struct.pack("<I", 0x7FC00000)


def validate(run_ckptconv, *args):
    """(exit code, report dict, stderr) of `validate --json ...`, the report
    checked against the schema."""
    r = run_ckptconv("validate", "--json", *map(str, args))
    assert r.stdout, f"no report on stdout (exit {r.returncode}): {r.stderr}"
    report = json.loads(r.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["exit_code"] == r.returncode
    return r.returncode, report, r.stderr


def problems(report):
    return report["problems"]


def find_problem(report, *words, file=None, rank=None, key=None):
    """The first problem whose message holds every word and whose fields match."""
    for p in report["problems"]:
        if all(w in p["message"] for w in words) and \
           (file is None or (p["file"] or "").endswith(file)) and \
           (rank is None or p["rank"] == rank) and (key is None or p["key"] == key):
            return p
    pytest.fail(f"no problem with {words} file={file} rank={rank} key={key} in:\n" +
                "\n".join(json.dumps(p) for p in report["problems"]))


def copy_of(rel, tmp_path):
    src = TD / rel
    dst = tmp_path / src.name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy(src, dst)
    return dst


# ---- byte offsets of zip records, from Python's zipfile ----------------------------------

def record_offset(zip_bytes: bytes, suffix: str) -> tuple[int, int]:
    """(data offset, size) of the record whose name ends with `suffix`."""
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    h = info.header_offset
    name_len, extra_len = struct.unpack("<HH", zip_bytes[h + 26:h + 30])
    return h + 30 + name_len + extra_len, info.file_size


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def dcp_item(dirpath: Path, fqn: str) -> tuple[str, int, int]:
    """(file name, offset, length) of the item holding `fqn` (its first chunk)."""
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(str(dirpath)).read_metadata()
    for index, info in md.storage_data.items():
        if index.fqn == fqn:
            return info.relative_path, info.offset, info.length
    raise AssertionError(fqn)


# ---- clean fixtures -----------------------------------------------------------------------

DCP = sorted(p.name for p in (TD / "dcp").iterdir() if p.is_dir())
RANKS = [f"{fam}/{d.name}" for fam in ("fsdp_st", "fsdp_dt") for d in sorted((TD / fam).iterdir())
         if d.is_dir() and d.name != "verl_flat_ws2"]


@pytest.mark.parametrize("rel", [f"dcp/{d}" for d in DCP] + RANKS + ["pt/dtypes.pt", "dcp/fsdp2_adamw_ws2.ref.pt"])
def test_clean_fixture_is_valid(rel, run_ckptconv, manifest):
    code, report, err = validate(run_ckptconv, TD / rel, "--finite")
    assert code == 0, json.dumps(report["problems"], indent=1)
    assert report["status"] == "valid" and report["problems"] == []
    assert report["finite"]["nonfinite"] == [] and report["finite"]["tensors_scanned"] > 0
    fixture = next((f for f in manifest["fixtures"] if f["path"] == rel), None)
    if fixture and fixture["family"] != "pt":
        assert report["world_size"] == fixture["world_size"]


def test_verl_model_files_are_valid_and_flat_optimizer_is_named(run_ckptconv):
    code, report, _ = validate(run_ckptconv, TD / "fsdp_dt" / "verl_flat_ws2", "--only", "model")
    assert code == 0, report["problems"]
    # The raw flat-parameter optimizer cannot be interpreted: validate says so (3), naming the file.
    code, report, _ = validate(run_ckptconv, TD / "fsdp_dt" / "verl_flat_ws2")
    assert code == 3
    find_problem(report, "optim_world_size_2_rank_0.pt", "flat parameters")


@pytest.mark.parametrize("fmt", ["safetensors", "h5", "sharded-safetensors"])
def test_clean_outputs_of_other_formats_are_valid(fmt, tmp_path, run_ckptconv):
    src = TD / "dcp" / "fsdp2_adamw_ws2"
    if fmt == "sharded-safetensors":
        out = tmp_path / "model.safetensors"
        r = run_ckptconv("consolidate", src, "-o", out, "--max-shard-size", "1K")
        target = tmp_path / "model.safetensors.index.json"
    else:
        out = target = tmp_path / f"model.{fmt}"
        r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 0, r.stderr
    code, report, _ = validate(run_ckptconv, target, "--finite", "--expect-world-size", "1")
    assert code == 0, report["problems"]
    assert report["summary"]["tensors"] == 25


# ---- the corruption matrix ----------------------------------------------------------------

def test_tensor_record_byte_flipped_rank_file_fails_crc(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws2", tmp_path)
    f = d / "optim_rank1.pt"
    data = f.read_bytes()
    with zipfile.ZipFile(f) as z:
        pkl = z.read("optim_rank1/data.pkl")
    # The local shard of state.fc2.weight.exp_avg on rank 1: find its record by its bytes.
    st = torch.load(TD / "fsdp_st" / "adamw_ws2" / "optim_full.pt", weights_only=True)
    shard = st["state"]["fc2.weight"]["exp_avg"][4:].contiguous()
    rec = None
    with zipfile.ZipFile(f) as z:
        for n in z.namelist():
            if "/data/" in n and z.read(n) == shard.numpy().tobytes():
                rec = n
    assert rec and pkl
    off, _ = record_offset(data, rec)
    flip_byte(f, off + 3)
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    p = find_problem(report, "CRC-32 mismatch", rec, file="optim_rank1.pt", rank=1,
                     key="state.fc2.weight.exp_avg")
    assert p["code"] == "DataLoss"


def test_tensor_record_byte_flipped_dcp_fails_crc(tmp_path, run_ckptconv):
    d = copy_of("dcp/fsdp2_adamw_ws3", tmp_path)
    name, off, length = dcp_item(d, "optim.state.fc1.weight.exp_avg_sq")
    item = (d / name).read_bytes()[off:off + length]
    data_off, size = record_offset(item, "data/0")
    assert size > 0
    flip_byte(d / name, off + data_off + size - 1)
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    rank = int(name.split("_")[2])
    find_problem(report, "CRC-32 mismatch", name, key="optim.state.fc1.weight.exp_avg_sq", rank=rank)


def test_tensor_record_byte_flipped_is_named_by_manifest(tmp_path, run_ckptconv):
    d = copy_of("dcp/fsdp2_adamw_ws2", tmp_path)
    m = tmp_path / "m.json"
    code, report, _ = validate(run_ckptconv, d, "--write-manifest", m)
    assert code == 0 and report["manifest"]["written"] == str(m)
    recorded = json.loads(m.read_text())
    assert recorded["algorithm"] == "xxh3-64" and len(recorded["files"]) == 3
    name, off, length = dcp_item(d, "model.fc1.weight")
    item = (d / name).read_bytes()[off:off + length]
    data_off, _ = record_offset(item, "data/0")
    flip_byte(d / name, off + data_off)
    code, report, _ = validate(run_ckptconv, d, "--manifest", m)
    assert code == 1
    find_problem(report, f"file '{name}' changed", file=name)
    find_problem(report, "tensor 'model.fc1.weight' changed", key="model.fc1.weight")
    assert report["manifest"]["changed"] == 2 and report["manifest"]["missing"] == 0


def test_unchanged_files_vouch_for_their_tensors(tmp_path, run_ckptconv):
    """validate --manifest hashes the files first and reads again only the
    tensors of files whose checksum differs (#56): a tensor checksum edited
    by hand in the manifest goes unnoticed while its file matches (the file
    checksum is what vouches, docs/usage.md); the same manifest without file
    checksums has every tensor read, and the edit is named."""
    d = copy_of("dcp/fsdp2_adamw_ws2", tmp_path)
    m = tmp_path / "m.json"
    assert validate(run_ckptconv, d, "--write-manifest", m)[0] == 0
    recorded = json.loads(m.read_text())
    edited = next(t for t in recorded["tensors"] if t["key"] == "model.fc1.weight")
    edited["checksum"] = "0" * 16
    m.write_text(json.dumps(recorded))
    code, report, _ = validate(run_ckptconv, d, "--manifest", m)
    assert code == 0 and report["manifest"]["changed"] == 0
    recorded["files"] = []
    m.write_text(json.dumps(recorded))
    code, report, _ = validate(run_ckptconv, d, "--manifest", m)
    assert code == 1
    find_problem(report, "tensor 'model.fc1.weight' changed", "0000000000000000 then", key="model.fc1.weight")
    assert report["manifest"]["changed"] == 1 and report["manifest"]["new"] == 3


def test_pickle_byte_flipped_in_a_value(tmp_path, run_ckptconv):
    """One bit of group 0's lr (0.01) in rank 1's data.pkl: the CRC of
    data.pkl fails, and the ranks no longer agree on param_groups."""
    d = copy_of("fsdp_st/adamw_ws2", tmp_path)
    f = d / "optim_rank1.pt"
    data = f.read_bytes()
    off, size = record_offset(data, "data.pkl")
    pos = data.index(b"G" + struct.pack(">d", 0.01), off)
    assert off < pos < off + size
    flip_byte(f, pos + 8)  # the last mantissa byte
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    find_problem(report, "data.pkl", "CRC-32 mismatch", file="optim_rank1.pt", rank=1)
    find_problem(report, "'param_groups.0.lr' differs between ranks", "optim_rank1.pt", file="optim_rank1.pt", rank=1,
                 key="param_groups.0.lr")


def test_pickle_byte_flipped_in_a_global_name(tmp_path, run_ckptconv):
    """A bit flip that turns 'DTensor' into 'DUensor': a global off the allow-list,
    refused as unsafe (exit 3), with the CRC failure that explains it."""
    d = copy_of("fsdp_dt/adamw_ws2", tmp_path)
    f = d / "model_world_size_2_rank_1.pt"
    data = f.read_bytes()
    off, size = record_offset(data, "data.pkl")
    pos = data.index(b"DTensor", off)
    assert off < pos < off + size
    flip_byte(f, pos + 1)
    code, report, _ = validate(run_ckptconv, d)
    assert code == 3 and report["status"] == "unsafe"
    find_problem(report, "data.pkl", "CRC-32 mismatch", file="model_world_size_2_rank_1.pt", rank=1)
    assert find_problem(report, "DUensor", file="model_world_size_2_rank_1.pt", rank=1)["code"] == "Unsafe"


def test_truncated_rank_file(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws2", tmp_path)
    f = d / "optim_rank1.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    find_problem(report, "optim_rank1.pt", file="optim_rank1.pt", rank=1)


def test_truncated_distcp(tmp_path, run_ckptconv):
    d = copy_of("dcp/fsdp2_adamw_ws3", tmp_path)
    f = d / "__2_0.distcp"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    # Every item past the cut is named with its key, file and rank.
    keyed = [q for q in problems(report) if q["key"] and (q["file"] or "").endswith("__2_0.distcp")]
    assert keyed, problems(report)
    assert all(q["rank"] == 2 and q["code"] == "DataLoss" and "__2_0.distcp" in q["message"] for q in keyed)


def test_deleted_rank_file(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws3", tmp_path)
    (d / "model_rank2.pt").unlink()
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    p = find_problem(report, "missing rank file", "model_rank2.pt (rank 2)", file="model_rank2.pt", rank=2)
    assert p["code"] == "NotFound"


def test_deleted_dcp_rank(tmp_path, run_ckptconv):
    d = copy_of("dcp/fsdp2_adamw_ws4", tmp_path)
    (d / "__3_0.distcp").unlink()
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    p = find_problem(report, "__3_0.distcp", "cannot open", file="__3_0.distcp", rank=3)
    assert p["key"]  # names a key stored there
    assert report["world_size"] == 4


def test_duplicated_rank_copied_over_another(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws2", tmp_path)
    shutil.copy(d / "model_rank0.pt", d / "model_rank1.pt")
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    find_problem(report, "holds the shards of rank 0", "name says rank 1", file="model_rank1.pt", rank=1)


def test_duplicated_rank_two_files_claim_it(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws2", tmp_path)
    shutil.copy(d / "optim_rank1.pt", d / "optim_rank1 (copy).pt")
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    find_problem(report, "two files claim rank 1", "optim_rank1 (copy).pt", rank=1)


def test_duplicated_dcp_rank(tmp_path, run_ckptconv):
    d = copy_of("dcp/fsdp2_adamw_ws2", tmp_path)
    shutil.copy(d / "__0_0.distcp", d / "__1_0.distcp")
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    named = [p for p in problems(report) if "__1_0.distcp" in p["message"] and p["key"]]
    assert named, problems(report)


def test_ranks_from_two_runs_of_other_world_sizes(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws2", tmp_path)
    shutil.copy(TD / "fsdp_st" / "adamw_ws3" / "model_rank1.pt", d / "model_rank1.pt")
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    find_problem(report, "files from different world sizes", "model_rank1.pt (world size 3", file="model_rank1.pt",
                 rank=1)


def test_ranks_from_two_runs_of_one_world_size_dcp(tmp_path, run_ckptconv):
    d = copy_of("dcp/fsdp2_adamw_ws2", tmp_path)
    shutil.copy(TD / "dcp" / "fsdp2_sgd_ws2" / "__1_0.distcp", d / "__1_0.distcp")
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    named = [p for p in problems(report) if p["rank"] == 1 and p["key"]]
    assert named, problems(report)


def test_ranks_from_two_runs_of_one_world_size_dtensor(tmp_path, run_ckptconv):
    """fsdp_dt/adamw_ws2 with verl_flat_ws2's rank-1 model file: same names, world
    size and shapes, other values; the plain tensor both ranks hold differs."""
    d = copy_of("fsdp_dt/adamw_ws2", tmp_path)
    for f in d.glob("optim_*"):
        f.unlink()
    shutil.copy(TD / "fsdp_dt" / "verl_flat_ws2" / "model_world_size_2_rank_1.pt", d)
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    # verl's FSDP1 model state dict lists its keys in another order.
    find_problem(report, "the keys of '<root>' are in a different order", "model_world_size_2_rank_1.pt",
                 file="model_world_size_2_rank_1.pt", rank=1)


def test_ranks_from_two_runs_extra_distcp_of_a_larger_world(tmp_path, run_ckptconv):
    """A .distcp of a world-size-4 save dropped into a world-size-3 directory."""
    d = copy_of("dcp/fsdp2_adamw_ws3", tmp_path)
    shutil.copy(TD / "dcp" / "fsdp2_adamw_ws4" / "__3_0.distcp", d)
    code, report, _ = validate(run_ckptconv, d)
    assert code == 1
    find_problem(report, "not referenced by the metadata", file="__3_0.distcp", rank=3)
    assert len(problems(report)) == 1


def test_glob_and_files_sources(run_ckptconv):
    d = TD / "fsdp_dt" / "adamw_ws3"
    code, report, _ = validate(run_ckptconv, str(d / "optim_world_size_3_rank_*.pt"), "--expect-world-size", "3")
    assert code == 0, problems(report)
    assert report["summary"]["files"] == 3
    files = sorted(str(p) for p in d.glob("model_world_size_3_rank_*.pt"))
    code, report, _ = validate(run_ckptconv, "--files", *files[:2])
    assert code == 1
    find_problem(report, "missing rank file", "model_world_size_3_rank_2.pt (rank 2)", rank=2)


# ---- NaN in exp_avg_sq --------------------------------------------------------------------

def nan_reference(tmp_path) -> Path:
    """dcp/fsdp2_adamw_ws2.ref.pt loaded by torch, one NaN and one Inf planted
    in optim.state.fc1.weight.exp_avg_sq, saved again by torch (valid CRCs)."""
    sd = torch.load(TD / "dcp" / "fsdp2_adamw_ws2.ref.pt", weights_only=True)
    sq = sd["optim"]["state"]["fc1.weight"]["exp_avg_sq"]
    sq[1, 2] = float("nan")
    sq[5, 0] = float("inf")
    out = tmp_path / "nan.pt"
    torch.save(sd, out)
    return out


def test_nan_in_exp_avg_sq_pt_saved_by_torch(tmp_path, run_ckptconv):
    f = nan_reference(tmp_path)
    code, report, _ = validate(run_ckptconv, f)
    assert code == 0, problems(report)  # values are not looked at without --finite
    code, report, _ = validate(run_ckptconv, f, "--finite")
    assert code == 1
    key = "optim.state.fc1.weight.exp_avg_sq"
    assert report["finite"]["nonfinite"] == [{"key": key, "dtype": "float32", "elements": 32, "nan": 1, "inf": 1}]
    find_problem(report, "1 NaN and 1 Inf", file="nan.pt", key=key)
    assert len(problems(report)) == 1


def test_nan_in_exp_avg_sq_dcp_saved_by_torch(tmp_path, run_ckptconv):
    """A DCP directory written by torch's dcp.save (one process) with the NaN."""
    import torch.distributed.checkpoint as dcp
    sd = torch.load(nan_reference(tmp_path), weights_only=True)
    d = tmp_path / "nan_dcp"
    dcp.save(sd, checkpoint_id=str(d))
    code, report, _ = validate(run_ckptconv, d, "--finite", "--device", "cpu", "--threads", "2")
    assert code == 1
    key = "optim.state.fc1.weight.exp_avg_sq"
    find_problem(report, "1 NaN and 1 Inf", "__0_0.distcp", key=key, rank=0)
    assert [n["key"] for n in report["finite"]["nonfinite"]] == [key]
    assert report["finite"]["device"] == "cpu"


def test_nan_bytes_planted_in_sharded_record(tmp_path, run_ckptconv):
    """0x7FC00000 written over one float32 of rank 1's exp_avg_sq shard in a
    DCP file and nothing else fixed: the CRC fails, and --finite still names
    the NaN, its rank and file."""
    d = copy_of("dcp/fsdp2_adamw_ws2", tmp_path)
    key = "optim.state.fc2.weight.exp_avg_sq"
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(str(d)).read_metadata()
    idx, info = next((i, s) for i, s in md.storage_data.items() if i.fqn == key and i.offset[0] > 0)
    item = (d / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
    data_off, size = record_offset(item, "data/0")
    pos = info.offset + data_off + 4 * 3
    raw = bytearray((d / info.relative_path).read_bytes())
    raw[pos:pos + 4] = NAN32
    (d / info.relative_path).write_bytes(bytes(raw))
    rank = int(info.relative_path.split("_")[2])
    code, report, _ = validate(run_ckptconv, d, "--finite")
    assert code == 1
    find_problem(report, "CRC-32 mismatch", key=key, rank=rank)
    find_problem(report, "1 NaN and 0 Inf", info.relative_path, key=key, rank=rank)


# ---- keys and world size ------------------------------------------------------------------

def keys_of(run_ckptconv, src):
    r = run_ckptconv("inspect", "--json", src)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    return [t["path"] for t in j["tensors"]] + [v["path"] for v in j["values"]]


def test_expect_keys_all_present(tmp_path, run_ckptconv):
    src = TD / "dcp" / "fsdp2_adamw_ws2"
    kf = tmp_path / "keys.txt"
    kf.write_text("# every key inspect prints\n" + "\n".join(keys_of(run_ckptconv, src)) + "\n")
    code, report, _ = validate(run_ckptconv, src, "--expect-keys", kf)
    assert code == 0, problems(report)
    assert "keys" in report["checks"]


def test_expect_keys_missing_key(tmp_path, run_ckptconv):
    src = TD / "dcp" / "fsdp2_adamw_ws2"
    kf = tmp_path / "keys.txt"
    kf.write_text("\n".join(keys_of(run_ckptconv, src) + ["model.fc3.weight"]) + "\n")
    code, report, _ = validate(run_ckptconv, src, "--expect-keys", kf)
    assert code == 1
    find_problem(report, "'model.fc3.weight' is missing", key="model.fc3.weight")
    assert len(problems(report)) == 1


def test_expect_keys_unexpected_key(tmp_path, run_ckptconv):
    src = TD / "dcp" / "fsdp2_adamw_ws2"
    kf = tmp_path / "keys.txt"
    kf.write_text("\n".join(k for k in keys_of(run_ckptconv, src) if k != "model.scale") + "\n")
    code, report, _ = validate(run_ckptconv, src, "--expect-keys", kf)
    assert code == 1
    find_problem(report, "'model.scale' is unexpected", key="model.scale")
    assert len(problems(report)) == 1


def test_expect_world_size_mismatch(run_ckptconv):
    code, report, _ = validate(run_ckptconv, TD / "fsdp_dt" / "adamw_ws3", "--expect-world-size", "4")
    assert code == 1
    find_problem(report, "world size is 3, expected 4")
    code, report, _ = validate(run_ckptconv, TD / "fsdp_dt" / "adamw_ws3", "--expect-world-size", "3")
    assert code == 0


# ---- optimizer state against param_groups and the model -------------------------------------

def test_optimizer_state_for_unlisted_parameter_and_wrong_shape(tmp_path, run_ckptconv):
    sd = torch.load(TD / "dcp" / "fsdp2_adamw_ws2.ref.pt", weights_only=True)
    state = sd["optim"]["state"]
    state["ghost.weight"] = {k: v.clone() for k, v in state["fc1.weight"].items()}
    state["fc2.bias"]["exp_avg"] = torch.zeros(3)
    out = tmp_path / "bad_optim.pt"
    torch.save(sd, out)
    code, report, _ = validate(run_ckptconv, out)
    assert code == 1
    find_problem(report, "'ghost.weight', which no param_groups entry", key="optim.state.ghost.weight")
    find_problem(report, "has shape (3,)", "has shape (7,)", key="optim.state.fc2.bias.exp_avg")
    assert len(problems(report)) == 2


# ---- unsafe input ---------------------------------------------------------------------------

class _Hostile:
    def __reduce__(self):
        import os
        return (os.system, ("echo pwned",))


def test_hostile_pickle_exits_3(tmp_path, run_ckptconv):
    f = tmp_path / "hostile.pt"
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        z.writestr("hostile/data.pkl", pickle.dumps({"x": _Hostile()}, protocol=2))
        z.writestr("hostile/byteorder", "little")
        z.writestr("hostile/version", "3\n")
    code, report, _ = validate(run_ckptconv, f)
    assert code == 3
    p = find_problem(report, "system")
    assert p["code"] == "Unsafe"
    assert report["status"] == "unsafe"


def test_hostile_dcp_metadata_exits_3(tmp_path, run_ckptconv):
    d = copy_of("dcp/fsdp2_adamw_ws1", tmp_path)
    (d / ".metadata").write_bytes(pickle.dumps(_Hostile(), protocol=4))
    code, report, _ = validate(run_ckptconv, d)
    assert code == 3
    assert find_problem(report, "system")["code"] == "Unsafe"


def test_usage_errors_exit_2(tmp_path, run_ckptconv):
    r = run_ckptconv("validate", TD / "pt" / "dtypes.pt", "--expect-keys", tmp_path / "absent.txt")
    assert r.returncode == 2 and "absent.txt" in r.stderr
    r = run_ckptconv("validate", TD / "pt" / "dtypes.pt", "--device", "tpu")
    assert r.returncode == 2


def test_missing_source_exits_3(tmp_path, run_ckptconv):
    code, report, _ = validate(run_ckptconv, tmp_path / "nothing_here")
    assert code == 3
    find_problem(report, "nothing_here")


# ---- manifests --------------------------------------------------------------------------------

def test_manifest_tensor_checksums_survive_consolidation(tmp_path, run_ckptconv):
    """A manifest of a DCP directory verifies its consolidated .pt and .h5:
    tensor checksums are over logical bytes, not the layout."""
    src = TD / "dcp" / "fsdp2_adamw_ws3"
    m = tmp_path / "m.json"
    code, _, _ = validate(run_ckptconv, src, "--write-manifest", m, "--sha256")
    assert code == 0
    assert json.loads(m.read_text())["algorithm"] == "sha256"
    for ext in ("pt", "h5"):
        out = tmp_path / f"full.{ext}"
        assert run_ckptconv("consolidate", src, "-o", out).returncode == 0
        code, report, _ = validate(run_ckptconv, out, "--manifest", m)
        assert code == 0, problems(report)
        assert report["manifest"]["files_compared"] is False
        assert any("files not compared" in n for n in report["notes"])
    # Resharded to world size 2: the same tensors.
    rs = tmp_path / "ws2"
    assert run_ckptconv("reshard", src, "-o", rs, "--world-size", "2").returncode == 0
    code, report, _ = validate(run_ckptconv, rs, "--manifest", m)
    assert code == 0, problems(report)


def test_manifest_names_missing_and_new_files(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws2", tmp_path)
    m = tmp_path / "m.json"
    assert validate(run_ckptconv, d, "--write-manifest", m)[0] == 0
    # Not written again without --force.
    r = run_ckptconv("validate", d, "--write-manifest", m)
    assert r.returncode == 2 and "exists" in r.stderr
    shutil.copy(TD / "fsdp_st" / "adamw_ws2" / "model_full.pt", d / "model_full.pt")  # not a rank file: ignored
    (d / "optim_rank1.pt").rename(d / "optim_rank1.pt.bak")
    code, report, _ = validate(run_ckptconv, d, "--manifest", m)
    assert code == 1
    find_problem(report, "file 'optim_rank1.pt' is in the manifest", file="optim_rank1.pt")


def test_manifest_not_written_for_an_invalid_checkpoint(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws3", tmp_path)
    (d / "model_rank2.pt").unlink()
    m = tmp_path / "m.json"
    code, report, _ = validate(run_ckptconv, d, "--write-manifest", m)
    assert code == 1 and not m.exists()
    assert report["manifest"]["written"] is None


# ---- text output and inspect's schema -----------------------------------------------------------

def test_text_report_names_each_problem(tmp_path, run_ckptconv):
    d = copy_of("fsdp_st/adamw_ws3", tmp_path)
    (d / "model_rank2.pt").unlink()
    r = run_ckptconv("validate", d)
    assert r.returncode == 1
    assert "problem 1 [NotFound]: missing rank file" in r.stdout
    assert "(file " in r.stdout and "model_rank2.pt, rank 2)" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith("INVALID: ")


EVERY_FAMILY = ["dcp/fsdp2_adamw_ws3", "fsdp_dt/adamw_ws2", "pt/dtypes.pt", "dcp/zstd_ws1", "zero/z2_bf16_ws2",
                "frameworks/accelerate_fsdp1_ws2/project/checkpoints/checkpoint_1", "hf/sharded", "dcp_hf/fsdp2_ws3"]


@pytest.mark.parametrize("rel", EVERY_FAMILY)
def test_inspect_json_matches_its_schema(rel, run_ckptconv):
    r = run_ckptconv("inspect", "--json", TD / rel)
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), INSPECT_SCHEMA)


@pytest.mark.parametrize("rel", EVERY_FAMILY)
def test_validate_json_of_every_family_matches_its_schema(rel, run_ckptconv):
    """A DeepSpeed or Accelerate source's report named formats the schema did
    not list (deepspeed-zero, dcp-pair): a consumer validating it failed."""
    code, report, err = validate(run_ckptconv, TD / rel)
    assert code == 0, err
    assert report["format"] in ("dcp", "fsdp-ranks", "pt", "deepspeed-zero", "dcp-pair", "safetensors", "dcp-hf")


@pytest.mark.parametrize("how", ["path", "tag"])
def test_a_save_that_died_before_its_metadata_is_an_incomplete_checkpoint(how, tmp_path, run_ckptconv):
    """#36 row 4: `validate ckpt/step-300` where the save died before writing
    .metadata was UNREADABLE, 'directory is not a recognised checkpoint', exit
    3, while `inspect ckpt` listed it INCOMPLETE. It is a checkpoint with a
    problem: exit 1, 'incomplete checkpoint: ... the save did not finish'."""
    import shutil
    root = tmp_path / "ckpt"
    root.mkdir()
    src = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2"
    shutil.copytree(src, root / "step-200")
    shutil.copytree(src, root / "step-300")
    (root / "step-300" / ".metadata").unlink()
    args = [root / "step-300"] if how == "path" else [root, "--tag", "step-300"]
    r = run_ckptconv("validate", *args)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "incomplete checkpoint: " in r.stdout and "save did not finish" in r.stdout, r.stdout
    j = json.loads(run_ckptconv("validate", *args, "--json").stdout)
    assert (j["status"], j["format"], j["exit_code"]) == ("problems", "dcp", 1)


def test_validate_names_the_checkpoint_it_read_in_a_folder(tmp_path, run_ckptconv):
    """#36 row 6: `validate ckpt --tag latest -q` said which step it checked only
    in a stderr info line that -q hides: now on the result line and in --json."""
    import shutil
    root = tmp_path / "ckpt"
    root.mkdir()
    for step in (100, 200):
        shutil.copytree(REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2", root / f"step-{step}")
    r = run_ckptconv("validate", root, "--tag", "latest", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].startswith(f"{root} (checkpoint {root / 'step-200'}): dcp"), r.stdout
    j = json.loads(run_ckptconv("validate", root, "--tag", "latest", "--json").stdout)
    assert (j["source"], j["checkpoint"]) == (str(root), str(root / "step-200"))
    j = json.loads(run_ckptconv("validate", root / "step-100", "--json").stdout)
    assert j["checkpoint"] == j["source"] == str(root / "step-100")


def test_a_manifest_matches_any_spelling_of_the_same_checkpoint(tmp_path, run_ckptconv):
    """#36 row 2: `validate ckpt --tag latest --write-manifest m.json`, then
    `validate ckpt/step-200 --manifest m.json` on the unchanged checkpoint said
    '0 changed, 5 missing, 5 new', exit 1: paths were relative to how SRC was
    named. They are relative to the checkpoint's own directory now."""
    import shutil
    root = tmp_path / "ckpt"
    root.mkdir()
    for step in (100, 200):
        shutil.copytree(REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2", root / f"step-{step}")
    m = tmp_path / "m.json"
    assert run_ckptconv("validate", root, "--tag", "latest", "--write-manifest", m).returncode == 0
    assert {f["path"] for f in json.loads(m.read_text())["files"]} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    (tmp_path / "link").symlink_to(root / "step-200", target_is_directory=True)
    for spelling in ([root / "step-200"], [tmp_path / "link"], [root, "--tag", "step-200"],
                     [Path("ckpt") / "step-200"]):
        r = run_ckptconv("validate", *spelling, "--manifest", m, cwd=tmp_path)
        assert r.returncode == 0 and "0 changed, 0 missing, 0 new" in r.stdout, (spelling, r.stdout)
