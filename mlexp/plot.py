"""One figure style for the whole course, and plotting helpers that return their Axes."""
import itertools

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

__all__ = ["STYLE", "COLORS", "setup_style", "plot_histories"]

# Okabe & Ito's colour-blind-safe palette (Okabe & Ito, "Color Universal Design", 2008).
COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]

STYLE = {
    "figure.figsize": (6.4, 3.8),
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.prop_cycle": mpl.cycler(color=COLORS),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.8,
    "legend.frameon": False,
    "legend.fontsize": 9,
}


def setup_style() -> None:
    """Apply the course style (``STYLE``) to every later matplotlib figure in this process.

    Lessons call it once in their setup cell. The helpers below use the style for their own
    figures even without it.
    """
    mpl.rcParams.update(STYLE)


def plot_histories(histories, title: str, ax=None):
    """Plot loss against training step for several runs: validation solid, training dashed.

    Args:
        histories: dict name -> history, each history as returned by ``mlexp.train_lm``
            (lists ``step``, ``val_loss`` and, optionally, ``train_loss``; loss in nats/token).
        title: the figure title, ideally the claim the figure supports.
        ax: draw into this Axes; by default a new figure is made.
    Returns:
        the matplotlib Axes (call ``plt.show()`` to display it outside a notebook).
    Raises ``TypeError`` when given one history instead of a dict of them, ``KeyError`` when a
    history lacks ``step`` or ``val_loss``.
    """
    if not isinstance(histories, dict) or "step" in histories:
        raise TypeError("plot_histories takes a dict name -> history, e.g. {'attention': history}.")
    with mpl.rc_context(STYLE):
        if ax is None:
            _, ax = plt.subplots()
        for (name, hist), color in zip(histories.items(), itertools.cycle(COLORS)):
            missing = [key for key in ("step", "val_loss") if key not in hist]
            if missing:
                raise KeyError(f"history {name!r} has no {missing}; pass the dict returned by train_lm.")
            ax.plot(hist["step"], hist["val_loss"], color=color, label=name)
            if hist.get("train_loss"):
                ax.plot(hist["step"], hist["train_loss"], color=color, linestyle="--", alpha=0.7)
        ax.set_xlabel("training step")
        ax.set_ylabel("loss (nats per token)")
        ax.set_title(title)
        key = [Line2D([], [], color="0.3", label="validation"),
               Line2D([], [], color="0.3", linestyle="--", label="training")]
        ax.legend(handles=ax.get_legend_handles_labels()[0] + key)
    return ax
