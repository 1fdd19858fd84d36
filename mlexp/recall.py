"""Associative-recall tasks (AR, multi-query AR, recall with overwrites) and a small trainer for them."""
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from .mixers import DecayLinearAttention, DeltaNet, GatedDeltaNet, LinearAttention
from .train import default_device
from .transformer import Attention, TinyLM

__all__ = ["IGNORE", "RecallBatch", "RecallTask", "associative_recall", "mqar", "recall_with_overwrites",
           "accuracy_by_distance", "recall_model", "train_recall", "evaluate_recall"]

IGNORE = -100   # target at unscored positions (the ignore_index of F.cross_entropy)

# Token ids of every task: keys 0 .. n_keys-1, values n_keys .. n_keys+n_values-1, then one
# filler token (id n_keys + n_values) for positions that hold neither a pair nor a query.


@dataclass
class RecallBatch:
    """A batch of recall sequences; all tensors are int64 of shape (N, T) on the CPU.

    inputs: token ids. targets: the value id to predict at each query position, IGNORE elsewhere.
    distances: query position minus the position of the key it asks about (the latest write of
    that key for overwrites); -1 where nothing is scored. n_pairs: distinct keys per sequence.
    """
    inputs: torch.Tensor
    targets: torch.Tensor
    distances: torch.Tensor
    n_pairs: int


def _check_sizes(n_examples, n_pairs, n_keys, n_values):
    if min(n_examples, n_pairs, n_values) < 1:
        raise ValueError(f"n_examples, n_pairs and n_values must be at least 1; got {n_examples}, "
                         f"{n_pairs}, {n_values}.")
    if n_pairs > n_keys:
        raise ValueError(f"{n_pairs} pairs need {n_pairs} distinct keys but the key vocabulary has "
                         f"{n_keys}; raise n_keys or lower n_pairs.")


def _distinct_keys(n_examples, n_pairs, n_keys, generator):
    """(N, n_pairs) distinct key ids per row, uniformly at random."""
    return torch.rand(n_examples, n_keys, generator=generator).argsort(dim=-1)[:, :n_pairs]


def associative_recall(n_examples, n_pairs, n_keys=16, n_values=16, *, generator=None):
    """Single-query associative recall: k_1 v_1 ... k_n v_n q, predict the value stored under q.

    Sequences have T = 2 n_pairs + 1 tokens; keys within a sequence are distinct, values are
    drawn with replacement, the query is one of the n keys; only the last position is scored.
    The distance is 2 (n - i) + 2 for the pair i (1-based), from 2 to 2n.
    Args: n_examples N; n_pairs n; n_keys, n_values: vocabulary sizes; generator: a
    torch.Generator for reproducible draws (None: torch's global one).
    Returns a RecallBatch. Raises ValueError when n_pairs > n_keys or a size is below 1.
    Source: the associative-recall probe of Ba et al. 2016 and Fu et al. 2023 (H3).
    """
    _check_sizes(n_examples, n_pairs, n_keys, n_values)
    keys = _distinct_keys(n_examples, n_pairs, n_keys, generator)                  # (N, n)
    values = n_keys + torch.randint(n_values, (n_examples, n_pairs), generator=generator)
    pick = torch.randint(n_pairs, (n_examples,), generator=generator)               # (N,)
    rows = torch.arange(n_examples)
    T = 2 * n_pairs + 1
    inputs = torch.empty(n_examples, T, dtype=torch.long)
    inputs[:, 0:2 * n_pairs:2], inputs[:, 1:2 * n_pairs:2] = keys, values
    inputs[:, -1] = keys[rows, pick]
    targets = torch.full((n_examples, T), IGNORE, dtype=torch.long)
    distances = torch.full((n_examples, T), -1, dtype=torch.long)
    targets[:, -1] = values[rows, pick]
    distances[:, -1] = (T - 1) - 2 * pick
    return RecallBatch(inputs, targets, distances, n_pairs)


def _place_queries(n_examples, start, seq_len, n_queries, generator):
    """(N, n_queries) distinct positions in start .. seq_len-1, uniformly at random."""
    region = seq_len - start
    return start + torch.rand(n_examples, region, generator=generator).argsort(dim=-1)[:, :n_queries]


def mqar(n_examples, n_pairs, n_keys=64, n_values=64, *, seq_len=None, n_queries=None, generator=None):
    """Multi-query associative recall (MQAR, Arora et al. 2023, "Zoology").

    Layout: k_1 v_1 ... k_n v_n, then a query region up to ``seq_len`` (default 4 n) in which
    ``n_queries`` (default n, at most the region) of the n keys appear again, each once, at random
    positions; the other positions hold the filler token. Every query position is scored: its
    target is the value written after that key. Keys in a sequence are distinct.
    Args: as ``associative_recall``, plus seq_len T >= 2n + 1 and n_queries in 1..min(n, T - 2n).
    Returns a RecallBatch with T = seq_len. Raises ValueError for sizes that do not fit.
    Zoology also places queries by a power law of distance; here they are uniform.
    """
    _check_sizes(n_examples, n_pairs, n_keys, n_values)
    seq_len = 4 * n_pairs if seq_len is None else seq_len
    n_queries = min(n_pairs, seq_len - 2 * n_pairs) if n_queries is None else n_queries
    if seq_len < 2 * n_pairs + 1 or not 1 <= n_queries <= min(n_pairs, seq_len - 2 * n_pairs):
        raise ValueError(f"seq_len={seq_len} must leave room for the {2 * n_pairs} pair tokens and "
                         f"n_queries={n_queries} queries (1 <= n_queries <= n_pairs).")
    keys = _distinct_keys(n_examples, n_pairs, n_keys, generator)                  # (N, n)
    values = n_keys + torch.randint(n_values, (n_examples, n_pairs), generator=generator)
    asked = torch.rand(n_examples, n_pairs, generator=generator).argsort(dim=-1)[:, :n_queries]
    where = _place_queries(n_examples, 2 * n_pairs, seq_len, n_queries, generator)  # (N, n_q)
    inputs = torch.full((n_examples, seq_len), n_keys + n_values, dtype=torch.long)  # filler
    inputs[:, 0:2 * n_pairs:2], inputs[:, 1:2 * n_pairs:2] = keys, values
    targets = torch.full((n_examples, seq_len), IGNORE, dtype=torch.long)
    distances = torch.full((n_examples, seq_len), -1, dtype=torch.long)
    inputs.scatter_(1, where, keys.gather(1, asked))
    targets.scatter_(1, where, values.gather(1, asked))
    distances.scatter_(1, where, where - 2 * asked)                                 # key i sits at 2i
    return RecallBatch(inputs, targets, distances, n_pairs)


def recall_with_overwrites(n_examples, n_pairs, n_writes, n_keys=64, n_values=64, *, seq_len=None,
                           n_queries=None, generator=None):
    """Recall with overwrites (lesson 03): keys are written again with new values; answer the latest.

    ``n_writes`` >= n_pairs (key, value) writes use n_pairs distinct keys: each key is written at
    least once and the other n_writes - n_pairs writes pick keys at random from the n, in a random
    order. A query region follows as in ``mqar`` (seq_len default 2 n_writes + 2 n_pairs,
    n_queries default n_pairs); the target of a query is the value of the key's *latest* write and
    its distance is measured from that write. Values are drawn with replacement.
    Returns a RecallBatch. Raises ValueError for n_writes < n_pairs or sizes that do not fit.
    """
    _check_sizes(n_examples, n_pairs, n_keys, n_values)
    if n_writes < n_pairs:
        raise ValueError(f"n_writes={n_writes} must be at least n_pairs={n_pairs} (each key is written).")
    W = 2 * n_writes
    seq_len = W + 2 * n_pairs if seq_len is None else seq_len
    n_queries = min(n_pairs, seq_len - W) if n_queries is None else n_queries
    if seq_len < W + 1 or not 1 <= n_queries <= min(n_pairs, seq_len - W):
        raise ValueError(f"seq_len={seq_len} must leave room for the {W} write tokens and "
                         f"n_queries={n_queries} queries (1 <= n_queries <= n_pairs).")
    keys = _distinct_keys(n_examples, n_pairs, n_keys, generator)                  # (N, n)
    extra = torch.randint(n_pairs, (n_examples, n_writes - n_pairs), generator=generator)
    slot = torch.cat([torch.arange(n_pairs).expand(n_examples, -1), extra], dim=1)   # (N, n_writes)
    order = torch.rand(n_examples, n_writes, generator=generator).argsort(dim=-1)
    slot = slot.gather(1, order)                                                    # which key each write uses
    values = n_keys + torch.randint(n_values, (n_examples, n_writes), generator=generator)
    inputs = torch.full((n_examples, seq_len), n_keys + n_values, dtype=torch.long)
    inputs[:, 0:W:2], inputs[:, 1:W:2] = keys.gather(1, slot), values
    # Latest write of each key: the largest write index w whose slot is that key.
    w_idx = torch.arange(n_writes).expand(n_examples, -1)
    latest = torch.full((n_examples, n_pairs), -1, dtype=torch.long).scatter_reduce(
        1, slot, w_idx, reduce="amax")                                              # (N, n)
    asked = torch.rand(n_examples, n_pairs, generator=generator).argsort(dim=-1)[:, :n_queries]
    where = _place_queries(n_examples, W, seq_len, n_queries, generator)
    w_asked = latest.gather(1, asked)                                               # (N, n_q)
    targets = torch.full((n_examples, seq_len), IGNORE, dtype=torch.long)
    distances = torch.full((n_examples, seq_len), -1, dtype=torch.long)
    inputs.scatter_(1, where, keys.gather(1, asked))
    targets.scatter_(1, where, values.gather(1, w_asked))
    distances.scatter_(1, where, where - 2 * w_asked)
    return RecallBatch(inputs, targets, distances, n_pairs)


@dataclass(frozen=True)
class RecallTask:
    """One task configuration; ``sample(n, generator)`` draws a RecallBatch of n sequences.

    kind: "ar", "mqar" or "overwrite"; the other fields are passed to the generator of that
    kind (n_writes only for "overwrite"; seq_len/n_queries ignored for "ar").
    """
    kind: str
    n_pairs: int
    n_keys: int = 64
    n_values: int = 64
    seq_len: int | None = None
    n_queries: int | None = None
    n_writes: int | None = None

    @property
    def vocab_size(self) -> int:
        """Keys + values + the filler token."""
        return self.n_keys + self.n_values + 1

    def sample(self, n_examples, generator=None) -> RecallBatch:
        common = dict(n_keys=self.n_keys, n_values=self.n_values, generator=generator)
        if self.kind == "ar":
            return associative_recall(n_examples, self.n_pairs, **common)
        extra = dict(seq_len=self.seq_len, n_queries=self.n_queries, **common)
        if self.kind == "mqar":
            return mqar(n_examples, self.n_pairs, **extra)
        if self.kind == "overwrite":
            n_writes = 2 * self.n_pairs if self.n_writes is None else self.n_writes
            return recall_with_overwrites(n_examples, self.n_pairs, n_writes, **extra)
        raise ValueError(f"kind must be 'ar', 'mqar' or 'overwrite'; got {self.kind!r}")


def accuracy_by_distance(predictions, targets, distances) -> dict:
    """Fraction of scored positions predicted right, per distance: {distance: (accuracy, count)}.

    predictions, targets, distances: (N, T) integer tensors; positions whose target is IGNORE are
    skipped. Keys of the returned dict are sorted ints. Raises ValueError for unequal shapes.
    """
    if not predictions.shape == targets.shape == distances.shape:
        raise ValueError(f"predictions {tuple(predictions.shape)}, targets {tuple(targets.shape)} and "
                         f"distances {tuple(distances.shape)} must have the same shape (N, T).")
    scored = targets != IGNORE
    right = (predictions == targets)[scored]
    dist = distances[scored]
    out = {}
    for d in sorted(dist.unique().tolist()):
        hit = right[dist == d]
        out[int(d)] = (hit.float().mean().item(), int(hit.numel()))
    return out


class _ShortConv(nn.Module):
    """Depthwise causal convolution over time, (B, T, dim) -> (B, T, dim), kernel ``width``."""

    def __init__(self, dim, width=3):
        super().__init__()
        self.width = width
        self.conv = nn.Conv1d(dim, dim, width, groups=dim)

    def forward(self, x):
        y = F.pad(x.transpose(1, 2), (self.width - 1, 0))      # (B, dim, T + width - 1), left pad
        return self.conv(y).transpose(1, 2)                      # (B, T, dim)


class _ConvThenMixer(nn.Module):
    """x + short_conv(x), then the mixer: lets any mixer see the previous token (as in H3, Based)."""

    def __init__(self, dim, mixer):
        super().__init__()
        self.short_conv, self.mixer = _ShortConv(dim), mixer

    def forward(self, x):
        return self.mixer(x + self.short_conv(x))


def recall_model(mixer, vocab_size, dim=64, n_layers=2, n_heads=1, head_dim=None, max_len=512):
    """A TinyLM for recall tasks, every block a short convolution followed by ``mixer``.

    ``mixer`` is one of "attention" (softmax, RoPE), "linear" (phi = elu + 1), "decay"
    (data-dependent decay gate), "delta" (DeltaNet), "gated_delta" (Gated DeltaNet), or a callable
    ``make_mixer(layer_index) -> nn.Module`` with the mixer interface (B, T, dim) -> (B, T, dim).
    Every block puts a short causal convolution (kernel 3) before its mixer, so that each model
    can bind a value to the key just before it; models then differ only in how a query finds
    its pair (the short convolutions of H3, Based and Mamba play this role). For the recurrent
    mixers ``head_dim`` sets the state size: n_heads states of head_dim x head_dim per layer
    (default dim // n_heads). Attention uses head_dim = dim // n_heads.
    Returns the model (forward: ids (B, T) -> logits (B, T, vocab_size)).
    Raises ValueError for an unknown mixer name.
    """
    named = {
        "attention": lambda i: Attention(dim, n_heads, rope=True, max_len=max_len),
        "linear": lambda i: LinearAttention(dim, n_heads, head_dim),
        "decay": lambda i: DecayLinearAttention(dim, n_heads, head_dim, decay="data"),
        "delta": lambda i: DeltaNet(dim, n_heads, head_dim),
        "gated_delta": lambda i: GatedDeltaNet(dim, n_heads, head_dim),
    }
    if callable(mixer):
        make_mixer = mixer
    elif mixer in named:
        make_mixer = named[mixer]
    else:
        raise ValueError(f"mixer must be one of {', '.join(map(repr, named))} or a callable "
                         f"make_mixer(layer_index); got {mixer!r}")
    return TinyLM(vocab_size, dim, n_layers, lambda i: _ConvThenMixer(dim, make_mixer(i)), max_len=max_len)


def _check_tasks(tasks):
    tasks = [tasks] if isinstance(tasks, RecallTask) else list(tasks)
    if not tasks or len({t.vocab_size for t in tasks}) != 1:
        raise ValueError("give one RecallTask or a list of them sharing n_keys and n_values.")
    return tasks


def train_recall(model, tasks, *, steps=500, batch_size=64, lr=3e-3, weight_decay=0.1, seed=0,
                 device=None, log=True) -> dict:
    """Train ``model`` on fresh batches of ``tasks`` (cycled step by step); return the loss history.

    model: ids (B, T) -> logits (B, T, vocab); trained in place with AdamW (constant lr, grad
    norm clipped at 1), cross-entropy on scored positions only. tasks: a RecallTask or a list
    sharing one vocabulary (e.g. several n_pairs). seed: seeds the data and torch's global
    generator (build the model after your own torch.manual_seed for reproducible weights).
    Returns {"step": [...], "loss": [...]} (nats per scored token, every step).
    """
    tasks = _check_tasks(tasks)
    device = default_device() if device is None else torch.device(device)
    model.to(device).train()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history = {"step": [], "loss": []}
    bar = tqdm(range(1, steps + 1), desc="training", disable=not log)
    for step in bar:
        batch = tasks[(step - 1) % len(tasks)].sample(batch_size, gen)
        logits = model(batch.inputs.to(device))                                     # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.targets.to(device).flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        history["step"].append(step)
        history["loss"].append(loss.item())
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return history


@torch.no_grad()
def evaluate_recall(model, tasks, *, n_examples=1000, batch_size=250, seed=12345, device=None) -> dict:
    """Accuracy of ``model`` on fresh sequences of each task, overall, per n_pairs and per distance.

    Returns {"accuracy": float, "by_pairs": {n_pairs: accuracy}, "by_distance": {d: (accuracy,
    count)}} over all scored positions; n_examples sequences per task, drawn from ``seed``
    (different from training seeds, so these are unseen sequences). Chance is 1 / n_values.
    """
    tasks = _check_tasks(tasks)
    device = next(model.parameters()).device if device is None else torch.device(device)
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    right, count = defaultdict(int), defaultdict(int)
    all_pred, all_tgt, all_dist = [], [], []
    for task in tasks:
        for start in range(0, n_examples, batch_size):
            batch = task.sample(min(batch_size, n_examples - start), gen)
            pred = model(batch.inputs.to(device)).argmax(-1).cpu()                   # (B, T)
            scored = batch.targets != IGNORE
            right[task.n_pairs] += (pred == batch.targets)[scored].sum().item()
            count[task.n_pairs] += scored.sum().item()
            all_pred.append(pred.flatten())
            all_tgt.append(batch.targets.flatten())
            all_dist.append(batch.distances.flatten())
    model.train(was_training)
    by_distance = accuracy_by_distance(*(torch.cat(x)[None] for x in (all_pred, all_tgt, all_dist)))
    return {"accuracy": sum(right.values()) / sum(count.values()),
            "by_pairs": {n: right[n] / count[n] for n in sorted(count)},
            "by_distance": by_distance}
