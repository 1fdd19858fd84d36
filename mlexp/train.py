"""The training loop every lesson shares: seeded AdamW on next-token prediction, history as plain lists."""
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data import get_batch

__all__ = ["train_lm", "count_params", "default_device", "evaluate_lm"]


def default_device() -> torch.device:
    """CUDA when a GPU is present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def count_params(model: torch.nn.Module) -> int:
    """Number of trainable parameters (``requires_grad``); a shared tensor is counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _lm_loss(model, x, y):
    """Mean cross-entropy (nats per token) of model(x) against targets y, both (B, T)."""
    logits = model(x)  # (B, T) -> (B, T, V)
    if logits.dim() != 3 or logits.shape[:2] != x.shape:
        raise ValueError(f"model(x) must return logits of shape (B, T, vocab_size) = "
                         f"({x.shape[0]}, {x.shape[1]}, V); got {tuple(logits.shape)}.")
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


@torch.no_grad()
def evaluate_lm(model, batches) -> float:
    """Mean loss (nats per token) over a list of (x, y) batches, in eval mode, without gradients."""
    was_training = model.training
    model.eval()
    loss = sum(_lm_loss(model, x, y).item() for x, y in batches) / len(batches)
    model.train(was_training)
    return loss


def _check_ids(name, ids, block_size):
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point():
        raise ValueError(f"{name} must be a 1-D integer tensor of token ids (see load_char_corpus).")
    if len(ids) <= block_size:
        raise ValueError(f"{name} has {len(ids)} tokens; it needs more than block_size={block_size}.")


def train_lm(model, train_ids, val_ids, *, steps: int = 600, block_size: int = 64, batch_size: int = 32,
             lr: float = 3e-3, weight_decay: float = 0.1, grad_clip: float | None = 1.0,
             eval_every: int = 100, eval_batches: int = 10, seed: int = 0, device=None, log: bool = True):
    """Train a next-token model with AdamW and return its loss history.

    Args:
        model: maps token ids (B, T) int64 to logits (B, T, V); trained in place, left on ``device``.
        train_ids, val_ids: 1-D LongTensors of token ids (e.g. from ``load_char_corpus``).
        steps: optimiser steps, each on ``batch_size`` random windows of ``block_size`` tokens.
        lr, weight_decay: AdamW settings (constant learning rate); ``grad_clip`` caps the global
            gradient norm (None: off).
        eval_every, eval_batches: every ``eval_every`` steps (and at step 0 and the last step) the
            mean loss over the same ``eval_batches`` fixed batches of each split is recorded.
        seed: seeds the batch order, the fixed evaluation batches and torch's global generator
            (dropout and the like). The model's initial weights are the caller's: seed before
            building it (``torch.manual_seed(0)``). On the CPU the same seed gives the same history.
        device: default CUDA when available, else CPU. Batches are drawn on the CPU, so a seed
            sees the same data on every device.
        log: show a tqdm progress bar with the latest losses.

    Returns:
        dict of plain lists, one entry per evaluation: ``step``, ``train_loss`` and ``val_loss``
        (mean cross-entropy, nats per token) and ``seconds`` (wall time since the start).

    Raises ``ValueError`` for ids that are not 1-D integer tensors longer than ``block_size``,
    non-positive ``steps``/``eval_every``/``eval_batches``, or logits of the wrong shape.
    Method: AdamW, Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019.
    """
    _check_ids("train_ids", train_ids, block_size)
    _check_ids("val_ids", val_ids, block_size)
    if min(steps, eval_every, eval_batches, batch_size) < 1:
        raise ValueError("steps, eval_every, eval_batches and batch_size must all be at least 1.")
    device = default_device() if device is None else torch.device(device)
    model.to(device)
    model.train()
    torch.manual_seed(seed)
    train_gen = torch.Generator().manual_seed(seed)
    eval_gen = torch.Generator().manual_seed(seed + 1)
    fixed = {  # the same evaluation windows at every evaluation, for a smooth and fair curve
        split: [get_batch(ids, batch_size, block_size, generator=eval_gen, device=device)
                for _ in range(eval_batches)]
        for split, ids in (("train", train_ids), ("val", val_ids))
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history = {"step": [], "train_loss": [], "val_loss": [], "seconds": []}
    start = time.perf_counter()

    def record(step):
        history["step"].append(step)
        history["train_loss"].append(evaluate_lm(model, fixed["train"]))
        history["val_loss"].append(evaluate_lm(model, fixed["val"]))
        history["seconds"].append(time.perf_counter() - start)

    record(0)
    bar = tqdm(range(1, steps + 1), desc="training", disable=not log, leave=True)
    for step in bar:
        x, y = get_batch(train_ids, batch_size, block_size, generator=train_gen, device=device)
        loss = _lm_loss(model, x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        if step % eval_every == 0 or step == steps:
            record(step)
            bar.set_postfix(train=f"{history['train_loss'][-1]:.3f}", val=f"{history['val_loss'][-1]:.3f}")
    bar.close()
    return history
