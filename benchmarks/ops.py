"""Speed of mlexp.ops, as ratios timed side by side in one run: chunkwise vs recurrent, vs SDPA, vs matmul.

    .venv/bin/python benchmarks/ops.py            # CPU here; on a CUDA machine it adds Triton (and fla)

Every time is the fastest of a few repeats after a warm-up (the run least disturbed by other
processes), measured in this run; the ratios, not the milliseconds, carry over between machines.
"""
import argparse
import time

import torch
import torch.nn.functional as F

from mlexp.ops import delta_rule, gated_delta_rule, gated_linear_attention, linear_attention


def timeit(fn, device, repeats=5, warmup=1):
    """Fastest wall time of fn() over ``repeats`` runs, in seconds (CUDA is synchronised before reading the clock)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def qkv(B, H, T, D, device, grad=False, dtype=torch.float32):
    """Random phi-features for q and k (elu + 1) and plain values, (B, H, T, D) each."""
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype) for _ in range(3))
    q, k = F.elu(q) + 1, F.elu(k) + 1
    return [x.requires_grad_(grad) for x in (q, k, v)]


def family_inputs(B, H, T, D, device, grad=False, dtype=torch.float32):
    """Inputs for every op of the family: q, k, v as in :func:`qkv`, unit keys for the delta rule,
    beta in (0, 1), and log-decays g per head and token (B, H, T) and per key channel (B, H, T, D)."""
    q, k, v = qkv(B, H, T, D, device, dtype=dtype)
    k_unit = F.normalize(torch.randn(B, H, T, D, device=device, dtype=dtype), dim=-1)
    beta = torch.sigmoid(torch.randn(B, H, T, device=device, dtype=dtype))
    g = F.logsigmoid(torch.randn(B, H, T, device=device, dtype=dtype) + 3)
    g_ch = F.logsigmoid(torch.randn(B, H, T, D, device=device, dtype=dtype) + 3)
    xs = dict(q=q, k=k, v=v, k_unit=k_unit, beta=beta, g=g, g_ch=g_ch)
    return {n: x.requires_grad_(grad) for n, x in xs.items()}


# The four public ops, each called the same way: fn(impl, inputs dict, chunk size).
FAMILY = {
    "linear": lambda impl, x, C: linear_attention(x["q"], x["k"], x["v"], impl=impl, chunk_size=C),
    "gated (scalar g)": lambda impl, x, C: gated_linear_attention(x["q"], x["k"], x["v"], x["g"], impl=impl, chunk_size=C),
    "gated (channel g)": lambda impl, x, C: gated_linear_attention(x["q"], x["k"], x["v"], x["g_ch"], impl=impl, chunk_size=C),
    "delta_rule": lambda impl, x, C: delta_rule(x["q"], x["k_unit"], x["v"], x["beta"], impl=impl, chunk_size=C),
    "gated_delta_rule": lambda impl, x, C: gated_delta_rule(x["q"], x["k_unit"], x["v"], x["beta"], x["g"], impl=impl, chunk_size=C),
}


def fwd_bwd(op):
    """A callable running op() and a backward pass through its output."""
    def run():
        o = op()
        o = o[0] if isinstance(o, tuple) else o
        o.sum().backward()
    return run


def chunk_flops(T, D, C):
    """Operations of the chunkwise forward per head (1 multiply-add = 2): per block of C tokens
    Q K^T and A V (2 C^2 D each), K^T V and Q S (2 C D^2 each)."""
    N = -(-T // C)
    return N * (4 * C * C * D + 4 * C * D * D)


def cpu_tables(a, device):
    B, H, D, C = a.batch, a.heads, a.head_dim, a.chunk
    print(f"# shapes: B={B}, H={H}, head_dim={D}, chunk C={C}, float32, {torch.get_num_threads()} threads, {device}")
    print("\n## chunkwise vs recurrent (linear_attention, unnormalised)")
    print(f"recurrent timed on the full T up to T={a.recurrent_max} (forward) and T={a.recurrent_bwd_max} "
          "(forward+backward); beyond that its time is the time measured there scaled by the ratio of T "
          "(a loop: its cost per token is constant), marked *")
    print(f"{'T':>6} {'rec fwd ms':>11} {'chunk fwd ms':>13} {'fwd x':>7} {'rec f+b ms':>11} {'chunk f+b ms':>13} {'f+b x':>7}")
    results, rec_cache = {}, {}

    def recurrent_time(T, grad):
        """Time of the recurrent loop at T (measured once per length, reused for longer T)."""
        if (T, grad) not in rec_cache:
            q, k, v = qkv(B, H, T, D, device, grad=grad)
            op = lambda: linear_attention(q, k, v, impl="recurrent")      # noqa: E731
            rec_cache[T, grad] = timeit(fwd_bwd(op) if grad else op, device, repeats=3, warmup=0)
        return rec_cache[T, grad]

    for T in a.T:
        Tr, Tb = min(T, a.recurrent_max), min(T, a.recurrent_bwd_max)
        rec = recurrent_time(Tr, False) * T / Tr
        rec_fb = recurrent_time(Tb, True) * T / Tb
        q, k, v = qkv(B, H, T, D, device)
        chunk = timeit(lambda: linear_attention(q, k, v, impl="chunk", chunk_size=C), device)
        q, k, v = qkv(B, H, T, D, device, grad=True)
        chunk_fb = timeit(fwd_bwd(lambda: linear_attention(q, k, v, impl="chunk", chunk_size=C)), device)
        mark, mark_b = ("*" if Tr < T else " "), ("*" if Tb < T else " ")
        print(f"{T:>6} {rec * 1e3:>10.1f}{mark} {chunk * 1e3:>13.2f} {rec / chunk:>7.1f} "
              f"{rec_fb * 1e3:>10.1f}{mark_b} {chunk_fb * 1e3:>13.2f} {rec_fb / chunk_fb:>7.1f}")
        results[T] = dict(fwd_speedup=rec / chunk, chunk_s=chunk)

    print("\n## chunkwise linear attention vs causal softmax attention (F.scaled_dot_product_attention), forward")
    print(f"{'T':>6} {'sdpa ms':>9} {'chunk ms':>9} {'sdpa/chunk':>11}")
    crossover = None
    for T in sorted(set([128, 256] + list(a.T))):
        q, k, v = qkv(B, H, T, D, device)
        sdpa = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device)
        chunk = timeit(lambda: linear_attention(q, k, v, impl="chunk", chunk_size=C), device)
        print(f"{T:>6} {sdpa * 1e3:>9.2f} {chunk * 1e3:>9.2f} {sdpa / chunk:>11.2f}")
        if sdpa > chunk and crossover is None:
            crossover = T
        elif sdpa <= chunk:
            crossover = None                               # the crossover is where chunk stays ahead
    print(f"crossover: chunkwise linear attention is faster from T = {crossover} on" if crossover
          else "crossover: not reached in this range")

    print("\n## chunkwise forward FLOP/s vs torch.matmul FLOP/s, both measured now")
    n = a.matmul_n
    x, y = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    mm = 2 * n ** 3 / timeit(lambda: x @ y, device)
    tiles = torch.randn(B * H * (2048 // C), C, D, device=device)
    mm_tile = 2 * tiles.shape[0] * C * C * D / timeit(lambda: tiles @ tiles.transpose(1, 2), device)
    print(f"torch.matmul {n}x{n} @ {n}x{n}: {mm / 1e9:.1f} GFLOP/s; "
          f"batched ({C}x{D}) @ ({D}x{C}) tiles: {mm_tile / 1e9:.1f} GFLOP/s")
    print(f"{'T':>6} {'chunk GFLOP/s':>14} {'of matmul':>10} {'of tile matmul':>15}")
    for T in a.T:
        rate = B * H * chunk_flops(T, D, C) / results[T]["chunk_s"]
        results[T]["frac"] = rate / mm
        print(f"{T:>6} {rate / 1e9:>14.1f} {rate / mm:>9.0%} {rate / mm_tile:>14.0%}")

    T = a.family_T
    print(f"\n## every op at T={T}: chunkwise vs recurrent, forward and forward+backward")
    print(f"{'op':>18} {'rec fwd ms':>11} {'chunk fwd ms':>13} {'fwd x':>7} {'rec f+b ms':>11} {'chunk f+b ms':>13} {'f+b x':>7}")
    for name, op in FAMILY.items():
        row = []
        for grad in (False, True):
            x = family_inputs(B, H, T, D, device, grad=grad)
            wrap = fwd_bwd if grad else (lambda f: f)
            rec = timeit(wrap(lambda: op("recurrent", x, C)), device, repeats=2, warmup=0)
            chunk = timeit(wrap(lambda: op("chunk", x, C)), device)
            row += [rec, chunk]
        print(f"{name:>18} {row[0] * 1e3:>11.1f} {row[1] * 1e3:>13.2f} {row[0] / row[1]:>7.1f} "
              f"{row[2] * 1e3:>11.1f} {row[3] * 1e3:>13.2f} {row[2] / row[3]:>7.1f}")

    if 2048 in results:
        r = results[2048]
        ok = r["fwd_speedup"] >= 20 and r["frac"] >= 0.30
        print(f"\ndone-criterion (issue 3) at T=2048, head_dim {D}: chunk/recurrent forward = {r['fwd_speedup']:.1f}x "
              f"(goal >= 20x); chunk FLOP/s = {r['frac']:.0%} of matmul (goal >= 30%): {'PASS' if ok else 'FAIL'}")


def _fla_ops():
    """fla's chunk kernels as callables taking our inputs dict (B, H, T, D), or the reason they are missing."""
    try:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.gla import chunk_gla
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:                                       # noqa: BLE001 - any import failure means skip
        return None, f"{type(e).__name__}: {e}"
    t = lambda x: x.transpose(1, 2)                               # fla takes (B, T, H, D)  # noqa: E731
    return {
        "linear": lambda x: chunk_simple_gla(t(x["q"]), t(x["k"]), t(x["v"]), scale=1.0)[0],
        "gated (scalar g)": lambda x: chunk_simple_gla(t(x["q"]), t(x["k"]), t(x["v"]), g=t(x["g"]), scale=1.0)[0],
        "gated (channel g)": lambda x: chunk_gla(t(x["q"]), t(x["k"]), t(x["v"]), g=t(x["g_ch"]), scale=1.0)[0],
        "delta_rule": lambda x: chunk_delta_rule(t(x["q"]), t(x["k_unit"]), t(x["v"]), t(x["beta"]), scale=1.0)[0],
        "gated_delta_rule": lambda x: chunk_gated_delta_rule(t(x["q"]), t(x["k_unit"]), t(x["v"]), t(x["g"]),
                                                             t(x["beta"]), scale=1.0)[0],
    }, None


def cuda_tables(a, device):
    """Triton kernels (and fla's, when importable) against the chunkwise PyTorch path, on the GPU."""
    B, H, D, C = a.batch, a.heads, a.head_dim, a.chunk
    print(f"\n## CUDA ({torch.cuda.get_device_name()}): B={B}, H={H}, head_dim={D}, bfloat16 inputs")
    fla, why = _fla_ops()
    print("fla: " + ("found, its chunk kernels are timed too" if fla else f"not importable ({why}), skipped"))
    print(f"{'op':>18} {'T':>6} {'pass':>5} {'chunk ms':>9} {'triton ms':>10} {'chunk/triton':>13} {'fla ms':>8} {'fla/triton':>11}")
    for name, op in FAMILY.items():
        for T in a.T:
            for mode in ("fwd", "f+b"):
                x = family_inputs(B, H, T, D, device, grad=mode == "f+b", dtype=torch.bfloat16)
                wrap = fwd_bwd if mode == "f+b" else (lambda f: f)
                times = {impl: timeit(wrap(lambda impl=impl: op(impl, x, C)), device) for impl in ("chunk", "triton")}
                line = (f"{name:>18} {T:>6} {mode:>5} {times['chunk'] * 1e3:>9.2f} {times['triton'] * 1e3:>10.2f} "
                        f"{times['chunk'] / times['triton']:>13.2f}")
                if fla:
                    try:
                        f_t = timeit(wrap(lambda: fla[name](x)), device)
                        line += f" {f_t * 1e3:>8.2f} {f_t / times['triton']:>11.2f}"
                    except Exception as e:                       # noqa: BLE001 - report and go on
                        line += f" fla failed: {type(e).__name__}"
                print(line)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192], help="sequence lengths")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--chunk", type=int, default=64, help="chunk size C")
    p.add_argument("--recurrent-max", type=int, default=2048, help="longest T the recurrent forward is run at")
    p.add_argument("--recurrent-bwd-max", type=int, default=1024, help="longest T the recurrent forward+backward is run at")
    p.add_argument("--family-T", type=int, default=2048, help="T of the every-op table")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice); 1 gives steadier numbers on a busy machine")
    p.add_argument("--matmul-n", type=int, default=1024, help="size of the square matmul giving the reference FLOP/s")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cpu_tables(a, torch.device("cpu"))
    if torch.cuda.is_available():
        cuda_tables(a, torch.device("cuda"))
    else:
        print("\nCUDA: not available here; on a GPU machine this same command adds the Triton (and fla) tables.")


if __name__ == "__main__":
    main()
