"""Tests for mlexp.mixers: shapes, causality, backward, and agreement of the ops' implementations."""
import pytest
import torch
import torch.nn.functional as F

from mlexp import mixers
from mlexp.mixers import (DecayLinearAttention, DeltaNet, GatedDeltaNet, LinearAttention, TaylorLinearAttention,
                          retnet_gammas, taylor_features)

MAKERS = {
    "linear": lambda **kw: LinearAttention(32, n_heads=4, **kw),
    "decay_fixed": lambda **kw: DecayLinearAttention(32, n_heads=4, decay="fixed", **kw),
    "decay_data": lambda **kw: DecayLinearAttention(32, n_heads=4, decay="data", **kw),
    "delta": lambda **kw: DeltaNet(32, n_heads=4, **kw),
    "delta_additive": lambda **kw: DeltaNet(32, n_heads=4, rule="additive", **kw),
    "gated_delta": lambda **kw: GatedDeltaNet(32, n_heads=2, head_dim=12, **kw),
    "taylor": lambda **kw: TaylorLinearAttention(32, n_heads=4, feature_dim=5, **kw),
}


@pytest.mark.parametrize("name", MAKERS)
def test_shape_and_causality(name):
    torch.manual_seed(0)
    mixer = MAKERS[name](chunk_size=16)
    x = torch.randn(2, 37, 32)
    y = mixer(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    x2 = x.clone()
    x2[:, 20:] = torch.randn(2, 17, 32)                          # change only the future of t < 20
    y2 = mixer(x2)
    torch.testing.assert_close(y2[:, :20], y[:, :20], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y2[:, 20:], y[:, 20:])             # ... and the later outputs do move


@pytest.mark.parametrize("name", MAKERS)
def test_backward_reaches_every_parameter(name):
    torch.manual_seed(0)
    mixer = MAKERS[name](chunk_size=16)
    mixer(torch.randn(2, 24, 32)).pow(2).mean().backward()
    for pname, p in mixer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


def _rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


AUTOCAST_MAKERS = {**MAKERS,
                   "softmax": lambda **kw: mixers.SoftmaxAttention(32, 4),
                   "conv": lambda **kw: mixers.CausalConv(32, 4),
                   "lstm": lambda **kw: mixers.LSTMMixer(32)}


@pytest.mark.parametrize("impl", [None, "recurrent", "chunk"])
@pytest.mark.parametrize("name", AUTOCAST_MAKERS)
def test_mixer_runs_under_cpu_autocast(name, impl):
    """Under torch.autocast("cpu", bfloat16) forward and backward run, close to the float32 result."""
    if impl is not None and name in ("softmax", "conv", "lstm"):
        pytest.skip("no impl to choose")
    torch.manual_seed(0)
    mixer = AUTOCAST_MAKERS[name](impl=impl, chunk_size=16)
    x = torch.randn(2, 40, 32)                                  # 40: two full chunks and a ragged one
    ref = mixer(x)
    ref.pow(2).mean().backward()
    ref_grads = {n: p.grad.clone() for n, p in mixer.named_parameters()}
    mixer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mixer(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert _rel_err(y, ref) < 3e-2, _rel_err(y, ref)           # bf16 has 8 bits of mantissa (eps 2^-8 = 4e-3)
    y.float().pow(2).mean().backward()
    for pname, p in mixer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert _rel_err(p.grad, ref_grads[pname]) < 1e-1, (pname, _rel_err(p.grad, ref_grads[pname]))


@pytest.mark.parametrize("name", MAKERS)
def test_recurrent_and_chunk_give_the_same_mixer_output(name):
    torch.manual_seed(0)
    ref = MAKERS[name](impl="recurrent").double()
    fast = MAKERS[name](impl="chunk", chunk_size=8).double()
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(1, 21, 32, dtype=torch.float64)
    torch.testing.assert_close(fast(x), ref(x), rtol=1e-9, atol=1e-9)


def test_retnet_gammas_match_the_syllabus():
    gammas = retnet_gammas(8)
    assert gammas[0].item() == 0.96875
    assert abs(gammas[7].item() - 0.999756) < 1e-6
    assert abs(1 / (1 - gammas[7].item()) - 4096) < 1e-6


def test_data_decay_starts_at_retnet_gammas():
    mixer = DecayLinearAttention(16, n_heads=4, decay="data")
    torch.nn.init.zeros_(mixer.gate.weight)
    alpha = mixer.log_decay(torch.randn(1, 5, 16)).exp()         # (1, H, 5)
    torch.testing.assert_close(alpha[0, :, 0], retnet_gammas(4).float())


def test_additive_rule_only_changes_the_write():
    """DeltaNet(rule="additive") is DeltaNet with S_t = S_{t-1} + beta_t k_t v_t^T: with the same
    weights it matches that write done by hand, and differs from the delta rule's output."""
    torch.manual_seed(0)
    delta, additive = DeltaNet(8, n_heads=1).double(), DeltaNet(8, n_heads=1, rule="additive").double()
    additive.load_state_dict(delta.state_dict())
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    q, k, v = (F.normalize(t, dim=-1) if i < 2 else t for i, t in enumerate(additive._qkv(x)))
    beta = torch.sigmoid(additive.beta_proj(x))[0, :, 0]                       # (T,)
    S, reads = torch.zeros(8, 8, dtype=torch.float64), []
    for t in range(6):                                                        # the write, by hand
        S = S + beta[t] * torch.outer(k[0, 0, t], v[0, 0, t])
        reads.append(q[0, 0, t] @ S)
    o = torch.stack(reads)[None, None]
    expected = additive._merge(o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(additive(x), expected, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(additive(x), delta(x))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="head_dim"):
        DeltaNet(30, n_heads=4)
    with pytest.raises(ValueError, match="decay"):
        DecayLinearAttention(32, n_heads=4, decay="sometimes")
    with pytest.raises(ValueError, match="rule"):
        DeltaNet(32, n_heads=4, rule="hebbian")
    with pytest.raises(ValueError, match=r"\(B, T, 32\)"):
        DeltaNet(32, n_heads=4)(torch.randn(2, 5, 16))


def test_softmax_attention_is_exported():
    from mlexp.transformer import Attention

    assert mixers.SoftmaxAttention is Attention
    y = mixers.SoftmaxAttention(32, 4, 2)(torch.randn(2, 9, 32))
    assert y.shape == (2, 9, 32)


def test_taylor_features_are_the_second_order_expansion_of_exp():
    """phi(q) . phi(k) = 1 + u + u^2 / 2 with u = q.k / sqrt(d), Based's Taylor map (1 + d + d^2 features)."""
    torch.manual_seed(0)
    q, k = torch.randn(7, 6, dtype=torch.float64), torch.randn(7, 6, dtype=torch.float64)
    fq, fk = taylor_features(q), taylor_features(k)
    assert fq.shape == (7, 1 + 6 + 36) and fq.dtype == torch.float64
    u = (q * k).sum(-1) / 6 ** 0.5
    torch.testing.assert_close((fq * fk).sum(-1), 1 + u + u ** 2 / 2, rtol=1e-12, atol=1e-12)
    assert ((fq * fk).sum(-1) > 0).all()                       # 1 + u + u^2/2 > 0: the normaliser never vanishes
    # For small u it approaches exp(u); the error is the third-order term, u^3 / 6.
    small = 1e-2 * q
    us = (small * k).sum(-1) / 6 ** 0.5
    err = ((taylor_features(small) * fk).sum(-1) - us.exp()).abs()
    assert (err <= (us.abs() ** 3 / 6) * 1.01 + 1e-15).all()


def test_taylor_linear_attention_state_shape_and_reference():
    """The mixer's state is (S, z) of 1 + d' + d'^2 key features, and its output is the normalised
    linear attention of the Taylor features, written out as a masked T x T product."""
    torch.manual_seed(0)
    mixer = TaylorLinearAttention(32, n_heads=4, feature_dim=3).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    y, (S, z) = mixer(x, return_state=True)
    assert S.shape == (2, 4, 1 + 3 + 9, 8) and z.shape == (2, 4, 1 + 3 + 9)
    q, k, v = mixer._features(x)                                  # (B, H, T, 13), (B, H, T, 13), (B, H, T, 8)
    scores = (q @ k.transpose(-1, -2)).tril()                    # (B, H, T, T): phi(q_t) . phi(k_s), s <= t
    o = (scores @ v) / (scores.sum(-1, keepdim=True) + 1e-6)     # the op's eps = 1e-6 in the denominator
    torch.testing.assert_close(y, mixer._merge(o), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(S, k.transpose(-1, -2) @ v, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(z, k.sum(-2), rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="feature_dim"):
        TaylorLinearAttention(32, n_heads=4, feature_dim=0)
