"""Tests for mlexp.ops.delta_rule / gated_delta_rule: recurrent vs chunkwise vs Triton, and checks."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from mlexp.ops import delta_rule, gated_delta_rule


def _inputs(B, H, T, Dk, Dv, dtype=torch.float64, seed=0):
    """Random q, unit keys k, v, beta in [0, 2), log-decay g <= 0, initial state S0."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    k = F.normalize(r(B, H, T, Dk), dim=-1)
    beta = 2 * torch.rand(B, H, T, generator=gen, dtype=dtype)
    g = F.logsigmoid(r(B, H, T) + 2)
    return r(B, H, T, Dk), k, r(B, H, T, Dv), beta, g, r(B, H, Dk, Dv)


def _call(gated, q, k, v, beta, g, **kw):
    return gated_delta_rule(q, k, v, beta, g, **kw) if gated else delta_rule(q, k, v, beta, **kw)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("B,H,T,Dk,Dv,C", [(1, 1, 16, 4, 4, 16), (2, 3, 37, 8, 5, 8), (1, 2, 50, 6, 9, 64),
                                           (2, 2, 64, 16, 16, 16)])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_matches_recurrent_float64(gated, B, H, T, Dk, Dv, C, with_state):
    q, k, v, beta, g, S0 = _inputs(B, H, T, Dk, Dv, seed=T + Dk)
    S0 = S0 if with_state else None
    o_ref, S_ref = _call(gated, q, k, v, beta, g, initial_state=S0, impl="recurrent")
    o, S = _call(gated, q, k, v, beta, g, initial_state=S0, impl="chunk", chunk_size=C)
    assert o.shape == (B, H, T, Dv) and S.shape == (B, H, Dk, Dv)
    assert o.dtype == S.dtype == torch.float64
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)


def test_state_carries_across_calls():
    """Running two halves with the state handed over equals one run over the whole sequence."""
    q, k, v, beta, g, _ = _inputs(2, 2, 40, 8, 8)
    o_all, S_all = gated_delta_rule(q, k, v, beta, g, impl="chunk", chunk_size=16)
    o1, S1 = gated_delta_rule(q[:, :, :23], k[:, :, :23], v[:, :, :23], beta[:, :, :23], g[:, :, :23])
    o2, S2 = gated_delta_rule(q[:, :, 23:], k[:, :, 23:], v[:, :, 23:], beta[:, :, 23:], g[:, :, 23:],
                              initial_state=S1)
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), o_all)
    torch.testing.assert_close(S2, S_all)


def _worked_example(beta2=1.0):
    """Syllabus lesson 03: key (1,0) written with (2,0), later with (0,4); then query (1,0)."""
    k = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]).view(1, 1, 3, 2)
    v = torch.tensor([[2.0, 0.0], [0.0, 4.0], [0.0, 0.0]]).view(1, 1, 3, 2)
    q = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]]).view(1, 1, 3, 2)
    beta = torch.tensor([1.0, beta2, 0.0]).view(1, 1, 3)                # third token only reads
    return q, k, v, beta


@pytest.mark.parametrize("impl", ["recurrent", "chunk"])
def test_worked_example_delta_reads_latest_value(impl):
    q, k, v, beta = _worked_example()
    o, S = delta_rule(q, k, v, beta, impl=impl, scale=1.0, chunk_size=2)
    torch.testing.assert_close(o[0, 0, -1], torch.tensor([0.0, 4.0]))   # the old (2,0) is replaced
    torch.testing.assert_close(S[0, 0], torch.tensor([[0.0, 4.0], [0.0, 0.0]]))


@pytest.mark.parametrize("impl", ["recurrent", "chunk"])
def test_worked_example_gated_by_hand(impl):
    q, k, v, beta = _worked_example(beta2=0.5)
    g = torch.full((1, 1, 3), 0.5).log()                               # alpha = 0.5 every token
    o, _ = gated_delta_rule(q, k, v, beta, g, impl=impl, scale=1.0, chunk_size=2)
    # By hand: S1 = k v1^T, row (2, 0). Token 2: alpha S1 has row (1, 0); it holds (1, 0) for
    # key (1,0), the error is (0,4) - (1,0) = (-1, 4), half of it is written: row (0.5, 2).
    # Token 3 (beta 0) only decays: row (0.25, 1), which query (1,0) reads.
    torch.testing.assert_close(o[0, 0, -1], torch.tensor([0.25, 1.0]))
    q, k, v, beta = _worked_example(beta2=1.0)                         # beta 1: full overwrite
    o, _ = gated_delta_rule(q, k, v, beta, g, impl=impl, scale=1.0, chunk_size=2)
    torch.testing.assert_close(o[0, 0, -1], torch.tensor([0.0, 2.0]))  # (0,4) decayed once


def test_strong_decay_over_long_chunk_stays_finite():
    """g = -40 per token over a 64-token chunk: exp(-b) would be e^2560; differences of logs are fine."""
    q, k, v, beta, _, S0 = _inputs(1, 2, 100, 8, 8)
    g = torch.full((1, 2, 100), -40.0, dtype=torch.float64)
    o_ref, S_ref = gated_delta_rule(q, k, v, beta, g, initial_state=S0, impl="recurrent")
    o, S = gated_delta_rule(q, k, v, beta, g, initial_state=S0, impl="chunk", chunk_size=64)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(S, S_ref)


@pytest.mark.parametrize("gated", [False, True])
def test_gradcheck_chunk_float64(gated):
    gen = torch.Generator().manual_seed(1)
    leaf = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)  # noqa: E731
    B, H, T, Dk, Dv = 1, 2, 7, 3, 2
    args = (leaf(B, H, T, Dk), leaf(B, H, T, Dk), leaf(B, H, T, Dv), leaf(B, H, T), leaf(B, H, T),
            leaf(B, H, Dk, Dv))

    def f(q, k, v, b_raw, g_raw, S0):
        beta, g = torch.sigmoid(b_raw), F.logsigmoid(g_raw)
        return _call(gated, q, k, v, beta, g, initial_state=S0, impl="chunk", chunk_size=4,
                     normalize_qk=True)

    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_accumulate_in_float32(dtype):
    q, k, v, beta, g, S0 = _inputs(1, 2, 40, 16, 16, dtype=torch.float32)
    o_ref, S_ref = gated_delta_rule(q, k, v, beta, g, initial_state=S0, impl="recurrent")
    low = [x.to(dtype) for x in (q, k, v, beta, g)]
    o, S = gated_delta_rule(*low, initial_state=S0, impl="chunk", chunk_size=16)
    assert o.dtype == dtype and S.dtype == torch.float32
    rel = ((o.float() - o_ref).norm() / o_ref.norm()).item()
    assert rel < 3e-2, rel


def test_normalize_qk_equals_normalising_first():
    q, k, v, beta, g, _ = _inputs(1, 2, 20, 8, 4)
    k_raw = 3 * k + 0.1
    o1, S1 = gated_delta_rule(q, k_raw, v, beta, g, normalize_qk=True)
    o2, S2 = gated_delta_rule(F.normalize(q, dim=-1), F.normalize(k_raw, dim=-1), v, beta, g)
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(S1, S2)


def test_input_errors_say_what_to_do():
    q, k, v, beta, g, S0 = _inputs(1, 2, 10, 4, 4)
    with pytest.raises(ValueError, match="normalize_qk=True"):
        delta_rule(q, 2 * k, v, beta)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        delta_rule(q, k, v, beta + 2.5)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        delta_rule(q, k, v, -beta)
    with pytest.raises(ValueError, match="<= 0"):
        gated_delta_rule(q, k, v, beta, -g)
    with pytest.raises(ValueError, match="beta must be a tensor of shape"):
        delta_rule(q, k, v, beta[..., None])
    with pytest.raises(ValueError, match="per-key-channel"):
        gated_delta_rule(q, k, v, beta, g[..., None].expand(-1, -1, -1, 4))
    with pytest.raises(ValueError, match="initial_state"):
        delta_rule(q, k, v, beta, initial_state=S0[:, :1])
    with pytest.raises(ValueError, match="impl"):
        delta_rule(q, k, v, beta, impl="parallel")
    with pytest.raises(ValueError):
        delta_rule(q, k[:, :, :5], v, beta)
    with pytest.raises(ValueError, match="chunk_size"):
        delta_rule(q, k, v, beta, chunk_size=0)
    with pytest.raises(ValueError, match="needs g"):
        gated_delta_rule(q, k, v, beta, None)
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="CUDA"):
            delta_rule(q.float(), k.float(), v.float(), beta.float(), impl="triton")


_TRITON_SCRIPT = textwrap.dedent("""
    import json, torch, torch.nn.functional as F
    from mlexp.ops import delta_rule, gated_delta_rule
    def rel(a, b):
        return ((a - b).pow(2).mean() / b.pow(2).mean()).sqrt().item()
    torch.manual_seed(0)
    errs = {}
    # shapes a GPU accepts too: chunks and tiles of at least 16; ragged T, Dk/Dv not powers of 2
    for B, H, T, Dk, Dv, C in [(1, 2, 40, 16, 16, 16), (2, 1, 33, 20, 40, 32)]:
        q, v = torch.randn(B, H, T, Dk), torch.randn(B, H, T, Dv)
        k = F.normalize(torch.randn(B, H, T, Dk), dim=-1)
        beta, g = 2 * torch.rand(B, H, T), F.logsigmoid(torch.randn(B, H, T) + 2)
        S0 = torch.randn(B, H, Dk, Dv)
        for name, fn, extra in (("delta", delta_rule, ()), ("gated", gated_delta_rule, (g,))):
            o1, S1 = fn(q, k, v, beta, *extra, initial_state=S0, impl="recurrent")
            o2, S2 = fn(q, k, v, beta, *extra, initial_state=S0, impl="triton", chunk_size=C)
            errs[f"{name} T={T} o"] = rel(o2, o1)
            errs[f"{name} T={T} S"] = rel(S2, S1)
    # backward: the Triton backward kernels must give the chunk path's gradients
    leaves = [torch.randn(*s, requires_grad=True) for s in [(1, 2, 20, 16)] * 2 + [(1, 2, 20, 16), (1, 2, 20),
              (1, 2, 20), (1, 2, 16, 16)]]
    grads = []
    for impl in ("chunk", "triton"):
        q, k, v, b, gg, S0 = leaves
        o, S = gated_delta_rule(q, k, v, torch.sigmoid(b), F.logsigmoid(gg), initial_state=S0,
                                impl=impl, chunk_size=16, normalize_qk=True)
        grads.append(torch.autograd.grad(o.pow(2).sum() + S.sum(), leaves))
    for i, (a, b) in enumerate(zip(*grads)):
        errs[f"grad {i}"] = rel(b, a)
    print(json.dumps(errs))
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.slow   # one of the slowest fast tests: left out of make test-fast (under 3 min); make test runs it
def test_triton_forward_and_backward_in_interpreter():
    """The Triton kernel under TRITON_INTERPRET=1 (set in a subprocess, before triton is imported)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert run.returncode == 0, run.stderr[-3000:]
    errs = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(errs) == 14
    bad = {name: e for name, e in errs.items() if not e < 1e-4}
    assert not bad, f"RMS-relative error >= 1e-4: {bad}"
