"""Progress and color on stderr (issue #8 "Output a pipeline can use"):
progress text only when stderr is a terminal (a pseudo-terminal here) and
not --quiet; no ANSI escapes under NO_COLOR; pipes never see either."""
import os
import re
import pty
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DCP = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2"
REF = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2.ref.pt"


def run_with_tty_stderr(ckptconv, *args, env_extra=None):
    """Runs ckptconv with stderr on a pseudo-terminal and stdout on a pipe;
    returns (exit code, stdout, everything written to the terminal)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    env["TERM"] = "xterm"
    env.update(env_extra or {})
    proc = subprocess.Popen([str(ckptconv), *map(str, args)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, env=env)
    os.close(slave)
    tty = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not chunk:
            break
        tty += chunk
    os.close(master)
    out = proc.stdout.read().decode()
    return proc.wait(timeout=600), out, tty.decode(errors="replace")


def test_diff_draws_progress_on_a_terminal(ckptconv):
    code, out, tty = run_with_tty_stderr(ckptconv, "diff", DCP, REF)
    assert code == 0 and out.rstrip().endswith("equal")
    assert "\rdiff  0 B / " in tty  # the first line, drawn at once
    assert "100%" in tty and "ETA" in tty and "/s" in tty
    # The final count, then erased with spaces before the log line that follows.
    assert re.search(r"100%[^\r]*\r +\r(\x1b\[\d+m)?info", tty), repr(tty)
    assert "\r" not in out and "ETA" not in out  # progress never goes to stdout


def test_consolidate_draws_progress_on_a_terminal(ckptconv, tmp_path):
    out_file = tmp_path / "full.pt"
    code, _, tty = run_with_tty_stderr(ckptconv, "consolidate", DCP, "-o", out_file)
    assert code == 0 and out_file.exists()
    assert f"\rwrite {out_file}  0 B / " in tty and "100%" in tty


def test_quiet_and_pipes_get_no_progress(ckptconv, run_ckptconv, tmp_path):
    code, _, tty = run_with_tty_stderr(ckptconv, "-q", "diff", DCP, REF)
    assert code == 0 and tty == ""
    piped = run_ckptconv("diff", DCP, REF)
    assert piped.returncode == 0 and "\r" not in piped.stderr and "ETA" not in piped.stderr
    piped = run_ckptconv("consolidate", DCP, "-o", tmp_path / "x.pt")
    assert piped.returncode == 0 and "\r" not in piped.stderr and "\x1b" not in piped.stderr
    assert "wrote" in piped.stderr  # the log line itself is still there


def test_log_colors_on_a_terminal_unless_no_color(ckptconv, tmp_path):
    code, _, colored = run_with_tty_stderr(ckptconv, "consolidate", DCP, "-o", tmp_path / "a.pt")
    assert code == 0 and "\x1b[" in colored and "wrote" in colored
    code, _, plain = run_with_tty_stderr(ckptconv, "consolidate", DCP, "-o", tmp_path / "b.pt",
                                         env_extra={"NO_COLOR": "1"})
    assert code == 0 and "wrote" in plain and "100%" in plain
    assert "\x1b" not in plain


@pytest.mark.parametrize("flag,shown,hidden", [("-q", [], ["info:", "debug:"]),
                                               (None, ["info: compared"], ["debug:"]),
                                               ("-v", ["info: compared", "debug: A: "], [])])
def test_log_levels(run_ckptconv, flag, shown, hidden):
    r = run_ckptconv(*([flag] if flag else []), "diff", DCP, REF)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("equal")
    for s in shown:
        assert s in r.stderr, (flag, r.stderr)
    for s in hidden:
        assert s not in r.stderr, (flag, r.stderr)


@pytest.mark.parametrize("flag", ["-q", "-v"])
def test_log_flags_also_after_the_subcommand(run_ckptconv, flag):
    r = run_ckptconv("diff", DCP, REF, flag)
    assert r.returncode == 0
    assert ("debug: A: " in r.stderr) == (flag == "-v")
    assert ("info:" in r.stderr) == (flag == "-v")
    assert run_ckptconv("diff", DCP, REF, "--no-such-flag").returncode == 2
