"""FSDP1 flat parameters (testdata/fsdp1, tools/make_fsdp1_checkpoints.py):
per-rank LOCAL_STATE_DICT model files and raw optim.state_dict() files,
unflattened with --param-layout, against the FULL_STATE_DICT model and
FSDP.optim_state_dict(model, optim) that torch wrote in the same job.

Every case ran under torch 2.15 and torch 2.4: use_orig_params False and
True, world sizes 2-4, Adam/AdamW/SGD, nested units, a tied weight, a unit
of frozen parameters and (use_orig_params=True) a frozen parameter inside a
trainable unit. Written back for other world sizes (reshard --layout
fsdp1-flat), they resume a real FSDP1 job exactly."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from state_compare import assert_same

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "testdata" / "fsdp1"
CASES = sorted(p for p in ROOT.glob("torch*/*") if p.is_dir())
ids = lambda p: f"{p.parent.name}/{p.name}"  # noqa: E731


def refs(d):
    return (torch.load(d / "model_full.pt", weights_only=True), torch.load(d / "optim_full.pt", weights_only=True))


def consolidate(run_ckptconv, src, out, *args):
    r = run_ckptconv("consolidate", str(src), "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return torch.load(out, weights_only=True)


def assert_optim_same(got, want):
    # FSDP.optim_state_dict orders `state` by its own traversal (with
    # use_orig_params=True not even param_groups order) and each parameter's
    # keys as the optimizer created them after FSDP's regrouping; ckptconv
    # gives param_groups order and the raw file's key order. Same keys, same
    # bits; param_groups (their `params` lists included) in the same order.
    assert_same(got["param_groups"], want["param_groups"], "param_groups")
    assert_same(got["state"], want["state"], "state", key_order=False)


def test_the_cases_cover_the_issue():
    seen = {(json.loads((d / "case.json").read_text())["torch"].split("+")[0], d.name) for d in CASES}
    assert {v for v, _ in seen} == {"2.15.0", "2.4.1"}
    everywhere = {"flat_adam_ws2", "orig_adamw_ws3", "flat_sgd_ws4", "orig_adam_ws4",
                  # two param groups split by name (weight decay for weights, none for biases and
                  # gains), a frozen parameter in neither: the optimizer most training scripts build
                  "orig_adamw_wdgroups_ws2", "orig_adamw_wdgroups_ws3"}
    assert {n for v, n in seen if v == "2.4.1"} == everywhere
    assert {n for v, n in seen if v == "2.15.0"} == everywhere | {"orig_adamw_trainable_ws2",
                                                                  "flat_adam_trainable_ws3"}


@pytest.mark.parametrize("d", [d for d in CASES if "wdgroups" in d.name], ids=ids)
def test_param_groups_split_by_name_are_matched_group_by_group(d, tmp_path, run_ckptconv):
    """Each group is its own order-keeping subsequence of the model's
    parameters: their ids, concatenated, are not in model order."""
    _, optim = refs(d)
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt", "--param-layout", d / "layout.pt")["optim"]
    decay, plain = (g["params"] for g in got["param_groups"])
    assert decay == [n for n in optim["param_groups"][0]["params"]] and "blocks.0.lin1.weight" in decay
    assert plain == optim["param_groups"][1]["params"] and "blocks.0.lin1.bias" in plain
    assert [g["weight_decay"] for g in got["param_groups"]] == [0.05, 0.0]
    assert "blocks.1.lin2.bias" not in decay + plain  # frozen: in no group


@pytest.mark.parametrize("d", CASES, ids=ids)
def test_consolidate_equals_torchs_full_state_dicts(d, tmp_path, run_ckptconv):
    model, optim = refs(d)
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt", "--param-layout", d / "layout.pt")
    assert list(got) == ["model", "optim"]
    assert_same(got["model"], model, "model")  # key order too: FULL_STATE_DICT's
    assert_optim_same(got["optim"], optim)
    # The tied head.weight is emb.weight; the frozen unit has no state.
    assert torch.equal(got["model"]["head.weight"], got["model"]["emb.weight"])
    assert "proj.weight" not in got["optim"]["state"]


@pytest.mark.parametrize("d", [ROOT / "torch2.15" / "flat_adam_ws2", ROOT / "torch2.15" / "orig_adamw_ws3",
                               ROOT / "torch2.4" / "flat_sgd_ws4", ROOT / "torch2.4" / "orig_adam_ws4"], ids=ids)
def test_only_model_and_only_optim(d, tmp_path, run_ckptconv):
    model, optim = refs(d)
    layout = ["--param-layout", str(d / "layout.pt")]
    assert_same(consolidate(run_ckptconv, d, tmp_path / "m.pt", "--only", "model", *layout), model)
    assert_optim_same(consolidate(run_ckptconv, d, tmp_path / "o.pt", "--only", "optim", *layout), optim)


def test_model_files_alone(tmp_path, run_ckptconv):
    d = ROOT / "torch2.15" / "orig_adamw_ws3"
    model, _ = refs(d)
    got = consolidate(run_ckptconv, f"{d}/model_rank*", tmp_path / "m.pt", "--param-layout", d / "layout.pt")
    assert_same(got, model)


@pytest.mark.parametrize("fmt", ["safetensors", "h5"])
def test_other_outputs(fmt, tmp_path, run_ckptconv):
    d = ROOT / "torch2.15" / "flat_sgd_ws4"
    model, _ = refs(d)
    out = tmp_path / f"m.{fmt}"
    r = run_ckptconv("consolidate", d, "--only", "model", "--param-layout", d / "layout.pt", "-o", out)
    assert r.returncode == 0, r.stderr
    if fmt == "safetensors":
        from safetensors.torch import load_file
        got = load_file(out)
    else:
        import h5py
        with h5py.File(out) as f:
            got = {}
            f.visititems(lambda k, v: got.__setitem__(k.replace("/", "."), torch.from_numpy(v[()]))
                         if isinstance(v, h5py.Dataset) else None)
    assert set(got) == set(model)
    for k, v in model.items():
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize("ws", [1, 2, 3])
def test_reshard_reads_back_equal(ws, tmp_path, run_ckptconv):
    d = ROOT / "torch2.4" / "orig_adamw_ws3"
    model, optim = refs(d)
    for layout in ("fsdp-sharded-tensor", "dcp"):
        out = tmp_path / f"{layout}{ws}"
        r = run_ckptconv("reshard", d, "--param-layout", d / "layout.pt", "-o", out, "--world-size", ws,
                         "--layout", layout)
        assert r.returncode == 0, r.stderr
        got = consolidate(run_ckptconv, out, tmp_path / f"{layout}{ws}.pt")
        assert_same(got["model"], model)
        assert_optim_same(got["optim"], optim)


# ---- writing: FSDP1's fast save for another world size -----------------------

@pytest.mark.parametrize("case, n", [("torch2.15/flat_adam_ws2", 3), ("torch2.15/orig_adamw_ws3", 2),
                                     ("torch2.4/flat_sgd_ws4", 3), ("torch2.4/orig_adam_ws4", 3),
                                     ("torch2.15/orig_adamw_trainable_ws2", 3),
                                     ("torch2.15/flat_adam_trainable_ws3", 2)])
def test_written_files_resume_a_real_fsdp1_job(case, n, tmp_path, run_ckptconv):
    """A real FSDP1 job at world size n loads the files with LOCAL_STATE_DICT
    and optim.load_state_dict and trains on exactly as a job that loaded the
    source job's FULL references (tests/fsdp1_flat_resume.py)."""
    d = ROOT / case
    out = tmp_path / "written"
    r = run_ckptconv("reshard", d, "--param-layout", d / "layout.pt", "--layout", "fsdp1-flat",
                     "--world-size", n, "-o", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{k}_rank{i}.pt" for k in ("model", "optim") for i in range(n))
    res = tmp_path / "resume.pt"
    p = subprocess.run([sys.executable, str(REPO / "tests" / "fsdp1_flat_resume.py"), str(n), str(res), str(d),
                        str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    got = torch.load(res, weights_only=True)
    model, optim = refs(d)
    assert_same(got["loaded"]["model"], model, "loaded model", key_order=False)
    # torch 2.15's Adam fills in the hyper-parameter a torch 2.4 file lacks
    # (decoupled_weight_decay, False) when it loads the state.
    for g, w in zip(got["loaded"]["optim"]["param_groups"], optim["param_groups"]):
        for k in set(g) - set(w):
            assert k == "decoupled_weight_decay" and g.pop(k) is False, k
    assert_optim_same(got["loaded"]["optim"], optim)
    written, reference = got["losses"]
    assert torch.equal(written, reference), (written, reference)
    assert_same(got["final"][0], got["final"][1], "after two steps", key_order=False)
    # and ckptconv reads its own files back as the source
    back = consolidate(run_ckptconv, out, tmp_path / "back.pt", "--param-layout", d / "layout.pt")
    assert_same(back["model"], model)
    assert_optim_same(back["optim"], optim)


def test_written_files_keep_the_source_names(tmp_path, run_ckptconv):
    """veRL's names carry the world size: the written files say the new one."""
    src = ROOT / "torch2.15" / "flat_adam_ws2"
    d = tmp_path / "ckpt"
    d.mkdir()
    for kind in ("model", "optim"):
        for r in range(2):
            shutil.copy(src / f"{kind}_rank{r}.pt", d / f"{kind}_world_size_2_rank_{r}.pt")
    out = tmp_path / "written"
    r = run_ckptconv("reshard", d, "--param-layout", src / "layout.pt", "--layout", "fsdp1-flat", "--world-size", 3,
                     "-o", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{k}_world_size_3_rank_{i}.pt" for k in ("model", "optim") for i in range(3))
    model, optim = refs(src)
    back = consolidate(run_ckptconv, out, tmp_path / "back.pt", "--param-layout", src / "layout.pt")
    assert_same(back["model"], model)
    assert_optim_same(back["optim"], optim)


def test_fsdp1_flat_needs_an_fsdp1_source(tmp_path, run_ckptconv):
    d = REPO / "testdata" / "fsdp_st" / "adamw_ws2"
    r = run_ckptconv("reshard", d, "--layout", "fsdp1-flat", "--world-size", 2, "-o", tmp_path / "out")
    assert r.returncode == 2 and "records no FSDP units" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_validate_and_inspect(run_ckptconv):
    d = ROOT / "torch2.15" / "flat_adam_ws2"
    r = run_ckptconv("validate", d, "--param-layout", d / "layout.pt")
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr
    r = run_ckptconv("inspect", d, "--param-layout", d / "layout.pt")
    assert r.returncode == 0, r.stderr
    assert "model.blocks.0.lin1.weight" in r.stdout and "(9, 6)" in r.stdout
    assert "use_orig_params=False" in r.stdout


def test_an_optimizer_of_the_trainable_parameters_only(tmp_path, run_ckptconv):
    """optim = AdamW(p for p in model.parameters() if p.requires_grad): fewer
    ids than parameters (units); which ones, the one order-keeping choice
    that every rank's state lengths fit."""
    for name, frozen in (("orig_adamw_trainable_ws2", {"blocks.1.lin2.bias", "proj.weight", "proj.bias"}),
                         ("flat_adam_trainable_ws3", {"proj.weight", "proj.bias"})):
        d = ROOT / "torch2.15" / name
        model, optim = refs(d)
        got = consolidate(run_ckptconv, d, tmp_path / f"{name}.pt", "--param-layout", d / "layout.pt")
        assert_same(got["model"], model)
        assert_optim_same(got["optim"], optim)
        assert not frozen & set(got["optim"]["param_groups"][0]["params"])


# ---- refused: nothing guessed, nothing written -------------------------------

def run_refused(run_ckptconv, tmp_path, *args, code=3):
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", *map(str, args), "-o", out)
    assert r.returncode == code, r.stderr
    assert not out.exists() and not list(tmp_path.glob("out.pt.tmp*"))
    return r.stderr


def layout_with(tmp_path, d, change):
    sd = torch.load(d / "layout.pt", weights_only=True)
    change(sd)
    path = tmp_path / "layout.pt"
    torch.save(sd, path)
    return path


def test_without_a_layout_says_what_is_missing(tmp_path, run_ckptconv):
    d = ROOT / "torch2.15" / "flat_adam_ws2"
    err = run_refused(run_ckptconv, tmp_path, d)
    assert "model_rank0.pt" in err and "LOCAL_STATE_DICT" in err and "--param-layout FILE" in err


def test_a_layout_of_another_shape(tmp_path, run_ckptconv):
    d = ROOT / "torch2.15" / "orig_adamw_ws3"

    def grow(sd):
        sd["blocks.0.lin1.weight"] = torch.zeros(10, 6)
    err = run_refused(run_ckptconv, tmp_path, d, "--param-layout", layout_with(tmp_path, d, grow))
    # The unit, the found numel and the expected one, the likely causes.
    assert "unit 'blocks.0.lin1._flat_param' holds 66 elements" in err, err
    assert "blocks.0.lin1.weight (10, 6)" in err and "add up to 69" in err, err
    assert "another model" in err and "wrap policy" in err and "torch version" in err


def test_a_layout_missing_a_parameter(tmp_path, run_ckptconv):
    d = ROOT / "torch2.4" / "flat_sgd_ws4"
    err = run_refused(run_ckptconv, tmp_path, d, "--param-layout",
                      layout_with(tmp_path, d, lambda sd: sd.pop("scale")))
    assert "the root unit (_flat_param) holds 69 elements" in err and "add up to 66" in err, err


def test_a_layout_that_unties_the_tied_weight(tmp_path, run_ckptconv):
    d = ROOT / "torch2.15" / "flat_adam_ws2"

    def untie(sd):
        sd["head.weight"] = sd["head.weight"].clone()
    err = run_refused(run_ckptconv, tmp_path, d, "--param-layout", layout_with(tmp_path, d, untie))
    assert "the root unit (_flat_param) holds 69 elements" in err and "add up to 135" in err, err
    assert "tied weight" in err


def test_a_layout_naming_a_buffer_the_files_lack(tmp_path, run_ckptconv):
    d = ROOT / "torch2.15" / "flat_adam_ws2"
    err = run_refused(run_ckptconv, tmp_path, d, "--param-layout",
                      layout_with(tmp_path, d, lambda sd: sd.pop("blocks.1.running")))
    assert "holds 'blocks.1.running', which the layout file" in err, err


def test_a_layout_of_another_model(tmp_path, run_ckptconv):
    d = ROOT / "torch2.15" / "orig_adam_ws4"
    other = REPO / "testdata" / "fsdp_st" / "adamw_ws2" / "model_full.pt"
    err = run_refused(run_ckptconv, tmp_path, d, "--param-layout", other)
    assert "which the layout file" in err and "another model" in err, err


def drop_optimizer_id(src, dst, drop):
    """src's files in dst, id `drop` left out of the optimizer (as if the job
    had not given that unit to it), the others renumbered."""
    dst.mkdir()
    for f in src.glob("model_rank*.pt"):
        shutil.copy(f, dst / f.name)
    for f in src.glob("optim_rank*.pt"):
        osd = torch.load(f, weights_only=True)
        new = lambda i: i - (i > drop)  # noqa: E731
        osd["state"] = {new(i): st for i, st in osd["state"].items() if i != drop}
        for g in osd["param_groups"]:
            g["params"] = [new(i) for i in g["params"] if i != drop]
        torch.save(osd, dst / f.name)


def test_an_optimizer_subset_the_state_tells_apart(tmp_path, run_ckptconv):
    # flat_adam_ws2 without blocks.1's unit (id 3): the ids' shard lengths
    # 35, 33, 32, 32 and proj's none fit one choice only.
    src = ROOT / "torch2.15" / "flat_adam_ws2"
    drop_optimizer_id(src, tmp_path / "ckpt", 3)
    got = consolidate(run_ckptconv, tmp_path / "ckpt", tmp_path / "out.pt", "--param-layout", src / "layout.pt")
    _, optim = refs(src)
    names = got["optim"]["param_groups"][0]["params"]
    unit = {"blocks.1.gain", "blocks.1.lin2.weight", "blocks.1.lin2.bias"}  # not blocks.1.lin1, a unit of its own
    assert names == [n for n in optim["param_groups"][0]["params"] if n not in unit]
    for n in names:
        if n in optim["state"]:
            assert_same(got["optim"]["state"][n], optim["state"][n], n, key_order=False)


def test_an_optimizer_subset_the_state_cannot_tell_apart(tmp_path, run_ckptconv):
    # Without blocks.1.lin1's unit (id 4), the last id (proj's, no state)
    # could be blocks.1.lin1 or proj: refused, not guessed.
    src = ROOT / "torch2.15" / "flat_adam_ws2"
    drop_optimizer_id(src, tmp_path / "ckpt", 4)
    err = run_refused(run_ckptconv, tmp_path, tmp_path / "ckpt", "--param-layout", src / "layout.pt")
    assert "param_groups list 5 parameter ids, the model has 6 flat parameters" in err, err
    assert "more than one choice" in err


def test_files_of_another_world_size(tmp_path, run_ckptconv):
    # Rank 3's files removed and the rest renamed as if of world size 3.
    src = ROOT / "torch2.15" / "orig_adam_ws4"
    d = tmp_path / "ckpt"
    d.mkdir()
    for kind in ("model", "optim"):
        for r in range(3):
            shutil.copy(src / f"{kind}_rank{r}.pt", d / f"{kind}_rank{r}.pt")
    err = run_refused(run_ckptconv, tmp_path, d, "--param-layout", src / "layout.pt")
    assert "world size" in err, err


def test_validate_reports_a_missing_rank(tmp_path, run_ckptconv):
    src = ROOT / "torch2.15" / "orig_adam_ws4"
    d = tmp_path / "ckpt"
    shutil.copytree(src, d)
    (d / "model_rank2.pt").unlink()
    r = run_ckptconv("validate", d, "--param-layout", src / "layout.pt")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "model_rank2.pt (rank 2)" in r.stdout and "3 of 4 rank files" in r.stdout, r.stdout


def test_optimizer_files_without_the_model_files(tmp_path, run_ckptconv):
    d = ROOT / "torch2.15" / "flat_adam_ws2"
    err = run_refused(run_ckptconv, tmp_path, f"{d}/optim_rank*", "--param-layout", d / "layout.pt", code=2)
    assert "LOCAL_STATE_DICT model files" in err


def test_a_layout_for_files_that_need_none(tmp_path, run_ckptconv):
    d = REPO / "testdata" / "fsdp_st" / "adamw_ws2"
    err = run_refused(run_ckptconv, tmp_path, d, "--param-layout", d / "model_full.pt", code=2)
    assert "--param-layout is for FSDP1 flat-parameter files" in err
