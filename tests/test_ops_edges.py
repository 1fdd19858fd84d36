"""mlexp.ops at the edges: hard resets in the gate, empty inputs, the dtype rule, non-finite inputs."""
import doctest
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import mlexp.ops
from mlexp import mixers
from mlexp.ops import _common, delta, gated, linear
from mlexp.ops import delta_rule, gated_delta_rule, gated_linear_attention, linear_attention

RESETS = [float("-inf"), -1e9, -1e30]
LN2 = math.log(2.0)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _family(B, H, T, Dk, Dv, seed=0, dtype=torch.float64):
    """q, k (unit keys, so the delta rule accepts them), v, beta in (0, 1), ordinary gates g (B, H, T, Dk)."""
    gen = _gen(seed)
    q = torch.randn(B, H, T, Dk, generator=gen, dtype=dtype)
    k = F.normalize(torch.randn(B, H, T, Dk, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(B, H, T, Dv, generator=gen, dtype=dtype)
    beta = torch.rand(B, H, T, generator=gen, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, H, T, Dk, generator=gen, dtype=dtype) + 2)
    return q, k, v, beta, g


# Every op as op(impl, q, k, v, beta, g, **kw); g is (B, H, T, Dk) and the scalar ops take its first channel.
OPS = {
    "linear": lambda impl, q, k, v, beta, g, **kw: linear_attention(q, k, v, impl=impl, **kw),
    "gated_scalar": lambda impl, q, k, v, beta, g, **kw: gated_linear_attention(q, k, v, g[..., 0], impl=impl, **kw),
    "gated_channel": lambda impl, q, k, v, beta, g, **kw: gated_linear_attention(q, k, v, g, impl=impl, **kw),
    "delta": lambda impl, q, k, v, beta, g, **kw: delta_rule(q, k, v, beta, impl=impl, **kw),
    "gated_delta": lambda impl, q, k, v, beta, g, **kw: gated_delta_rule(q, k, v, beta, g[..., 0], impl=impl, **kw),
}
PATHS = {name: (("parallel", "chunk") if name.startswith(("linear", "gated_s", "gated_c")) else ("chunk",))
         for name in OPS}
GATED = ("gated_scalar", "gated_channel", "gated_delta")


# ----------------------------------------------------------------------------- hard resets


@pytest.mark.parametrize("R", RESETS, ids=["-inf", "-1e9", "-1e30"])
@pytest.mark.parametrize("C", [1, 2, 3, 64], ids=lambda c: f"C{c}")
def test_reset_example_from_the_issue(R, C):
    """q = k = v = 1, g = [0, R, -ln 2, -ln 2]: the state forgets everything at token 1, then halves twice."""
    q = k = v = torch.ones(1, 1, 4, 1)
    g = torch.tensor([0.0, R, -LN2, -LN2]).view(1, 1, 4)
    beta = torch.full((1, 1, 4), 0.5)
    expect_gla = torch.tensor([1.0, 1.0, 1.5, 1.75])            # S: 1, 1 (reset, then +1), 1/2 + 1, 3/4 + 1
    expect_gdr = torch.tensor([0.5, 0.5, 0.625, 0.65625])       # S <- alpha S + 0.5 (1 - alpha S)
    for impl in ("recurrent", "parallel", "chunk"):
        for gate in (g, g[..., None]):                          # one decay per head, and per channel
            o, S = gated_linear_attention(q, k, v, gate, impl=impl, chunk_size=C)
            torch.testing.assert_close(o.flatten(), expect_gla, msg=f"{impl} gate {tuple(gate.shape)}")
            torch.testing.assert_close(S.flatten(), expect_gla[-1:])
    for impl in ("recurrent", "chunk"):
        o, S = gated_delta_rule(q, k, v, beta, g, impl=impl, chunk_size=C)
        torch.testing.assert_close(o.flatten(), expect_gdr, msg=impl)


def test_decay_sums_keep_small_gates_after_a_reset():
    """A difference of running sums loses -0.25 after -1e9 in float32 and gives nan after -inf."""
    for R in RESETS:
        g = torch.tensor([0.0, R, -0.5, -0.25]).view(4, 1)
        D = _common.decay_pairs(g)[..., 0]
        assert D[3, 2] == -0.25 and D[2, 1] == -0.5 and D[3, 1] == -0.75 and D[2, 2] == 0
        assert D[2, 0] <= -1e9 and D[0, 1] == float("-inf") and not D.isnan().any()
        after = _common.decay_after(g)[:, 0]
        assert after[1:].tolist() == [-0.75, -0.25, 0.0] and after[0] <= -1e9
        b = g.cumsum(0)
        assert (b[3] - b[2]).item() != -0.25                   # what the old form computed


def _with_resets(g, where, value, channels=None):
    """Put the hard reset ``value`` into g (B, H, T, Dk) at the token indices ``where`` (some channels only)."""
    g = g.clone()
    chans = slice(None) if channels is None else channels
    for t in where:
        g[:, :, t, chans] = value
    return g


# (T, C, reset tokens): at token 0, at a chunk boundary (C - 1, C), inside a chunk, at the last token,
# two resets in one chunk, and a strong finite gate (-30, -100) that is not a reset.
RESET_CASES = [(37, 8, (0,)), (37, 8, (7,)), (37, 8, (8,)), (37, 8, (13,)), (37, 8, (36,)),
               (37, 8, (3, 5, 21)), (40, 16, (0, 15, 16, 39)), (20, 64, (4, 11))]


@pytest.mark.parametrize("value", RESETS + [-30.0, -100.0], ids=["-inf", "-1e9", "-1e30", "-30", "-100"])
@pytest.mark.parametrize("case", RESET_CASES, ids=lambda c: f"T{c[0]}C{c[1]}at{'-'.join(map(str, c[2]))}")
@pytest.mark.parametrize("name", GATED)
def test_resets_match_the_loop_in_float32(name, case, value):
    T, C, where = case
    q, k, v, beta, g = (x.float() for x in _family(2, 2, T, 4, 3, seed=len(where) + T))
    g = _with_resets(g, where, value)
    S0 = torch.randn(2, 2, 4, 3, generator=_gen(9))
    ref_o, ref_S = OPS[name]("recurrent", *(x.double() for x in (q, k, v, beta, g)), initial_state=S0.double())
    for impl in PATHS[name]:
        o, S = OPS[name](impl, q, k, v, beta, g, initial_state=S0, chunk_size=C)
        torch.testing.assert_close(o, ref_o.float(), rtol=2e-5, atol=2e-5, msg=f"{impl} output")
        torch.testing.assert_close(S, ref_S.float(), rtol=2e-5, atol=2e-5, msg=f"{impl} state")


@pytest.mark.parametrize("value", RESETS, ids=["-inf", "-1e9", "-1e30"])
@pytest.mark.parametrize("impl", ["parallel", "chunk"])
def test_per_channel_resets_of_some_channels_only(impl, value):
    """Channels 0 and 2 forget at tokens 5 and 9 (inside and at the edge of a chunk of 5); 1 and 3 keep decaying."""
    q, k, v, _, g = (x.float() for x in _family(1, 2, 23, 4, 3, seed=4))
    g = _with_resets(g, (5, 9), value, channels=[0, 2])
    ref_o, ref_S = gated_linear_attention(q.double(), k.double(), v.double(), g.double(), impl="recurrent")
    o, S = gated_linear_attention(q, k, v, g, impl=impl, chunk_size=5)
    torch.testing.assert_close(o, ref_o.float(), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(S, ref_S.float(), rtol=2e-5, atol=2e-5)
    assert S[..., 1, :].abs().min() > 0 and not S.isnan().any()


@pytest.mark.parametrize("impl", ["parallel", "chunk"])
def test_per_channel_reset_gradients_of_some_channels_only(impl):
    """Backward through resets of channels 0 and 2 only (tokens 3 and 8, chunks of 4), float64."""
    q, k, v, _, g = _family(1, 2, 11, 4, 3, seed=8)
    g = _with_resets(g, (3, 8), float("-inf"), channels=[0, 2])
    w = torch.randn(1, 2, 11, 3, generator=_gen(3), dtype=torch.float64)

    def grads(impl):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, g)]
        o, S = gated_linear_attention(*leaves, impl=impl, chunk_size=4)
        ((o * w).sum() + S.sum()).backward()
        return [x.grad for x in leaves]

    for i, (a, b) in enumerate(zip(grads(impl), grads("recurrent"), strict=True)):
        assert not a.isnan().any(), f"grad {i} has nan"
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8, msg=f"grad {i}")


@pytest.mark.parametrize("value", [float("-inf"), -1e9], ids=["-inf", "-1e9"])
@pytest.mark.parametrize("name", GATED)
def test_reset_gradients_match_the_loop(name, value):
    """Backward through the resets (chunk boundary and inside a chunk), float64, every input and S0."""
    q, k, v, beta, g = _family(1, 2, 13, 3, 2, seed=2)
    g = _with_resets(g, (0, 4, 6), value)
    S0 = torch.randn(1, 2, 3, 2, generator=_gen(5), dtype=torch.float64)
    w = torch.randn(1, 2, 13, 2, generator=_gen(6), dtype=torch.float64)

    def grads(impl):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, beta, g, S0)]
        o, S = OPS[name](impl, *leaves[:5], initial_state=leaves[5], chunk_size=4)
        ((o * w).sum() + S.sum()).backward()
        return [x.grad for x in leaves if x.grad is not None]  # beta has none in gated linear attention

    ref = grads("recurrent")
    for impl in PATHS[name]:
        for i, (a, b) in enumerate(zip(grads(impl), ref, strict=True)):
            assert not a.isnan().any(), f"{impl} grad {i} has nan"
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8, msg=f"{impl} grad {i}")


# ----------------------------------------------------------------------------- empty inputs


@pytest.mark.parametrize("empty", ["B", "H", "T"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("name", OPS)
def test_empty_in_empty_out(name, empty, with_state, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")                 # impl="triton" is accepted on CPU ...
    sizes = dict(B=2, H=3, T=5)
    sizes[empty] = 0
    B, H, T = sizes["B"], sizes["H"], sizes["T"]
    q, k, v, beta, g = _family(B, H, T, 4, 3, dtype=torch.float32)
    S0 = torch.randn(B, H, 4, 3) if with_state else None
    impls = ("recurrent",) + PATHS[name] + (("triton",) if _common.triton_available() else ())
    for impl in impls:                                          # ... and never reached: handled before dispatch
        o, S = OPS[name](impl, q, k, v, beta, g, initial_state=S0)
        assert o.shape == (B, H, T, 3) and o.dtype == torch.float32, impl
        assert S.shape == (B, H, 4, 3) and S.dtype == torch.float32, impl
        torch.testing.assert_close(S, S0 if with_state else torch.zeros(B, H, 4, 3))


def test_empty_normalised_linear_attention_passes_s_and_z_through():
    q, k, v, _, _ = _family(2, 2, 0, 4, 3)
    S0, z0 = torch.rand(2, 2, 4, 3, dtype=torch.float64), torch.rand(2, 2, 4, dtype=torch.float64)
    for impl in ("recurrent", "parallel", "chunk"):
        o, (S, z) = linear_attention(q, k, v, normalize=True, initial_state=(S0, z0), impl=impl)
        assert o.shape == (2, 2, 0, 3)
        assert torch.equal(S, S0) and torch.equal(z, z0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", OPS)
def test_empty_input_returns_a_new_state(name, dtype, monkeypatch):
    """At T = 0 the final state is a copy: writing into it leaves the caller's initial_state alone."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v, beta, g = _family(2, 3, 0, 4, 3, dtype=dtype)
    impls = ("recurrent",) + PATHS[name] + (("triton",) if _common.triton_available() and dtype != torch.float64 else ())
    for impl in impls:
        S0 = torch.randn(2, 3, 4, 3, dtype=dtype)
        before = S0.clone()
        _, S = OPS[name](impl, q, k, v, beta, g, initial_state=S0)
        assert S is not S0 and S.data_ptr() != S0.data_ptr(), impl
        S.add_(1.0)
        assert torch.equal(S0, before), f"{name} {impl}: writing into the returned state changed initial_state"


def test_empty_normalised_linear_attention_returns_new_s_and_z():
    q, k, v, _, _ = _family(2, 2, 0, 4, 3, dtype=torch.float32)
    for impl in ("recurrent", "parallel", "chunk"):
        S0, z0 = torch.rand(2, 2, 4, 3), torch.rand(2, 2, 4)
        before = S0.clone(), z0.clone()
        _, (S, z) = linear_attention(q, k, v, normalize=True, initial_state=(S0, z0), impl=impl)
        assert S is not S0 and z is not z0, impl
        S.zero_(), z.zero_()
        assert torch.equal(S0, before[0]) and torch.equal(z0, before[1]), impl


MIXERS = {
    "LinearAttention": lambda: mixers.LinearAttention(8, 2),
    "DecayFixed": lambda: mixers.DecayLinearAttention(8, 2, decay="fixed"),
    "DecayData": lambda: mixers.DecayLinearAttention(8, 2, decay="data"),
    "DeltaNet": lambda: mixers.DeltaNet(8, 2),
    "GatedDeltaNet": lambda: mixers.GatedDeltaNet(8, 2),
    "SoftmaxAttention": lambda: mixers.SoftmaxAttention(8, 2),
    "CausalConv": lambda: mixers.CausalConv(8, 3),
    "LSTMMixer": lambda: mixers.LSTMMixer(8),
}


@pytest.mark.parametrize("shape", [(0, 5, 8), (3, 0, 8)], ids=["B0", "T0"])
@pytest.mark.parametrize("make", MIXERS.values(), ids=MIXERS.keys())
def test_mixers_empty_in_empty_out(make, shape):
    torch.manual_seed(0)
    m = make()
    x = torch.randn(*shape, requires_grad=True)
    y = m(x)
    assert y.shape == shape and y.dtype == x.dtype
    y.sum().backward()                                          # and the backward runs
    assert x.grad.shape == shape


# ----------------------------------------------------------------------------- autocast


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32_in", "bf16_in"])
@pytest.mark.parametrize("name", OPS)
def test_every_op_runs_under_cpu_autocast(name, dtype):
    """Under torch.autocast("cpu", bfloat16) every CPU path (and the default) runs forward and
    backward, gives the input dtype, and matches the float32 result to bf16 accuracy."""
    q, k, v, beta, g = _family(2, 2, 21, 8, 4, seed=3, dtype=torch.float32)   # ragged last chunk of 8
    inputs = [x.to(dtype) for x in (q, k, v, beta, g)]
    S0 = torch.randn(2, 2, 8, 4, generator=_gen(4))
    kw = dict(normalize_qk=True) if "delta" in name else {}   # bf16-rounded keys are unit only to 1e-2
    ref_o, ref_S = OPS[name]("recurrent", *(x.float() for x in inputs), initial_state=S0, **kw)   # fp32, no autocast
    # bf16 tolerance: the output is rounded to the input dtype (2^-8 relative), and so are the
    # keys normalize_qk makes from bf16 inputs (which the state then holds).
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    for impl in (None, "recurrent") + PATHS[name]:
        leaves = [x.clone().requires_grad_() for x in inputs]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            o, S = OPS[name](impl, *leaves, initial_state=S0, chunk_size=8, **kw)
        assert o.dtype == dtype and S.dtype == torch.float32, impl
        torch.testing.assert_close(o.float(), ref_o, **tol, msg=f"{name} {impl}")
        torch.testing.assert_close(S, ref_S, **tol, msg=f"{name} {impl}")
        (o.float().sum() + S.sum()).backward()
        assert all(x.grad is None or torch.isfinite(x.grad).all() for x in leaves), impl


# ----------------------------------------------------------------------------- the dtype rule


@pytest.mark.parametrize("choices", [_common.IMPLS, delta.IMPLS], ids=["linear_gated", "delta"])
def test_default_never_loses_precision(choices, monkeypatch):
    monkeypatch.setattr(_common, "triton_available", lambda: True)
    cuda = torch.device("cuda")                                 # a device object only; no GPU is touched
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert _common.resolve_impl(None, cuda, dtype, choices) == "triton"
    assert _common.resolve_impl(None, cuda, torch.float64, choices) == "chunk"
    for dtype in (torch.float32, torch.float64):
        assert _common.resolve_impl(None, torch.device("cpu"), dtype, choices) == "chunk"
    monkeypatch.setattr(_common, "triton_available", lambda: False)
    assert _common.resolve_impl(None, cuda, torch.float32, choices) == "chunk"


def test_explicit_triton_with_float64_is_refused(monkeypatch):
    monkeypatch.setattr(_common, "triton_available", lambda: True)
    with pytest.raises(ValueError, match="cannot honour float64"):
        _common.resolve_impl("triton", torch.device("cuda"), torch.float64)
    assert _common.resolve_impl("triton", torch.device("cuda"), torch.float32) == "triton"


@pytest.mark.parametrize("name", OPS)
def test_every_op_refuses_triton_for_float64_and_keeps_float64_by_default(name, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(_common, "triton_available", lambda: True)
    q, k, v, beta, g = _family(1, 2, 5, 4, 3)
    with pytest.raises(ValueError, match="cannot honour float64"):
        OPS[name]("triton", q, k, v, beta, g)
    o, S = OPS[name](None, q, k, v, beta, g)
    ref, S_ref = OPS[name]("recurrent", q, k, v, beta, g)
    assert o.dtype == S.dtype == torch.float64
    torch.testing.assert_close(o, ref, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- non-finite inputs

BAD = {"q": ("nan", "inf", "-inf"), "k": ("nan", "inf"), "v": ("nan", "inf", "-inf"), "g": ("nan",), "beta": ("nan",)}
BAD_CASES = [(name, tensor, value) for name in OPS for tensor, values in BAD.items() for value in values
             if not (tensor == "g" and name not in GATED) and not (tensor == "beta" and not name.endswith("delta"))]


@pytest.mark.parametrize("name, tensor, value", BAD_CASES, ids=lambda x: str(x))
def test_non_finite_input_spoils_no_earlier_output(name, tensor, value):
    """One bad entry at (batch 1, head 0, token 11, channel 1): earlier outputs are the loop's, finite;
    later outputs are non-finite wherever the loop's are; other heads are untouched."""
    T, t = 19, 11
    q, k, v, beta, g = _family(2, 2, T, 4, 3, seed=1)
    xs = dict(q=q, k=k, v=v, beta=beta, g=g)
    x = xs[tensor].clone()
    idx = (1, 0, t, 0 if tensor == "g" else 1) if x.dim() == 4 else (1, 0, t)   # g: channel 0 is the scalar gate
    x[idx] = float(value)
    xs[tensor] = x
    kw = dict(normalize_qk=True) if name.endswith("delta") else {}  # inf in a key: normalised to nan
    ref_o, ref_S = OPS[name]("recurrent", **xs, **kw)
    assert ref_o[1, 0, :t].isfinite().all() and not ref_o[1, 0, t].isfinite().all()
    for impl in PATHS[name]:
        for C in (4, 8, 32):                                    # the bad token inside, and in the one chunk
            o, S = OPS[name](impl, **xs, chunk_size=C, **kw)
            torch.testing.assert_close(o[1, 0, :t], ref_o[1, 0, :t], rtol=1e-10, atol=1e-10)
            mask = torch.ones_like(o, dtype=torch.bool)
            mask[1, 0] = False
            torch.testing.assert_close(o[mask], ref_o[mask], rtol=1e-10, atol=1e-10)
            assert not o[1, 0][~ref_o[1, 0].isfinite()].isfinite().any()
            if tensor == "q":                                   # read at its own token only
                torch.testing.assert_close(o[1, 0, t + 1:], ref_o[1, 0, t + 1:], rtol=1e-10, atol=1e-10)
                torch.testing.assert_close(S, ref_S, rtol=1e-10, atol=1e-10)
            else:
                assert not o[1, 0, t:].isfinite().any() and not S[1, 0].isfinite().any()


def test_positive_infinite_gate_and_infinite_beta_are_refused():
    q, k, v, beta, g = _family(1, 1, 6, 4, 3)
    g[0, 0, 2] = float("inf")
    with pytest.raises(ValueError, match="must be <= 0"):
        gated_linear_attention(q, k, v, g)
    beta[0, 0, 2] = float("inf")
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        delta_rule(q, k, v, beta)


# ----------------------------------------------------------------------------- docstring examples


@pytest.mark.parametrize("module", [mlexp.ops, linear, gated, delta], ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------------------- Triton, in the CPU interpreter

_TRITON_RESET_SCRIPT = """
import torch, torch.nn.functional as F
from mlexp.ops import gated_delta_rule, gated_linear_attention
q = k = v = torch.ones(1, 1, 4, 16) / 4
half = torch.tensor(0.5).log().item()
for R in (float("-inf"), -1e9):
    g = torch.tensor([[[0.0, R, half, half]]])
    for gate in (g, g[..., None].expand(1, 1, 4, 16).contiguous()):
        o, S = gated_linear_attention(q, k, v, gate, impl="triton", chunk_size=16)
        ref, S_ref = gated_linear_attention(q, k, v, gate, impl="recurrent")
        torch.testing.assert_close(o, ref)
    ku, beta = F.normalize(k, dim=-1), torch.full((1, 1, 4), 0.5)
    o, S = gated_delta_rule(q, ku, v, beta, g, impl="triton", chunk_size=16)
    torch.testing.assert_close(o, gated_delta_rule(q, ku, v, beta, g, impl="recurrent")[0])
"""


@pytest.mark.skipif(not _common.triton_available(), reason="triton not installed")
def test_value_checks_read_no_gpu_value(monkeypatch):
    """On a GPU the checks that read values (g <= 0, beta in [0, 2], unit keys) would wait for the
    device, so they run there only with MLEXP_CHECK_VALUES=1; shape checks always run."""
    class FakeCuda:
        type = "cuda"
    g = torch.ones(1, 1, 3)          # not a log-decay: refused on CPU ...
    with pytest.raises(ValueError, match="log-decay"):
        _common.check_log_decay(g, torch.zeros(1, 1, 3, 2))
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: FakeCuda()))
    assert not _common.check_values(g)             # ... never read back from a GPU by default
    monkeypatch.setenv("MLEXP_CHECK_VALUES", "1")
    assert _common.check_values(g)


@pytest.mark.slow   # one of the slowest fast tests: left out of make test-fast (under 3 min); make test runs it
def test_triton_resets_in_interpreter():
    """The issue's hard-reset example on the Triton path, under TRITON_INTERPRET=1 in a subprocess."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _TRITON_RESET_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
