"""Speed of mlexp.ops as ratios of things timed side by side in one run (issue 13's goals).

    .venv/bin/python benchmarks/ops.py                    # one thread, T = 2048, head_dim 64, CPU
    .venv/bin/python benchmarks/ops.py --skip-loop        # without the (slow) recurrent-loop table

Threads are pinned (--threads, default 1: OpenMP threads spinning against other processes made
the same forward take 7 to 75 ms on a shared 2-core machine). Every time is the median of
--repeats runs after a warm-up, printed with its spread, the interquartile range as a share of
the median; a row whose spread passes --busy (10%) is flagged BUSY: the machine was busy while it
ran and its ratios are unreliable. The clock is this thread's CPU time (--clock cpu, the default
with one thread): on a machine shared with other jobs it leaves out the time the scheduler gives
them; a row whose wall time passes its CPU time by more than --busy is flagged BUSY too. The two
things a ratio compares are timed in turn, one run of each, and the ratio is the median of the
run-by-run ratios, so a slow patch of the machine slows both sides of it. The goals of issue 13 are printed with PASS or FAIL:
  - chunkwise forward at T = 2048, head_dim 64: >= 50% of the matmul FLOP/s for linear and
    scalar-gated attention, >= 35% for per-channel gated and the two delta rules;
  - forward + backward: >= 2x faster than flash-linear-attention's pure-PyTorch reference for the
    same op, when fla is installed (pip install --no-deps fla-core einops; never a dependency).
On a CUDA machine the same command adds the Triton tables.

The ops and their order come from mlexp/ops/registry.py, and rows are named by its labels (since
issue 42: "gated, scalar g", "gated, per-channel g", "delta rule", "gated delta rule", where this
script printed "gated (scalar g)", "gated (channel g)", "delta_rule", "gated_delta_rule").
"""
import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mlexp.ops import linear_attention
from mlexp.ops.registry import OPS, make_inputs


@dataclass
class Timing:
    """Median time in seconds over repeats, its spread (interquartile range / median), the runs in
    order, and how much longer the wall clock ran than this thread's CPU time (median ratio)."""
    median: float
    spread: float
    runs: list
    wall_over_cpu: float = 1.0


CLOCK = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = "wall"                                                   # set by main(): --clock


def median_spread(xs):
    """(median, interquartile range / median) of a list of numbers."""
    xs, n = sorted(xs), len(xs)
    med = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    iqr = xs[(3 * n) // 4] - xs[n // 4] if n >= 4 else xs[-1] - xs[0]
    return med, iqr / med


def paired(a, b):
    """Median and spread of the ratio a/b taken run by run (each pair timed back to back)."""
    return median_spread([x / y for x, y in zip(a.runs, b.runs)])


def _sync(device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def measure(fns, device, repeats=9, warmup=1):
    """Time each callable of ``fns`` ``repeats`` times, interleaved (one run of each in turn), after warm-up.

    Returns one Timing per callable. Interleaving puts the same disturbances into every one.
    """
    sync = _sync(device)
    use = "wall" if device.type == "cuda" else clock             # a GPU's work is not this thread's CPU time
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync()
    runs = [{"cpu": [], "wall": []} for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, runs):
            w0, c0 = time.perf_counter(), time.thread_time()
            fn()
            sync()
            times["cpu"].append(max(time.thread_time() - c0, 1e-9))
            times["wall"].append(time.perf_counter() - w0)
    return [Timing(*median_spread(t[use]), t[use], median_spread([w / c for w, c in zip(t["wall"], t["cpu"])])[0])
            for t in runs]


def timeit(fn, device, repeats=5, warmup=1):
    """Median wall time of fn() in seconds (CUDA is synchronised before reading the clock)."""
    return measure([fn], device, repeats, warmup)[0].median


def is_busy(t, busy):
    """The machine was busy: the spread passes ``busy``, or the wall clock ran 1 + busy times this thread's CPU time."""
    return t.spread > busy or t.wall_over_cpu > 1 + busy


def show(t, busy):
    """'12.34 ms +- 3%' with a BUSY mark (see is_busy)."""
    return f"{t.median * 1e3:9.2f} ms +-{t.spread:4.0%}{' BUSY' if is_busy(t, busy) else '     '}"


def qkv(B, H, T, D, device, grad=False, dtype=torch.float32):
    """Random phi-features for q and k (elu + 1) and plain values, (B, H, T, D) each."""
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype) for _ in range(3))
    q, k = F.elu(q) + 1, F.elu(k) + 1
    return [x.requires_grad_(grad) for x in (q, k, v)]


def family_inputs(B, H, T, D, device, grad=False, dtype=torch.float32):
    """Inputs for every op of the registry (mlexp.ops.registry.make_inputs) from torch's global
    generator: q, k as phi-features as in :func:`qkv`, plain v, unit keys for the delta rule, beta in
    (0, 1), and log-decays g per head and token (B, H, T) and per key channel (B, H, T, D)."""
    return make_inputs(B, H, T, D, dtype=dtype, device=device, seed=None, grad=grad, positive=True)


# Goal: chunkwise forward FLOP/s as a share of the matmul's (issue 13), by op name; an op without one
# is timed and shown without a verdict.
FLOP_GOAL = {"linear": 0.50, "gated_scalar": 0.50, "gated_channel": 0.35, "delta": 0.35, "gated_delta": 0.35}


def fwd_bwd(op):
    """A callable running op() and a backward pass through its output."""
    def run():
        o = op()
        o = o[0] if isinstance(o, tuple) else o
        o.sum().backward()
    return run


def chunk_flops(name, T, D, C):
    """Matmul operations of the chunkwise forward per head (a multiply-add counts 2).

    Linear and gated, per block of C tokens: Q K^T and A V (2 C^2 D each), K^T V and Q S
    (2 C D^2 each). Delta rules: K K^T, W = T K, U = T V, Q K^T, P V' (2 C^2 D each), W S, Q S,
    K^T V' (2 C D^2 each) and the triangular inverse (C^3 / 3).
    """
    N = -(-T // C)
    if "delta" in name:
        return N * (10 * C * C * D + 6 * C * D * D + C ** 3 // 3)
    return N * (4 * C * C * D + 4 * C * D * D)


def warm_up(a, device):
    """Run every op (forward and backward) and the matmul a few times before anything is timed.

    A fresh process pays for its first large allocations (the allocator maps new pages and
    learns its thresholds); without this, whichever op is timed first looks 1.5-2x slower.
    """
    x = family_inputs(a.batch, a.heads, a.family_T, a.head_dim, device, grad=True)
    m = torch.randn(a.matmul_n, a.matmul_n, device=device)
    for _ in range(3):
        for op in OPS.values():
            fwd_bwd(lambda: op(x, "chunk", chunk_size=a.chunk))()
        m @ m


def flop_table(a, device):
    """Goal 1: every op's chunkwise forward FLOP/s against a 1024^3 matmul timed interleaved with it."""
    B, H, D, C, T = a.batch, a.heads, a.head_dim, a.chunk, a.family_T
    n = a.matmul_n
    x_mm, y_mm = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    print(f"\n## chunkwise forward FLOP/s vs a {n}^3 torch.matmul timed beside it, T={T}")
    print("share: the op's FLOP/s over the matmul's, run by run (each pair back to back), median +- IQR/median")
    print(f"{'op':>20} {'chunk forward':>23} {'matmul':>23} {'GFLOP/s':>8} {'share':>12} {'goal':>5}")
    tiles = torch.randn(B * H * (-(-T // C)), C, D, device=device)   # the shape of every matmul of the chunk form
    t_tile, t_mm = measure([lambda: torch.bmm(tiles, tiles.transpose(1, 2)), lambda: x_mm @ y_mm], device, a.repeats)
    inv, spread = paired(t_tile, t_mm)
    rate = 2 * tiles.shape[0] * C * C * D / t_tile.median
    print(f"{'(C, D) @ (D, C) bmm':>20} {show(t_tile, a.busy)} {show(t_mm, a.busy)} {rate / 1e9:>8.1f} "
          f"{tiles.shape[0] * C * C * D / n ** 3 / inv:>5.0%} +-{spread:3.0%}        the ceiling: batched tiles alone")
    results = {}
    for name, op in OPS.items():
        x = family_inputs(B, H, T, D, device)
        t_op, t_mm = measure([lambda: op(x, "chunk", chunk_size=C), lambda: x_mm @ y_mm], device, a.repeats)
        rate = B * H * chunk_flops(name, T, D, C) / t_op.median
        inv, spread = paired(t_op, t_mm)                         # op time / matmul time, per pair
        share = B * H * chunk_flops(name, T, D, C) / (2 * n ** 3) / inv
        results[name] = share
        goal = FLOP_GOAL.get(name)
        goal = f"{goal:>5.0%} {'PASS' if share >= goal else 'FAIL'}" if goal is not None else f"{'-':>5}"
        print(f"{op.label:>20} {show(t_op, a.busy)} {show(t_mm, a.busy)} {rate / 1e9:>8.1f} {share:>5.0%} "
              f"+-{spread:3.0%} {goal}")
    return results


def _fla_references():
    """fla's pure-PyTorch references as callables on our inputs dict, or (None, why not)."""
    try:
        from fla.ops.delta_rule.naive import delta_rule_chunkwise
        from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule
        from fla.ops.gla.naive import naive_recurrent_gla
        from fla.ops.linear_attn.naive import naive_chunk_linear_attn
        from fla.ops.simple_gla.naive import naive_chunk_simple_gla
    except Exception as e:                                       # noqa: BLE001 - any import failure means skip
        return None, f"{type(e).__name__}: {e}"
    t = lambda x: x.transpose(1, 2)                               # fla's (B, T, H, ...) layout  # noqa: E731
    # by op name (an op fla has no reference of is left out of the table):
    # (callable(inputs, chunk), chunk sizes to try: the fastest counts, what it is)
    return {
        "linear": (lambda x, C: naive_chunk_linear_attn(t(x["q"]), t(x["k"]), t(x["v"]), scale=1.0),
                   (64,), "naive_chunk_linear_attn"),
        "gated_scalar": (lambda x, C: naive_chunk_simple_gla(t(x["q"]), t(x["k"]), t(x["v"]), t(x["g"]),
                                                             chunk_size=C, scale=1.0)[0],
                         (32, 64), "naive_chunk_simple_gla"),
        "gated_channel": (lambda x, C: naive_recurrent_gla(t(x["q"]), t(x["k"]), t(x["v"]), t(x["g_ch"]))[0],
                          (None,), "naive_recurrent_gla (fla has no PyTorch chunk form for GLA)"),
        "delta": (lambda x, C: delta_rule_chunkwise(x["q"], x["k_unit"], x["v"], x["beta"], chunk_size=C)[0],
                  (32, 64), "delta_rule_chunkwise"),
        "gated_delta": (lambda x, C: naive_chunk_gated_delta_rule(t(x["q"]), t(x["k_unit"]), t(x["v"]), t(x["g"]),
                                                                  t(x["beta"]), chunk_size=C, scale=1.0)[0],
                        (32, 64), "naive_chunk_gated_delta_rule"),
    }, None


def fla_table(a, device):
    """Goal 2: forward + backward against fla's pure-PyTorch reference of the same op (when installed)."""
    B, H, D, C, T = a.batch, a.heads, a.head_dim, a.chunk, a.family_T
    refs, why = _fla_references()
    print(f"\n## forward+backward vs flash-linear-attention's pure-PyTorch reference, T={T}")
    if refs is None:
        print(f"fla: not importable ({why}); skipped. Install it beside the course to compare: "
              "pip install --no-deps fla-core einops")
        return None
    print(f"{'op':>20} {'ours (chunk)':>23} {'fla':>23} {'fla/ours':>9} {'goal':>5}  fla function (chunk)")
    results = {}
    for name, op in OPS.items():
        if name not in refs:
            print(f"{op.label:>20} no fla reference to compare with")
            continue
        fn, chunks, what = refs[name]
        x = family_inputs(B, H, T, D, device, grad=True)
        with torch.no_grad():                                    # same op, same numbers (fla's scale set to 1)
            o, o_ref = op(x, "chunk", chunk_size=C)[0], fn(x, chunks[0])
            o_ref = o_ref if name == "delta" else o_ref.transpose(1, 2)
            if name in ("gated_channel", "delta"):
                o_ref = o_ref * D ** 0.5                         # these two always scale q by Dk^-0.5
            err = ((o - o_ref).norm() / o.norm()).item()
        fla_t, fla_c = None, None
        for c in chunks:
            t_ours, t_fla = measure([fwd_bwd(lambda: op(x, "chunk", chunk_size=C)), fwd_bwd(lambda: fn(x, c))], device,
                                    a.repeats if c else 3)
            if fla_t is None or t_fla.median < fla_t.median:
                fla_t, fla_c, ours_t = t_fla, c, t_ours
        ratio, _ = paired(fla_t, ours_t)
        results[name] = ratio
        print(f"{op.label:>20} {show(ours_t, a.busy)} {show(fla_t, a.busy)} {ratio:>8.1f}x {2:>4}x "
              f"{'PASS' if ratio >= 2 else 'FAIL'}  {what} ({fla_c or 'loop'}); outputs agree to {err:.0e}")
    return results


def loop_table(a, device):
    """Every op's chunkwise form against its recurrent loop (the readable reference)."""
    B, H, D, C, T = a.batch, a.heads, a.head_dim, a.chunk, a.family_T
    print(f"\n## chunkwise vs the recurrent loop, T={T} (the loop timed {a.loop_repeats} times)")
    print(f"{'op':>20} {'fwd: loop/chunk':>16} {'f+b: loop/chunk':>16}")
    for op in OPS.values():
        row = []
        for grad in (False, True):
            x = family_inputs(B, H, T, D, device, grad=grad)
            wrap = fwd_bwd if grad else (lambda f: f)
            t_loop, t_chunk = measure([wrap(lambda: op(x, "recurrent", chunk_size=C)),
                                       wrap(lambda: op(x, "chunk", chunk_size=C))], device, a.loop_repeats, warmup=0)
            row.append(f"{paired(t_loop, t_chunk)[0]:>15.1f}x" + ("!" if is_busy(t_chunk, a.busy) else " "))
        print(f"{op.label:>20} {row[0]} {row[1]}")


def sdpa_table(a, device):
    """Chunkwise linear attention against causal softmax attention (F.scaled_dot_product_attention)."""
    B, H, D, C = a.batch, a.heads, a.head_dim, a.chunk
    print("\n## causal softmax attention (SDPA) time / chunkwise linear attention time, forward")
    print(f"{'T':>6} {'sdpa/chunk':>11}")
    crossover = None
    for T in sorted(set([128, 256, 512, a.family_T])):
        q, k, v = qkv(B, H, T, D, device)
        t_sdpa, t_chunk = measure([lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                   lambda: linear_attention(q, k, v, impl="chunk", chunk_size=C)], device, a.repeats)
        ratio = paired(t_sdpa, t_chunk)[0]
        print(f"{T:>6} {ratio:>11.2f}{' BUSY' if is_busy(t_sdpa, a.busy) or is_busy(t_chunk, a.busy) else ''}")
        crossover = (crossover or T) if ratio > 1 else None      # from where chunk stays ahead
    print(f"crossover: chunkwise linear attention is faster from T = {crossover} on" if crossover
          else "crossover: not reached in this range")


def edge_costs(a, device):
    """What the edge handling costs: hard resets (exact form in their chunks) and the non-finite check."""
    B, H, D, C, T = a.batch, a.heads, a.head_dim, a.chunk, a.family_T
    print(f"\n## cost of the edge handling, chunkwise forward, T={T}")
    x = family_inputs(B, H, T, D, device)
    reset = dict(x)                                              # a document boundary every 512 tokens
    reset["g"], reset["g_ch"] = x["g"].clone(), x["g_ch"].clone()
    reset["g"][:, :, 512::512] = float("-inf")
    reset["g_ch"][:, :, 512::512] = float("-inf")
    print(f"{'op':>20} {'with resets / without':>22} {'finite check / forward':>23}")
    for op in [op for op in OPS.values() if {"g", "g_ch"} & set(op.inputs)]:      # the ops with a gate
        o = op(x, "chunk", chunk_size=C)
        t_plain, t_reset, t_check = measure([lambda: op(x, "chunk", chunk_size=C),
                                             lambda: op(reset, "chunk", chunk_size=C),
                                             lambda: bool(torch.isfinite(sum(y.sum() for y in o)))], device, a.repeats)
        print(f"{op.label:>20} {paired(t_reset, t_plain)[0]:>21.2f}x {paired(t_check, t_plain)[0]:>22.1%}"
              f"{' BUSY' if is_busy(t_plain, a.busy) or is_busy(t_reset, a.busy) else ''}")
    n_resets, n_chunks = len(range(512, T, 512)), -(-T // C)
    print(f"(resets: g = -inf every 512 tokens, so {n_resets} of {n_chunks} chunks per head take the exact form; "
          "finite check: the sum over the outputs that decides whether any input was NaN or inf)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=[2048], help="sequence lengths of the CUDA tables")
    p.add_argument("--family-T", type=int, default=2048, help="T of the CPU tables (the goals are stated at 2048)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--chunk", type=int, default=64, help="chunk size C")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steady on a shared machine)")
    p.add_argument("--repeats", type=int, default=9, help="timed runs per measurement (the median is reported)")
    p.add_argument("--loop-repeats", type=int, default=3, help="timed runs of the slow recurrent-loop table")
    p.add_argument("--busy", type=float, default=0.10, help="spread (IQR / median) above which a row is flagged BUSY")
    p.add_argument("--matmul-n", type=int, default=1024, help="size of the square matmul giving the reference FLOP/s")
    p.add_argument("--skip-loop", action="store_true", help="leave out the recurrent-loop table (the slowest part)")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                   help="CPU timings: this thread's CPU time (default; leaves out the time the scheduler gives "
                        "other processes, which needs --threads 1) or the wall clock")
    a = p.parse_args()
    global clock
    clock = "wall" if a.threads != 1 else a.clock                # other threads' work is not this thread's time
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    device = torch.device("cpu")
    print(f"# B={a.batch}, H={a.heads}, head_dim={a.head_dim}, chunk C={a.chunk}, float32, "
          f"{torch.get_num_threads()} thread(s), {device}; median of {a.repeats} runs +- IQR/median; "
          f"clock: {'this thread' + chr(39) + 's CPU time' if clock == 'cpu' else 'wall'}")
    warm_up(a, device)
    shares = flop_table(a, device)
    vs_fla = fla_table(a, device)
    edge_costs(a, device)
    sdpa_table(a, device)
    if not a.skip_loop:
        loop_table(a, device)
    print("\n## issue 13 goals")
    for name, share in shares.items():
        if name in FLOP_GOAL:
            print(f"forward FLOP/s share {OPS[name].label}: {share:.0%} (goal >= {FLOP_GOAL[name]:.0%}): "
                  f"{'PASS' if share >= FLOP_GOAL[name] else 'FAIL'}")
    for name, ratio in (vs_fla or {}).items():
        print(f"forward+backward vs fla {OPS[name].label}: {ratio:.1f}x (goal >= 2x): "
              f"{'PASS' if ratio >= 2 else 'FAIL'}")
    if vs_fla is None:
        print("forward+backward vs fla: not measured (fla not installed)")
    if torch.cuda.is_available():   # the Triton kernels: correctness first, then the timed tables
        import ops_cuda             # benchmarks/ops_cuda.py, beside this file
        ops_cuda.main(["--budget", "600"])
    else:
        print("\nCUDA: not available here; on a GPU machine this same command adds the Triton tables "
              "(benchmarks/ops_cuda.py: correctness, then Triton vs chunkwise vs fla, grids vs SMs).")


if __name__ == "__main__":
    main()
