"""Values across the grader's trust boundary: a plain-data wire format (the codec, no state).

The course's grader never runs a test cell in the student's process. The student's kernel runs
the student's cells; each test cell runs in a separate, trusted process (``autograder.engine.harness``)
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

The kernel side of the channel (:mod:`autograder.engine.kernel.kernel_server`) runs inside the student's
kernel with a copy of this module; the harness sends it one JSON request per cell and reads the
answer from a display message of type :data:`WIRE_MIME`. The same codec on the trusted side
only decodes what comes back and encodes a test's arguments. Design notes: the "Trust
boundary" section of the course's design.

This module is the codec's face; its parts, in the order they are sent into the kernel ahead
of it: :mod:`autograder.engine.kernel.wire_format` (what may cross, the errors, :class:`Opaque`),
:mod:`autograder.engine.kernel.wire_encode` (values to nodes) and :mod:`autograder.engine.kernel.wire_decode` (nodes to
plain values).
"""
import json

if __package__:   # the trusted side; in the kernel the codec's parts share one namespace
    from .wire_decode import decode_node
    from .wire_encode import encode_value
    from .wire_format import Opaque, WireError, visible

__all__ = ["WIRE_MIME", "WireError", "Opaque", "encode", "decode", "encode_json",
           "decode_json", "visible", "MAX_BYTES"]

WIRE_MIME = "application/vnd.mlexp.grading+json"
MAX_BYTES = 256 * 2**20      # raw array bytes per crossing; more is refused, not truncated


def encode(value, *, grad_leaves=None, kernel=False, refs=None):
    """``value`` as JSON-compatible wire nodes; raises WireError for what cannot cross.

    ``grad_leaves`` (a list) collects tensors that require grad, each node numbered in order.
    ``kernel=True`` is the student's side, where modules never travel back; there ``refs`` (a
    list) receives each callable, which becomes a ``ref`` node, and any other object an
    ``opaque`` node naming its type.
    """
    return encode_value(value, [MAX_BYTES, MAX_BYTES], grad_leaves, 0, kernel, refs)


def encode_json(value, **kw) -> str:
    """:func:`encode`, then JSON text."""
    return json.dumps(encode(value, **kw), allow_nan=True)


def decode(node, *, ref_factory=None, leaves=None, modules=False):
    """Rebuild a value from wire nodes as plain Python types, tensors and arrays.

    ``ref_factory(id, type_name, name)`` turns a ``ref`` node into a callable (the harness's
    proxy); without it references are refused. ``leaves`` (a dict) receives the tensors marked
    as autograd leaves, by number, with ``requires_grad`` set. ``modules=True`` (the kernel side
    only) rebuilds ``torch.nn`` modules. Raises WireError for anything malformed or refused.
    """
    try:
        return decode_node(node, [MAX_BYTES, MAX_BYTES], 0, leaves, ref_factory, modules)
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
