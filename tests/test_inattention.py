"""InAttention layer and LM: shapes, causality, last-position inference, sizes, pair counts, memory."""
import pytest
import torch
import torch.nn.functional as F

from mlexp.inattention import (InAttention, InAttentionLM, attention_pairs, inattention_lm,
                               peak_memory_bytes)
from mlexp.train import count_params
from mlexp.transformer import attention_lm, apply_rope, rope_cache


def small_lm(**kw):
    torch.manual_seed(0)
    args = dict(vocab_size=11, dim=16, n_layers=3, n_heads=4, max_len=64)
    args.update(kw)
    return InAttentionLM(**args).double().eval()


def test_shapes_and_dtypes():
    m = small_lm()
    ids = torch.randint(11, (2, 9))
    assert m(ids).shape == (2, 9, 11)
    assert m.last_logits(ids).shape == (2, 11)
    layer = InAttention(16, 4, 2)
    x, y = torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    assert layer(x, y).shape == (3, 5, 16)
    k, v = layer.kv(y)
    assert k.shape == v.shape == (3, 2, 5, 4)


def test_keys_values_come_from_initial_states_through_the_layernorm():
    """kv(y) against the formula written out per token and head, with a non-trivial LayerNorm."""
    torch.manual_seed(1)
    layer = InAttention(8, 2, rope=False).double()
    with torch.no_grad():
        layer.kv_norm.weight.uniform_(0.5, 1.5)
        layer.kv_norm.bias.uniform_(-0.5, 0.5)
    y = torch.randn(2, 3, 8, dtype=torch.float64)
    k, v = layer.kv(y)
    for b in range(2):
        for t in range(3):
            yt = y[b, t]
            ln = (yt - yt.mean()) / torch.sqrt(yt.var(unbiased=False) + layer.kv_norm.eps)
            ln = ln * layer.kv_norm.weight + layer.kv_norm.bias
            for h in range(2):
                rows = slice(4 * h, 4 * h + 4)
                assert torch.allclose(k[b, h, t], layer.k_proj.weight[rows] @ ln)
                assert torch.allclose(v[b, h, t], layer.v_proj.weight[rows] @ ln)
    # The hidden states x do not enter the keys and values: the output at a position changes
    # with x only through that position's own query.
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 0] += 1.0
    assert torch.allclose(layer(x, y)[:, 1:], layer(x2, y)[:, 1:])


def test_layer_matches_explicit_attention_with_rope_and_gqa():
    torch.manual_seed(2)
    layer = InAttention(16, 4, 2, rope=True, max_len=32).double()
    x, y = torch.randn(2, 7, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    cos, sin = rope_cache(32, 4)
    q = apply_rope(layer.q_proj(x).view(2, 7, 4, 4).transpose(1, 2), cos, sin)
    yn = F.layer_norm(y, (16,), layer.kv_norm.weight, layer.kv_norm.bias, layer.kv_norm.eps)
    k = apply_rope(layer.k_proj(yn).view(2, 7, 2, 4).transpose(1, 2), cos, sin).repeat_interleave(2, 1)
    v = layer.v_proj(yn).view(2, 7, 2, 4).transpose(1, 2).repeat_interleave(2, 1)
    scores = q @ k.transpose(-1, -2) / 2.0  # (B, H, T, T), sqrt(head_dim) = 2
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, 16)
    assert torch.allclose(layer(x, y), layer.o_proj(out))


def test_causal():
    m = small_lm()
    ids = torch.randint(11, (1, 12))
    changed = ids.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % 11
    a, b = m(ids), m(changed)
    assert torch.allclose(a[0, :7], b[0, :7])
    assert not torch.allclose(a[0, 7], b[0, 7])


@pytest.mark.parametrize("T, n_kv_heads, rope", [(1, None, True), (13, None, True), (20, 2, True), (9, 1, False)])
def test_last_position_inference_equals_full_forward(T, n_kv_heads, rope):
    m = small_lm(n_kv_heads=n_kv_heads, rope=rope)
    ids = torch.randint(11, (3, T))
    with torch.no_grad():
        full, last = m(ids)[:, -1], m.last_logits(ids)
    assert torch.allclose(full, last, rtol=1e-10, atol=1e-12), (full - last).abs().max()


def test_last_position_inference_reads_every_earlier_token():
    m = small_lm()
    ids = torch.randint(11, (1, 10))
    for j in range(10):
        changed = ids.clone()
        changed[0, j] = (changed[0, j] + 1) % 11
        assert not torch.allclose(m.last_logits(ids), m.last_logits(changed)), j


def test_parameter_count_equals_standard_plus_layernorms():
    for dim, n_layers, n_kv in [(64, 4, None), (32, 2, 2), (48, 3, 1)]:
        std = attention_lm(65, dim, n_layers, 4, n_kv)
        inatt = inattention_lm(65, dim, n_layers, 4, n_kv)
        assert count_params(inatt) == count_params(std) + n_layers * 2 * dim
    assert count_params(inattention_lm(65)) == 205_504


def test_attention_pair_counts_against_enumeration():
    for T in [1, 2, 5, 64, 100]:
        causal = sum(1 for t in range(T) for s in range(T) if s <= t)  # every position, causal
        last_only = sum(1 for s in range(T) if s <= T - 1)  # the last query only
        assert attention_pairs(T, "standard") == causal == (T * T + T) // 2
        assert attention_pairs(T, "inattention") == last_only == T
    with pytest.raises(ValueError, match="standard"):
        attention_pairs(4, "mamba")
    with pytest.raises(ValueError, match="at least 1"):
        attention_pairs(0, "standard")


def test_backward_reaches_every_parameter():
    m = small_lm().float().train()
    ids = torch.randint(11, (2, 8))
    loss = F.cross_entropy(m(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_errors_say_what_to_do():
    m = small_lm(max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        m(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="batch dimension"):
        m.last_logits(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="n_kv_heads"):
        InAttention(16, 4, 3)
    layer = InAttention(16, 4)
    with pytest.raises(ValueError, match="forward_last"):
        layer(torch.randn(1, 3, 16), torch.randn(1, 4, 16))
    with pytest.raises(ValueError, match=r"\(B, 1, dim\)"):
        layer.forward_last(torch.randn(1, 2, 16), torch.randn(1, 4, 16))


def test_peak_memory_measures_live_tensors_on_cpu():
    def work():
        a = torch.ones(1000, 1000)  # 4,000,000 bytes
        b = torch.ones(500, 1000)  # 2,000,000
        del a
        c = torch.ones(2000, 1000)  # 8,000,000: live b + c = 10,000,000 is the peak
        return b.sum() + c.sum()

    peak = peak_memory_bytes(work)
    assert 10_000_000 <= peak < 10_000_100, peak  # + a few bytes for the scalar sums
    with pytest.raises(ValueError, match="cpu"):
        peak_memory_bytes(work, device="meta")


def test_last_position_prefill_uses_less_memory_and_grows_linearly():
    torch.manual_seed(0)
    std, inatt = attention_lm(11, 16, 2, 2, max_len=1024).eval(), inattention_lm(11, 16, 2, 2, max_len=1024).eval()
    with torch.no_grad():
        mem = {}
        for T in (256, 1024):
            ids = torch.randint(11, (1, T))
            mem[T] = (peak_memory_bytes(lambda: std(ids)[:, -1]), peak_memory_bytes(lambda: inatt.last_logits(ids)))
    assert mem[1024][1] < mem[1024][0]
    assert 3.0 < mem[1024][1] / mem[256][1] < 5.0  # 4x the tokens, about 4x the bytes
