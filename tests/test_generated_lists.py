"""The lists of source kinds and reshard layouts in the help texts and the
shell completions are generated (formats/registry.cc's descriptors,
jobs/layouts.cc's table), so none leaves a kind or a layout out.

The expected lists come from elsewhere than the help text: the source kinds
from model/source_info.cc (source_kind_name, one name per SourceKind), the
layouts from CLI11's refusal of an unknown `--layout` value. Those that the
hand-written lists used to leave out are also named explicitly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC_COMMANDS = ["inspect", "consolidate", "convert", "reshard", "validate", "diff"]

# Left out of the hand-written lists before they were generated.
ONCE_MISSING_KINDS = ["Megatron-core torch_dist checkpoint", "DeepSpeed universal checkpoint",
                      "DCP model and optimizer directories (Accelerate)", "HDF5 file",
                      "Hugging Face model folder (pytorch_model.bin)"]
ONCE_MISSING_LAYOUTS = ["megatron", "deepspeed-universal", "accelerate", "fsdp1-flat", "hf"]
ALL_LAYOUTS = ["dcp", "hf", "fsdp-sharded-tensor", "fsdp-dtensor", "accelerate", "deepspeed-universal",
               "fsdp1-flat", "megatron", "megatron-legacy"]


def _kind_names(repo: Path) -> list[str]:
    """Every SourceKind's name, as source_kind_name returns it."""
    text = (repo / "src/model/source_info.cc").read_text()
    body = text.split("const char* source_kind_name(SourceKind kind) {", 1)[1].split("\n}\n", 1)[0]
    names = re.findall(r'case SourceKind::k\w+: return "([^"]+)";', body)
    enum = (repo / "src/model/source_info.h").read_text().split("enum class SourceKind {", 1)[1].split("}", 1)[0]
    assert len(names) == len(re.findall(r"\bk\w+", enum)) > 10, names
    return names


@pytest.fixture(scope="module")
def kinds(repo) -> list[str]:
    names = _kind_names(repo)
    for k in ONCE_MISSING_KINDS:
        assert k in names
    return names


@pytest.fixture
def layouts(run_ckptconv) -> list[str]:
    """The values CLI11's IsMember accepts for --layout, from its refusal."""
    r = run_ckptconv("reshard", "x", "-o", "y", "--layout", "nosuch")
    assert r.returncode == 2, r.stderr
    m = re.search(r"nosuch not in \{([^}]*)\}", r.stderr)
    assert m, r.stderr
    names = m.group(1).split(",")
    assert names == ALL_LAYOUTS
    return names


def _src_section(help_text: str) -> list[str]:
    """The kinds named in a help's "SRC is detected as one of:" block."""
    assert "SRC is detected as one of:\n" in help_text, help_text
    block = help_text.split("SRC is detected as one of:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split(": ", 1)[0].strip() for line in block.splitlines()]


def test_top_level_help_names_every_source_kind(run_ckptconv, kinds):
    text = run_ckptconv("--help").stdout
    description = text.split("\nUsage:", 1)[0]
    for kind in kinds:
        assert kind in description, (kind, description)


@pytest.mark.parametrize("command", SRC_COMMANDS)
def test_each_command_help_names_every_source_kind(run_ckptconv, kinds, command):
    r = run_ckptconv(command, "--help")
    assert r.returncode == 0, r.stderr
    listed = _src_section(r.stdout)
    assert sorted(listed) == sorted(kinds), (command, listed)
    for kind in ONCE_MISSING_KINDS:
        assert f"  {kind}: " in r.stdout, (command, kind)
    # `ckptconv help CMD` prints the same text.
    assert run_ckptconv("help", command).stdout == r.stdout


def test_reshard_help_names_every_layout(run_ckptconv, layouts):
    text = run_ckptconv("reshard", "--help").stdout
    description = text.split("\nUsage:", 1)[0]
    layout_help = text.split("--layout TEXT:{", 1)[1].split("\n  --", 1)[0]
    assert layout_help.startswith(",".join(layouts) + "}"), layout_help
    for name in layouts:
        assert name in description, (name, description)
        # each with its own help: "name (what is written)"
        assert re.search(rf"(^|[\s,]){re.escape(name)} \(", layout_help), (name, layout_help)
    for name in ONCE_MISSING_LAYOUTS:
        assert f" {name} (" in " " + " ".join(layout_help.split()), name
    # --world-size's exception is the table's (the layout that loads at any world size)
    assert "except for deepspeed-universal" in text


def test_top_level_help_lists_reshard_description_with_every_layout(run_ckptconv, layouts):
    text = run_ckptconv("--help").stdout
    line = next(l for l in text.splitlines() if l.strip().startswith("reshard "))
    for name in layouts:
        assert name in line, (name, line)


def test_bash_completion_offers_every_layout(run_ckptconv, layouts):
    script = run_ckptconv("completion", "bash").stdout
    block = script.split("\n    reshard)\n", 1)[1].split("\n      ;;\n", 1)[0]
    m = re.search(r"--layout\) values='([^']*)';;", block)
    assert m, block
    assert m.group(1).split() == layouts
    for name in ONCE_MISSING_LAYOUTS:
        assert name in m.group(1).split()


def test_zsh_completion_offers_and_describes_every_layout(run_ckptconv, layouts):
    script = run_ckptconv("completion", "zsh").stdout
    body = script.split("_ckptconv_reshard() {", 1)[1].split("\n}\n", 1)[0]
    assert f":value:({' '.join(layouts)})" in body
    described = next(l for l in script.splitlines() if l.strip().startswith("'reshard:"))
    for name in layouts:
        assert name in described, (name, described)
    for name in ONCE_MISSING_LAYOUTS:
        assert name in described


def test_man_page_names_every_source_kind_and_layout(run_ckptconv, kinds, layouts):
    page = run_ckptconv("man").stdout.replace("\\-", "-")
    for kind in kinds:
        assert kind in page, kind
    for name in layouts:
        assert name in page, name
