"""Interactive panels for the lessons: thin ipywidgets shells over pure functions that tests call."""
from __future__ import annotations

import math

import matplotlib as mpl
import matplotlib.pyplot as plt

from . import kvcache as kc
from .plot import COLORS, STYLE

__all__ = ["cache_report", "plot_cache_vs_state", "CacheCalculator", "cache_calculator"]

DTYPES = ("bf16", "fp16", "fp32")
CONTEXTS = tuple(2**k for k in range(10, 21))  # 1K .. 1M tokens


def cache_report(n_layers: int, attn_period: int, attn_offset: int, n_kv_heads: int, head_dim: int,
                 context: int, dtype="bf16", *, state_heads: int = 32, state_d_k: int = 128,
                 state_d_v: int = 128, state_bytes_per_layer: int | None = None,
                 window: int | None = None) -> dict:
    """Memory of one sequence in a periodic hybrid: growing KV cache vs fixed recurrent state.

    Layer i is attention when i % attn_period == attn_offset (``kvcache.layer_types``); the others
    keep a linear-attention state of ``state_heads`` matrices (state_d_k, state_d_v), unless
    ``state_bytes_per_layer`` gives their size directly (e.g. ``kvcache.mamba_state_bytes``).
    Cache and state use the same ``dtype``. Sources: Jamba (arXiv:2403.19887) for the layer
    pattern, Gated DeltaNet (arXiv:2412.06464) for the state.

    Returns a dict of plain numbers: ``attention_layers`` (indices), ``n_attention_layers``,
    ``n_recurrent_layers``, ``kv_bytes_per_token``, ``kv_cache_bytes``, ``state_bytes``,
    ``total_bytes``, ``pure_attention_bytes`` (same geometry, every layer attention),
    ``saving`` (pure_attention_bytes / total_bytes) and ``crossover_context`` (tokens, or None).
    Raises ``ValueError`` on bad sizes, dtype, period or offset (from ``mlexp.kvcache``).
    """
    types = kc.layer_types(n_layers, attn_period, attn_offset)
    if state_bytes_per_layer is None:
        state_bytes_per_layer = kc.linear_state_bytes(state_heads, state_d_k, state_d_v, dtype)
    mem = kc.hybrid_memory_bytes(types, context, n_kv_heads, head_dim, state_bytes_per_layer, dtype, window)
    per_token = kc.kv_bytes_per_token(mem["n_attention_layers"], n_kv_heads, head_dim, dtype)
    pure = kc.kv_cache_bytes(n_layers, n_kv_heads, head_dim, context, dtype, window)
    return {
        "attention_layers": [i for i, kind in enumerate(types) if kind == "attention"],
        **mem,
        "kv_bytes_per_token": per_token,
        "pure_attention_bytes": pure,
        "saving": pure / mem["total_bytes"] if mem["total_bytes"] else math.nan,
        "crossover_context": kc.crossover_context(per_token, mem["state_bytes"], window),
    }


def _tokens_label(n: int) -> str:
    return f"{n // 2**20}M" if n >= 2**20 and n % 2**20 == 0 else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def plot_cache_vs_state(kv_bytes_per_token: int, state_bytes: int, contexts=CONTEXTS[::2],
                        window: int | None = None, unit: str = "GiB", logy: bool = True, ax=None,
                        title: str | None = None):
    """Stacked bars of fixed state (bottom) and KV cache (top) at each context, crossover marked.

    Args:
        kv_bytes_per_token: bytes the cache grows per token (``kvcache.kv_bytes_per_token``).
        state_bytes: fixed bytes of all recurrent layers. contexts: increasing token counts,
            evenly spaced in log scale for the crossover marker to sit correctly.
        window: sliding-window cap on the cache, or None. unit: "MiB", "GiB" (powers of 2) or "GB".
        logy: log-scale memory axis (default), so the small fixed state stays visible.
        ax: draw into this Axes; by default a new figure.
    Returns the matplotlib Axes. Raises ``ValueError`` for an empty or unsorted ``contexts``.
    """
    contexts = list(contexts)
    if not contexts or contexts != sorted(contexts):
        raise ValueError("contexts must be a non-empty increasing list of token counts.")
    cache = [kv_bytes_per_token * (min(t, window) if window else t) for t in contexts]
    with mpl.rc_context(STYLE):
        if ax is None:
            _, ax = plt.subplots()
        xs = range(len(contexts))
        state = [kc.to_unit(state_bytes, unit)] * len(contexts)
        ax.bar(xs, state, color=COLORS[2], label="recurrent state (fixed)")
        ax.bar(xs, [kc.to_unit(b, unit) for b in cache], bottom=state, color=COLORS[0],
               label="KV cache (grows with context)")
        ax.set_xticks(list(xs), [_tokens_label(t) for t in contexts])
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(f"memory per sequence ({unit})")
        positive = [v for v in state + [kc.to_unit(b, unit) for b in cache] if v > 0]
        if logy and positive:
            ax.set_yscale("log")
            ax.set_ylim(bottom=min(positive) / 4)  # keep the bottom (state) segment of every bar in view
        cross = kc.crossover_context(kv_bytes_per_token, state_bytes, window)
        if state_bytes == 0:
            ax.plot([], [], " ", label="no recurrent state: the cache is all the memory")
        elif kv_bytes_per_token == 0:
            ax.plot([], [], " ", label="no attention layer: no KV cache")
        elif cross and len(contexts) > 1 and contexts[0] <= cross <= contexts[-1]:
            # Bars sit at evenly spaced log(context); place the marker by log-interpolation.
            logs = [math.log(t) for t in contexts]
            step = (logs[-1] - logs[0]) / (len(logs) - 1)
            pos = (math.log(cross) - logs[0]) / step
            ax.axvline(pos, color=COLORS[3], linestyle="--", label=f"cache = state at {cross:,} tokens")
        elif cross is not None:
            ax.plot([], [], " ", label=f"cache = state at {cross:,} tokens (off the axis)")
        else:
            ax.plot([], [], " ", label="cache never reaches the state")
        ax.set_title(title or "A hybrid's cache grows; its recurrent state does not")
        ax.legend(loc="upper left")
    return ax


class CacheCalculator:
    """Sliders for a hybrid's geometry, a printed report and the stacked-bar plot.

    ``controls`` maps each ``cache_report`` argument to its widget; ``report`` is the latest
    result of ``cache_report`` (or ``{"error": message}`` should a setting be impossible).
    Setting any control's ``.value`` recomputes both at once, with one redraw. The offset slider
    only reaches period - 1: lowering the period pulls a larger offset down to period - 1 first,
    within the same redraw.
    """

    def __init__(self, show_plot: bool = True, **defaults):
        import ipywidgets as w  # lazily: mlexp.kvcache and the rest of mlexp need no ipywidgets

        start = {"n_layers": 32, "attn_period": 8, "attn_offset": 4, "n_kv_heads": 8, "head_dim": 128,
                 "dtype": "bf16", "context": 2**18, "state_heads": 32, "state_d_k": 128, **defaults}
        self.show_plot = show_plot
        self.controls = {
            "n_layers": w.IntSlider(value=start["n_layers"], min=1, max=128, description="layers"),
            "attn_period": w.IntSlider(value=start["attn_period"], min=1, max=16, description="attn period"),
            "attn_offset": w.IntSlider(value=start["attn_offset"], min=0, max=15, description="attn offset"),
            "n_kv_heads": w.IntSlider(value=start["n_kv_heads"], min=1, max=64, description="kv heads"),
            "head_dim": w.Dropdown(options=[64, 96, 128, 256], value=start["head_dim"], description="head dim"),
            "dtype": w.Dropdown(options=list(DTYPES), value=start["dtype"], description="dtype"),
            "context": w.Dropdown(options=[(_tokens_label(t), t) for t in CONTEXTS], value=start["context"],
                                  description="context"),
            "state_heads": w.IntSlider(value=start["state_heads"], min=1, max=128, description="state heads"),
            "state_d_k": w.Dropdown(options=[64, 128, 256], value=start["state_d_k"], description="state d_k"),
        }
        period, offset = self.controls["attn_period"], self.controls["attn_offset"]
        offset.max = period.value - 1                      # clamps a starting offset >= period
        self._clamping = False                             # True while a period change pulls the offset down
        period.observe(self._limit_offset, names="value")  # registered first: runs before the redraw
        self.output = w.Output()
        names = list(self.controls)
        self.widget = w.VBox([w.HBox([self.controls[n] for n in names[:3]]),
                              w.HBox([self.controls[n] for n in names[3:6]]),
                              w.HBox([self.controls[n] for n in names[6:]]), self.output])
        for control in self.controls.values():
            control.observe(self.update, names="value")
        self.report: dict = {}
        self.update()

    def _limit_offset(self, change) -> None:
        """Keep the offset slider inside [0, period - 1] (ipywidgets pulls its value down).

        The offset change this causes redraws nothing: the period's own redraw, which comes right
        after, shows both new values, so one change of the period gives one redraw.
        """
        self._clamping = True
        try:
            self.controls["attn_offset"].max = change["new"] - 1
        finally:
            self._clamping = False

    def values(self) -> dict:
        """Current control values as keyword arguments of ``cache_report``."""
        args = {name: control.value for name, control in self.controls.items()}
        args["state_d_v"] = args["state_d_k"]
        return args

    def update(self, change=None) -> dict:
        """Recompute the report from the controls and redraw the output; returns the report.

        Called by every control's observer; an offset change made by a period change
        (``_limit_offset``) is left to the period's own call, so each change redraws once.
        """
        from IPython.display import clear_output

        if self._clamping:
            return self.report

        try:
            self.report = cache_report(**self.values())
        except ValueError as exc:
            self.report = {"error": str(exc)}
        with self.output:
            clear_output(wait=True)
            print(self.summary())
            if self.show_plot and "error" not in self.report:
                v = self.values()
                ax = plot_cache_vs_state(self.report["kv_bytes_per_token"], self.report["state_bytes"])
                ax.figure.suptitle(f"{v['n_layers']} layers, attention at {self.report['attention_layers'][:6]}"
                                   f"{'...' if len(self.report['attention_layers']) > 6 else ''}", fontsize=9)
                plt.show()
                plt.close(ax.figure)
        return self.report

    def summary(self) -> str:
        """The report as stable printed lines (binary units)."""
        r = self.report
        if "error" in r:
            return f"cannot size this model: {r['error']}"
        cross, n_attn, n_rec = r["crossover_context"], r["n_attention_layers"], r["n_recurrent_layers"]
        if n_rec == 0:
            pure = "every layer is attention: this is the all-attention model"
            crossing = "none: without recurrent layers there is no state, the cache is all the memory"
        elif n_attn == 0:
            pure = (f"all-attention model: {kc.format_binary(r['pure_attention_bytes'])} "
                    "(this model keeps no cache at all)")
            crossing = "none: without attention layers there is no cache, the fixed state is all the memory"
        else:
            pure = (f"all-attention model: {kc.format_binary(r['pure_attention_bytes'])} "
                    f"({r['saving']:.1f}x more)")
            crossing = (f"the cache reaches the state at {cross:,} tokens" if cross is not None
                        else "the cache never reaches the state")
        return "\n".join([
            f"attention layers: {n_attn} {r['attention_layers']}; recurrent layers: {n_rec}",
            f"KV cache: {kc.format_binary(r['kv_bytes_per_token'])} per token, "
            f"{kc.format_binary(r['kv_cache_bytes'])} at this context",
            f"recurrent state: {kc.format_binary(r['state_bytes'])} whatever the context",
            f"total: {kc.format_binary(r['total_bytes'])}; {pure}",
            f"crossover: {crossing}",
        ])

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def cache_calculator(show_plot: bool = True, **defaults) -> CacheCalculator:
    """Build the lesson 04 cache calculator; display it by leaving it as a cell's last value.

    ``defaults`` override the starting values (n_layers, attn_period, attn_offset, n_kv_heads,
    head_dim, dtype, context, state_heads, state_d_k); the start is Jamba-like (32 layers, one in 8
    attention at offset 4, 8 kv heads of 128, 256K tokens). Needs ipywidgets (7.7 or 8.x).
    """
    return CacheCalculator(show_plot=show_plot, **defaults)
