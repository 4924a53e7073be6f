"""Hostile input, fourth pass (#49): the surfaces added since the third --
completions, HF folders, DCP-HF, Megatron torch_dist, DeepSpeed universal
checkpoints, FSDP1 flat parameters. Every reproducer is generated here,
with the real library where one writes the format (torch's DCP writer,
safetensors, h5py, a real FSDP1 job), and every run is bounded by a hang
guard (a timeout, never a timing assertion). Each case names the row of
the issue it is."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TESTDATA = REPO / "testdata"
DCP = TESTDATA / "dcp" / "fsdp2_adamw_ws2"
HANG_GUARD_S = 120


def _not_a_signal(r: subprocess.CompletedProcess) -> None:
    assert r.returncode >= 0 and r.returncode not in (134, 136, 139), (r.returncode, r.stderr[-2000:])


# ---- row 1: completion never evaluates a name it offers ----------------------

def _hostile_root(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(DCP, root / "step-100")
    shutil.copytree(DCP, root / "step-200$(id>PWNED)")
    return root


def test_bash_tag_completion_does_not_run_a_folder_name(tmp_path, ckptconv, run_ckptconv):
    root = _hostile_root(tmp_path)
    script = run_ckptconv("completion", "bash").stdout
    work = tmp_path / "work"
    work.mkdir()
    words = " ".join("'" + w + "'" for w in (str(ckptconv), "reshard", str(root), "--tag", ""))
    prog = (f"{script}\nCOMP_WORDS=({words})\nCOMP_CWORD=4\n_ckptconv\n"
            "printf '%s\\n' \"${COMPREPLY[@]}\"\n"
            # what the shell runs once the user accepts the completion
            "eval \"printf '<%s>\\n' ${COMPREPLY[2]}\"\n")
    r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, cwd=work, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:3] == ["latest", "step-100", "step-200\\$\\(id\\>PWNED\\)"], lines
    assert lines[3] == "<step-200$(id>PWNED)>"  # the accepted word is the folder's name, literally
    assert not (work / "PWNED").exists() and not (root / "PWNED").exists()


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is installed by scripts/setup")
def test_zsh_tag_completion_does_not_run_a_folder_name(tmp_path, ckptconv, run_ckptconv):
    root = _hostile_root(tmp_path)
    script = run_ckptconv("completion", "zsh").stdout
    tags_fn = script.split("_ckptconv_tags() {", 1)[1].split("\n}\n", 1)[0]
    work = tmp_path / "work"
    work.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ckptconv").symlink_to(ckptconv)
    # compadd stubbed to print the words it is given; the function itself is
    # the generated one, run as zsh runs it for `ckptconv reshard ROOT --tag <TAB>`.
    prog = ("compadd() { [[ $1 == -a ]] && print -rl -- \"${(@P)2}\" }\n"
            f"_ckptconv_tags() {{{tags_fn}\n}}\n"
            f"words=(ckptconv reshard '{root}' --tag '')\nCURRENT=5\n_ckptconv_tags 1\n")
    r = subprocess.run(["zsh", "-f", "-c", prog], capture_output=True, text=True, cwd=work, timeout=60,
                       env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["latest", "step-100", "step-200$(id>PWNED)"], r.stdout
    assert not (work / "PWNED").exists() and not (root / "PWNED").exists()


# ---- row 4: one containment rule for every file a reader opens or a writer copies

def _outside(tmp_path: Path, src: Path) -> Path:
    """A copy of `src` outside the checkpoint, private (0600)."""
    away = tmp_path / "elsewhere"
    away.mkdir(exist_ok=True)
    dst = away / ("x-" + src.name)
    shutil.copyfile(src, dst)
    dst.chmod(0o600)
    return dst


def _link_out(tmp_path: Path, ckpt: Path, rel: str) -> None:
    f = ckpt / rel
    target = _outside(tmp_path, f if f.exists() else TESTDATA / "hf" / "single" / "config.json")
    if f.exists():
        f.unlink()
    f.symlink_to(target)


def _ucp(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(TESTDATA / "ucp" / "z2_bf16_ws2", root)
    return root


LINKED = {
    # case: (fixture copied, file linked out, command)
    "hf-side-file": (TESTDATA / "hf" / "single", "tokenizer.json", ["consolidate", "{src}", "-o", "{out}/"]),
    "hf-weights": (TESTDATA / "hf" / "single", "model.safetensors", ["inspect", "{src}"]),
    "indexed-shard": (TESTDATA / "hf" / "sharded", "model-00002-of-00003.safetensors", ["inspect", "{src}"]),
    "indexed-shard-via-index": (TESTDATA / "hf" / "sharded", "model-00002-of-00003.safetensors",
                                ["inspect", "{src}/model.safetensors.index.json"]),
    "dcp-hf-rank-file": (TESTDATA / "dcp_hf" / "fsdp2_ws3", "shard-00002-model-00001-of-00001.safetensors",
                         ["inspect", "{src}"]),
    "megatron-common": (TESTDATA / "megatron" / "gpt_tp1pp1" / "ckpt", "common.pt", ["inspect", "{src}"]),
    "megatron-metadata": (TESTDATA / "megatron" / "gpt_tp1pp1" / "ckpt", "metadata.json",
                          ["reshard", "{src}", "-o", "{out}", "--world-size", "2"]),
    "ucp-model-states": (TESTDATA / "ucp" / "z2_bf16_ws2", "global_step3_universal/mp_rank_00_model_states.pt",
                         ["inspect", "{src}"]),
    "ucp-optimizer-state": (TESTDATA / "ucp" / "z2_bf16_ws2", "global_step3_universal/zero/optimizer_state.pt",
                            ["inspect", "{src}"]),
    "lightning-meta": (None, "meta.pt", ["reshard", "{src}", "-o", "{out}", "--world-size", "2", "--layout", "dcp"]),
}


def _lightning_dcp() -> Path:
    found = sorted(p.parent for p in (TESTDATA / "frameworks" / "lightning_fsdp1_ws2").rglob("meta.pt"))
    assert found, "the Lightning fixture holds a meta.pt"
    return found[0]


@pytest.mark.parametrize("case", sorted(LINKED))
def test_a_file_linked_out_of_the_checkpoint_is_refused(case, tmp_path, run_ckptconv):
    fixture, rel, command = LINKED[case]
    src = tmp_path / "ckpt"
    shutil.copytree(fixture or _lightning_dcp(), src)
    _link_out(tmp_path, src, rel)
    out = tmp_path / "out"
    args = [a.replace("{src}", str(src)).replace("{out}", str(out)) for a in command]
    r = run_ckptconv(*args, timeout=HANG_GUARD_S)
    assert r.returncode == 3, (case, r.returncode, r.stderr)
    assert "outside the checkpoint directory" in r.stderr and "--follow-links" in r.stderr, r.stderr
    assert Path(rel).name in r.stderr, r.stderr
    assert not out.exists() and not list(tmp_path.glob("out*"))
    # trusted input: the same command reads it
    r = run_ckptconv("--follow-links", *args, timeout=HANG_GUARD_S)
    assert r.returncode == 0, (case, r.stderr)


def test_a_symlinked_source_named_by_the_user_is_read(tmp_path, run_ckptconv):
    """The paths a user types are trusted as given: SRC itself may be a link."""
    link = tmp_path / "model.safetensors"
    link.symlink_to(TESTDATA / "hf" / "single" / "model.safetensors")
    assert run_ckptconv("inspect", link).returncode == 0
    folder = tmp_path / "folder"
    folder.symlink_to(TESTDATA / "hf" / "sharded")
    assert run_ckptconv("inspect", folder).returncode == 0


# ---- row 5: un-stacking a torch_dist key is bounded by the slices it makes ----

def _torch_dist(path: Path, items: dict, compress: bool = False) -> Path:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    extensions = {}
    if compress:
        from torch.distributed.checkpoint._extension import ZStandard
        extensions = {"_extensions": [ZStandard()]}
    dcp.save(dict(items), no_dist=True, storage_writer=FileSystemWriter(str(path), **extensions))
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
                                        '"common_backend": "torch", "common_backend_version": 1}')
    return path


def _peak_rss_mb(ckptconv: Path, *args) -> tuple[subprocess.CompletedProcess, float]:
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", str(ckptconv), *map(str, args)],
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    kb = [line for line in r.stderr.splitlines() if line.startswith("maxrss_kb=")]
    return r, int(kb[-1].split("=")[1]) / 1024


def test_a_compressed_stack_of_a_million_layers_is_refused_in_bounded_memory(tmp_path, ckptconv):
    src = _torch_dist(tmp_path / "ckpt", {"decoder.layers.w": torch.zeros(1_000_000, 1, dtype=torch.uint8)},
                      compress=True)
    assert sum(f.stat().st_size for f in src.iterdir()) < 64 * 1024
    r, mb = _peak_rss_mb(ckptconv, "inspect", src, "--only", "model")
    assert r.returncode == 3, r.stderr
    assert "is stacked 1000000 deep under 'decoder.layers.'" in r.stderr and "16384" in r.stderr, r.stderr
    assert mb < 256, mb


def test_a_stack_within_the_bound_is_split(tmp_path, run_ckptconv):
    src = _torch_dist(tmp_path / "ckpt", {"decoder.layers.w": torch.arange(6.0).reshape(3, 2)})
    out = tmp_path / "m.pt"
    r = run_ckptconv("consolidate", src, "--only", "model", "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)
    assert list(got) == [f"decoder.layers.{i}.w" for i in range(3)]
    assert torch.equal(got["decoder.layers.1.w"], torch.tensor([2.0, 3.0]))


# ---- row 6: a sharded object of thousands of dimensions -----------------------

@pytest.mark.parametrize("dims", [9, 4000, 5000])
def test_an_object_of_too_many_dimensions_is_refused(dims, tmp_path, run_ckptconv):
    key = "x._extra_state/shard_" + ".".join(["0"] * dims) + "_" + ".".join(["1"] * dims)
    src = _torch_dist(tmp_path / "ckpt", {"w": torch.ones(2), key: [None]})
    for args in (["inspect", src], ["validate", src], ["consolidate", src, "-o", tmp_path / "o.pt"]):
        r = run_ckptconv(*args, timeout=HANG_GUARD_S)
        _not_a_signal(r)
        assert r.returncode in (1, 3), (args[0], r.stderr)
        assert f"a {dims}-d shape; megatron-core's objects have at most 8 axes" in r.stdout + r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_an_object_of_three_dimensions_is_read(tmp_path, run_ckptconv):
    items = {"w": torch.ones(2)}
    for i in range(2):
        items[f"rng_state/shard_0.{i}.0_1.2.1"] = [{"rank": i}]
    src = _torch_dist(tmp_path / "ckpt", items)
    out = tmp_path / "o.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 0, r.stderr
    assert torch.load(out, weights_only=True)["rng_state"] == [[[{"rank": 0}], [{"rank": 1}]]]


# ---- row 7: every JSON a checkpoint carries is parsed in linear time ----------
# Sizes where a quadratic parse (ordered insertion: 82 s at 160k names) runs
# for many minutes, past the hang guard, while a linear one takes seconds.

QUADRATIC_SCALE = 600_000


def test_an_index_of_600k_names_is_parsed_in_linear_time(tmp_path, run_ckptconv):
    from safetensors.torch import save_file
    src = tmp_path / "hf"
    src.mkdir()
    save_file({"model.t0": torch.ones(1)}, src / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {f"model.t{i}": "model-00001-of-00001.safetensors"
                                            for i in range(QUADRATIC_SCALE)}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "o.pt", timeout=HANG_GUARD_S)
    assert r.returncode == 3, r.stderr
    assert "weight_map lists tensor 'model.t1' that no shard holds" in r.stderr, r.stderr[-1000:]


def test_an_index_of_100k_names_reads_whole(tmp_path, run_ckptconv):
    from safetensors.torch import save_file
    src = tmp_path / "hf"
    src.mkdir()
    n = 100_000
    base = torch.arange(float(n))
    save_file({f"model.t{i}": base[i:i + 1].clone() for i in range(n)}, src / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {f"model.t{i}": "model-00001-of-00001.safetensors" for i in range(n)}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    r = run_ckptconv("validate", src, "--json", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["tensors"] == n


def test_dcp_sharding_info_of_400k_members_is_parsed_in_linear_time(tmp_path, run_ckptconv):
    from safetensors.torch import save_file
    src = tmp_path / "dcphf"
    src.mkdir()
    info = {f"t{i}": {"saved_offsets": [0]} for i in range(400_000)}
    info["w"] = {"saved_offsets": [0]}
    save_file({"w": torch.ones(3)}, src / "shard-00001-model-00001-of-00001.safetensors",
              metadata={"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0"})
    r = run_ckptconv("inspect", src, timeout=HANG_GUARD_S)
    _not_a_signal(r)
    assert r.returncode == 0, r.stderr
    assert "w" in r.stdout


def test_hdf5_json_value_of_400k_members_is_parsed_in_linear_time(tmp_path, run_ckptconv):
    import h5py
    src = tmp_path / "v.h5"
    n = 400_000
    with h5py.File(src, "w") as f:
        f.attrs["ckptconv.layout_version"] = 1
        f.attrs["ckptconv.kind"] = "dict"
        f.attrs["ckptconv.keys"] = '["v"]'
        f.attrs["v"] = json.dumps({f"k{i}": i for i in range(n)})
    r = run_ckptconv("convert", src, "-o", tmp_path / "o.pt", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "o.pt", weights_only=True)["v"]
    assert len(got) == n and got[f"k{n - 1}"] == n - 1 and list(got)[:2] == ["k0", "k1"]


@pytest.mark.parametrize("text,message", [
    ('{"weight_map": {"a": "m.safetensors", "a": "m.safetensors"}}', "weight_map names 'a' twice"),
    ("[" * 100 + "]" * 100, "nests deeper than 64 levels"),
])
def test_index_json_limits_are_the_shared_ones(text, message, tmp_path, run_ckptconv):
    from safetensors.torch import save_file
    src = tmp_path / "hf"
    src.mkdir()
    save_file({"a": torch.ones(1)}, src / "m.safetensors")
    (src / "model.safetensors.index.json").write_text(text)
    r = run_ckptconv("inspect", src / "model.safetensors.index.json")
    assert r.returncode == 3 and message in r.stderr, r.stderr


# ---- row 8: a universal checkpoint naming 150k modules ------------------------
# 40k names took 25 s with a scan per name; 150k would take six minutes.

def test_ucp_of_150k_module_names_is_read_in_linear_time(tmp_path, run_ckptconv):
    root = _ucp(tmp_path)
    states = root / "global_step3_universal" / "mp_rank_00_model_states.pt"
    sd = torch.load(states, weights_only=False)
    n = 150_000
    extra = torch.arange(float(n))
    for i in range(n):
        sd["module"][f"extra.{i}"] = extra[i:i + 1]
    torch.save(sd, states)
    r = run_ckptconv("inspect", root, "--json", timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    names = {t["path"] for t in json.loads(r.stdout)["tensors"]}
    assert "model.extra.0" in names and f"model.extra.{n - 1}" in names


# ---- row 9: a universal checkpoint of more files than descriptors -------------

def _limit_files(n: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


def test_a_ucp_of_1200_files_reads_under_ulimit_n_1024(tmp_path, ckptconv, run_ckptconv):
    n = 300
    model = {f"layer{i}.weight": torch.full((2,), float(i)) for i in range(n)}
    state = {k: {"step": torch.tensor(1.0), "exp_avg": v + 0.5, "exp_avg_sq": v + 0.25} for k, v in model.items()}
    optim = {"state": state, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.0,
                                                "params": list(model)}]}
    torch.save({"model": model, "optim": optim}, tmp_path / "full.pt")
    ucp = tmp_path / "root" / "step1_universal"
    ucp.parent.mkdir()
    r = run_ckptconv("reshard", tmp_path / "full.pt", "-o", ucp, "--layout", "deepspeed-universal")
    assert r.returncode == 0, r.stderr
    assert sum(1 for _ in ucp.rglob("*.pt")) >= 4 * n
    out = tmp_path / "back.pt"
    for args in (["inspect", ucp], ["validate", ucp], ["consolidate", ucp, "-o", out]):
        r = subprocess.run([str(ckptconv), *map(str, args)], capture_output=True, text=True, timeout=HANG_GUARD_S,
                           preexec_fn=_limit_files(1024))
        assert r.returncode == 0, (args[0], r.stderr[-2000:])
    got = torch.load(out, weights_only=True)
    assert torch.equal(got["model"]["layer299.weight"], model["layer299.weight"])
    assert torch.equal(got["optim"]["state"]["layer7.weight"]["exp_avg_sq"], state["layer7.weight"]["exp_avg_sq"])
    # Out of descriptors is a resource limit of this process, not bad input: exit 4.
    r = subprocess.run([str(ckptconv), "inspect", ucp], capture_output=True, text=True, timeout=HANG_GUARD_S,
                       preexec_fn=_limit_files(12))
    _not_a_signal(r)
    assert r.returncode == 4, r.stderr


# ---- row 10: a pointer file the job read is not rewritten ----------------------

def test_reshard_into_its_own_root_keeps_latest_universal(tmp_path, run_ckptconv):
    root = _ucp(tmp_path)
    before = (root / "latest_universal").read_bytes()
    r = run_ckptconv("reshard", root, "-o", root / "global_step9_universal", "--layout", "deepspeed-universal")
    assert r.returncode == 0, r.stderr
    assert (root / "global_step9_universal" / "zero" / "optimizer_state.pt").is_file()
    assert (root / "latest_universal").read_bytes() == before
    assert "--update-latest" in r.stderr
    r = run_ckptconv("reshard", root, "-o", root / "global_step10_universal", "--layout", "deepspeed-universal",
                     "--update-latest")
    assert r.returncode == 0, r.stderr
    assert (root / "latest_universal").read_bytes() == b"global_step10_universal"


@pytest.mark.parametrize("name", ["latest_universal", "latest"])
def test_a_tag_folder_named_like_the_pointer_is_refused_before_writing(name, tmp_path, run_ckptconv):
    root = _ucp(tmp_path)
    out = tmp_path / "lu"
    out.mkdir()
    r = run_ckptconv("reshard", root, "-o", out / name, "--layout", "deepspeed-universal")
    assert r.returncode == 2, r.stderr
    assert "cannot be named" in r.stderr
    assert list(out.iterdir()) == []


# ---- row 11: FSDP1's optimizer subset matched in O(N) memory -------------------

FSDP1_JOB = r"""
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

class Many(nn.Module):
    # every parameter one element but one of three: the one the optimizer leaves out
    def __init__(self, n):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.full((3 if i == n // 4 else 1,), float(i)))
                                    for i in range(n)])
    def forward(self):
        return sum((p * p).sum() for p in self.ps)

def job(rank, out, n):
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    if rank == 0:
        torch.save(Many(n).state_dict(), f"{out}/layout.pt")
    model = FSDP(Many(n), device_id=torch.device("cpu"), use_orig_params=True)
    optim = torch.optim.Adam([p for i, p in enumerate(model.parameters()) if i != n // 4], lr=0.1, foreach=False)
    model().backward()
    optim.step()
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        torch.save(model.state_dict(), f"{out}/model_rank{rank}.pt")
    torch.save(optim.state_dict(), f"{out}/optim_rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(job, args=(sys.argv[1], int(sys.argv[2])), nprocs=2, join=True)
"""


def test_fsdp1_optimizer_over_all_but_one_of_20k_parameters(tmp_path, ckptconv):
    """A real FSDP1 job (gloo, world size 2, use_orig_params=True) of 20,000
    parameters whose optimizer holds all but one: the one left out is told
    apart by its state lengths, in memory linear in the parameters."""
    n = 20_000
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (tmp_path / "job.py").write_text(FSDP1_JOB)
    job = subprocess.run([sys.executable, str(tmp_path / "job.py"), str(ckpt), str(n)], capture_output=True,
                         text=True, timeout=900)
    assert job.returncode == 0, job.stderr[-3000:]
    (ckpt / "store").unlink(missing_ok=True)
    layout = tmp_path / "layout.pt"
    (ckpt / "layout.pt").rename(layout)
    raw = [torch.load(ckpt / f"optim_rank{r}.pt", weights_only=True) for r in range(2)]
    out = tmp_path / "o.pt"
    r, mb = _peak_rss_mb(ckptconv, "consolidate", ckpt, "--param-layout", layout, "-o", out)
    assert r.returncode == 0, r.stderr[-3000:]
    got = torch.load(out, weights_only=True)["optim"]
    names = [f"ps.{i}" for i in range(n) if i != n // 4]
    assert got["param_groups"][0]["params"] == names
    for k in (0, n // 4, n - 2):  # id k is parameter names[k]: its state on the rank that holds it
        held = [o["state"][k]["exp_avg"] for o in raw if k in o["state"] and o["state"][k]["exp_avg"].numel()]
        assert len(held) == 1 and torch.equal(got["state"][names[k]]["exp_avg"].flatten(), held[0].flatten())
    assert mb < 1024, mb  # the choice table alone was 1.7 GB


# ---- the sweep: rank numbers no job has ----------------------------------------

def test_a_rank_file_numbered_past_any_world_size_is_no_internal_error(tmp_path, run_ckptconv):
    """A ZeRO file whose rank has 11 digits threw std::out_of_range from
    stoi (exit 5, "internal error"); rank numbers are read as at most 6
    digits, so such a file is no rank file of the job."""
    root = tmp_path / "zero"
    shutil.copytree(TESTDATA / "zero" / "z2_bf16_ws2", root)
    tag = root / (root / "latest").read_text().strip()
    first = sorted(tag.glob("*zero_pp_rank_0_mp_rank_00_optim_states.pt"))[0]
    shutil.copyfile(first, tag / first.name.replace("rank_0_mp", "rank_99999999999_mp"))
    for cmd in (["inspect", root], ["validate", root], ["consolidate", root, "-o", tmp_path / "o.pt"]):
        r = run_ckptconv(*cmd)
        _not_a_signal(r)
        assert r.returncode in (0, 1, 3), (cmd[0], r.returncode, r.stderr)
        assert "internal error" not in r.stderr
