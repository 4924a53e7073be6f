"""Single-bit mutants of an HDF5 file ckptconv wrote, each read by
`ckptconv inspect` and `ckptconv convert` (which reads every tensor):
counts exit codes, signal deaths and hangs, and keeps every input that
killed or hung the tool, or libhdf5 in the tool's isolated reader (for
tests/regressions/hdf5_reader_fuzz/).

  .venv/bin/python tools/hdf5_mutants.py --count 10000 [--seed 1] [--keep DIR]

Issue #17 row 9: 0 signal deaths over >= 10,000 mutants."""

from __future__ import annotations

import argparse
import collections
import os
import random
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HANG_S = 150  # above the isolated reader's own 60 s limit, which refuses a looping libhdf5 with exit 3


def run_one(binary: Path, data: bytes, work: Path, index: int) -> tuple[str, int]:
    path = work / f"m{index}.h5"
    path.write_bytes(data)
    worst = "exit 0"
    try:
        for args in (["inspect", path], ["convert", path, "-o", work / f"m{index}.pt", "--force"]):
            try:
                r = subprocess.run([str(binary), *map(str, args)], capture_output=True, timeout=HANG_S)
            except subprocess.TimeoutExpired:
                return "hang", index
            if r.returncode < 0:
                return f"signal {-r.returncode}", index
            if b"crashed the library" in r.stderr:
                return "exit 3: libhdf5 crashed in the isolated child", index
            if b"did not finish within" in r.stderr:
                return "exit 3: libhdf5 hung in the isolated child", index
            if r.returncode != 0:
                worst = f"exit {r.returncode}"
        return worst, index
    finally:
        path.unlink(missing_ok=True)
        (work / f"m{index}.pt").unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--keep", type=Path, help="copy inputs that killed or hung the tool here")
    ap.add_argument("--binary", type=Path, default=REPO / "build" / "ckptconv")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = work / "base.h5"
        subprocess.run([str(a.binary), "consolidate", str(REPO / "testdata/dcp/fsdp2_adamw_ws2"), "-o", str(base)],
                       check=True, capture_output=True)
        original = base.read_bytes()
        rng = random.Random(a.seed)
        mutants = []
        for _ in range(a.count):
            data = bytearray(original)
            bit = rng.randrange(len(data) * 8)
            data[bit // 8] ^= 1 << (bit % 8)
            mutants.append(bytes(data))
        outcomes: collections.Counter[str] = collections.Counter()
        with ThreadPoolExecutor(a.jobs) as pool:
            for outcome, index in pool.map(lambda im: run_one(a.binary, im[1], work, im[0]), enumerate(mutants)):
                outcomes[outcome] += 1
                if a.keep and ("hang" in outcome or "hung" in outcome or "signal" in outcome or "crashed" in outcome
                               or outcome == "exit 5"):
                    a.keep.mkdir(parents=True, exist_ok=True)
                    (a.keep / f"mutant-{a.seed}-{index}.h5").write_bytes(mutants[index])
        print(f"{a.count} single-bit mutants of a {len(original)}-byte ckptconv .h5 (seed {a.seed}):",
              ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
        bad = sum(v for k, v in outcomes.items() if k in ("hang", "exit 5") or k.startswith("signal"))
        return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
