"""Mistakes a user makes that used to give a wrong result with exit 0 (issue
#16): each is now a usage error (exit 2) that says what to do."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("name", ["model.safetensor", "model.pt.tmp", "model", "model.ckpt"])
def test_output_extension_naming_no_format_is_a_usage_error(name, tmp_path, run_ckptconv, testdata):
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", tmp_path / name)
    assert r.returncode == 2, r.stderr
    assert "names no output format" in r.stderr and ".safetensors" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_extension_case_does_not_matter(tmp_path, run_ckptconv, testdata):
    out = tmp_path / "model.SAFETENSORS"
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", out)
    assert r.returncode == 0, r.stderr
    from safetensors import safe_open
    with safe_open(str(out), "pt") as f:
        assert len(list(f.keys())) > 0


def test_format_disagreeing_with_the_extension_is_a_usage_error(tmp_path, run_ckptconv, testdata):
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", tmp_path / "y.safetensors",
                     "--format", "hdf5")
    assert r.returncode == 2, r.stderr
    assert "the extension says safetensors but --format is hdf5" in r.stderr
    # --format gives the format of a name without a known extension
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", tmp_path / "y.ckpt", "--format", "pt")
    assert r.returncode == 0, r.stderr
    assert "model" in torch.load(tmp_path / "y.ckpt", weights_only=True)


@pytest.mark.parametrize("alias,dtype", [("bfloat16", torch.bfloat16), ("half", torch.float16),
                                         ("float16", torch.float16), ("float", torch.float32)])
def test_dtype_accepts_torch_names(alias, dtype, tmp_path, run_ckptconv, testdata):
    out = tmp_path / "o.pt"
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", out, "--only", "model",
                     "--dtype", alias)
    assert r.returncode == 0, r.stderr
    sd = torch.load(out, weights_only=True)  # --only model: the model's own keys
    assert {t.dtype for t in sd.values()} == {dtype}
    assert "emb.weight" in sd


@pytest.mark.parametrize("member", ["__0_0.distcp", "__1_0.distcp", ".metadata"])
def test_one_file_of_a_dcp_directory_given_alone(member, tmp_path, run_ckptconv, testdata):
    src = testdata / "dcp" / "fsdp2_adamw_ws2" / member
    for args in (["validate", src], ["inspect", src], ["consolidate", src, "-o", tmp_path / "o.pt"]):
        r = run_ckptconv(*args)
        assert r.returncode == 2, f"{args[0]}: {r.returncode} {r.stderr}"
        assert "is one file of the DCP checkpoint" in r.stderr and "pass the directory" in r.stderr
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("member, says", [
    ("fsdp_st/adamw_ws2/model_rank0.pt", "is rank 0 of the per-rank checkpoint"),
    ("fsdp_dt/adamw_ws3/optim_world_size_3_rank_2.pt", "is rank 2 of the per-rank checkpoint"),
    ("zero/z2_bf16_ws2/global_step3/mp_rank_00_model_states.pt", "is one file of the DeepSpeed ZeRO checkpoint"),
    ("zero/z3_bf16_ws2/global_step3/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
     "is one file of the DeepSpeed ZeRO checkpoint"),
])
def test_one_rank_file_given_alone(member, says, tmp_path, run_ckptconv, testdata):
    """Read alone, one rank's file used to consolidate into a wrong whole
    (a ZeRO model-states file: its bf16 weights, exit 0). inspect still shows
    the file as what it is, with the same words as a warning."""
    src = testdata / member
    for args in (["validate", src], ["consolidate", src, "-o", tmp_path / "o.pt"], ["diff", src, src],
                 ["reshard", src, "-o", tmp_path / "d", "--world-size", "2", "--layout", "dcp"]):
        r = run_ckptconv(*args)
        assert r.returncode == 2, f"{args[0]}: {r.returncode} {r.stderr}"
        assert says in r.stderr and str(src.parent) in r.stderr and "pass the directory" in r.stderr
    assert list(tmp_path.iterdir()) == []
    r = run_ckptconv("inspect", src)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("warning: ") and says in r.stderr and "showing this file alone" in r.stderr


def test_empty_directory_says_no_checkpoint_found(tmp_path, run_ckptconv):
    (tmp_path / "empty").mkdir()
    r = run_ckptconv("inspect", tmp_path / "empty")
    assert r.returncode == 3
    assert "no checkpoint found in" in r.stderr and "empty" in r.stderr


def test_usage_errors_start_with_error_and_suggest(tmp_path, run_ckptconv, testdata):
    r = run_ckptconv("consolidte", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", tmp_path / "y.pt")
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "did you mean 'consolidate'?" in r.stderr
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", tmp_path / "y.pt", "--dtyp", "bf16")
    assert r.returncode == 2 and "did you mean '--dtype' for '--dtyp'?" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_shell_expanded_glob_is_explained(run_ckptconv, testdata):
    files = sorted((testdata / "fsdp_st" / "adamw_ws2").glob("*rank*.pt"))
    r = run_ckptconv("inspect", *files)
    assert r.returncode == 2
    assert "quote it" in r.stderr and "--files" in r.stderr


def test_help_command(run_ckptconv):
    r = run_ckptconv("help")
    assert r.returncode == 0 and "consolidate" in r.stdout and "reshard" in r.stdout
    r = run_ckptconv("help", "consolidate")
    assert r.returncode == 0 and r.stdout == run_ckptconv("consolidate", "--help").stdout
    r = run_ckptconv("help", "consolidat")
    assert r.returncode == 2 and "did you mean 'consolidate'?" in r.stderr


@pytest.mark.parametrize("form", ["dir/", "dir"])
def test_output_that_is_a_directory_gets_the_file_in_it(form, tmp_path, run_ckptconv, testdata):
    """-o DIR/ (or an existing DIR) writes into it, as Hugging Face tools do
    (tests/test_everyday_paths.py checks what is written)."""
    (tmp_path / "dir").mkdir()
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", f"{tmp_path}/{form}")
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "dir").iterdir()] == ["full.safetensors"]
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", f"{tmp_path}/{form}")
    assert r.returncode == 2 and "output exists (use --force to overwrite)" in r.stderr, r.stderr


@pytest.mark.parametrize("cmd", [["consolidate", "-o", "{t}/nope/x.pt"],
                                 ["consolidate", "-o", "{t}/nope/x.safetensors", "--max-shard-size", "1K"],
                                 ["reshard", "-o", "{t}/nope/dst", "--world-size", "2"]])
def test_missing_parent_directory_is_made(cmd, tmp_path, run_ckptconv, testdata):
    """Missing parents are made, as `consolidate -o DIR/` makes them (#48 row
    5; they were refused, naming the directory to create), and removed again
    when the job fails (tests/test_real_run_edges.py)."""
    args = [a.format(t=tmp_path) for a in cmd]
    r = run_ckptconv(args[0], testdata / "dcp" / "fsdp2_adamw_ws2", *args[1:])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "nope").is_dir() and any((tmp_path / "nope").iterdir())
    written = args[args.index("-o") + 1]
    if "--max-shard-size" in args:  # shards and their index
        written += ".index.json"
    assert run_ckptconv("diff", written, testdata / "dcp" / "fsdp2_adamw_ws2").returncode == 0


@pytest.mark.parametrize("how", [["{t}/zz/*.pt"], ["{t}/zz*.pt"], ["--files", "{t}/zz*.pt"]])
@pytest.mark.parametrize("command", ["consolidate", "validate", "inspect"])
def test_glob_matching_nothing_is_a_usage_error(command, how, tmp_path, run_ckptconv):
    args = [a.format(t=tmp_path) for a in how]
    out = ["-o", str(tmp_path / "x.pt")] if command == "consolidate" else []
    r = run_ckptconv(command, *args, *out)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no file matches this pattern" in r.stderr


EXIT_CODES = {  # the codes each command can return, as its help's footer lists them
    "inspect": {0, 2, 3, 5},
    "consolidate": {0, 1, 2, 3, 4, 5},
    "convert": {0, 1, 2, 3, 4, 5},
    "reshard": {0, 2, 3, 4, 5},
    "validate": {0, 1, 2, 3, 4, 5},
    "diff": {0, 1, 2, 3, 5},
}


@pytest.mark.parametrize("command", sorted(EXIT_CODES))
def test_help_has_examples_groups_and_its_own_exit_codes(command, run_ckptconv):
    import re
    r = run_ckptconv(command, "--help")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    examples = text.split("Examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert 2 <= len(examples) <= 3 and all(e.startswith(f"  ckptconv {command} ") for e in examples), examples
    groups = re.findall(r"^([A-Z][a-z]+):$", text, re.M)
    assert len(set(groups) - {"Positionals", "Options", "Examples"}) >= 2, groups
    footer = text.split("Exit codes: ", 1)[1].replace("\n", " ")
    listed = {int(c) for c in re.findall(r"(?:^|; )(\d)\b", footer)}
    assert listed == EXIT_CODES[command], footer
    if command in ("consolidate", "convert", "reshard"):
        assert "130/143/129" in footer


def test_inspect_help_names_every_source_kind(run_ckptconv):
    text = run_ckptconv("inspect", "--help").stdout
    for kind in ("DCP directory", "per-rank FSDP files", "DeepSpeed ZeRO", "--tag", ".pt", ".safetensors",
                 ".safetensors.index.json", ".h5"):
        assert kind in text, kind


def test_convert_is_documented_as_the_same_job_as_consolidate(run_ckptconv):
    assert "the same job as consolidate" in run_ckptconv("convert", "--help").stdout


def test_verbose_says_what_was_found_skipped_planned_and_chosen(tmp_path, run_ckptconv, testdata):
    import shutil
    src = tmp_path / "ranks"
    shutil.copytree(testdata / "fsdp_st" / "adamw_ws2", src)
    (src / "notes.txt").write_text("not a rank file")
    r = run_ckptconv("-v", "consolidate", src, "--dtype", "bf16", "-o", tmp_path / "o.safetensors")
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert f"ignoring {src}/notes.txt: no rank in its file name" in err
    assert f"source {src}: per-rank files (fsdp-ranks)" in err and "world size 2" in err
    assert "plan: " in err and "-> " + str(tmp_path / "o.safetensors") + " (safetensors)" in err
    assert "backend: cpu for casts and scans (--device auto)" in err
    r = run_ckptconv("-v", "reshard", testdata / "zero" / "z2_bf16_ws2", "-o", tmp_path / "dst", "--world-size", "3",
                     "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    assert "DeepSpeed ZeRO checkpoint (deepspeed-zero)" in r.stderr and "zero_stage: 2" in r.stderr
    assert "over 3 ranks" in r.stderr and "bytes are copied unchanged" in r.stderr


def test_quiet_prints_only_errors(tmp_path, run_ckptconv, testdata):
    r = run_ckptconv("-q", "consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "--dtype", "bf16",
                     "-o", tmp_path / "o.pt")
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr
    r = run_ckptconv("-q", "consolidate", tmp_path / "missing", "-o", tmp_path / "p.pt")
    assert r.returncode == 3 and r.stderr.startswith("error: ")


@pytest.mark.parametrize("name, extra, says", [
    ("m.pt", [], r"wrote {d}/m\.pt \(pt\)"),
    ("m.h5", [], r"wrote {d}/m\.h5 \(hdf5\)"),
    ("m.safetensors", ["--max-shard-size", "1K"],
     r"wrote {d}/m\.safetensors\.index\.json and 2 shards \({d}/m-00001-of-00002\.safetensors, \.\.\.\) \(safetensors\)"),
])
def test_success_line_names_format_files_size_time_and_throughput(name, extra, says, tmp_path, run_ckptconv,
                                                                  testdata):
    import re
    r = run_ckptconv("consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", tmp_path / name, *extra)
    assert r.returncode == 0, r.stderr
    pattern = says.format(d=re.escape(str(tmp_path))) + r": 25 tensors, [\d.]+ KiB in [\d.]+ s \([\d.]+ [KMG]?i?B/s\)"
    assert re.search(pattern, r.stderr), r.stderr
    if extra:
        assert not (tmp_path / name).exists()  # the line never names a file that is not there
