"""Values across the grader's trust boundary: a plain-data wire format (the codec, no state).

The course's grader never runs a test cell in the student's process. The student's kernel runs
the student's cells; each test cell runs in a separate, trusted process (``autograder.harness``)
where every name the test uses but does not define is fetched from the kernel *as data*:

- ``None``, bools, ints, floats, complex numbers, strings and bytes (any of them: an int of
  thousands of digits, NaN and infinities, a string with a lone surrogate such as ``'x\\ud800'``
  cross exactly, as nodes of their own, since JSON and the kernel's messages carry none of them);
- tuples, lists, sets and dicts of those;
- ``torch.Tensor`` and ``numpy.ndarray`` (dtype, shape and raw bytes; never pickle);
- ``torch.dtype``.

:func:`encode` turns such a value into JSON-compatible nodes and :func:`decode` rebuilds it as
plain built-in types and plain tensors, so a value whose ``__eq__`` always answers True, a
subclass of ``float`` or a tensor subclass arrive as what they hold, not as what they claim.
A student *function* crosses as a reference: the harness calls it through the kernel, its
arguments and results crossing the same way (arguments may also be ``torch.nn`` modules, rebuilt
in the kernel from their parameters). Anything else arrives as an opaque marker that fails every
use with a clear TypeError. Nothing in this format can carry code or a class.

The kernel side of the channel (:mod:`autograder.kernel_server`) runs inside the student's
kernel with a copy of this module; the harness sends it one JSON request per cell and reads the
answer from a display message of type :data:`WIRE_MIME`. The same codec on the trusted side
only decodes what comes back and encodes a test's arguments. Design notes: the "Trust
boundary" section of the course's design.
"""
import base64
import json
import re
import sys

__all__ = ["WIRE_MIME", "WireError", "Opaque", "encode", "decode", "encode_json",
           "decode_json", "visible", "MAX_BYTES"]

WIRE_MIME = "application/vnd.mlexp.grading+json"
MAX_BYTES = 256 * 2**20      # raw array bytes per crossing; more is refused, not truncated
MAX_DEPTH = 64
_HEX = re.compile(r"-?[0-9a-f]+")
_SURROGATE = re.compile("[\ud800-\udfff]")
TENSOR_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                 "float32", "float64", "complex64", "complex128")
NUMPY_DTYPES = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
                "int64", "float16", "float32", "float64", "complex64", "complex128")
MODULE_PREFIXES = ("torch.nn.", "mlexp.")   # classes a module argument may be rebuilt from


class WireError(ValueError):
    """A value that cannot cross the boundary, or a node that is not valid wire data."""


class Opaque:
    """What the trusted side holds for a student object that is not plain data.

    Every comparison, conversion, iteration or arithmetic raises TypeError naming the type, so a
    test fails with a message the student understands instead of being fooled.
    """

    def __init__(self, type_name: str, where: str = "the value"):
        self._type, self._where = type_name, where

    def _refuse(self, *_args, **_kwargs):
        raise TypeError(f"{self._where} is a {self._type} object, which the grader cannot check: "
                        "use numbers, strings, tuples, lists, dicts or tensors")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __len__ = _refuse
    __iter__ = __getitem__ = __float__ = __int__ = __index__ = __complex__ = __call__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _refuse
    __rtruediv__ = __matmul__ = __rmatmul__ = __neg__ = __abs__ = __hash__ = _refuse
    __contains__ = __getattr__ = _refuse

    def __repr__(self):
        return f"<{self._type} object from the student's notebook>"


# ---------------------------------------------------------------------------------------------
# Encoding (either side)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _tensor_node(x, budget, grad_leaves):
    import torch
    t = torch.Tensor.detach(x)
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_sparse or t.layout != torch.strided:
        t = t.to_dense()
    dtype = str(t.dtype).replace("torch.", "")
    if dtype not in TENSOR_DTYPES:
        raise WireError(f"a tensor of dtype {dtype} cannot be graded")
    t = t.contiguous()
    raw = t.view(torch.int16) if dtype == "bfloat16" else t
    data = raw.numpy().tobytes() if t.numel() else b""
    budget[0] -= len(data)
    if budget[0] < 0:
        raise WireError(f"more than {MAX_BYTES} bytes of array data")
    node = {"t": "tensor", "dtype": dtype, "shape": list(t.shape), "data": _b64(data)}
    if grad_leaves is not None and x.requires_grad:
        node["leaf"] = len(grad_leaves)
        grad_leaves.append(x)
    return node


def _module_node(m, budget, grad_leaves, depth):
    cls = type(m)
    path = f"{cls.__module__}.{cls.__qualname__}"
    if not path.startswith(MODULE_PREFIXES):
        raise WireError(f"a {cls.__name__} module cannot be passed (only torch.nn and mlexp modules)")
    plain = {}
    for k, v in vars(m).items():
        if k.startswith("_") or k == "training":
            continue
        try:
            plain[k] = _encode(v, budget, None, depth + 1, kernel=False)
        except WireError:
            continue   # an attribute that is not data (a function, a hook) is rebuilt by __init__ only
    return {"t": "module", "cls": path, "training": bool(m.training), "attrs": plain,
            "params": {k: (None if p is None else _tensor_node(p, budget, grad_leaves))
                       for k, p in m._parameters.items()},
            "buffers": {k: (None if b is None else _tensor_node(b, budget, None))
                        for k, b in m._buffers.items()},
            "children": {k: (None if c is None else _module_node(c, budget, grad_leaves, depth + 1))
                         for k, c in m._modules.items()}}


def _charge(budget, n: int) -> None:
    budget[0] -= n
    if budget[0] < 0:
        raise WireError(f"more than {MAX_BYTES} bytes of data")


def _str(x: str, budget):
    """A string as itself, or, when it is not valid UTF-8 text (a lone surrogate, which no
    kernel message can carry), as a node of its UTF-8 bytes with the surrogates kept."""
    if x.isascii():
        return x
    try:
        x.encode("utf-8")
        return x
    except UnicodeEncodeError:
        data = x.encode("utf-8", "surrogatepass")
        _charge(budget, len(data))
        return {"t": "str", "v": _b64(data)}


def _int(x: int, budget):
    """An int as itself when JSON readers take it exactly (64 bits), else as hex digits (no
    limit on their number, unlike decimal: Python refuses more than 4,300 decimal digits)."""
    if -2**63 <= x < 2**64:
        return x
    digits = format(x, "x")
    _charge(budget, len(digits))
    return {"t": "int", "v": digits}


def _float(x: float):
    """A float as itself, or NaN and the infinities (not JSON) as a node naming them."""
    if x != x or x in (float("inf"), float("-inf")):
        return {"t": "float", "v": repr(x)}
    return x


def _encode(x, budget, grad_leaves, depth, kernel, refs=None):
    if depth > MAX_DEPTH:
        raise WireError(f"nested more than {MAX_DEPTH} levels deep")
    if x is None or type(x) is bool:
        return x
    if type(x) is str:
        return _str(x, budget)
    if type(x) is int:
        return _int(x, budget)
    if type(x) is float:
        return _float(x)
    # Subclasses of the built-in types cross as the value they hold (their own methods never run).
    if isinstance(x, int):
        return _int(int.__int__(x), budget)
    if isinstance(x, float):
        return _float(float.__float__(x))
    if isinstance(x, str):
        return _str(str.__str__(x), budget)
    if isinstance(x, complex):
        return {"t": "complex", "v": [_float(complex.real.__get__(x)),
                                      _float(complex.imag.__get__(x))]}
    if isinstance(x, (bytes, bytearray)):
        data = bytes(x)
        budget[0] -= len(data)
        if budget[0] < 0:
            raise WireError(f"more than {MAX_BYTES} bytes of data")
        return {"t": "bytes", "v": _b64(data)}
    if isinstance(x, (list, tuple, set, frozenset)):
        kind = "list" if isinstance(x, list) else "tuple" if isinstance(x, tuple) else "set"
        items = list(list.__iter__(x)) if isinstance(x, list) else \
            list(tuple.__iter__(x)) if isinstance(x, tuple) else list(x)
        return {"t": kind, "v": [_encode(i, budget, grad_leaves, depth + 1, kernel, refs) for i in items]}
    if isinstance(x, dict):
        return {"t": "dict", "v": [[_encode(k, budget, grad_leaves, depth + 1, kernel, refs),
                                    _encode(v, budget, grad_leaves, depth + 1, kernel, refs)]
                                   for k, v in dict.items(x)]}
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(x, torch.Tensor):
            return _tensor_node(x, budget, grad_leaves)
        if isinstance(x, torch.dtype):
            return {"t": "dtype", "v": str(x).replace("torch.", "")}
        if isinstance(x, torch.Size):
            return {"t": "tuple", "v": [int(i) for i in x]}
        if not kernel and isinstance(x, torch.nn.Module):
            return _module_node(x, budget, grad_leaves, depth)
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(x, np.ndarray):
            dtype = x.dtype.name
            if dtype not in NUMPY_DTYPES:
                raise WireError(f"a numpy array of dtype {dtype} cannot be graded")
            data = np.ascontiguousarray(x).tobytes()
            budget[0] -= len(data)
            if budget[0] < 0:
                raise WireError(f"more than {MAX_BYTES} bytes of array data")
            return {"t": "ndarray", "dtype": dtype, "shape": list(x.shape), "data": _b64(data)}
        if isinstance(x, np.generic) and x.dtype.name in NUMPY_DTYPES:
            return _encode(x.item(), budget, grad_leaves, depth + 1, kernel, refs)
    if isinstance(x, range):
        return {"t": "range", "v": [x.start, x.stop, x.step]}
    if refs is not None and callable(x):
        refs.append(x)
        return {"t": "ref", "id": len(refs) - 1, "type": visible(type(x).__name__),
                "name": visible(str(getattr(x, "__name__", ""))[:100])}
    if refs is not None:
        return {"t": "opaque", "type": visible(type(x).__name__[:100])}
    raise WireError(f"a {type(x).__name__} cannot be passed across the grader's boundary")


def encode(value, *, grad_leaves=None, kernel=False, refs=None):
    """``value`` as JSON-compatible wire nodes; raises WireError for what cannot cross.

    ``grad_leaves`` (a list) collects tensors that require grad, each node numbered in order.
    ``kernel=True`` is the student's side, where modules never travel back; there ``refs`` (a
    list) receives each callable, which becomes a ``ref`` node, and any other object an
    ``opaque`` node naming its type.
    """
    return _encode(value, [MAX_BYTES], grad_leaves, 0, kernel, refs)


def encode_json(value, **kw) -> str:
    """:func:`encode`, then JSON text."""
    return json.dumps(encode(value, **kw), allow_nan=True)


# ---------------------------------------------------------------------------------------------
# Decoding (trusted side: plain types only)


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
    budget[0] -= len(raw)
    if budget[0] < 0:
        raise WireError(f"more than {MAX_BYTES} bytes of array data")
    return raw


def _decode(node, budget, depth, leaves, ref_factory, modules):
    if depth > MAX_DEPTH:
        raise WireError("nested too deep")
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is not dict or "t" not in node:
        raise WireError(f"not a wire node: {type(node).__name__}")
    kind = node["t"]
    rec = lambda n: _decode(n, budget, depth + 1, leaves, ref_factory, modules)  # noqa: E731
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
        _charge(budget, len(digits))
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


def decode(node, *, ref_factory=None, leaves=None, modules=False):
    """Rebuild a value from wire nodes as plain Python types, tensors and arrays.

    ``ref_factory(id, type_name, name)`` turns a ``ref`` node into a callable (the harness's
    proxy); without it references are refused. ``leaves`` (a dict) receives the tensors marked
    as autograd leaves, by number, with ``requires_grad`` set. ``modules=True`` (the kernel side
    only) rebuilds ``torch.nn`` modules. Raises WireError for anything malformed or refused.
    """
    try:
        return _decode(node, [MAX_BYTES], 0, leaves, ref_factory, modules)
    except WireError:
        raise
    except (ValueError, TypeError, RecursionError, OverflowError) as exc:
        raise WireError(f"malformed wire data ({type(exc).__name__}: {str(exc)[:100]})") from None


def decode_json(text: str, **kw):
    """JSON text (at most a few hundred MiB) to a value, as :func:`decode`."""
    try:
        node = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON ({str(exc)[:100]})") from None
    return decode(node, **kw)


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
        setattr(m, k, _decode(v, budget, depth + 1, None, None, False))
    for k, p in (node.get("params") or {}).items():
        t = None if p is None else _decode(p, budget, depth + 1, leaves, None, False)
        m.register_parameter(k, None if t is None else torch.nn.Parameter(t, requires_grad="leaf" in p))
        if t is not None and "leaf" in p and leaves is not None:
            leaves[p["leaf"]] = m._parameters[k]
    for k, b in (node.get("buffers") or {}).items():
        m.register_buffer(k, None if b is None else _decode(b, budget, depth + 1, None, None, False))
    for k, c in (node.get("children") or {}).items():
        m.add_module(k, None if c is None else _rebuild_module(c, budget, depth + 1, leaves))
    m.train(bool(node.get("training", True)))
    return m


def visible(value):
    """``value`` (text, or lists and dicts of it) with each lone surrogate written out as the
    text ``\\udXXX``: what a message, a notebook or a report can hold, and a reader can see."""
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", value)
    if isinstance(value, list):
        return [visible(v) for v in value]
    if isinstance(value, dict):
        return {visible(k): visible(v) for k, v in value.items()}
    return value
