"""mlexp.widgets: the pure cache_report, the plot helper and the calculator built headless."""
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mlexp import kvcache as kc  # noqa: E402
from mlexp.widgets import cache_calculator, cache_report, plot_cache_vs_state  # noqa: E402


def test_cache_report_reproduces_qwen3_next_from_its_config():
    qwen = kc.CONFIGS["qwen3-next-80b-a3b"]
    period = qwen.attention_layers[1] - qwen.attention_layers[0]
    r = cache_report(qwen.n_layers, period, qwen.attention_layers[0], qwen.n_kv_heads, qwen.head_dim,
                     context=4096, dtype="bf16", state_heads=32, state_d_k=128, state_d_v=128)
    assert r["attention_layers"] == qwen.attention_layers
    assert r["kv_bytes_per_token"] == qwen.kv_bytes_per_token() == 24 * kc.KiB
    assert r["state_bytes"] == qwen.state_bytes() == 36 * kc.MiB
    assert r["crossover_context"] == 1536
    assert r["kv_cache_bytes"] == 4096 * 24 * kc.KiB
    assert r["total_bytes"] == r["kv_cache_bytes"] + r["state_bytes"]
    assert r["pure_attention_bytes"] == 4 * r["kv_cache_bytes"]


def test_cache_report_jamba_with_mamba_state_bytes():
    jamba = kc.CONFIGS["jamba-v0.1"]
    mamba = kc.mamba_state_bytes(2 * 4096, 16, "bf16")
    r = cache_report(32, 8, 4, 8, 128, context=2**18, state_bytes_per_layer=mamba)
    assert r["kv_cache_bytes"] == jamba.cache_bytes(2**18) == 4 * kc.GiB
    assert r["state_bytes"] == jamba.state_bytes() == 28 * mamba
    assert r["pure_attention_bytes"] == 32 * kc.GiB and r["saving"] > 7.9


def test_cache_report_changes_with_dtype_and_rejects_bad_pattern():
    small = cache_report(8, 2, 1, 4, 64, context=100, dtype="bf16")
    big = cache_report(8, 2, 1, 4, 64, context=100, dtype="fp32")
    assert big["total_bytes"] == 2 * small["total_bytes"]
    with pytest.raises(ValueError, match="offset"):
        cache_report(8, 2, 2, 4, 64, context=100)
    with pytest.raises(ValueError, match="period"):
        cache_report(8, 0, 0, 4, 64, context=100)


def test_plot_marks_the_crossover():
    ax = plot_cache_vs_state(24 * kc.KiB, 36 * kc.MiB, contexts=[1024, 4096, 16384])
    labels = ax.get_legend_handles_labels()[1]
    assert any("1,536 tokens" in label for label in labels)
    assert len(ax.patches) == 6  # a state bar and a cache bar per context
    (line,) = [l for l in ax.lines if l.get_linestyle() == "--"]
    assert 0 < line.get_xdata()[0] < 1  # 1,536 lies between the 1K and 4K bars
    plt.close(ax.figure)
    ax = plot_cache_vs_state(16 * kc.KiB, 10**12, window=2048)
    assert any("never" in label for label in ax.get_legend_handles_labels()[1])
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="increasing"):
        plot_cache_vs_state(1, 1, contexts=[4096, 1024])


def test_calculator_builds_headless_and_updates_on_slider_change():
    pytest.importorskip("ipywidgets")
    calc = cache_calculator(show_plot=False)
    assert calc.report["attention_layers"] == [4, 12, 20, 28]
    first = calc.report["kv_cache_bytes"]
    calc.controls["n_kv_heads"].value = 16                     # observer fires on .value
    assert calc.report["kv_cache_bytes"] == 2 * first
    calc.controls["attn_period"].value = 4
    calc.controls["attn_offset"].value = 3
    assert calc.report["attention_layers"] == list(range(3, 32, 4))
    assert "attention layers: 8" in calc.summary()
    calc.controls["attn_offset"].value = 7                     # beyond the period: held at period - 1
    assert calc.controls["attn_offset"].value == 3 and "error" not in calc.report
    calc.controls["attn_offset"].value = 1
    assert calc.report["attention_layers"] == list(range(1, 32, 4))


def test_one_redraw_per_change(monkeypatch):
    """Issue 26 item 10: a period change that also pulls the offset down redraws once, not twice."""
    pytest.importorskip("ipywidgets")
    import IPython.display

    calc = cache_calculator(show_plot=False)                    # period 8, offset 4
    redraws = []
    real = IPython.display.clear_output
    monkeypatch.setattr(IPython.display, "clear_output", lambda *a, **kw: (redraws.append(1), real(*a, **kw)))
    calc.controls["attn_period"].value = 3                      # moves the offset 4 -> 2 as well
    assert calc.controls["attn_offset"].value == 2 and len(redraws) == 1, len(redraws)
    assert calc.report["attention_layers"] == list(range(2, 32, 3))   # the one redraw shows both
    assert f"attention layers: {len(range(2, 32, 3))} " in calc.summary()
    for control, value in (("attn_period", 5), ("attn_offset", 4), ("n_kv_heads", 4), ("attn_period", 2)):
        redraws.clear()
        calc.controls[control].value = value
        assert len(redraws) == 1, (control, value, len(redraws))
    assert calc.controls["attn_offset"].value == 1 and calc.report["attention_layers"] == list(range(1, 32, 2))


def test_every_slider_position_gives_a_sensible_report():
    """Issue 14 item 16: period 1 with the offset at 4, a model without attention or without
    recurrent layers: always a report, never '0 tokens' or '1.0x more'."""
    pytest.importorskip("ipywidgets")
    calc = cache_calculator(show_plot=False)
    seen = set()
    for n_layers in (1, 3, 8, 32):
        calc.controls["n_layers"].value = n_layers
        for period in (8, 1, 2, 5, 16, 3):
            calc.controls["attn_period"].value = period
            assert calc.controls["attn_offset"].max == period - 1
            for offset in range(16):
                calc.controls["attn_offset"].value = offset
                assert calc.controls["attn_offset"].value == min(offset, period - 1)
                r, text = calc.report, calc.summary()
                assert "error" not in r, (n_layers, period, offset, r)
                assert r["attention_layers"] == [i for i in range(n_layers) if i % period == min(offset, period - 1)]
                assert " 0 tokens" not in text and "1.0x more" not in text and "nan" not in text, text
                seen.add((r["n_attention_layers"] > 0, r["n_recurrent_layers"] > 0))
    assert seen == {(True, True), (True, False), (False, True)}
    calc.controls["n_layers"].value, calc.controls["attn_period"].value = 8, 1
    assert "every layer is attention" in calc.summary() and "no state" in calc.summary()
    calc.controls["n_layers"].value, calc.controls["attn_period"].value = 3, 8
    calc.controls["attn_offset"].value = 5
    assert "no cache" in calc.summary()


def test_plot_without_state_or_without_cache_says_so():
    ax = plot_cache_vs_state(16 * kc.KiB, 0)
    assert any("no recurrent state" in label for label in ax.get_legend_handles_labels()[1])
    plt.close(ax.figure)
    ax = plot_cache_vs_state(0, 36 * kc.MiB)
    assert any("no KV cache" in label for label in ax.get_legend_handles_labels()[1])
    plt.close(ax.figure)


def test_calculator_draws_its_plot():
    pytest.importorskip("ipywidgets")
    before = len(plt.get_fignums())
    calc = cache_calculator(show_plot=True, context=4096)
    calc.controls["dtype"].value = "fp32"
    assert calc.report["kv_bytes_per_token"] == 2 * 4 * 8 * 128 * 4
    assert len(plt.get_fignums()) == before  # each redraw shows then closes its figure


def test_kvcache_import_needs_no_ipywidgets():
    code = "import sys, mlexp.kvcache; assert 'ipywidgets' not in sys.modules and 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
