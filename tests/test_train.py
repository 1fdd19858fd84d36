"""Tests of mlexp.train and mlexp.plot: the shared training loop and the loss plots."""
import math

import pytest
import torch

from mlexp.train import train_lm
from mlexp.transformer import attention_lm


# --------------------------------------------------------------------------------------------
# Training and plotting
# --------------------------------------------------------------------------------------------


def _tiny_run(seed):
    torch.manual_seed(123)
    model = attention_lm(vocab_size=5, dim=16, n_layers=1, n_heads=2, max_len=16)
    ids = torch.tensor([0, 1, 2, 3, 4] * 100)  # a cycle: perfectly predictable
    return train_lm(model, ids[:400], ids[400:], steps=20, block_size=8, batch_size=8, lr=1e-2,
                    eval_every=10, eval_batches=2, seed=seed, device="cpu", log=False)


@pytest.mark.slow
def test_train_lm_learns_and_is_reproducible():
    h1, h2, h3 = _tiny_run(0), _tiny_run(0), _tiny_run(1)
    assert h1["step"] == [0, 10, 20]
    assert set(h1) >= {"step", "train_loss", "val_loss"}
    assert all(type(v) is float for v in h1["val_loss"] + h1["train_loss"])
    assert h1["val_loss"][0] > math.log(5) - 0.5  # starts near chance
    assert h1["val_loss"][-1] < 0.5 * h1["val_loss"][0]
    assert h1["train_loss"] == h2["train_loss"] and h1["val_loss"] == h2["val_loss"]
    assert h1["val_loss"] != h3["val_loss"]  # the seed matters


def test_train_lm_rejects_bad_inputs():
    model = attention_lm(vocab_size=5, dim=16, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="1-D integer"):
        train_lm(model, torch.randn(100), torch.arange(50) % 5, steps=1, log=False)
    flat = torch.nn.Sequential(torch.nn.Embedding(5, 5), torch.nn.Flatten())  # (B, T) -> (B, T*5)
    ids = torch.arange(50) % 5
    with pytest.raises(ValueError, match=r"\(B, T, vocab_size\)"):
        train_lm(flat, ids, ids, steps=1, block_size=4, eval_batches=1, log=False)


def test_plot_histories_returns_axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlexp.plot import plot_histories, setup_style

    setup_style()
    hist = {"step": [0, 10], "train_loss": [2.0, 1.0], "val_loss": [2.1, 1.2]}
    ax = plot_histories({"a": hist, "b": hist}, "two runs")
    assert isinstance(ax, matplotlib.axes.Axes) and ax.get_title() == "two runs"
    assert len(ax.lines) == 4  # val + train per run
    fig, given = plt.subplots()
    assert plot_histories({"a": hist}, "given axes", ax=given) is given
    with pytest.raises(TypeError, match="dict name -> history"):
        plot_histories(hist, "one history")
    plt.close("all")
