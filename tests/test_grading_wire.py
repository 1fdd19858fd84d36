"""autograder.engine.kernel.wire's wire format: what crosses from a student's kernel is plain data, never code."""
import json
import math

import numpy as np
import pytest
import torch

from autograder.engine.kernel.wire import Opaque, WireError, decode, decode_json, encode, encode_json


def roundtrip(value, **kw):
    return decode_json(encode_json(value, **kw))


@pytest.mark.parametrize("value", [
    None, True, 0, -7, 2**80, 1.5, float("inf"), "π text", b"\x00\xff", 3 + 4j,
    (1, (2.0, "x")), [1, [None]], {"a": 1, 2: (3,)}, {1, 2}, range(2, 9, 3),
])
def test_plain_values_come_back_equal_and_plain(value):
    got = roundtrip(value)
    assert got == value and type(got) is type(value)


def test_nan_crosses():
    assert math.isnan(roundtrip(float("nan")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.bool, torch.complex64])
def test_tensors_keep_dtype_shape_and_values(dtype):
    t = (torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) - 5).to(dtype)
    got = roundtrip(t.transpose(0, 2))          # non-contiguous in
    assert type(got) is torch.Tensor and got.dtype == dtype and got.shape == (4, 3, 2)
    assert torch.equal(got, t.transpose(0, 2))
    assert roundtrip(torch.empty(0, 3, dtype=dtype)).shape == (0, 3)


def test_numpy_arrays_and_scalars():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    got = roundtrip(a)
    assert isinstance(got, np.ndarray) and got.dtype == np.int32 and (got == a).all()
    assert roundtrip(np.float64(2.5)) == 2.5 and type(roundtrip(np.float64(2.5))) is float


def test_subclasses_arrive_as_what_they_hold():
    class Liar(float):
        def __eq__(self, other):
            return True
        __hash__ = float.__hash__

    class LyingTuple(tuple):
        def __eq__(self, other):
            return True
        __hash__ = tuple.__hash__

    class SneakyTensor(torch.Tensor):
        pass

    assert type(roundtrip(Liar(2.0))) is float and roundtrip(Liar(2.0)) != 3.0
    got = roundtrip(LyingTuple((1, 2)))
    assert type(got) is tuple and got != (5, 6)
    t = roundtrip(torch.ones(2).as_subclass(SneakyTensor))
    assert type(t) is torch.Tensor


def test_kernel_side_objects_become_opaque_or_references():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    refs = []
    node = encode({"obj": AlwaysEqual(), "fn": len}, kernel=True, refs=refs)
    assert refs == [len]
    got = decode(node, ref_factory=lambda i, t, n: ("ref", i, n))
    assert got["fn"] == ("ref", 0, "len")
    opaque = got["obj"]
    assert isinstance(opaque, Opaque)
    for use in (lambda o: o == 1, lambda o: o != 1, lambda o: float(o), lambda o: list(o),
                lambda o: bool(o), lambda o: o + 1, lambda o: o[0], lambda o: len(o)):
        with pytest.raises(TypeError, match="AlwaysEqual object"):
            use(opaque)
    with pytest.raises(WireError, match="refused"):   # references need a factory
        decode(node)


@pytest.mark.parametrize("node, needle", [
    ({"t": "tensor", "dtype": "object", "shape": [1], "data": ""}, "not allowed"),
    ({"t": "tensor", "dtype": "float32", "shape": [4], "data": "AAAA"}, "does not match"),
    ({"t": "tensor", "dtype": "float32", "shape": [-1], "data": ""}, "shape"),
    ({"t": "ndarray", "dtype": "O", "shape": [1], "data": ""}, "not allowed"),
    ({"t": "module", "cls": "torch.nn.Linear"}, "refused"),
    ({"t": "pickle", "v": "gASV"}, "refused"),
    ({"no": "tag"}, "not a wire node"),
    ({"t": "dict", "v": [[{"t": "list", "v": []}, 1]]}, "bad dict key"),
    ({"t": "bytes", "v": "!!!"}, "malformed"),
])
def test_malformed_or_refused_nodes_raise(node, needle):
    with pytest.raises(WireError, match=needle):
        decode(node)


def test_deep_nesting_is_refused_not_a_crash():
    node = 1
    for _ in range(200):
        node = {"t": "list", "v": [node]}
    with pytest.raises(WireError):
        decode(node)
    with pytest.raises(WireError):
        decode_json("[" * 100000 + "]" * 100000)


def test_modules_travel_to_the_kernel_with_their_parameters_and_gradients():
    torch.manual_seed(0)
    lin, norm = torch.nn.Linear(3, 2), torch.nn.LayerNorm(3)
    x = torch.randn(4, 3, requires_grad=True)
    leaves = []
    node = json.loads(json.dumps(encode((x, norm, lin), grad_leaves=leaves)))
    assert len(leaves) == 1 + 2 + 2            # x, LayerNorm weight and bias, Linear weight and bias
    kernel_leaves = {}
    kx, knorm, klin = decode(node, leaves=kernel_leaves, modules=True)
    assert isinstance(knorm, torch.nn.LayerNorm) and isinstance(klin, torch.nn.Linear)
    assert torch.equal(klin(knorm(kx)), lin(norm(x)))
    klin(knorm(kx)).sum().backward()
    lin(norm(x)).sum().backward()
    for mine, theirs in zip(leaves, [kernel_leaves[i] for i in sorted(kernel_leaves)]):
        assert torch.allclose(mine.grad, theirs.grad)


def test_modules_of_other_packages_are_refused():
    class Mine(torch.nn.Module):
        pass
    with pytest.raises(WireError, match="only torch.nn and mlexp"):
        encode(Mine())
    bad = {"t": "module", "cls": "os.path.join", "params": {}}
    with pytest.raises(WireError):
        decode(bad, modules=True)


def test_too_much_data_is_refused(monkeypatch):
    import autograder.engine.kernel.wire as g
    monkeypatch.setattr(g, "MAX_BYTES", 1000)
    with pytest.raises(WireError, match="more than 1000 bytes"):
        encode(torch.zeros(1000))
    import base64
    node = {"t": "tensor", "dtype": "float64", "shape": [200],
            "data": base64.b64encode(bytes(1600)).decode()}
    with pytest.raises(WireError):
        decode(node)
