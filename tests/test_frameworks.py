"""Checkpoints as training frameworks lay them out (testdata/frameworks/,
written by real Accelerate and Lightning: tools/make_framework_checkpoints.py;
testdata/titan/: torchtitan's layout) and folders of checkpoints (--tag).

References are torch's own dcp_to_torch_save of each DCP directory, and the
live full state dicts the generator saved beside them.
"""
import json
import shutil
from pathlib import Path

import pytest
import torch

from state_compare import assert_same

REPO = Path(__file__).resolve().parent.parent
ACC = REPO / "testdata" / "frameworks" / "accelerate_fsdp1_ws2"
ACC_ROOT = ACC / "project" / "checkpoints"
LIT = REPO / "testdata" / "frameworks" / "lightning_fsdp1_ws2"
LIT_CKPT = LIT / "checkpoints" / "epoch=0-step=2.ckpt"
TITAN = REPO / "testdata" / "titan" / "checkpoint" / "step-3"


def load(p):
    return torch.load(p, weights_only=True)


def run_ok(run_ckptconv, *args):
    r = run_ckptconv(*args)
    assert r.returncode == 0, r.stderr
    return r


def accelerate_ref(n):
    ref = ACC / "references" / f"checkpoint_{n}"
    return {"model": load(ref / "pytorch_model_fsdp_0.dcp_to_torch_save.pt")["model"],
            "optim": load(ref / "optimizer_0.dcp_to_torch_save.pt")["optimizer"]}


@pytest.mark.parametrize("n", [0, 1])
def test_accelerate_checkpoint_folder_consolidates_model_and_optimizer(n, tmp_path, run_ckptconv):
    out = tmp_path / "full.pt"
    run_ok(run_ckptconv, "consolidate", ACC_ROOT / f"checkpoint_{n}", "-o", out)
    got = load(out)
    assert_same(got, accelerate_ref(n))
    # The live full state dicts (FSDP FULL_STATE_DICT) the job saved beside it.
    assert_same(got["model"], load(ACC / "references" / f"checkpoint_{n}" / "model_full.pt"), key_order=False)


def test_accelerate_only_model_and_optim(tmp_path, run_ckptconv):
    for only, key in (("model", "model"), ("optim", "optim")):
        out = tmp_path / f"{only}.pt"
        run_ok(run_ckptconv, "consolidate", ACC_ROOT / "checkpoint_1", "--only", only, "-o", out)
        assert_same(load(out), accelerate_ref(1)[key])


def test_accelerate_root_is_read_at_its_highest_and_a_tag_chooses(tmp_path, run_ckptconv):
    # no --tag: the highest-numbered complete checkpoint, said in a note (#48 row 6)
    r = run_ok(run_ckptconv, "consolidate", ACC_ROOT, "-o", tmp_path / "x.pt")
    assert "checkpoint_1" in r.stderr and "no --tag" in r.stderr and "--tag NAME reads another" in r.stderr
    assert_same(load(tmp_path / "x.pt"), accelerate_ref(1))
    out = tmp_path / "latest.pt"
    r = run_ok(run_ckptconv, "consolidate", ACC_ROOT, "--tag", "latest", "-o", out)
    assert "checkpoint_1" in r.stderr
    assert_same(load(out), accelerate_ref(1))
    run_ok(run_ckptconv, "consolidate", ACC_ROOT, "--tag", "checkpoint_0", "-o", tmp_path / "c0.pt")
    assert_same(load(tmp_path / "c0.pt"), accelerate_ref(0))


def test_inspect_lists_a_root(run_ckptconv):
    r = run_ok(run_ckptconv, "inspect", ACC_ROOT)
    lines = r.stdout.splitlines()
    assert "a folder of 2 checkpoints" in lines[0]
    assert lines[1].split()[:6] == ["checkpoint_0", "step", "0", "dcp-pair", "world", "size"]
    assert lines[2].endswith("complete")
    j = json.loads(run_ok(run_ckptconv, "inspect", ACC_ROOT, "--json").stdout)
    assert [c["name"] for c in j["checkpoints"]] == ["checkpoint_0", "checkpoint_1"]
    assert all(c["complete"] and c["world_size"] == 2 and c["format"] == "dcp-pair" for c in j["checkpoints"])


def titan_root(tmp_path, latest=None):
    """A training output folder: step-3 and step-10 (copies of the real save),
    step-20 whose save never finished (no .metadata)."""
    root = tmp_path / "checkpoint"
    root.mkdir()
    shutil.copytree(TITAN, root / "step-3")
    shutil.copytree(TITAN, root / "step-10")
    (root / "step-20").mkdir()
    for f in TITAN.glob("*.distcp"):
        shutil.copy(f, root / "step-20" / f.name)
    if latest:
        (root / "latest").write_text(latest + "\n")
    return root


def test_latest_skips_an_incomplete_save(tmp_path, run_ckptconv):
    root = titan_root(tmp_path)
    r = run_ok(run_ckptconv, "inspect", root)
    assert "step-20" in r.stdout and "INCOMPLETE" in r.stdout
    r = run_ok(run_ckptconv, "consolidate", root, "--tag", "latest", "--only", "model", "-o", tmp_path / "m.pt")
    assert "step-10" in r.stderr
    r = run_ckptconv("consolidate", root, "--tag", "step-20", "-o", tmp_path / "x.pt")
    assert r.returncode == 3 and "incomplete" in r.stderr
    r = run_ckptconv("consolidate", root, "--tag", "step-9", "-o", tmp_path / "x.pt")
    assert r.returncode != 0 and "step-3, step-10, step-20 (incomplete)" in r.stderr
    assert not (tmp_path / "x.pt").exists()


def test_latest_file_names_the_checkpoint(tmp_path, run_ckptconv):
    root = titan_root(tmp_path, latest="step-3")
    r = run_ok(run_ckptconv, "validate", root, "--tag", "latest")
    assert "step-3" in r.stderr


def test_tag_on_a_single_checkpoint_is_a_usage_error(tmp_path, run_ckptconv):
    r = run_ckptconv("consolidate", TITAN, "--tag", "latest", "-o", tmp_path / "x.pt")
    assert r.returncode == 2 and "drop --tag" in r.stderr


def lightning_ref():
    """What Lightning's consolidate_checkpoint makes: the DCP items, then
    dict.update with meta.pt's entries."""
    ref = load(LIT / "references" / "epoch=0-step=2.ckpt" / "epoch=0-step=2.ckpt.dcp_to_torch_save.pt")
    ref.update(load(LIT_CKPT / "meta.pt"))
    return ref


def test_lightning_sharded_ckpt_dir_with_meta_pt(tmp_path, run_ckptconv):
    out = tmp_path / "full.pt"
    run_ok(run_ckptconv, "consolidate", LIT_CKPT, "-o", out)
    got = load(out)
    assert_same(got, lightning_ref())
    assert got["global_step"] == 2
    run_ok(run_ckptconv, "validate", LIT_CKPT)
    # The root holding it has one checkpoint: read without --tag.
    run_ok(run_ckptconv, "consolidate", LIT / "checkpoints", "--only", "model", "-o", tmp_path / "m.pt")
    assert_same(load(tmp_path / "m.pt"), lightning_ref()["model"])


def test_lightning_only_optim_is_its_optimizer(tmp_path, run_ckptconv):
    out = tmp_path / "o.pt"
    run_ok(run_ckptconv, "consolidate", LIT_CKPT, "--only", "optim", "-o", out)
    assert_same(load(out), lightning_ref()["optimizer_0"])


@pytest.mark.parametrize("n", [1, 3])
def test_accelerate_folder_reshards_to_accelerates_own_layout(n, tmp_path, run_ckptconv):
    """#30 row 7: by default an Accelerate checkpoint_N/ reshards into
    Accelerate's own layout, what accelerator.load_state reads under FSDP's
    SHARDED_STATE_DICT: pytorch_model_fsdp_0/ a DCP directory of {"model"},
    optimizer_0/ one of {"optimizer"}, at the new world size, and the files
    it saved whole (random_states_0.pkl) copied byte for byte. torch's own
    dcp_to_torch_save reads each as it read the source's."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    src = ACC_ROOT / "checkpoint_1"
    dst = tmp_path / "checkpoint_1"
    run_ok(run_ckptconv, "reshard", src, "-o", dst, "--world-size", str(n))
    assert sorted(p.name for p in dst.iterdir()) == ["optimizer_0", "pytorch_model_fsdp_0", "random_states_0.pkl"]
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (dst / part).iterdir()) == [".metadata"] + [f"__{r}_0.distcp" for r in range(n)]
        dcp_to_torch_save(dst / part, tmp_path / f"{part}.pt")
        assert_same(load(tmp_path / f"{part}.pt"), load(ACC / "references" / "checkpoint_1" / f"{part}.dcp_to_torch_save.pt"))
    assert (dst / "random_states_0.pkl").read_bytes() == (src / "random_states_0.pkl").read_bytes()


def test_accelerate_layout_split_over_part_workers_is_the_one_process_folder(tmp_path, run_ckptconv):
    """--part I/N of --layout accelerate: two workers (the second finalizes)
    write both DCP folders' rank files as one process does, byte for byte,
    and copy the files Accelerate saved whole; each .metadata (its own save
    id and path) reads back with torch's DCP reader as the reference."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    src = ACC_ROOT / "checkpoint_1"
    one, two = tmp_path / "one", tmp_path / "two"
    run_ok(run_ckptconv, "reshard", src, "-o", one, "--world-size", "3")
    for i in range(2):
        run_ok(run_ckptconv, "reshard", src, "-o", two, "--world-size", "3", "--part", f"{i}/2")
    names = sorted(p.relative_to(one).as_posix() for p in one.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(two).as_posix() for p in two.rglob("*") if p.is_file())
    assert len(names) == 9 and "random_states_0.pkl" in names
    for n in names:
        if not n.endswith(".metadata"):
            assert (one / n).read_bytes() == (two / n).read_bytes(), n
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        dcp_to_torch_save(two / part, tmp_path / f"{part}.pt")
        assert_same(load(tmp_path / f"{part}.pt"), load(ACC / "references" / "checkpoint_1" / f"{part}.dcp_to_torch_save.pt"))


def test_accelerate_folder_reshards_to_one_dcp_dir_on_request(tmp_path, run_ckptconv):
    dst = tmp_path / "out"
    run_ok(run_ckptconv, "reshard", ACC_ROOT / "checkpoint_1", "-o", dst, "--world-size", "3", "--layout", "dcp")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(dst, tmp_path / "torch.pt")
    assert_same(load(tmp_path / "torch.pt"), accelerate_ref(1))


def test_accelerate_layout_needs_an_accelerate_source(tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", TITAN, "-o", tmp_path / "o", "--world-size", "2", "--layout", "accelerate")
    assert r.returncode == 2 and "must be an Accelerate checkpoint folder" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_lightning_reshard_keeps_meta_pt(tmp_path, run_ckptconv):
    dst = tmp_path / "epoch=0-step=2.ckpt"
    run_ok(run_ckptconv, "reshard", LIT_CKPT, "-o", dst, "--world-size", "3")
    assert (dst / "meta.pt").read_bytes() == (LIT_CKPT / "meta.pt").read_bytes()
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(dst, tmp_path / "torch.pt")
    got = load(tmp_path / "torch.pt")
    got.update(load(dst / "meta.pt"))  # as Lightning's consolidate_checkpoint
    assert_same(got, lightning_ref())


def test_model_export_from_a_run_folder_in_safetensors_shards(tmp_path, run_ckptconv):
    """The most common after-training job: the latest checkpoint's model, bf16,
    safetensors shards with an index; every shard loads alone with
    safetensors.torch.load_file, together exactly the model's state_dict()."""
    from safetensors.torch import load_file
    root = titan_root(tmp_path)
    out = tmp_path / "export" / "model.safetensors"
    out.parent.mkdir()
    run_ok(run_ckptconv, "consolidate", root, "--tag", "latest", "--only", "model", "--dtype", "bf16",
           "-o", out, "--max-shard-size", "200")
    index = json.loads((out.parent / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    got = {}
    for shard in shards:
        part = load_file(out.parent / shard)
        assert not set(part) & set(got)
        got.update(part)
    want = torch.load(REPO / "testdata" / "titan" / "step-3.ref.pt", weights_only=False)["model"]
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], v.to(torch.bfloat16)), k
