"""Cache and state sizing for attention, recurrent and hybrid models, with published configurations."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = [
    "KiB", "MiB", "GiB", "GB", "dtype_bytes", "to_unit", "format_binary", "format_decimal",
    "layer_types", "attention_layer_indices", "layer_types_from_pattern",
    "kv_bytes_per_token", "kv_cache_bytes", "mla_bytes_per_token",
    "linear_state_bytes", "mamba_state_bytes", "conv_state_bytes",
    "hybrid_memory_bytes", "crossover_context", "ModelConfig", "CONFIGS", "get_config",
]

# Units. Binary units (KiB, MiB, GiB) are powers of 2; decimal units (kB, MB, GB) powers of 10.
KiB, MiB, GiB = 2**10, 2**20, 2**30
KB, MB, GB = 10**3, 10**6, 10**9
_UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": 2**40,
          "kB": KB, "KB": KB, "MB": MB, "GB": GB, "TB": 10**12}

# Bytes per stored number. Names follow torch (float16, bfloat16, ...) plus common short forms.
_DTYPE_BYTES = {
    "float64": 8, "double": 8, "fp64": 8,
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1, "uint8": 1,
}
ATTENTION, RECURRENT, MLP = "attention", "recurrent", "mlp"


def dtype_bytes(dtype) -> int:
    """Bytes per element of ``dtype``: a torch dtype (``torch.bfloat16``) or a string ("bf16", "fp32").

    bf16/fp16 = 2, fp32 = 4, fp8/int8 = 1, fp64 = 8. Raises ``ValueError`` for anything else.
    torch is not imported: a torch dtype is recognised by its name ("torch.bfloat16").
    """
    name = str(dtype).lower().removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use a torch dtype or one of {sorted(_DTYPE_BYTES)}.")
    return _DTYPE_BYTES[name]


def to_unit(n_bytes: int, unit: str) -> float:
    """``n_bytes`` expressed in ``unit``: "KiB"/"MiB"/"GiB" (powers of 2) or "kB"/"MB"/"GB" (powers of 10)."""
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r}; choose from {list(_UNITS)}.")
    return n_bytes / _UNITS[unit]


def _format(n_bytes: int, units: tuple[str, ...], digits: int) -> str:
    for unit in reversed(units):
        if n_bytes >= _UNITS[unit]:
            return f"{to_unit(n_bytes, unit):,.{digits}f} {unit}"
    return f"{n_bytes:,} B"


def format_binary(n_bytes: int, digits: int = 2) -> str:
    """Human-readable size in powers of 2 (B, KiB, MiB, GiB, TiB): 16384 -> '16.00 KiB'."""
    return _format(n_bytes, ("KiB", "MiB", "GiB", "TiB"), digits)


def format_decimal(n_bytes: int, digits: int = 2) -> str:
    """Human-readable size in powers of 10 (B, kB, MB, GB, TB): 10737418240 -> '10.74 GB'."""
    return _format(n_bytes, ("kB", "MB", "GB", "TB"), digits)


def _check_int(name: str, value, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value


# ----------------------------------------------------------------------------- layer patterns
def layer_types(n_layers: int, period: int, offset: int) -> list[str]:
    """Per-layer mixer kind of a periodic hybrid: layer i is "attention" when i % period == offset.

    Every other layer is "recurrent" (fixed-size state: Mamba, linear attention, Gated DeltaNet...).
    Layers count from 0, as in Hugging Face configs: Jamba's ``attn_layer_period=8``,
    ``attn_layer_offset=4`` gives attention at 4, 12, 20, 28 (Lieber et al. 2024, arXiv:2403.19887).
    Raises ``ValueError`` when n_layers < 1, period < 1 or offset is not in [0, period).
    """
    _check_int("n_layers", n_layers, 1)
    _check_int("period", period, 1)
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < period:
        raise ValueError(f"offset must be an integer in [0, period={period}), got {offset!r}.")
    return [ATTENTION if i % period == offset else RECURRENT for i in range(n_layers)]


def attention_layer_indices(n_layers: int, period: int, offset: int) -> list[int]:
    """Indices (from 0) of the attention layers of ``layer_types(n_layers, period, offset)``."""
    return [i for i, kind in enumerate(layer_types(n_layers, period, offset)) if kind == ATTENTION]


def layer_types_from_pattern(pattern: str, attention: str = "*", recurrent: str = "M",
                             mlp: str = "-") -> list[str]:
    """Layer kinds from a one-character-per-layer pattern such as Nemotron-H's
    ``hybrid_override_pattern`` ("M" Mamba-2, "*" attention, "-" MLP only). Raises ``ValueError``
    on any other character."""
    table = {attention: ATTENTION, recurrent: RECURRENT, mlp: MLP}
    bad = sorted(set(pattern) - set(table))
    if bad:
        raise ValueError(f"pattern has unknown layer symbols {bad}; expected {list(table)}.")
    return [table[ch] for ch in pattern]


# ----------------------------------------------------------------------------- growing caches
def kv_bytes_per_token(n_attn_layers: int, n_kv_heads: int, head_dim: int, dtype="bf16") -> int:
    """KV-cache bytes added per token: 2 (K and V) * n_attn_layers * n_kv_heads * head_dim * bytes.

    GQA/MQA shrink n_kv_heads (Ainslie et al. 2023, arXiv:2305.13245). Only softmax-attention
    layers count; recurrent layers add nothing per token. Raises ``ValueError`` on negative sizes
    or an unknown dtype.
    """
    for name, value in (("n_attn_layers", n_attn_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
        _check_int(name, value)
    return 2 * n_attn_layers * n_kv_heads * head_dim * dtype_bytes(dtype)


def _cached_tokens(context: int, window: int | None) -> int:
    _check_int("context", context)
    if window is None:
        return context
    return min(context, _check_int("window", window, 1))  # sliding window: only the last `window` tokens


def kv_cache_bytes(n_attn_layers: int, n_kv_heads: int, head_dim: int, context: int,
                   dtype="bf16", window: int | None = None) -> int:
    """KV-cache bytes for one sequence of ``context`` tokens: per-token bytes * min(context, window).

    ``window`` caps the cache for sliding-window attention (Mistral 7B keeps 4,096 tokens, Jiang et
    al. 2023, arXiv:2310.06825). Raises ``ValueError`` for a negative context or window < 1.
    """
    return kv_bytes_per_token(n_attn_layers, n_kv_heads, head_dim, dtype) * _cached_tokens(context, window)


def mla_bytes_per_token(n_attn_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype="bf16") -> int:
    """Multi-head latent attention cache per token: n_attn_layers * (kv_lora_rank + qk_rope_head_dim) * bytes.

    MLA caches one compressed latent c_KV (shared by K and V, so no factor 2) and one decoupled
    RoPE key per layer (DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434, Sec. 2.1).
    """
    for name, value in (("n_attn_layers", n_attn_layers), ("kv_lora_rank", kv_lora_rank),
                        ("qk_rope_head_dim", qk_rope_head_dim)):
        _check_int(name, value)
    return n_attn_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes(dtype)


# ----------------------------------------------------------------------------- fixed states
def linear_state_bytes(n_heads: int, d_k: int, d_v: int, dtype="bf16") -> int:
    """One linear-attention layer's state S: n_heads matrices of (d_k, d_v), whatever the context.

    Covers linear attention, Gated DeltaNet (Yang et al. 2024, arXiv:2412.06464; n_heads = value
    heads), KDA and lightning attention. The short-convolution buffers are separate
    (``conv_state_bytes``).
    """
    for name, value in (("n_heads", n_heads), ("d_k", d_k), ("d_v", d_v)):
        _check_int(name, value)
    return n_heads * d_k * d_v * dtype_bytes(dtype)


def mamba_state_bytes(d_inner: int, d_state: int, dtype="bf16") -> int:
    """One Mamba layer's SSM state h: d_inner channels * d_state numbers (Gu & Dao 2023, arXiv:2312.00752).

    For Mamba-2, d_inner = n_heads * head_dim (Dao & Gu 2024, arXiv:2405.21060). Many servers keep
    this state in fp32: pass dtype="fp32" to count that.
    """
    _check_int("d_inner", d_inner)
    _check_int("d_state", d_state)
    return d_inner * d_state * dtype_bytes(dtype)


def conv_state_bytes(channels: int, kernel: int, dtype="bf16") -> int:
    """Causal short-convolution buffer: the last (kernel - 1) inputs of each channel."""
    _check_int("channels", channels)
    _check_int("kernel", kernel, 1)
    return channels * (kernel - 1) * dtype_bytes(dtype)


# ----------------------------------------------------------------------------- hybrids
def hybrid_memory_bytes(layers, context: int, n_kv_heads: int, head_dim: int,
                        state_bytes_per_layer: int, dtype="bf16", window: int | None = None) -> dict:
    """Cache and state of a hybrid for one sequence, given its per-layer kinds.

    Args:
        layers: list of "attention" / "recurrent" / "mlp" per layer, e.g. ``layer_types(32, 8, 4)``.
        context: tokens in the sequence. n_kv_heads, head_dim: attention geometry.
        state_bytes_per_layer: fixed bytes of one recurrent layer (``linear_state_bytes`` ...).
        dtype: of the KV cache. window: sliding-window cap, or None.
    Returns:
        dict of ints (bytes): ``kv_cache_bytes`` (grows with context), ``state_bytes`` (fixed),
        ``total_bytes``, plus ``n_attention_layers`` and ``n_recurrent_layers``.
    """
    kinds = list(layers)
    unknown = sorted(set(kinds) - {ATTENTION, RECURRENT, MLP})
    if unknown:
        raise ValueError(f"unknown layer kinds {unknown}; use 'attention', 'recurrent' or 'mlp'.")
    n_attn, n_rec = kinds.count(ATTENTION), kinds.count(RECURRENT)
    cache = kv_cache_bytes(n_attn, n_kv_heads, head_dim, context, dtype, window)
    state = n_rec * _check_int("state_bytes_per_layer", state_bytes_per_layer)
    return {"kv_cache_bytes": cache, "state_bytes": state, "total_bytes": cache + state,
            "n_attention_layers": n_attn, "n_recurrent_layers": n_rec}


def crossover_context(kv_per_token: int, state_bytes: int, window: int | None = None) -> int | None:
    """Smallest context T at which the growing cache reaches the fixed state: ceil(state / per-token).

    Beyond T the cache is the larger part of a hybrid's memory. Returns 0 when there is no state,
    and None when the cache can never reach it (no attention layers, or a window that caps the
    cache below the state). (Lesson 04's crossover exercise asks for this number: its test checks
    the student's function against this one.)
    """
    _check_int("kv_per_token", kv_per_token)
    _check_int("state_bytes", state_bytes)
    if state_bytes == 0:
        return 0
    if kv_per_token == 0:
        return None
    tokens = math.ceil(state_bytes / kv_per_token)
    return None if window is not None and tokens > window else tokens


# ----------------------------------------------------------------------------- configurations
@dataclass(frozen=True)
class ModelConfig:
    """Geometry of one published model, enough to size its cache and state.

    ``layers`` gives each layer's kind ("attention" keeps a KV cache, "recurrent" a fixed state,
    "mlp" neither). Attention layers use either K/V heads (``n_kv_heads`` x ``head_dim``) or, when
    ``mla_dims`` is set, MLA's (latent, rope) numbers per token. ``state_elements`` counts the
    numbers in one recurrent layer's state (S or h); ``conv_elements`` its convolution buffer.
    ``source`` names the config file and fields (or paper table) every number came from.
    """
    name: str
    layers: tuple[str, ...]
    n_heads: int
    n_kv_heads: int
    head_dim: int
    source: str
    state_elements: int = 0
    conv_elements: int = 0
    state_kind: str = ""
    window: int | None = None
    mla_dims: tuple[int, int] | None = None
    note: str = ""

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layers) if kind == ATTENTION]

    @property
    def n_recurrent_layers(self) -> int:
        return self.layers.count(RECURRENT)

    def kv_bytes_per_token(self, dtype="bf16") -> int:
        """Cache bytes added per token (MLA latent formula when ``mla_dims`` is set)."""
        n_attn = len(self.attention_layers)
        if self.mla_dims is not None:
            return mla_bytes_per_token(n_attn, *self.mla_dims, dtype=dtype)
        return kv_bytes_per_token(n_attn, self.n_kv_heads, self.head_dim, dtype)

    def cache_bytes(self, context: int, dtype="bf16", use_window: bool = True) -> int:
        """Cache bytes at ``context`` tokens; ``use_window=False`` ignores a sliding window."""
        window = self.window if use_window else None
        return self.kv_bytes_per_token(dtype) * _cached_tokens(context, window)

    def state_bytes(self, dtype="bf16", include_conv: bool = False) -> int:
        """Fixed recurrent bytes of all recurrent layers; by default the state matrices only."""
        per_layer = self.state_elements + (self.conv_elements if include_conv else 0)
        return self.n_recurrent_layers * per_layer * dtype_bytes(dtype)

    def total_bytes(self, context: int, dtype="bf16", include_conv: bool = False) -> int:
        return self.cache_bytes(context, dtype) + self.state_bytes(dtype, include_conv)

    def crossover_context(self, dtype="bf16", include_conv: bool = False) -> int | None:
        """Context where this model's cache reaches its fixed state (see ``crossover_context``)."""
        return crossover_context(self.kv_bytes_per_token(dtype), self.state_bytes(dtype, include_conv),
                                 self.window)

    def as_pure_attention(self) -> "ModelConfig":
        """The same geometry with every mixer layer made attention (what the hybrid saves)."""
        layers = tuple(ATTENTION if kind == RECURRENT else kind for kind in self.layers)
        return dataclasses.replace(self, name=f"{self.name} (all attention)", layers=layers,
                                   state_elements=0, conv_elements=0, state_kind="")


def _mamba(d_inner, d_state, d_conv, n_groups=0):
    """(state elements, conv elements) of one Mamba layer; n_groups > 0 means Mamba-2 (B, C convolved)."""
    return d_inner * d_state, (d_inner + 2 * n_groups * d_state) * (d_conv - 1)


def _dense(name, n_layers, n_heads, n_kv_heads, head_dim, source, **kw):
    return ModelConfig(name, (ATTENTION,) * n_layers, n_heads, n_kv_heads, head_dim, source, **kw)


def _build_configs() -> dict[str, ModelConfig]:
    hf = "huggingface.co/{}/blob/main/config.json"
    c = {}
    s, conv = _mamba(d_inner=2 * 4096, d_state=16, d_conv=4)
    c["jamba-v0.1"] = ModelConfig(
        "Jamba v0.1", tuple(layer_types(32, 8, 4)), 32, 8, 4096 // 32, hf.format("ai21labs/Jamba-v0.1")
        + ": num_hidden_layers=32, attn_layer_period=8, attn_layer_offset=4, num_attention_heads=32,"
        " num_key_value_heads=8, hidden_size=4096 (head_dim 4096/32), mamba_expand=2, mamba_d_state=16,"
        " mamba_d_conv=4; Lieber et al. 2024 (arXiv:2403.19887) Table 1 (KV cache at 256K).",
        s, conv, "Mamba-1")
    gdn_conv = (2 * 16 * 128 + 32 * 128) * (4 - 1)  # q, k (16 heads) and v (32 heads) are convolved
    c["qwen3-next-80b-a3b"] = ModelConfig(
        "Qwen3-Next-80B-A3B", tuple(layer_types(48, 4, 3)), 16, 2, 256,
        hf.format("Qwen/Qwen3-Next-80B-A3B-Instruct") + ": num_hidden_layers=48, full_attention_interval=4"
        " (layers 3, 7, ..., 47), num_attention_heads=16, num_key_value_heads=2, head_dim=256,"
        " linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128,"
        " linear_value_head_dim=128, linear_conv_kernel_dim=4.",
        32 * 128 * 128, gdn_conv, "Gated DeltaNet")
    kimi_mla = {3, 7, 11, 15, 19, 23, 26}  # full_attn_layers [4, 8, ..., 24, 27] are 1-based
    c["kimi-linear-48b-a3b"] = ModelConfig(
        "Kimi Linear 48B-A3B", tuple(ATTENTION if i in kimi_mla else RECURRENT for i in range(27)),
        32, 32, 128, hf.format("moonshotai/Kimi-Linear-48B-A3B-Instruct") + ": num_hidden_layers=27,"
        " linear_attn_config.full_attn_layers=[4,8,12,16,20,24,27] (1-based, MLA), kda_layers = the other"
        " 20, linear_attn_config.num_heads=32, head_dim=128, short_conv_kernel_size=4; kv_lora_rank=512,"
        " qk_rope_head_dim=64. Kimi Team 2025, arXiv:2510.26692.",
        32 * 128 * 128, 3 * 32 * 128 * (4 - 1), "KDA", mla_dims=(512, 64))
    c["minimax-text-01"] = ModelConfig(
        "MiniMax-Text-01", tuple(layer_types(80, 8, 7)), 64, 8, 128,
        hf.format("MiniMaxAI/MiniMax-Text-01") + ": num_hidden_layers=80, attn_type_list with 1"
        " (softmax) at every 8th layer (7, 15, ..., 79), num_attention_heads=64, num_key_value_heads=8,"
        " head_dim=128. MiniMax 2025, arXiv:2501.08313.", 64 * 128 * 128, 0, "lightning attention",
        note="Values read from the VL-01 text config (same backbone) in a transformers test and secondary "
             "summaries, not the config file itself; lightning state assumed to be 64 heads of 128 x 128.")
    nemo = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    s, conv = _mamba(d_inner=128 * 64, d_state=128, d_conv=4, n_groups=8)
    c["nemotron-h-8b"] = ModelConfig(
        "Nemotron-H-8B", tuple(layer_types_from_pattern(nemo)), 32, 8, 128,
        hf.format("nvidia/Nemotron-H-8B-Base-8K") + f": hybrid_override_pattern={nemo!r} (52 layers: 24 M,"
        " 4 *, 24 -), num_attention_heads=32, num_key_value_heads=8, attention_head_dim=128,"
        " mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4."
        " NVIDIA 2025, arXiv:2504.03624.", s, conv, "Mamba-2")
    s, conv = _mamba(d_inner=128 * 64, d_state=128, d_conv=4, n_groups=1)
    c["granite-4.0-h-small"] = ModelConfig(
        "Granite-4.0-H-Small", tuple(layer_types(40, 10, 5)), 32, 8, 4096 // 32,
        hf.format("ibm-granite/granite-4.0-h-small") + ": num_hidden_layers=40, layer_types = 36 mamba +"
        " 4 attention, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, mamba_d_state=128,"
        " mamba_d_conv=4, mamba_expand=2.", s, conv, "Mamba-2",
        note="Count of 4 attention layers verified; their positions (5, 15, 25, 35: one per 9 Mamba) and "
             "mamba_n_heads=128, mamba_d_head=64, mamba_n_groups=1 are not verified against the file.")
    s, conv = _mamba(d_inner=2 * 2816, d_state=16, d_conv=4)
    c["samba-3.8b"] = ModelConfig(
        "Samba 3.8B", (RECURRENT, MLP, ATTENTION, MLP) * 16, 11, 1, 2816 // 11,
        "Ren et al. 2024, Samba, arXiv:2406.07522, Table 10 (3.8B): N=64 layers (Mamba-MLP-SWA-MLP),"
        " width 2816, 11 query heads, 1 key-value head, sliding window 2048.", s, conv, "Mamba-1",
        window=2048, note="Mamba expansion 2, d_state 16 and kernel 4 are the Mamba defaults, not in Table 10.")
    c["llama-2-7b"] = _dense("Llama-2 7B", 32, 32, 32, 128, hf.format("meta-llama/Llama-2-7b-hf")
                             + ": num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,"
                             " hidden_size=4096 (MHA).")
    c["llama-2-70b"] = _dense("Llama-2 70B", 80, 64, 8, 128, hf.format("meta-llama/Llama-2-70b-hf")
                              + ": num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,"
                              " hidden_size=8192.")
    c["llama-3-8b"] = _dense("Llama-3 8B", 32, 32, 8, 128, hf.format("meta-llama/Meta-Llama-3-8B")
                             + ": num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,"
                             " hidden_size=4096.")
    c["mistral-7b"] = _dense("Mistral 7B", 32, 32, 8, 128, hf.format("mistralai/Mistral-7B-v0.1")
                             + ": num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,"
                             " hidden_size=4096, sliding_window=4096. Jiang et al. 2023, arXiv:2310.06825.",
                             window=4096)
    c["mixtral-8x7b"] = _dense("Mixtral 8x7B", 32, 32, 8, 128, hf.format("mistralai/Mixtral-8x7B-v0.1")
                               + ": num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,"
                               " hidden_size=4096; full attention over 32K (Jiang et al. 2024, arXiv:2401.04088).")
    c["deepseek-v2"] = _dense("DeepSeek-V2", 60, 128, 128, 128, hf.format("deepseek-ai/DeepSeek-V2")
                              + ": num_hidden_layers=60, num_attention_heads=128, kv_lora_rank=512,"
                              " qk_rope_head_dim=64. DeepSeek-AI 2024, arXiv:2405.04434.", mla_dims=(512, 64))
    return c


CONFIGS: dict[str, ModelConfig] = _build_configs()


def get_config(name: str) -> ModelConfig:
    """The ``CONFIGS`` entry for ``name`` (case-insensitive); ``KeyError`` lists the known names."""
    key = name.lower()
    if key not in CONFIGS:
        raise KeyError(f"no configuration {name!r}; known: {', '.join(CONFIGS)}.")
    return CONFIGS[key]
