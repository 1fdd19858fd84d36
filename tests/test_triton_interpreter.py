"""The Triton kernels under TRITON_INTERPRET=1, with tl.dot made to multiply as a GPU does.

Each test runs this file as a script in a subprocess (TRITON_INTERPRET must be set before triton
is imported) with mlexp.ops.triton_check.emulate_gpu_dots() installed: bf16 operands decoded,
fp32 operands rounded as ``input_precision`` says (tf32x3 for our fp32 path), fp32 accumulation.
The script prints one JSON line; the test asserts on it. Oracles: the ops' recurrent loops
(float64 where the inputs allow it).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("linear", "gated_scalar", "gated_channel", "delta", "gated_delta")
# RMS-relative error bounds against the float64 loop, about 3x what the emulated GPU arithmetic gives.
TOL = {"fp32": 2e-5, "bf16": 1.5e-2, "fp16": 2e-3}

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


def _run(group, *extra, timeout=900):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, os.path.abspath(__file__), group, *extra], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _over(errs, tol):
    return {name: e for name, e in errs.items() if not e <= tol}


@pytest.mark.slow   # 16 s; make test-fast keeps test_ops_linear's interpreter check
def test_strided_inputs_give_the_loops_values_and_gradients():
    """Transposed q, k, v, g, beta (from (B, T, H, D) layouts) and an expanded g (stride 0, one
    decay per head): forward and every gradient match the loop (the saved-tensor bug gave 29-54%
    errors and NaN here)."""
    errs = _run("strided")
    # o, S and one gradient per leaf (4 to 6 leaves), transposed for every op, expanded where g is
    assert len(errs) == 6 + 2 * 7 + 2 * 7 + 7 + 2 * 8
    assert not _over(errs, TOL["fp32"]), _over(errs, TOL["fp32"])


@pytest.mark.slow   # 15 s for both
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_inputs(dtype):
    """bf16 / fp16 operands multiplied as such: outputs in the input dtype, state in fp32, errors
    against the float64 loop within the half-precision bound (forward and gradients)."""
    out = _run("dtype", dtype)
    assert out.pop("dtypes_ok") is True
    assert not _over(out, TOL[dtype]), _over(out, TOL[dtype])
    assert max(out.values()) > TOL["fp32"], "16-bit rounding must show: is the emulation active?"


@pytest.mark.slow   # 9 s
def test_fp32_tolerance_holds_for_tf32x3_and_not_for_plain_tf32():
    """The fp32 path's precision (tf32x3) meets the fp32 bound under TF32 emulation; plain TF32
    would not, so the bound really tests the precision choice."""
    out = _run("tf32")
    assert not _over(out["tf32x3"], TOL["fp32"]), _over(out["tf32x3"], TOL["fp32"])
    assert min(out["tf32"].values()) > 10 * TOL["fp32"], out["tf32"]


@pytest.mark.slow   # 22 s at "some"; make test-fast keeps test_ops_edges::test_triton_resets_in_interpreter
@pytest.mark.parametrize("full", [pytest.param("", id="some"), pytest.param("full", id="all")])
def test_hard_resets(full):
    """Log-decay -inf, -1e30 (and, all: -1e4) at token 0, at a chunk's last and the next chunk's first
    token, inside a chunk and at the last token, for all channels or some: the loop's outputs, states
    and gradients (issue 13's example among them, where the loop gives [1, 1, 1.5, 1.75])."""
    out = _run("resets", full)
    assert out.pop("issue_example") == [[1.0, 1.0, 1.5, 1.75]] * 3
    assert len(out) >= (340 if full else 140)
    assert not _over(out, TOL["fp32"]), _over(out, TOL["fp32"])


@pytest.mark.slow   # 14 s at "some"
@pytest.mark.parametrize("full", [pytest.param("", id="some"), pytest.param("full", id="all")])
def test_non_finite_inputs_poison_only_later_tokens(full):
    """NaN or inf in q, k, v, g or beta at a token: the Triton outputs are non-finite exactly where
    the loop's are (that token on, never earlier tokens) and equal the loop's elsewhere."""
    out = _run("nonfinite", full)
    assert out.pop("example") == [1.0, 3.0, 6.0, None]
    bad = {name: r for name, r in out.items() if r != "ok"}
    assert not bad, bad
    assert len(out) >= (130 if full else 60)


@pytest.mark.slow
def test_many_tiles_and_chunk_sizes():
    """Dk, Dv over one 64-wide tile, ragged T, every chunk size, B*H > 1, normalised linear attention."""
    errs = _run("shapes", timeout=1800)
    assert len(errs) >= 60
    assert not _over(errs, TOL["fp32"]), _over(errs, TOL["fp32"])


@pytest.mark.slow   # 35 s for both
@pytest.mark.parametrize("op", ["delta", "gated_delta"])
def test_delta_state_pass_split_into_v_tiles_of_16(op):
    """The delta-rule state pass with V split into four tiles of 16 (what STATE_PROGRAMS_PER_SM
    picks at a small batch on a 132-SM GPU) and in one tile of 64 (one SM): forward and every
    gradient match the float64 loop in fp32 and bf16, and the two splits agree."""
    out = _run("state_tiles", op)
    assert out.pop("tiles") == {"132": [32, 16], "1": [32, 64]}
    split = {n: e for n, e in out.items() if n.endswith("split")}
    for dtype in ("fp32", "bf16"):
        errs = {n: e for n, e in out.items() if f" {dtype} " in n and n not in split}
        assert len(errs) == 2 * (2 + 5 + (op == "gated_delta")), errs     # two splits: o, S, a gradient per leaf
        assert not _over(errs, TOL[dtype]), _over(errs, TOL[dtype])
    assert not _over(split, 1e-5), split


# ----------------------------------------------------------------------------- the script side


def _setup():
    import torch
    from mlexp.ops import triton_check
    triton_check.emulate_gpu_dots()
    torch.manual_seed(0)


def _rel(a, b):
    """RMS-relative error of a against b, in float64; 0 when both are zero."""
    a, b = a.double(), b.double()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def _call(op, impl, q, k, v, g=None, beta=None, S0=None, C=16, normalize=False):
    from mlexp.ops import delta_rule, gated_delta_rule, gated_linear_attention, linear_attention
    if op == "linear" and normalize:                                # z_0 = 1: q . z > 0 for positive q
        out = linear_attention(q, k, v, initial_state=(S0, S0.new_ones(S0.shape[:-1])), impl=impl,
                               chunk_size=C, normalize=True)
        return out[0], out[1][0]
    if op == "linear":
        return linear_attention(q, k, v, initial_state=S0, impl=impl, chunk_size=C)
    if op.startswith("gated_") and op != "gated_delta":
        return gated_linear_attention(q, k, v, g, initial_state=S0, impl=impl, chunk_size=C)
    if op == "delta":
        return delta_rule(q, k, v, beta, initial_state=S0, impl=impl, chunk_size=C)
    return gated_delta_rule(q, k, v, beta, g, initial_state=S0, impl=impl, chunk_size=C)


def _reference(op, q, k, v, g, beta, S0):
    """The recurrent loop in float64 on the same values (the delta loop directly: rounded keys
    are only normalised to their dtype's accuracy)."""
    import torch
    from mlexp.ops import delta
    d = [None if x is None else x.double() for x in (q, k, v, g, beta, S0)]
    if op in ("delta", "gated_delta"):
        return delta._recurrent(d[0], d[1], d[2], d[4], d[3] if op == "gated_delta" else None,
                                d[5] if d[5] is not None else torch.zeros(*q.shape[:2], q.shape[-1], v.shape[-1],
                                                                          dtype=torch.float64))
    return _call(op, "recurrent", d[0], d[1], d[2], d[3], d[4], d[5])


def _inputs(op, B, H, T, Dk, Dv, dtype=None, seed=0):
    """Random inputs for op as a dict of leaves (float32): q, k, v, S0, and g / beta when used."""
    import torch
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, H, T, Dk, generator=gen), "k": torch.randn(B, H, T, Dk, generator=gen),
         "v": torch.randn(B, H, T, Dv, generator=gen), "S0": torch.randn(B, H, Dk, Dv, generator=gen)}
    if op in ("delta", "gated_delta"):
        x["k"] = F.normalize(x["k"], dim=-1)
        x["beta"] = torch.rand(B, H, T, generator=gen)
    if op.startswith("gated"):
        shape = (B, H, T, Dk) if op == "gated_channel" else (B, H, T)
        x["g"] = F.logsigmoid(torch.randn(*shape, generator=gen) + 2)
    if dtype is not None:
        x = {n: (t if n == "S0" else t.to(dtype)) for n, t in x.items()}
    return x


def _compare(op, x, build, tag, errs, C=16, grads=True, **kw):
    """Run op on build(leaves) with Triton and on the float64 loop; record output, state and
    gradient errors. build maps the dict of leaves to the call's tensors (strides, expansion)."""
    import torch
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    names = list(leaves)
    outs = {}
    for impl in ("triton", "reference"):
        a = build(leaves)
        if impl == "triton":
            o, S = _call(op, "triton", a["q"], a["k"], a["v"], a.get("g"), a.get("beta"), a["S0"], C=C, **kw)
        elif kw.get("normalize"):
            o, S = _call(op, "recurrent", *(a[n].double() for n in ("q", "k", "v")), S0=a["S0"].double(), **kw)
        else:
            o, S = _reference(op, a["q"], a["k"], a["v"], a.get("g"), a.get("beta"), a["S0"])
        gr = None
        if grads:
            gen = torch.Generator().manual_seed(1)
            wo, wS = torch.randn(o.shape, generator=gen), torch.randn(S.shape, generator=gen)
            loss = (o.double() * wo.double()).sum() + (S.double() * wS.double()).sum()
            gr = torch.autograd.grad(loss, [leaves[n] for n in names])
        outs[impl] = (o, S, gr)
    (o, S, g1), (o_ref, S_ref, g0) = outs["triton"], outs["reference"]
    errs[f"{op} {tag} o"], errs[f"{op} {tag} S"] = _rel(o, o_ref), _rel(S, S_ref)
    if grads:
        for n, a, b in zip(names, g1, g0):
            errs[f"{op} {tag} d{n}"] = _rel(a, b)
    return outs


def group_strided():
    """Transposed and expanded inputs (the layouts the course's mixers pass)."""
    errs = {}
    B, H, T, Dk, Dv = 2, 2, 37, 16, 24
    for op in OPS:
        x = _inputs(op, B, H, T, Dk, Dv)
        # every (B, H, T, ...) input as a transposed view of a (B, T, H, ...) leaf
        xt = {n: (t.transpose(1, 2).contiguous() if n != "S0" else t) for n, t in x.items()}
        _compare(op, xt, lambda L: {n: (t.transpose(1, 2) if n != "S0" else t) for n, t in L.items()},
                 "transposed", errs, grads=True)
        if "g" in x:   # one fixed decay per head (and channel), expanded over batch and time: stride 0
            xe = dict(x, g=x["g"][:1, :, :1].clone())
            _compare(op, xe, lambda L: dict(L, g=L["g"].expand(x["g"].shape)), "expanded", errs)
    return errs


def group_dtype(name):
    import torch
    from mlexp.ops import triton_common, triton_delta
    triton_common.SMS_ELSEWHERE = 1              # widest state tiles (the other groups get the narrow ones)
    triton_delta.STATE_PROGRAMS_PER_SM = 1
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[name]
    errs, ok = {}, True
    for op in OPS:
        x = _inputs(op, 1, 2, 100, 32, 24, dtype=dtype)       # two chunks of 64 (fp32 inputs run chunks of 32)
        outs = _compare(op, x, lambda L: L, name, errs, C=64)
        o, S, grads = outs["triton"]
        ok &= o.dtype == dtype and S.dtype == torch.float32
        ok &= all(gr.dtype == x[n].dtype for n, gr in zip(x, grads))
    errs["dtypes_ok"] = bool(ok)
    return errs


def group_tf32():
    from mlexp.ops import triton_common
    triton_common.CAPABILITY_ELSEWHERE = (8, 0)  # the tiles and configs an A100 gets
    out = {}
    for prec in ("tf32x3", "tf32"):
        triton_common.F32_PRECISION = prec                        # what the wrappers ask tl.dot for
        errs = {}
        for op in OPS:
            _compare(op, _inputs(op, 1, 2, 40, 32, 32), lambda L: L, prec, errs, C=32, grads=(prec == "tf32x3"))
        out[prec] = errs if prec == "tf32x3" else {n: e for n, e in errs.items() if n.endswith(" o")}
    return out


def group_resets(full=""):
    import torch
    from mlexp.ops import triton_common
    triton_common.CAPABILITY_ELSEWHERE = (7, 5)  # the narrow tiles a T4 gets
    errs = {}
    example = []
    ones = torch.ones(1, 1, 4, 1)
    for R in (-float("inf"), -1e9, -1e30):
        g = torch.tensor([0.0, R, -0.6931, -0.6931]).view(1, 1, 4)
        o, _ = _call("gated_scalar", "triton", ones, ones, ones, g)
        example.append([round(t, 4) for t in o.flatten().tolist()])
        for op, gg in (("gated_scalar", g), ("gated_channel", g[..., None]), ("gated_delta", g)):
            x = {"q": ones, "k": ones, "v": ones, "S0": torch.zeros(1, 1, 1, 1), "g": gg}
            if op == "gated_delta":
                x["beta"] = torch.full((1, 1, 4), 0.5)
            _compare(op, x, lambda L: L, f"example R={R:g}", errs, grads=False)
    errs["issue_example"] = example
    B, H, T, Dk, Dv = 1, 2, 50, 16, 16
    for op in ("gated_scalar", "gated_channel", "gated_delta"):
        for R in (-float("inf"), -1e30, -1e4)[:3 if full else 2]:
            for where in ((0,), (15, 16), (23,), (49,), (3, 23, 40))[:5 if full else 3]:
                x = _inputs(op, B, H, T, Dk, Dv, seed=len(where))
                g = x["g"].clone()
                for t in where:
                    if op == "gated_channel":
                        g[:, :, t, : Dk // 4] = R                  # some channels only
                    else:
                        g[:, :, t] = R
                x["g"] = g
                _compare(op, x, lambda L: L, f"R={R:g} at {where}", errs)
    return errs


def group_nonfinite(full=""):
    import torch
    out = {}
    ones = torch.ones(1, 1, 4, 1)
    v = torch.tensor([1.0, 2.0, 3.0, float("nan")]).view(1, 1, 4, 1)
    o, _ = _call("linear", "triton", ones, ones, v)
    out["example"] = [None if t != t else t for t in o.flatten().tolist()]
    B, H, T, Dk, Dv = 1, 1, 40, 16, 16
    for op in OPS:
        names = ["q", "k", "v"] + (["g"] if op.startswith("gated") else []) + (["beta"] if "delta" in op else [])
        for name in names:
            for bad in (float("nan"), float("inf")):
                if bad == float("inf") and name in ("g", "beta"):
                    continue                                       # refused by the ops' argument checks
                for t in ((0, 7, 16, T - 1) if full else (7, 16)):
                    x = _inputs(op, B, H, T, Dk, Dv, seed=t)
                    x[name] = x[name].clone()
                    x[name][0, 0, t] = bad
                    res = []
                    for impl in ("recurrent", "triton"):
                        try:
                            res.append(_call(op, impl, x["q"], x["k"], x["v"], x.get("g"), x.get("beta"), x["S0"]))
                        except ValueError as e:
                            res.append(e)
                    key = f"{op} {name}={bad} at {t}"
                    if isinstance(res[0], ValueError) or isinstance(res[1], ValueError):
                        same = type(res[0]) is type(res[1])
                        out[key] = "ok" if same else f"one raised: {res}"
                        continue
                    msgs = []
                    for part, a, b in zip(("o", "S"), res[1], res[0]):
                        fin = torch.isfinite(b)
                        if not torch.equal(torch.isfinite(a), fin):
                            msgs.append(f"{part}: non-finite at {(~torch.isfinite(a)).nonzero()[:3].tolist()} vs "
                                        f"{(~fin).nonzero()[:3].tolist()}")
                        elif fin.any() and _rel(a[fin], b[fin]) > 1e-4:
                            msgs.append(f"{part}: finite values differ by {_rel(a[fin], b[fin]):.2e}")
                    out[key] = "; ".join(msgs) or "ok"
    return out


def group_shapes():
    errs = {}
    for B, H, T, Dk, Dv, C in [(1, 1, 150, 80, 72, 64), (2, 3, 37, 20, 40, 32), (1, 2, 33, 16, 16, 16),
                               (1, 1, 64, 130, 24, 64)]:
        for op in OPS:
            if op in ("delta", "gated_delta") and Dk > 128:
                continue
            _compare(op, _inputs(op, B, H, T, Dk, Dv), lambda L: L, f"{B}x{H}x{T}x{Dk}x{Dv} C={C}", errs, C=C)
    x = _inputs("linear", 1, 2, 45, 16, 24)
    x["q"], x["k"] = x["q"].exp(), x["k"].exp()                    # positive features: q . z > 0
    _compare("linear", x, lambda L: L, "normalize", errs, C=16, normalize=True)
    return errs


def group_state_tiles(op):
    import torch
    from mlexp.ops import triton_common, triton_delta
    errs, tiles = {}, {}
    for dtype, name in ((None, "fp32"), (torch.bfloat16, "bf16")):
        x = _inputs(op, 2, 2, 100, 32, 64, dtype=dtype)
        o = {}
        for sms in (132, 1):
            triton_common.SMS_ELSEWHERE = sms
            tiles[str(sms)] = list(triton_delta._state_tiles(32, 64, torch.float32, 4, torch.device("cpu")))
            o[sms] = _compare(op, x, lambda L: L, f"{name} sms={sms}", errs, C=32)["triton"]
        if name == "fp32":
            errs[f"{op} o split"] = _rel(o[132][0], o[1][0])
            errs[f"{op} S split"] = _rel(o[132][1], o[1][1])
    errs["tiles"] = tiles
    return errs


if __name__ == "__main__":
    _setup()
    group = sys.argv[1]
    fn = globals()[f"group_{group}"]
    print(json.dumps(fn(*sys.argv[2:])))
