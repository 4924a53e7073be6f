"""Hostile pickles: every way we know for a pickle to reach a callable,
built by CPython's own pickler from objects whose __reduce__ asks for it
(or, where no Python object pickles that way, assembled opcode by opcode).

Each payload, if some loader ever ran it, creates the file MARKER: tests
assert it is never created and that no output carries the payload.

Used by tests/pickle/make_hostile_samples.py (the Catch2 samples) and by
tests/test_hostile_pickles.py (real torch.save / dcp.save files through every
subcommand). Needs only CPython; torch is imported by the callers.
"""
import builtins
import collections
import functools
import operator
import pickle


def payload(marker):
    """The code a successful attack runs: harmless, but visible."""
    return "open(%r, 'w').close()" % marker


class Reduce:
    """An object that pickles as callable(*args)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args

    def __call__(self, *args):  # pickle insists that the callable of a reduce be callable
        raise RuntimeError("only ever pickled")


def getattr_chain(marker):
    # getattr(getattr(getattr, '__self__'), 'eval')(payload): builtins.getattr
    # is allowed for ShardedTensor.ProcessGroupState; here it reaches eval.
    builtins_module = Reduce(getattr, getattr, "__self__")
    evaluate = Reduce(getattr, builtins_module, "eval")
    return Reduce(evaluate, payload(marker))


def direct_eval(marker):
    return Reduce(eval, payload(marker))


def attrgetter(marker):
    return Reduce(Reduce(operator.attrgetter("__self__.eval"), getattr), payload(marker))


def partial(marker):
    return Reduce(functools.partial(eval, payload(marker)))


def copyreg_reconstructor(marker):
    import copyreg
    return Reduce(copyreg._reconstructor, collections.OrderedDict, dict, {"x": payload(marker)})


def defaultdict_factory(marker):
    return Reduce(collections.defaultdict, eval)


# Objects torch.save can write: each is one attack, as the value of a key.
OBJECT_ATTACKS = {
    "getattr_chain": getattr_chain,
    "direct_eval": direct_eval,
    "attrgetter": attrgetter,
    "partial": partial,
    "copyreg": copyreg_reconstructor,
    "defaultdict": defaultdict_factory,
}


def _global(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _str(s):
    b = s.encode()
    return b"X" + len(b).to_bytes(4, "little") + b


def opcode_attacks(marker):
    """Streams no Python object pickles to, assembled by hand (protocol 2
    unless noted). Each names only globals the allow-list has, or uses an
    opcode that calls something: the policy must refuse the use itself."""
    code = _str(payload(marker))
    getattr_g = _global("__builtin__", "getattr")
    eval_via_getattr = (getattr_g + getattr_g + getattr_g + _str("__self__") + b"\x86R" + _str("eval") + b"\x86R")
    return {
        # REDUCE of getattr chains (protocol 2 GLOBAL)
        "reduce_getattr_chain": b"\x80\x02" + eval_via_getattr + code + b"\x85R.",
        # the same names through STACK_GLOBAL (protocol 4)
        "stack_global_getattr": b"\x80\x04" + _str("builtins") + _str("getattr") + b"\x93" + _str("builtins") +
        _str("getattr") + b"\x93" + _str("__self__") + b"\x86R.",
        # INST (protocol 0): getattr(getattr, '__self__') as a class instantiation
        "inst_getattr": b"(" + getattr_g + b"S'__self__'\nibuiltins\ngetattr\n.",
        # OBJ (protocol 1)
        "obj_getattr": b"(" + getattr_g + getattr_g + b"S'__self__'\no.",
        # NEWOBJ of something that is a function or a value, not a record class
        "newobj_getattr": b"\x80\x02" + getattr_g + getattr_g + _str("__self__") + b"\x86\x81.",
        "newobj_storage": b"\x80\x02" + _global("torch", "FloatStorage") + b")\x81.",
        "newobj_ex_getattr": b"\x80\x04" + _global("builtins", "getattr") + _global("builtins", "getattr") +
        _str("__self__") + b"\x86}\x92.",
        # _rebuild_from_type_v2 calls its first argument: getattr through it
        "from_type_getattr": b"\x80\x02" + _global("torch._tensor", "_rebuild_from_type_v2") + b"(" + getattr_g +
        _global("torch", "Tensor") + getattr_g + _str("__self__") + b"\x86}tR.",
        # BUILD on a class: sets attributes of torch.Size in the loader
        "build_on_class": b"\x80\x02" + _global("torch", "Size") + b"}" + _str("__reduce__") + getattr_g + b"sb.",
        # BUILD with slot state (setattr) on an OrderedDict
        "build_ordered_dict_slots": b"\x80\x02" + _global("collections", "OrderedDict") + b")R" + b"N}" +
        _str("__class__") + getattr_g + b"s\x86b.",
        # SETITEMS on an object calls its __setitem__
        "setitems_on_object": b"\x80\x02" + _global("torch.distributed.checkpoint.metadata", "Metadata") + b")\x81" +
        _str("k") + getattr_g + b"s.",
        # _codecs.encode with a codec other than latin1
        "codecs_rot13": b"\x80\x02" + _global("_codecs", "encode") + _str("x") + _str("rot13") + b"\x86R.",
        # OrderedDict called with items (not what torch writes; a route to iterate an object)
        "ordered_dict_args": b"\x80\x02" + _global("collections", "OrderedDict") + b"]\x85R.",
        # a tensor rebuild whose storage is not a persistent id
        "rebuild_tensor_inline_storage": b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v2") + b"(" +
        getattr_g + b"K\x00))\x89" + _global("collections", "OrderedDict") + b")RtR.",
        # calling the result of a call
        "call_of_call": b"\x80\x02" + _global("torch", "Size") + b")\x85R)R.",
    }


def sample_pickles(marker):
    """Every attack as raw pickle bytes: the object attacks pickled at
    protocol 2 (as torch.save writes data.pkl) plus the opcode attacks."""
    out = {name: pickle.dumps({"x": make(marker)}, protocol=2) for name, make in OBJECT_ATTACKS.items()}
    out.update(opcode_attacks(marker))
    return out
