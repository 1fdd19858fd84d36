"""The wire format's vocabulary, shared by both directions of the codec (autograder.engine.kernel.wire).

What may cross and how much: the array dtypes, the nesting limit, the classes a module argument
may be rebuilt from, the byte budget of one crossing, the error for what cannot cross, the
marker the trusted side holds for a student object that is not data (:class:`Opaque`), and
:func:`visible`, which makes text with lone surrogates printable.
"""
import re

__all__ = ["WireError", "Opaque", "visible", "charge", "TENSOR_DTYPES", "NUMPY_DTYPES",
           "MODULE_PREFIXES", "MAX_DEPTH"]

MAX_DEPTH = 64
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


def charge(budget, n: int, what: str = "data") -> None:
    """Take ``n`` bytes from one crossing's ``budget`` ([bytes left, the limit]: wire.encode and
    wire.decode make one per call); WireError once it is spent."""
    budget[0] -= n
    if budget[0] < 0:
        raise WireError(f"more than {budget[1]} bytes of {what}")


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
