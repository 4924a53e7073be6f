#!/usr/bin/env python3
"""Write real DeepSpeed universal checkpoints (UCP) for ckptconv's tests.

Every universal checkpoint here is written by real DeepSpeed: its own converter
``deepspeed/checkpoint/ds_to_universal.py`` (DeepSpeed 0.19.8, CPU,
DS_ACCELERATOR=cpu), run as a subprocess on the real ZeRO checkpoints of
``testdata/zero/<case>/`` (written by tools/make_zero_checkpoints.py). Nothing
is written by hand; this script only copies the input, runs the converter,
moves its output into place and writes ``case.json``.

    .venv-deepspeed/bin/python tools/make_ucp_checkpoints.py [--out testdata/ucp] [--only CASE ...]

For each case, the source case's tag folder (``testdata/zero/<case>/global_step3``)
is copied into a temporary directory ``<tmp>/src/global_step3`` and, with
``<tmp>`` as the working directory, converted with

    DS_ACCELERATOR=cpu .venv-deepspeed/bin/python -m deepspeed.checkpoint.ds_to_universal \\
        --input_folder src/global_step3 --output_folder <case>/global_step3_universal \\
        --inject_missing_state --num_extract_workers 1 --num_merge_workers 1

(``--inject_missing_state``: these checkpoints have no
``universal_checkpoint_info``; the converter adds a minimal one in memory. It
does not write to its input, and the copy's sha256 are checked before and after
anyway, as are those of testdata/zero.) ``<tmp>/<case>/`` then holds exactly
what the converter wrote: ``global_step3_universal/`` (``zero/<param>/*.pt``,
``zero/optimizer_state.pt`` and the copied ``*model_states.pt``) and
``latest_universal`` (the output folder's name, no newline), written next to
the output folder. Both are moved to ``<out>/<case>/``. The converter's
scratch folder ``global_step3_universal/tmp`` (per-rank fragments) is deleted
by the converter itself (no ``--keep_temp_folder``); anything else not in that
list would fail the case.

``<out>/<case>/case.json`` records the source case, the DeepSpeed / torch /
Python versions, the exact command line (argv, working directory, environment),
the size and sha256 of every file written, and a bit-equality check of each
trainable param's ``fp32.pt`` / ``exp_avg.pt`` / ``exp_avg_sq.pt`` / ``step.pt``
against ``testdata/zero/<case>/reference_live.pt`` (and of the frozen param, the
tied alias and the buffer against the live lp weight / buffer cast to fp32):
"equal", "equal, flat" (ZeRO-3 writes plain 1-D tensors), "DIFFERENT" or
"missing" (ZeRO-3 writes no step.pt and nothing for frozen params or buffers). A case the
converter fails on gets ``status: "failed"`` and the error, and the rest go on.

The converter's output is byte-deterministic (torch.save of the same values);
rerunning rewrites the same bytes. CPU only; needs no GPU. About 5-10 s per case.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

ROOT = Path(__file__).resolve().parent.parent
ZERO = ROOT / "testdata" / "zero"
TAG = "global_step3"
UCP_TAG = f"{TAG}_universal"

# source case in testdata/zero -> what it exercises in UCP form
CASES = {
    "z1_fp16_ws2": "ZeRO-1 fp16 (DynamicLossScaler): no frozen_param_* in the source, so frozen.weight comes "
                   "from the model-states 'module' fallback",
    "z2_bf16_ws2": "ZeRO-2 bf16: frozen param, tied alias and buffer get fp32.pt only (lp value cast to fp32)",
    "z2_2groups_ws2": "ZeRO-2 bf16, two param groups: optimizer_state.pt param_groups with 2 entries",
    "z2_fp32_ws3": "ZeRO-2 fp32 at ws 3 (LossScaler): odd partitioning merged back; the tied alias's fp32.pt is a view into the whole lp flat buffer (storage offset 131 of 186)",
    "z3_bf16_ws2": "ZeRO-3 bf16: per-rank model states copied, ceil(numel/ws) fragments merged",
    "z3_fp32_ws2": "ZeRO-3 fp32",
    "z3_2groups_ws2": "ZeRO-3 bf16, two param groups",
}
TRAINABLE = ["out_bias", "l1.weight", "l1.bias", "l2.weight", "head.weight"]


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(d: Path) -> dict:
    return {str(p.relative_to(d)): {"size": p.stat().st_size, "sha256": sha256(p)}
            for p in sorted(d.rglob("*")) if p.is_file()}


def load(p: Path):
    return torch.load(p, map_location="cpu", weights_only=False)


def compare(ucp: Path, src: Path) -> dict:
    """Each UCP per-param file against the live values of reference_live.pt.

    Per state: "equal" (same dtype, shape and bits), "equal, flat" (ZeRO-3: the
    file holds the same bits as a 1-D tensor), "DIFFERENT", or "missing" (no file).
    """
    ref = load(src / "reference_live.pt")
    zero = ucp / "zero"
    res = {}

    def cmp(f: Path, want: torch.Tensor) -> str:
        if not f.exists():
            return "missing"
        got = load(f)
        if isinstance(got, dict):  # ZeRO-1/2: {"param": tensor, "cat_dim": 0}
            got = got["param"]
        if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.numel() != want.numel():
            return "DIFFERENT"
        if got.shape == want.shape:
            return "equal" if torch.equal(got, want) else "DIFFERENT"
        if got.dim() == 1:
            return "equal, flat" if torch.equal(got, want.reshape(-1)) else "DIFFERENT"
        return "DIFFERENT"

    for n in TRAINABLE:
        r = {k: cmp(zero / n / f"{k}.pt", want) for k, want in
             (("fp32", ref["model"][n]), ("exp_avg", ref["optim"][n]["exp_avg"]),
              ("exp_avg_sq", ref["optim"][n]["exp_avg_sq"]))}
        f = zero / n / "step.pt"
        if f.exists():
            got, want = load(f), ref["optim"][n]["step"]
            r["step"] = "equal" if torch.equal(torch.as_tensor(got).double(), torch.as_tensor(want).double()) else "DIFFERENT"
        else:
            r["step"] = "missing"
        res[n] = r
    # params / buffers with no optimizer state: fp32.pt only (ZeRO-1/2), the
    # model-states tensor cast to fp32; compared with the live lp weight / buffer cast to fp32
    others = {"frozen.weight": ref["lp"]["frozen.weight"], "head_tied.weight": ref["lp"]["head.weight"],
              "scale": ref["buffers"]["scale"]}
    for n, want in others.items():
        res[n] = {"fp32 (vs live lp/buffer cast to fp32)": cmp(zero / n / "fp32.pt", want.float())}
    return res


def convert(name: str, out: Path) -> dict:
    import deepspeed
    src = ZERO / name
    src_info = json.loads((src / "case.json").read_text())
    argv = [".venv-deepspeed/bin/python", "-m", "deepspeed.checkpoint.ds_to_universal",
            "--input_folder", f"src/{TAG}", "--output_folder", f"{name}/{UCP_TAG}",
            "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"]
    info = {
        "case": name,
        "source_case": f"testdata/zero/{name}",
        "source": {k: src_info[k] for k in ("stage", "dtype", "world_size", "optimizer_class", "options")},
        "exercises": CASES[name],
        "ds_version": deepspeed.__version__,
        "torch_version": torch.__version__,
        "python_version": sys.version.split()[0],
        "command": {
            "argv": argv,
            "cwd": "<tmp> (a fresh temporary directory holding src/global_step3, a copy of "
                   f"testdata/zero/{name}/global_step3)",
            "env": {"DS_ACCELERATOR": "cpu"},
            "shell": "cd <tmp> && DS_ACCELERATOR=cpu " + " ".join(argv),
        },
    }
    src_before = tree_digest(src / TAG)
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    with tempfile.TemporaryDirectory(prefix="ucp_") as tmp:
        tmp = Path(tmp)
        shutil.copytree(src / TAG, tmp / "src" / TAG)
        copy_before = tree_digest(tmp / "src" / TAG)
        env = dict(os.environ, DS_ACCELERATOR="cpu")
        proc = subprocess.run([sys.executable, *argv[1:]], cwd=tmp, env=env, capture_output=True, text=True)
        info["input_unchanged"] = {"temp_copy": tree_digest(tmp / "src" / TAG) == copy_before,
                                   f"testdata/zero/{name}/{TAG}": tree_digest(src / TAG) == src_before}
        assert all(info["input_unchanged"].values()), (name, info["input_unchanged"])
        steps = [ln for ln in proc.stdout.splitlines() if ln.startswith("***")]
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
            info.update(status="failed", returncode=proc.returncode, converter_steps=steps,
                        error="\n".join(tail).replace(str(tmp), "<tmp>"))
            d.mkdir(parents=True)
            (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")
            return info
        made = tmp / name
        top = sorted(p.name for p in made.iterdir())
        assert top == ["global_step3_universal", "latest_universal"], (name, top)
        # the converter removes its own scratch folder (<output>/tmp) unless --keep_temp_folder
        assert not (made / UCP_TAG / "tmp").exists(), (name, "scratch folder left behind")
        shutil.copytree(made, d)
    assert (d / "latest_universal").read_bytes() == UCP_TAG.encode(), (d / "latest_universal").read_bytes()
    info.update(status="ok", converter_steps=steps, removed=[],
                scratch="global_step3_universal/tmp: the converter's per-rank fragment folder, deleted by the "
                        "converter itself (no --keep_temp_folder); nothing else removed",
                check_vs_reference_live=compare(d / UCP_TAG, src))
    info["files"] = tree_digest(d)
    info["generator"] = "tools/make_ucp_checkpoints.py"
    (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "testdata" / "ucp"))
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="regenerate only these cases")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    failed = []
    for name in args.only or CASES:
        t = time.time()
        info = convert(name, out)
        if info["status"] != "ok":
            failed.append(name)
            print(f"{name}: FAILED: {info['error'].splitlines()[-1]}", flush=True)
            continue
        chk = [(f"{n}:{k}", v) for n, r in info["check_vs_reference_live"].items() for k, v in r.items()]
        bad = [nk for nk, v in chk if v == "DIFFERENT"]
        missing = [nk for nk, v in chk if v == "missing"]
        print(f"{name}: {len(info['files'])} files, {sum(f['size'] for f in info['files'].values())} bytes, "
              f"differ from reference_live: {bad or 'none'}, no file: {missing or 'none'}, "
              f"{time.time() - t:.1f}s", flush=True)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"ucp: {total} bytes in {out}, {time.time() - t0:.1f}s" + (f"; failed: {failed}" if failed else ""))


if __name__ == "__main__":
    main()
