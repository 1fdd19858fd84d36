"""Transformer parts: RMSNorm, SwiGLU, RoPE, causal attention with n_kv_heads, blocks and a small LM."""
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "RMSNorm",
    "SwiGLU",
    "rope_cache",
    "apply_rope",
    "Attention",
    "Block",
    "TinyLM",
    "attention_lm",
    "default_ffn_hidden",
]


class RMSNorm(nn.Module):
    """Root-mean-square norm: x / sqrt(mean(x^2) + eps) * weight, over the last dimension.

    Shapes: (..., dim) -> (..., dim), same dtype (computed in float32 for bf16/fp16 inputs).
    Source: Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., dim)
        return x32.type_as(x) * self.weight


class SwiGLU(nn.Module):
    """Gated feed-forward: w_down(silu(w_gate x) * w_up x), no biases; 3 * dim * hidden parameters.

    Shapes: (..., dim) -> (..., dim) through a hidden width ``hidden``.
    Source: Shazeer, "GLU Variants Improve Transformer", 2020.
    """

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))  # (..., hidden) -> (..., dim)


def default_ffn_hidden(dim: int) -> int:
    """SwiGLU hidden width 8/3 * dim, rounded down (170 at dim 64).

    Three matrices of 8/3 * dim match the 8 * dim^2 parameters of a classic 4 * dim MLP
    (the LLaMA convention). For the lesson-00 char LM (vocab 65, width 64, 4 attention blocks)
    this gives 204,992 parameters, the syllabus's "~205k".
    """
    return int(8 * dim / 3)


# ---------------------------------------------------------------------------------------------
# Rotary position embedding (RoPE)
# ---------------------------------------------------------------------------------------------


def rope_cache(seq_len: int, head_dim: int, base: float = 10000.0, device=None, dtype=torch.float32):
    """Cosines and sines of the RoPE angles, each of shape (seq_len, head_dim // 2).

    Position m and frequency i give the angle m * base^(-2i / head_dim) (radians).
    Raises ``ValueError`` for an odd ``head_dim``.
    Source: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE rotates pairs of features, so head_dim must be even, got {head_dim}.")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float64), inv_freq)  # (T, D/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin, offset: int = 0):
    """Rotate each pair of features (i, i + D/2) of x by its position's angle.

    Args:
        x: (B, H, T, D) queries or keys, D even.
        cos, sin: (L, D/2) tables from ``rope_cache``; rows offset .. offset+T-1 are used, so a
            decoder can pass the position of its first new token as ``offset``.
    Returns:
        (B, H, T, D), same dtype as x. Norms are unchanged, and the dot product of a rotated
        query at position m with a rotated key at position n depends only on m - n.

    Pairs (i, i + D/2) as in GPT-NeoX and LLaMA; the RoFormer paper pairs neighbours (2i, 2i+1),
    which is the same rotation applied to a permutation of the features.
    Raises ``ValueError`` for a table of the wrong width or one too short for offset + T.
    """
    T, D = x.shape[-2], x.shape[-1]
    if cos.shape[-1] * 2 != D:
        raise ValueError(f"RoPE table has {cos.shape[-1]} frequencies but x has head_dim {D}; "
                         f"build it with rope_cache(seq_len, {D}).")
    if offset + T > cos.shape[0]:
        raise ValueError(f"RoPE table covers {cos.shape[0]} positions but positions up to "
                         f"{offset + T} are needed; build a longer one with rope_cache.")
    cos = cos[offset:offset + T].to(x.dtype)  # (T, D/2), broadcasts over (B, H)
    sin = sin[offset:offset + T].to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]  # (B, H, T, D/2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, H, T, D)


# ---------------------------------------------------------------------------------------------
# Causal attention with n_kv_heads: MHA (n_kv_heads = n_heads), GQA (fewer), MQA (one)
# ---------------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Causal softmax attention mixer, x (B, T, dim) -> (B, T, dim).

    ``n_heads`` query heads of width head_dim = dim / n_heads share ``n_kv_heads`` key/value
    heads (default: n_heads, i.e. multi-head attention); each group of n_heads / n_kv_heads
    consecutive query heads reads the same kv head. n_kv_heads = 1 is multi-query attention.
    RoPE on queries and keys when ``rope`` (positions up to ``max_len``).
    ``window`` (tokens) makes it sliding-window attention: position t sees positions t - window + 1
    .. t only, so a decoder keeps at most ``window`` keys and values per layer (Beltagy et al. 2020,
    Longformer; Jiang et al. 2023, Mistral 7B). None (the default) sees every earlier position.
    Parameters: 2 * dim^2 + 2 * dim * n_kv_heads * head_dim (no biases).

    Sources: Vaswani et al. 2017 (attention); Shazeer 2019 (MQA); Ainslie et al. 2023 (GQA).
    Raises ``ValueError`` when dim is not divisible by n_heads or n_heads by n_kv_heads, or for a
    window below 1.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int | None = None, rope: bool = True,
                 max_len: int = 1024, rope_base: float = 10000.0, window: int | None = None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a whole number of tokens >= 1 (or None), got {window!r}.")
        self.window = window
        if dim % n_heads:
            raise ValueError(f"dim={dim} must be divisible by n_heads={n_heads}.")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads} "
                             "(use n_kv_heads=n_heads for MHA, a divisor for GQA, 1 for MQA).")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.rope, self.max_len = rope, max_len
        self.q_proj = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        if rope:
            cos, sin = rope_cache(max_len, self.head_dim, rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)  # (max_len, head_dim/2)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        if self.rope and T > self.max_len:
            raise ValueError(f"Sequence of {T} tokens is longer than max_len={self.max_len}; "
                             "build Attention with a larger max_len.")
        # (B, T, dim) -> (B, T, heads, head_dim) -> (B, heads, T, head_dim)
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            q = apply_rope(q, self.rope_cos, self.rope_sin)
            k = apply_rope(k, self.rope_cos, self.rope_sin)
        group = self.n_heads // self.n_kv_heads
        if group > 1:  # (B, H_kv, T, D) -> (B, H, T, D): kv head j serves query heads j*group ..
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if self.window is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        else:  # query t sees keys s with 0 <= t - s < window: a band below the diagonal
            lag = torch.arange(T, device=x.device)[:, None] - torch.arange(T, device=x.device)[None, :]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=(lag >= 0) & (lag < self.window))
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))  # (B, T, dim)


# ---------------------------------------------------------------------------------------------
# Blocks and the language model: only the mixer changes between lessons
# ---------------------------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(RMSNorm(x)), then + SwiGLU(RMSNorm(x)).

    ``mixer`` is any module mapping (B, T, dim) -> (B, T, dim). Shapes: (B, T, dim) -> (B, T, dim).
    """

    def __init__(self, dim: int, mixer: nn.Module, ffn_hidden: int):
        super().__init__()
        self.norm1, self.mixer = RMSNorm(dim), mixer
        self.norm2, self.ffn = RMSNorm(dim), SwiGLU(dim, ffn_hidden)

    def forward(self, x):
        x = x + self.mixer(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class TinyLM(nn.Module):
    """Small language model: embedding, ``n_layers`` Blocks, final RMSNorm, linear head.

    ``make_mixer(layer_index) -> nn.Module`` builds the token mixer of each block, so models
    differ only in how tokens exchange information. ``ffn_hidden`` defaults to
    ``default_ffn_hidden(dim)``. There is no positional embedding: position comes from the mixer
    (RoPE, convolution, recurrence). Inputs longer than ``max_len`` are refused.

    forward: ids (B, T) int64 -> logits (B, T, vocab_size), float32.
    """

    def __init__(self, vocab_size: int, dim: int, n_layers: int, make_mixer, ffn_hidden: int | None = None,
                 max_len: int = 1024):
        super().__init__()
        ffn_hidden = default_ffn_hidden(dim) if ffn_hidden is None else ffn_hidden
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(Block(dim, make_mixer(i), ffn_hidden) for i in range(n_layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, ids):
        if ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"TinyLM expects integer token ids of shape (B, T), got {tuple(ids.shape)} "
                             f"{ids.dtype}; add a batch dimension with ids[None].")
        if ids.shape[1] > self.max_len:
            raise ValueError(f"{ids.shape[1]} tokens exceed max_len={self.max_len}; "
                             "crop the context or build the model with a larger max_len.")
        x = self.embed(ids)  # (B, T) -> (B, T, dim)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (B, T, dim) -> (B, T, vocab_size)

    @torch.no_grad()
    def generate(self, ids, max_new_tokens: int, temperature: float = 1.0, generator=None):
        """Sample ``max_new_tokens`` tokens after ``ids`` (B, T); returns (B, T + max_new_tokens).

        Re-runs the model on the last ``max_len`` tokens at each step (no cache: simple, not fast).
        """
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            logits = self(ids[:, -self.max_len:])[:, -1] / temperature  # (B, vocab_size)
            probs = torch.softmax(logits.float(), dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(ids.device)  # (B, 1)
            ids = torch.cat([ids, nxt], dim=1)
        self.train(was_training)
        return ids


def attention_lm(vocab_size: int, dim: int = 64, n_layers: int = 4, n_heads: int = 4,
                 n_kv_heads: int | None = None, ffn_hidden: int | None = None, max_len: int = 1024) -> TinyLM:
    """TinyLM whose mixers are causal RoPE attention (MHA by default; GQA/MQA via n_kv_heads).

    With the defaults and vocab_size 65 (TinyShakespeare): 204,992 trainable parameters
    (SwiGLU hidden 170, see ``default_ffn_hidden``); 2 kv heads give 188,608, 1 gives 180,416.
    """
    return TinyLM(vocab_size, dim, n_layers,
                  lambda i: Attention(dim, n_heads, n_kv_heads, rope=True, max_len=max_len),
                  ffn_hidden=ffn_hidden, max_len=max_len)
