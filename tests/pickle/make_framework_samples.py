"""Writes tests/pickle/framework_samples.h: pickles of the framework objects
of docs/pickle-globals.md's decode table, made by CPython and numpy at
torch.save's protocol 2, and near misses of each shape, as C++ literals.

Megatron's enums come from stand-in modules registered under megatron's
module paths (same class names, same values), so this needs numpy only:
    .venv/bin/python tests/pickle/make_framework_samples.py
"""
import argparse
import enum
import os
import pickle
import sys
import types

import numpy as np

from make_cpython_samples import literal

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "framework_samples.h")


def stand_in_enums():
    mod = types.ModuleType("megatron.core.transformer.enums")

    class AttnBackend(enum.Enum):
        flash = 1
        fused = 2
        unfused = 3
        local = 4
        auto = 5

    class ModelType(enum.Enum):
        encoder_or_decoder = 1

    class NotInTheTable(enum.Enum):
        x = 1

    for cls in (AttnBackend, ModelType, NotInTheTable):
        cls.__module__ = mod.__name__
        cls.__qualname__ = cls.__name__
        setattr(mod, cls.__name__, cls)
    for name in ("megatron", "megatron.core", "megatron.core.transformer"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[mod.__name__] = mod
    return mod


class Reduce:
    def __init__(self, fn, args, state=None):
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


def samples():
    enums = stand_in_enums()
    rec = np._core.multiarray._reconstruct
    u4 = np.dtype("u4")
    out = []

    def add(name, expr, data):
        out.append((name, expr, data))

    def p2(obj):
        return pickle.dumps(obj, protocol=2)

    add("kUint32Array", "pickle.dumps(np.array([1, 2, 4000000000], dtype=np.uint32), protocol=2)",
        p2(np.array([1, 2, 4000000000], dtype=np.uint32)))
    fortran = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3) - 2)
    add("kFortranInt64", "pickle.dumps(np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3) - 2), protocol=2)",
        p2(fortran))
    add("kBigEndianInt32", "pickle.dumps(np.array([1, -2], dtype='>i4'), protocol=2)", p2(np.array([1, -2], dtype=">i4")))
    add("kHalfAndBool", "pickle.dumps([np.array([1.5, -2.0], dtype=np.float16), np.array([True, False])], protocol=2)",
        p2([np.array([1.5, -2.0], dtype=np.float16), np.array([True, False])]))
    add("kZeroDAndEmpty", "pickle.dumps([np.array(2.25), np.zeros((0, 3))], protocol=2)",
        p2([np.array(2.25), np.zeros((0, 3))]))
    add("kScalars", "pickle.dumps([np.float64(1.5), np.int64(-7), np.bool_(True), np.uint64(2**64 - 1)], protocol=2)",
        p2([np.float64(1.5), np.int64(-7), np.bool_(True), np.uint64(2**64 - 1)]))
    add("kDtype", "pickle.dumps(np.dtype('float32'), protocol=2)", p2(np.dtype("float32")))
    state = np.random.RandomState(5).get_state()
    add("kRandomState", "pickle.dumps(np.random.RandomState(5).get_state(), protocol=2)", p2(state))
    ns = argparse.Namespace(lr=0.5, attention_backend=enums.AttnBackend.auto, model_type=enums.ModelType.encoder_or_decoder)
    add("kNamespace", "pickle.dumps(argparse.Namespace(lr=0.5, attention_backend=AttnBackend.auto, "
        "model_type=ModelType.encoder_or_decoder), protocol=2)", p2(ns))
    add("kEmptyNamespace", "pickle.dumps([argparse.Namespace()], protocol=2)", p2([argparse.Namespace()]))
    small = p2(np.array([1, 2], dtype=np.uint32))
    add("kUint32ArrayNumpy1", "kUint32Array's pickle as numpy 1.x names it (numpy.core.multiarray)",
        small.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    add("kScalarNumpy1", "pickle.dumps(np.int64(3), protocol=2) as numpy 1.x names it (numpy.core.multiarray)",
        p2(np.int64(3)).replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))

    # ---- near misses: each refused naming its global ----
    add("kArrayStateTooShort", "_reconstruct(ndarray, (0,), b'b') with BUILD (1, (2,), dtype('u4'), False)",
        p2(Reduce(rec, (np.ndarray, (0,), b"b"), (1, (2,), u4, False))))
    add("kArrayStateWrongSize", "_reconstruct(ndarray, (0,), b'b') with BUILD (1, (3,), dtype('u4'), False, 8 bytes)",
        p2(Reduce(rec, (np.ndarray, (0,), b"b"), (1, (3,), u4, False, b"\0" * 8))))
    add("kReconstructOtherClass", "_reconstruct(collections.OrderedDict, (0,), b'b')",
        p2(Reduce(rec, (__import__("collections").OrderedDict, (0,), b"b"))))
    add("kDtypeUnknownCode", "pickle.dumps(np.dtype('complex128'), protocol=2)", p2(np.dtype("complex128")))
    add("kDtypeWithFields", "pickle.dumps(np.dtype([('a', 'u4')]), protocol=2)", p2(np.dtype([("a", "u4")])))
    add("kObjectArray", "pickle.dumps(np.array([None, 1], dtype=object), protocol=2)",
        p2(np.array([None, 1], dtype=object)))
    add("kScalarWrongSize", "scalar(dtype('f8'), 4 bytes)",
        p2(Reduce(np._core.multiarray.scalar, (np.dtype("f8"), b"\0" * 4))))
    add("kEnumNotInTable", "pickle.dumps(NotInTheTable.x, protocol=2) (megatron.core.transformer.enums.NotInTheTable)",
        p2(enums.NotInTheTable.x))
    auto = p2(enums.AttnBackend.auto)
    assert auto.count(b"K\x05") == 1
    add("kEnumValueNotInTable", "pickle.dumps(AttnBackend.auto, protocol=2) with its value 5 made 9 (AttnBackend(9))",
        auto.replace(b"K\x05", b"K\x09"))
    add("kNamespaceWithArgs", "argparse.Namespace.__new__(Namespace, 1) (NEWOBJ with an argument)",
        b"\x80\x02cargparse\nNamespace\nK\x01\x85\x81.")  # pickle.py refuses to write it: hand-made
    add("kNamespaceIntKey", "Namespace() with BUILD {1: 2}",
        b"\x80\x02cargparse\nNamespace\n)\x81}K\x01K\x02sb.")
    return out


def main():
    lines = [f"// Generated by tests/pickle/make_framework_samples.py with CPython {sys.version.split()[0]}, "
             f"numpy {np.__version__}; do not edit.",
             "// Each sample: the Python that made it, then its bytes.", "#pragma once", "", "#include <string>", "",
             '#include "cpython_samples.h"', "", "namespace framework_samples {", "",
             "using cpython_samples::bytes_of;", ""]
    for name, expr, data in samples():
        lines.append(f"// {expr}")
        lines.append(f"inline const std::string {name} = bytes_of(\n{literal(data)});")
        lines.append("")
    lines.append("}  // namespace framework_samples")
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
