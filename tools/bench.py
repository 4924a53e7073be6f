#!/usr/bin/env python3
"""Benchmark driver for scripts/bench: times commands and reads each one's
peak RSS from the kernel (wait4 rusage of that child alone), so every figure
in one report comes from the same run on the same warm page cache.

    python tools/bench.py consolidate --ckpt DIR --work DIR --ckptconv BIN
    python tools/bench.py validate    --ckpt DIR --work DIR --ckptconv BIN   (the validate rows alone)
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_measured(cmd: list[str], env=None) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one command; raises on failure.

    Peak RSS comes from GNU time (the process after exec): the rusage of a
    child forked from this Python would include the ~30 MB of the fork."""
    with tempfile.NamedTemporaryFile("r") as report:
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", report.name, *cmd], env=env,
                              stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"bench: {' '.join(cmd)} failed with exit code {proc.returncode}")
        rss_kb = int(report.read().strip().splitlines()[-1])
    return wall, rss_kb * 1024


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def warm_cache(d: Path) -> None:
    for p in sorted(d.iterdir()):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def validate_rows(ckpt: Path, work: Path, ckptconv: str) -> dict:
    """validate (read-only) against the raw read floor: every file of the
    checkpoint read once to /dev/null. Rows: validate (CRC-32 of every record,
    metadata, coverage), --finite (plus a NaN/Inf scan of every float tensor),
    --manifest (plus XXH3-64 of every file and every tensor's logical bytes,
    verified against a manifest written beforehand, untimed)."""
    files = " ".join(str(p) for p in sorted(ckpt.iterdir()) if p.is_file())
    manifest = work / "validate-manifest.json"
    manifest.unlink(missing_ok=True)
    run_measured([ckptconv, "-q", "validate", str(ckpt), "--write-manifest", str(manifest)])
    results = {
        "raw read (cat>/dev/null)": run_measured(["sh", "-c", f"cat {files} > /dev/null"]),
        "ckptconv validate": run_measured([ckptconv, "-q", "validate", str(ckpt)]),
        "validate --finite": run_measured([ckptconv, "-q", "validate", str(ckpt), "--finite"]),
        "validate --manifest": run_measured([ckptconv, "-q", "validate", str(ckpt), "--manifest", str(manifest)]),
    }
    manifest.unlink()
    return results


def print_validate_ratios(results: dict) -> None:
    floor = results["raw read (cat>/dev/null)"][0]
    print(f"validate ratios to the raw read floor: validate = {results['ckptconv validate'][0] / floor:.2f}, "
          f"--finite = {results['validate --finite'][0] / floor:.2f}, "
          f"--manifest = {results['validate --manifest'][0] / floor:.2f}")


def print_table(ckpt: Path, size: int, results: dict) -> None:
    print(f"checkpoint: {ckpt} ({size / 1e9:.2f} GB, {sum(1 for p in ckpt.iterdir() if p.is_file())} files)")
    print(f"{'command':<24} {'wall s':>8} {'GB/s':>7} {'peak RSS MB':>12} {'RSS/ckpt':>9}")
    for name, (wall, rss) in results.items():
        print(f"{name:<24} {wall:8.2f} {size / 1e9 / wall:7.2f} {rss / 1e6:12.1f} {rss / size:9.1%}")


def validate(args) -> None:
    ckpt, work = Path(args.ckpt), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    for _ in range(2):  # first pass warms the cache and the binaries; the second is reported
        warm_cache(ckpt)
        results = validate_rows(ckpt, work, args.ckptconv)
    print_table(ckpt, dir_bytes(ckpt), results)
    print_validate_ratios(results)


def consolidate(args) -> None:
    ckpt, work = Path(args.ckpt), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    size = dir_bytes(ckpt)
    distcp = sorted(str(p) for p in ckpt.glob("*.distcp"))
    py = sys.executable
    raw_out, torch_out, ours_out = work / "raw.out", work / "torch.pt", work / "ckptconv.pt"
    st_out, h5_out = work / "ckptconv.safetensors", work / "ckptconv.h5"
    results = {}
    for _ in range(2):  # first pass warms the cache and the binaries; the second is reported
        for p in (raw_out, torch_out, ours_out, st_out, h5_out):
            p.unlink(missing_ok=True)
        warm_cache(ckpt)
        # (a) raw I/O floor: every .distcp byte read once, the same amount
        # written and made durable (ckptconv fsyncs its output before the
        # rename that publishes it); also shown without the fsync.
        results["raw I/O, no fsync"] = run_measured(["sh", "-c", f"cat {' '.join(distcp)} > {raw_out}"])
        raw_out.unlink()
        results["raw I/O (cat+fsync)"] = run_measured(["sh", "-c", f"cat {' '.join(distcp)} > {raw_out} && sync {raw_out}"])
        raw_out.unlink()
        # (b) torch's own tool.
        results["torch dcp_to_torch"] = run_measured(
            [py, "-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch", str(ckpt), str(torch_out)])
        torch_out.unlink()
        # (c) ckptconv.
        results["ckptconv consolidate"] = run_measured([args.ckptconv, "-q", "consolidate", str(ckpt), "-o", str(ours_out)])
        ours_out.unlink()
        results["ckptconv --no-fsync"] = run_measured(
            [args.ckptconv, "-q", "consolidate", str(ckpt), "-o", str(ours_out), "--no-fsync"])
        ours_out.unlink()
        results["ckptconv --dtype bf16"] = run_measured(
            [args.ckptconv, "-q", "consolidate", str(ckpt), "-o", str(ours_out), "--dtype", "bf16", "--no-fsync"])
        ours_out.unlink()
        # Reshard to world size 3: every byte read and written once more, N files.
        reshard_out = work / "resharded"
        shutil.rmtree(reshard_out, ignore_errors=True)
        results["ckptconv reshard 4->3"] = run_measured(
            [args.ckptconv, "-q", "reshard", str(ckpt), "-o", str(reshard_out), "--world-size", "3"])
        shutil.rmtree(reshard_out)
        # (d) the other output formats.
        for name, out in (("ckptconv -> .safetensors", st_out), ("ckptconv -> .h5", h5_out)):
            results[name] = run_measured([args.ckptconv, "-q", "consolidate", str(ckpt), "-o", str(out)])
            out.unlink()
        # (e) validate, read-only, against reading every file once.
        results.update(validate_rows(ckpt, work, args.ckptconv))
    print(f"checkpoint: {ckpt} ({size / 1e9:.2f} GB, {len(distcp)} .distcp files)")
    print(f"{'command':<24} {'wall s':>8} {'GB/s':>7} {'peak RSS MB':>12} {'RSS/ckpt':>9}")
    for name, (wall, rss) in results.items():
        print(f"{name:<24} {wall:8.2f} {size / 1e9 / wall:7.2f} {rss / 1e6:12.1f} {rss / size:9.1%}")
    a, b, c = (results[k][0] for k in ("raw I/O (cat+fsync)", "torch dcp_to_torch", "ckptconv consolidate"))
    print("torch's dcp_to_torch does not fsync its output; ckptconv and the raw floor above do.")
    print(f"ratios: ckptconv/raw = {c / a:.2f} (target <= 1.5), torch/ckptconv = {b / c:.2f} (target >= 3), "
          f"ckptconv peak RSS = {results['ckptconv consolidate'][1] / size:.1%} of the checkpoint (target < 15%)")
    nf, raw_nf = results["ckptconv --no-fsync"][0], results["raw I/O, no fsync"][0]
    print(f"without fsync on both sides: ckptconv/raw = {nf / raw_nf:.2f}, torch/ckptconv = {b / nf:.2f}")
    st, h5 = results["ckptconv -> .safetensors"][0], results["ckptconv -> .h5"][0]
    rs = results["ckptconv reshard 4->3"]
    print(f"ratios to the raw floor: .safetensors = {st / a:.2f}, .h5 = {h5 / a:.2f}, "
          f"reshard 4->3 = {rs[0] / a:.2f} (peak RSS {rs[1] / size:.1%} of the checkpoint)")
    print_validate_ratios(results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("consolidate", "validate"):
        c = sub.add_parser(name)
        c.add_argument("--ckpt", required=True)
        c.add_argument("--work", required=True)
        c.add_argument("--ckptconv", required=True)
    args = ap.parse_args()
    {"consolidate": consolidate, "validate": validate}[args.cmd](args)


if __name__ == "__main__":
    main()
