"""benchmarks/gpu_run.py without a GPU: the plan and its order, the compile units, the estimate, and the
table rendered from a results JSON, whole or cut short. Nothing here compiles a kernel."""
import importlib.util
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "benchmarks", "gpu_run.py")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


@pytest.fixture(scope="module")
def run():
    spec = importlib.util.spec_from_file_location("gpu_run", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_run"] = mod                 # the compile pool's workers import it by name
    spec.loader.exec_module(mod)
    return mod


def test_plan_has_the_15_checks_and_every_op_at_every_shape_never_measured_first(run):
    cases = run.plan()
    checks = [(c["op"], c["shape"]) for c in cases if c["kind"] == "check"]
    timed = [(c["op"], c["shape"]) for c in cases if c["kind"] == "time"]
    ops, shapes, small = run.ops_cuda.OPS, run.ops_cuda.SHAPES, run.ops_cuda.CHECK_SHAPES
    assert len(ops) == 5 and sorted(checks) == sorted((o, s) for o in ops for s in small) and len(checks) == 15
    assert sorted(timed) == sorted((o, s) for o in ops for s in shapes) and len(timed) == 15
    ab = [(c["op"], c["shape"], c["variant"]) for c in cases if c["kind"] == "ab"]
    assert sorted(ab) == sorted((op, s, "state_before") for op, s in run.AB) and len(cases) == 32
    assert all(c["kind"] == "check" for c in cases[:15])                   # correctness before timing
    seen = [run.measured(c, "check") for c in cases[:15]]
    assert seen == sorted(seen) and not seen[0] and seen[-1]              # never measured first
    reached = [sum(run.measured(c, m) for m in run.MODES) for c in cases[15:]]
    assert reached == sorted(reached) and reached[0] == 0 and reached[-1] == 2
    assert cases[-1]["op"] == "linear" and cases[-1]["shape"] == (8, 16, 2048, 64)   # timed on the first H200


def test_compile_units_hold_each_compilation_once(run):
    cases = [c for c in run.plan(["linear", "gated_delta"]) if c["shape"][3] == 64]
    units = run.compile_units(cases, torch.bfloat16, 90, 132)
    keys = [run.launch_key(l) for u in units for l in u["launches"]]
    assert len(keys) == len(set(keys)) > 0
    every = set()
    for c in cases:
        with run.variant(c.get("variant")):
            every |= {run.launch_key(l) for l in run.op_launches_at(c["op"], c["shape"], torch.bfloat16, 90, 132)}
    assert set(keys) == every
    assert all(run.launch_key(l)[0] == u["kernel"] and u["head_dim"] == 64 for u in units for l in u["launches"])
    assert len({(u["op"], u["dtype"], u["head_dim"], u["kernel"], u["variant"]) for u in units}) == len(units)
    # the state tile narrows at small B*H: the (1, 4, 8192, 64) state kernel is another compilation
    # than the (8, 16, 2048, 64) one
    state = [u for u in units if u["kernel"] == "delta_state_fwd_kernel" and u["variant"] is None]
    assert len(state) == 1 and len(state[0]["launches"]) >= 2


def test_state_pass_variant_is_the_choice_before_issue_29(run):
    """At the issue's shapes the delta-rule state kernels now run 512 programs (V tiles of 16, 4 warps);
    the "state_before" variant gives back 256 (V tiles of 32, 8 warps), and only inside its block."""
    def state(shape, var=None):
        with run.variant(var):
            launches = run.op_launches_at("gated_delta", shape, torch.bfloat16, 90, 132)
        return {(l["kernel"].__name__, l["grid"][0] * l["grid"][1], l["constexprs"]["BV"], l["num_warps"])
                for l in launches if l["kernel"].__name__.startswith("delta_state")}
    for shape in [(8, 16, 2048, 64), (4, 16, 4096, 128)]:
        assert state(shape) == {("delta_state_fwd_kernel", 512, 16, 4), ("delta_state_bwd_kernel", 512, 16, 4)}
        assert state(shape, "state_before") == {("delta_state_fwd_kernel", 256, 32, 8),
                                                ("delta_state_bwd_kernel", 256, 32, 8)}
        assert state(shape) == {("delta_state_fwd_kernel", 512, 16, 4), ("delta_state_bwd_kernel", 512, 16, 4)}
    units = run.compile_units(run.plan(["gated_delta"]), torch.bfloat16, 90, 132)
    before = {(u["kernel"], l["constexprs"]["BV"], l["num_warps"]) for u in units if u["variant"] == "state_before"
              for l in u["launches"] if u["kernel"].startswith("delta_state")}
    assert before == {("delta_state_fwd_kernel", 32, 8), ("delta_state_bwd_kernel", 32, 8)}


def test_estimate_schedules_the_units_on_the_workers(run):
    assert run.makespan([10, 10, 10, 10], 2) == 20 and run.makespan([30, 10, 10, 10], 2) == 30
    assert run.makespan([5] * 16, 16) == 5 and run.makespan([], 16) == 0
    unit = dict(kernel="k", head_dim=64, launches=[1, 2])
    times = {"seconds": {"k@64": 7.0, "k@128": 100.0}}
    assert run.unit_seconds(unit, times) == 14.0
    assert run.unit_seconds(dict(unit, head_dim=100), times) == 2 * 53.5          # other head dims' mean
    assert run.unit_seconds(dict(unit, kernel="new"), times) == 2 * run.DEFAULT_COMPILE_S
    cases = run.plan()
    est = run.estimate(cases, [unit] * 32, 0, 16, times)
    assert est["compile"] == run.STARTUP_S + 2 * 14.0 and est["compile_serial"] == 32 * 14.0
    assert est["checks"] == 15 * run.CHECK_S and est["total"] == est["compile"] + est["checks"] + est["timing"]


def test_dry_run_lists_every_case_and_the_compile_estimate(run, capsys):
    assert run.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for c in run.plan():
        assert sum(run.describe(c) in line for line in lines) == 1, c
    assert "15 correctness, 15 timed (op, shape), 2 state-pass comparisons" in out and "nothing is run" in out
    n = int(out.split("# compile: ")[1].split()[0])
    assert n > 100 and f"{n} distinct compilations" in out
    assert "# estimate: compile" in out and " s in all" in out
    assert sum("compile " in line and "launch(es)" in line for line in lines) == len(
        run.compile_units(run.plan(), torch.bfloat16, 90, 132))


def _sample():
    """A results JSON as a whole run writes it (numbers of the shape of the first H200 window's)."""
    run_ops, shapes, small = ("linear", "gated_scalar", "gated_channel", "delta", "gated_delta"), \
        [(1, 4, 8192, 64), (8, 16, 2048, 64), (4, 16, 4096, 128)], [(2, 3, 300, 64), (1, 2, 1000, 128), (1, 1, 77, 100)]
    cases = [dict(kind="check", op=op, shape=list(s), status="PASS", errs={"o": 2.3e-3, "S": 3.7e-3, "dq": 3e-3})
             for op in run_ops for s in small]
    for s in shapes:
        for op in run_ops:
            fb = {"triton": [1.076, 1.0, 1.2], "chunk": [3.0, 2.9, 3.1], "fla": [1.313, 1.3, 1.4]}
            if op == "gated_delta":
                fb = {"triton": [2.59, 2.5, 2.7], "chunk": [11.0, 10.9, 11.2], "fla_error": "RuntimeError: triton<3.8"}
            cases.append(dict(kind="time", op=op, shape=list(s), fwd={"triton": [0.274, 0.27, 0.28],
                              "chunk": [1.07, 1.0, 1.1], "fla": [0.260, 0.25, 0.27]}, **{"fwd+bwd": fb}))
    cases.append(dict(kind="ab", op="gated_delta", shape=[8, 16, 2048, 64], variant="state_before",
                      fwd={"triton": [0.5, 0.5, 0.6], "state_before": [1.0, 0.9, 1.1]},
                      **{"fwd+bwd": {"triton": [2.0, 2.0, 2.1], "state_before": [2.5, 2.4, 2.6]}}))
    meta = dict(date="2026-12-02", device="NVIDIA H200", torch="2.11.0+cu130", triton="3.6.0", fla="0.6.0",
                dtype="bf16", bound=0.02, compilations=212, compile_s=150.0, wall_s=600.0, checks_planned=15,
                timed_planned=[[op, list(s)] for s in shapes for op in run_ops],
                ab_planned=[["gated_delta", [8, 16, 2048, 64]], ["gated_delta", [4, 16, 4096, 128]]])
    return json.loads(json.dumps(dict(meta=meta, cases=cases, not_reached=[])))


def _rows(table):
    """The rows of the main table (six cells; the state-pass table below it has four)."""
    return [line for line in table.splitlines() if line.startswith("| (") and line.count("|") == 7]


def test_render_makes_the_readme_table_from_a_results_json(run, tmp_path):
    path = str(tmp_path / "gpu_run.json")
    run.save(_sample(), path)
    with open(path) as f:
        table = run.render(json.load(f))
    assert open(str(tmp_path / "gpu_run.md")).read() == table
    assert "| shape | op | forward: Triton / fla | forward: chunk / Triton | fwd+bwd: Triton / fla |" in table
    assert "2026-12-02 on NVIDIA H200: torch 2.11.0+cu130, triton 3.6.0, fla 0.6.0" in table
    assert "15 of 15 cases reached passed" in table and "2.3e-03 to 3.7e-03" in table
    rows = _rows(table)
    assert len(rows) == 15 and not any("not reached" in r for r in rows)
    assert rows[0].startswith("| (1, 4, 8192, 64) | linear | 1.05 (0.274 vs 0.260 ms) | 3.9 (1.070 vs 0.274 ms) "
                              "| 0.82 (1.076 vs 1.313 ms) | 2.8 (3.000 vs 1.076 ms) |")
    delta = [r for r in rows if "gated delta rule" in r]
    assert len(delta) == 3 and all("fla failed*" in r and "4.2 (11.000 vs 2.590 ms)" in r for r in delta)
    assert "*fla raised, so chunk / Triton is the comparison there" in table and "triton<3.8" in table
    assert ("| (8, 16, 2048, 64) | gated delta rule | 0.50 (0.500 vs 1.000 ms) | 0.80 (2.000 vs 2.500 ms) |"
            in table.splitlines())
    assert "| (4, 16, 4096, 128) | gated delta rule | not reached | not reached |" in table.splitlines()


def test_a_run_cut_short_renders_the_cases_it_reached(run):
    res = _sample()
    reached = res["cases"][:16]                                  # the 15 checks and one timed (op, shape)
    assert all(c["kind"] != "ab" for c in reached)
    reached[3] = dict(reached[3], status="FAIL", errs={"o": 0.5})
    res["cases"] = reached
    res["not_reached"] = ["time gated_scalar (1, 4, 8192, 64)"]
    table = run.render(res)
    rows = _rows(table)
    assert len(rows) == 15                                        # every planned row, reached or not
    assert "0.82 (1.076 vs 1.313 ms)" in rows[0] and "not reached" not in rows[0]
    assert all(r.count("not reached") == 4 for r in rows[1:])
    assert "14 of 15 cases reached passed" in table and "FAIL o 5.0e-01" in table
    assert reached[3]["op"] == "gated_scalar" and "| gated, scalar g (failed correctness) |" in rows[1]
    assert "failed correctness" not in rows[0]
    assert "Not reached in the time budget: time gated_scalar (1, 4, 8192, 64)" in table
    assert "| (8, 16, 2048, 64) | gated delta rule | not reached | not reached |" in table.splitlines()
    res["cases"], res["meta"] = [], {}                            # nothing reached, nothing known
    assert "0 of 0 cases reached passed" in run.render(res)


def test_measured_compile_times_cover_every_kernel_of_the_plan(run):
    """The estimate reads benchmarks/compile_times.json: re-measure (--measure-compile) when kernels change."""
    times = run.load_compile_times()["seconds"]
    units = run.compile_units(run.plan(), torch.bfloat16, 90, 132)
    missing = {f"{u['kernel']}@{u['head_dim']}" for u in units} - set(times)
    assert not missing, f"run benchmarks/gpu_run.py --measure-compile; missing {sorted(missing)}"


@pytest.mark.slow   # one of the slowest fast tests: left out of make test-fast (under 3 min); make test runs it
def test_compile_pool_reports_a_warm_up_that_fails(run):
    """Off a GPU kernel.warmup cannot run: the pool reports that unit, then its first-call redo, and
    returns; a unit with nothing to compile succeeds."""
    cases = [dict(kind="check", op="linear", shape=(1, 1, 77, 100))]
    units = run.compile_units(cases, torch.bfloat16, 90, 132)
    empty = dict(units[0], kernel="no_such_kernel")
    logged = []
    res = run.compile_all([units[0], empty], [], "bf16", 90, 132, jobs=2, timeout=300, log=logged.append)
    assert [f.split(":")[0] for f in res["failed"]] == [f"linear D=100 {units[0]['kernel']}", "linear D=100 first call"]
    assert any("no_such_kernel: 0 in" in line for line in logged) and not res["not_finished"]
