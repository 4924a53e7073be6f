"""Editing real torch.save files record by record, for tests that need a
file torch wrote with one record changed (a hostile data.pkl, a damaged
format record, an added client_state entry). Not a test module."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Callable


def rewrite_records(pt: Path, change: Callable[[str, bytes], bytes]) -> None:
    """Rewrites the zip `pt` with every record's bytes passed through
    change(name, data); stored, as torch writes them."""
    with zipfile.ZipFile(pt) as z:
        records = [(info.filename, z.read(info)) for info in z.infolist()]
    with zipfile.ZipFile(pt, "w", compression=zipfile.ZIP_STORED) as out:
        for name, data in records:
            out.writestr(name, change(name, data))


def replace_record(pt: Path, suffix: str, data: bytes) -> None:
    """The record whose name ends with "/" + suffix gets `data` (it must exist)."""
    found = []

    def change(name: str, old: bytes) -> bytes:
        if name.endswith("/" + suffix):
            found.append(name)
            return data
        return old
    rewrite_records(pt, change)
    assert found, f"{pt} has no record {suffix}"


def pt_with_data_pkl(path: Path, data_pkl: bytes) -> None:
    """A real torch.save zip (of {'w': arange(4)}) whose data.pkl is `data_pkl`."""
    import torch
    torch.save({"w": torch.arange(4.0)}, path)
    replace_record(path, "data.pkl", data_pkl)


# Bytes per element to reverse, by the storage class data.pkl names (complex:
# each of its two floats; one-byte types: none).
_SWAP_UNIT = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
              "IntStorage": 4, "ShortStorage": 2, "ComplexFloatStorage": 4, "ComplexDoubleStorage": 8,
              "UInt16Storage": 2, "UInt32Storage": 4, "UInt64Storage": 8}


def storage_classes(data_pkl: bytes) -> dict[str, str]:
    """Record key -> storage class name, from the persistent ids of data.pkl
    (('storage', <class>, key, location, numel)), without building anything."""
    import io
    import pickle

    class Named:
        def __init__(self, name):
            self.name = name

        def __call__(self, *args, **kwargs):
            return None

    found = {}

    class Scan(pickle.Unpickler):
        def find_class(self, module, name):
            return Named(name)

        def persistent_load(self, pid):
            found[str(pid[2])] = pid[1].name
            return None
    Scan(io.BytesIO(data_pkl)).load()
    return found


def save_big_endian(obj, path: Path) -> None:
    """What torch.save writes on a big-endian machine (s390x): byteorder
    'big' and every storage's elements byte-reversed. torch.save here, then
    the archive copied record by record through torch's own archive writer
    (torch._C.PyTorchFileWriter) with each storage swapped for its dtype.
    torch.load reads the result by swapping back, which the tests check."""
    import numpy as np
    import torch
    tmp = path.with_name(path.name + ".le")
    torch.save(obj, tmp)
    reader = torch._C.PyTorchFileReader(str(tmp))
    names = reader.get_all_records()
    classes = storage_classes(bytes(reader.get_record("data.pkl")))
    writer = torch._C.PyTorchFileWriter(str(path))
    for name in names:
        data = bytes(reader.get_record(name))
        if name == "byteorder":
            data = b"big"
        elif name.startswith("data/") and classes.get(name[len("data/"):]) in _SWAP_UNIT:
            unit = _SWAP_UNIT[classes[name[len("data/"):]]]
            data = np.frombuffer(data, dtype=f"<u{unit}").astype(f">u{unit}").tobytes()
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    del reader
    tmp.unlink()
