"""Tests for mlexp.ops.linear_attention and gated_linear_attention: implementations agree, grads flow."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mlexp.ops import gated, gated_linear_attention, linear_attention

IMPLS = ("recurrent", "parallel", "chunk")
# (B, H, T, Dk, Dv, C): T below, equal to, and not a multiple of the chunk; H > 1; Dk != Dv.
SHAPES = [(1, 1, 1, 3, 3, 4), (2, 3, 37, 5, 4, 8), (1, 2, 16, 4, 6, 16), (2, 2, 50, 8, 8, 64), (1, 4, 33, 3, 7, 5)]


def _rand(*shape, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return torch.nn.functional.elu(x) + 1 if positive else x   # phi = elu + 1 keeps q . z > 0


def _inputs(B, H, T, Dk, Dv, positive=False, seed=0):
    return (_rand(B, H, T, Dk, seed=seed, positive=positive), _rand(B, H, T, Dk, seed=seed + 1, positive=positive),
            _rand(B, H, T, Dv, seed=seed + 2))


def _rms_rel(x, ref):
    """RMS-relative error ||x - ref|| / ||ref||, computed in float64."""
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def _states(out, normalize):
    """The final state as a flat tuple of tensors."""
    return out[1] if normalize else (out[1],)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_linear_impls_agree_float64(shape, with_state, normalize):
    B, H, T, Dk, Dv, C = shape
    q, k, v = _inputs(B, H, T, Dk, Dv, positive=normalize)
    init = None
    if with_state:
        S0 = _rand(B, H, Dk, Dv, seed=7)
        init = (S0.abs(), _rand(B, H, Dk, seed=8).abs()) if normalize else S0
    ref = linear_attention(q, k, v, normalize=normalize, initial_state=init, impl="recurrent")
    assert ref[0].shape == (B, H, T, Dv) and ref[0].dtype == torch.float64
    for impl in IMPLS[1:]:
        out = linear_attention(q, k, v, normalize=normalize, initial_state=init, impl=impl, chunk_size=C)
        torch.testing.assert_close(out[0], ref[0], rtol=1e-10, atol=1e-10, msg=f"{impl} output")
        for a, b in zip(_states(out, normalize), _states(ref, normalize)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"{impl} final state")


def test_linear_matches_naive_attention_without_softmax():
    """o_t = sum_{i<=t} (q_t . k_i) v_i / sum_{i<=t} q_t . k_i, computed by a plain double loop."""
    q, k, v = _inputs(1, 1, 6, 3, 2, positive=True)
    o, _ = linear_attention(q, k, v, normalize=True, eps=0.0, impl="chunk", chunk_size=4)
    for t in range(6):
        w = torch.stack([q[0, 0, t] @ k[0, 0, i] for i in range(t + 1)])
        expect = (w[:, None] * v[0, 0, : t + 1]).sum(0) / w.sum()
        torch.testing.assert_close(o[0, 0, t], expect)


def test_linear_worked_example_from_lesson_01():
    """Keys (1,0), (1,1); values (2,0), (0,4); query (1,2) reads (0.5, 3) with S = [[2,4],[0,4]], z = (2,1)."""
    k = torch.tensor([[1.0, 0.0], [1.0, 1.0]]).view(1, 1, 2, 2)
    v = torch.tensor([[2.0, 0.0], [0.0, 4.0]]).view(1, 1, 2, 2)
    q = torch.tensor([[1.0, 2.0], [1.0, 2.0]]).view(1, 1, 2, 2)
    for impl in IMPLS:
        o, (S, z) = linear_attention(q, k, v, normalize=True, eps=0.0, impl=impl)
        torch.testing.assert_close(o[0, 0, -1], torch.tensor([0.5, 3.0]))
        torch.testing.assert_close(S[0, 0], torch.tensor([[2.0, 4.0], [0.0, 4.0]]))
        torch.testing.assert_close(z[0, 0], torch.tensor([2.0, 1.0]))


@pytest.mark.parametrize("normalize", [False, True])
def test_linear_state_carries_across_calls(normalize):
    """Running T tokens at once equals running the first part, then the rest from its final state."""
    q, k, v = _inputs(2, 2, 29, 4, 5, positive=normalize)
    full, state_full = linear_attention(q, k, v, normalize=normalize, impl="chunk", chunk_size=8)
    o1, st = linear_attention(q[:, :, :11], k[:, :, :11], v[:, :, :11], normalize=normalize, impl="chunk", chunk_size=8)
    o2, st = linear_attention(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], normalize=normalize, initial_state=st,
                              impl="recurrent")
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), full)
    for a, b in zip(_states((None, st), normalize), _states((None, state_full), normalize)):
        torch.testing.assert_close(a, b)


def test_linear_scale_multiplies_q():
    q, k, v = _inputs(1, 2, 9, 4, 4)
    a, _ = linear_attention(q, k, v, scale=0.25, impl="chunk", chunk_size=4)
    b, _ = linear_attention(q * 0.25, k, v, impl="recurrent")
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("normalize", [False, True])
def test_linear_chunk_gradcheck(normalize):
    q, k, v = _inputs(1, 2, 7, 3, 2, positive=normalize)
    S0 = _rand(1, 2, 3, 2, seed=5).abs()
    z0 = _rand(1, 2, 3, seed=6).abs()
    args = [x.clone().requires_grad_() for x in (q, k, v, S0, z0)]

    def f(q, k, v, S0, z0):
        init = (S0, z0) if normalize else S0
        o, st = linear_attention(q, k, v, normalize=normalize, initial_state=init, impl="chunk", chunk_size=3)
        return (o,) + _states((None, st), normalize)

    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_half_inputs_accumulate_in_fp32(dtype):
    q, k, v = (x.to(dtype) for x in _inputs(2, 2, 40, 8, 8, positive=True))
    o, (S, z) = linear_attention(q, k, v, normalize=True, impl="chunk", chunk_size=16)
    assert o.dtype == dtype and S.dtype == torch.float32 and z.dtype == torch.float32
    ref, _ = linear_attention(q.double(), k.double(), v.double(), normalize=True, impl="recurrent")
    err = _rms_rel(o, ref)
    assert err < 1e-2, f"relative error {err:.2e} too large for {dtype} inputs"


def test_linear_defaults_to_chunk_on_cpu():
    q, k, v = _inputs(1, 1, 70, 4, 4)
    o, S = linear_attention(q, k, v)
    ref, S_ref = linear_attention(q, k, v, impl="recurrent")
    torch.testing.assert_close(o, ref)
    torch.testing.assert_close(S, S_ref)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda q, k, v: (q[0], k, v), r"q must have shape \(B, H, T, D\)"),
        (lambda q, k, v: (q, k[..., :2], v), "q and k must have the same shape"),
        (lambda q, k, v: (q, k, v[:, :, :3]), r"v must share \(B, H, T\)"),
        (lambda q, k, v: (q, k.float(), v), "one dtype"),
        (lambda q, k, v: (q, k, torch.empty(v.shape, dtype=v.dtype, device="meta")), "one device"),
        (lambda q, k, v: (q.long(), k, v), "must be float16, bfloat16, float32 or float64"),
    ],
)
def test_linear_rejects_bad_inputs(change, match):
    q, k, v = _inputs(1, 2, 5, 4, 4)
    with pytest.raises(ValueError, match=match):
        linear_attention(*change(q, k, v))


def test_linear_rejects_bad_options():
    q, k, v = _inputs(1, 2, 5, 4, 3)
    with pytest.raises(ValueError, match="impl must be one of"):
        linear_attention(q, k, v, impl="fast")
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        linear_attention(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(1, 2, 4, 3\)"):
        linear_attention(q, k, v, initial_state=torch.zeros(1, 2, 3, 4, dtype=q.dtype))
    with pytest.raises(ValueError, match=r"tuple \(S, z\)"):
        linear_attention(q, k, v, normalize=True, initial_state=torch.zeros(1, 2, 4, 3, dtype=q.dtype))


# ---------------------------------------------------------------- gated_linear_attention

def _log_decay(B, H, T, Dk, per_channel, seed=3, strength=1.0):
    g = -strength * _rand(B, H, T, Dk, seed=seed).abs()        # log-decay <= 0
    return g if per_channel else g[..., 0]


@pytest.mark.parametrize("per_channel", [False, True], ids=["scalar", "channel"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gated_impls_agree_float64(shape, with_state, per_channel):
    B, H, T, Dk, Dv, C = shape
    q, k, v = _inputs(B, H, T, Dk, Dv)
    g = _log_decay(B, H, T, Dk, per_channel, strength=0.5)
    S0 = _rand(B, H, Dk, Dv, seed=9) if with_state else None
    ref_o, ref_S = gated_linear_attention(q, k, v, g, initial_state=S0, impl="recurrent")
    for impl in IMPLS[1:]:
        o, S = gated_linear_attention(q, k, v, g, initial_state=S0, impl=impl, chunk_size=C)
        torch.testing.assert_close(o, ref_o, rtol=1e-10, atol=1e-10, msg=f"{impl} output")
        torch.testing.assert_close(S, ref_S, rtol=1e-10, atol=1e-10, msg=f"{impl} final state")


def _max_chunk_span(g, C):
    """The most any chunk of C tokens decays, in log units (what picks the per-channel path)."""
    T = g.shape[2]
    return max((-g[:, :, s:s + C].sum(dim=2)).max().item() for s in range(0, T, C))


# Per-channel decay has two chunkwise forms: one matmul per chunk when a chunk decays by at most
# SPAN (mild), exact 16-token sub-blocks otherwise (strong). Both are checked on purpose.
DECAY_STRENGTH = {"mild": 0.3, "strong": 4.0}


@pytest.mark.parametrize("decay", DECAY_STRENGTH)
@pytest.mark.parametrize("per_channel", [False, True], ids=["scalar", "channel"])
def test_gated_chunk_sub_blocks_agree(per_channel, decay):
    """Chunks longer than the 16-token sub-block exercise the split decay exp(b_i - b_r) exp(b_r - b_j)."""
    q, k, v = _inputs(1, 2, 100, 4, 3)
    g = _log_decay(1, 2, 100, 4, per_channel, strength=DECAY_STRENGTH[decay])
    ref = gated_linear_attention(q, k, v, g, impl="recurrent")
    for C in (37, 64):
        assert (_max_chunk_span(g, C) > gated.SPAN) == (decay == "strong")
        out = gated_linear_attention(q, k, v, g, impl="chunk", chunk_size=C)
        torch.testing.assert_close(out[0], ref[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(out[1], ref[1], rtol=1e-10, atol=1e-10)


def test_gated_with_zero_decay_is_linear_attention():
    q, k, v = _inputs(2, 2, 21, 4, 5)
    S0 = _rand(2, 2, 4, 5, seed=4)
    expect = linear_attention(q, k, v, initial_state=S0, impl="recurrent")
    for g in (torch.zeros(2, 2, 21, dtype=q.dtype), torch.zeros(2, 2, 21, 4, dtype=q.dtype)):
        o, S = gated_linear_attention(q, k, v, g, initial_state=S0, impl="chunk", chunk_size=8)
        torch.testing.assert_close(o, expect[0])
        torch.testing.assert_close(S, expect[1])


def test_gated_worked_example_from_lesson_03():
    """Key (1,0) written with (2,0), then again with (0,4); decay gamma = 0.5 reads (1, 4)."""
    k = torch.tensor([[1.0, 0.0], [1.0, 0.0]]).view(1, 1, 2, 2)
    v = torch.tensor([[2.0, 0.0], [0.0, 4.0]]).view(1, 1, 2, 2)
    q = k.clone()
    g = torch.full((1, 1, 2), torch.tensor(0.5).log().item())
    for impl in IMPLS:
        o, _ = gated_linear_attention(q, k, v, g, impl=impl)
        torch.testing.assert_close(o[0, 0, -1], torch.tensor([1.0, 4.0]))


@pytest.mark.parametrize("per_channel", [False, True], ids=["scalar", "channel"])
def test_gated_strong_decay_stays_finite_in_fp32(per_channel):
    """Cumulative logs reach about -1,000 inside a chunk: exp(-b) would overflow fp32, differences do not."""
    q, k, v = (x.float() for x in _inputs(1, 2, 64, 8, 8))
    g = _log_decay(1, 2, 64, 8, per_channel, strength=20.0).float()
    ref_o, ref_S = gated_linear_attention(q.double(), k.double(), v.double(), g.double(), impl="recurrent")
    for impl in IMPLS[1:]:
        o, S = gated_linear_attention(q, k, v, g, impl=impl, chunk_size=64)
        assert torch.isfinite(o).all() and torch.isfinite(S).all(), impl
        assert _rms_rel(o, ref_o) < 1e-5 and _rms_rel(S, ref_S) < 1e-5, impl


@pytest.mark.parametrize("per_channel, decay", [(False, "mild"), (True, "mild"), (True, "strong")],
                         ids=["scalar", "channel-mild", "channel-strong"])
def test_gated_chunk_gradcheck(per_channel, decay):
    # per channel: T = 18 in one chunk of 18 also covers the split left of a 16-token sub-block
    B, H, T, Dk, Dv, C = (1, 1, 18, 2, 2, 18) if per_channel else (1, 2, 9, 3, 2, 4)
    q, k, v = _inputs(B, H, T, Dk, Dv)
    g = _log_decay(B, H, T, Dk, per_channel, strength={"mild": 0.5, "strong": 5.0}[decay])
    assert (_max_chunk_span(g, C) > gated.SPAN) == (decay == "strong")
    S0 = _rand(B, H, Dk, Dv, seed=5)
    args = [x.clone().requires_grad_() for x in (q, k, v, g, S0)]

    def f(q, k, v, g, S0):
        return gated_linear_attention(q, k, v, g, initial_state=S0, impl="chunk", chunk_size=C)

    assert torch.autograd.gradcheck(f, args)


def test_gated_half_inputs_accumulate_in_fp32():
    q, k, v = (x.bfloat16() for x in _inputs(1, 2, 40, 8, 8))
    g = _log_decay(1, 2, 40, 8, True, strength=0.2).bfloat16()
    o, S = gated_linear_attention(q, k, v, g, impl="chunk", chunk_size=16)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    ref, _ = gated_linear_attention(q.double(), k.double(), v.double(), g.double(), impl="recurrent")
    assert _rms_rel(o, ref) < 1e-2


def test_gated_rejects_bad_decay():
    q, k, v = _inputs(1, 2, 5, 4, 3)
    with pytest.raises(ValueError, match=r"g must have shape \(B, H, T\)"):
        gated_linear_attention(q, k, v, torch.zeros(1, 2, 5, 3, dtype=q.dtype))
    with pytest.raises(ValueError, match="must be <= 0"):
        gated_linear_attention(q, k, v, torch.full((1, 2, 5), 0.1, dtype=q.dtype))
    with pytest.raises(ValueError, match="g is on meta"):
        gated_linear_attention(q, k, v, torch.zeros(1, 2, 5, device="meta"))


# ---------------------------------------------------------------- Triton, in the CPU interpreter

_TRITON_SCRIPT = textwrap.dedent("""
    import json, torch, torch.nn.functional as F
    from mlexp.ops import gated_linear_attention, linear_attention

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()

    def run(case, impl, q, k, v, S0, g, z0, C):
        \"\"\"One op call; returns o and the final state (z appended as a last column when normalised).\"\"\"
        if case == "linear":
            return linear_attention(q, k, v, initial_state=S0, impl=impl, chunk_size=C)
        if case == "normalized":
            o, (S, z) = linear_attention(F.elu(q) + 1, F.elu(k) + 1, v, normalize=True,
                                         initial_state=(S0.abs(), z0), impl=impl, chunk_size=C)
            return o, torch.cat([S, z[..., None]], dim=-1)
        return gated_linear_attention(q, k, v, g, initial_state=S0, impl=impl, chunk_size=C)

    torch.manual_seed(0)
    errs = {}
    # shapes a GPU accepts too: chunks and tiles >= 16; ragged T; Dk, Dv not powers of two
    for B, H, T, Dk, Dv, C in [(1, 2, 40, 16, 16, 16), (2, 1, 37, 20, 24, 32)]:
        q, k, v = torch.randn(B, H, T, Dk), torch.randn(B, H, T, Dk), torch.randn(B, H, T, Dv)
        S0, z0 = torch.randn(B, H, Dk, Dv), torch.rand(B, H, Dk)
        gates = {"linear": None, "normalized": None,
                 "scalar": F.logsigmoid(torch.randn(B, H, T) + 2),
                 "channel": F.logsigmoid(torch.randn(B, H, T, Dk) + 2)}
        for case, g in gates.items():
            tag = f"{case} T={T}"
            leaves = [x.clone().requires_grad_() for x in (q, k, v, S0) + ((g,) if g is not None else ())]
            gq = leaves[4] if g is not None else None
            results = {impl: run(case, impl, *leaves[:4], gq, z0, C) for impl in ("recurrent", "triton")}
            (o_ref, S_ref), (o, S) = results["recurrent"], results["triton"]
            errs[tag + " o"], errs[tag + " S"] = rel(o, o_ref), rel(S, S_ref)
            w_o, w_S = torch.randn_like(o_ref), torch.randn_like(S_ref)   # a loss touching every output
            grads = [torch.autograd.grad((oo * w_o).sum() + (ss * w_S).sum(), leaves) for oo, ss in results.values()]
            for i, (a, b) in enumerate(zip(*grads)):
                errs[f"{tag} grad{i}"] = rel(b, a)
    print(json.dumps(errs))
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.slow   # one of the slowest fast tests: left out of make test-fast (under 3 min); make test runs it
def test_triton_linear_and_gated_in_interpreter():
    """Triton forward and backward under TRITON_INTERPRET=1 (set in a subprocess before triton is imported)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-3000:]
    errs = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(errs) == 2 * (6 + 6 + 7 + 7)   # 2 shapes x (2 ungated cases x (o, S, 4 grads) + 2 gated x (o, S, 5 grads))
    bad = {name: e for name, e in errs.items() if not e < 1e-4}
    assert not bad, f"RMS-relative error >= 1e-4: {bad}"


def test_triton_refused_on_cpu_without_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    q, k, v = _inputs(1, 1, 16, 16, 16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1|needs the triton package"):
        linear_attention(q, k, v, impl="triton")
