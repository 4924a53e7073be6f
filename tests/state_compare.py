"""Equality of state dicts as torch loads them: same nesting, same key order,
tensors bitwise equal with equal dtype and shape, other values equal."""
import torch


def tensor_bits(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else t


def assert_same(actual, expected, path="<root>", key_order=True):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual).__name__}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        assert torch.equal(tensor_bits(actual), tensor_bits(expected)), f"{path}: tensor bytes differ"
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected a dict, got {type(actual).__name__}"
        if key_order:
            assert list(actual.keys()) == list(expected.keys()), f"{path}: keys {list(actual)} != {list(expected)}"
        else:
            assert sorted(map(str, actual)) == sorted(map(str, expected)), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}.{k}", key_order)
        return
    if isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}.{i}", key_order)
        return
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, float) and expected != expected:
        assert actual != actual, f"{path}: expected NaN"
        return
    assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def select(sd, only=None, keys=None):
    """The torch-side meaning of --only and --keys (docs/usage.md): --only
    NAME makes the top-level entry NAME (for optim also "optimizer") the
    root; then dicts keep entries with a leaf --keys matches below it, and a
    list is kept whole when any leaf under it matches."""
    import re

    if only:
        name = only if only in sd or only != "optim" else "optimizer"
        sd = sd[name]

    pattern = re.compile(keys) if keys else None

    def leaves(v, path):
        if isinstance(v, dict) and v:
            for k, c in v.items():
                yield from leaves(c, f"{path}.{k}" if path else str(k))
        elif isinstance(v, (list, tuple)) and any(isinstance(i, (dict, list, tuple, torch.Tensor)) for i in v):
            for i, c in enumerate(v):
                yield from leaves(c, f"{path}.{i}" if path else str(i))
        else:
            yield path

    def keep(v, path):
        if isinstance(v, dict) and v:
            out = {}
            for k, c in v.items():
                p = f"{path}.{k}" if path else str(k)
                kept = keep(c, p)
                if kept is not None:
                    out[k] = kept
            return out or None
        if pattern is None or any(pattern.search(p) for p in leaves(v, path)):
            return v
        return None

    return keep(sd, "")


def cast_floats(sd, dtype):
    """The torch-side meaning of --dtype: floating tensors cast, optimizer step counters kept."""
    def walk(v, key):
        if isinstance(v, torch.Tensor):
            return v.to(dtype) if v.is_floating_point() and key != "step" else v
        if isinstance(v, dict):
            return {k: walk(c, k) for k, c in v.items()}
        if isinstance(v, list):
            return [walk(c, None) for c in v]
        return v
    return walk(sd, None)
