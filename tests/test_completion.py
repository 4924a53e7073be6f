"""Shell completions (bash, zsh) and the man page are generated at build time
from the CLI definition (build/share/...), so every command and option the
binary accepts is in them. Bash completion is exercised as bash runs it
(COMP_WORDS/COMP_CWORD and the function `complete -F` registers); zsh's is
syntax-checked by zsh and compared option by option; the man page is
rendered by man."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

COMMANDS = ["inspect", "consolidate", "convert", "reshard", "validate", "diff", "finalize"]


def _share(ckptconv: Path) -> Path:
    share = ckptconv.parent / "share"
    assert share.is_dir(), f"no {share}: the build's ckptconv_share target (part of ALL) writes it"
    return share


def _long_options(run_ckptconv, command: str) -> set[str]:
    text = run_ckptconv(command, "--help").stdout
    body = text.split("\nExamples:", 1)[0]
    return set(re.findall(r"^\s+(?:-\w,)?(--[\w-]+)", body, re.M))


def _bash_complete(script: Path, *words: str) -> list[str]:
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    prog = (f"source '{script}'\nCOMP_WORDS=({quoted})\nCOMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n"
            "_ckptconv\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, cwd=script.parent)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_generated_files_match_the_binary(ckptconv, run_ckptconv):
    share = _share(ckptconv)
    assert (share / "bash-completion/completions/ckptconv").read_text() == run_ckptconv("completion", "bash").stdout
    assert (share / "zsh/site-functions/_ckptconv").read_text() == run_ckptconv("completion", "zsh").stdout
    assert (share / "man/man1/ckptconv.1").read_text() == run_ckptconv("man").stdout


def test_bash_completes_commands_options_and_values(ckptconv, run_ckptconv):
    script = _share(ckptconv) / "bash-completion/completions/ckptconv"
    assert _bash_complete(script, "ckptconv", "") == COMMANDS + ["help", "version", "completion"]
    assert _bash_complete(script, "ckptconv", "con") == ["consolidate", "convert"]
    for command in COMMANDS:
        offered = set(_bash_complete(script, "ckptconv", "-v", command, "x", "--"))
        missing = _long_options(run_ckptconv, command) - offered
        assert not missing, (command, missing)
    assert _bash_complete(script, "ckptconv", "consolidate", "x", "--dtype", "b") == ["bf16"]  # torch names: accepted, not offered
    assert _bash_complete(script, "ckptconv", "reshard", "x", "--layout", "fsdp") == ["fsdp-sharded-tensor",
                                                                                       "fsdp-dtensor", "fsdp1-flat"]
    assert _bash_complete(script, "ckptconv", "completion", "") == ["bash", "zsh"]
    # SRC and -o OUT complete file names
    assert "ckptconv" in _bash_complete(script, "ckptconv", "inspect", "ckpt")
    assert "ckptconv" in _bash_complete(script, "ckptconv", "consolidate", "x", "-o", "ckpt")


def test_zsh_script_parses_and_names_every_option(ckptconv, run_ckptconv):
    script = _share(ckptconv) / "zsh/site-functions/_ckptconv"
    if shutil.which("zsh"):
        r = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    text = script.read_text()
    assert text.startswith("#compdef ckptconv\n")
    for command in COMMANDS:
        body = text.split(f"_ckptconv_{command}() {{", 1)[1].split("\n}\n", 1)[0]
        for opt in _long_options(run_ckptconv, command):
            assert opt in body, (command, opt)
    assert "(keep fp32 bf16 fp16 fp8_e4m3 fp8_e5m2)" in text


def test_man_page_renders_and_documents_every_command_and_option(ckptconv, run_ckptconv):
    page = _share(ckptconv) / "man/man1/ckptconv.1"
    assert shutil.which("man"), "man not installed (scripts/setup installs man-db)"
    r = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True, text=True,
                       env={"MANPAGER": "cat", "MANWIDTH": "100", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = r.stdout.replace("\u2010", "-").replace("\u2011", "-")
    text = re.sub(r"-\n\s+", "-", text)  # hyphenated line breaks
    for section in ("NAME", "SYNOPSIS", "GLOBAL OPTIONS", "COMMANDS", "EXIT STATUS", "ENVIRONMENT"):
        assert re.search(rf"^{section}$", text, re.M), section
    for command in COMMANDS:
        assert re.search(rf"^   {command}$", text, re.M), command
        for opt in _long_options(run_ckptconv, command):
            assert opt in text, (command, opt)
    assert "CKPTCONV_LIBTORCH" in text and "130/143/129" in text
