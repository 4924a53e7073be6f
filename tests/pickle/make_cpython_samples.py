"""Writes tests/pickle/cpython_samples.h: pickles made by CPython (and torch)
as C++ byte-string literals, each under a comment with the Python expression.

Run from the repository root with the project venv (torch needed for the
torch.save and DCP samples) and, for the Python 2 sample, python2.7:
    .venv/bin/python tests/pickle/make_cpython_samples.py
"""
import collections
import io
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import zipfile

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpython_samples.h")
PY27 = os.path.expanduser("~/.pyenv/versions/2.7.18/bin/python")


def literal(data: bytes) -> str:
    """C++ string literal pieces, 100 source characters a line, with hex
    escapes split from a following hex digit."""
    lines, cur, prev_hex = [], "", False
    for b in data:
        c = chr(b)
        if c == "\\":
            piece = "\\\\"
        elif c == '"':
            piece = '\\"'
        elif 0x20 <= b < 0x7F and c != "?":
            piece = c
            if prev_hex and c in "0123456789abcdefABCDEF":
                piece = '" "' + c
        else:
            piece = "\\x%02x" % b
        prev_hex = piece.startswith("\\x")
        if len(cur) + len(piece) > 96:
            lines.append(cur)
            cur, prev_hex = "", piece.startswith("\\x")
        cur += piece
    lines.append(cur)
    return "\n".join('    "%s"' % line for line in lines)


class Point:
    def __init__(self):
        self.x = 1


class Reduce:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def samples():
    out = []
    common = "{'a': [1, -2, 3.5, None, True, False], 'b': ('x', b'\\x00\\xff'), 'c': 2**70, 'd': -2**63, 'u': 'h\\xe9llo\\n\\\\', 's': {7}, 'ba': bytearray(b'z')}"
    obj = eval(common)
    for proto in range(6):
        out.append((f"kCommonProtocol{proto}", f"pickle.dumps({common}, protocol={proto})", pickle.dumps(obj, protocol=proto)))
    out.append(("kFrozenSetProtocol4", "pickle.dumps(frozenset([1]), protocol=4)", pickle.dumps(frozenset([1]), protocol=4)))
    out.append(("kOrderedDictProtocol2", "pickle.dumps(OrderedDict([('x', 1), ('y', 2)]), protocol=2)",
                pickle.dumps(collections.OrderedDict([("x", 1), ("y", 2)]), protocol=2)))
    l = [1]
    out.append(("kSharedListProtocol2", "l = [1]; pickle.dumps([l, l], protocol=2)", pickle.dumps([l, l], protocol=2)))
    p = Point()
    out.append(("kSharedObjectProtocol2", "p = Point() (p.x = 1, class in __main__); pickle.dumps([p, p], protocol=2)",
                pickle.dumps([p, p], protocol=2)))
    big = [2**64, -2**64, 2**1000, 2**2100, -2**2100 + 12345]
    out.append(("kBigIntsProtocol2", "pickle.dumps([2**64, -2**64, 2**1000, 2**2100, -2**2100 + 12345], protocol=2)",
                pickle.dumps(big, protocol=2)))
    out.append(("kBigIntsProtocol0", "pickle.dumps([2**70, -2**70, 5], protocol=0)", pickle.dumps([2**70, -2**70, 5], protocol=0)))
    cyc = []
    cyc.append(cyc)
    out.append(("kSelfContainingList", "l = []; l.append(l); pickle.dumps(l, protocol=2)", pickle.dumps(cyc, protocol=2)))
    # refused globals, made the way an attacker would
    import os as os_mod
    import subprocess as sp
    out.append(("kReduceTrickSystem", "pickle.dumps(Reduce(os.system, ('echo',)), protocol=2)  # os.system is posix.system",
                pickle.dumps(Reduce(os_mod.system, ("echo",)), protocol=2)))
    out.append(("kStackGlobalEval", "pickle.dumps(Reduce(eval, ('1+1',)), protocol=4)",
                pickle.dumps(Reduce(eval, ("1+1",)), protocol=4)))
    out.append(("kPopen", "pickle.dumps(Reduce(subprocess.Popen, (['ls'],)), protocol=2)",
                pickle.dumps(Reduce(sp.Popen, (["ls"],)), protocol=2)))
    # pickler byte-exact references (protocol 2)
    exact = {
        "kExactNone": None, "kExactTrue": True, "kExactInts": [0, 255, 256, 65535, 65536, -1, 2**31 - 1, -2**31, 2**31,
                                                               2**63 - 1, -2**63, 2**64, -129, 128],
        "kExactFloat": [1.5, -0.0, float("inf")], "kExactStr": "h\xe9llo \u4e16\U0001f600",
        "kExactBytes": [b"\x00\xff", b"ab"], "kExactDict": {"a": 1, "b": [None]},
        "kExactTuples": [("x",), (1, 2), (1, 2, 3), (1, 2, 3, 4), ()],
        "kExactOrderedDict": collections.OrderedDict([("a", 1), ("b", 2)]),
        "kExactSet": {1, 2, 3}, "kExactByteArray": bytearray(b"ab"),
    }
    for name, value in exact.items():
        out.append((name, f"pickle.dumps({value!r}, protocol=2)", pickle.dumps(value, protocol=2)))
    return out


def py27_sample():
    code = ("import pickle,sys; sys.stdout.write(pickle.dumps({'s': 'ab\\'c\\n\\x01', 'u': u'h\\xe9\\\\', "
            "'l': 12345678901234567890L, 't': True, 'f': 1.5, 'i': -7, 'n': None}, 0))")
    data = subprocess.run([PY27, "-c", code], check=True, capture_output=True).stdout
    expr = ("pickle.dumps({'s': 'ab\\'c\\n\\x01', 'u': u'h\\xe9\\\\', 'l': 12345678901234567890L, 't': True, "
            "'f': 1.5, 'i': -7, 'n': None}, 0)  # Python 2.7")
    return [("kPython2Protocol0", expr, data)]


def torch_samples():
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 3)
    buf = io.BytesIO()
    torch.save(lin.state_dict(), buf)
    z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    data_pkl = z.read("archive/data.pkl")
    d = tempfile.mkdtemp()
    ckpt = os.path.join(d, "ckpt")
    dcp.save({"w": torch.ones(3, 2), "f": 1.5, "l": [1, 2, "x"]}, checkpoint_id=ckpt)
    meta = open(os.path.join(ckpt, ".metadata"), "rb").read()
    shutil.rmtree(d)
    return [
        ("kTorchLinearDataPkl", "data.pkl of torch.save(torch.nn.Linear(2, 3).state_dict()) (torch 2.15)", data_pkl),
        ("kDcpMetadata", "DCP .metadata of dcp.save({'w': torch.ones(3, 2), 'f': 1.5, 'l': [1, 2, 'x']}) (torch 2.15, "
                         "checkpoint_id under a temp dir)", meta),
    ]


def main():
    items = samples() + py27_sample() + torch_samples()
    with open(OUT, "w") as f:
        f.write("// Generated by tests/pickle/make_cpython_samples.py with CPython %s; do not edit.\n"
                % sys.version.split()[0])
        f.write("// Each sample: the Python that made it, then its bytes.\n#pragma once\n\n#include <string>\n\n")
        f.write("namespace cpython_samples {\n\n")
        f.write("template <std::size_t N>\nstd::string bytes_of(const char (&s)[N]) { return std::string(s, N - 1); }\n\n")
        for name, expr, data in items:
            f.write("// %s\n" % expr.replace("\n", "\\n"))
            f.write("inline const std::string %s = bytes_of(\n%s);\n\n" % (name, literal(data)))
        f.write("}  // namespace cpython_samples\n")


if __name__ == "__main__":
    main()
