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
