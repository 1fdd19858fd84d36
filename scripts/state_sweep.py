"""Lesson 06's state-size sweep: two recurrent designs with narrower and wider heads, so a smaller and a larger state.

    .venv/bin/python scripts/state_sweep.py --designs gated_delta decay --head-dims 8 32 --seeds 0 1 2 \\
        --jobs 2 --out solutions/06_recall_per_byte/state_sweep.json

The lesson's models have 4 heads of 16 numbers in every layer. Here the recurrent layers get heads
of ``head_dim`` numbers instead (``CapstoneConfig.head_dim``), still 4 of them at model width 64:
their state is 4 x head_dim^2 numbers per layer, 4 times larger at each doubling of head_dim, and
their q, k, v and output projections (dim x 4 head_dim each) grow with it, as the state does in
Zoology's sweep over model width; the file records each model's parameters. The lesson's own runs
are the head_dim-16 point (its seeds.md), so the default leaves 16 out. Each run is
``mlexp.capstone.train_and_score`` at ``CapstoneConfig()`` with only ``head_dim`` and ``lr``
changed, at the design's best rate of ``lr_sweep.json`` (the lesson's rule: the highest MQAR mean,
then the lowest final loss; the rate was swept at head_dim 16 only), in its own process with one
torch thread and deterministic algorithms, as the lesson's seed runs are. The file is rewritten
after every run; ``--resume`` keeps its runs and skips them. ``--grading`` runs the token size the
grader uses (2 steps), to check the tool in seconds; its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sweep_book import end_call, run_all, start_call, write  # noqa: E402  (beside this script)
LR_SWEEP = ROOT / "solutions" / "06_recall_per_byte" / "lr_sweep.json"


def best_rates(sweep: dict) -> dict:
    """{design: rate} by the lesson's rule: the highest MQAR mean of the sweep, ties to the lower loss."""
    by = {}
    for r in sweep["runs"]:
        by.setdefault(r["name"], {})[r["lr"]] = r
    return {n: max(rs, key=lambda lr: (rs[lr]["mqar_mean"], -rs[lr]["loss"])) for n, rs in by.items()}


def _run(name, head_dim, lr, seed, grading):
    import torch

    from mlexp.capstone import CapstoneConfig, lesson_designs, memory_bytes, train_and_score

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    config = dataclasses.replace(CapstoneConfig(), head_dim=head_dim, lr=lr)
    if grading:
        config = dataclasses.replace(config, steps=2, n_eval=2)
    design = lesson_designs()[name]
    r = train_and_score(design, config, seed=seed)
    out = {k: r[k] for k in ("name", "pattern", "params", "bytes", "mqar_mean", "overwrite_mean", "mqar_2x_mean",
                             "loss", "seconds")}
    out["state_bytes"] = memory_bytes(design, config.seq_len, config.dim, config.n_heads, config.dtype,
                                      head_dim=head_dim)["state_bytes"]
    for key in ("mqar", "overwrite", "mqar_2x"):
        out[key] = {str(n): a for n, a in r[key].items()}
    out.update(n_heads=config.n_heads, head_dim=head_dim, lr=lr, seed=seed)
    return out


def main(argv=None) -> int:
    from mlexp.capstone import CapstoneConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--designs", nargs="+", default=["gated_delta", "decay"])
    p.add_argument("--head-dims", type=int, nargs="+", default=[8, 32], help="the recurrent layers' head width")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true", help="keep the file's runs and skip them")
    p.add_argument("--grading", action="store_true", help="token size (2 steps), to test the tool")
    args = p.parse_args(argv)
    out = Path(args.out)
    rates = best_rates(json.loads(LR_SWEEP.read_text()))
    data = json.loads(out.read_text()) if args.resume and out.is_file() else {}
    runs = data.get("runs", [])
    done = {(r["name"], r["head_dim"], r["seed"]) for r in runs}
    plan = [(n, h, s) for s in args.seeds for h in args.head_dims for n in args.designs if (n, h, s) not in done]
    config = CapstoneConfig()
    data.update(designs=args.designs, head_dims=sorted(set(data.get("head_dims", [])) | set(args.head_dims)),
                seeds=sorted(set(data.get("seeds", [])) | set(args.seeds)), grading=args.grading,
                rates={n: rates[n] for n in args.designs}, lr_from="lr_sweep.json (swept at head_dim 16)",
                sizes=f"CapstoneConfig() with the recurrent layers' head_dim varied: {config.n_layers} layers, width "
                      f"{config.dim}, {config.n_heads} heads, "
                      f"{2 if args.grading else config.steps} steps of {config.batch_size} x {config.seq_len} tokens",
                jobs=args.jobs, torch_threads=1, cpus=os.cpu_count(), date=datetime.date.today().isoformat())
    start = start_call(data)

    def save():
        data["runs"] = sorted(runs, key=lambda r: (args.designs.index(r["name"]) if r["name"] in args.designs
                                                   else len(args.designs), r["head_dim"], r["seed"]))
        write(out, data)

    for r in run_all(_run, [(n, h, rates[n], s, args.grading) for n, h, s in plan], args.jobs):
        runs.append(r)
        print(f"{r['name']:12s} head_dim {r['head_dim']:2d}, seed {r['seed']}: "
              f"MQAR {r['mqar_mean']:.3f} overwrite {r['overwrite_mean']:.3f} loss {r['loss']:.3f} "
              f"({r['bytes']:,} bytes, {r['params']:,} parameters, {r['seconds']:.0f} s)", flush=True)
        save()
    end_call(data, start, runs=len(plan), jobs=args.jobs)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
