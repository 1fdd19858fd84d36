"""One lent GPU window: compile every kernel in parallel first, then correctness and timing from the warm cache.

    python benchmarks/gpu_run.py --budget 840             # on the lent GPU (15 minutes, a minute to spare)
    python benchmarks/gpu_run.py --dry-run                # anywhere: the plan, the compilations, an estimate
    python benchmarks/gpu_run.py --measure-compile        # here, no GPU: time AOT compiles for the estimate

1. Compile. The launches of every op (forward and backward) are recorded on ``meta`` tensors at
   every shape of the run, as the wrappers make them for this GPU's SM count and architecture
   (mlexp.ops.triton_check.op_launches), and grouped into units, one per (op, dtype, head_dim,
   kernel); a launch that an earlier unit already compiles (same kernel, constexprs, warps,
   stages and argument specialisation) is not repeated. A pool of ``--jobs`` processes (16 by
   default: the lent machine's cores) takes one unit at a time and calls ``kernel.warmup`` for its launches into
   one shared ``TRITON_CACHE_DIR``; a unit whose warm-up fails is redone by running its op once
   on the GPU at each shape (Triton's compile-on-first-call). With fla importable, one more
   process per (op, head_dim) runs fla's kernels once at the run's shapes, into the same cache.
2. Correctness: the 15 cases of benchmarks/ops_cuda.py (five ops, i.e. linear attention, the
   scalar and per-channel gates, the delta rule and the gated delta rule, at three small and
   ragged shapes): Triton against the float32 chunk path, output, final state, every gradient.
3. Timing: forward and forward+backward at the three shapes of ops_cuda.py, Triton vs the chunk
   path and vs fla (median of repeats, CUDA events); and the gated delta rule's state pass as it
   is against its tile choice before issue 29 (VARIANTS), Triton only, at the issue's two shapes.
Within 2 and 3 the cases never measured on a GPU before (MEASURED) come first. Every finished case
is written at once to ``--out`` (JSON) and its table rendered from it into the .md beside it
(benchmarks/gpu_results.py; docs/contributors.md, "The Triton kernels", describes the run), so a
run cut short still reports every case it reached.
"""
import argparse
import concurrent.futures
import contextlib
import datetime
import heapq
import json
import multiprocessing
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_cuda  # noqa: E402  (benchmarks/ is not a package)
from gpu_results import MODES, render, save, write_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
COMPILE_TIMES = os.path.join(HERE, "compile_times.json")

# What the first H200 window (2026-12-01) reached: these cases go last.
MEASURED = {
    ("check", "linear", (2, 3, 300, 64)), ("check", "linear", (1, 2, 1000, 128)), ("check", "linear", (1, 1, 77, 100)),
    ("check", "gated_scalar", (2, 3, 300, 64)), ("check", "gated_scalar", (1, 2, 1000, 128)),
    ("check", "gated_scalar", (1, 1, 77, 100)),
    ("check", "gated_channel", (2, 3, 300, 64)), ("check", "gated_channel", (1, 2, 1000, 128)),
    ("fwd", "linear", (8, 16, 2048, 64)), ("fwd+bwd", "linear", (8, 16, 2048, 64)),
    ("fwd", "gated_scalar", (8, 16, 2048, 64)), ("fwd", "gated_delta", (8, 16, 2048, 64)),
}

# The delta-rule state pass as chosen before issue 29 (tiles for one program per SM, 8 warps),
# timed beside the current choice in the same run (Triton only) at the two shapes.
VARIANTS = {"state_before": dict(STATE_PROGRAMS_PER_SM=1, STATE_SMALL_WARPS=None)}
AB = [("gated_delta", (8, 16, 2048, 64)), ("gated_delta", (4, 16, 4096, 128))]


@contextlib.contextmanager
def variant(name):
    """Run the block with mlexp.ops.triton_delta's tile choice set to VARIANTS[name] (None: as is)."""
    from mlexp.ops import triton_delta
    changes = VARIANTS[name] if name else {}
    before = {k: getattr(triton_delta, k) for k in changes}
    for k, v in changes.items():
        setattr(triton_delta, k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            setattr(triton_delta, k, v)


# Seconds of the run besides compiling, for the estimate (guesses from the first H200 window, where
# a warm correctness case took about 2 s and a timed (op, shape) both modes about 5 s with fla).
STARTUP_S = 10.0          # a compile worker's start: python, torch, triton, mlexp imported, CUDA initialised
CHECK_S = 3.0             # one correctness case from a warm cache
TIME_S = 6.0              # one (op, shape): two modes, Triton, chunk and fla, 20 repeats
FLA_WARM_S = 90.0         # one fla warm-up process (fla compiles and autotunes its kernels): not measured
DEFAULT_COMPILE_S = 30.0  # a kernel missing from compile_times.json


# ----------------------------------------------------------------------------- the plan


def plan(ops=ops_cuda.OPS, shapes=ops_cuda.SHAPES, check_shapes=ops_cuda.CHECK_SHAPES):
    """The run's cases in order: correctness, then timing, each with the never-measured cases first.
    A case is a dict: kind ("check", "time", or "ab": Triton now against a VARIANTS entry), op,
    shape (and variant)."""
    checks = [dict(kind="check", op=op, shape=tuple(s)) for op in ops for s in check_shapes]
    timed = [dict(kind="time", op=op, shape=tuple(s)) for s in shapes for op in ops]
    timed += [dict(kind="ab", op=op, shape=s, variant=v) for op, s in AB if op in ops for v in VARIANTS]
    checks.sort(key=lambda c: measured(c, "check"))                                      # stable: order kept
    timed.sort(key=lambda c: sum(measured(c, m) for m in MODES))
    return checks + timed


def measured(case, mode):
    """Whether a GPU window has measured this case in this mode ("check", "fwd" or "fwd+bwd")."""
    return case["kind"] != "ab" and (mode, case["op"], tuple(case["shape"])) in MEASURED


def _spec(a):
    """How Triton specialises one kernel argument (what makes a new compilation)."""
    if isinstance(a, torch.Tensor):
        return str(a.dtype)
    if isinstance(a, bool) or not isinstance(a, int):
        return type(a).__name__
    return ("i64" if not -2**31 <= a < 2**31 else "i32", "1" if a == 1 else "16" if a % 16 == 0 else "")


def launch_key(launch):
    """What tells one compilation of a kernel from another."""
    return (launch["kernel"].__name__, tuple(sorted(launch["constexprs"].items())), launch["num_warps"],
            launch["num_stages"], tuple(_spec(a) for a in launch["args"]))


def op_launches_at(op, shape, dtype, arch, sm):
    """The recorded launches of op forward and backward at (B, H, T, D) on a GPU of arch with sm SMs."""
    from mlexp.ops import triton_common
    from mlexp.ops.triton_check import op_launches
    B, H, T, D = shape
    assumed, triton_common.SMS_ELSEWHERE = triton_common.SMS_ELSEWHERE, sm
    try:
        return op_launches(op, B=B, H=H, T=T, Dk=D, Dv=D, dtype=dtype, arch=arch)
    finally:
        triton_common.SMS_ELSEWHERE = assumed


def compile_units(cases, dtype, arch, sm):
    """[unit] with unit = dict(op, dtype, head_dim, kernel, shapes, launches): every distinct
    compilation the cases need, once, grouped per (op, dtype, head_dim, kernel)."""
    seen, units = set(), {}
    for case in cases:
        op, shape, var = case["op"], case["shape"], case.get("variant")
        with variant(var):
            launches = op_launches_at(op, shape, dtype, arch, sm)
        for launch in launches:
            key = launch_key(launch)
            if key in seen:
                continue
            seen.add(key)
            ukey = (op, str(dtype).replace("torch.", ""), shape[3], key[0], var)
            unit = units.setdefault(ukey, dict(op=op, dtype=ukey[1], head_dim=shape[3], kernel=key[0], variant=var,
                                               shapes=[], launches=[]))
            if shape not in unit["shapes"]:
                unit["shapes"].append(shape)
            unit["launches"].append(launch)
    return list(units.values())


def fla_units(cases):
    """[(op, head_dim, shapes)]: one fla warm-up process per op and head_dim the cases need."""
    units = {}
    for case in cases:
        units.setdefault((case["op"], case["shape"][3]), []).append(case["shape"])
    return [(op, D, shapes) for (op, D), shapes in units.items()]


# ----------------------------------------------------------------------------- the estimate


def load_compile_times(path=COMPILE_TIMES):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"seconds": {}}


def unit_seconds(unit, times):
    """Estimated compile seconds of a unit: the measured AOT seconds of its kernel at its head_dim
    (or at any head_dim, or DEFAULT_COMPILE_S) per launch."""
    sec = times.get("seconds", {})
    name = unit["kernel"]
    per = sec.get(f"{name}@{unit['head_dim']}")
    if per is None:
        others = [v for k, v in sec.items() if k.split("@")[0] == name]
        per = sum(others) / len(others) if others else DEFAULT_COMPILE_S
    return per * len(unit["launches"])


def makespan(durations, jobs):
    """Wall seconds of running the durations on jobs workers, longest first (as the pool is fed)."""
    free = [0.0] * max(1, jobs)
    for d in sorted(durations, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def estimate(cases, units, n_fla, jobs, times):
    """dict of estimated seconds: compile (parallel), checks, timing, total."""
    durations = [unit_seconds(u, times) for u in units] + [FLA_WARM_S] * n_fla
    est = dict(compile=STARTUP_S + makespan(durations, jobs), compile_serial=sum(durations),
               checks=CHECK_S * sum(c["kind"] == "check" for c in cases),
               timing=TIME_S * sum(c["kind"] != "check" for c in cases))
    est["total"] = est["compile"] + est["checks"] + est["timing"]
    return est


# ----------------------------------------------------------------------------- compiling (on the GPU)


def _warm_unit(op, dtype_name, head_dim, kernel, shapes, arch, sm, var=None):
    """In a worker: warm up (compile without running) one unit's launches into TRITON_CACHE_DIR."""
    t0 = time.monotonic()
    dtype = ops_cuda.DTYPES[dtype_name]
    done, seen = 0, set()
    for shape in shapes:
        with variant(var):
            launches = op_launches_at(op, tuple(shape), dtype, arch, sm)
        for launch in launches:
            key = launch_key(launch)
            if key[0] != kernel or key in seen:
                continue
            seen.add(key)
            args = [a.dtype if isinstance(a, torch.Tensor) else a for a in launch["args"]]
            launch["kernel"].warmup(*args, grid=launch["grid"], num_warps=launch["num_warps"],
                                    num_stages=launch["num_stages"], **launch["constexprs"])
            done += 1
    return done, time.monotonic() - t0


def _first_call(op, dtype_name, shapes):
    """In a worker: run op forward and backward once on the GPU at each shape (compile on first call)."""
    t0 = time.monotonic()
    for shape in shapes:
        x = ops_cuda.make_inputs(*shape, ops_cuda.DTYPES[dtype_name], torch.device("cuda"))
        names = ops_cuda.OPS[op].inputs
        ops_cuda.forward_backward(lambda x: ops_cuda.OPS[op](x, "triton"), x, names)()
    torch.cuda.synchronize()
    return len(shapes), time.monotonic() - t0


def _fla_first_call(op, dtype_name, shapes):
    """In a worker: run fla's op forward and backward once at each shape (its compile and autotune)."""
    t0 = time.monotonic()
    fla, why = ops_cuda.fla_ops()
    for shape in shapes:
        x = ops_cuda.to_fla(ops_cuda.make_inputs(*shape, ops_cuda.DTYPES[dtype_name], torch.device("cuda")))
        try:
            ops_cuda.forward_backward(fla[op], x, ops_cuda.OPS[op].inputs)()
        except Exception:                                                         # noqa: BLE001 - forward at least
            with torch.no_grad():
                fla[op](x)
    torch.cuda.synchronize()
    return len(shapes), time.monotonic() - t0


def compile_all(units, fla_jobs, dtype_name, arch, sm, jobs, timeout, log):
    """Run every unit in its own process, jobs at a time; redo failed units by first call.
    Returns dict(seconds, warmed, failed: [str], not_finished)."""
    t0 = time.monotonic()
    ctx = multiprocessing.get_context("spawn")
    failed, retry = [], {}
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futs = {}
        for u in sorted(units, key=lambda u: -len(u["launches"])):
            futs[pool.submit(_warm_unit, u["op"], dtype_name, u["head_dim"], u["kernel"], u["shapes"], arch, sm,
                             u.get("variant"))] = u
        for op, D, shapes in fla_jobs:
            futs[pool.submit(_fla_first_call, op, dtype_name, shapes)] = dict(op=op, head_dim=D, kernel="fla")
        done, pending = concurrent.futures.wait(futs, timeout=timeout)
        for f in done:
            u = futs[f]
            try:
                n, s = f.result()
                log(f"  compiled {u['op']} D={u['head_dim']} {u['kernel']}: {n} in {s:.0f} s")
            except Exception as e:                                                # noqa: BLE001 - redo, report
                failed.append(f"{u['op']} D={u['head_dim']} {u['kernel']}: {type(e).__name__}: {e}"[:300])
                if u["kernel"] != "fla":
                    retry.setdefault((u["op"], u["head_dim"]), u["shapes"])
        if retry and time.monotonic() - t0 < timeout and not pool._broken:
            log(f"  {len(failed)} warm-up(s) failed; first calls for {sorted(retry)}")
            futs2 = {pool.submit(_first_call, op, dtype_name, shapes): (op, D) for (op, D), shapes in retry.items()}
            done2, pending2 = concurrent.futures.wait(futs2, timeout=max(1.0, timeout - (time.monotonic() - t0)))
            for f in done2:
                if f.exception() is not None:
                    op, D = futs2[f]
                    failed.append(f"{op} D={D} first call: {type(f.exception()).__name__}: {f.exception()}"[:300])
            pending |= pending2
            futs.update({f: dict(op=op, head_dim=D, kernel="first call") for f, (op, D) in futs2.items()})
        for f in pending:
            f.cancel()
        not_finished = [f"{futs[f]['op']} D={futs[f]['head_dim']} {futs[f]['kernel']}" for f in pending]
        pool.shutdown(wait=False, cancel_futures=True)
    return dict(seconds=time.monotonic() - t0, failed=failed, not_finished=not_finished)


# ----------------------------------------------------------------------------- running the cases


def run_check(case, dtype, device, fla):
    errs = ops_cuda.check(case["op"], case["shape"], dtype, device, fla)
    bad = [n for n, e in errs.items() if n != "fla o" and not e <= ops_cuda.BOUND[dtype]]
    return dict(status="FAIL" if bad else "PASS", errs=errs)


def run_ab(case, dtype, device, repeats):
    """{mode: {"triton": ms, case["variant"]: ms}}: Triton as it is and with the variant's tile
    choice, forward and forward+backward, timed one after the other on the same inputs."""
    op, shape = case["op"], case["shape"]
    x = ops_cuda.make_inputs(*shape, dtype, device)
    fn = lambda x: ops_cuda.OPS[op](x, "triton")                                  # noqa: E731
    out = {}
    for mode in MODES:
        row = {}
        for label, var in (("triton", None), (case["variant"], case["variant"])):
            call = ops_cuda.forward_backward(fn, x, ops_cuda.OPS[op].inputs) if mode == "fwd+bwd" else (lambda: fn(x))
            with variant(var), (torch.no_grad() if mode == "fwd" else torch.enable_grad()):
                row[label] = list(ops_cuda.cuda_time(call, repeats))
        out[mode] = row
    del x
    torch.cuda.empty_cache()
    return out


def describe(case):
    return f"{case['kind']:>5} {case['op']:>14} {tuple(case['shape'])}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="+", default=list(ops_cuda.OPS), choices=list(ops_cuda.OPS))
    p.add_argument("--dtype", choices=list(ops_cuda.DTYPES), default="bf16")
    p.add_argument("--budget", type=float, default=840.0, help="seconds for the whole run, compiling included")
    p.add_argument("--compile-budget", type=float, default=420.0, help="at most this many seconds compiling")
    p.add_argument("--jobs", type=int, default=16, help="compile processes at a time")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default="gpu_run.json", help="results JSON (the table goes beside it, .md)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, compilations and estimate; run nothing")
    p.add_argument("--measure-compile", action="store_true",
                   help=f"time one AOT compile (sm_90a) per kernel and head_dim into {os.path.basename(COMPILE_TIMES)}")
    a = p.parse_args(argv)
    start = time.monotonic()
    dtype = ops_cuda.DTYPES[a.dtype]
    cuda = torch.cuda.is_available() and not a.dry_run and not a.measure_compile
    sm = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    major, minor = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else (9, 0)
    arch = 10 * major + minor
    cases = plan(a.ops)
    units = compile_units(cases, dtype, arch, sm)
    n_comp = sum(len(u["launches"]) for u in units)
    if a.measure_compile:
        return measure_compile(units)
    fla, why = ops_cuda.fla_ops()
    fla_jobs = fla_units([c for c in cases if c["op"] in fla]) if fla else []
    est = estimate(cases, units, len(fla_jobs), a.jobs, load_compile_times())
    print(f"# plan: {len(cases)} cases ({sum(c['kind'] == 'check' for c in cases)} correctness, "
          f"{sum(c['kind'] == 'time' for c in cases)} timed (op, shape), {sum(c['kind'] == 'ab' for c in cases)} "
          "state-pass comparisons; each forward and forward+backward), "
          f"never-measured first; {a.dtype}, sm_{arch}, {sm} SMs{'' if torch.cuda.is_available() else ' (assumed)'}")
    print(f"# compile: {n_comp} distinct compilations in {len(units)} units (one per op, dtype, head_dim, "
          f"kernel) on {a.jobs} processes" + (f", plus {len(fla_jobs)} fla warm-ups" if fla_jobs else
                                            f"; fla not importable ({why})"))
    print(f"# estimate: compile {est['compile']:.0f} s ({est['compile_serial']:.0f} s one after another), "
          f"correctness {est['checks']:.0f} s, timing {est['timing']:.0f} s: {est['total']:.0f} s in all "
          f"(budget {a.budget:.0f} s; AOT compile seconds measured here, {load_compile_times().get('measured', '-')})")
    print("# not in the estimate: first calls on the GPU (CUDA modules loading) and fla's autotuning at each new "
          "shape (the first H200 window spent about 45 s per new (op, dtype, head_dim), compiling one after another)")
    for i, c in enumerate(cases):
        new = [m for m in (("check",) if c["kind"] == "check" else MODES) if not measured(c, m)]
        every = 1 if c["kind"] == "check" else len(MODES)
        note = "never measured" if len(new) == every else "new: " + ", ".join(new) if new else "measured before"
        print(f"{i + 1:>3}. {describe(c)}  {note}")
    for u in units:
        print(f"     compile {u['op']:>14} {u['dtype']} D={u['head_dim']:<4} {u['kernel']:<26} "
              f"{len(u['launches'])} launch(es), ~{unit_seconds(u, load_compile_times()):.0f} s")
    if not cuda:
        print("No CUDA device (or --dry-run): nothing is run.")
        return 0
    import triton
    results = dict(meta=dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(),
                             torch=torch.__version__, triton=triton.__version__, dtype=a.dtype,
                             fla=_fla_version() if fla else None, bound=ops_cuda.BOUND[dtype],
                             compilations=n_comp, checks_planned=sum(c["kind"] == "check" for c in cases),
                             timed_planned=[[c["op"], list(c["shape"])] for c in cases if c["kind"] == "time"],
                             ab_planned=[[c["op"], list(c["shape"])] for c in cases if c["kind"] == "ab"],
                             estimate=est),
                   cases=[], not_reached=[])
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="gpu_run_triton_cache_"))   # a fresh one
    if hasattr(triton, "knobs"):                     # this process reads the cache the workers fill
        triton.knobs.cache.dir = os.environ["TRITON_CACHE_DIR"]
    print(f"\n## compiling into {os.environ['TRITON_CACHE_DIR']}", flush=True)
    comp = compile_all(units, fla_jobs, a.dtype, arch, sm, a.jobs, min(a.compile_budget, a.budget), print)
    results["meta"].update(compile_s=comp["seconds"], compile_failed=comp["failed"],
                           compile_not_finished=comp["not_finished"])
    print(f"compiled in {comp['seconds']:.0f} s; failed {len(comp['failed'])}, not finished "
          f"{len(comp['not_finished'])}", flush=True)
    save(results, a.out)
    device = torch.device("cuda")
    for c in cases:
        if time.monotonic() - start > a.budget:
            results["not_reached"].append(describe(c).strip())
            continue
        t0 = time.monotonic()
        rec = dict(kind=c["kind"], op=c["op"], shape=list(c["shape"]))
        try:
            if c["kind"] == "check":
                rec.update(run_check(c, dtype, device, fla))
            elif c["kind"] == "ab":
                rec.update(run_ab(c, dtype, device, a.repeats), variant=c["variant"])
            else:
                rec.update(ops_cuda.time_op(c["op"], c["shape"], dtype, device, fla, a.repeats))
        except Exception as e:                                                    # noqa: BLE001 - record, go on
            rec.update(status="ERROR", error=f" {type(e).__name__}: {e}"[:300])
        rec["seconds"] = time.monotonic() - t0
        results["cases"].append(rec)
        results["meta"]["wall_s"] = time.monotonic() - start
        save(results, a.out)
        print(f"{describe(c)} {rec['seconds']:5.1f} s  " + json.dumps({k: v for k, v in rec.items()
                                                                       if k not in ('kind', 'op', 'shape', 'seconds')}),
              flush=True)
    results["meta"]["wall_s"] = time.monotonic() - start
    save(results, a.out)
    print("\n" + render(results))
    return int(any(c.get("status") in ("FAIL", "ERROR") for c in results["cases"]))


def _fla_version():
    from importlib import metadata
    for name in ("flash-linear-attention", "fla-core"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return "?"


def measure_compile(units, path=COMPILE_TIMES):
    """Time one AOT compile for sm_90a (triton_check.compile_launch) per (kernel, head_dim) of the
    units and write the seconds to path; the dry run's estimate reads them."""
    import platform

    import triton
    from mlexp.ops.triton_check import compile_launch
    times = load_compile_times(path)
    sec = times.setdefault("seconds", {})
    cache = tempfile.mkdtemp(prefix="gpu_run_cache_")        # a cold cache: ~/.triton/cache would hide compiles
    triton.knobs.cache.dir = os.path.join(cache, "first")
    compile_launch(units[0]["launches"][0], 90)               # loads the backend: not part of any kernel's time
    triton.knobs.cache.dir = os.path.join(cache, "timed")
    for u in units:
        key = f"{u['kernel']}@{u['head_dim']}"
        if key in sec:
            continue
        t0 = time.monotonic()
        compile_launch(u["launches"][0], 90)
        sec[key] = round(time.monotonic() - t0, 1)
        times["measured"] = (f"{datetime.date.today().isoformat()}, {platform.machine()} "
                             f"{os.cpu_count()} cores (shared), triton {triton.__version__}, sm_90a, one at a time")
        write_file(path, json.dumps(times, indent=1, sort_keys=True) + "\n")
        print(f"{key}: {sec[key]} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
