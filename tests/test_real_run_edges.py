"""The rough edges of a real run (#48): what inspect says of a Megatron job
saved with model parallelism, and the messages a user meets on the way.
Fixtures are real megatron-core checkpoints from testdata/megatron."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

TD = Path(__file__).resolve().parent.parent / "testdata"


@pytest.mark.parametrize("case", ["gpt_tp2pp2", "gpt_tp1pp1_dp2_dpresh"])
def test_inspect_a_megatron_job_gives_its_world_size_as_a_bound_and_its_parameters(case, run_ckptconv):
    src = TD / "megatron" / case / "ckpt"
    saved = json.loads((TD / "megatron" / case / "case.json").read_text())
    r = run_ckptconv("inspect", src)
    assert r.returncode == 0, r.stderr
    files = {int(p.name.split("_")[2]) for p in src.glob("__*_*.distcp")}  # __<rank>_<i>.distcp
    # the ranks that wrote files, said as a lower bound (DP replicas write none)
    assert f"world_size: ≥ {len(files)} (the ranks that wrote files" in r.stdout, r.stdout
    assert len(files) <= saved["world_size"]
    # the parameters line, as every other kind prints it: the model's numel
    # as model.state_dict() counts it (the --only model export's tensors)
    line = next(l for l in r.stdout.splitlines() if l.strip().startswith("parameters:"))
    numel = int(line.split()[1].replace(",", ""))
    model = run_ckptconv("inspect", src, "--only", "model", "--json")
    tensors = json.loads(model.stdout)["tensors"]
    want = 0
    for t in tensors:
        n = 1
        for d in t["shape"]:
            n *= d
        want += n
    assert numel == want, (line, want)


def test_a_cast_export_into_a_folder_with_its_own_config_sets_that_configs_dtype(tmp_path, run_ckptconv):
    out = tmp_path / "hf-model"
    out.mkdir()
    mine = json.loads((TD / "hf" / "llama_tied" / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**mine, "note": "the user's own"}))
    r = run_ckptconv("consolidate", TD / "hf" / "llama_tied", "--dtype", "bf16", "-o", f"{out}/")
    assert r.returncode == 0, r.stderr
    kept = json.loads((out / "config.json").read_text())
    assert kept["note"] == "the user's own"  # the folder's config is kept ...
    assert kept["dtype"] == "bfloat16", kept  # ... and says the dtype written beside it
    assert "its dtype set to bfloat16" in r.stderr
    # without a cast nothing is rewritten: byte for byte the source's
    plain = tmp_path / "plain"
    assert run_ckptconv("consolidate", TD / "hf" / "llama_tied", "-o", f"{plain}/").returncode == 0
    assert (plain / "config.json").read_bytes() == (TD / "hf" / "llama_tied" / "config.json").read_bytes()


DCP = TD / "dcp" / "fsdp2_adamw_ws2"


def test_reshard_makes_the_outputs_parents_and_removes_them_when_it_fails(tmp_path, run_ckptconv):
    out = tmp_path / "new" / "dir" / "ws4"
    r = run_ckptconv("reshard", DCP, "-o", out, "--world-size", "4")
    assert r.returncode == 0, r.stderr
    assert run_ckptconv("diff", out, DCP).returncode == 0
    # a job that fails after making them leaves no empty folders behind
    failed = tmp_path / "other" / "deeper" / "ws4"
    r = run_ckptconv("reshard", DCP, "-o", failed, "--world-size", "4", "--max-output-size", "1B")
    assert r.returncode == 4, r.stderr
    assert not (tmp_path / "other").exists()
    # and consolidate's file outputs the same
    assert run_ckptconv("consolidate", DCP, "-o", tmp_path / "a" / "b" / "c.pt").returncode == 0
    assert (tmp_path / "a" / "b" / "c.pt").is_file()
    # a parent that is a file is still refused, naming it
    (tmp_path / "afile").write_text("x")
    r = run_ckptconv("reshard", DCP, "-o", tmp_path / "afile" / "ws2", "--world-size", "2")
    assert r.returncode == 4 and "afile is a file, not a directory" in r.stderr, r.stderr


def test_a_run_folder_is_read_at_its_latest_complete_step_with_a_note(tmp_path, run_ckptconv):
    import shutil
    run = tmp_path / "run"
    for step in (100, 200):
        shutil.copytree(DCP, run / f"step-{step}")
    (run / "step-300").mkdir()  # a save that did not finish: items, no .metadata
    shutil.copy(DCP / "__0_0.distcp", run / "step-300")
    # docs/usage.md's own example, on a folder of several steps
    r = run_ckptconv("consolidate", run, "--only", "model", "--dtype", "bf16", "-o", f"{tmp_path}/hf-model/")
    assert r.returncode == 0, r.stderr
    assert f"reading {run}/step-200" in r.stderr and "no --tag" in r.stderr and "step-300 is incomplete" in r.stderr
    # --tag still chooses
    r = run_ckptconv("consolidate", run, "--tag", "step-100", "--only", "model", "-o", tmp_path / "s100.safetensors")
    assert r.returncode == 0 and f"{run}/step-100" in r.stderr, r.stderr
    # a `latest` file is what it names
    (run / "latest").write_text("step-100")
    r = run_ckptconv("validate", run)
    assert r.returncode == 0 and "the file `latest` names" in r.stderr, r.stderr
    # none complete: a usage error listing them
    (run / "latest").unlink()
    for step in (100, 200):
        (run / f"step-{step}" / ".metadata").unlink()
    r = run_ckptconv("consolidate", run, "-o", tmp_path / "x.pt")
    assert r.returncode == 2 and "none is complete" in r.stderr, r.stderr


def test_an_output_without_extension_is_offered_as_a_folder(tmp_path, run_ckptconv):
    r = run_ckptconv("consolidate", DCP, "--only", "model", "-o", tmp_path / "hf-noslash")
    assert r.returncode == 2
    assert f"-o {tmp_path}/hf-noslash/" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_validate_only_model_of_megatron_names_no_missing_chunks(run_ckptconv):
    """--only model reads the model on purpose: the optimizer's chunks are
    not 'not read: chunks in the missing files' when no file is missing."""
    for case in ("gpt_tp2pp1_mlm", "gpt_tp2pp2"):
        r = run_ckptconv("validate", TD / "megatron" / case / "ckpt", "--only", "model")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "not read" not in r.stdout and "missing" not in r.stdout, r.stdout


def test_hdf5_export_of_megatron_keeps_the_world_size_attribute(tmp_path, run_ckptconv):
    """The world size fact says '≥ N (...)' for Megatron now: the HDF5 writer
    takes the number from the reader's SourceInfo, not from that text."""
    import h5py
    out = tmp_path / "m.h5"
    r = run_ckptconv("consolidate", TD / "megatron" / "gpt_tp2pp2" / "ckpt", "--only", "model", "-o", out)
    assert r.returncode == 0, r.stderr
    files = {int(p.name.split("_")[2]) for p in (TD / "megatron" / "gpt_tp2pp2" / "ckpt").glob("__*_*.distcp")}
    assert h5py.File(out)["/"].attrs["ckptconv.world_size"] == len(files)
