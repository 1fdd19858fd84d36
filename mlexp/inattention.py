"""InAttention (Eisner 2024): queries from hidden states, keys and values from the initial embeddings."""
import os
import sys
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .transformer import Attention, RMSNorm, SwiGLU, apply_rope, default_ffn_hidden

__all__ = [
    "InAttention",
    "InAttentionBlock",
    "InAttentionLM",
    "inattention_lm",
    "attention_pairs",
    "peak_memory_bytes",
]

# Source of the method, cited by every public object below:
# J. D. Eisner, "InAttention: Linear Context Scaling for Transformers", arXiv:2410.07063, 2024.


def _attend(q, k, v, causal: bool):
    """Softmax attention of q (B, H, Tq, D) over k, v (B, H_kv, Tk, D); kv heads shared by groups.

    ``causal`` masks key s > query t (needs Tq == Tk); without it every query sees every key.
    """
    group = q.shape[1] // k.shape[1]
    if group > 1:  # (B, H_kv, Tk, D) -> (B, H, Tk, D): kv head j serves query heads j*group ..
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, H, Tq, D)


class InAttention(Attention):
    """Causal attention whose keys and values come from the initial states Y, not the hidden states X.

    q = W_Q x (from the block's normalised hidden states), k = W_K LN(y), v = W_V LN(y), where y
    are the token embeddings (the model's initial states) and LN is this layer's own LayerNorm.
    ``n_heads`` query heads of width head_dim = dim / n_heads share ``n_kv_heads`` kv heads (GQA
    as in ``mlexp.transformer.Attention``); RoPE on q and k when ``rope`` (positions < max_len).
    Parameters: those of ``Attention`` plus 2 * dim for the LayerNorm (weight and bias).

    forward(x, y): x, y (B, T, dim) -> (B, T, dim), every position, causal.
    forward_last(x_last, y): x_last (B, 1, dim) the last position's hidden state, y (B, T, dim)
        for all T positions -> (B, 1, dim): the last row of forward(x, y), from T attention pairs.

    Source: Eisner, "InAttention: Linear Context Scaling for Transformers", arXiv:2410.07063, 2024.
    Raises ``ValueError`` when dim is not divisible by n_heads or n_heads by n_kv_heads, and for
    inputs of mismatched shapes or longer than max_len.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int | None = None, rope: bool = True,
                 max_len: int = 1024, rope_base: float = 10000.0):
        # The projections, head layout and RoPE tables are those of the standard layer.
        super().__init__(dim, n_heads, n_kv_heads, rope, max_len, rope_base)
        self.kv_norm = nn.LayerNorm(dim)  # LN_l: one per layer, applied to the initial states

    def kv(self, y):
        """Keys and values of every position from the initial states: y (B, T, dim) -> k, v (B, H_kv, T, D).

        k = W_K LN(y), v = W_V LN(y), split into heads; RoPE is not applied here (see forward).
        """
        B, T, _ = y.shape
        y = self.kv_norm(y)  # (B, T, dim), normalised per token by this layer's LayerNorm
        # (B, T, dim) -> (B, T, H_kv, D) -> (B, H_kv, T, D)
        k = self.k_proj(y).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(y).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return k, v

    def _check(self, x, y):
        if x.dim() != 3 or y.dim() != 3 or x.shape[0] != y.shape[0] or x.shape[2] != y.shape[2]:
            raise ValueError(f"InAttention expects x (B, Tq, dim) and y (B, T, dim) with the same B and "
                             f"dim; got {tuple(x.shape)} and {tuple(y.shape)}.")
        if self.rope and y.shape[1] > self.max_len:
            raise ValueError(f"Sequence of {y.shape[1]} tokens is longer than max_len={self.max_len}; "
                             "build InAttention with a larger max_len.")

    def _queries(self, x, offset: int):
        B, Tq, _ = x.shape
        q = self.q_proj(x).view(B, Tq, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, Tq, D)
        return apply_rope(q, self.rope_cos, self.rope_sin, offset=offset) if self.rope else q

    def _keys_values(self, y):
        k, v = self.kv(y)  # (B, H_kv, T, D) each
        if self.rope:
            k = apply_rope(k, self.rope_cos, self.rope_sin)
        return k, v

    def forward(self, x, y):
        self._check(x, y)
        if x.shape[1] != y.shape[1]:
            raise ValueError(f"forward needs x and y of the same length, got {x.shape[1]} and {y.shape[1]}; "
                             "use forward_last for the last position alone.")
        B, T, _ = x.shape
        q = self._queries(x, offset=0)  # (B, H, T, D)
        k, v = self._keys_values(y)  # (B, H_kv, T, D)
        out = _attend(q, k, v, causal=True)  # (B, H, T, T) scores, masked -> (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))  # (B, T, dim)

    def forward_last(self, x_last, y):
        self._check(x_last, y)
        if x_last.shape[1] != 1:
            raise ValueError(f"forward_last takes the last position only: x_last (B, 1, dim), got "
                             f"{tuple(x_last.shape)}.")
        B, T, _ = y.shape
        q = self._queries(x_last, offset=T - 1)  # (B, H, 1, D), rotated to position T - 1
        k, v = self._keys_values(y)  # (B, H_kv, T, D)
        out = _attend(q, k, v, causal=False)  # the last position sees all T: (B, H, 1, T) -> (B, H, 1, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, 1, -1))  # (B, 1, dim)


class InAttentionBlock(nn.Module):
    """Pre-norm block as ``mlexp.transformer.Block``, but the mixer also reads the initial states y.

    x + InAttention(RMSNorm(x), y), then + SwiGLU(RMSNorm(x)). Shapes: x, y (B, T, dim) -> (B, T, dim);
    ``forward_last(x_last, y)`` runs the same block for the last position only, x_last (B, 1, dim).
    """

    def __init__(self, dim: int, mixer: InAttention, ffn_hidden: int):
        super().__init__()
        self.norm1, self.mixer = RMSNorm(dim), mixer
        self.norm2, self.ffn = RMSNorm(dim), SwiGLU(dim, ffn_hidden)

    def forward(self, x, y):
        x = x + self.mixer(self.norm1(x), y)
        return x + self.ffn(self.norm2(x))

    def forward_last(self, x_last, y):
        x_last = x_last + self.mixer.forward_last(self.norm1(x_last), y)
        return x_last + self.ffn(self.norm2(x_last))


class InAttentionLM(nn.Module):
    """The course's small LM skeleton (embedding, pre-norm blocks with SwiGLU, RMSNorm, head) with InAttention.

    The embeddings Y = embed(ids) are the initial states; every layer's keys and values are
    computed from Y, its queries from the running hidden states. Same sizes as
    ``mlexp.transformer.attention_lm`` with the same arguments, plus 2 * dim parameters per
    layer (the LayerNorms): 204,992 + 4 * 128 = 205,504 for vocab 65, dim 64, 4 layers.

    forward(ids): (B, T) int64 -> logits (B, T, vocab_size), every position (for training).
    last_logits(ids): (B, T) int64 -> logits (B, vocab_size) of the last position only. Keys and
        values come from Y for all T positions, but the residual tower (queries, feed-forwards)
        runs for the last position alone: T attention pairs per layer instead of T (T + 1) / 2,
        and no hidden state of an earlier position is computed. Equal to forward(ids)[:, -1].

    Source: Eisner, "InAttention: Linear Context Scaling for Transformers", arXiv:2410.07063, 2024
    (the paper's models are GPT-NeoX style; this one uses the course's RMSNorm/SwiGLU/RoPE skeleton).
    Raises ``ValueError`` for ids that are not (B, T) integers or are longer than max_len.
    """

    def __init__(self, vocab_size: int, dim: int = 64, n_layers: int = 4, n_heads: int = 4,
                 n_kv_heads: int | None = None, ffn_hidden: int | None = None, max_len: int = 1024,
                 rope: bool = True):
        super().__init__()
        ffn_hidden = default_ffn_hidden(dim) if ffn_hidden is None else ffn_hidden
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(
            InAttentionBlock(dim, InAttention(dim, n_heads, n_kv_heads, rope=rope, max_len=max_len), ffn_hidden)
            for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def _check(self, ids):
        if ids.dim() != 2 or ids.is_floating_point() or ids.shape[1] == 0:
            raise ValueError(f"InAttentionLM expects integer token ids of shape (B, T), T >= 1, got "
                             f"{tuple(ids.shape)} {ids.dtype}; add a batch dimension with ids[None].")
        if ids.shape[1] > self.max_len:
            raise ValueError(f"{ids.shape[1]} tokens exceed max_len={self.max_len}; "
                             "crop the context or build the model with a larger max_len.")

    def forward(self, ids):
        self._check(ids)
        y = self.embed(ids)  # initial states Y: (B, T) -> (B, T, dim)
        x = y
        for block in self.blocks:
            x = block(x, y)  # (B, T, dim)
        return self.head(self.norm(x))  # (B, T, dim) -> (B, T, vocab_size)

    def last_logits(self, ids):
        self._check(ids)
        y = self.embed(ids)  # (B, T, dim): all the earlier positions contribute is Y
        x = y[:, -1:]  # (B, 1, dim): the residual tower of the last position only
        for block in self.blocks:
            x = block.forward_last(x, y)  # (B, 1, dim)
        return self.head(self.norm(x))[:, 0]  # (B, 1, dim) -> (B, vocab_size)


def inattention_lm(vocab_size: int, dim: int = 64, n_layers: int = 4, n_heads: int = 4,
                   n_kv_heads: int | None = None, ffn_hidden: int | None = None,
                   max_len: int = 1024) -> InAttentionLM:
    """InAttentionLM with RoPE, with the same arguments and sizes as ``mlexp.transformer.attention_lm``."""
    return InAttentionLM(vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_hidden, max_len, rope=True)


def attention_pairs(T: int, model: str) -> int:
    """Query-key pairs scored per layer to get next-token logits from a context of T tokens.

    ``model="standard"``: every position's hidden state is needed by the next layer, so every
    position t attends positions 0..t: 1 + 2 + ... + T = T (T + 1) / 2 pairs.
    ``model="inattention"``: keys and values come from the initial states, so only the last
    position's query is needed: T pairs.
    Raises ``ValueError`` for T < 1 or another model name. Source: Eisner 2024 (arXiv:2410.07063).
    """
    if T < 1:
        raise ValueError(f"T must be at least 1 token, got {T}.")
    if model == "standard":
        return T * (T + 1) // 2
    if model == "inattention":
        return T
    raise ValueError(f"model must be 'standard' or 'inattention', got {model!r}.")


# ---------------------------------------------------------------------------------------------
# Measuring peak memory: CUDA's allocator statistics, or the PyTorch profiler's records on a CPU
# ---------------------------------------------------------------------------------------------


@contextmanager
def _quiet_fd2():
    """Send file descriptor 2 to /dev/null: the profiler's C++ layer prints start/stop lines there."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_memory_bytes(fn, device="cpu") -> int:
    """Peak bytes of tensor memory allocated while ``fn()`` runs, above what was allocated before.

    CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak, minus the bytes allocated
    at the start (the caching allocator's own count of live tensor bytes).
    CPU: there is no allocator counter, so the call runs under ``torch.profiler`` with
    ``profile_memory=True``, which records the bytes every operator allocates and frees; their
    running sum in time order is the live tensor memory and its maximum is the peak. Tensors
    made outside PyTorch (NumPy arrays, Python objects) are not counted, nor are allocator
    caches: this measures tensors, not the process's resident memory.
    Returns an int (bytes). Source: PyTorch documentation (torch.profiler, CUDA memory statistics).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    if device.type != "cpu":
        raise ValueError(f"peak_memory_bytes measures 'cpu' or 'cuda' devices, got {device}.")
    from torch.profiler import ProfilerActivity, profile
    with _quiet_fd2(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage  # + bytes allocated, - bytes freed, by this event itself
        peak = max(peak, live)
    return peak
