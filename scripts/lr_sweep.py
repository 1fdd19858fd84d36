"""Lesson 06's learning-rate sweep: every design of the lesson at a few learning rates, one seed.

    .venv/bin/python scripts/lr_sweep.py --rates 1e-3 3e-3 6e-3 --seed 0 --jobs 2 \\
        --out solutions/06_recall_per_byte/lr_sweep.json

Each run is ``mlexp.capstone.train_and_score`` at the lesson's sizes (``CapstoneConfig()``) with
only ``lr`` changed, in its own process with one torch thread and deterministic algorithms. The
file gets one entry per (design, rate): its accuracies, final loss, training seconds and loss
curve (every step), plus the sweep's wall and CPU time, the load average and the date, so the
lesson can state what the sweep cost: ``wall_seconds`` and ``cpu_seconds`` are summed over the
calls that built the file, and ``calls`` lists each call's own share. The file is rewritten after every run, and an existing
file's runs are kept (``--resume`` skips them), so a sweep cut short keeps what finished.
``--grading`` runs the token size the grader uses (2 steps, 2 evaluation sequences), to check the
tool in seconds; its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sweep_book import children_cpu, end_call, run_all, start_call, write  # noqa: E402  (beside this script)


def _run(name, lr, seed, grading):
    import torch

    from mlexp.capstone import CapstoneConfig, lesson_designs, train_and_score

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    config = CapstoneConfig()
    if grading:
        config = dataclasses.replace(config, steps=2, n_eval=2)
    r = train_and_score(lesson_designs()[name], dataclasses.replace(config, lr=lr), seed=seed)
    keep = ("name", "pattern", "bytes", "mqar_mean", "overwrite_mean", "mqar_2x_mean", "loss", "seconds")
    out = {k: r[k] for k in keep}
    out["mqar"] = {str(n): a for n, a in r["mqar"].items()}
    out["lr"], out["seed"] = lr, seed
    out["losses"] = [round(x, 4) for x in r["losses"]]
    return out


def main(argv=None) -> int:
    from mlexp.capstone import CapstoneConfig, lesson_designs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=[1e-3, 3e-3, 6e-3])
    p.add_argument("--designs", nargs="+", default=list(lesson_designs()))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true", help="keep the file's runs and skip them")
    p.add_argument("--grading", action="store_true", help="token size (2 steps), to test the tool")
    args = p.parse_args(argv)
    out = Path(args.out)
    data = json.loads(out.read_text()) if args.resume and out.is_file() else {}
    runs = data.get("runs", [])
    done = {(r["name"], r["lr"]) for r in runs}
    plan = [(n, lr) for n in args.designs for lr in args.rates if (n, lr) not in done]
    config = CapstoneConfig()
    data.update(rates=sorted(set(data.get("rates", [])) | set(args.rates)), seed=args.seed,
                grading=args.grading, steps=2 if args.grading else config.steps,
                sizes=f"CapstoneConfig() with lr swept: {config.n_layers} layers, dim {config.dim}, "
                      f"{config.n_heads} heads, {config.steps} steps of {config.batch_size} x {config.seq_len} tokens",
                jobs=args.jobs, torch_threads=1, cpus=os.cpu_count(), date=datetime.date.today().isoformat())
    start = start_call(data)
    order = list(lesson_designs())           # the file lists the runs in the lesson's order of designs

    def save():
        data["runs"] = sorted(runs, key=lambda r: (order.index(r["name"]) if r["name"] in order else len(order), r["lr"]))
        data["wall_seconds_this_call"] = round(time.perf_counter() - start, 1)
        data["cpu_seconds_this_call"] = round(children_cpu(), 1)
        write(out, data)

    for r in run_all(_run, [(n, lr, args.seed, args.grading) for n, lr in plan], args.jobs):
        runs.append(r)
        print(f"{r['name']:12s} lr {r['lr']:.0e}: MQAR {r['mqar_mean']:.3f} overwrite {r['overwrite_mean']:.3f} "
              f"loss {r['loss']:.3f} ({r['seconds']:.0f} s)", flush=True)
        save()
    end_call(data, start, designs=sorted({n for n, _ in plan}, key=args.designs.index), runs=len(plan), jobs=args.jobs)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
