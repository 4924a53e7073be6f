#!/usr/bin/env python3
"""Mutation campaign: damage one file of a real checkpoint (flip a bit,
truncate, duplicate or delete a byte range) and run inspect, validate and
consolidate on it, classifying what each did.

    .venv/bin/python tools/mutate.py --family dcp --count 1000 [--seed 7] [--ckptconv build/ckptconv]

Families (all from testdata/, written by real torch / DeepSpeed / safetensors,
or by ckptconv for HDF5): pt, dcp, ranks, zero, safetensors, hdf5; and parts:
a --part run of 2 workers (dcp/fsdp2_adamw_ws2 to OUT.pt) left for
`ckptconv finalize OUT.pt`, one file of its OUT.pt.parts-*/ folder damaged
(the receipts, request.json, the shared data file), then finalize alone.

Per case the outcome is one of:
  signal    a command died of a signal (a crash: always a bug)
  not utf-8 a command's output was not UTF-8 (a message echoing raw bytes)
  hang      a command ran past --timeout seconds
  internal  a command exited 5 ("internal error"): it blamed ckptconv for a
            damaged input, which is a bug in how the damage was caught
  partial   a command failed but left OUT or a temporary file behind
  refused   consolidate exited non-zero (with a message) and wrote nothing
  same      consolidate exited 0 and its output equals the clean one
  silent    consolidate exited 0 with an output that differs from the clean
            one; `explained` when the damaged bytes are ones no checksum
            covers (safetensors payloads, HDF5 data) and the output holds
            exactly what safetensors / h5py read from the damaged input;
            `torch reads the same` for a damaged DCP .metadata that torch's
            dcp_to_torch_save reads into the same state dict; otherwise
            unexplained (a bug)
Prints a table of counts and the first unexplained cases; exit 1 if any
signal, hang, partial or unexplained silent case was seen.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TD = REPO / "testdata"

# A state dict of the dtypes safetensors holds (dtypes.pt has complex ones).
SIMPLE_PT = TD / "dcp" / "fsdp2_adamw_ws2.ref.pt"

FAMILIES = {
    "pt": SIMPLE_PT,
    "dcp": TD / "dcp" / "fsdp2_adamw_ws2",
    "ranks": TD / "fsdp_st" / "adamw_ws2",
    "zero": TD / "zero" / "z2_bf16_ws2",
}


def make_source(family: str, work: Path, ckptconv: Path) -> Path:
    """The clean source of `family` under `work`."""
    if family in FAMILIES:
        src = FAMILIES[family]
        dst = work / src.name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
        return dst
    if family == "safetensors":
        import torch
        from safetensors.torch import save_file
        sd = torch.load(SIMPLE_PT, weights_only=True)
        flat = {k: v.contiguous() for k, v in sd["model"].items()}
        dst = work / "model.safetensors"
        save_file(flat, str(dst))
        return dst
    if family == "hdf5":
        dst = work / "model.h5"
        subprocess.run([str(ckptconv), "convert", str(SIMPLE_PT), "--keys", r"^model\.", "-o", str(dst), "-q"], check=True)
        return dst
    raise SystemExit(f"unknown family {family}")


def files_of(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]


def mutate(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    if not data:
        return "empty file"
    kind = rng.choice(["flip", "flip", "truncate", "duplicate", "delete"])
    at = rng.randrange(len(data))
    if kind == "flip":
        bit = rng.randrange(8)
        data[at] ^= 1 << bit
        what = f"flip bit {bit} at {at}"
    elif kind == "truncate":
        data = data[:at]
        what = f"truncate to {at}"
    else:
        n = rng.randint(1, min(64, len(data) - at))
        if kind == "duplicate":
            data[at:at] = data[at:at + n]
        else:
            del data[at:at + n]
        what = f"{kind} {n} bytes at {at}"
    path.write_bytes(bytes(data))
    return what


def run(ckptconv: Path, args: list, timeout: float) -> tuple[str, int]:
    try:
        r = subprocess.run([str(ckptconv), *map(str, args), "-q"], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hang", -1
    if r.returncode < 0:
        return "signal", r.returncode
    try:
        (r.stdout + r.stderr).decode("utf-8")
    except UnicodeDecodeError:
        return "not utf-8", r.returncode  # a message echoing raw input bytes
    return "exit", r.returncode


def output_digest(out: Path) -> str:
    """The tensors and keys of a consolidated .safetensors output, hashed."""
    return hashlib.sha256(out.read_bytes()).hexdigest()


def clean_digest(ckptconv: Path, src: Path, out: Path) -> str:
    """What one undamaged consolidate of `src` into `out` writes, hashed."""
    subprocess.run([str(ckptconv), "consolidate", str(src), "-o", str(out), "-q"], check=True)
    return output_digest(out)


def reference_read(family: str, damaged: Path):
    """What the format's own library reads from the damaged input, or None
    when it refuses it (only for the families whose payload no checksum covers)."""
    try:
        if family == "safetensors":
            from safetensors.torch import load_file
            return load_file(str(damaged))
        if family == "hdf5":
            import h5py
            out = {}
            with h5py.File(damaged, "r") as f:
                f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
            return out
    except Exception:  # noqa: BLE001 -- the library refused it
        return None
    return None


def agrees_with_torch_dcp(src: Path, out: Path, ckptconv: Path) -> bool:
    """A DCP directory whose .metadata (which no checksum covers) was damaged:
    torch's own dcp_to_torch_save reads it into the same state dict (compared
    by ckptconv's diff, which compares structure, not only dotted paths)."""
    import warnings
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    ref = out.parent / "torch_ref.pt"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp_to_torch_save(str(src), str(ref))
    except (Exception, BaseException) as e:  # noqa: BLE001 -- torch refuses what we accepted (CheckpointException is a BaseException)
        if isinstance(e, KeyboardInterrupt):
            raise
        return False
    r = subprocess.run([str(ckptconv), "diff", str(ref), str(out), "-q"], capture_output=True)
    ref.unlink(missing_ok=True)
    return r.returncode == 0


def agrees(family: str, damaged: Path, out: Path) -> bool:
    ref = reference_read(family, damaged)
    if ref is None:
        return False
    from safetensors.torch import load_file
    ours = load_file(str(out))
    import numpy as np
    for name, want in ref.items():
        key = name.replace("/", ".") if family == "hdf5" else name  # h5py names groups with '/'
        if key not in ours:
            return False
        got = ours[key]
        w = want.numpy() if hasattr(want, "numpy") else np.asarray(want)
        g = got.view(-1).numpy().view(w.dtype).reshape(w.shape) if got.numel() else got.numpy()
        if g.tobytes() != w.tobytes():
            return False
    return True


def campaign(family: str, count: int, seed: int, ckptconv: Path, timeout: float, verbose: bool = False,
             only: set[int] | None = None) -> dict:
    """`only`: run the commands for these case numbers alone (the others are
    drawn and skipped, so a case of a long campaign is replayed exactly)."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    unexplained: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        clean_dir = work / "clean"
        clean_dir.mkdir()
        clean = make_source(family, clean_dir, ckptconv)
        ref_digest = clean_digest(ckptconv, clean, work / "ref.safetensors")
        for case in range(count):
            case_dir = work / f"case{case}"
            case_dir.mkdir()
            src = case_dir / clean.name
            (shutil.copytree if clean.is_dir() else shutil.copy)(clean, src)
            victim = rng.choice(files_of(src))
            what = f"{victim.relative_to(case_dir)}: " + mutate(victim, rng)
            if only is not None and case not in only:
                shutil.rmtree(case_dir, ignore_errors=True)
                continue
            out_dir = case_dir / "out"
            out_dir.mkdir()
            out = out_dir / "out.safetensors"
            outcome = None
            for args in (["inspect", src], ["validate", src], ["consolidate", src, "-o", out]):
                status, code = run(ckptconv, args, timeout)
                if status == "exit" and code == 5:
                    status = "internal"
                if status != "exit":
                    outcome = status
                    break
            if outcome is None:
                left = list(out_dir.iterdir())
                if code != 0:
                    outcome = "partial" if left else "refused"
                elif output_digest(out) == ref_digest:
                    outcome = "same"
                elif family in ("safetensors", "hdf5") and agrees(family, victim, out):
                    outcome = "silent (explained)"
                elif family == "dcp" and victim.name.endswith("metadata") and agrees_with_torch_dcp(src, out, ckptconv):
                    outcome = "silent (torch reads the same)"
                else:
                    outcome = "silent (unexplained)"
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome in ("signal", "hang", "internal", "partial", "not utf-8", "silent (unexplained)") \
                    and len(unexplained) < 20:
                unexplained.append(f"case {case}: {outcome}: {what}")
            if verbose:
                print(f"case {case}: {outcome}: {what}", flush=True)
            shutil.rmtree(case_dir, ignore_errors=True)
    return {"counts": counts, "bad": unexplained}


def parts_campaign(count: int, seed: int, ckptconv: Path, timeout: float, verbose: bool = False) -> dict:
    """--family parts: the finalizer must refuse a damaged parts folder (exit
    non-zero, nothing at OUT) or publish the single-process bytes."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    bad: list[str] = []
    src = FAMILIES["dcp"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ref_digest = clean_digest(ckptconv, src, work / "ref.pt")
        for case in range(count):
            case_dir = work / f"case{case}"
            case_dir.mkdir()
            # Both parts written, the elected finalizer "dead": the folder finalize completes.
            subprocess.run([str(ckptconv), "consolidate", str(src), "-o", "out.pt", "--part", "0/2", "-q"],
                           cwd=case_dir, check=True)
            (folder,) = case_dir.glob("out.pt.parts-*")
            (folder / "finalizing").touch()
            subprocess.run([str(ckptconv), "consolidate", str(src), "-o", "out.pt", "--part", "1/2", "-q"],
                           cwd=case_dir, check=True)
            (folder / "finalizing").unlink()
            victim = rng.choice(files_of(folder))
            what = f"{victim.name}: " + mutate(victim, rng)
            try:
                r = subprocess.run([str(ckptconv), "finalize", str(case_dir / "out.pt"), "-q"], capture_output=True,
                                   timeout=timeout)
                status, code = ("signal", r.returncode) if r.returncode < 0 else ("exit", r.returncode)
            except subprocess.TimeoutExpired:
                status, code = "hang", -1
            out = case_dir / "out.pt"
            if status != "exit":
                outcome = status
            elif code == 5:
                outcome = "internal"
            elif code != 0:
                outcome = "partial" if out.exists() or list(case_dir.glob("out.pt.tmp-*")) else "refused"
            else:
                outcome = "same" if output_digest(out) == ref_digest else "silent (unexplained)"
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome not in ("refused", "same") and len(bad) < 20:
                bad.append(f"case {case}: {outcome}: {what}")
            if verbose:
                print(f"case {case}: {outcome}: {what}", flush=True)
            shutil.rmtree(case_dir, ignore_errors=True)
    return {"counts": counts, "bad": bad}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(list(FAMILIES) + ["safetensors", "hdf5", "parts"]), required=True)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--ckptconv", default=str(REPO / "build" / "ckptconv"))
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.family == "parts":
        result = parts_campaign(args.count, args.seed, Path(args.ckptconv), args.timeout, args.verbose)
    else:
        result = campaign(args.family, args.count, args.seed, Path(args.ckptconv), args.timeout, args.verbose)
    print(f"mutate {args.family}: {args.count} cases (seed {args.seed}): " +
          ", ".join(f"{k} {v}" for k, v in sorted(result["counts"].items())))
    for line in result["bad"]:
        print("  " + line)
    return 1 if result["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
