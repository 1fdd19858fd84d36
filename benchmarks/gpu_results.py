"""The results of a GPU window (benchmarks/gpu_run.py) and the table made from them.

A run writes its results JSON after every finished case (:func:`save`) and its report beside it
(.md, :func:`render`): a header line (date, device, versions, compile time), the correctness
summary, then a row per (shape, op) of forward and forward+backward (:data:`MODES`), Triton / fla
and chunk / Triton, and the gated delta rule's state pass against its choice before issue 29. A
case the run did not reach reads "not reached", so a run cut short still gives the whole table.
"""
import json
import os
import sys

from mlexp.ops.registry import op_label

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_cuda  # noqa: E402  (benchmarks/ is not a package)

MODES = ("fwd", "fwd+bwd")     # what a timed case records: forward, and forward and backward


def write_file(path, text):
    """Write text to path through a temporary file: a run cut short never leaves half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def save(results, path):
    """Write the results JSON and, beside it (.md), the table made from it."""
    write_file(path, json.dumps(results, indent=1) + "\n")
    write_file(os.path.splitext(path)[0] + ".md", render(results))


def _ratio(a, b):
    """'1.06 (0.274 vs 0.260 ms)' for timings a over b, each [median, min, max] ms."""
    return f"{a[0] / b[0]:.2f} ({a[0]:.3f} vs {b[0]:.3f} ms)"


def _cell_fla(t):
    if "triton" in t and "fla" in t:
        return _ratio(t["triton"], t["fla"])
    if "fla_error" in t:
        return "fla failed*"
    if "triton_error" in t:
        return "Triton failed"
    return "no fla" if "triton" in t else "not reached"


def _cell_chunk(t):
    if "triton" in t and "chunk" in t:
        return f"{t['chunk'][0] / t['triton'][0]:.1f} ({t['chunk'][0]:.3f} vs {t['triton'][0]:.3f} ms)"
    return "Triton failed" if "triton_error" in t else "not reached"


def render(results):
    """The report of a run (the .md beside its JSON): its header line, the correctness summary and one table of
    forward and forward+backward, Triton / fla and chunk / Triton, per shape and op. Cases the
    run did not reach read "not reached"."""
    meta = results.get("meta", {})
    cases = results.get("cases", [])
    lines = [f"Run of {meta.get('date', '?')} on {meta.get('device', '?')}: torch {meta.get('torch', '?')}, "
             f"triton {meta.get('triton', '?')}, fla {meta.get('fla', 'not importable')}, "
             f"{meta.get('dtype', 'bf16')}; compile {meta.get('compile_s', float('nan')):.0f} s for "
             f"{meta.get('compilations', '?')} compilations; {meta.get('wall_s', float('nan')):.0f} s in all.", ""]
    checks = [c for c in cases if c["kind"] == "check"]
    passed = [c for c in checks if c.get("status") == "PASS"]
    lines.append(f"Correctness (Triton vs the float32 chunk path, bound {meta.get('bound', '?')}): "
                 f"{len(passed)} of {len(checks)} cases reached passed"
                 f" (of {meta.get('checks_planned', len(checks))} planned).")
    errs = [e for c in passed for n, e in c.get("errs", {}).items() if n != "fla o"]
    if errs:
        lines[-1] += f" RMS-relative errors {min(errs):.1e} to {max(errs):.1e}."
    for c in checks:
        if c.get("status") != "PASS":
            lines.append(f"- {c['op']} {tuple(c['shape'])}: {c.get('status')} "
                         + " ".join(f"{n} {e:.1e}" for n, e in c.get("errs", {}).items()) + c.get("error", ""))
    lines += ["", "| shape | op | forward: Triton / fla | forward: chunk / Triton | fwd+bwd: Triton / fla "
              "| fwd+bwd: chunk / Triton |", "|---|---|---|---|---|---|"]
    timed = {(c["op"], tuple(c["shape"])): c for c in cases if c["kind"] == "time"}
    order = meta.get("timed_planned") or [[c["op"], c["shape"]] for c in cases if c["kind"] == "time"]
    order = sorted({(op, tuple(s)) for op, s in order},
                   key=lambda k: (ops_cuda.SHAPES.index(k[1]) if k[1] in ops_cuda.SHAPES else 99,
                                  list(ops_cuda.OPS).index(k[0]) if k[0] in ops_cuda.OPS else 99))
    fla_failed = []
    for op, shape in order:
        case = timed.get((op, shape), {})
        row = [str(shape), op_label(op)]
        for mode in MODES:
            t = case.get(mode, {})
            row += [_cell_fla(t), _cell_chunk(t)]
            if "fla_error" in t:
                fla_failed.append(f"{op} {shape} {mode}: {t['fla_error']}")
        if any(c.get("status") == "FAIL" for c in checks if c["op"] == op):
            row[1] += " (failed correctness)"
        lines.append("| " + " | ".join(row) + " |")
    if fla_failed:
        lines += ["", "*fla raised, so chunk / Triton is the comparison there (and fla's forward where it ran): "
                  + "; ".join(fla_failed)]
    ab = [c for c in cases if c["kind"] == "ab"]
    if ab or meta.get("ab_planned"):
        lines += ["", "The gated delta rule's state pass, V tiles for 4 programs per SM and 4 warps, against the "
                  "choice before (tiles for one program per SM, 8 warps), Triton only, same run:", "",
                  "| shape | op | forward: now / before | fwd+bwd: now / before |", "|---|---|---|---|"]
        done = {(c["op"], tuple(c["shape"])): c for c in ab}
        for op, shape in [(op, tuple(s)) for op, s in meta.get("ab_planned") or [[c["op"], c["shape"]] for c in ab]]:
            c = done.get((op, shape), {})
            cells = [_ratio(c[m]["triton"], c[m][c["variant"]]) if m in c else "not reached" for m in MODES]
            lines.append("| " + " | ".join([str(shape), op_label(op)] + cells) + " |")
    if results.get("not_reached"):
        lines += ["", "Not reached in the time budget: " + ", ".join(results["not_reached"])]
    return "\n".join(lines) + "\n"
