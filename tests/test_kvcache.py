"""mlexp.kvcache: the syllabus figures recomputed from the configuration table, units and errors."""
import dataclasses

import pytest
import torch

from mlexp import kvcache as kc
from mlexp.kvcache import CONFIGS, GiB, KiB, MiB

T_256K = 256 * 1024  # "256K" in the Jamba paper is 2**18 = 262,144 tokens


# ----------------------------------------------------------------------------- the Jamba paper table
@pytest.mark.parametrize("name, gib", [("llama-2-7b", 128), ("mistral-7b", 32), ("mixtral-8x7b", 32),
                                       ("jamba-v0.1", 4)])
def test_jamba_paper_table_at_256k(name, gib):
    # Lieber et al. 2024, Table 1: KV cache at 256K context, 16-bit, in "GB" that are GiB.
    # The table keeps every token, so Mistral's sliding window is ignored there.
    got = CONFIGS[name].cache_bytes(T_256K, "bf16", use_window=False)
    assert got == gib * GiB
    assert kc.format_binary(got, digits=0) == f"{gib} GiB"


def test_jamba_table_gb_is_gib_not_decimal():
    llama = CONFIGS["llama-2-7b"].cache_bytes(T_256K, "fp16")
    assert round(kc.to_unit(llama, "GiB")) == 128
    assert round(kc.to_unit(llama, "GB"), 1) == 137.4  # the same bytes in powers of 10


def test_jamba_geometry_and_cache():
    jamba = CONFIGS["jamba-v0.1"]
    assert jamba.n_layers == 32 and jamba.attention_layers == [4, 12, 20, 28]
    assert jamba.kv_bytes_per_token("bf16") == 16 * KiB
    assert jamba.cache_bytes(T_256K, torch.bfloat16) == 4 * GiB
    # Same geometry with every layer attention: 8x the cache.
    assert jamba.as_pure_attention().cache_bytes(T_256K) == 32 * GiB


def test_mistral_window_caps_the_cache():
    mistral = CONFIGS["mistral-7b"]
    assert mistral.window == 4096
    per_token = mistral.kv_bytes_per_token()
    assert mistral.cache_bytes(4096) == mistral.cache_bytes(T_256K) == 4096 * per_token
    assert mistral.cache_bytes(1000) == 1000 * per_token
    assert mistral.cache_bytes(T_256K) == 512 * MiB


# ----------------------------------------------------------------------------- Qwen3-Next
def test_qwen3_next_cache_state_and_crossover():
    qwen = CONFIGS["qwen3-next-80b-a3b"]
    assert len(qwen.attention_layers) == 12 and qwen.n_recurrent_layers == 36
    assert qwen.attention_layers[:3] == [3, 7, 11]
    assert qwen.kv_bytes_per_token("bf16") == 24 * KiB
    assert qwen.state_bytes("bf16") == 36 * MiB
    assert qwen.state_bytes("bf16") == 36 * kc.linear_state_bytes(32, 128, 128, "bf16")
    assert qwen.crossover_context("bf16") == 1536
    assert qwen.cache_bytes(1536) == qwen.state_bytes()
    assert qwen.cache_bytes(1535) < qwen.state_bytes() < qwen.cache_bytes(1537)
    # The state does not depend on the context; the convolution buffers add a little on top.
    assert qwen.total_bytes(10) - qwen.cache_bytes(10) == qwen.total_bytes(10**6) - qwen.cache_bytes(10**6)
    assert qwen.state_bytes(include_conv=True) > qwen.state_bytes()


# ----------------------------------------------------------------------------- dense and MLA
def test_llama_per_token_figures():
    assert CONFIGS["llama-2-70b"].kv_bytes_per_token("bf16") == 320 * KiB
    assert CONFIGS["llama-2-7b"].kv_bytes_per_token("bf16") == 512 * KiB
    llama3 = CONFIGS["llama-3-8b"]
    assert llama3.kv_bytes_per_token("fp16") == 131_072 == 128 * KiB  # lesson 00 exercise
    mha = dataclasses.replace(llama3, n_kv_heads=32)
    assert mha.kv_bytes_per_token("fp16") == 4 * 131_072


def test_lesson00_70b_scale_mha_gqa_mqa():
    # 70B scale: 80 layers, head 128, 4,096 tokens, 2 bytes; kv heads 64 (MHA), 8 (GQA), 1 (MQA).
    llama70 = CONFIGS["llama-2-70b"]
    sizes = {kv: kc.kv_cache_bytes(len(llama70.attention_layers), kv, llama70.head_dim, 4096, "fp16")
             for kv in (llama70.n_heads, llama70.n_kv_heads, 1)}
    assert [kc.format_decimal(sizes[kv]) for kv in (64, 8, 1)] == ["10.74 GB", "1.34 GB", "167.77 MB"]
    assert [round(sizes[kv] / 1e9, 2) for kv in (64, 8, 1)] == [10.74, 1.34, 0.17]


def test_deepseek_v2_mla_caches_576_numbers_per_layer():
    ds = CONFIGS["deepseek-v2"]
    assert sum(ds.mla_dims) == 576
    assert ds.kv_bytes_per_token("bf16") == 60 * 576 * 2
    assert kc.mla_bytes_per_token(1, 512, 64, "fp32") == 576 * 4  # no factor 2: K and V share the latent
    assert ds.kv_bytes_per_token() < kc.kv_bytes_per_token(60, ds.n_heads, ds.head_dim) / 50


# ----------------------------------------------------------------------------- other hybrids
@pytest.mark.parametrize("name, n_attn, n_layers", [
    ("kimi-linear-48b-a3b", 7, 27), ("minimax-text-01", 10, 80), ("nemotron-h-8b", 4, 52),
    ("granite-4.0-h-small", 4, 40), ("jamba-v0.1", 4, 32), ("qwen3-next-80b-a3b", 12, 48)])
def test_hybrid_layer_counts(name, n_attn, n_layers):
    cfg = CONFIGS[name]
    assert cfg.n_layers == n_layers and len(cfg.attention_layers) == n_attn
    assert cfg.state_bytes() > 0 and cfg.crossover_context() > 0


def test_kimi_linear_uses_mla_and_kda():
    kimi = CONFIGS["kimi-linear-48b-a3b"]
    assert kimi.attention_layers == [3, 7, 11, 15, 19, 23, 26] and kimi.n_recurrent_layers == 20
    assert kimi.kv_bytes_per_token("bf16") == 7 * 576 * 2
    assert kimi.state_bytes("bf16") == 20 * kc.linear_state_bytes(32, 128, 128, "bf16")


def test_nemotron_pattern_and_mamba2_state():
    nemo = CONFIGS["nemotron-h-8b"]
    assert nemo.layers.count("mlp") == 24 and nemo.n_recurrent_layers == 24
    assert nemo.state_bytes("fp32") == 24 * kc.mamba_state_bytes(128 * 64, 128, "fp32")


def test_samba_sliding_window_and_every_entry_cites_a_source():
    samba = CONFIGS["samba-3.8b"]
    assert samba.window == 2048
    assert samba.cache_bytes(T_256K) == samba.cache_bytes(2048) < samba.cache_bytes(T_256K, use_window=False)
    assert samba.crossover_context() == kc.crossover_context(samba.kv_bytes_per_token(), samba.state_bytes())
    for cfg in CONFIGS.values():
        assert "arXiv" in cfg.source or "config.json" in cfg.source, cfg.name
    assert kc.get_config("Mistral-7B") is CONFIGS["mistral-7b"]
    with pytest.raises(KeyError, match="known"):
        kc.get_config("gpt-5")


# ----------------------------------------------------------------------------- pure functions
def test_layer_types_and_hybrid_total():
    types = kc.layer_types(8, 4, 1)
    assert types == ["recurrent", "attention", "recurrent", "recurrent"] * 2
    assert kc.attention_layer_indices(10, 3, 0) == [0, 3, 6, 9]
    mem = kc.hybrid_memory_bytes(types, 100, n_kv_heads=2, head_dim=4, state_bytes_per_layer=1000, dtype="fp32")
    assert mem["kv_cache_bytes"] == 2 * 2 * 2 * 4 * 100 * 4
    assert mem["state_bytes"] == 6 * 1000 and mem["total_bytes"] == mem["kv_cache_bytes"] + 6000
    # An explicit list works the same way as a period/offset pattern.
    assert kc.hybrid_memory_bytes(["attention"] * 2 + ["recurrent"] * 6, 100, 2, 4, 1000, "fp32") == mem


def test_dtypes_units_and_formatting():
    assert kc.dtype_bytes("bf16") == kc.dtype_bytes(torch.float16) == 2
    assert kc.dtype_bytes("fp32") == kc.dtype_bytes(torch.float32) == 4
    assert kc.kv_bytes_per_token(32, 8, 128, "fp32") == 2 * kc.kv_bytes_per_token(32, 8, 128, "bf16")
    assert kc.format_binary(16 * KiB) == "16.00 KiB" and kc.format_binary(512) == "512 B"
    assert kc.format_decimal(1_340_000_000) == "1.34 GB"


def test_crossover_edge_cases():
    assert kc.crossover_context(100, 0) == 0            # pure attention: the cache wins at once
    assert kc.crossover_context(0, 1000) is None        # pure recurrent: the cache never grows
    assert kc.crossover_context(100, 1001) == 11        # rounded up to whole tokens
    assert kc.crossover_context(100, 10_000, window=50) is None
    assert kc.kv_cache_bytes(4, 8, 128, 0) == 0


@pytest.mark.parametrize("call, match", [
    (lambda: kc.kv_cache_bytes(4, 8, 128, -1), "context"),
    (lambda: kc.kv_bytes_per_token(4, 8, 128, "fp12"), "unknown dtype"),
    (lambda: kc.dtype_bytes(torch.int32), "unknown dtype"),
    (lambda: kc.layer_types(32, 0, 0), "period"),
    (lambda: kc.layer_types(32, -8, 0), "period"),
    (lambda: kc.layer_types(32, 8, 8), "offset"),
    (lambda: kc.layer_types(32, 8, -1), "offset"),
    (lambda: kc.layer_types(0, 8, 4), "n_layers"),
    (lambda: kc.kv_cache_bytes(4, 8, 128, 10, window=0), "window"),
    (lambda: kc.layer_types_from_pattern("MM*x"), "unknown layer symbols"),
    (lambda: kc.hybrid_memory_bytes(["attention", "ssm"], 10, 1, 1, 1), "unknown layer kinds"),
    (lambda: kc.to_unit(10, "GiBs"), "unknown unit"),
    (lambda: kc.kv_bytes_per_token(4.5, 8, 128), "n_attn_layers"),
])
def test_bad_input_raises_clear_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
