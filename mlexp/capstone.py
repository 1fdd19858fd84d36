"""Recall per byte (lesson 06): models that differ only in their token mixers, their memory per sequence, and the experiment."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from . import kvcache as kc
from .inattention import InAttention
from .mixers import DecayLinearAttention, GatedDeltaNet, TaylorLinearAttention
from .recall import RecallTask, _ShortConv, evaluate_recall, train_recall
from .train import count_params
from .transformer import Attention, RMSNorm, SwiGLU, default_ffn_hidden

__all__ = ["LAYER_KINDS", "Design", "lesson_designs", "RecallLM", "build_model", "memory_bytes",
           "CapstoneConfig", "train_and_score", "pareto_front"]

# One word per layer kind. "attention" keeps a KV cache of every token, "window" one of the last
# `window` tokens, "gated_delta", "gated_additive" (Gated DeltaNet with an additive write: the control) and "decay" (a
# scalar-decay linear attention) a fixed state per head, "inattention" reads keys and
# values from the initial states Y (lesson 05), so what it keeps per token is one y. "based" is Based's
# linear attention with the Taylor feature map (mlexp.mixers.TaylorLinearAttention): a fixed state per head of
# (1 + d' + d'^2) x head_dim numbers and a normaliser of 1 + d' + d'^2, for keys of d' = feature_dim numbers.
LAYER_KINDS = ("attention", "window", "gated_delta", "gated_additive", "decay", "inattention", "based")
RECURRENT_KINDS = ("gated_delta", "gated_additive", "decay")     # head_dim x head_dim states; "based" is counted on its own


@dataclass(frozen=True)
class Design:
    """A stack of token mixers: one kind from LAYER_KINDS per layer (and the window, if any).

    name: short label used in RESULT lines and plots; layers: tuple of kinds, layer 0 first;
    window: tokens kept by "window" layers (required when there is one, ignored otherwise);
    feature_dim: d', the query and key width per head of "based" layers (16, as in Based; ignored
    otherwise). Raises ValueError for an unknown kind, an empty stack, a missing window or a
    feature_dim below 1.
    """
    name: str
    layers: tuple
    window: int | None = None
    feature_dim: int = 16

    def __post_init__(self):
        bad = sorted(set(self.layers) - set(LAYER_KINDS))
        if not self.layers or bad:
            raise ValueError(f"design {self.name!r}: layers must be a non-empty tuple of {LAYER_KINDS}; "
                             f"got unknown kinds {bad}" if bad else f"design {self.name!r} has no layers.")
        if "window" in self.layers and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"design {self.name!r} has window layers but window={self.window!r}; "
                             "give the number of tokens each keeps.")
        if "based" in self.layers and (not isinstance(self.feature_dim, int) or self.feature_dim < 1):
            raise ValueError(f"design {self.name!r} has based layers but feature_dim={self.feature_dim!r}.")

    @property
    def pattern(self) -> str:
        """One letter per layer: A attention, W window, G gated delta, C its additive control, D decay, I InAttention,
        B Based's Taylor linear attention."""
        return "".join({"attention": "A", "window": "W", "gated_delta": "G", "gated_additive": "C", "decay": "D",
                        "inattention": "I", "based": "B"}[k] for k in self.layers)


def lesson_designs(n_layers: int = 4, placements=(0, 3), windows=(8, 32), based_window: int | None = 8) -> dict:
    """The lesson's designs, {name: Design}, all of ``n_layers`` layers.

    attention (every layer attention); gated_delta (every layer Gated DeltaNet); decay (every
    layer ``DecayLinearAttention(decay="data")``: one sigmoid decay per head and token, additive
    writes k v^T of unnormalised keys, write weight 1; RetNet's form with a data-dependent decay,
    not Mamba-2's, which scales its writes by the step size dt that sets its decay); gated_additive
    (every layer ``GatedDeltaNet(rule="additive")``: Gated DeltaNet's gate, L2-normalised q and k and
    learned beta, with the additive write alpha_t S_{t-1} + beta_t k_t v_t^T: the control that differs
    from gated_delta in the update rule only, and from decay in the rest); hybrid_at_<i>: Gated
    DeltaNet everywhere but one attention layer at index i, for each i in ``placements``;
    window_<w>: sliding-window attention of w tokens in every layer, for each w in ``windows``;
    inattention: InAttention in every layer; based (unless ``based_window`` is None): Based (Arora et
    al. 2024, arXiv:2402.18668), its Taylor linear attention (feature_dim 16) in layers 0, 2, ...
    and sliding-window attention of ``based_window`` tokens in layers 1, 3, ... (pattern BWBW).
    Based combines the two as separate layers of one stack (with gated short convolutions, which
    every block here has as its 3-tap convolution), not summed inside a layer, which also fits the
    skeleton's one mixer per layer; which kind comes first is our choice. Based's windows are small
    (64 tokens) next to its contexts of thousands; at this lesson's 64 tokens a window of 64 would be
    full attention, so the default keeps 8, the lesson's small window. Raises ValueError for a
    placement outside the stack.
    """
    if any(not 0 <= i < n_layers for i in placements):
        raise ValueError(f"placements {placements} must lie in 0 .. {n_layers - 1}.")
    d = [Design("attention", ("attention",) * n_layers),
         Design("gated_delta", ("gated_delta",) * n_layers),
         Design("decay", ("decay",) * n_layers),
         Design("gated_additive", ("gated_additive",) * n_layers)]
    for i in placements:
        d.append(Design(f"hybrid_at_{i}", tuple("attention" if j == i else "gated_delta" for j in range(n_layers))))
    d += [Design(f"window_{w}", ("window",) * n_layers, window=w) for w in windows]
    d.append(Design("inattention", ("inattention",) * n_layers))
    if based_window is not None:
        d.append(Design("based", tuple("based" if j % 2 == 0 else "window" for j in range(n_layers)),
                        window=based_window))
    return {x.name: x for x in d}


# ----------------------------------------------------------------------------- the model
class _Block(nn.Module):
    """x + mixer(h + short_conv(h)) with h = RMSNorm(x), then + SwiGLU(RMSNorm(x)).

    An InAttention mixer also gets the initial states y (its keys and values come from them);
    every other mixer sees only h. Shapes: x, y (B, T, dim) -> (B, T, dim).
    """

    def __init__(self, dim, mixer, ffn_hidden):
        super().__init__()
        self.norm1, self.short_conv, self.mixer = RMSNorm(dim), _ShortConv(dim), mixer
        self.norm2, self.ffn = RMSNorm(dim), SwiGLU(dim, ffn_hidden)

    def forward(self, x, y):
        h = self.norm1(x)
        h = h + self.short_conv(h)
        x = x + (self.mixer(h, y) if isinstance(self.mixer, InAttention) else self.mixer(h))
        return x + self.ffn(self.norm2(x))


class RecallLM(nn.Module):
    """The course's small LM skeleton with one mixer kind per layer, for recall tasks.

    Embedding, one pre-norm block per entry of ``design.layers`` (each: a short causal convolution
    of 3 tokens, then the mixer, then a SwiGLU feed-forward), RMSNorm, linear head; the same
    skeleton as ``mlexp.recall.recall_model``, so designs differ in their mixers only. Every mixer
    has ``n_heads`` heads of head_dim = dim / n_heads; recurrent layers keep n_heads states of
    head_dim x head_dim. RoPE (attention, window, InAttention) covers ``max_len`` positions.
    ``head_dim`` (None: dim / n_heads) sets the head width of the recurrent layers alone
    (gated_delta, gated_additive, decay): their projections map dim to n_heads x head_dim and
    their states grow to head_dim x head_dim, the axis Zoology and Based vary (lesson 06's
    state-size sweep); every other layer keeps dim / n_heads.
    forward: ids (B, T) int64 -> logits (B, T, vocab_size). Raises ValueError for ids longer
    than max_len or not of shape (B, T).
    """

    def __init__(self, design: Design, vocab_size: int, dim: int = 64, n_heads: int = 4,
                 max_len: int = 128, chunk_size: int = 16, head_dim: int | None = None):
        super().__init__()
        self.design, self.max_len = design, max_len
        make = {
            "attention": lambda: Attention(dim, n_heads, rope=True, max_len=max_len),
            "window": lambda: Attention(dim, n_heads, rope=True, max_len=max_len, window=design.window),
            "gated_delta": lambda: GatedDeltaNet(dim, n_heads, head_dim, chunk_size=chunk_size),
            "gated_additive": lambda: GatedDeltaNet(dim, n_heads, head_dim, chunk_size=chunk_size, rule="additive"),
            "decay": lambda: DecayLinearAttention(dim, n_heads, head_dim, decay="data", chunk_size=chunk_size),
            "inattention": lambda: InAttention(dim, n_heads, rope=True, max_len=max_len),
            "based": lambda: TaylorLinearAttention(dim, n_heads, feature_dim=design.feature_dim, chunk_size=chunk_size),
        }
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(_Block(dim, make[kind](), default_ffn_hidden(dim)) for kind in design.layers)
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, ids):
        if ids.dim() != 2 or ids.is_floating_point() or ids.shape[1] > self.max_len:
            raise ValueError(f"RecallLM expects integer ids of shape (B, T) with T <= max_len={self.max_len}; "
                             f"got {tuple(ids.shape)} {ids.dtype}.")
        y = self.embed(ids)                        # (B, T, dim): the initial states
        x = y
        for block in self.blocks:
            x = block(x, y)
        return self.head(self.norm(x))             # (B, T, vocab_size)


# ----------------------------------------------------------------------------- memory
def memory_bytes(design: Design, context: int, dim: int = 64, n_heads: int = 4, dtype="bf16",
                 conv_kernel: int = 3, head_dim: int | None = None) -> dict:
    """What one sequence of ``context`` tokens keeps to go on generating, in bytes (lesson 04's counts).

    cache_bytes (grows with the context):
      attention layers: 2 x n_heads x head_dim numbers per token each (K and V; n_kv_heads = n_heads);
      window layers: the same, for at most ``window`` tokens;
      InAttention: the initial states Y, dim numbers per token shared by all its layers (each layer
      rebuilds its K and V from Y, lesson 05).
    state_bytes (fixed): n_heads states of head_dim x head_dim per recurrent layer; per "based"
      layer, n_heads states S of (1 + d' + d'^2) x head_dim and normalisers z of 1 + d' + d'^2
      (d' = design.feature_dim; the Taylor features of mlexp.mixers.TaylorLinearAttention);
      plus every layer's short-convolution buffer (the last conv_kernel - 1 inputs of dim channels).
    Returns {"cache_bytes", "state_bytes", "total_bytes"} (ints). head_dim = dim // n_heads, except
    that ``head_dim``, when given, is the recurrent layers' own (RecallLM's ``head_dim``).
    Raises ValueError for a negative context, dim not divisible by n_heads or an unknown dtype.
    """
    if dim % n_heads:
        raise ValueError(f"dim={dim} must be divisible by n_heads={n_heads}.")
    rec_head_dim = dim // n_heads if head_dim is None else head_dim      # the recurrent layers' head width
    head_dim, kinds = dim // n_heads, list(design.layers)
    cache = kc.kv_cache_bytes(kinds.count("attention"), n_heads, head_dim, context, dtype)
    cache += kc.kv_cache_bytes(kinds.count("window"), n_heads, head_dim, context, dtype, window=design.window or 1)
    if "inattention" in kinds:
        cache += dim * context * kc.dtype_bytes(dtype)
    n_rec = sum(kinds.count(k) for k in RECURRENT_KINDS)
    state = n_rec * kc.linear_state_bytes(n_heads, rec_head_dim, rec_head_dim, dtype)
    n_features = 1 + design.feature_dim + design.feature_dim ** 2           # Taylor features of a d'-wide key
    state += kinds.count("based") * (kc.linear_state_bytes(n_heads, n_features, head_dim, dtype)   # S
                                     + n_heads * n_features * kc.dtype_bytes(dtype))                # z
    state += len(kinds) * kc.conv_state_bytes(dim, conv_kernel, dtype)
    return {"cache_bytes": cache, "state_bytes": state, "total_bytes": cache + state}


# ----------------------------------------------------------------------------- the experiment
@dataclass(frozen=True)
class CapstoneConfig:
    """Sizes of the experiment. Every design gets the same model size, data, steps and seed.

    Training cycles step by step through MQAR at each of ``mqar_pairs`` and recall with
    overwrites at each (n_pairs, n_writes) of ``overwrite``, all of length ``seq_len`` over one
    vocabulary (n_keys keys, n_values values, a filler). Evaluation: ``n_eval`` fresh sequences per
    task at seq_len, and MQAR again at 2 x seq_len (length generalisation).
    """
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 4
    seq_len: int = 64
    n_keys: int = 32
    n_values: int = 32
    mqar_pairs: tuple = (4, 8, 16, 24)
    overwrite: tuple = ((4, 12), (8, 20))
    steps: int = 500
    batch_size: int = 16
    lr: float = 6e-3
    chunk_size: int = 16
    head_dim: int | None = None       # the recurrent layers' head width; None: dim // n_heads
    n_eval: int = 200
    dtype: str = "bf16"

    def mqar_tasks(self, seq_len=None) -> list:
        T = self.seq_len if seq_len is None else seq_len
        return [RecallTask("mqar", n, self.n_keys, self.n_values, seq_len=T) for n in self.mqar_pairs]

    def overwrite_tasks(self, seq_len=None) -> list:
        T = self.seq_len if seq_len is None else seq_len
        return [RecallTask("overwrite", n, self.n_keys, self.n_values, seq_len=T, n_writes=w)
                for n, w in self.overwrite]


def build_model(design: Design, config: CapstoneConfig, seed: int = 0) -> RecallLM:
    """A fresh RecallLM for ``design`` at the config's sizes, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    vocab = config.mqar_tasks()[0].vocab_size
    return RecallLM(design, vocab, config.dim, config.n_heads, max_len=2 * config.seq_len,
                    chunk_size=config.chunk_size, head_dim=config.head_dim)


def train_and_score(design: Design, config: CapstoneConfig, seed: int = 0, device=None) -> dict:
    """Train one design on the config's task mix and score it; memory from ``memory_bytes``.

    Returns a dict: name, pattern, params, seconds (training wall time), loss (mean of the last
    50 steps), bytes and bytes_2x (total memory at seq_len and 2 seq_len), mqar {pairs: accuracy},
    overwrite {pairs: accuracy}, mqar_2x {pairs: accuracy} (at twice the training length), and
    the means mqar_mean, overwrite_mean, mqar_2x_mean, and losses (the training loss of every
    step, for loss curves). Accuracy is over every scored query; chance is 1 / n_values.
    Evaluation sequences come from seeds other than training's.
    """
    model = build_model(design, config, seed)
    start = time.perf_counter()
    history = train_recall(model, config.mqar_tasks() + config.overwrite_tasks(), steps=config.steps,
                           batch_size=config.batch_size, lr=config.lr, seed=seed, device=device, log=False)
    seconds = time.perf_counter() - start
    scores = {}
    for key, tasks in (("mqar", config.mqar_tasks()), ("overwrite", config.overwrite_tasks()),
                       ("mqar_2x", config.mqar_tasks(2 * config.seq_len))):
        result = evaluate_recall(model, tasks, n_examples=config.n_eval, batch_size=100, seed=10_000 + seed)
        scores[key], scores[key + "_mean"] = result["by_pairs"], sum(result["by_pairs"].values()) / len(tasks)
    mem = lambda T: memory_bytes(design, T, config.dim, config.n_heads, config.dtype,
                                 head_dim=config.head_dim)["total_bytes"]
    tail = history["loss"][-50:]
    return {"name": design.name, "pattern": design.pattern, "params": count_params(model), "seconds": seconds,
            "loss": sum(tail) / max(len(tail), 1), "bytes": mem(config.seq_len), "bytes_2x": mem(2 * config.seq_len),
            **scores, "losses": list(history["loss"])}


def pareto_front(points) -> list:
    """Indices of the points no other point beats on both memory and accuracy, by increasing memory.

    points: a sequence of (bytes, accuracy). Point i is dominated when some j has bytes_j <= bytes_i
    and accuracy_j >= accuracy_i with at least one strict; the front is every point that is not.
    Of several identical points the first is kept. Returns a list of ints sorted by bytes.
    """
    pts = [(float(b), float(a)) for b, a in points]
    front = []
    for i, (b, a) in enumerate(pts):
        dominated = any((bj <= b and aj >= a and (bj < b or aj > a)) or ((bj, aj) == (b, a) and j < i)
                        for j, (bj, aj) in enumerate(pts) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (pts[i][0], -pts[i][1]))
