"""Folders of checkpoints and DeepSpeed tags that are links out of the folder
(#37 row 6): the symlink rule that covers a checkpoint's own files covers
the checkpoints a folder holds too. A step directory `step-9 -> ../secret`,
or a DeepSpeed `latest` naming a linked tag, is exit 3 naming the link,
unless --follow-links; a link that stays inside the folder is read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DCP = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2"
ZERO = REPO / "testdata" / "zero" / "z2_bf16_ws2"


@pytest.fixture
def folder(tmp_path):
    """ckpt/step-100 (a real DCP checkpoint) and secret/ outside the folder: ckpt/step-200 -> ../secret."""
    root = tmp_path / "ckpt"
    root.mkdir()
    shutil.copytree(DCP, root / "step-100")
    shutil.copytree(DCP, tmp_path / "secret")
    (root / "step-200").symlink_to(Path("..") / "secret", target_is_directory=True)
    return root


@pytest.mark.parametrize("args", [["inspect"], ["validate"], ["consolidate", "--tag", "latest"],
                                  ["consolidate", "--tag", "step-200"], ["consolidate", "--tag", "step-100"]])
def test_a_step_directory_linked_out_of_the_folder_is_refused(args, folder, tmp_path, run_ckptconv):
    command, *rest = args
    out = ["-o", tmp_path / "out.pt"] if command == "consolidate" else []
    r = run_ckptconv(command, folder, *rest, *out)
    said = r.stdout + r.stderr  # validate reports on stdout
    assert r.returncode == 3, said
    assert "step-200 resolves to" in said and "outside the checkpoint directory" in said, said
    assert "--follow-links" in said
    assert not (tmp_path / "out.pt").exists()


def test_follow_links_reads_a_linked_step_directory(folder, tmp_path, run_ckptconv):
    r = run_ckptconv("--follow-links", "consolidate", folder, "--tag", "latest", "-o", tmp_path / "out.pt")
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("diff", tmp_path / "out.pt", tmp_path / "secret")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_link_that_stays_inside_the_folder_is_read(folder, tmp_path, run_ckptconv):
    (folder / "step-200").unlink()
    (folder / "step-200").symlink_to("step-100", target_is_directory=True)
    r = run_ckptconv("consolidate", folder, "--tag", "latest", "-o", tmp_path / "out.pt")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("how", ["latest", "tag"])
def test_a_deepspeed_tag_linked_out_of_the_folder_is_refused(how, tmp_path, run_ckptconv):
    root = tmp_path / "ds"
    root.mkdir()
    (tag,) = [p for p in ZERO.iterdir() if p.is_dir()]
    shutil.copytree(tag, tmp_path / "secret_tag")
    (root / tag.name).symlink_to(tmp_path / "secret_tag", target_is_directory=True)
    (root / "latest").write_text(tag.name)
    extra = ["--tag", tag.name] if how == "tag" else []
    r = run_ckptconv("consolidate", root, *extra, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert "outside the checkpoint directory" in r.stderr and "--follow-links" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()
    r = run_ckptconv("--follow-links", "consolidate", root, *extra, "-o", tmp_path / "out.pt")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("latest,says", [
    ("../x", "names '../x', which is not a directory inside"),
    ("/etc", "names '/etc', which is not a directory inside"),
    ("", "names '', which is not a directory inside"),
    ("A" * 100_000, "longer than a directory name can be"),
])
@pytest.mark.parametrize("tag", [[], ["--tag", "latest"]], ids=["no-tag", "tag-latest"])
def test_a_latest_that_names_no_tag_is_an_input_fault(latest, says, tag, tmp_path, run_ckptconv):
    """#37 row 8: a `latest` of ../x was exit 2 (a usage error), a 100 KB one
    was echoed whole. Now exit 3 naming the file, quoting at most 64 bytes."""
    root = tmp_path / "ds"
    root.mkdir()
    (tag_dir,) = [p for p in ZERO.iterdir() if p.is_dir()]
    shutil.copytree(tag_dir, root / tag_dir.name)
    (root / "latest").write_text(latest)
    r = run_ckptconv("consolidate", root, *tag, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert f"{root / 'latest'}: " in r.stderr and says in r.stderr, r.stderr
    assert len(r.stderr) < 1000, len(r.stderr)
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("latest,says", [
    ("global_step9", "names 'global_step9', which is no checkpoint here"),
    ("\ufeff{tag}", "starts with a UTF-8 byte-order mark"),
    ("{tag}\nglobal_step9\n", "holds more than one line"),
])
@pytest.mark.parametrize("tag", [[], ["--tag", "latest"]], ids=["no-tag", "tag-latest"])
def test_a_latest_naming_a_missing_tag_does_not_read_the_only_one(latest, says, tag, tmp_path, run_ckptconv):
    """A root with one tag and a `latest` naming another (that save deleted,
    or the name behind a byte-order mark, which DeepSpeed's `read().strip()`
    keeps) was read as 'the only checkpoint': another step, exit 0, VALID.
    A resuming DeepSpeed job finds no checkpoint there, so it is exit 3."""
    root = tmp_path / "ds"
    root.mkdir()
    (tag_dir,) = [p for p in ZERO.iterdir() if p.is_dir()]
    shutil.copytree(tag_dir, root / tag_dir.name)
    (root / "latest").write_text(latest.format(tag=tag_dir.name), encoding="utf-8")
    asked = "--tag latest" if tag else "no --tag"
    r = run_ckptconv("consolidate", root, *tag, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert says in r.stderr and str(root / "latest") in r.stderr, r.stderr
    if latest == "global_step9":
        assert r.stderr.count(asked + ":") == 1, r.stderr
    assert not (tmp_path / "out.pt").exists()
    r = run_ckptconv("validate", root, *tag)
    assert r.returncode == 3 and says in r.stdout and "VALID" not in r.stdout.replace("INVALID", ""), r.stdout
    # --tag NAME still reads it
    assert run_ckptconv("validate", root, "--tag", tag_dir.name).returncode == 0


def test_a_latest_is_stripped_as_deepspeed_strips_it(tmp_path, run_ckptconv):
    """DeepSpeed reads `latest` with read().strip(): whitespace before the
    name (a leading newline or space, a vertical tab) goes as well as after."""
    root = tmp_path / "ds"
    root.mkdir()
    (tag_dir,) = [p for p in ZERO.iterdir() if p.is_dir()]
    shutil.copytree(tag_dir, root / tag_dir.name)
    (root / "latest").write_text(f"\n \x0b{tag_dir.name}\r\n\t ")
    assert open(root / "latest").read().strip() == tag_dir.name
    r = run_ckptconv("validate", root)
    assert r.returncode == 0 and f"checkpoint {root / tag_dir.name}" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["__0_0.distcp\x00", "__0_0.distcp\x00.old"])
def test_a_storage_path_with_a_nul_byte_is_refused(name, tmp_path, run_ckptconv):
    """A DCP .metadata whose storage path holds a NUL byte names no file
    (torch: "embedded null byte"); opened as a C string it had read the file
    named by the bytes before the NUL, with exit 0."""
    import dataclasses
    import pickle

    import torch
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "ckpt"
    dcp.save({"w": torch.arange(4.0)}, checkpoint_id=src)
    md = pickle.loads((src / ".metadata").read_bytes())
    for k, v in md.storage_data.items():
        md.storage_data[k] = dataclasses.replace(v, relative_path=name)
    (src / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(BaseException):  # CheckpointException over ValueError: embedded null byte
        dcp.load({"w": torch.zeros(4)}, checkpoint_id=src)
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "o.pt")
    assert r.returncode == 3 and "NUL" in r.stderr and "__0_0.distcp" in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()
