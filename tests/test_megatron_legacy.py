"""Megatron-LM legacy checkpoints (ckpt_format=torch; testdata/megatron_legacy,
tools/make_megatron_legacy_checkpoints.py): a GPT (local spec, SwiGLU,
grouped-query attention) saved by Megatron-LM's own save_checkpoint at
TP=2 x PP=2 with the plain optimizer, at PP=2 with 2 virtual stages per
pipeline rank (model0/model1 in each file, layers interleaved), at TP=2 x
DP=2 with the distributed optimizer (distrib_optim.pt beside each rank file),
and at TP=2 in bf16 with the mixed-precision optimizer (fp32 masters in
fp32_from_fp16_params).

The references are megatron-core's own reading of the same weights into a
TP=1/PP=1 model (dist_checkpointing.load, then state_dict_for_save_checkpoint):
what the consolidated model must be, bit for bit; and of the same job's
optimizer state into a TP=1 optimizer (optim_ref.pt): what --only optim must
be, bit for bit."""
import enum
import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from proofs_guard import require_side_env
from state_compare import assert_same

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "testdata" / "megatron_legacy"
CASE = ROOT / "gpt_tp2pp2"
ITER = "iter_0000007"


def load(p):
    return torch.load(p, weights_only=True)


def consolidate(run_ckptconv, src, out, *args):
    r = run_ckptconv("consolidate", str(src), "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return r


def copy_ckpt(tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(CASE / "ckpt", dst)
    return dst


def rank_file(root, folder):
    return root / ITER / folder / "model_optim_rng.pt"


@pytest.fixture
def megatron_enums(monkeypatch):
    """The one megatron class a rank file's args names (AttnBackend, with
    megatron-core 0.16.1's members), importable under its own module path,
    so that this venv (no megatron-core) loads our fixture's files whole and
    saves them back naming the same global the same way."""
    mod = types.ModuleType("megatron.core.transformer.enums")
    mod.AttnBackend = enum.Enum("AttnBackend", {"flash": 1, "fused": 2, "unfused": 3, "local": 4, "auto": 5},
                                module=mod.__name__)
    for name in ("megatron", "megatron.core", "megatron.core.transformer"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)


def load_rank(path):
    # Our own fixture (args is an argparse.Namespace): weights_only=False.
    return torch.load(path, weights_only=False)


def test_the_fixture_is_megatron_lms_own_save():
    info = json.loads((CASE / "case.json").read_text())
    assert info["megatron_lm"] == "core_v0.16.1" and info["ckpt_format"] == "torch"
    assert (info["tensor_model_parallel_size"], info["pipeline_model_parallel_size"]) == (2, 2)
    assert info["num_query_groups"] < info["num_attention_heads"]
    assert (CASE / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "7"
    folders = sorted(p.name for p in (CASE / "ckpt" / ITER).iterdir())
    assert folders == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]


@pytest.mark.parametrize("case", ["gpt_tp2pp2", "gpt_pp2_vpp2", "gpt_tp2_dp2_distopt", "gpt_tp2_bf16",
                                  "gpt_pp2_dp2_buckets"])
def test_only_model_equals_megatron_load_at_tp1_pp1(case, tmp_path, run_ckptconv):
    consolidate(run_ckptconv, ROOT / case / "ckpt", tmp_path / "m.pt", "--only", "model")
    got, want = load(tmp_path / "m.pt"), load(ROOT / case / "model_ref.pt")
    # Same names (global layer index) in the same order, same bits.
    assert_same(got, want)
    assert got["decoder.layers.3.mlp.linear_fc1.weight"].shape == (24, 8)  # [gate; up] of ffn 12
    assert got["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (16, 8)  # 4 q heads + 2 k + 2 v, dim 2


def test_distributed_optimizer_job_reads_its_model_and_says_dp(tmp_path, run_ckptconv):
    case = ROOT / "gpt_tp2_dp2_distopt"
    info = json.loads((case / "case.json").read_text())
    assert (info["tensor_model_parallel_size"], info["data_parallel_size"]) == (2, 2)
    it = case / "ckpt" / "iter_0000005"
    # Only DP rank 0 writes: one folder per TP rank, its distrib_optim.pt beside.
    assert sorted(p.name for p in it.iterdir()) == ["mp_rank_00", "mp_rank_01"]
    assert all((it / f / "distrib_optim.pt").is_file() for f in ("mp_rank_00", "mp_rank_01"))
    r = run_ckptconv("inspect", str(it))
    assert r.returncode == 0, r.stderr
    assert "megatron parallelism: TP 2 x PP 1, EP 1, DP 2" in r.stdout
    assert "use_distributed_optimizer=True" in r.stdout


def test_virtual_stages_interleave_their_layers(tmp_path, run_ckptconv, megatron_enums):
    # Virtual stage v of pipeline rank p holds global layer v * PP + p (one layer each).
    vpp = ROOT / "gpt_pp2_vpp2" / "ckpt"
    assert json.loads((ROOT / "gpt_pp2_vpp2" / "case.json").read_text())["virtual_pipeline_model_parallel_size"] == 2
    consolidate(run_ckptconv, vpp, tmp_path / "m.pt", "--only", "model")
    got = load(tmp_path / "m.pt")
    files = [load_rank(vpp / "iter_0000003" / f / "model_optim_rng.pt")
             for f in ("mp_rank_00_000", "mp_rank_00_001")]
    key = "decoder.layers.0.mlp.linear_fc2.weight"
    for layer, (p, v) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        assert torch.equal(got[f"decoder.layers.{layer}.mlp.linear_fc2.weight"], files[p][f"model{v}"][key])


def test_swiglu_halves_are_regrouped_not_concatenated(tmp_path, run_ckptconv, megatron_enums):
    # Each TP rank holds [gate_r; up_r]: the TP=1 tensor is [gate_0; gate_1; up_0; up_1].
    consolidate(run_ckptconv, CASE / "ckpt" / ITER, tmp_path / "m.pt", "--only", "model")
    got = load(tmp_path / "m.pt")["decoder.layers.0.mlp.linear_fc1.weight"]
    r0 = load_rank(rank_file(CASE / "ckpt", "mp_rank_00_000"))["model"]
    r1 = load_rank(rank_file(CASE / "ckpt", "mp_rank_01_000"))["model"]
    a, b = r0["decoder.layers.0.mlp.linear_fc1.weight"], r1["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(got, torch.cat([a[:6], b[:6], a[6:], b[6:]]))
    assert not torch.equal(got, torch.cat([a, b]))


def test_root_is_read_at_the_tracker_iteration(tmp_path, run_ckptconv):
    r = consolidate(run_ckptconv, CASE / "ckpt", tmp_path / "m.pt", "--only", "model")
    assert "latest_checkpointed_iteration.txt" in r.stderr
    assert_same(load(tmp_path / "m.pt"), load(CASE / "model_ref.pt"))


def test_tag_selects_an_iteration_and_release(tmp_path, run_ckptconv):
    root = copy_ckpt(tmp_path)
    shutil.copytree(root / ITER, root / "release")
    consolidate(run_ckptconv, root, tmp_path / "a.pt", "--only", "model", "--tag", ITER)
    consolidate(run_ckptconv, root, tmp_path / "b.pt", "--only", "model", "--tag", "release")
    assert_same(load(tmp_path / "a.pt"), load(CASE / "model_ref.pt"))
    assert_same(load(tmp_path / "b.pt"), load(CASE / "model_ref.pt"))
    (root / "latest_checkpointed_iteration.txt").write_text("release")
    r = consolidate(run_ckptconv, root, tmp_path / "c.pt", "--only", "model")
    assert "the iteration" in r.stderr and "release" in (tmp_path / "c.pt").parent.name + r.stderr
    r = run_ckptconv("consolidate", str(root), "-o", str(tmp_path / "d.pt"), "--tag", "iter_0000008")
    assert r.returncode == 3 and "iter_0000008" in r.stderr
    assert not (tmp_path / "d.pt").exists()


def test_inspect_of_the_root_lists_iterations_and_marks_the_tracker(tmp_path, run_ckptconv):
    root = copy_ckpt(tmp_path)
    shutil.copytree(root / ITER, root / "iter_0000005")
    r = run_ckptconv("inspect", str(root))
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()[1:] if line.strip()}
    assert "<- latest" in lines[ITER] and "world size 4" in lines[ITER]
    assert "<- latest" not in lines["iter_0000005"]


def test_tracker_naming_a_missing_iteration_is_an_error(tmp_path, run_ckptconv):
    root = copy_ckpt(tmp_path)
    (root / "latest_checkpointed_iteration.txt").write_text("9")
    r = run_ckptconv("consolidate", str(root), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3 and "iter_0000009" in r.stderr
    (root / "latest_checkpointed_iteration.txt").write_text("seven")
    r = run_ckptconv("consolidate", str(root), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3 and "latest_checkpointed_iteration.txt" in r.stderr
    assert not (tmp_path / "m.pt").exists()


def test_inspect_shows_degrees_iteration_and_args(run_ckptconv):
    r = run_ckptconv("inspect", str(CASE / "ckpt" / ITER))
    assert r.returncode == 0, r.stderr
    assert "megatron parallelism: TP 2 x PP 2, EP 1, DP 1" in r.stdout
    assert "megatron iteration: 7" in r.stdout
    assert "megatron checkpoint_version: 3.0" in r.stdout
    assert "num_query_groups=2" in r.stdout and "swiglu=True" in r.stdout
    assert "decoder.layers.3.mlp.linear_fc2.weight" in r.stdout
    r = run_ckptconv("inspect", str(CASE / "ckpt" / ITER), "--json")
    j = json.loads(r.stdout)
    assert j["facts"]["megatron iteration"] == "7"


def test_without_only_the_job_entries_come_from_the_first_rank(tmp_path, run_ckptconv):
    r = consolidate(run_ckptconv, CASE / "ckpt" / ITER, tmp_path / "all.pt")
    assert "optimizer" in r.stderr and "not in the model view" in r.stderr and "--only optim" in r.stderr
    got = torch.load(tmp_path / "all.pt", weights_only=True)
    assert list(got) == ["model", "args", "checkpoint_version", "iteration", "num_floating_point_operations_so_far"]
    assert got["iteration"] == 7 and got["checkpoint_version"] == 3.0
    assert got["args"]["tensor_model_parallel_size"] == 2 and got["args"]["ckpt_format"] == "torch"
    assert_same(got["model"], load(CASE / "model_ref.pt"))


def test_validate_accepts_the_checkpoint(run_ckptconv):
    r = run_ckptconv("validate", str(CASE / "ckpt" / ITER))
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_missing_rank_folder_is_named(tmp_path, run_ckptconv):
    root = copy_ckpt(tmp_path)
    shutil.rmtree(root / ITER / "mp_rank_01_001")
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3
    assert "mp_rank_01_001" in r.stderr and "TP rank 1, PP rank 1" in r.stderr
    assert not (tmp_path / "m.pt").exists() and not list(tmp_path.glob("m.pt*"))
    r = run_ckptconv("validate", str(root / ITER))
    assert r.returncode == 1 and "mp_rank_01_001" in r.stdout + r.stderr


def test_a_truncated_rank_file_is_named(tmp_path, run_ckptconv):
    root = copy_ckpt(tmp_path)
    victim = rank_file(root, "mp_rank_01_000")
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3 and "mp_rank_01_000/model_optim_rng.pt" in r.stderr
    assert not list(tmp_path.glob("m.pt*"))
    r = run_ckptconv("validate", str(root / ITER))
    assert r.returncode == 1 and "mp_rank_01_000/model_optim_rng.pt" in r.stdout


def _rewrite(path, edit, entry="model"):
    sd = load_rank(path)
    edit(sd[entry])
    torch.save(sd, path)


def test_args_calling_for_ranks_that_are_not_there_is_an_error(tmp_path, run_ckptconv, megatron_enums):
    # The degrees come from the first rank's args: TP 3 calls for mp_rank_02_*.
    root = copy_ckpt(tmp_path)
    _rewrite(rank_file(root, "mp_rank_00_000"), lambda a: setattr(a, "tensor_model_parallel_size", 3), "args")
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3 and "mp_rank_02_000" in r.stderr and "TP rank 2, PP rank 0" in r.stderr
    assert not list(tmp_path.glob("m.pt*"))


def test_rank_folders_beyond_the_args_degrees_are_an_error(tmp_path, run_ckptconv, megatron_enums):
    root = copy_ckpt(tmp_path)
    _rewrite(rank_file(root, "mp_rank_00_000"), lambda a: setattr(a, "pipeline_model_parallel_size", 1), "args")
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3 and "outside the job's TP 2 x PP 1" in r.stderr
    assert not list(tmp_path.glob("m.pt*"))


def test_ranks_of_different_iterations_are_not_one_checkpoint(tmp_path, run_ckptconv, megatron_enums):
    root = copy_ckpt(tmp_path)
    path = rank_file(root, "mp_rank_01_001")
    sd = load_rank(path)
    sd["iteration"] = 6
    torch.save(sd, path)
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3 and "mp_rank_01_001" in r.stderr and "iteration 6" in r.stderr


def test_tp_ranks_disagreeing_on_a_whole_tensor_is_an_error(tmp_path, run_ckptconv, megatron_enums):
    root = copy_ckpt(tmp_path)
    name = "decoder.layers.1.pre_mlp_layernorm.weight"
    _rewrite(rank_file(root, "mp_rank_01_001"), lambda m: m[name].add_(1.0))
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3
    # Stage 1's local layer 1 is global layer 3.
    assert "decoder.layers.3.pre_mlp_layernorm.weight" in r.stderr and "mp_rank_01_001" in r.stderr
    assert "differs from TP rank 0" in r.stderr
    assert not list(tmp_path.glob("m.pt*"))


def test_a_parameter_the_tp_rules_do_not_know_is_refused(tmp_path, run_ckptconv, megatron_enums):
    root = copy_ckpt(tmp_path)
    for folder in ("mp_rank_00_000", "mp_rank_01_000"):
        _rewrite(rank_file(root, folder), lambda m: m.__setitem__("decoder.layers.0.mlp.gate_proj.weight",
                                                                  torch.zeros(4, 8)))
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 3
    assert "decoder.layers.0.mlp.gate_proj.weight" in r.stderr and "refusing to guess" in r.stderr
    assert not list(tmp_path.glob("m.pt*"))


# ---- --only optim ----

OPTIM_CASES = {"gpt_tp2pp2": "iter_0000007", "gpt_pp2_vpp2": "iter_0000003", "gpt_tp2_dp2_distopt": "iter_0000005",
               "gpt_tp2_bf16": "iter_0000009", "gpt_pp2_dp2_buckets": "iter_0000011",
               "gpt_pp2_dp2_tied": "iter_0000013"}
# The cases whose optimizer keeps an fp32 master apart from the weight: the
# distributed optimizer, and the mixed-precision one of a bf16 job.
WITH_MASTER = {"gpt_tp2_dp2_distopt", "gpt_tp2_bf16", "gpt_pp2_dp2_buckets"}
# The cases megatron-core's own TP=1 view of the optimizer is the reference
# of (optim_ref.pt). Not the bucketed one: megatron-core 0.16.1 misreads its
# own buffers past the first bucket (tools/make_megatron_legacy_checkpoints.py,
# OPTIM_REF_BROKEN); test_bucketed_buffers_give_every_master_its_weight
# checks it instead.
WITH_REF = [c for c in OPTIM_CASES if c not in ("gpt_pp2_dp2_buckets", "gpt_pp2_dp2_tied")]
# megatron-core's name for the mixed-precision optimizer's fp32 master in its
# sharded save; ckptconv calls every fp32 master `param`, as the distributed
# optimizer's is called (and as --only optim of torch_dist gives it).
REF_KIND = {"fp32_param": "param"}


def copy_case(tmp_path, case):
    dst = tmp_path / "ckpt"
    shutil.copytree(ROOT / case / "ckpt", dst)
    return dst / OPTIM_CASES[case]


@pytest.mark.parametrize("case", WITH_REF)
def test_only_optim_equals_megatron_cores_tp1_view(case, tmp_path, run_ckptconv):
    consolidate(run_ckptconv, ROOT / case / "ckpt", tmp_path / "o.pt", "--only", "optim")
    got, ref = load(tmp_path / "o.pt"), load(ROOT / case / "optim_ref.pt")
    common_step = ref.pop("common_step", None)
    # The same parameter names as --only model, in the model's order, each
    # state bit-equal to what megatron-core's load gives the TP=1 optimizer
    # (the bytes are copied: ranges of distrib_optim.pt's flat buffers, or
    # the plain optimizer's TP pieces, joined as the parameter is).
    assert list(got["state"]) == list(ref) == [k for k, v in load(ROOT / case / "model_ref.pt").items()
                                               if isinstance(v, torch.Tensor)]
    kinds = ["param", "exp_avg", "exp_avg_sq"] if case in WITH_MASTER else ["exp_avg", "exp_avg_sq"]
    for name, states in ref.items():
        assert list(got["state"][name]) == kinds, name
        assert sorted(REF_KIND.get(k, k) for k in states) == sorted(kinds), name
        for kind, want in states.items():
            have = got["state"][name][REF_KIND.get(kind, kind)]
            assert have.dtype == want.dtype and torch.equal(have, want), (name, kind)
    model = load(ROOT / case / "model_ref.pt")
    if "param" in kinds:  # the weight is the master, in the model's dtype (bf16: rounded)
        for n in ref:
            master = got["state"][n]["param"]
            assert master.dtype == torch.float32
            assert torch.equal(master.to(model[n].dtype), model[n]), n
        assert model["output_layer.weight"].dtype == (torch.bfloat16 if case == "gpt_tp2_bf16" else torch.float32)
    # param_groups: the default (weight decay) group, then wd_mult 0 (biases
    # and 1-d parameters), as stored without their per-rank `params`, the
    # step where the distributed optimizer keeps it.
    groups = got["param_groups"]
    assert [g["wd_mult"] for g in groups] == [1.0, 0.0]
    assert all("params" not in g for g in groups)
    for g in groups:
        assert float(g["step"]) == 1.0
        if common_step is not None:
            assert torch.equal(g["step"], common_step)


def test_optim_layout_of_another_megatron_core_is_refused_naming_it(tmp_path, run_ckptconv):
    # A distrib_optim.pt without `buckets_coalesced` is the per-bucket layout
    # of older megatron-core: refused, not guessed.
    it = copy_case(tmp_path, "gpt_tp2_dp2_distopt")
    path = it / "mp_rank_01" / "distrib_optim.pt"
    sd = load(path)
    del sd["buckets_coalesced"]
    torch.save(sd, path)
    r = run_ckptconv("consolidate", str(it), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3, r.stderr
    assert "mp_rank_01/distrib_optim.pt" in r.stderr and "buckets_coalesced" in r.stderr and "0.16" in r.stderr
    assert not list(tmp_path.glob("o.pt*"))
    # The model does not need it.
    consolidate(run_ckptconv, it, tmp_path / "m.pt", "--only", "model")


def test_a_buffer_the_016_layout_does_not_account_for_is_refused(tmp_path, run_ckptconv):
    # The same state without the 64-element alignment between parameters
    # (1440 elements instead of 3648): another version's rules.
    it = copy_case(tmp_path, "gpt_tp2_dp2_distopt")
    path = it / "mp_rank_00" / "distrib_optim.pt"
    sd = load(path)
    (key, buf), = sd[0].items()
    for k in ("param", "exp_avg", "exp_avg_sq"):
        buf[k] = buf[k][:1440].clone()
    buf["numel_unpadded"] = 1440
    torch.save(sd, path)
    r = run_ckptconv("consolidate", str(it), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3, r.stderr
    assert "mp_rank_00/distrib_optim.pt: grad buffer 0 holds 1440 elements" in r.stderr
    assert "gives 3648" in r.stderr and "does not guess" in r.stderr
    assert not list(tmp_path.glob("o.pt*"))


def test_a_missing_distrib_optim_pt_is_named(tmp_path, run_ckptconv):
    it = copy_case(tmp_path, "gpt_tp2_dp2_distopt")
    (it / "mp_rank_01" / "distrib_optim.pt").unlink()
    r = run_ckptconv("consolidate", str(it), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3 and "mp_rank_01/distrib_optim.pt: missing" in r.stderr
    assert not list(tmp_path.glob("o.pt*"))


def test_bucketed_buffers_give_every_master_its_weight(tmp_path, run_ckptconv):
    # PP=2 x DP=2, --overlap-grad-reduce, 500-element buckets: the first
    # stage's buffer is several buckets, its parameters at places the bucket
    # boundaries move. Each fp32 master (`param`, fp32 job) is bit-equal to
    # the weight megatron-core's own load gives the TP=1 model, which pins
    # every parameter's range of the flat buffers; the moments are read
    # from the same ranges of their own buffers.
    case = "gpt_pp2_dp2_buckets"
    consolidate(run_ckptconv, ROOT / case / "ckpt", tmp_path / "o.pt", "--only", "optim")
    got, model = load(tmp_path / "o.pt"), load(ROOT / case / "model_ref.pt")
    params = [k for k, v in model.items() if isinstance(v, torch.Tensor)]
    assert list(got["state"]) == params
    for n in params:
        s = got["state"][n]
        assert list(s) == ["param", "exp_avg", "exp_avg_sq"]
        assert s["param"].dtype == torch.float32 and torch.equal(s["param"], model[n]), n
        assert s["exp_avg"].shape == s["exp_avg_sq"].shape == model[n].shape
        # One Adam step from zero: exp_avg = 0.1 g, exp_avg_sq = 0.001 g^2,
        # so exp_avg^2 / exp_avg_sq = 10 wherever g != 0: a moment read from
        # another parameter's range (or from padding) would break it.
        nz = s["exp_avg_sq"] > 0
        assert nz.float().mean() > 0.99, n
        ratio = s["exp_avg"][nz].double() ** 2 / s["exp_avg_sq"][nz].double()
        assert torch.allclose(ratio, torch.full_like(ratio, 10.0), rtol=1e-4), n


def test_bucket_sizes_come_from_the_args(tmp_path, run_ckptconv, megatron_enums):
    # gpt_pp2_dp2_buckets: --overlap-grad-reduce with 500-element buckets, so
    # the first stage's buffer is several buckets, each starting right after
    # the last one's parameters in distrib_optim.pt. Read with another bucket
    # size, the layout no longer fits the file: refused, not guessed.
    info = json.loads((ROOT / "gpt_pp2_dp2_buckets" / "case.json").read_text())
    assert info["ddp"] == "overlap_grad_reduce, ddp_bucket_size 500"
    it = copy_case(tmp_path, "gpt_pp2_dp2_buckets")
    _rewrite(it / "mp_rank_00_000" / "model_optim_rng.pt", lambda a: setattr(a, "ddp_bucket_size", 10 ** 6), "args")
    r = run_ckptconv("consolidate", str(it), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3, r.stderr
    assert "mp_rank_00_000/distrib_optim.pt: grad buffer 0 holds" in r.stderr and "does not guess" in r.stderr
    assert not list(tmp_path.glob("o.pt*"))


def test_a_param_group_outside_the_standard_rules_is_refused(tmp_path, run_ckptconv, megatron_enums):
    # Which parameters a group holds is not stored: a group the 0.16 rules
    # do not make (an lr_mult override) cannot be named.
    root = copy_ckpt(tmp_path)
    _rewrite(rank_file(root, "mp_rank_01_001"), lambda o: o["param_groups"][0].__setitem__("lr_mult", 2.0),
             "optimizer")
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3, r.stderr
    assert "mp_rank_01_001/model_optim_rng.pt: optimizer param group 0" in r.stderr
    assert "standard groups" in r.stderr
    assert not list(tmp_path.glob("o.pt*"))


def test_optimizer_state_of_the_wrong_shape_is_refused(tmp_path, run_ckptconv, megatron_enums):
    # A state tensor whose shape is not the parameter's the grouping names:
    # the rules do not fit this file, so nothing is named by them.
    root = copy_ckpt(tmp_path)
    _rewrite(rank_file(root, "mp_rank_00_000"),
             lambda o: o["state"][0].__setitem__("exp_avg", torch.zeros(3)), "optimizer")
    r = run_ckptconv("consolidate", str(root / ITER), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3 and "optimizer state 0 'exp_avg' is (3,)" in r.stderr
    assert "embedding.word_embeddings.weight" in r.stderr


def test_masters_that_do_not_match_the_16_bit_parameters_are_refused(tmp_path, run_ckptconv, megatron_enums):
    # bf16 job: one fp32 master per bf16 parameter of each group, in order;
    # one missing leaves the others unnamed.
    it = copy_case(tmp_path, "gpt_tp2_bf16")
    _rewrite(it / "mp_rank_01" / "model_optim_rng.pt", lambda o: o["fp32_from_fp16_params"][1].pop(), "optimizer")
    r = run_ckptconv("consolidate", str(it), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3, r.stderr
    assert "mp_rank_01/model_optim_rng.pt: optimizer param group 1" in r.stderr
    assert "fewer fp32_from_fp16_params than 16-bit parameters" in r.stderr
    assert not list(tmp_path.glob("o.pt*"))


def test_a_truncated_distrib_optim_pt_is_named(tmp_path, run_ckptconv):
    it = copy_case(tmp_path, "gpt_tp2_dp2_distopt")
    path = it / "mp_rank_01" / "distrib_optim.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    r = run_ckptconv("consolidate", str(it), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3 and "mp_rank_01/distrib_optim.pt" in r.stderr, r.stderr
    assert not list(tmp_path.glob("o.pt*"))
    # The model does not read it.
    consolidate(run_ckptconv, it, tmp_path / "m.pt", "--only", "model")


def test_tied_embeddings_at_pp2_get_buckets_of_their_own(tmp_path, run_ckptconv, megatron_enums):
    # gpt_pp2_dp2_tied: Megatron-LM's default tied embeddings at PP=2 with the
    # distributed optimizer. The first stage's word embeddings and the last
    # stage's output layer (its copy) each have a bucket of their own; every
    # fp32 master equals the weight saved beside it (the output layer's copy
    # is kept as stored, as --only model keeps it).
    case = "gpt_pp2_dp2_tied"
    consolidate(run_ckptconv, ROOT / case / "ckpt", tmp_path / "o.pt", "--only", "optim")
    consolidate(run_ckptconv, ROOT / case / "ckpt", tmp_path / "m.pt", "--only", "model")
    got, model, ref = load(tmp_path / "o.pt"), load(tmp_path / "m.pt"), load(ROOT / case / "model_ref.pt")
    assert "output_layer.weight" in model and "output_layer.weight" not in ref  # the copy (TP=1/PP=1 has none)
    assert list(got["state"]) == [k for k, v in model.items() if isinstance(v, torch.Tensor)]
    for n, s in got["state"].items():
        assert torch.equal(s["param"], model[n]), n
        if n in ref:
            assert torch.equal(s["param"], ref[n]), n
    # (The copy's master is the copy's weight, not the first stage's: the
    # generator's gradients differ per stage and it does not run Megatron-LM's
    # finalize_model_grads, whose embedding all-reduce keeps the two equal.)
    assert not torch.equal(got["state"]["output_layer.weight"]["param"], ref["embedding.word_embeddings.weight"])
    # Read as untied, the same files do not fit the layout: refused.
    it = copy_case(tmp_path, case)
    _rewrite(it / "mp_rank_00_000" / "model_optim_rng.pt",
             lambda a: setattr(a, "untie_embeddings_and_output_weights", True), "args")
    r = run_ckptconv("consolidate", str(it), "-o", str(tmp_path / "u.pt"), "--only", "optim")
    assert r.returncode == 3 and "does not guess" in r.stderr, r.stderr


# ------------------------------------------------------------ reshard --layout megatron (legacy -> torch_dist)

MEGATRON_PY = REPO / ".venv-megatron" / "bin" / "python"


def to_torch_dist(run_ckptconv, ws, out, *args):
    r = run_ckptconv("reshard", str(CASE / "ckpt"), "--layout", "megatron", "--world-size", str(ws), "-o", str(out),
                     *args)
    assert r.returncode == 0, r.stderr
    return out


def megatron_core_reads(kind, out, tp, pp, tmp_path, ref=CASE / "model_ref.pt", vpp=1, iteration=7):
    """tests/megatron_legacy_load.py: a model built by megatron-core at TP x
    PP loads `out`; what it loaded, gathered by megatron-core's own save and
    TP=1/PP=1 load, must be the legacy job's model bit for bit (`ref`: or a
    torch_dist source, which megatron-core reads for the reference)."""
    import subprocess
    require_side_env(MEGATRON_PY, "loading with megatron-core itself runs", "scripts/setup-megatron")
    report = tmp_path / "load.json"
    r = subprocess.run([str(MEGATRON_PY), str(REPO / "tests" / "megatron_legacy_load.py"), kind, str(out), str(tp),
                        str(pp), str(ref), str(report), str(vpp), str(iteration)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["ranks"] == tp * pp and got["tensors"] == 53
    assert got["differ"] == [] and got["unexpected"] == []
    if pp == 1:
        # One training step from the loaded model gives the per-token losses
        # (before and after an SGD step) of the same step from the job's own
        # weights at TP=1/PP=1, in the same run: bit for bit at TP 1; at TP 2
        # the row-parallel layers and the vocab-parallel cross entropy sum
        # two partial results, which rounds differently (fp32: a few ulp).
        assert len(got["losses"][0]) == 16 and got["losses"][1] != got["losses"][0]  # the step moved the weights
        for ours, ref in zip(got["losses"], got["ref_losses"]):
            if tp == 1:
                assert ours == ref
            else:
                assert ours == pytest.approx(ref, rel=1e-5, abs=0)
    return got


@pytest.mark.parametrize("tp,pp,ws", [(1, 2, 3), (2, 1, 2), (1, 1, 1)])
def test_megatron_core_loads_the_torch_dist_written_from_legacy(tp, pp, ws, tmp_path, run_ckptconv):
    # The TP=2 x PP=2 legacy job written as torch_dist for ws ranks, loaded at TP x PP.
    got = megatron_core_reads("torch_dist", to_torch_dist(run_ckptconv, ws, tmp_path / "dist"), tp, pp, tmp_path)
    # common.pt's entries, which dist_checkpointing.load hands back beside the model
    assert got["common"] == ["args", "checkpoint_version", "iteration", "num_floating_point_operations_so_far"]


def test_torch_dist_from_legacy_stacks_the_layers_under_the_stored_names(tmp_path, run_ckptconv, megatron_enums):
    # What the directory holds, read with torch alone: the layers stacked
    # on a leading axis under megatron-core's stored names (the local
    # spec's input_layernorm is self_attention.linear_qkv.layer_norm_*),
    # each layer's _extra_state an object shard, and common.pt the job's
    # entries with args as the Namespace it was.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = to_torch_dist(run_ckptconv, 2, tmp_path / "dist")
    assert json.loads((out / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    common = torch.load(out / "common.pt", weights_only=False)
    assert common["iteration"] == 7 and common["checkpoint_version"] == 3.0
    assert common["args"].tensor_model_parallel_size == 2 and common["args"].num_layers == 4
    dcp_to_torch_save(out, tmp_path / "flat.pt")
    flat = torch.load(tmp_path / "flat.pt", weights_only=False)
    ref = load(CASE / "model_ref.pt")
    stacked = {
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
        "decoder.layers.mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
        "decoder.layers.mlp.linear_fc1.weight": "mlp.linear_fc1.weight",
        "decoder.layers.self_attention.linear_proj.weight": "self_attention.linear_proj.weight",
    }
    for key, name in stacked.items():
        assert torch.equal(flat[key], torch.stack([ref[f"decoder.layers.{i}.{name}"] for i in range(4)])), key
    for key in ("embedding.word_embeddings.weight", "output_layer.weight", "decoder.final_layernorm.weight"):
        assert torch.equal(flat[key], ref[key]), key
    assert flat["decoder.layers.mlp.linear_fc2._extra_state/shard_3_4"] == [None]
    assert not any(k.startswith("output_layer._extra_state") or ".input_layernorm." in k for k in flat)


def test_torch_dist_from_legacy_needs_it_read_whole(tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(CASE / "ckpt"), "--layout", "megatron", "--world-size", "2", "-o",
                     str(tmp_path / "out"), "--only", "model")
    assert r.returncode == 2, r.stderr
    assert "read whole" in r.stderr and "args" in r.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------ reshard --layout megatron-legacy --tp --pp


def to_legacy(run_ckptconv, tp, pp, out, *args):
    r = run_ckptconv("reshard", str(CASE / "ckpt"), "--layout", "megatron-legacy", "--tp", str(tp), "--pp", str(pp),
                     "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 1), (1, 1), (2, 2)])
def test_megatron_core_loads_the_legacy_checkpoint_written_for_another_tp_pp(tp, pp, tmp_path, run_ckptconv):
    # Each rank of a model built at TP x PP loads its rank file as
    # Megatron-LM's load_checkpoint does (load_state_dict, strict), its args
    # saying this TP and PP.
    megatron_core_reads("legacy", to_legacy(run_ckptconv, tp, pp, tmp_path / "legacy"), tp, pp, tmp_path)


def test_legacy_output_names_its_rank_folders_and_tracker(tmp_path, run_ckptconv, megatron_enums):
    out = to_legacy(run_ckptconv, 1, 2, tmp_path / "legacy")
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "7"
    assert sorted(p.name for p in (out / ITER).iterdir()) == ["mp_rank_00_000", "mp_rank_00_001"]
    first = load_rank(rank_file(out, "mp_rank_00_000"))
    last = load_rank(rank_file(out, "mp_rank_00_001"))
    src = load_rank(rank_file(CASE / "ckpt", "mp_rank_00_001"))
    assert first["args"].tensor_model_parallel_size == 1 and first["args"].pipeline_model_parallel_size == 2
    assert first["iteration"] == 7 and first["checkpoint_version"] == 3.0
    assert set(src) - set(first) == {"rng_state"}
    # Stage 1 holds layers 2 and 3 as its 0 and 1, the final norm and the output layer.
    ref = load(CASE / "model_ref.pt")
    assert "embedding.word_embeddings.weight" in first["model"] and "output_layer.weight" not in first["model"]
    assert torch.equal(last["model"]["decoder.layers.0.mlp.linear_fc1.weight"], ref["decoder.layers.2.mlp.linear_fc1.weight"])
    assert torch.equal(last["model"]["output_layer.weight"], ref["output_layer.weight"])
    # Read back by ckptconv: the same TP=1/PP=1 model.
    consolidate(run_ckptconv, out, tmp_path / "back.pt", "--only", "model")
    assert_same(load(tmp_path / "back.pt"), ref)


def test_legacy_output_at_tp2_gives_each_rank_its_swiglu_halves_and_query_groups(tmp_path, run_ckptconv,
                                                                                 megatron_enums):
    out = to_legacy(run_ckptconv, 2, 1, tmp_path / "legacy")
    ref = load(CASE / "model_ref.pt")
    fc1 = ref["decoder.layers.1.mlp.linear_fc1.weight"]  # [gate (12); up (12)]
    qkv = ref["decoder.layers.1.self_attention.linear_qkv.weight"]  # 2 query groups of [q q; k; v] rows
    for t in range(2):
        model = load_rank(rank_file(out, f"mp_rank_{t:02d}"))["model"]
        assert torch.equal(model["decoder.layers.1.mlp.linear_fc1.weight"],
                           torch.cat([fc1[6 * t:6 * t + 6], fc1[12 + 6 * t:12 + 6 * t + 6]]))
        assert torch.equal(model["decoder.layers.1.self_attention.linear_qkv.weight"], qkv[8 * t:8 * t + 8])
        assert torch.equal(model["decoder.layers.1.self_attention.linear_proj.weight"],
                           ref["decoder.layers.1.self_attention.linear_proj.weight"][:, 4 * t:4 * t + 4])
        assert torch.equal(model["decoder.layers.1.self_attention.linear_proj.bias"],
                           ref["decoder.layers.1.self_attention.linear_proj.bias"])


@pytest.mark.parametrize("args,code,message", [
    (["--layout", "megatron-legacy", "--tp", "3"], 3, "query groups do not divide over TP 3"),
    (["--layout", "megatron-legacy", "--pp", "3"], 3, "4 layers do not divide into 3 pipeline stages"),
    (["--layout", "megatron-legacy", "--world-size", "2"], 2, "one rank per --tp x --pp"),
    (["--layout", "megatron-legacy", "--only", "model"], 2, "read whole"),
    (["--layout", "megatron", "--world-size", "2", "--tp", "2"], 2, "--tp / --pp"),
    (["--layout", "megatron", "--world-size", "2", "--distributed-optimizer"], 2,
     "--distributed-optimizer: only for a layout written per TP x PP position"),
])
def test_legacy_layout_refusals(args, code, message, tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(CASE / "ckpt"), "-o", str(tmp_path / "out"), *args)
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


def test_legacy_layout_needs_a_source_with_megatron_lm_args(tmp_path, run_ckptconv):
    # A torch_dist checkpoint megatron-core saved alone holds no Megatron-LM
    # args to write into the rank files: exit 3 saying so, nothing made up.
    r = run_ckptconv("reshard", str(REPO / "testdata" / "megatron" / "gpt_tp2pp2" / "ckpt"), "--layout",
                     "megatron-legacy", "--tp", "1", "--pp", "2", "-o", str(tmp_path / "out"))
    assert r.returncode == 3, r.stderr
    assert "no Megatron-LM args in common.pt" in r.stderr and "does not make up" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_torch_dist_save_whose_args_lack_what_a_rank_file_needs_is_refused_naming_them(tmp_path, run_ckptconv):
    # gpt_tp2pp1_mlm's args hold a few entries only (no heads, no padded
    # vocabulary, no layer spec): each missing one named.
    r = run_ckptconv("reshard", str(REPO / "testdata" / "megatron" / "gpt_tp2pp1_mlm" / "ckpt"), "--layout",
                     "megatron-legacy", "--tp", "1", "-o", str(tmp_path / "out"))
    assert r.returncode == 3, r.stderr
    assert "common.pt's args lack num_attention_heads, padded_vocab_size, swiglu" in r.stderr
    assert "transformer_impl" in r.stderr
    assert not (tmp_path / "out").exists()


def test_legacy_output_by_parts_and_dry_run(tmp_path, run_ckptconv):
    # --part: the same files from two processes as from one; --dry-run: each
    # rank file's exact size, nothing written; the RNG states' absence said.
    one = to_legacy(run_ckptconv, 2, 1, tmp_path / "one")
    assert "the RNG states are not written (the optimizer is): load the output with --no-load-rng" in run_ckptconv(
        "reshard", str(CASE / "ckpt"), "--layout", "megatron-legacy", "--tp", "2", "-o", str(tmp_path / "x"),
        "--dry-run").stderr
    for part in ("0/2", "1/2"):
        to_legacy(run_ckptconv, 2, 1, tmp_path / "two", "--part", part)
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert [str(f) for f in files] == ["iter_0000007/mp_rank_00/model_optim_rng.pt",
                                       "iter_0000007/mp_rank_01/model_optim_rng.pt",
                                       "latest_checkpointed_iteration.txt"]
    for f in files:
        assert (one / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f
    r = run_ckptconv("reshard", str(CASE / "ckpt"), "--layout", "megatron-legacy", "--tp", "2", "-o",
                     str(tmp_path / "dry"), "--dry-run")
    assert r.returncode == 0, r.stderr
    size = (one / files[0]).stat().st_size
    # 53 model tensors, and per parameter its step, exp_avg and exp_avg_sq
    assert f"iter_0000007/mp_rank_00/model_optim_rng.pt: {53 * 4} tensors, {size} bytes" in r.stdout
    assert "latest_checkpointed_iteration.txt: 7" in r.stdout
    assert not (tmp_path / "dry").exists()


def test_tied_embeddings_keep_the_last_stages_copy_only_across_stages(tmp_path, run_ckptconv):
    # gpt_pp2_dp2_tied (Megatron-LM's default tied embeddings, vocabulary 17):
    # at PP 1 no output_layer.weight (the TP=1/PP=1 model megatron-core
    # reads: model_ref.pt), at PP 2 the last stage's copy, as the source holds it.
    case = ROOT / "gpt_pp2_dp2_tied"
    consolidate(run_ckptconv, case / "ckpt", tmp_path / "src.pt", "--only", "model")
    for pp, want in ((1, load(case / "model_ref.pt")), (2, load(tmp_path / "src.pt"))):
        out = tmp_path / f"pp{pp}"
        r = run_ckptconv("reshard", str(case / "ckpt"), "--layout", "megatron-legacy", "--pp", str(pp), "-o", str(out))
        assert r.returncode == 0, r.stderr
        consolidate(run_ckptconv, out, tmp_path / f"back{pp}.pt", "--only", "model")
        assert_same(load(tmp_path / f"back{pp}.pt"), want)
    assert "output_layer.weight" in load(tmp_path / "back2.pt") and "output_layer.weight" not in load(tmp_path / "back1.pt")
    # At TP 2 Megatron-LM pads 17 rows to 18: rows the source does not hold.
    r = run_ckptconv("reshard", str(case / "ckpt"), "--layout", "megatron-legacy", "--tp", "2", "-o",
                     str(tmp_path / "tp2"))
    assert r.returncode == 3 and "pads the vocabulary of 17 to 18 rows" in r.stderr, r.stderr
    assert not (tmp_path / "tp2").exists()


def test_a_release_checkpoint_is_written_as_release(tmp_path, run_ckptconv):
    src = copy_ckpt(tmp_path)
    (src / ITER).rename(src / "release")
    (src / "latest_checkpointed_iteration.txt").write_text("release\n")
    r = run_ckptconv("reshard", str(src), "--layout", "megatron-legacy", "--pp", "2", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert sorted(p.name for p in (tmp_path / "out" / "release").iterdir()) == ["mp_rank_00_000", "mp_rank_00_001"]


# ------------------------------------------------------------ the optimizer written with --layout megatron-legacy

OPTIM_PY = REPO / "tests" / "megatron_legacy_optim.py"


def megatron_core_resumes(case, tp, pp, tmp_path, run_ckptconv, dp=1, flags=()):
    """tests/megatron_legacy_optim.py: megatron-core's model and optimizer
    (plain, or the DistributedOptimizer at DP `dp` where the output's args
    say so) at TP x PP load CASE written for that TP x PP, as Megatron-LM's
    load_checkpoint does (ddp.load_state_dict, optimizer.load_state_dict,
    and optimizer.load_parameter_state of distrib_optim.pt), and take a
    training step beside the same step from the source job's own state at
    TP=1/PP=1."""
    import subprocess
    require_side_env(MEGATRON_PY, "loading with megatron-core's own optimizer runs", "scripts/setup-megatron")
    out = tmp_path / "legacy"
    r = run_ckptconv("reshard", str(ROOT / case / "ckpt"), "--layout", "megatron-legacy", "--tp", str(tp), "--pp",
                     str(pp), "-o", str(out), *flags)
    assert r.returncode == 0, r.stderr
    report = tmp_path / "resume.json"
    r = subprocess.run([str(MEGATRON_PY), str(OPTIM_PY), str(out), str(tp), str(pp), str(ROOT / case), str(report),
                        str(dp)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.parametrize("case,tp,pp,dp,flag", [
    ("gpt_tp2pp2", 1, 2, 1, None), ("gpt_tp2pp2", 2, 1, 1, None), ("gpt_tp2_bf16", 1, 1, 1, None),
    ("gpt_tp2_dp2_distopt", 1, 1, 1, None), ("gpt_tp2_dp2_distopt", 1, 1, 2, None),
    ("gpt_tp2pp2", 2, 1, 1, "--distributed-optimizer"), ("gpt_tp2pp2", 1, 2, 2, "--distributed-optimizer"),
    ("gpt_tp2_bf16", 1, 1, 2, "--distributed-optimizer"),
    ("gpt_tp2_dp2_distopt", 1, 1, 1, "--no-distributed-optimizer")])
def test_megatron_core_loads_the_optimizer_and_takes_the_same_step(case, tp, pp, dp, flag, tmp_path, run_ckptconv):
    # A distributed optimizer's source is written as distrib_optim.pt (and a
    # plain one's with --distributed-optimizer), which megatron-core's
    # DistributedOptimizer loads (load_parameter_state) at DP 1 and,
    # scattered from DP rank 0, at DP 2; --no-distributed-optimizer writes
    # the plain optimizer's state instead.
    got = megatron_core_resumes(case, tp, pp, tmp_path, run_ckptconv, dp, [flag] if flag else [])
    assert got["ranks"] == tp * pp * dp and got["problems"] == []
    assert got["distributed"] == (flag == "--distributed-optimizer" or ("distopt" in case and flag is None))
    # What megatron-core's model and optimizer loaded, joined at TP=1/PP=1 by
    # megatron-core: every weight, fp32 master and Adam moment the source
    # job's own (model_ref.pt, optim_ref.pt), bit for bit.
    assert got["model_differ"] == [] and got["optim_differ"] == []
    assert got["optim_compared"] == 53 * (3 if case in WITH_MASTER else 2)
    if pp > 1:
        assert got["losses"] is None  # a pipeline step needs megatron's schedules: not run
        return
    # One Adam step (gradient clipping included) from the loaded state and
    # from the source's state at TP=1/PP=1, in the same run. At TP 1 the
    # same arithmetic: bit-equal losses and weights. At TP 2 the row-parallel
    # layers, the vocab-parallel cross entropy and the gradient norm sum two
    # partial results, which rounds differently in fp32 (measured: 9e-8
    # relative on the losses, 3e-8 on weights the step moved by 1e-2).
    assert got["ref_params"] == 53 and got["stepped_moved"] > 1e-3
    assert got["losses"][1] != got["losses"][0]
    if tp == 1:
        assert got["losses"] == got["ref_losses"] and got["stepped_equal"]
    else:
        for ours, ref in zip(got["losses"], got["ref_losses"]):
            assert ours == pytest.approx(ref, rel=1e-6, abs=0)
        assert got["stepped_max_diff"] <= 1e-6


@pytest.mark.parametrize("case,tp,pp", [("gpt_tp2pp2", 1, 2), ("gpt_tp2pp2", 2, 1), ("gpt_tp2_bf16", 1, 1),
                                        ("gpt_pp2_vpp2", 1, 2), ("gpt_pp2_dp2_buckets", 1, 1),
                                        ("gpt_pp2_dp2_tied", 1, 2), ("gpt_pp2_dp2_tied", 1, 1)])
def test_legacy_output_optimizer_reads_back_as_the_source_per_name(case, tp, pp, tmp_path, run_ckptconv):
    # ckptconv's --only optim of the output is the source's: the same
    # states under the same names, bit for bit (the bytes are copied). A
    # distributed optimizer's is written as distrib_optim.pt again (the
    # bucketed case's first stage in buckets of 500 elements, the tied
    # case's shared embedding in a bucket of its own at PP 2). A tied model
    # at PP 1 has no output-layer copy. (Our reader reading our writer
    # proves little alone: megatron-core's load of it is the proof, above.)
    out = tmp_path / "legacy"
    r = run_ckptconv("reshard", str(ROOT / case / "ckpt"), "--layout", "megatron-legacy", "--tp", str(tp), "--pp",
                     str(pp), "-o", str(out))
    assert r.returncode == 0, r.stderr
    consolidate(run_ckptconv, ROOT / case / "ckpt", tmp_path / "src.pt", "--only", "optim")
    consolidate(run_ckptconv, out, tmp_path / "out.pt", "--only", "optim")
    src, got = load(tmp_path / "src.pt"), load(tmp_path / "out.pt")
    if "dp2" in case:
        assert list(out.rglob("distrib_optim.pt")) and "param" in next(iter(got["state"].values()))
    if pp == 1 and "tied" in case:
        assert "output_layer.weight" not in got["state"]
        del src["state"]["output_layer.weight"]
    assert_same(got, src)


def test_legacy_output_optimizer_is_torch_adams_state_dict_per_rank(tmp_path, run_ckptconv, megatron_enums):
    # TP 2 x PP 1 from TP 2 x PP 2: each rank's state numbered over the two
    # groups (weight decay, then wd_mult 0: biases and 1-d), each state the
    # rank's TP piece of the TP=1 state, cut as the weight is.
    out = to_legacy(run_ckptconv, 2, 1, tmp_path / "legacy")
    consolidate(run_ckptconv, CASE / "ckpt", tmp_path / "src.pt", "--only", "optim")
    src = load(tmp_path / "src.pt")["state"]
    for t in range(2):
        rank = load_rank(rank_file(out, f"mp_rank_{t:02d}"))
        opt, model = rank["optimizer"], rank["model"]
        params = [k for k, v in model.items() if isinstance(v, torch.Tensor)]
        groups = opt["param_groups"]
        assert [g["wd_mult"] for g in groups] == [1.0, 0.0] and all("step" not in g for g in groups)
        members = [[p for p in params if (p.endswith(".bias") or model[p].dim() == 1) == bool(g["wd_mult"] == 0)]
                   for g in groups]
        assert [g["params"] for g in groups] == [list(range(len(members[0]))),
                                                 list(range(len(members[0]), len(params)))]
        named = dict(zip(members[0] + members[1], range(len(params))))
        fc1 = src["decoder.layers.1.mlp.linear_fc1.weight"]["exp_avg"]  # [gate (12); up (12)]
        st = opt["state"][named["decoder.layers.1.mlp.linear_fc1.weight"]]
        assert torch.equal(st["exp_avg"], torch.cat([fc1[6 * t:6 * t + 6], fc1[12 + 6 * t:12 + 6 * t + 6]]))
        proj = src["decoder.layers.1.self_attention.linear_proj.weight"]["exp_avg_sq"]
        st = opt["state"][named["decoder.layers.1.self_attention.linear_proj.weight"]]
        assert torch.equal(st["exp_avg_sq"], proj[:, 4 * t:4 * t + 4])
        assert all(float(s["step"]) == 1.0 and s["exp_avg"].shape == model[p].shape
                   for p, s in ((p, opt["state"][i]) for p, i in named.items()))


def test_the_distributed_optimizer_is_written_as_distrib_optim_pt(tmp_path, run_ckptconv, megatron_enums):
    # TP 1 from TP 2 x DP 2: beside the rank file, distrib_optim.pt as
    # save_parameter_state writes it (one flat fp32 buffer per grad buffer,
    # DP shards gathered); the rank file's `optimizer` holds what the
    # DistributedOptimizer's state_dict gives: param_groups with the step,
    # no state. No warning: the job keeps --use-distributed-optimizer.
    case = ROOT / "gpt_tp2_dp2_distopt"
    out = tmp_path / "legacy"
    r = run_ckptconv("reshard", str(case / "ckpt"), "--layout", "megatron-legacy", "--tp", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "distributed optimizer" not in r.stderr and "1 rank files with distrib_optim.pt" in r.stderr + r.stdout
    rank = load_rank(out / "iter_0000005" / "mp_rank_00" / "model_optim_rng.pt")
    assert rank["args"].use_distributed_optimizer is True
    src = load_rank(case / "ckpt" / "iter_0000005" / "mp_rank_00" / "model_optim_rng.pt")
    assert rank["optimizer"] == src["optimizer"]  # {"optimizer": {"param_groups": [... "step": 1.0]}}
    sd = torch.load(out / "iter_0000005" / "mp_rank_00" / "distrib_optim.pt", weights_only=False)
    assert list(sd) == ["buckets_coalesced", 0] and sd["buckets_coalesced"] is True
    (dtypes, states), = sd[0].items()
    assert dtypes == (torch.float32, torch.float32)
    # 53 parameters at TP 1, each starting at a multiple of 64 elements
    n = states["numel_unpadded"]
    assert list(states) == ["param", "exp_avg", "exp_avg_sq", "numel_unpadded"]
    assert all(states[k].dtype == torch.float32 and states[k].shape == (n,) for k in ("param", "exp_avg", "exp_avg_sq"))
    # The last parameter registered comes first: the output layer (16 x 8).
    consolidate(run_ckptconv, case / "ckpt", tmp_path / "src.pt", "--only", "optim")
    ref = load(tmp_path / "src.pt")["state"]
    assert torch.equal(states["exp_avg"][:128], ref["output_layer.weight"]["exp_avg"].flatten())
    assert torch.equal(states["param"][:128], ref["output_layer.weight"]["param"].flatten())
    assert n == 4544 and not list(out.rglob("distrib_optim.pt"))[1:]


def test_a_source_without_an_optimizer_writes_none_and_says_so(tmp_path, run_ckptconv, megatron_enums):
    root = copy_ckpt(tmp_path)
    for f in root.rglob("model_optim_rng.pt"):  # as a job with --no-save-optim saves
        sd = load_rank(f)
        del sd["optimizer"]
        torch.save(sd, f)
    r = run_ckptconv("reshard", str(root), "--layout", "megatron-legacy", "--pp", "2", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "--no-load-rng --no-load-optim" in r.stderr
    assert "optimizer" not in load_rank(rank_file(tmp_path / "out", "mp_rank_00_001"))
    # Asked for a distributed optimizer there is none to write: a usage error, not a silent no-op.
    r = run_ckptconv("reshard", str(root), "--layout", "megatron-legacy", "--pp", "2", "--distributed-optimizer",
                     "-o", str(tmp_path / "out2"))
    assert r.returncode == 2 and "the source saved no optimizer" in r.stderr, r.stderr
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("arg,value", [("mtp_num_layers", 1), ("num_distributed_optimizer_instances", 2)])
def test_a_distributed_optimizer_with_no_known_layout_is_not_written(tmp_path, run_ckptconv, megatron_enums, arg,
                                                                      value):
    """A plain source whose args the distrib_optim.pt rules do not place (what
    the reader refuses of a distributed source) is not written distributed."""
    root = copy_ckpt(tmp_path)
    for f in root.rglob("model_optim_rng.pt"):
        sd = load_rank(f)
        setattr(sd["args"], arg, value)
        torch.save(sd, f)
    r = run_ckptconv("reshard", str(root), "--layout", "megatron-legacy", "--pp", "2", "--distributed-optimizer",
                     "-o", str(tmp_path / "out"))
    assert r.returncode == 3 and f"args.{arg} {value}" in r.stderr and "--no-distributed-optimizer" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_an_optimizer_whose_layout_is_not_known_is_refused_writing_nothing(tmp_path, run_ckptconv, megatron_enums):
    # A group the 0.16 rules do not make: which parameters it holds is not
    # known, so neither is what to write; refused, not dropped.
    root = copy_ckpt(tmp_path)
    _rewrite(rank_file(root, "mp_rank_01_001"), lambda o: o["param_groups"][0].__setitem__("lr_mult", 2.0),
             "optimizer")
    r = run_ckptconv("reshard", str(root), "--layout", "megatron-legacy", "--pp", "2", "-o", str(tmp_path / "out"))
    assert r.returncode == 3, r.stderr
    assert "reading the optimizer to write it for TP 1 x PP 2" in r.stderr and "standard groups" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_tied_copy_written_at_pp2_from_pp1_gets_the_embeddings_state(tmp_path, run_ckptconv):
    # No fixture is a tied job at PP 1: the tied PP 2 job written at PP 1
    # (no copy) is one. Written at PP 2 again, the last stage's copy of the
    # embedding gets the embedding's optimizer state, as it gets its weight
    # (the two receive the same gradient in a tied job).
    case = ROOT / "gpt_pp2_dp2_tied"
    for pp, src, out in ((1, case / "ckpt", tmp_path / "pp1"), (2, tmp_path / "pp1", tmp_path / "pp2")):
        r = run_ckptconv("reshard", str(src), "--layout", "megatron-legacy", "--pp", str(pp), "-o", str(out))
        assert r.returncode == 0, r.stderr
    consolidate(run_ckptconv, tmp_path / "pp2", tmp_path / "o.pt", "--only", "optim")
    state = load(tmp_path / "o.pt")["state"]
    assert list(state)[-1] == "output_layer.weight"
    assert_same(state["output_layer.weight"], state["embedding.word_embeddings.weight"])


# ------------------------------------------------------------ reshard --layout megatron-legacy from torch_dist

# A Megatron-LM job's torch_dist save (testdata/megatron/gpt_tp2pp2_mlm:
# megatron-core at TP 2 x PP 2 with the DistributedOptimizer, common.pt
# holding the args Megatron-LM's parse_args made for the legacy fixture's
# job, whose model this is).
DIST = REPO / "testdata" / "megatron" / "gpt_tp2pp2_mlm"


def dist_to_legacy(run_ckptconv, tp, pp, out, *args):
    r = run_ckptconv("reshard", str(DIST / "ckpt"), "--layout", "megatron-legacy", "--tp", str(tp), "--pp", str(pp),
                     "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 1)])
def test_megatron_core_loads_the_legacy_checkpoint_written_from_torch_dist(tp, pp, tmp_path, run_ckptconv):
    # Each rank loads its file strictly; the model gathered at TP=1/PP=1 is
    # megatron-core's own dist_checkpointing.load of the torch_dist source
    # (in the same run) bit for bit; at PP 1 the same training step.
    out = dist_to_legacy(run_ckptconv, tp, pp, tmp_path / "legacy")
    megatron_core_reads("legacy", out, tp, pp, tmp_path, ref=DIST / "ckpt")


@pytest.mark.parametrize("tp,pp,flag", [(1, 2, None), (2, 1, None), (1, 1, None), (1, 1, "--no-distributed-optimizer")])
def test_megatron_core_resumes_the_torch_dist_jobs_optimizer_from_legacy(tp, pp, flag, tmp_path, run_ckptconv):
    # The source's fully_reshardable optimizer state, per parameter name, is
    # written as distrib_optim.pt (its args say use_distributed_optimizer),
    # or as the plain optimizer's with --no-distributed-optimizer: megatron-
    # core's model and optimizer load it and hold the source's 53 weights,
    # masters and moments (megatron-core's own TP=1 reading of the source,
    # in the same run) bit for bit, then take the same Adam step.
    import subprocess
    require_side_env(MEGATRON_PY, "loading with megatron-core's own optimizer runs", "scripts/setup-megatron")
    out = dist_to_legacy(run_ckptconv, tp, pp, tmp_path / "legacy", *([flag] if flag else []))
    assert bool(list(out.rglob("distrib_optim.pt"))) == (flag is None)
    report = tmp_path / "resume.json"
    r = subprocess.run([str(MEGATRON_PY), str(OPTIM_PY), str(out), str(tp), str(pp), str(DIST), str(report)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["ranks"] == tp * pp and got["problems"] == [] and got["distributed"] == (flag is None)
    assert got["model_differ"] == [] and got["optim_differ"] == [] and got["optim_compared"] == 53 * 3
    if pp > 1:
        assert got["losses"] is None
        return
    assert got["ref_params"] == 53 and got["stepped_moved"] > 1e-3 and got["losses"][1] != got["losses"][0]
    if tp == 1:
        assert got["losses"] == got["ref_losses"] and got["stepped_equal"]
    else:  # two partial sums in fp32, as for the legacy sources above
        for ours, ref in zip(got["losses"], got["ref_losses"]):
            assert ours == pytest.approx(ref, rel=1e-6, abs=0)
        assert got["stepped_max_diff"] <= 1e-6


def test_legacy_from_torch_dist_holds_the_modules_names_and_the_jobs_entries(tmp_path, run_ckptconv, megatron_enums):
    # The fused layer-norm keys of the local spec back under the module's
    # own names, output_layer._extra_state put back (GPTModel's sharded save
    # leaves it out), the job's entries from common.pt with the new TP and
    # PP and ckpt_format torch; no rng_state. Read back by ckptconv: the
    # legacy fixture's key order (what state_dict gives), and the source's
    # own --only model view per name.
    out = dist_to_legacy(run_ckptconv, 1, 2, tmp_path / "legacy")
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "7"
    first, last = (load_rank(rank_file(out, f"mp_rank_00_{p:03d}")) for p in (0, 1))
    assert list(first) == ["args", "checkpoint_version", "iteration", "model", "optimizer",
                           "num_floating_point_operations_so_far"]
    args = first["args"]
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.ckpt_format) == (1, 2, "torch")
    assert args.use_distributed_optimizer and first["iteration"] == 7
    assert "decoder.layers.1.input_layernorm.weight" in first["model"]
    assert not any("layer_norm_" in k for k in first["model"])
    assert last["model"]["output_layer._extra_state"] is None
    consolidate(run_ckptconv, out, tmp_path / "back.pt", "--only", "model")
    back = load(tmp_path / "back.pt")
    legacy_ref = load(CASE / "model_ref.pt")
    assert list(back) == list(legacy_ref)
    stored = load(DIST / "model_ref.pt")  # megatron-core's reading, the stored names
    for name, value in stored.items():
        module = name.replace("self_attention.linear_qkv.layer_norm_", "input_layernorm.").replace(
            "mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm.")
        if isinstance(value, torch.Tensor):
            assert torch.equal(back[module], value), name


def test_a_torch_dist_optimizer_not_read_per_parameter_leaves_the_model_only(tmp_path, run_ckptconv, megatron_enums):
    # dp_reshardable (flat buckets: which parameter a piece is, is not in
    # the files): the model is written, the optimizer not, and the run says
    # to load with --no-load-optim.
    src = tmp_path / "src"
    shutil.copytree(REPO / "testdata" / "megatron" / "gpt_tp1pp1_dp2_dpresh" / "ckpt", src)
    common = torch.load(src / "common.pt", weights_only=False)
    job = torch.load(DIST / "ckpt" / "common.pt", weights_only=False)
    # the args of the job saved there: the torch_dist fixtures' sizes (2 layers, 2 heads)
    job["args"].num_layers, job["args"].num_attention_heads, job["args"].num_query_groups = 2, 2, 2
    job["args"].tensor_model_parallel_size = job["args"].pipeline_model_parallel_size = 1
    common.update({k: job[k] for k in ("args", "checkpoint_version", "num_floating_point_operations_so_far")})
    torch.save(common, src / "common.pt")
    r = run_ckptconv("reshard", str(src), "--layout", "megatron-legacy", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "the optimizer is not written" in r.stderr and "--no-load-optim" in r.stderr
    state = load_rank(tmp_path / "out" / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt")
    assert "optimizer" not in state and len([k for k in state["model"] if not k.endswith("_extra_state")]) == 29


def test_a_hugging_face_folder_is_not_written_as_legacy_without_args_from(tmp_path, run_ckptconv):
    # A Hugging Face folder holds no Megatron-LM args for the rank files:
    # a usage error naming --args-from (and --layout megatron), nothing written.
    consolidate(run_ckptconv, CASE / "ckpt", str(tmp_path / "hf") + "/", "--only", "model")
    r = run_ckptconv("reshard", str(tmp_path / "hf"), "--layout", "megatron-legacy", "-o", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert "needs --args-from CKPT" in r.stderr and "--layout megatron writes it as torch_dist" in r.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------ reshard HF --layout megatron-legacy --args-from CKPT

# The legacy fixture's model exported to a safetensors folder by ckptconv
# (no architecture map takes it: LayerNorm, biases and learned positions are
# no Hugging Face architecture's, so it keeps megatron's module names), then
# written back as legacy with the job's args taken from a checkpoint.


@pytest.fixture
def hf_of_legacy(tmp_path, run_ckptconv):
    hf = tmp_path / "hf"
    consolidate(run_ckptconv, CASE / "ckpt", f"{hf}/", "--only", "model")
    return hf


def hf_to_legacy(run_ckptconv, hf, tp, pp, out, args_from, *extra):
    r = run_ckptconv("reshard", str(hf), "--layout", "megatron-legacy", "--tp", str(tp), "--pp", str(pp),
                     "--args-from", str(args_from), "-o", str(out), *extra)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("tp,pp,args_from", [(1, 2, CASE / "ckpt"), (2, 1, CASE / "ckpt" / ITER)],
                         ids=["tp1pp2-root", "tp2pp1-iter"])
def test_megatron_core_loads_legacy_written_from_a_hugging_face_folder(tp, pp, args_from, hf_of_legacy, tmp_path,
                                                                       run_ckptconv):
    # Every rank of megatron-core's model at TP x PP loads its file
    # strictly; gathered at TP=1/PP=1 it is model_ref.pt bit for bit; at
    # PP 1 the same training step as from model_ref.pt's weights.
    out = tmp_path / "legacy"
    r = hf_to_legacy(run_ckptconv, hf_of_legacy, tp, pp, out, args_from)
    assert "--no-load-optim" in r.stderr and "--finetune" in r.stderr
    megatron_core_reads("legacy", out, tp, pp, tmp_path, iteration=1)


@pytest.mark.parametrize("args_from", [CASE / "ckpt", DIST / "ckpt"], ids=["legacy", "torch_dist"])
def test_legacy_from_a_hugging_face_folder_carries_the_jobs_args_as_the_converter_writes(args_from, hf_of_legacy,
                                                                                         tmp_path, run_ckptconv,
                                                                                         megatron_enums):
    # CKPT's args (the legacy fixture's own, or the torch_dist job's
    # common.pt) with the new TP and PP and no samples consumed; iteration 1
    # and no floating-point operations, as Megatron-LM's converter saves a
    # converted model; no optimizer, no RNG state.
    out = tmp_path / "legacy"
    hf_to_legacy(run_ckptconv, hf_of_legacy, 1, 2, out, args_from)
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert sorted(p.name for p in (out / "iter_0000001").iterdir()) == ["mp_rank_00_000", "mp_rank_00_001"]
    first = load_rank(out / "iter_0000001" / "mp_rank_00_000" / "model_optim_rng.pt")
    assert list(first) == ["args", "checkpoint_version", "iteration", "model", "num_floating_point_operations_so_far"]
    assert first["iteration"] == 1 and first["checkpoint_version"] == 3.0
    assert first["num_floating_point_operations_so_far"] == 0
    if args_from == CASE / "ckpt":
        job = load_rank(rank_file(CASE / "ckpt", "mp_rank_00_000"))["args"]
    else:
        job = torch.load(DIST / "ckpt" / "common.pt", weights_only=False)["args"]
    got = first["args"]
    assert (got.tensor_model_parallel_size, got.pipeline_model_parallel_size, got.ckpt_format) == (1, 2, "torch")
    # (set to 0 where the args hold them: these fixtures' jobs never trained, so hold none)
    assert getattr(got, "consumed_train_samples", 0) == 0 and getattr(got, "consumed_valid_samples", 0) == 0
    assert got.padded_vocab_size == 16
    changed = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "transformer_pipeline_model_parallel_size",
               "consumed_train_samples", "consumed_valid_samples", "ckpt_format", "padded_vocab_size",
               "virtual_pipeline_model_parallel_size"}
    for key, value in vars(job).items():
        if key not in changed:
            assert getattr(got, key) == value, key
    consolidate(run_ckptconv, out, tmp_path / "back.pt", "--only", "model")
    assert_same(load(tmp_path / "back.pt"), load(CASE / "model_ref.pt"))


def _args_copy(tmp_path, edit):
    """The torch_dist job's checkpoint (the legacy fixture's args in its
    common.pt) with its args edited by torch. (A legacy copy would not do
    for every field: the legacy reader itself refuses args that disagree
    with its rank files, num_layers for one.)"""
    root = tmp_path / "job"
    shutil.copytree(DIST / "ckpt", root)
    common = torch.load(root / "common.pt", weights_only=False)
    edit(common["args"])
    torch.save(common, root / "common.pt")
    return root


LLAMA = REPO / "testdata" / "arch" / "llama_gqa_tp2pp2"  # megatron-core's Llama-shaped GPT, with its HF config


def _llama_job(args, vocab=60):
    """Megatron-LM args for the Llama-shaped GPT of testdata/arch (its
    case.json's model_config), edited from the legacy fixture's job."""
    for key, value in {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_query_groups": 2,
                       "group_query_attention": True, "kv_channels": 8, "ffn_hidden_size": 48, "vocab_size": vocab,
                       "make_vocab_size_divisible_by": 8, "padded_vocab_size": 64, "normalization": "RMSNorm",
                       "add_bias_linear": False, "add_qkv_bias": False, "position_embedding_type": "rope",
                       "swiglu": True, "untie_embeddings_and_output_weights": True}.items():
        setattr(args, key, value)


def test_a_folder_mapped_back_is_written_with_the_jobs_names_and_padding(tmp_path, run_ckptconv, megatron_enums):
    # The Llama export of a megatron-core GPT (ckptconv's forward map), back
    # through the same map to megatron's names, then the module's, cut for
    # TP 2 with the vocabulary padded as the job pads it (60 -> 64: 8 x TP
    # 2). Read back at TP=1/PP=1 by ckptconv's legacy reader: megatron-
    # core's own stored tensors (its --only model reading), zeros in the
    # padding rows the folder does not hold.
    export = tmp_path / "export"
    consolidate(run_ckptconv, LLAMA / "ckpt", f"{export}/", "--only", "model", "--config-from",
                str(LLAMA / "hf_config"))
    out = tmp_path / "legacy"
    r = hf_to_legacy(run_ckptconv, export, 2, 1, out, _args_copy(tmp_path, _llama_job))
    assert "map megatron-gpt-llama (built in), the way back" in r.stderr
    rank = load_rank(out / "iter_0000001" / "mp_rank_01" / "model_optim_rng.pt")
    assert rank["args"].padded_vocab_size == 64 and rank["model"]["embedding.word_embeddings.weight"].shape == (32, 32)
    consolidate(run_ckptconv, out, tmp_path / "back.pt", "--only", "model")
    back = load(tmp_path / "back.pt")
    consolidate(run_ckptconv, LLAMA / "ckpt", tmp_path / "ref.pt", "--only", "model")
    ref = load(tmp_path / "ref.pt")
    compared = 0
    for name, value in ref.items():
        if not isinstance(value, torch.Tensor):
            continue
        module = name.replace("self_attention.linear_qkv.layer_norm_", "input_layernorm.").replace(
            "mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm.")
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            assert torch.equal(back[module][:60], value[:60]) and not back[module][60:].any(), name
        else:
            assert torch.equal(back[module], value), name
        compared += 1
    assert compared == 2 + 1 + 2 * 6 and len([k for k in back if not k.endswith("_extra_state")]) == compared
    # The config's vocabulary against the job's: named with both.
    r = run_ckptconv("reshard", str(export), "--layout", "megatron-legacy", "--tp", "2", "--args-from",
                     str(_args_copy(tmp_path / "b", lambda a: _llama_job(a, vocab=61))), "-o", str(tmp_path / "o2"))
    assert r.returncode == 3, r.stderr
    assert "args.vocab_size is 61, but config.json's vocab_size is 60" in r.stderr
    assert not (tmp_path / "o2").exists()


@pytest.mark.parametrize("edit,lines", [
    (lambda a: setattr(a, "num_layers", 2), ["args.num_layers is 2, but the folder holds 4 layers"]),
    (lambda a: setattr(a, "kv_channels", 4),
     ["args.num_attention_heads is 4, but linear_proj's 8 input columns are 2 heads of 4 channels"]),
    (lambda a: setattr(a, "num_attention_heads", 2),  # then 4 channels a head: 1 group in the rows left
     ["args.num_query_groups is 2, but linear_qkv's 16 rows hold 1 query groups of 4 channels (args.kv_channels, "
      "else hidden_size / num_attention_heads 2)"]),
    (lambda a: setattr(a, "num_query_groups", 4), ["args.num_query_groups is 4, but linear_qkv's 16 rows hold 2 query"]),
    (lambda a: setattr(a, "ffn_hidden_size", 24), ["args.ffn_hidden_size is 24, but linear_fc2 has 12 input columns"]),
    (lambda a: setattr(a, "swiglu", False), ["args.swiglu is False, but linear_fc1 has 24 rows"]),
    (lambda a: (setattr(a, "normalization", "RMSNorm"), setattr(a, "add_bias_linear", False)),
     ["args.normalization is 'RMSNorm', but its layer norms have biases (LayerNorm)",
      "args.add_bias_linear is False, but linear_proj has bias", "args.add_qkv_bias is False, but linear_qkv has bias"]),
    (lambda a: setattr(a, "position_embedding_type", "rope"),
     ["args.position_embedding_type is 'rope', but the folder holds learned position embeddings"]),
    (lambda a: setattr(a, "hidden_size", 16), ["args.hidden_size is 16, but the folder's word embeddings are 8 wide"]),
], ids=["layers", "channels", "heads", "groups", "ffn", "swiglu", "norm-bias", "positions", "hidden"])
def test_args_that_do_not_describe_the_folders_model_are_refused_naming_each_field(edit, lines, hf_of_legacy,
                                                                                   tmp_path, run_ckptconv,
                                                                                   megatron_enums):
    job = _args_copy(tmp_path, edit)
    r = run_ckptconv("reshard", str(hf_of_legacy), "--layout", "megatron-legacy", "--args-from", str(job), "-o",
                     str(tmp_path / "out"))
    assert r.returncode == 3, r.stderr
    assert "do not describe this model (nothing written)" in r.stderr
    for line in lines:
        assert line in r.stderr
    assert not (tmp_path / "out").exists()


def test_args_of_another_real_job_are_refused(hf_of_legacy, tmp_path, run_ckptconv):
    # gpt_pp2_dp2_tied: the same layer sizes, but tied embeddings and a
    # vocabulary of 17: two fields named, each with both values.
    r = run_ckptconv("reshard", str(hf_of_legacy), "--layout", "megatron-legacy", "--args-from",
                     str(ROOT / "gpt_pp2_dp2_tied" / "ckpt"), "-o", str(tmp_path / "out"))
    assert r.returncode == 3, r.stderr
    assert "args.untie_embeddings_and_output_weights is False, but the folder holds an output layer" in r.stderr
    assert "args.padded_vocab_size is 17, but the folder's word embeddings have 16 rows" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args_from,code,message", [
    (REPO / "testdata" / "megatron" / "gpt_tp2pp2" / "ckpt", 3, "no Megatron-LM args in it (common.pt holds none"),
    ("missing", 3, "no such file or directory"),
    ("hf", 2, "a Hugging Face model folder, not a Megatron-LM checkpoint"),
], ids=["torch-dist-without-args", "missing", "not-megatron"])
def test_args_from_a_checkpoint_without_args_is_refused(args_from, code, message, hf_of_legacy, tmp_path,
                                                        run_ckptconv):
    src = tmp_path / args_from if isinstance(args_from, str) else args_from
    r = run_ckptconv("reshard", str(hf_of_legacy), "--layout", "megatron-legacy", "--args-from", str(src), "-o",
                     str(tmp_path / "out"))
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("src,args,message", [
    ("hf", ["--layout", "megatron", "--world-size", "1"], "--args-from: only for --layout megatron-legacy"),
    ("legacy", ["--layout", "megatron-legacy"], "--args-from: only for a Hugging Face folder source"),
])
def test_args_from_outside_its_use_is_a_usage_error(src, args, message, hf_of_legacy, tmp_path, run_ckptconv):
    source = hf_of_legacy if src == "hf" else CASE / "ckpt"
    r = run_ckptconv("reshard", str(source), "--args-from", str(CASE / "ckpt"), "-o", str(tmp_path / "out"), *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------ --vpp: virtual pipeline stages written


@pytest.mark.parametrize("src,ref", [(CASE / "ckpt", CASE / "model_ref.pt"), (DIST / "ckpt", DIST / "ckpt")],
                         ids=["legacy", "torch_dist"])
def test_megatron_core_loads_virtual_stages_at_pp2_vpp2(src, ref, tmp_path, run_ckptconv):
    # Each pipeline rank's model0 and model1 load strictly into megatron-
    # core's two GPTModel stages (vp_stage 0 and 1, which megatron-core
    # gives the interleaved schedule's layers: rank p stage v holds the
    # (2v + p)-th layer); their args say 2 virtual stages; the model they
    # hold, gathered by megatron-core at TP=1/PP=1, is the source's bit for bit.
    out = tmp_path / "legacy"
    r = run_ckptconv("reshard", str(src), "--layout", "megatron-legacy", "--pp", "2", "--vpp", "2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "TP 1 x PP 2 x VPP 2, 2 rank files" in r.stderr
    megatron_core_reads("legacy", out, 1, 2, tmp_path, ref=ref, vpp=2)


def test_virtual_stages_hold_interleaved_layers_and_read_back_as_the_source(tmp_path, run_ckptconv, megatron_enums):
    out = to_legacy(run_ckptconv, 1, 2, tmp_path / "legacy", "--vpp", "2")
    ref = load(CASE / "model_ref.pt")
    for p in range(2):
        state = load_rank(rank_file(out, f"mp_rank_00_{p:03d}"))
        assert [k for k in state if k.startswith("model")] == ["model0", "model1"]
        assert state["args"].virtual_pipeline_model_parallel_size == 2
        assert state["args"].num_virtual_stages_per_pipeline_rank == 2
        for v in range(2):
            chunk = state[f"model{v}"]
            assert torch.equal(chunk["decoder.layers.0.mlp.linear_fc2.weight"],
                               ref[f"decoder.layers.{2 * v + p}.mlp.linear_fc2.weight"])
            assert not any(k.startswith("decoder.layers.1.") for k in chunk)
            assert ("embedding.word_embeddings.weight" in chunk) == (p == 0 and v == 0)
            assert ("output_layer.weight" in chunk) == (p == 1 and v == 1)
    # Read back by ckptconv (its VPP reading is proven on Megatron-LM's own
    # gpt_pp2_vpp2): the TP=1/PP=1 model, and the optimizer per name, the source's.
    consolidate(run_ckptconv, out, tmp_path / "back.pt", "--only", "model")
    assert_same(load(tmp_path / "back.pt"), ref)
    consolidate(run_ckptconv, CASE / "ckpt", tmp_path / "src-optim.pt", "--only", "optim")
    for flags in ([], ["--tp", "2", "--distributed-optimizer"]):
        again = tmp_path / f"again{len(flags)}"
        r = run_ckptconv("reshard", str(CASE / "ckpt"), "--layout", "megatron-legacy", "--pp", "2", "--vpp", "2",
                         "-o", str(again), *flags)
        assert r.returncode == 0, r.stderr
        consolidate(run_ckptconv, again, tmp_path / f"back-optim{len(flags)}.pt", "--only", "optim")
        got, want = load(tmp_path / f"back-optim{len(flags)}.pt"), load(tmp_path / "src-optim.pt")
        for name, states in want["state"].items():
            for kind in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(got["state"][name][kind], states[kind]), (flags, name, kind)


@pytest.mark.parametrize("args,code,message", [
    (["--pp", "1", "--vpp", "2"], 2, "--vpp 2: virtual pipeline stages interleave over pipeline ranks"),
    (["--pp", "4", "--vpp", "2"], 3, "4 layers do not divide into 8 virtual pipeline stages"),
    (["--pp", "2", "--vpp", "0"], 2, "--tp, --pp and --vpp must be at least 1"),
])
def test_virtual_stage_refusals(args, code, message, tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(CASE / "ckpt"), "--layout", "megatron-legacy", "-o", str(tmp_path / "out"), *args)
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


def test_torch_dist_to_legacy_with_virtual_stages_by_parts_is_the_single_process_output(tmp_path, run_ckptconv):
    # --part (the request kept beside the parts carries --vpp): the same
    # files as one process, distrib_optim.pt's two chunks' buffers included.
    one = dist_to_legacy(run_ckptconv, 1, 2, tmp_path / "one", "--vpp", "2")
    for part in ("0/2", "1/2"):
        dist_to_legacy(run_ckptconv, 1, 2, tmp_path / "two", "--vpp", "2", "--part", part)
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert len(files) == 5 and sum(f.name == "distrib_optim.pt" for f in files) == 2
    for f in files:
        assert (one / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f
