"""Tests of mlexp.transformer: RMSNorm, SwiGLU, RoPE, attention with n_kv_heads, the small LM."""
import pytest
import torch

from mlexp.train import count_params
from mlexp.transformer import Attention, RMSNorm, SwiGLU, TinyLM, apply_rope, attention_lm, rope_cache


# --------------------------------------------------------------------------------------------
# Transformer parts
# --------------------------------------------------------------------------------------------


def test_rmsnorm_and_swiglu_shapes():
    x = torch.randn(2, 5, 8)
    y = RMSNorm(8)(x)
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(2, 5), atol=1e-4)
    ffn = SwiGLU(8, 24)
    assert ffn(x).shape == x.shape and count_params(ffn) == 3 * 8 * 24


def test_rope_preserves_norms():
    cos, sin = rope_cache(32, 16, dtype=torch.float64)
    x = torch.randn(2, 3, 32, 16, dtype=torch.float64)
    out = apply_rope(x, cos, sin)
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1))
    assert torch.allclose(out[:, :, 0], x[:, :, 0])  # position 0 is not rotated
    assert not torch.allclose(out[:, :, 1:], x[:, :, 1:])


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    D_ = 16
    cos, sin = rope_cache(64, D_, dtype=torch.float64)
    q, k = torch.randn(D_, dtype=torch.float64), torch.randn(D_, dtype=torch.float64)

    def score(m, n):  # q at position m, k at position n
        qm = apply_rope(q.expand(1, 1, 1, D_), cos, sin, offset=m)
        kn = apply_rope(k.expand(1, 1, 1, D_), cos, sin, offset=n)
        return (qm * kn).sum().item()

    for m, n in [(5, 2), (20, 10), (40, 3)]:
        shifted = [score(m + s, n + s) for s in (0, 7, 19)]
        assert shifted == pytest.approx([shifted[0]] * 3, abs=1e-9)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-6)
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(1, 1, 8, D_), cos, sin, offset=60)


def test_gqa_shapes_params_and_causality():
    torch.manual_seed(0)
    dim, T = 32, 12
    x = torch.randn(2, T, dim)
    for n_kv in (4, 2, 1):
        attn = Attention(dim, n_heads=4, n_kv_heads=n_kv)
        assert attn(x).shape == x.shape
        head_dim = dim // 4
        assert count_params(attn) == 2 * dim * dim + 2 * dim * n_kv * head_dim
        # causal: changing the future never changes the past
        x2 = x.clone()
        x2[:, 7:] = torch.randn(2, T - 7, dim)
        out, out2 = attn(x), attn(x2)
        assert torch.allclose(out[:, :7], out2[:, :7], atol=1e-6)
        assert not torch.allclose(out[:, 7:], out2[:, 7:])
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        Attention(dim, n_heads=4, n_kv_heads=3)


def test_gqa_equals_mha_with_repeated_kv_weights():
    """A GQA layer computes what an MHA layer does whose kv heads are copies, group by group."""
    torch.manual_seed(0)
    dim, hd = 32, 8
    gqa, mha = Attention(dim, 4, n_kv_heads=2), Attention(dim, 4)
    with torch.no_grad():
        for name in ("q_proj", "o_proj"):
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight)
        for name in ("k_proj", "v_proj"):  # kv head j serves query heads 2j and 2j+1
            w = getattr(gqa, name).weight.view(2, hd, dim)
            getattr(mha, name).weight.copy_(w.repeat_interleave(2, dim=0).reshape(4 * hd, dim))
    x = torch.randn(3, 10, dim)
    assert torch.allclose(gqa(x), mha(x), atol=1e-6)


def test_tiny_lm_parameter_count_and_errors():
    model = attention_lm(65)
    assert count_params(model) == 204_992  # lesson 00: "~205k parameters"
    assert model(torch.zeros(2, 9, dtype=torch.long)).shape == (2, 9, 65)
    with pytest.raises(ValueError, match="batch dimension"):
        model(torch.zeros(9, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        attention_lm(65, max_len=8)(torch.zeros(1, 9, dtype=torch.long))
    sample = attention_lm(65, max_len=8).generate(torch.zeros(1, 3, dtype=torch.long), 10,
                                                  generator=torch.Generator().manual_seed(0))
    assert sample.shape == (1, 13) and sample.dtype == torch.long and int(sample.max()) < 65
    custom = TinyLM(10, 16, 2, lambda i: torch.nn.Identity(), ffn_hidden=8)
    assert count_params(custom) == 10 * 16 * 2 + 16 * 5 + 2 * 3 * 16 * 8
