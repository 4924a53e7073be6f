"""--device and --finite: backend selection, the CPU reference, and CUDA
against CPU bit for bit.

The CUDA comparisons need a CUDA build and a visible device; elsewhere they
are skipped with the reason (scripts/gpu-check runs them on a GPU machine).
"""

from __future__ import annotations

import filecmp
import re

import pytest
import torch


def auto_backend(run_ckptconv) -> str:
    r = run_ckptconv("version")
    assert r.returncode == 0, r.stderr
    m = re.search(r"^--device auto: (.*)$", r.stdout, re.M)
    assert m, r.stdout
    return m.group(1)


@pytest.fixture
def cuda_or_skip(run_ckptconv) -> None:
    backend = auto_backend(run_ckptconv)
    if not backend.startswith("cuda"):
        pytest.skip(f"needs a GPU: no CUDA device, --device auto picks {backend} (scripts/gpu-check runs these on one)")


def test_version_says_what_auto_picks(run_ckptconv):
    backend = auto_backend(run_ckptconv)
    assert backend.startswith("cuda:") or backend.startswith("cpu ("), backend


def test_device_cuda_without_a_device_is_a_usage_error(run_ckptconv, testdata, tmp_path):
    backend = auto_backend(run_ckptconv)
    if backend.startswith("cuda"):
        pytest.skip(f"needs a machine without a GPU: a CUDA device is visible ({backend})")
    r = run_ckptconv("consolidate", testdata / "dcp/fsdp2_adamw_ws2", "-o", tmp_path / "o.pt",
                     "--dtype", "bf16", "--device", "cuda")
    assert r.returncode == 2, r.stderr
    assert re.search(r"--device cuda: (no CUDA device is visible|this ckptconv was built without CUDA)", r.stderr), r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_unknown_device_is_a_usage_error(run_ckptconv, testdata, tmp_path):
    r = run_ckptconv("consolidate", testdata / "dcp/fsdp2_adamw_ws2", "-o", tmp_path / "o.pt", "--device", "tpu")
    assert r.returncode == 2
    assert "--device" in r.stderr


def special_state() -> dict:
    """Tensors whose casts exercise every rounding corner, NaN payloads included."""
    bits = torch.tensor([0x7FC00000, -0x00400000, 0x7F800001, 0x7FA00000, -1, 0x7F800000, -0x00800000,
                         0, -0x80000000, 1, 0x3F808000, 0x3F818000, 0x477FF000, 0x33000001, 0x7F7FFFFF],
                        dtype=torch.int64).to(torch.int32)
    g = torch.Generator().manual_seed(7)
    noise = torch.randint(-2**31, 2**31 - 1, (4096,), generator=g, dtype=torch.int64).to(torch.int32)
    return {
        "special": bits.view(torch.float32).clone(),
        "noise": noise.view(torch.float32).reshape(64, 64).clone(),
        "finite": torch.linspace(-3, 3, 1000, dtype=torch.float32),
        "half": torch.tensor([1.0, float("inf"), float("nan")], dtype=torch.float16),
        "scalar": torch.tensor(5.0),
    }


def test_dtype_cast_on_cpu_equals_torch_bit_for_bit(run_ckptconv, tmp_path):
    src = tmp_path / "special.pt"
    state = special_state()
    torch.save(state, src)
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        out = tmp_path / f"out_{name}.pt"
        r = run_ckptconv("convert", src, "-o", out, "--dtype", name, "--device", "cpu")
        assert r.returncode == 0, r.stderr
        got = torch.load(out, weights_only=True)
        for key, value in state.items():
            want = value.to(dtype) if value.is_floating_point() else value
            assert got[key].dtype == want.dtype, key
            bits = torch.int16 if want.element_size() == 2 else torch.int32
            assert torch.equal(got[key].view(bits), want.view(bits)), (name, key)


def test_finite_names_tensors_with_nan_or_inf_and_exits_1(run_ckptconv, tmp_path):
    src = tmp_path / "special.pt"
    state = special_state()
    torch.save(state, src)
    out = tmp_path / "out.pt"
    r = run_ckptconv("convert", src, "-o", out, "--finite", "--device", "cpu")
    assert r.returncode == 1, r.stderr
    want = {}
    for key, value in state.items():
        if value.is_floating_point():
            nan, inf = int(value.isnan().sum()), int(value.isinf().sum())
            if nan or inf:
                want[key] = (nan, inf)
    assert "special" in want and "half" in want and "finite" not in want
    for key, (nan, inf) in want.items():
        assert f"tensor '{key}': {nan} NaN, {inf} Inf" in r.stderr, r.stderr
    assert "'finite'" not in r.stderr
    got = torch.load(out, weights_only=True)  # the output is written all the same
    for key, value in state.items():
        assert torch.equal(got[key].reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8)), key


def test_finite_counts_the_output_after_the_cast(run_ckptconv, tmp_path):
    # 3.4e38 is finite in float32 and overflows to Inf in float16.
    src = tmp_path / "big.pt"
    torch.save({"w": torch.tensor([3.4e38, 1.0])}, src)
    r = run_ckptconv("convert", src, "-o", tmp_path / "keep.pt", "--finite")
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("convert", src, "-o", tmp_path / "half.pt", "--finite", "--dtype", "fp16")
    assert r.returncode == 1, r.stderr
    assert "tensor 'w': 0 NaN, 1 Inf" in r.stderr


def fixture_sources(manifest, testdata):
    return [testdata / f["path"] for f in manifest["fixtures"]]


# Every variant sends arithmetic to the device: a scan alone (gather + scan),
# bf16 with a scan, fp16 (its own rounding and overflow rules).
@pytest.mark.parametrize("extra", [["--finite"], ["--dtype", "bf16", "--finite"], ["--dtype", "fp16"]],
                         ids=["finite", "bf16-finite", "fp16"])
def test_cuda_output_equals_cpu_for_every_fixture(cuda_or_skip, run_ckptconv, manifest, testdata, tmp_path, extra):
    for i, src in enumerate(fixture_sources(manifest, testdata)):
        outs = {}
        for device in ("cpu", "cuda"):
            out = tmp_path / f"{i}_{device}.pt"
            r = run_ckptconv("consolidate", src, "-o", out, "--device", device, *extra)
            outs[device] = (r.returncode, out, r.stderr)
        (rc_cpu, out_cpu, err_cpu), (rc_cuda, out_cuda, err_cuda) = outs["cpu"], outs["cuda"]
        assert rc_cpu == rc_cuda, (src, err_cpu, err_cuda)
        if rc_cpu in (0, 1):
            assert filecmp.cmp(out_cpu, out_cuda, shallow=False), src
            tensors = lambda err: sorted(re.findall(r"tensor '.*': \d+ NaN, \d+ Inf", err))
            assert tensors(err_cpu) == tensors(err_cuda), src


def test_cuda_cast_of_special_values_equals_cpu(cuda_or_skip, run_ckptconv, tmp_path):
    src = tmp_path / "special.pt"
    torch.save(special_state(), src)
    for name in ("bf16", "fp16"):
        a, b = tmp_path / f"cpu_{name}.pt", tmp_path / f"cuda_{name}.pt"
        assert run_ckptconv("convert", src, "-o", a, "--dtype", name, "--device", "cpu").returncode == 0
        assert run_ckptconv("convert", src, "-o", b, "--dtype", name, "--device", "cuda").returncode == 0
        assert filecmp.cmp(a, b, shallow=False), name


def test_large_tensor_cast_in_overlapping_slabs_equals_torch(run_ckptconv, tmp_path):
    # 64 MiB of float32 under a 40 MiB budget: several slabs of more than
    # 4 MiB, each written on a second thread while the next is assembled.
    g = torch.Generator().manual_seed(11)
    w = torch.randn(4096, 4096, generator=g)
    w[5, 7] = float("nan")
    w[4000, 1] = float("inf")
    src = tmp_path / "big.pt"
    torch.save({"w": w, "b": torch.randn(4096, generator=g)}, src)
    out = tmp_path / "out.pt"
    r = run_ckptconv("convert", src, "-o", out, "--dtype", "bf16", "--memory-limit", "40M", "--finite",
                     "--device", "cpu")
    assert r.returncode == 1, r.stderr
    assert "tensor 'w': 1 NaN, 1 Inf" in r.stderr
    got = torch.load(out, weights_only=True)
    assert torch.equal(got["w"].view(torch.int16), w.to(torch.bfloat16).view(torch.int16))


def test_cuda_validate_finite_equals_cpu_for_every_fixture(cuda_or_skip, run_ckptconv, manifest, testdata):
    # validate's scan workers share one backend from many threads at once
    # (unlike consolidate's one assembling thread): on an H100 with 16 of
    # them the CUDA backend crashed (exit 139) before it held its engine per
    # call. Several threads force the sharing on any machine.
    for src in fixture_sources(manifest, testdata):
        runs = {}
        for device in ("cpu", "cuda"):
            r = run_ckptconv("validate", src, "--finite", "--device", device, "--threads", "8")
            runs[device] = (r.returncode, re.sub(r"^finite scan \(.*?\): ", "finite scan: ", r.stdout, flags=re.M))
        assert runs["cpu"] == runs["cuda"], (src, runs)


def test_cuda_pipelines_pieces_of_a_large_tensor_like_cpu(cuda_or_skip, run_ckptconv, tmp_path):
    # 160 MiB of float32 in 8 slabs of up to 1365 rows (21 MiB), each in
    # pieces of 512 rows (8 MiB) through the three lanes; NaN in the first
    # and last piece (their pieces are cast again on the host), Inf between.
    # Every fixture above fits one piece.
    g = torch.Generator().manual_seed(3)
    w = torch.randn(10240, 4096, generator=g)
    w[1, 2] = float("nan")
    w[5000, 3] = float("inf")
    w[10239, 4095] = float("nan")
    src = tmp_path / "big.pt"
    torch.save({"w": w}, src)
    outs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.pt"
        r = run_ckptconv("convert", src, "-o", out, "--dtype", "bf16", "--finite", "--device", device)
        assert r.returncode == 1, r.stderr
        assert "tensor 'w': 2 NaN, 1 Inf" in r.stderr, r.stderr
        outs[device] = out
    assert filecmp.cmp(outs["cpu"], outs["cuda"], shallow=False)
    got = torch.load(outs["cuda"], weights_only=True)["w"]
    assert torch.equal(got.view(torch.int16), w.to(torch.bfloat16).view(torch.int16))


def test_validate_scans_on_the_cpu_unless_cuda_is_asked_for(cuda_or_skip, run_ckptconv, testdata):
    # Its bytes are in host buffers already: the device would add a copy (gpu.md).
    src = testdata / "dcp/fsdp2_adamw_ws2"
    auto = run_ckptconv("validate", src, "--finite")
    cuda = run_ckptconv("validate", src, "--finite", "--device", "cuda")
    assert auto.returncode == cuda.returncode == 0, (auto.stderr, cuda.stderr)
    assert re.search(r"^finite scan \(cpu", auto.stdout, re.M), auto.stdout
    assert re.search(r"^finite scan \(cuda:0", cuda.stdout, re.M), cuda.stdout
