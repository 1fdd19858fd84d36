"""Decoding: wire nodes rebuilt as plain values (autograder.engine.kernel.wire).

Only built-in types, plain tensors and arrays come out, each node checked (kind, dtype, shape,
byte count, depth) and charged to the crossing's budget; a reference becomes what the caller's
``ref_factory`` makes of it, and ``torch.nn`` modules are rebuilt only where asked (the kernel
side, for a test's arguments).
"""
import base64
import re

if __package__:   # the trusted side; in the kernel the codec's parts share one namespace
    from .wire_format import MAX_DEPTH, MODULE_PREFIXES, NUMPY_DTYPES, TENSOR_DTYPES, WireError, \
        Opaque, charge

__all__ = ["decode_node"]

_HEX = re.compile(r"-?[0-9a-f]+")


def _array(node, budget, allowed, itemsize):
    """(dtype, shape, raw bytes) of an array node, checked: allowed dtype, shape, byte count."""
    dtype, shape, data = node.get("dtype"), node.get("shape"), node.get("data")
    if dtype not in allowed:
        raise WireError(f"array dtype {dtype!r} is not allowed")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise WireError("bad array shape")
    if not isinstance(data, str):
        raise WireError("bad array data")
    raw = _raw(data, budget)
    count = 1
    for n in shape:
        count *= n
    if len(raw) != count * itemsize(dtype):
        raise WireError("array data does not match its shape")
    return dtype, shape, raw


def _raw(data: str, budget) -> bytes:
    raw = base64.b64decode(data.encode("ascii"), validate=True)
    charge(budget, len(raw), "array data")
    return raw


def decode_node(node, budget, depth, leaves, ref_factory, modules):
    if depth > MAX_DEPTH:
        raise WireError("nested too deep")
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is not dict or "t" not in node:
        raise WireError(f"not a wire node: {type(node).__name__}")
    kind = node["t"]
    rec = lambda n: decode_node(n, budget, depth + 1, leaves, ref_factory, modules)  # noqa: E731
    if kind in ("list", "tuple", "set"):
        items = node.get("v")
        if not isinstance(items, list):
            raise WireError(f"bad {kind}")
        values = [rec(i) for i in items]
        return values if kind == "list" else tuple(values) if kind == "tuple" else set(values)
    if kind == "dict":
        pairs = node.get("v")
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise WireError("bad dict")
        try:
            return {rec(k): rec(v) for k, v in pairs}
        except TypeError as exc:   # an unhashable key
            raise WireError(f"bad dict key: {exc}") from None
    if kind == "complex":
        re_im = node.get("v")
        if not (isinstance(re_im, list) and len(re_im) == 2):
            raise WireError("bad complex")
        re_im = [rec(x) if type(x) is dict and x.get("t") == "float" else x for x in re_im]
        if not all(type(x) in (int, float) for x in re_im):
            raise WireError("bad complex")
        return complex(*re_im)
    if kind == "float":
        if node.get("v") not in ("nan", "inf", "-inf"):
            raise WireError("bad float")
        return float(node["v"])
    if kind == "int":
        digits = node.get("v")
        if not (isinstance(digits, str) and _HEX.fullmatch(digits)):
            raise WireError("bad int")
        charge(budget, len(digits))
        return int(digits, 16)
    if kind == "str":
        if not isinstance(node.get("v"), str):
            raise WireError("bad str")
        return _raw(node["v"], budget).decode("utf-8", "surrogatepass")
    if kind == "bytes":
        if not isinstance(node.get("v"), str):
            raise WireError("bad bytes")
        return _raw(node["v"], budget)
    if kind == "range":
        args = node.get("v")
        if not (isinstance(args, list) and len(args) == 3 and all(type(a) is int for a in args)):
            raise WireError("bad range")
        return range(*args)
    if kind == "tensor":
        import torch
        dtype, shape, raw = _array(node, budget, TENSOR_DTYPES,
                                   lambda d: torch.empty((), dtype=getattr(torch, d)).element_size())
        if not raw:
            t = torch.empty(shape, dtype=getattr(torch, dtype))
        elif dtype == "bfloat16":
            t = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16).reshape(shape)
        else:
            t = torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape)
        if leaves is not None and "leaf" in node:
            t.requires_grad_(True)
            leaves[node["leaf"]] = t
        return t
    if kind == "ndarray":
        import numpy as np
        dtype, shape, raw = _array(node, budget, NUMPY_DTYPES, lambda d: np.dtype(d).itemsize)
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    if kind == "dtype":
        import torch
        if node.get("v") not in TENSOR_DTYPES:
            raise WireError("dtype not allowed")
        return getattr(torch, node["v"])
    if kind == "ref" and ref_factory is not None:
        if type(node.get("id")) is not int:
            raise WireError("bad reference")
        return ref_factory(node["id"], str(node.get("type", ""))[:100], str(node.get("name", ""))[:100])
    if kind == "opaque":
        return Opaque(str(node.get("type", "object"))[:100])
    if kind == "module" and modules:
        return _rebuild_module(node, budget, depth, leaves)
    raise WireError(f"unknown or refused wire node {kind!r}")


def _rebuild_module(node, budget, depth, leaves):
    """A torch.nn / mlexp module from its class path, plain attributes, parameters and buffers."""
    import importlib

    import torch
    path = node.get("cls", "")
    if not isinstance(path, str) or not path.startswith(MODULE_PREFIXES):
        raise WireError("module class not allowed")
    modname, _, qual = path.rpartition(".")
    cls = getattr(importlib.import_module(modname), qual)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise WireError("not a module class")
    m = cls.__new__(cls)
    torch.nn.Module.__init__(m)
    for k, v in (node.get("attrs") or {}).items():
        setattr(m, k, decode_node(v, budget, depth + 1, None, None, False))
    for k, p in (node.get("params") or {}).items():
        t = None if p is None else decode_node(p, budget, depth + 1, leaves, None, False)
        m.register_parameter(k, None if t is None else torch.nn.Parameter(t, requires_grad="leaf" in p))
        if t is not None and "leaf" in p and leaves is not None:
            leaves[p["leaf"]] = m._parameters[k]
    for k, b in (node.get("buffers") or {}).items():
        m.register_buffer(k, None if b is None else decode_node(b, budget, depth + 1, None, None, False))
    for k, c in (node.get("children") or {}).items():
        m.add_module(k, None if c is None else _rebuild_module(c, budget, depth + 1, leaves))
    m.train(bool(node.get("training", True)))
    return m
