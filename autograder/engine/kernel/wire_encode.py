"""Encoding (either side): a value as JSON-compatible wire nodes (autograder.engine.kernel.wire).

Built-in values cross as what they hold (a subclass's own methods never run), tensors and numpy
arrays as dtype, shape and raw bytes, ``torch.nn`` modules (trusted side only) as class path,
plain attributes, parameters and buffers; in the kernel a callable becomes a reference and any
other object an opaque marker. Every byte is charged to the crossing's budget.
"""
import base64
import sys

if __package__:   # the trusted side; in the kernel the codec's parts share one namespace
    from .wire_format import MAX_DEPTH, MODULE_PREFIXES, NUMPY_DTYPES, TENSOR_DTYPES, WireError, \
        charge, visible

__all__ = ["encode_value"]


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
    charge(budget, len(data), "array data")
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
            plain[k] = encode_value(v, budget, None, depth + 1, kernel=False)
        except WireError:
            continue   # an attribute that is not data (a function, a hook) is rebuilt by __init__ only
    return {"t": "module", "cls": path, "training": bool(m.training), "attrs": plain,
            "params": {k: (None if p is None else _tensor_node(p, budget, grad_leaves))
                       for k, p in m._parameters.items()},
            "buffers": {k: (None if b is None else _tensor_node(b, budget, None))
                        for k, b in m._buffers.items()},
            "children": {k: (None if c is None else _module_node(c, budget, grad_leaves, depth + 1))
                         for k, c in m._modules.items()}}


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
        charge(budget, len(data))
        return {"t": "str", "v": _b64(data)}


def _int(x: int, budget):
    """An int as itself when JSON readers take it exactly (64 bits), else as hex digits (no
    limit on their number, unlike decimal: Python refuses more than 4,300 decimal digits)."""
    if -2**63 <= x < 2**64:
        return x
    digits = format(x, "x")
    charge(budget, len(digits))
    return {"t": "int", "v": digits}


def _float(x: float):
    """A float as itself, or NaN and the infinities (not JSON) as a node naming them."""
    if x != x or x in (float("inf"), float("-inf")):
        return {"t": "float", "v": repr(x)}
    return x


def encode_value(x, budget, grad_leaves, depth, kernel, refs=None):
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
        charge(budget, len(data))
        return {"t": "bytes", "v": _b64(data)}
    if isinstance(x, (list, tuple, set, frozenset)):
        kind = "list" if isinstance(x, list) else "tuple" if isinstance(x, tuple) else "set"
        items = list(list.__iter__(x)) if isinstance(x, list) else \
            list(tuple.__iter__(x)) if isinstance(x, tuple) else list(x)
        return {"t": kind, "v": [encode_value(i, budget, grad_leaves, depth + 1, kernel, refs) for i in items]}
    if isinstance(x, dict):
        return {"t": "dict", "v": [[encode_value(k, budget, grad_leaves, depth + 1, kernel, refs),
                                    encode_value(v, budget, grad_leaves, depth + 1, kernel, refs)]
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
            charge(budget, len(data), "array data")
            return {"t": "ndarray", "dtype": dtype, "shape": list(x.shape), "data": _b64(data)}
        if isinstance(x, np.generic) and x.dtype.name in NUMPY_DTYPES:
            return encode_value(x.item(), budget, grad_leaves, depth + 1, kernel, refs)
    if isinstance(x, range):
        return {"t": "range", "v": [x.start, x.stop, x.step]}
    if refs is not None and callable(x):
        refs.append(x)
        return {"t": "ref", "id": len(refs) - 1, "type": visible(type(x).__name__),
                "name": visible(str(getattr(x, "__name__", ""))[:100])}
    if refs is not None:
        return {"t": "opaque", "type": visible(type(x).__name__[:100])}
    raise WireError(f"a {type(x).__name__} cannot be passed across the grader's boundary")
