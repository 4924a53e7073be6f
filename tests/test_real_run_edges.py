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
