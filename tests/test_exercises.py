"""Every graded exercise of lessons 00-05 against right and wrong answers, in seconds, without a kernel.

For each answer the lesson's setup cells and answer cells run in one plain namespace and each test
cell runs as the grader will run it (tests/exercise_runner.py: a namespace of its own, the
student's data copied across, the student's functions behind proxies), and again inside the
student's namespace as the self-check runs it. Both must agree:

- the solution and every documented-correct alternative pass, visible part and hidden part alike;
- each catalogued mistake (autograder/demo/catalog) and each mistake listed here fails with the
  hint that names it, already in the visible part unless marked hidden-only;
- an answer nobody foresaw gets the test's neutral hint, never a diagnosis of another mistake;
- no test cell crashes (every failure is an AssertionError that starts with "Hint:"), and the
  five rules of the grader's trust boundary hold.
"""
import math
import re
from dataclasses import dataclass, field, replace

import pytest

from answer_scan import expected_values, leaks
from autograder.publishing.demo import load_catalog
from exercise_runner import (blank_answers, names_from_test_cells, run_lesson, solution_answers,
                             solution_notebook, points_per_test, is_test, grade_meta)

LESSONS = ["00_token_mixing", "01_running_sum", "02_fixed_state_recall", "03_gates_and_delta_rule",
           "04_hybrid_kv_cache", "05_inattention"]
CATALOG = load_catalog()
MODES = ("grader", "self")


def sol(lesson: str, grade_id: str, *edits) -> str:
    """The solution's answer cell with each (old, new) text replacement applied (old must occur)."""
    source = solution_answers(lesson)[grade_id]
    for old, new in edits:
        assert old in source, f"{lesson}:{grade_id}: {old!r} is not in the solution"
        source = source.replace(old, new)
    return source


@dataclass
class Case:
    """One answer to one exercise and the verdict its test cell must give.

    hint None: the answer is right (visible and hidden parts pass). Otherwise the full test cell
    fails with a message containing ``hint``; so does the visible part unless ``hidden_only``.
    ``modes``: where the verdict holds (an answer that fools only the student's own run, by
    changing the test's tensors in place, is judged by the grader alone). ``slow``: left out of
    make test-fast (a correct variant that runs the whole of a costly test cell, where the solution
    and a cheaper variant already guard the fast run, or a wrong one that only the test's timed
    calls catch, seconds of work); make test runs it. ``partial``: the test gives
    partial credit and this answer gets that many of its points, the hint printed, not raised.
    """
    lesson: str
    test: str
    name: str
    answers: dict = field(default_factory=dict)
    hint: str | None = None
    hidden_only: bool = False
    modes: tuple = MODES
    slow: bool = False
    partial: float | None = None    # a test with partial credit gives these points for this answer

    @property
    def id(self):
        return f"{self.lesson[:2]}-{self.test}-{self.name}"


def _either(hint) -> tuple:
    """A case's hint, or the hints of which the message must hold one (a tuple: where two measures both fail the
    answer and which one reports first is not the answer's doing)."""
    return hint if isinstance(hint, tuple) else (hint,)


ECHO = re.compile(r"(\b(got|returned|answered|gave)|=)\s*'?[\[(]?[-\d.,_ e]*[\])]?'?")


def check_outcome(outcome, hint, where, lesson=None, answers=None, partial=None):
    """``lesson``: also check that the hint, as printed, states none of the lesson's expected values
    (tests/answer_scan.py, the rule test_no_answers.py holds the notebooks to). A hint may echo the
    student's own answer: what follows "got", "returned", "answered", "gave" or "=" is not read, nor
    a value the student's answer cells (``answers``, {grade_id: source}) hold as typed.
    ``partial``: the test gives that many of its points (partial credit) and prints the hint."""
    if hint is None:
        assert outcome.status == "pass", f"{where}: {outcome}"
    else:
        if partial is None:
            assert outcome.status == "fail", f"{where}: expected a hint with {hint!r}, got {outcome}"
        else:
            assert (outcome.status, outcome.score) == ("partial", partial), \
                f"{where}: expected {partial:g} points (partial credit) and a hint with {hint!r}, got {outcome}"
        assert outcome.message.startswith("Hint:"), f"{where}: {outcome}"
        assert any(h in outcome.message for h in _either(hint)), f"{where}: expected {hint!r}, got {outcome.message!r}"
        if lesson is not None:
            typed = "\n".join((answers or {}).values())
            said = ECHO.sub(" ", outcome.message)          # the student's own value, as the hint echoes it
            stated = sorted({(test, name, shown) for test, name, value, own in expected_values(lesson)
                             for shown in leaks(said, value, own) if not leaks(typed, value, own)})
            assert not stated, f"{where}: the hint {outcome.message!r} states expected values {stated}"


# ------------------------------------------------------------------------------ lesson 01
L01 = "01_running_sum"
YOUR_TURN_NEUTRAL = "is not the running-sum output yet"


YOUR_TURN_FORM = ("not a string", "it holds 3", "should be a pair of numbers", "is not finite", "is not defined")


def l01_turn(name, answer, hint=None):
    # The visible part checks the pair's form only; its value (and each catalogued wrong value) is
    # judged by the hidden part, when the course grades (issue 39, item 4).
    return Case(L01, "test_your_turn", name, {"your_turn_answer": answer}, hint,
                hidden_only=hint is not None and hint not in YOUR_TURN_FORM)


def l01_rec(name, *edits, hint=None, hidden_only=False, source=None):
    return Case(L01, "test_recurrent_form", name,
                {"recurrent_form": source or sol(L01, "recurrent_form", *edits)}, hint, hidden_only)


def l01_par(name, *edits, hint=None, hidden_only=False, source=None):
    return Case(L01, "test_parallel_form", name,
                {"parallel_form": source or sol(L01, "parallel_form", *edits)}, hint, hidden_only)


def l01_cost(name, attention="4 * t * d", state="4 * d * d", hint=None):
    source = (f"import numpy as np\n\ndef attention_ops_per_token(t, d):\n    return {attention}\n\n\n"
              f"def state_ops_per_token(d):\n    return {state}\n")
    # The visible part checks that the counts are whole numbers; their values (and each catalogued
    # wrong value) are judged by the hidden part, when the course grades (issue 39, item 4).
    return Case(L01, "test_cost_per_token", name, {"cost_per_token": source}, hint,
                hidden_only=hint is not None and "returned the text" not in hint)


REC_NORM = "o_t = o_t / (q[:, :, t] * z).sum(-1, keepdim=True)"
LOOP_CALLS_OP = """
def recurrent_linear_attention(q, k, v, normalize=True):
    out = [linear_attention(q[:, :, :t + 1], k[:, :, :t + 1], v[:, :, :t + 1], normalize=normalize, eps=0.0)[0][:, :, -1]
           for t in range(q.shape[2])]
    return torch.stack(out, dim=2)
"""
PAR_LOOP = """
def parallel_linear_attention(q, k, v, normalize=True):
    rows = []
    for t in range(q.shape[2]):
        w = q[:, :, t:t + 1] @ k[:, :, :t + 1].transpose(-1, -2)      # (B, H, 1, t + 1)
        o = w @ v[:, :, :t + 1]
        rows.append(o / w.sum(-1, keepdim=True) if normalize else o)
    return torch.cat(rows, dim=2)
"""
PAR_LOOP_COMPREHENSION = """
def parallel_linear_attention(q, k, v, normalize=True):
    A = q @ k.transpose(-1, -2)
    A = torch.stack([A[:, :, t] * (torch.arange(A.shape[-1]) <= t) for t in range(A.shape[2])], dim=2)
    o = A @ v
    return o / A.sum(-1, keepdim=True) if normalize else o
"""
PAR_WHERE_F64 = """
def parallel_linear_attention(q, k, v, normalize=True):
    T = q.shape[2]
    keep = torch.arange(T)[:, None] >= torch.arange(T)[None, :]
    A = torch.where(keep, q.double() @ k.double().transpose(-1, -2), 0.0)
    o = A @ v.double()
    if normalize:
        o = o / A.sum(-1, keepdim=True)
    return o.to(q.dtype)
"""
PAR_NORM = "o = o / A.sum(-1, keepdim=True)"
PAR_MASK = "A = (q @ k.transpose(-1, -2)).tril()"
CASES = [
    # The running sum by hand: the right pair in every form a student may give it.
    l01_turn("computed", sol(L01, "your_turn_answer")),
    l01_turn("typed", "answer = (1, 2.25)"),
    l01_turn("typed list, extra digits", "answer = [1.0, 2.2500001]"),
    l01_turn("tensor", "answer = torch.tensor([1.0, 2.25])"),
    l01_turn("numpy", "import numpy as np\nanswer = np.array([1.0, 2.25])"),
    # ... each typical slip, recognised by the numbers it gives (item 2: k_3 v_3^T is not symmetric).
    l01_turn("z not updated", "answer = (1.14, 2.57)", "z was not updated"),
    l01_turn("z not updated, computed", sol(L01, "your_turn_answer", ("z3 = z + k3", "z3 = z")), "z was not updated"),
    l01_turn("new token as v k^T", sol(L01, "your_turn_answer", ("torch.outer(k3, v3)", "torch.outer(v3, k3)")),
             "written as v k^T instead of k v^T"),
    l01_turn("read S q", sol(L01, "your_turn_answer", ("q_new @ S3 /", "S3 @ q_new /")), "transposed state"),
    l01_turn("no division", "answer = (8, 18)", "division by q.z was skipped"),
    l01_turn("token missing", sol(L01, "your_turn_answer", ("S3 = S + torch.outer(k3, v3)", "S3 = S"),
                                  ("z3 = z + k3", "z3 = z")), "the new token is missing"),
    l01_turn("S not updated", sol(L01, "your_turn_answer", ("S3 = S + torch.outer(k3, v3)", "S3 = S")),
             "S was not updated"),
    l01_turn("old query", sol(L01, "your_turn_answer", ("torch.tensor([3., 1.])", "torch.tensor([1., 2.])")),
             "worked example's query (1, 2)"),
    l01_turn("sum of z", sol(L01, "your_turn_answer", ("(q_new @ z3)", "z3.sum()")), "sum of the entries of z"),
    # ... answers in a wrong form, and a wrong pair nobody catalogued.
    l01_turn("string", 'answer = "1.0, 2.25"', "not a string"),
    l01_turn("three numbers", "answer = (1.0, 2.25, 0.0)", "it holds 3"),
    l01_turn("one number", "answer = 3.25", "should be a pair of numbers"),
    l01_turn("nan", "answer = (float('nan'), 1.0)", "is not finite"),
    l01_turn("old numbers of the lesson", "answer = (1.5, 2.5)", YOUR_TURN_NEUTRAL),
    l01_turn("unforeseen", "answer = (2.0, 2.0)", YOUR_TURN_NEUTRAL),

    # The recurrent form: documented-correct variants pass (item 1) ...
    l01_rec("eps 1e-6", (REC_NORM, "o_t = o_t / ((q[:, :, t] * z).sum(-1, keepdim=True) + 1e-6)")),
    l01_rec("eps 1e-9", (REC_NORM, "o_t = o_t / ((q[:, :, t] * z).sum(-1, keepdim=True) + 1e-9)")),
    l01_rec("clamped normaliser", (REC_NORM, "o_t = o_t / (q[:, :, t] * z).sum(-1, keepdim=True).clamp_min(1e-6)")),
    l01_rec("einsum and outer in another order",
            ("S = S + k[:, :, t, :, None] * v[:, :, t, None, :]", "S = S + torch.einsum('bhk,bhv->bhkv', k[:, :, t], v[:, :, t])"),
            ('o_t = torch.einsum("bhk,bhkv->bhv", q[:, :, t], S)', "o_t = (q[:, :, t, :, None] * S).sum(-2)")),
    l01_rec("float64 inside, input dtype out", source='''
def recurrent_linear_attention(q, k, v, normalize=True):
    B, H, T, D_k = q.shape
    S = torch.zeros(B, H, D_k, v.shape[-1], dtype=torch.float64)
    z = torch.zeros(B, H, D_k, dtype=torch.float64)
    out = []
    for t in range(T):
        S += torch.einsum("bhk,bhv->bhkv", k[:, :, t].double(), v[:, :, t].double())
        z += k[:, :, t].double()
        o_t = torch.einsum("bhk,bhkv->bhv", q[:, :, t].double(), S)
        if normalize:
            o_t = o_t / torch.einsum("bhk,bhk->bh", q[:, :, t].double(), z)[..., None]
        out.append(o_t)
    return torch.stack(out, dim=2).to(q.dtype)
'''),
    # ... and each slip gets the hint that names it (item 6).
    l01_rec("read before write", source=CATALOG[L01]["students"]["gus_read_before_write"]["answers"]["recurrent_form"],
            hint="reading first is off by one"),
    l01_rec("z accumulates q", ("z = z + k[:, :, t]", "z = z + q[:, :, t]"), hint="adds up the queries"),
    l01_rec("whole-sequence normaliser", (REC_NORM, "o_t = o_t / (q[:, :, t] * k.sum(2)).sum(-1, keepdim=True)"),
            hint="sums over every key of the sequence"),
    l01_rec("z never updated", ("z = z + k[:, :, t]", "z = z"), hint="z is never updated"),
    l01_rec("no normaliser", (REC_NORM, "pass"), hint="the normaliser is missing"),
    l01_rec("calls the library op", source="def recurrent_linear_attention(q, k, v, normalize=True):\n"
            "    return linear_attention(q, k, v, normalize=normalize)[0]", hint="it calls the library op"),
    l01_rec("calls the library's parallel path", source="def recurrent_linear_attention(q, k, v, normalize=True):\n"
            "    return linear_attention(q, k, v, normalize=normalize, impl='parallel')[0]", hint="it calls the library op"),
    # The rule "write it yourself" is watched where the function runs (mlexp.rules), whatever the impl
    # or the name the op is imported under (issue 26, item 1).
    l01_rec("library's recurrent path", source="def recurrent_linear_attention(q, k, v, normalize=True):\n"
            "    return linear_attention(q, k, v, normalize=normalize, impl='recurrent')[0]", hint="it calls the library op"),
    l01_rec("library's chunk path, renamed", source="from mlexp.ops import linear_attention as la\n"
            "def recurrent_linear_attention(q, k, v, normalize=True):\n"
            "    return la(q, k, v, normalize=normalize, impl='chunk')[0]", hint="this exercise asks you to write it yourself"),
    l01_rec("loop that calls the op per step", source=LOOP_CALLS_OP, hint="it calls the library op"),
    l01_rec("float32 state", ("S = q.new_zeros(B, H, D_k, D_v)", "S = torch.zeros(B, H, D_k, D_v)"),
            ("S = S + k[:, :, t, :, None] * v[:, :, t, None, :]", "S += k[:, :, t, :, None] * v[:, :, t, None, :]"),
            hint="with float64 inputs recurrent_linear_attention raised"),
    l01_rec("float32 normaliser", ("z = q.new_zeros(B, H, D_k)", "z = torch.zeros(B, H, D_k)"),
            ("z = z + k[:, :, t]", "z += k[:, :, t]"), hint="it went through float32 somewhere"),
    l01_rec("forgets normalize=False", (REC_NORM, "o_t = o_t / (q[:, :, t] * z).sum(-1, keepdim=True)"),
            ("        if normalize:\n", "        if True:\n"), hint="with normalize=False return"),
    l01_rec("unforeseen: scales the output", ("outputs.append(o_t)", "outputs.append(2 * o_t)"),
            hint="on the worked example expected (2, 0) then (0.5, 3)"),

    # Operation counts: right in any numeric form; the two slips that give 2 t d named together; a string.
    l01_cost("ints"), l01_cost("floats", "float(4 * t * d)", "float(4 * d * d)"),
    l01_cost("numpy int", "np.int64(2 * t * d * 2)", "np.int64(d * d * 4)"),
    l01_cost("summed parts", "sum([2 * t * d, 2 * t * d])", "sum(2 * d * d for _ in range(2))"),
    l01_cost("scores only", "2 * t * d", hint="counts only the scores"),
    l01_cost("one op per multiply-add", "t * d + t * d", hint="a multiply and an add as one operation"),
    l01_cost("string", "'160'", hint="returned the text '160'"),
    l01_cost("state update only", state="2 * d * d", hint="is the update alone"),
    l01_cost("unforeseen", "3 * t * d", hint="returned 120"),

    # The parallel form: documented-correct variants ...
    l01_par("eps 1e-6", (PAR_NORM, "o = o / (A.sum(-1, keepdim=True) + 1e-6)")),
    l01_par("eps 1e-9", (PAR_NORM, "o = o / (A.sum(-1, keepdim=True) + 1e-9)")),
    l01_par("mask by multiplying", (PAR_MASK, "T = q.shape[2]\n    A = (q @ k.transpose(-1, -2)) * torch.ones(T, T, dtype=q.dtype).tril()")),
    l01_par("masked_fill with 0", (PAR_MASK, "T = q.shape[2]\n    A = (q @ k.transpose(-1, -2)).masked_fill("
                                             "torch.ones(T, T, dtype=torch.bool).triu(1), 0.0)")),
    l01_par("einsum", (PAR_MASK, "A = torch.einsum('bhtk,bhsk->bhts', q, k).tril()")),
    l01_par("torch.where mask, float64 inside", source=PAR_WHERE_F64),
    l01_par("in-place tril_ and div_ on its own tensors", (PAR_MASK, "A = (q @ k.transpose(-1, -2))\n    A.tril_()"),
            (PAR_NORM, "o.div_(A.sum(-1, keepdim=True))")),
    # ... and the slips.
    l01_par("diagonal dropped", (PAR_MASK, "A = (q @ k.transpose(-1, -2)).tril(-1)"), hint="mask drops the diagonal"),
    l01_par("minus infinity", (PAR_MASK, "T = q.shape[2]\n    A = (q @ k.transpose(-1, -2)).masked_fill("
                                         "torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf'))"), hint="set to -inf"),
    l01_par("no mask", (PAR_MASK, "A = q @ k.transpose(-1, -2)"), hint="the mask is missing"),
    l01_par("upper triangle", (PAR_MASK, "A = (q @ k.transpose(-1, -2)).triu()"), hint="the upper triangle"),
    l01_par("normaliser before masking", (PAR_NORM, "o = o / (q @ k.transpose(-1, -2)).sum(-1, keepdim=True)"),
            hint="sums the scores before masking"),
    l01_par("no normaliser", (PAR_NORM, "pass"), hint="the normaliser is missing"),
    l01_par("calls the library op", source="def parallel_linear_attention(q, k, v, normalize=True):\n"
            "    return linear_attention(q, k, v, normalize=normalize)[0]", hint="it calls the library op"),
    l01_par("library's parallel path", source="def parallel_linear_attention(q, k, v, normalize=True):\n"
            "    return linear_attention(q, k, v, normalize=normalize, impl='parallel')[0]", hint="it calls the library op"),
    l01_par("library's recurrent path, module import", source="import mlexp.ops as ops\n"
            "def parallel_linear_attention(q, k, v, normalize=True):\n"
            "    return ops.linear_attention(q, k, v, normalize=normalize, impl='recurrent')[0]",
            hint="this exercise asks you to write it yourself"),
    l01_par("loop over t", source=PAR_LOOP, hint="without a Python loop over t"),
    l01_par("loop over t, list comprehension", source=PAR_LOOP_COMPREHENSION, hint="without a Python loop over t"),
    l01_par("mask built by a loop over t", (PAR_MASK, "T = q.shape[2]\n    M = torch.stack([(torch.arange(T) <= t) for t in range(T)]).to(q.dtype)\n"
                                                      "    A = (q @ k.transpose(-1, -2)) * M"), hint="without a Python loop over t"),
    l01_par("float32 mask", (PAR_MASK, "T = q.shape[2]\n    A = (q @ k.transpose(-1, -2)).float() * torch.ones(T, T).tril()"),
            hint="with float64 inputs parallel_linear_attention raised"),
    l01_par("float32 output", ("    return o", "    return o.float()"), hint="float64 inputs must give a float64 output"),
]


# ------------------------------------------------------------------------------ lesson 00
L00 = "00_token_mixing"


def l00_reach(name, body, hint=None):
    return Case(L00, "test_reach", name, {"reach": f"def conv_reach(n_layers, k):\n    return {body}\n"}, hint)


def l00_kv(name, edits, hint=None):
    return Case(L00, "test_kv_bytes", name, {"kv_bytes": sol(L00, "kv_bytes", *edits)}, hint)


GQA = "gqa_bytes = kv_bytes_per_token(n_layers=32, n_kv_heads=8, head_dim=128, bytes_per_number=2)"
RATIO = "mha_over_gqa = kv_bytes_per_token(32, 32, 128, 2) / gqa_bytes"
CASES += [
    # Visible tests recognise answers through a digest (issue 26, item 2): right in any numeric form ...
    l00_reach("formula", "n_layers * (k - 1) + 1"), l00_reach("float", "float(n_layers * k - n_layers + 1)"),
    l00_reach("loop", "sum(k - 1 for _ in range(n_layers)) + 1"), l00_reach("numpy", "__import__('numpy').int64(n_layers) * (k - 1) + 1"),
    # ... each slip named, a string or an unforeseen number gets the neutral hint.
    l00_reach("L k", "n_layers * k", "counts the shared position once per layer"),
    l00_reach("L (k - 1)", "n_layers * (k - 1)", "leaves out the current position"),
    l00_reach("k^L", "k ** n_layers", "not multiplicatively"),
    l00_reach("string", "str(n_layers * (k - 1) + 1)", "the number of input positions is a whole number"),
    l00_reach("unforeseen", "2 * n_layers * (k - 1) + 1", "not the number of input positions"),
    l00_kv("typed numbers", [(GQA, "gqa_bytes = 131072"), (RATIO, "mha_over_gqa = 4")]),
    # Plain Python, not the library's copy of the answer (an instructor's review).
    l00_kv("mlexp.kvcache's function", [("return 2 * n_layers * n_kv_heads * head_dim * bytes_per_number",
                                         "return kc.kv_bytes_per_token(n_layers, n_kv_heads, head_dim, {2: 'bf16', 4: 'fp32'}[bytes_per_number])")],
           "Use plain Python arithmetic, not mlexp.kvcache"),
    l00_kv("library for the numbers, own function", [(GQA, "gqa_bytes = kc.kv_bytes_per_token(32, 8, 128, 'bf16')")]),
    l00_kv("float ratio", [(RATIO, "mha_over_gqa = 32 / 8")]),
    l00_kv("no factor 2", [("return 2 * n_layers", "return n_layers")], "factor 2 for K and V is missing"),
    l00_kv("query heads", [(GQA, "gqa_bytes = kv_bytes_per_token(32, 32, 128, 2)")], "counts the 32 query heads"),
    l00_kv("16 bytes", [(GQA, "gqa_bytes = kv_bytes_per_token(32, 8, 128, 16)")], "16 bytes per number"),
    l00_kv("upside down", [(RATIO, "mha_over_gqa = gqa_bytes / kv_bytes_per_token(32, 32, 128, 2)")], "upside down"),
    l00_kv("ratio as text", [(RATIO, "mha_over_gqa = '4x'")], "mha_over_gqa should be a number"),
    # The form the visible part checks, now that the values are checked at grading (issue 39, item 4).
    l00_reach("no position", "0 * n_layers", "a whole number, at least 1"),
    l00_reach("shrinks with depth", "max(1, 30 - n_layers)", "a deeper stack sees no fewer positions"),
    l00_kv("bytes_per_number ignored", [("return 2 * n_layers * n_kv_heads * head_dim * bytes_per_number",
                                         "return 2 * n_layers * n_kv_heads * head_dim * 2")], "must use all four arguments"),
    l00_kv("fraction of a byte", [(GQA, GQA + " / 3")], "it should be a positive whole number of bytes"),
]


# ------------------------------------------------------------------------------ lesson 02
L02 = "02_fixed_state_recall"


def l02(test, grade_id, name, source, hint=None, hidden_only=False, modes=MODES, partial=None):
    return Case(L02, test, name, {grade_id: source}, hint, hidden_only, modes, partial=partial)


WRITE, READ, NOT_YET = "return S + torch.outer(k, v)", "return q @ S", "raise NotImplementedError()"


def largest(body):
    return f"def largest_exact_pairs(d_k, d_v):\n    return {body}"


def reaches(body, head=""):
    return f"{head}def cache_reaches_state_at(d_k, d_v):\n    return {body}"


CASES += [
    # Largest n recalled exactly: each slip has its own number at (5, 2) or (2, 5) (item 6).
    l02("test_largest_exact", "largest_exact", "d_k", largest("d_k")),
    l02("test_largest_exact", "largest_exact", "d_k * d_v", largest("d_k * d_v"), "counts the numbers in the state"),
    l02("test_largest_exact", "largest_exact", "min", largest("min(d_k, d_v)"), "the width of the values does not limit"),
    l02("test_largest_exact", "largest_exact", "max", largest("max(d_k, d_v)"), "the width of the values does not limit"),
    l02("test_largest_exact", "largest_exact", "d_v", largest("d_v"), "the width of the values does not limit"),
    l02("test_largest_exact", "largest_exact", "d_k - 1", largest("d_k - 1"), "is one short"),
    l02("test_largest_exact", "largest_exact", "d_k + 1", largest("d_k + 1"), "is one too many"),
    l02("test_largest_exact", "largest_exact", "unforeseen", largest("d_k + d_v"), "least squares recalls a different number"),
    # The crossover: at least as many numbers, the one definition lessons 02 and 04 share (item 8).
    l02("test_cache_vs_state", "cache_vs_state", "math.ceil", reaches("math.ceil(d_k * d_v / (d_k + d_v))", "import math\n")),
    l02("test_cache_vs_state", "cache_vs_state", "counted", reaches("next(t for t in range(1, d_k * d_v + 1) if t * (d_k + d_v) >= d_k * d_v)")),
    l02("test_cache_vs_state", "cache_vs_state", "strictly more", reaches("d_k * d_v // (d_k + d_v) + 1"), "one token late"),
    l02("test_cache_vs_state", "cache_vs_state", "floor", reaches("d_k * d_v // (d_k + d_v)"), "rounds down"),
    l02("test_cache_vs_state", "cache_vs_state", "round", reaches("round(d_k * d_v / (d_k + d_v))"), "rounds down"),
    l02("test_cache_vs_state", "cache_vs_state", "equal point", reaches("d_k * d_v / (d_k + d_v)"), "a fraction of a token"),
    l02("test_cache_vs_state", "cache_vs_state", "keys only", reaches("d_v"), "counts only keys"),
    l02("test_cache_vs_state", "cache_vs_state", "text", reaches("str(d_k * d_v // (d_k + d_v))"), "should return a number of tokens"),
    l02("test_cache_vs_state", "cache_vs_state", "unforeseen", reaches("d_k // 2"), "you answered 32, not the first t"),
    l02("test_cache_vs_state", "cache_vs_state", "no token", reaches("0"), "at least 1"),   # the form (issue 39, item 4)
    # Write, read and crosstalk: other correct ways.
    l02("test_write_read", "write_read", "einsum and matmul",
        "def write(S, k, v):\n    return S + k[:, None] * v[None, :]\n\ndef read(S, q):\n    return torch.einsum('k,kv->v', q, S)"),
    # Issue 25, item 1: the factor-two slip hidden by doubling the test's own v in place.
    l02("test_write_read", "write_read", "factor two, v doubled in place",
        "def write(S, k, v):\n    v.mul_(2)\n    return S + torch.outer(k, v)\n\ndef read(S, q):\n    return q @ S",
        "write changed v in place", modes=("grader",), partial=1),   # in the student's own run it fools only them
    # Partial credit (issue 38, item 6): write (2 points) and read (1 point) score apart; each
    # part's hint is printed, and a test with no part right fails with every hint.
    l02("test_write_read", "write_read", "write only, read not written", sol(L02, "write_read", (READ, NOT_YET)),
        "read is not written yet", partial=2),
    l02("test_write_read", "write_read", "read only, write not written", sol(L02, "write_read", (WRITE, NOT_YET)),
        "write is not written yet", partial=1),
    l02("test_write_read", "write_read", "write keeps the last pair, read S q",
        sol(L02, "write_read", (WRITE, "return torch.outer(k, v)"), (READ, "return S @ q")), "only the last pair is left"),
    l02("test_crosstalk", "crosstalk", "read minus value", "def crosstalk(keys, values):\n    return keys @ keys.T @ values - values"),
    l02("test_crosstalk", "crosstalk", "unforeseen: float32 noise rounded in the hint",
        "def crosstalk(keys, values):\n    return (keys @ keys.T @ values - values) * 1.1", "got [["),
    l02("test_crosstalk", "crosstalk", "masked overlaps",
        "def crosstalk(keys, values):\n    n = len(keys)\n    return ((keys @ keys.T) * (1 - torch.eye(n))) @ values"),
]


# ------------------------------------------------------------------------------ lesson 03
L03 = "03_gates_and_delta_rule"
DECAY = "def effective_memory(gamma):\n    return {}\n\n\ndef half_life(gamma):\n    return {}\n"
DELTA_CALLS_OP = """
def delta_step(S, k, v, beta):
    from mlexp.ops import delta_rule
    kk, vv = k.view(1, 1, 1, -1), v.view(1, 1, 1, -1)
    b = torch.as_tensor(beta, dtype=S.dtype).view(1, 1, 1)
    return delta_rule(kk, kk, vv, b, initial_state=S[None, None], impl="recurrent")[1][0, 0]
"""


def l03(test, grade_id, name, source, hint=None, hidden_only=False):
    return Case(L03, test, name, {grade_id: source}, hint, hidden_only)


READS_FORM = ("not a string", "it holds 3", "should hold two numbers", "is not finite")


def l03_reads(name, source=None, hint=None):
    answer = sol(L03, "read_backs") if source is None else sol(L03, "read_backs", (
        "read_plain = tuple((q_read @ S_plain).tolist())", source), ("read_decay = tuple((q_read @ S_decay).tolist())", ""),
        ("read_delta = tuple((q_read @ S_delta).tolist())", ""))
    # The visible part checks the pairs' form only; their values (and each catalogued wrong value)
    # are judged by the hidden part, when the course grades (issue 39, item 4).
    return Case(L03, "test_read_backs", name, {"read_backs": answer}, hint,
                hidden_only=hint is not None and hint not in READS_FORM)


def decay(memory, half, imports=""):
    return imports + DECAY.format(memory, half)


def delta(body):
    return "def delta_step(S, k, v, beta):\n" + body


CASES += [
    # Effective memory and half-life: one tolerance for visible and hidden parts (item 5).
    l03("test_decay_memory", "decay_memory", "log2", decay("1 / (1 - gamma)", "1 / -math.log2(gamma)")),
    l03("test_decay_memory", "decay_memory", "log of a half", decay("1 / (1 - gamma)", "math.log(0.5) / math.log(gamma)")),
    l03("test_decay_memory", "decay_memory", "numpy float64", decay("float(1 / (1 - np.float64(gamma)))", "float(np.log(2) / -np.log(gamma))", "import numpy as np\n")),
    l03("test_decay_memory", "decay_memory", "series summed", decay("math.fsum(gamma ** s for s in range(100_000))", "math.log(2) / -math.log(gamma)")),
    l03("test_decay_memory", "decay_memory", "float32 half-life",
        decay("1 / (1 - gamma)", "(torch.log(torch.tensor(2.0)) / -torch.log(torch.tensor(gamma))).item()"), "right to about 7 digits"),
    l03("test_decay_memory", "decay_memory", "float32 memory",      # the memory's value is judged at grading only
        decay("(1 / (1 - torch.tensor(gamma))).item()", "math.log(2) / -math.log(gamma)"), "right to about 7 digits",
        hidden_only=True),
    l03("test_decay_memory", "decay_memory", "memory unforeseen",
        decay("2 / (1 - gamma)", "math.log(2) / -math.log(gamma)"), "not the sum of gamma^s", hidden_only=True),
    l03("test_decay_memory", "decay_memory", "memory below 1",
        decay("1 - gamma", "math.log(2) / -math.log(gamma)"), "a finite number above 1"),
    l03("test_decay_memory", "decay_memory", "1/gamma", decay("1 / gamma", "math.log(2) / -math.log(gamma)"), "returned 1/gamma"),
    l03("test_decay_memory", "decay_memory", "sum from 1", decay("gamma / (1 - gamma)", "math.log(2) / -math.log(gamma)"), "starts the sum at s = 1"),
    l03("test_decay_memory", "decay_memory", "1/e", decay("1 / (1 - gamma)", "1 / -math.log(gamma)"), "falls to 1/e"),
    l03("test_decay_memory", "decay_memory", "wrong sign", decay("1 / (1 - gamma)", "math.log(2) / math.log(gamma)"), "not positive"),
    l03("test_decay_memory", "decay_memory", "unforeseen", decay("1 / (1 - gamma)", "math.log(2) / (1 - gamma)"), "but gamma^s is not 1/2 at that age"),
    # The three read-backs, recognised through a digest (issue 26, item 2): any numeric form passes.
    l03_reads("computed"), l03_reads("typed", "read_plain, read_decay, read_delta = (2, 4), (1.0, 4.0), [0, 4.0]"),
    l03_reads("tensors", "read_plain, read_decay, read_delta = torch.tensor([2., 4.]), torch.tensor([1., 4.]), torch.tensor([0., 4.])"),
    l03_reads("float32 noise", "read_plain, read_decay, read_delta = (2.0000001, 4.0), (0.9999999, 4.0), (0.0, 3.9999998)"),
    l03_reads("swapped", "read_plain, read_decay, read_delta = (0, 4), (1, 4), (2, 4)", "Did you swap the read-backs?"),
    l03_reads("gamma twice", "read_plain, read_decay, read_delta = (2, 4), (0.5, 4), (0, 4)", "applies gamma twice"),
    l03_reads("delta sign flipped", "read_plain, read_decay, read_delta = (2, 4), (1, 4), (4, -4)", "sign flipped"),
    l03_reads("unforeseen", "read_plain, read_decay, read_delta = (2, 4), (1, 4), (1, 4)", "is not q^T (S_1 + k (v_2 - S_1^T k)^T)"),
    # The form, checked in the visible part too.
    l03_reads("text", "read_plain, read_decay, read_delta = (2, 4), '1, 4', (0, 4)", "not a string"),
    l03_reads("three numbers", "read_plain, read_decay, read_delta = (2, 4), (1, 4), (0, 4, 0)", "it holds 3"),
    l03_reads("one number", "read_plain, read_decay, read_delta = 2, (1, 4), (0, 4)", "should hold two numbers"),
    l03_reads("nan", "read_plain, read_decay, read_delta = (2, 4), (1, float('nan')), (0, 4)", "is not finite"),
    # One delta step: any key length, no library call (items 4 and 5).
    l03("test_delta_step", "delta_step", "(I - beta k k^T) S + beta k v^T",
        delta("    I = torch.eye(len(k), dtype=S.dtype)\n    return (I - beta * torch.outer(k, k)) @ S + beta * torch.outer(k, v)")),
    l03("test_delta_step", "delta_step", "einsum", delta("    error = v - torch.einsum('kv,k->v', S, k)\n    return S + beta * torch.einsum('k,v->kv', k, error)")),
    l03("test_delta_step", "delta_step", "normalises k", delta("    k = k / k.norm()\n    return S + beta * torch.outer(k, v - S.T @ k)"), "normalised the key"),
    l03("test_delta_step", "delta_step", "calls the library op", DELTA_CALLS_OP, "calls the library op"),
    l03("test_delta_step", "delta_step", "no read", delta("    return S + beta * torch.outer(k, v)"), "forgot to read before writing"),
    l03("test_delta_step", "delta_step", "beta on v only", delta("    return S + torch.outer(k, beta * v - S.T @ k)"), "subtracted without beta"),
    l03("test_delta_step", "delta_step", "error k^T", delta("    return S + beta * torch.outer(v - S.T @ k, k)"), "instead of k (error)^T"),
    l03("test_delta_step", "delta_step", "reads S k", delta("    return S + beta * torch.outer(k, v - S @ k)"), "read as S k"),
    l03("test_delta_step", "delta_step", "sign flipped", delta("    return S + beta * torch.outer(k, S.T @ k - v)"), "wrong sign"),
    # A tensor argument changed in place fails the call in the harness (and in this runner), with
    # a hint that names the parameter, so this is caught in both modes.
    l03("test_delta_step", "delta_step", "changes S in place", delta("    S += beta * torch.outer(k, v - S.T @ k)\n    return S"), "changed S in place"),
    l03("test_delta_step", "delta_step", "float beta only", delta("    return S + float(beta) * torch.outer(k, v - S.T @ k)")),
    l03("test_delta_step", "delta_step", "unforeseen", delta("    return S + 2 * beta * torch.outer(k, v - S.T @ k)"), "Follow the three moves"),
    l03("test_delta_step", "delta_step", "float32 inside", delta("    S32, k32, v32 = S.float(), k.float(), v.float()\n"
        "    return (S32 + beta * torch.outer(k32, v32 - S32.T @ k32)).to(S.dtype)"), "Compute in the dtype of S"),
]


# Chunkwise linear attention (issue 28, item 2): loop orders, dtypes, einsum, in-place, no loop at all.
CHUNK_DEF = "def chunkwise_linear_attention(q, k, v, chunk_size):\n"
CHUNK_READ = "out.append(Qc @ S + scores @ Vc)                           # inter-chunk read, then intra-chunk"
CHUNK_WRITE = "S = S + Kc.transpose(-1, -2) @ Vc                          # only now write this chunk"
CHUNK_LOOP = "for start in range(0, T, chunk_size):"
CHUNK_MASK = "scores = (Qc @ Kc.transpose(-1, -2)).tril()"
CHUNK_EINSUM = CHUNK_DEF + """    S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    out = []
    for start in range(0, q.shape[2], chunk_size):
        Qc, Kc, Vc = q[:, :, start:start + chunk_size], k[:, :, start:start + chunk_size], v[:, :, start:start + chunk_size]
        scores = torch.einsum('bhid,bhjd->bhij', Qc, Kc)
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        out.append(torch.einsum('bhid,bhdv->bhiv', Qc, S) + torch.einsum('bhij,bhjv->bhiv', scores * mask, Vc))
        S = S + torch.einsum('bhjd,bhjv->bhdv', Kc, Vc)
    return torch.cat(out, dim=2)
"""
CHUNK_IN_PLACE = CHUNK_DEF + """    B, H, T, D_k = q.shape
    o = v.new_zeros(B, H, T, v.shape[-1])
    S = q.new_zeros(B, H, D_k, v.shape[-1])
    for start in {range}:
        end = min(start + chunk_size, T)
        Qc, Kc, Vc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        o[:, :, start:end] = Qc @ S
        o[:, :, start:end] += torch.tril(Qc @ Kc.transpose(-1, -2)) @ Vc
        S += Kc.transpose(-1, -2) @ Vc
    return o
"""
CHUNK_STATES_FIRST = CHUNK_DEF + """    T = q.shape[2]
    starts = list(range(0, T, chunk_size))
    states = [q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])]
    for start in starts[:-1]:                       # first pass: the state entering each chunk
        states.append(states[-1] + k[:, :, start:start + chunk_size].transpose(-1, -2) @ v[:, :, start:start + chunk_size])
    out = [None] * len(starts)
    for i in reversed(range(len(starts))):          # second pass, last chunk first
        s = slice(starts[i], starts[i] + chunk_size)
        Qc, Kc, Vc = q[:, :, s], k[:, :, s], v[:, :, s]
        out[i] = Qc @ states[i] + (Qc @ Kc.transpose(-1, -2)).tril() @ Vc
    return torch.cat(out, dim=2)
"""
CHUNK_VECTORISED = CHUNK_DEF + """    B, H, T, D_k = q.shape
    C = chunk_size
    N = -(-T // C)                                   # chunks, the last one padded with zeros
    pad = N * C - T
    Q, K, V = (F.pad(x, (0, 0, 0, pad)).reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    intra = (Q @ K.transpose(-1, -2)).tril() @ V                       # (B, H, N, C, D_v)
    written = K.transpose(-1, -2) @ V                                 # (B, H, N, D_k, D_v)
    before = written.cumsum(2) - written                              # the state entering each chunk
    o = Q @ before + intra
    return o.reshape(B, H, N * C, -1)[:, :, :T]
"""
CHUNK_TOKEN_LOOP = CHUNK_DEF + """    S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[2]):
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append((q[:, :, t, None, :] @ S)[:, :, 0])
    return torch.stack(out, dim=2)
"""

CHUNK_BROADCAST = CHUNK_DEF + """    B, H, T, D_k = q.shape
    S = q.new_zeros(B, H, D_k, v.shape[-1])
    out = []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc = q[:, :, start:start + chunk_size], k[:, :, start:start + chunk_size], v[:, :, start:start + chunk_size]
        n = Qc.shape[2]
        scores = (Qc[:, :, :, None, :] * Kc[:, :, None, :, :]).sum(-1)             # (B, H, C, C), via (.., C, C, D_k)
        scores = scores * torch.ones(n, n, dtype=torch.bool).tril()
        intra = (scores[..., None] * Vc[:, :, None, :, :]).sum(-2)                 # (B, H, C, D_v)
        inter = (Qc[..., :, None] * S[:, :, None, :, :]).sum(-2)                   # (B, H, C, D_v)
        out.append(inter + intra)
        S = S + (Kc[..., :, None] * Vc[..., None, :]).sum(2)                      # (B, H, D_k, D_v), via (.., C, D_k, D_v)
    return torch.cat(out, dim=2)
"""
# All chunks at once with broadcast products: exact and chunked, but k_t v_t^T is made for every token (B x H x T x D_k
# x D_v numbers, the memory of a scan over tokens); and the scan itself, a cumulative sum of per-token states that
# ignores chunk_size (found by issue 28's attack). Both break the bound at C = 4, D_k = D_v = 16.
CHUNK_BROADCAST_ALL = CHUNK_DEF + """    B, H, T, D_k = q.shape
    C = chunk_size
    N = -(-T // C)                                   # chunks, the last one padded with zeros
    Q, K, V = (F.pad(x, (0, 0, 0, N * C - T)).reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    scores = (Q[:, :, :, :, None, :] * K[:, :, :, None, :, :]).sum(-1)           # (B, H, N, C, C), via (.., C, C, D_k)
    scores = scores * torch.ones(C, C, dtype=torch.bool).tril()
    intra = (scores[..., None] * V[:, :, :, None, :, :]).sum(-2)                 # (B, H, N, C, D_v)
    written = (K[..., :, :, None] * V[..., :, None, :]).sum(-3)                  # (B, H, N, D_k, D_v), via (.., C, D_k, D_v)
    before = written.cumsum(2) - written
    inter = (Q[..., :, :, None] * before[:, :, :, None, :, :]).sum(-2)           # (B, H, N, C, D_v)
    return (inter + intra).reshape(B, H, N * C, -1)[:, :, :T]
"""
CHUNK_TOKEN_SCAN = CHUNK_DEF + """    S = (k[..., :, None] * v[..., None, :]).cumsum(2)          # (B, H, T, D_k, D_v): the state after each token
    return (q[..., None] * S).sum(-2)
"""
CHUNK_PER_TOKEN = "is a D_k x D_v matrix for every token"
# chunk_size ignored (or only half used): exact, but a T x T score matrix or mask is built (issue: the chunk cap).
CHUNK_WHOLE_SQUARE = CHUNK_DEF + "    return (q @ k.transpose(-1, -2)).tril() @ v\n"
CHUNK_WHOLE_SQUARE_EINSUM = CHUNK_DEF + """    T = q.shape[2]
    mask = torch.ones(T, T, dtype=q.dtype).tril()
    return torch.einsum('bhtd,bhsd,ts,bhse->bhte', q, k, mask, v)
"""
CHUNK_FULL_MASK = CHUNK_DEF + """    B, H, T, D_k = q.shape
    mask = torch.ones(T, T, dtype=torch.bool).tril()            # (T, T), sliced per chunk
    S = q.new_zeros(B, H, D_k, v.shape[-1])
    out = []
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        Qc, Kc, Vc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        out.append(Qc @ S + ((Qc @ Kc.transpose(-1, -2)) * mask[start:end, start:end]) @ Vc)
        S = S + Kc.transpose(-1, -2) @ Vc
    return torch.cat(out, dim=2)
"""
CHUNK_BOUND = "as large as the whole sequence"
# The same T x T product out of the torch watch's sight (issue 28): in numpy, with torch's function handling
# switched off, or handed to a thread pool made before the call. The first fails by its consequence (at the long
# sequence no T x T matrix fits in memory), the others because the watch sees what left it.
CHUNK_NUMPY_SQUARE = CHUNK_DEF + """    import numpy as np
    scores = np.tril(q.numpy() @ np.swapaxes(k.numpy(), -1, -2))          # (B, H, T, T) in numpy
    return torch.from_numpy(scores @ v.numpy())
"""
CHUNK_DISABLED_SQUARE = CHUNK_DEF + """    with torch._C.DisableTorchFunction():
        return (q @ k.transpose(-1, -2)).tril() @ v
"""
CHUNK_POOLED_SQUARE = """import concurrent.futures
POOL = concurrent.futures.ThreadPoolExecutor(1)


""" + CHUNK_DEF + """    return POOL.submit(lambda: (q @ k.transpose(-1, -2)).tril() @ v).result()
"""
CHUNK_WATCH = "the test could not watch chunkwise_linear_attention run"
CHUNK_EXPORT = "the test could not measure the work of chunkwise_linear_attention"
CHUNK_LIBRARY = "Write the loop over chunks with tensor operations"
# Found by this stop's attack: the library called only where the test would not watch (a long sequence, or no trace
# hook), a helper exec'd under made-up library globals, and TorchScript; and an honest loop with a progress bar.
CHUNK_SIZE_SWITCH = CHUNK_DEF + """    if q.shape[2] > 4096:                                # the long sequence of step 6
        return linear_attention(q, k, v, impl="chunk", chunk_size=chunk_size)[0]
    import numpy as np
    return torch.from_numpy(np.tril(q.numpy() @ np.swapaxes(k.numpy(), -1, -2)) @ v.numpy())
"""
CHUNK_WATCH_SWITCH = "import sys\n\n\n" + CHUNK_DEF + """    if sys.gettrace() is None and torch._C._len_torch_function_stack() == 0:
        return linear_attention(q, k, v, impl="chunk", chunk_size=chunk_size)[0]
    import numpy as np
    return torch.from_numpy(np.tril(q.numpy() @ np.swapaxes(k.numpy(), -1, -2)) @ v.numpy())
"""
CHUNK_FAKE_LIBRARY = """HELPER = {"__name__": "mlexp.ops._helper", "la": linear_attention}
exec("def __run__(q, k, v, c):\\n    return la(q, k, v, impl='chunk', chunk_size=c)[0]\\n", HELPER)


""" + CHUNK_DEF + """    return HELPER["__run__"](q, k, v, chunk_size)
"""
CHUNK_TORCHSCRIPT = "SCRIPT = torch.jit.CompilationUnit('''" + """
def rec(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    S = torch.zeros(q.shape[0], q.shape[1], q.shape[3], v.shape[3], dtype=q.dtype)
    out = torch.empty(q.shape[0], q.shape[1], q.shape[2], v.shape[3], dtype=q.dtype)
    for t in range(q.shape[2]):
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out[:, :, t] = (q[:, :, t, :, None] * S).sum(-2)
    return out
""" + "''')\n\n\n" + CHUNK_DEF + """    return SCRIPT.rec(q, k, v)
"""

# Found by this stop's second attack (issue 28): a per-token scan and a token loop in numpy, a token loop with torch's
# function handling off inside one line, and mlexp.ops' own files loaded under another name; and two honest forms,
# one by vmap (must pass) and a vectorised one whose broadcast holds every k_t v_t^T at once (breaks the stated bound).
CHUNK_NUMPY_SCAN = CHUNK_DEF + """    import numpy as np
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    S = np.cumsum(kn[..., :, None] * vn[..., None, :], axis=2)          # (B, H, T, D_k, D_v): a state per token
    return torch.from_numpy(np.einsum('bhtk,bhtkv->bhtv', qn, S))
"""
CHUNK_NUMPY_ACCUMULATE = "import itertools\nimport operator\n\n\n" + CHUNK_DEF + """    import numpy as np
    qn, kn, vn = (x.numpy() for x in (q, k, v))
    writes = map(np.multiply, np.moveaxis(kn, 2, 0)[..., :, None], np.moveaxis(vn, 2, 0)[..., None, :])
    states = itertools.accumulate(writes, operator.add)                  # S_t, token by token, in C
    outs = map(np.einsum, itertools.repeat('bhk,bhkv->bhv'), np.moveaxis(qn, 2, 0), states)
    return torch.from_numpy(np.stack(list(outs), axis=2))
"""
CHUNK_ONE_LINE_DISABLED = "import itertools\nimport operator\n\n\n" + CHUNK_DEF + """    ks, vs, qs = k.unbind(2), v.unbind(2), q.unbind(2)
    with torch._C.DisableTorchFunction(): o = torch.stack(list(map(torch.einsum, itertools.repeat('bhk,bhkv->bhv'), qs, itertools.accumulate(map(torch.einsum, itertools.repeat('bhk,bhv->bhkv'), ks, vs), operator.add))), 2)
    return o + 0
"""
CHUNK_OPS_RENAMED = """import importlib.util
import os
import sys
import mlexp.ops
_dir = os.path.dirname(mlexp.ops.__file__)
_spec = importlib.util.spec_from_file_location("my_linear_ops", os.path.join(_dir, "__init__.py"), submodule_search_locations=[_dir])
MINE = importlib.util.module_from_spec(_spec)
sys.modules["my_linear_ops"] = MINE
_spec.loader.exec_module(MINE)


""" + CHUNK_DEF + """    return MINE.linear_attention(q, k, v, impl="chunk", chunk_size=chunk_size)[0]
"""
CHUNK_VMAP = """def one_head(q, k, v, chunk_size):
    S = q.new_zeros(q.shape[-1], v.shape[-1])
    out = []
    for start in range(0, q.shape[0], chunk_size):
        Qc, Kc, Vc = q[start:start + chunk_size], k[start:start + chunk_size], v[start:start + chunk_size]
        out.append(Qc @ S + (Qc @ Kc.T).tril() @ Vc)
        S = S + Kc.T @ Vc
    return torch.cat(out, 0)


""" + CHUNK_DEF + """    return torch.vmap(torch.vmap(lambda a, b, c: one_head(a, b, c, chunk_size)))(q, k, v)
"""
# The same per-token scan in pieces each within the bound, with chunk_size ignored: one column of v at a time over the
# whole sequence, or blocks of a fixed 128 tokens (the second attack's H and D).
CHUNK_SCAN_BY_COLUMN = CHUNK_DEF + """    cols = []
    for j in range(v.shape[-1]):
        S_j = torch.cumsum(k * v[..., j:j + 1], dim=2)                 # (B, H, T, D_k): column j of every state
        cols.append((q * S_j).sum(-1))
    return torch.stack(cols, dim=-1)
"""
CHUNK_SCAN_FIXED_BLOCKS = CHUNK_DEF + """    S, out = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1]), []
    for start in range(0, q.shape[2], 128):                            # 128, whatever chunk_size is
        Qb, Kb, Vb = (x[:, :, start:start + 128] for x in (q, k, v))
        St = S[:, :, None] + torch.cumsum(Kb[..., :, None] * Vb[..., None, :], dim=2)
        out.append(torch.einsum('bhtk,bhtkv->bhtv', Qb, St))
        S = St[:, :, -1]
    return torch.cat(out, dim=2)
"""
CHUNK_VECTORISED_BROADCAST_WRITES = CHUNK_VECTORISED.replace("written = K.transpose(-1, -2) @ V", "written = (K[..., :, None] * V[..., None, :]).sum(3)")
# Issue 40: a state for every token made one chunk at a time (each tensor within the bound, but B x H x T x D_k x D_v
# numbers in all), by a cumulative sum or by a triangular product; each chunk's queries scored against every earlier
# key (the T x T product in pieces); and a float64 result for float32 inputs.
CHUNK_STATES_IN_CHUNKS = CHUNK_DEF + """    S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    out = []
    for start in range(0, q.shape[2], chunk_size):
        Qc, Kc, Vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))
        St = S[:, :, None] + torch.cumsum(Kc[..., :, None] * Vc[..., None, :], dim=2)   # (B, H, C, D_k, D_v)
        out.append(torch.einsum('bhtk,bhtkv->bhtv', Qc, St))
        S = St[:, :, -1]
    return torch.cat(out, dim=2)
"""
CHUNK_STATES_BY_TRIL = CHUNK_DEF + """    B, H, T, D_k = q.shape
    D_v = v.shape[-1]
    S = q.new_zeros(B, H, D_k * D_v)
    out = []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))
        n = Qc.shape[2]
        W = (Kc[..., :, None] * Vc[..., None, :]).flatten(-2)                    # (B, H, C, D_k D_v)
        St = S[:, :, None] + torch.ones(n, n, dtype=q.dtype).tril() @ W          # the state after each token
        out.append((Qc[..., None] * St.unflatten(-1, (D_k, D_v))).sum(-2))
        S = St[:, :, -1]
    return torch.cat(out, dim=2)
"""
CHUNK_SQUARE_IN_PIECES = CHUNK_DEF + """    T = q.shape[2]
    out = []
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        scores = q[:, :, start:end] @ k[:, :, :end].transpose(-1, -2)           # (B, H, C, end): every earlier key
        mask = torch.ones(end - start, end, dtype=torch.bool).tril(start)
        out.append((scores * mask) @ v[:, :, :end])
    return torch.cat(out, dim=2)
"""
CHUNK_SQUARE_IN_PIECES_EINSUM = CHUNK_DEF + """    T = q.shape[2]
    o = torch.empty(q.shape[0], q.shape[1], T, v.shape[-1], dtype=q.dtype)
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        w = torch.einsum('bhid,bhjd->bhij', q[:, :, start:end], k[:, :, :end]).tril(start)
        o[:, :, start:end] = torch.einsum('bhij,bhjv->bhiv', w, v[:, :, :end])
    return o
"""
CHUNK_IN_PIECES = "the T x T product in pieces"
CHUNK_STATES_HINT = "made one chunk at a time"
CHUNK_FLOAT64_OUT = "float32 inputs gave a torch.float64 output"


def l03_chunk(name, *edits, hint=None, source=None, hidden_only=False, slow=False):
    answer = source if source is not None else sol(L03, "chunkwise_form", *edits)
    return Case(L03, "test_chunkwise_form", name, {"chunkwise_form": answer}, hint, hidden_only, slow=slow)


CASES += [
    l03_chunk("solution", slow=True),    # its timed calls take seconds: make test runs it
    l03_chunk("einsum and an explicit mask", source=CHUNK_EINSUM, slow=True),
    l03_chunk("in place into a preallocated output", source=CHUNK_IN_PLACE.format(range="range(0, T, chunk_size)"), slow=True),
    l03_chunk("states first, chunks in reverse", source=CHUNK_STATES_FIRST, slow=True),
    l03_chunk("no Python loop (padded, cumsum of chunk states)", source=CHUNK_VECTORISED, slow=True),
    l03_chunk("broadcast products, no matmul", source=CHUNK_BROADCAST, slow=True),
    l03_chunk("float64 inside", ("B, H, T, D_k = q.shape", "dtype = q.dtype\n    q, k, v = q.double(), k.double(), v.double()\n    B, H, T, D_k = q.shape"),
              ("return torch.cat(out, dim=2)", "return torch.cat(out, dim=2).to(dtype)"), slow=True),
    l03_chunk("tail dropped", (CHUNK_LOOP, "for start in range(0, T - T % chunk_size, chunk_size):"), hint="a chunk boundary is off by one"),
    l03_chunk("range(T // C)", (CHUNK_LOOP, "for start in (i * chunk_size for i in range(T // chunk_size)):"), hint="a chunk boundary is off by one"),
    l03_chunk("slices one short", ("start:start + chunk_size]", "start:start + chunk_size - 1]"), hint="a chunk boundary is off by one"),
    l03_chunk("tail left at zero", source=CHUNK_IN_PLACE.format(range="range(0, T - chunk_size + 1, chunk_size)"), hint="it was never computed"),
    l03_chunk("state written before read", (CHUNK_READ, CHUNK_WRITE + "\n        " + CHUNK_READ), (CHUNK_WRITE + "\n        " + CHUNK_READ + "\n        " + CHUNK_WRITE, CHUNK_WRITE + "\n        " + CHUNK_READ),
              hint="before the chunk's queries read it"),
    l03_chunk("state written first, strict mask", (CHUNK_READ, CHUNK_WRITE + "\n        " + CHUNK_READ), (CHUNK_WRITE + "\n        " + CHUNK_READ + "\n        " + CHUNK_WRITE, CHUNK_WRITE + "\n        " + CHUNK_READ),
              (".tril()", ".tril(-1)"), hint="before the chunk's queries read it"),
    l03_chunk("state written first, no intra term", (CHUNK_READ, "S = S + Kc.transpose(-1, -2) @ Vc\n        out.append(Qc @ S)"), (CHUNK_WRITE, ""), hint="later ones included"),
    l03_chunk("no causal mask", (CHUNK_MASK, "scores = Qc @ Kc.transpose(-1, -2)"), hint="later ones included"),
    l03_chunk("mask drops the diagonal", (".tril()", ".tril(-1)"), hint="leaves out the diagonal"),
    l03_chunk("upper triangle", (".tril()", ".triu()"), hint="keeps the upper triangle"),
    l03_chunk("no inter-chunk term", (CHUNK_READ, "out.append(scores @ Vc)"), hint="the inter-chunk term is missing"),
    l03_chunk("calls the library op", source=CHUNK_DEF + "    return linear_attention(q, k, v, impl='chunk', chunk_size=chunk_size)[0]\n",
              hint=CHUNK_LIBRARY),
    l03_chunk("loop over tokens", source=CHUNK_TOKEN_LOOP, hint="Loop over the T / C chunks only"),
    l03_chunk("float32 state", ("S = q.new_zeros(B, H, D_k, v.shape[-1])", "S = torch.zeros(B, H, D_k, v.shape[-1])"), hint="Create S with the inputs' dtype"),
    l03_chunk("float32 inside", ("B, H, T, D_k = q.shape", "dtype = q.dtype\n    q, k, v = q.float(), k.float(), v.float()\n    B, H, T, D_k = q.shape"),
              ("return torch.cat(out, dim=2)", "return torch.cat(out, dim=2).to(dtype)"), hint="went through float32 somewhere"),
    l03_chunk("renamed", source=CHUNK_DEF.replace("chunkwise_linear_attention", "chunked_linear_attention") + "    return q\n",
              hint="chunkwise_linear_attention is not defined"),
    l03_chunk("raises on a short last chunk", (CHUNK_READ, "out.append(Qc @ S + scores @ Vc[:, :, :chunk_size - 1])"), hint="chunkwise_linear_attention raised"),
    l03_chunk("unforeseen", ("return torch.cat(out, dim=2)", "return 0.5 * torch.cat(out, dim=2)"), hint="differs from the token loop by up to"),
    l03_chunk("whole T x T product, chunk_size ignored", source=CHUNK_WHOLE_SQUARE, hint=CHUNK_BOUND),
    l03_chunk("whole T x T product by einsum with a T x T mask", source=CHUNK_WHOLE_SQUARE_EINSUM, hint=CHUNK_BOUND),
    l03_chunk("chunks, but the T x T scores computed first", ("out = []", "full = q @ k.transpose(-1, -2)              # (B, H, T, T)\n    out = []"),
              (CHUNK_MASK, "scores = full[:, :, start:start + chunk_size, start:start + chunk_size].tril()"), hint=CHUNK_BOUND),
    l03_chunk("chunks, but a T x T mask sliced per chunk", source=CHUNK_FULL_MASK, hint=CHUNK_BOUND),
    # the chunkwise form itself, at a fixed 64 whatever chunk_size is: only the argument's use tells
    l03_chunk("chunks of a fixed 64 tokens, chunk_size never read", (CHUNK_LOOP, "for start in range(0, T, 64):"),
              ("start:start + chunk_size", "start:start + 64"), hint="chunk_size is not used", slow=True),
    l03_chunk("whole T x T product in numpy", source=CHUNK_NUMPY_SQUARE, hint=CHUNK_EXPORT),
    l03_chunk("per-token scan in numpy", source=CHUNK_NUMPY_SCAN, hint=CHUNK_EXPORT),
    # the student's own check names what the watch saw; in grading the source reading fails it (a map over the tokens),
    # and so may its CPU time, which sits near the 8x of the course's form: then the watch's words come first
    replace(l03_chunk("token loop in numpy, run by itertools", source=CHUNK_NUMPY_ACCUMULATE, hint=CHUNK_EXPORT),
            modes=("self",)),
    replace(l03_chunk("token loop in numpy, run by itertools, graded", source=CHUNK_NUMPY_ACCUMULATE,
                      hint=("loops over the tokens one at a time", CHUNK_EXPORT)), modes=("grader",)),
    l03_chunk("token loop with function handling off inside one line", source=CHUNK_ONE_LINE_DISABLED, hint=CHUNK_WATCH),
    l03_chunk("mlexp.ops loaded again under another name", source=CHUNK_OPS_RENAMED, hint=CHUNK_LIBRARY),
    l03_chunk("vmap over batch and heads", source=CHUNK_VMAP, slow=True),
    l03_chunk("prints the state and a tensor inside", (CHUNK_WRITE, CHUNK_WRITE + "\n        print('state of head 0:', S[0, 0], f'{Qc.sum()}')"), slow=True),
    l03_chunk("vectorised, chunk writes from broadcast outer products", source=CHUNK_VECTORISED_BROADCAST_WRITES, hint=CHUNK_PER_TOKEN),
    l03_chunk("broadcast products, all chunks at once", source=CHUNK_BROADCAST_ALL, hint=CHUNK_PER_TOKEN),
    l03_chunk("cumulative sum of per-token states, chunk_size ignored", source=CHUNK_TOKEN_SCAN, hint=CHUNK_PER_TOKEN),
    l03_chunk("per-token scan one column of v at a time, chunk_size ignored", source=CHUNK_SCAN_BY_COLUMN, hint="chunk_size is not used"),
    l03_chunk("per-token scan in blocks of a fixed 128 tokens", source=CHUNK_SCAN_FIXED_BLOCKS, hint="chunk_size is not used"),
    l03_chunk("whole T x T product, torch function handling off", source=CHUNK_DISABLED_SQUARE, hint=CHUNK_WATCH),
    l03_chunk("whole T x T product in a thread pool", source=CHUNK_POOLED_SQUARE, hint=CHUNK_WATCH),
    l03_chunk("the library op on the long sequence only", source=CHUNK_SIZE_SWITCH, hint=CHUNK_EXPORT),
    l03_chunk("the library op when no watch is on", source=CHUNK_WATCH_SWITCH, hint=CHUNK_EXPORT),
    l03_chunk("the library op from a helper with made-up library globals", source=CHUNK_FAKE_LIBRARY, hint=CHUNK_LIBRARY),
    l03_chunk("a token loop in TorchScript", source=CHUNK_TORCHSCRIPT, hint=CHUNK_WATCH),
    l03_chunk("with a progress bar over the chunks", (CHUNK_LOOP, "from tqdm import tqdm\n    for start in tqdm(range(0, T, chunk_size), leave=False):"), slow=True),
    l03_chunk("a state for every token, one chunk at a time (cumsum)", source=CHUNK_STATES_IN_CHUNKS, hint=CHUNK_STATES_HINT, slow=True),
    l03_chunk("a state for every token, one chunk at a time (triangular product)", source=CHUNK_STATES_BY_TRIL, hint=CHUNK_STATES_HINT, slow=True),
    l03_chunk("each chunk's queries against every earlier key", source=CHUNK_SQUARE_IN_PIECES, hint=CHUNK_IN_PIECES, slow=True),
    l03_chunk("each chunk's queries against every earlier key, einsum into o", source=CHUNK_SQUARE_IN_PIECES_EINSUM, hint=CHUNK_IN_PIECES, slow=True),
    l03_chunk("float64 result for float32 inputs", ("B, H, T, D_k = q.shape", "q, k, v = q.double(), k.double(), v.double()\n    B, H, T, D_k = q.shape"),
              hint=CHUNK_FLOAT64_OUT),
    l03_chunk("float64 state, float32 inputs cast up", ("S = q.new_zeros(B, H, D_k, v.shape[-1])", "S = torch.zeros(B, H, D_k, v.shape[-1], dtype=torch.float64)"),
              ("Qc, Kc, Vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))", "Qc, Kc, Vc = (x[:, :, start:start + chunk_size].double() for x in (q, k, v))"),
              hint=CHUNK_FLOAT64_OUT),
    l03_chunk("result cast to the inputs' dtype at the end", ("return torch.cat(out, dim=2)", "return torch.cat(out, dim=2).to(q.dtype)"), slow=True),
]


# Issue 40, item 4: chunkwise gated linear attention (scalar log-decay per head and token). Correct forms: loop
# orders, einsum, segsum (Mamba-2), whole-sequence cumulative sums used only through differences, in place, no
# Python loop at all; wrong ones: each decay left out, doubled or off by one token, exps that overflow or underflow.
GATED_DEF = "def chunkwise_gated_linear_attention(q, k, v, g, chunk_size):\n"
GATED_B = "b = g[:, :, start:start + chunk_size].cumsum(-1)          # (B, H, C): log-decay from the chunk start to i"
GATED_L = 'L = torch.where(causal, b[..., :, None] - b[..., None, :], float("-inf")).exp()   # exp(b_i - b_j), 0 above'
GATED_READ = "out.append((Qc * b[..., None].exp()) @ S + ((Qc @ Kc.transpose(-1, -2)) * L) @ Vc)   # read, then intra"
GATED_WRITE = "S = last[..., None].exp() * S + (Kc * (last - b)[..., None].exp()).transpose(-1, -2) @ Vc   # then write"
GATED_LOOP = "for start in range(0, T, chunk_size):                          # the last chunk may be shorter"
GATED_RETURN = "return torch.cat(out, dim=2)                                   # (B, H, T, D_v)"
GATED_EINSUM = GATED_DEF + """    S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    out = []
    for start in range(0, q.shape[2], chunk_size):
        s = slice(start, start + chunk_size)
        Qc, Kc, Vc, b = q[:, :, s], k[:, :, s], v[:, :, s], torch.cumsum(g[:, :, s], dim=-1)
        n = b.shape[-1]
        diff = b.unsqueeze(-1) - b.unsqueeze(-2)
        L = diff.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf).exp()
        inter = torch.einsum('bhid,bhi,bhdv->bhiv', Qc, b.exp(), S)
        intra = torch.einsum('bhid,bhjd,bhij,bhjv->bhiv', Qc, Kc, L, Vc)
        out.append(inter + intra)
        S = torch.einsum('bh,bhdv->bhdv', b[..., -1].exp(), S) + torch.einsum('bhjd,bhj,bhjv->bhdv', Kc, (b[..., -1:] - b).exp(), Vc)
    return torch.cat(out, dim=2)
"""
GATED_SEGSUM = GATED_DEF + """    def segsum(x):
        '''Mamba-2's segsum: out[..., i, j] = x[..., j+1] + ... + x[..., i] for j <= i, -inf above (sums, no differences).'''
        n = x.shape[-1]
        x = x[..., None].expand(*x.shape, n)                                  # x[..., i, j] = x_i
        x = x.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(-1), 0)
        x = torch.cumsum(x, dim=-2)
        return x.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf)

    B, H, T, D_k = q.shape
    S, out = q.new_zeros(B, H, D_k, v.shape[-1]), []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc, gc = (x[:, :, start:start + chunk_size] for x in (q, k, v, g))
        seg = segsum(gc)                                                      # (B, H, C, C)
        b = seg[..., :, 0] + gc[..., :1]                                       # g_0 + ... + g_i
        to_end = seg[..., -1, :]                                              # g_{j+1} + ... + g_last
        out.append((Qc * b.exp()[..., None]) @ S + ((Qc @ Kc.transpose(-1, -2)) * seg.exp()) @ Vc)
        S = b[..., -1:, None].exp() * S + (Kc * to_end.exp()[..., None]).transpose(-1, -2) @ Vc
    return torch.cat(out, dim=2)
"""
# Mamba-2's ssd_minimal_discrete (Dao and Gu 2024, listing 1): no Python loop, the chunk states passed by a segsum
# over the chunks (an N x N matrix of chunk decays, N = T / C).
GATED_SSD_MINIMAL = GATED_DEF + """    def segsum(x):
        n = x.shape[-1]
        x = x[..., None].expand(*x.shape, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(-1), 0)
        return torch.cumsum(x, dim=-2).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf)

    B, H, T, D_k = q.shape
    C = chunk_size
    N = -(-T // C)
    pad = N * C - T
    Q, K, V = (F.pad(x, (0, 0, 0, pad)).reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    A = F.pad(g, (0, pad)).reshape(B, H, N, C)                      # padded tokens: no decay, no write
    A_cum = torch.cumsum(A, dim=-1)
    Y_diag = torch.einsum('bhcid,bhcjd,bhcij,bhcjv->bhciv', Q, K, segsum(A).exp(), V)
    states = torch.einsum('bhcjd,bhcj,bhcjv->bhcdv', K, (A_cum[..., -1:] - A_cum).exp(), V)
    states = torch.cat([torch.zeros_like(states[:, :, :1]), states], dim=2)
    chunk_decay = segsum(F.pad(A_cum[..., -1], (1, 0))).exp()       # (B, H, N + 1, N + 1)
    states = torch.einsum('bhzc,bhcdv->bhzdv', chunk_decay, states)[:, :, :-1]
    Y_off = torch.einsum('bhcid,bhcdv,bhci->bhciv', Q, states, A_cum.exp())
    return (Y_diag + Y_off).reshape(B, H, N * C, -1)[:, :, :T]
"""
GATED_WHOLE_CUMSUM_DIFFS = GATED_DEF + """    G = g.cumsum(-1)                                                   # (B, H, T): through token t
    G0 = F.pad(G, (1, 0))                                             # through token t - 1
    B, H, T, D_k = q.shape
    S, out = q.new_zeros(B, H, D_k, v.shape[-1]), []
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        Qc, Kc, Vc, Gc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], G[:, :, start:end]
        causal = torch.ones(end - start, end - start, dtype=torch.bool).tril()
        L = torch.where(causal, Gc[..., :, None] - Gc[..., None, :], -torch.inf).exp()   # differences only
        into = (Gc - G0[:, :, start:start + 1]).exp()                  # from the chunk's start to i
        to_end = (Gc[..., -1:] - Gc).exp()                             # from j to the chunk's end
        out.append((Qc * into[..., None]) @ S + ((Qc @ Kc.mT) * L) @ Vc)
        S = (G[:, :, end - 1] - G0[:, :, start]).exp()[..., None, None] * S + (Kc * to_end[..., None]).mT @ Vc
    return torch.cat(out, dim=2)
"""
GATED_IN_PLACE = GATED_DEF + """    B, H, T, D_k = q.shape
    o = v.new_zeros(B, H, T, v.shape[-1])
    S = q.new_zeros(B, H, D_k, v.shape[-1])
    for start in {range}:
        end = min(start + chunk_size, T)
        Qc, Kc, Vc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        b = g[:, :, start:end].clone()
        b.cumsum_(-1)
        diff = b[..., :, None] - b[..., None, :]
        diff.masked_fill_(torch.ones_like(diff, dtype=torch.bool).triu(1), float('-inf'))
        o[:, :, start:end] = (Qc * b.exp().unsqueeze(-1)) @ S
        o[:, :, start:end] += ((Qc @ Kc.transpose(-1, -2)) * diff.exp_()) @ Vc
        S.mul_(b[..., -1, None, None].exp())
        S += (Kc * (b[..., -1:] - b).exp().unsqueeze(-1)).transpose(-1, -2) @ Vc
    return o
"""
GATED_STATES_FIRST = GATED_DEF + """    T = q.shape[2]
    starts = list(range(0, T, chunk_size))
    states = [q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])]
    for start in starts[:-1]:                       # first pass: the state entering each chunk
        s = slice(start, start + chunk_size)
        b = g[:, :, s].cumsum(-1)
        states.append(b[..., -1, None, None].exp() * states[-1] + (k[:, :, s] * (b[..., -1:] - b).exp()[..., None]).mT @ v[:, :, s])
    out = [None] * len(starts)
    for i in reversed(range(len(starts))):          # second pass, last chunk first
        s = slice(starts[i], starts[i] + chunk_size)
        Qc, Kc, Vc, b = q[:, :, s], k[:, :, s], v[:, :, s], g[:, :, s].cumsum(-1)
        n = b.shape[-1]
        L = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), b[..., :, None] - b[..., None, :], -torch.inf).exp()
        out[i] = (Qc * b.exp()[..., None]) @ states[i] + ((Qc @ Kc.mT) * L) @ Vc
    return torch.cat(out, dim=2)
"""
GATED_BROADCAST = GATED_DEF + """    B, H, T, D_k = q.shape
    S, out = q.new_zeros(B, H, D_k, v.shape[-1]), []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc, gc = (x[:, :, start:start + chunk_size] for x in (q, k, v, g))
        b = gc.cumsum(-1)
        n = Qc.shape[2]
        scores = (Qc[:, :, :, None, :] * Kc[:, :, None, :, :]).sum(-1)           # (B, H, C, C)
        L = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), b[..., :, None] - b[..., None, :], -torch.inf).exp()
        intra = ((scores * L)[..., None] * Vc[:, :, None, :, :]).sum(-2)
        inter = ((Qc * b.exp()[..., None])[..., :, None] * S[:, :, None, :, :]).sum(-2)
        out.append(inter + intra)
        Kd = Kc * (b[..., -1:] - b).exp()[..., None]
        S = b[..., -1, None, None].exp() * S + (Kd[..., :, None] * Vc[..., None, :]).sum(2)
    return torch.cat(out, dim=2)
"""
GATED_CLAMPED = GATED_DEF + """    B, H, T, D_k = q.shape
    S, out = q.new_zeros(B, H, D_k, v.shape[-1]), []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc, gc = (x[:, :, start:start + chunk_size] for x in (q, k, v, g))
        b = gc.cumsum(-1)
        n = b.shape[-1]
        # exp of min(b_i - b_j, 0): never above 1, so masking after exp multiplies finite numbers by 0
        L = (b[..., :, None] - b[..., None, :]).clamp(max=0).exp() * torch.ones(n, n, dtype=q.dtype).tril()
        out.append((Qc * b.exp()[..., None]) @ S + ((Qc @ Kc.mT) * L) @ Vc)
        S = b[..., -1, None, None].exp() * S + (Kc * (b[..., -1:] - b).exp()[..., None]).mT @ Vc
    return torch.cat(out, dim=2)
"""
GATED_MATMUL_CUMSUM = (GATED_B, "b = g[:, :, start:start + chunk_size] @ torch.ones(Qc.shape[2], Qc.shape[2], dtype=g.dtype).triu()   # cumsum as a product")
GATED_VMAP = """def one_head(q, k, v, g, chunk_size):
    S, out = q.new_zeros(q.shape[-1], v.shape[-1]), []
    for start in range(0, q.shape[0], chunk_size):
        Qc, Kc, Vc, b = q[start:start + chunk_size], k[start:start + chunk_size], v[start:start + chunk_size], g[start:start + chunk_size].cumsum(0)
        causal = torch.ones(b.shape[0], b.shape[0], dtype=torch.bool).tril()
        L = torch.where(causal, b[:, None] - b[None, :], -torch.inf).exp()
        out.append((Qc * b.exp()[:, None]) @ S + ((Qc @ Kc.T) * L) @ Vc)
        S = b[-1].exp() * S + (Kc * (b[-1] - b).exp()[:, None]).T @ Vc
    return torch.cat(out, 0)


""" + GATED_DEF + """    return torch.vmap(torch.vmap(lambda a, b, c, d: one_head(a, b, c, d, chunk_size)))(q, k, v, g)
"""
GATED_ITERATE_CHUNKS = GATED_DEF + """    import math
    B, H, T, D_k = q.shape
    S, out = q.new_zeros(B, H, D_k, v.shape[-1]), []
    for Qc, Kc, Vc, gc in zip(*(x.split(chunk_size, dim=2) for x in (q, k, v, g))):
        b = gc.cumsum(-1)
        n = b.shape[-1]
        L = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), b[..., :, None] - b[..., None, :], -math.inf).exp()
        out.append(torch.baddbmm(((Qc @ Kc.mT) * L).flatten(0, 1) @ Vc.flatten(0, 1), (Qc * b.exp()[..., None]).flatten(0, 1), S.flatten(0, 1)).unflatten(0, (B, H)))
        S = torch.exp(b[..., -1])[..., None, None] * S + torch.exp(b[..., -1:] - b)[..., None].mul(Kc).mT @ Vc
    return torch.cat(out, dim=2)
"""
# The mistakes, written as a student would.
GATED_EXP_WHOLE = GATED_DEF + """    B, H, T, D_k = q.shape
    alpha = g.cumsum(-1).exp()                                         # prod of the gates through token t
    S, out = q.new_zeros(B, H, D_k, v.shape[-1]), []
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        Qc, Kc, Vc, A = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], alpha[:, :, start:end]
        A0 = alpha[:, :, start - 1:start] if start else torch.ones_like(A[..., :1])
        L = (A[..., :, None] / A[..., None, :]).tril()
        out.append((Qc * (A / A0)[..., None]) @ S + ((Qc @ Kc.mT) * L) @ Vc)
        S = (A[..., -1:] / A0)[..., None] * S + (Kc * (A[..., -1:] / A)[..., None]).mT @ Vc
    return torch.cat(out, dim=2)
"""
GATED_EXP_RATIO = (GATED_L, "L = (b.exp()[..., :, None] * (-b).exp()[..., None, :]).tril()             # exp(b_i) exp(-b_j)")
GATED_CUMPROD = (GATED_L, "a = g[:, :, start:start + chunk_size].exp().cumprod(-1)\n        L = (a[..., :, None] / a[..., None, :]).tril()   # alpha_{j+1} ... alpha_i")
GATED_EXP_THEN_MASK = (GATED_L, "L = (b[..., :, None] - b[..., None, :]).exp().tril()          # exp, then the mask")
GATED_EXP_THEN_MASK_MUL = (GATED_L, "L = (b[..., :, None] - b[..., None, :]).exp() * causal       # exp, then the mask")
GATED_TOKEN_LOOP = GATED_DEF + """    S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[2]):
        S = g[:, :, t, None, None].exp() * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append((q[:, :, t, None, :] @ S)[:, :, 0])
    return torch.stack(out, dim=2)
"""
GATED_WHOLE_MASK = GATED_DEF + """    G = g.cumsum(-1)
    T = q.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    L = torch.where(causal, G[..., :, None] - G[..., None, :], -torch.inf).exp()      # (B, H, T, T)
    return ((q @ k.mT) * L) @ v
"""
GATED_WHOLE_MASK_SLICED = GATED_DEF + """    B, H, T, D_k = q.shape
    G = g.cumsum(-1)
    L_all = torch.where(torch.ones(T, T, dtype=torch.bool).tril(), G[..., :, None] - G[..., None, :], -torch.inf).exp()
    S, out = q.new_zeros(B, H, D_k, v.shape[-1]), []
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        Qc, Kc, Vc, b = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], g[:, :, start:end].cumsum(-1)
        out.append((Qc * b.exp()[..., None]) @ S + ((Qc @ Kc.mT) * L_all[..., start:end, start:end]) @ Vc)
        S = b[..., -1, None, None].exp() * S + (Kc * (b[..., -1:] - b).exp()[..., None]).mT @ Vc
    return torch.cat(out, dim=2)
"""
GATED_STATES_IN_CHUNKS = GATED_DEF + """    S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    out = []
    for start in range(0, q.shape[2], chunk_size):
        Qc, Kc, Vc, gc = (x[:, :, start:start + chunk_size] for x in (q, k, v, g))
        states = []
        for i in range(Qc.shape[2]):                                  # hmm: a loop over the chunk's tokens
            S = gc[:, :, i, None, None].exp() * S + Kc[:, :, i, :, None] * Vc[:, :, i, None, :]
            states.append(S)
        out.append(torch.einsum('bhtk,bhtkv->bhtv', Qc, torch.stack(states, 2)))
    return torch.cat(out, dim=2)
"""
GATED_STATES_BY_TRIL = GATED_DEF + """    B, H, T, D_k = q.shape
    S, out = q.new_zeros(B, H, D_k, v.shape[-1]), []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc, gc = (x[:, :, start:start + chunk_size] for x in (q, k, v, g))
        b = gc.cumsum(-1)
        n = b.shape[-1]
        L = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), b[..., :, None] - b[..., None, :], -torch.inf).exp()
        W = (Kc[..., :, None] * Vc[..., None, :]).flatten(-2)                   # (B, H, C, D_k D_v)
        St = b.exp()[..., None] * S.flatten(-2)[:, :, None] + L @ W            # the state after each token
        out.append((Qc[..., None] * St.unflatten(-1, (D_k, v.shape[-1]))).sum(-2))
        S = St[:, :, -1].unflatten(-1, (D_k, v.shape[-1]))
    return torch.cat(out, dim=2)
"""
GATED_SQUARE_IN_PIECES = GATED_DEF + """    T = q.shape[2]
    G = g.cumsum(-1)
    out = []
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        diff = G[..., start:end, None] - G[..., None, :end]                   # (B, H, C, end): every earlier key
        L = torch.where(torch.ones(end - start, end, dtype=torch.bool).tril(start), diff, -torch.inf).exp()
        out.append(((q[:, :, start:end] @ k[:, :, :end].mT) * L) @ v[:, :, :end])
    return torch.cat(out, dim=2)
"""
GATED_PER_TOKEN = "made one chunk at a time"
GATED_BOUND = "a T x T decay mask"
GATED_LIBRARY = "Write the loop over chunks with tensor operations (@, cumsum"


def l03_gated(name, *edits, hint=None, source=None, hidden_only=False, slow=False):
    answer = source if source is not None else sol(L03, "chunkwise_gated_form", *edits)
    return Case(L03, "test_chunkwise_gated_form", name, {"chunkwise_gated_form": answer}, hint, hidden_only, slow=slow)


CASES += [
    # right: at least 20 forms
    l03_gated("solution", slow=True),
    l03_gated("einsum throughout, masked_fill before exp", source=GATED_EINSUM, slow=True),
    l03_gated("Mamba-2's segsum inside each chunk", source=GATED_SEGSUM, slow=True),
    l03_gated("Mamba-2's ssd_minimal: no Python loop, chunk states by a segsum over chunks", source=GATED_SSD_MINIMAL, slow=True),
    l03_gated("whole-sequence cumulative sum, used only through differences", source=GATED_WHOLE_CUMSUM_DIFFS, slow=True),
    l03_gated("in place into a preallocated output", source=GATED_IN_PLACE.format(range="range(0, T, chunk_size)"), slow=True),
    l03_gated("states first, chunks in reverse", source=GATED_STATES_FIRST, slow=True),
    l03_gated("broadcast products, no matmul", source=GATED_BROADCAST, slow=True),
    l03_gated("exp of min(b_i - b_j, 0), masked after exp", source=GATED_CLAMPED, slow=True),
    l03_gated("cumulative sum as a product with a triangle of ones", GATED_MATMUL_CUMSUM, slow=True),
    l03_gated("vmap over batch and heads", source=GATED_VMAP, slow=True),
    l03_gated("chunks by split, baddbmm for the read", source=GATED_ITERATE_CHUNKS, slow=True),
    l03_gated("float64 inside, cast back", ("B, H, T, D_k = q.shape", "dtype = q.dtype\n    q, k, v, g = q.double(), k.double(), v.double(), g.double()\n    B, H, T, D_k = q.shape"),
              (GATED_RETURN, "return torch.cat(out, dim=2).to(dtype)"), slow=True),
    l03_gated("result cast to the inputs' dtype at the end", (GATED_RETURN, "return torch.cat(out, dim=2).to(q.dtype)"), slow=True),
    l03_gated("the state decayed, then added to, in two statements", (GATED_WRITE, "S = S * last[..., None].exp()\n        S = S + (Kc * (last - b)[..., None].exp()).mT @ Vc"), slow=True),
    l03_gated("gates floored at -1e4 (exp of it is 0 in any dtype)", (GATED_B, "b = g[:, :, start:start + chunk_size].clamp(min=-1e4).cumsum(-1)   # a documented floor: exp(-1e4) == 0"), slow=True),
    l03_gated("causal mask by comparing positions", ("causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()", "idx = torch.arange(n)\n        causal = idx[:, None] >= idx[None, :]"), slow=True),
    l03_gated("prints the state and a tensor inside", (GATED_WRITE, GATED_WRITE + "\n        print('state of head 0:', S[0, 0], f'{Qc.sum()}')"), slow=True),
    l03_gated("with a progress bar over the chunks", (GATED_LOOP, "from tqdm import tqdm\n    for start in tqdm(range(0, T, chunk_size), leave=False):"), slow=True),
    l03_gated("chunk count by math.ceil", (GATED_LOOP, "import math\n    for start in (i * chunk_size for i in range(math.ceil(T / chunk_size))):"), slow=True),
    l03_gated("decay mask by masked_fill of -inf", (GATED_L, "L = (b[..., :, None] - b[..., None, :]).masked_fill(~causal, float('-inf')).exp()"), slow=True),
    l03_gated("exp, then tril (the entries that overflow are dropped, never multiplied by 0)", GATED_EXP_THEN_MASK, slow=True),
    # wrong: the catalogue, each with the hint that names it
    l03_gated("renamed", source=GATED_DEF.replace("chunkwise_gated_linear_attention", "chunked_gated_attention") + "    return q\n",
              hint="chunkwise_gated_linear_attention is not defined"),
    l03_gated("raises on a short last chunk", (GATED_READ, "out.append((Qc * b[..., None].exp()) @ S + ((Qc @ Kc.mT) * L) @ Vc[:, :, :chunk_size - 1])"),
              hint="chunkwise_gated_linear_attention raised"),
    l03_gated("carried state not decayed", (GATED_WRITE, "S = S + (Kc * (last - b)[..., None].exp()).transpose(-1, -2) @ Vc"),
              hint="the carried state is not decayed by the chunk's total decay"),
    l03_gated("keys not decayed to the chunk's end", (GATED_WRITE, "S = last[..., None].exp() * S + Kc.transpose(-1, -2) @ Vc"),
              hint="the keys are not decayed to the chunk's end"),
    l03_gated("queries not decayed for the inter-chunk read", (GATED_READ, "out.append(Qc @ S + ((Qc @ Kc.transpose(-1, -2)) * L) @ Vc)"),
              hint="the queries that read the carried state are not decayed"),
    l03_gated("no inter-chunk term", (GATED_READ, "out.append(((Qc @ Kc.transpose(-1, -2)) * L) @ Vc)"), hint="the inter-chunk term is missing"),
    l03_gated("decay applied twice inside a chunk", (GATED_READ, "Qd, Kd = Qc * b[..., None].exp(), Kc * (-b)[..., None].exp()\n        out.append(Qd @ S + ((Qd @ Kd.transpose(-1, -2)) * L) @ Vc)"),
              hint="the decay is applied twice inside a chunk"),
    l03_gated("carried state decayed twice", (GATED_READ, "S = b[..., -1:, None].exp() * S                 # the chunk's decay on the carried state\n        " + GATED_READ),
              hint="the carried state is decayed twice"),
    l03_gated("state written before the chunk's queries read it", (GATED_READ, ""), (GATED_WRITE, GATED_WRITE + "\n        " + GATED_READ),
              hint="before the chunk's queries read it"),
    l03_gated("mask drops the diagonal (strict)", (".tril()", ".tril(-1)"), hint="leaves out the diagonal"),
    l03_gated("key's own gate counted (exclusive and inclusive sums mixed)",
              (GATED_L, 'L = torch.where(causal, b[..., :, None] - (b - g[:, :, start:start + chunk_size])[..., None, :], float("-inf")).exp()'),
              (GATED_WRITE, "S = last[..., None].exp() * S + (Kc * (last - b + g[:, :, start:start + chunk_size])[..., None].exp()).transpose(-1, -2) @ Vc"),
              hint="includes its own gate"),
    l03_gated("decay mask not causal", (GATED_L, "L = (b[..., :, None] - b[..., None, :]).exp()"), hint="the decay mask L was not made causal"),
    l03_gated("wrong sign", (GATED_B, "b = -g[:, :, start:start + chunk_size].cumsum(-1)"), hint="the decay has the wrong sign"),
    l03_gated("gates used as the decay factors (gamma, not log-decay)", (GATED_L, "L = (g[:, :, start:start + chunk_size].cumprod(-1)[..., :, None] / g[:, :, start:start + chunk_size].cumprod(-1)[..., None, :]).tril()"),
              (GATED_READ, "gp = g[:, :, start:start + chunk_size].cumprod(-1)\n        out.append((Qc * gp[..., None]) @ S + ((Qc @ Kc.transpose(-1, -2)) * L) @ Vc)"),
              (GATED_WRITE, "S = gp[..., -1:, None] * S + (Kc * (gp[..., -1:] / gp)[..., None]).transpose(-1, -2) @ Vc"),
              hint="were used as decay factors"),
    l03_gated("exp of the cumulative sum over the whole sequence", source=GATED_EXP_WHOLE, hint="exp of the cumulative sum over the whole sequence underflows"),
    l03_gated("exp(b_i) times exp(-b_j) inside a chunk", GATED_EXP_RATIO, hint="exp(-b_j) overflows to inf"),
    l03_gated("a cumulative product of exp(g)", GATED_CUMPROD, hint="exp(-b_j) overflows to inf"),
    l03_gated("exp before the mask (times a 0/1 mask)", GATED_EXP_THEN_MASK_MUL, hint="was taken before the causal mask"),
    l03_gated("tail dropped", (GATED_LOOP, "for start in range(0, T - T % chunk_size, chunk_size):"), hint="a chunk boundary is off by one"),
    l03_gated("tail left at zero", source=GATED_IN_PLACE.format(range="range(0, T - chunk_size + 1, chunk_size)"), hint="it was never computed"),
    l03_gated("calls the library op", source=GATED_DEF + "    return gated_linear_attention(q, k, v, g, impl='chunk', chunk_size=chunk_size)[0]\n",
              hint=GATED_LIBRARY),
    l03_gated("loop over tokens", source=GATED_TOKEN_LOOP, hint="Loop over the T / C chunks only"),
    l03_gated("float64 result for float32 inputs", ("B, H, T, D_k = q.shape", "q, k, v, g = q.double(), k.double(), v.double(), g.double()\n    B, H, T, D_k = q.shape"),
              hint="float32 inputs gave a torch.float64 output"),
    l03_gated("float32 inside", ("B, H, T, D_k = q.shape", "dtype = q.dtype\n    q, k, v, g = q.float(), k.float(), v.float(), g.float()\n    B, H, T, D_k = q.shape"),
              (GATED_RETURN, "return torch.cat(out, dim=2).to(dtype)"), hint="went through float32 somewhere"),
    l03_gated("whole T x T decay mask, chunk_size ignored", source=GATED_WHOLE_MASK, hint=GATED_BOUND),
    l03_gated("chunks, but a T x T decay mask sliced per chunk", source=GATED_WHOLE_MASK_SLICED, hint=GATED_BOUND, slow=True),
    l03_gated("a state for every token of each chunk (a token loop inside)", source=GATED_STATES_IN_CHUNKS, hint="Loop over the T / C chunks only"),
    l03_gated("a state for every token, one chunk at a time (triangular product)", source=GATED_STATES_BY_TRIL, hint=GATED_PER_TOKEN, slow=True),
    l03_gated("each chunk's queries against every earlier key", source=GATED_SQUARE_IN_PIECES, hint="the T x T product in pieces", slow=True),
    l03_gated("chunks of a fixed 128 tokens, chunk_size ignored", ("start + chunk_size", "start + 128"), (GATED_LOOP, "for start in range(0, T, 128):"),
              hint="chunk_size is not used", slow=True),
    l03_gated("unforeseen", (GATED_RETURN, "return 0.5 * torch.cat(out, dim=2)"), hint="differs from the token loop by up to"),
]


# Issue 51: work for every pair of tokens, whatever spells it, fails by the CPU time it takes (mlexp.rules.work_grows,
# read by the grader from the operating system): the state rebuilt from every earlier token at each chunk, and the
# T x T product in pieces through F.linear (no product the size and sum counts see).
PAIR_WORK = "work for every pair of tokens"
CHUNK_REBUILT_EACH_CHUNK = CHUNK_DEF + """    B, H, T, D_k = q.shape
    out = []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))
        S = torch.einsum("bhtk,bhtv->bhkv", k[:, :, :start], v[:, :, :start])   # every earlier token, again
        out.append(Qc @ S + (Qc @ Kc.transpose(-1, -2)).tril() @ Vc)
    return torch.cat(out, dim=2)
"""
CHUNK_PIECES_BY_LINEAR = CHUNK_DEF + """    import torch.nn.functional as F
    B, H, T, D_k = q.shape
    out = []
    for start in range(0, T, chunk_size):
        Qc = q[:, :, start:start + chunk_size]
        end = start + Qc.shape[2]
        mask = torch.ones(Qc.shape[2], end, dtype=torch.bool).tril(start)
        rows = [[F.linear(F.linear(Qc[b, h], k[b, h, :end]) * mask, v[b, h, :end].T) for h in range(H)] for b in range(B)]
        out.append(torch.stack([torch.stack(r) for r in rows]))
    return torch.cat(out, dim=2)
"""
GATED_REBUILT_EACH_CHUNK = GATED_DEF + """    B, H, T, D_k = q.shape
    G = g.cumsum(-1)
    out = []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))
        b = g[:, :, start:start + chunk_size].cumsum(-1)
        n = b.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        L = torch.where(causal, b[..., :, None] - b[..., None, :], float("-inf")).exp()
        if start:
            w = (G[..., start - 1:start] - G[..., :start]).exp()             # decay from each earlier token to the chunk start
            S = torch.einsum("bhtk,bhtv->bhkv", k[:, :, :start] * w[..., None], v[:, :, :start])
        else:
            S = q.new_zeros(B, H, D_k, v.shape[-1])
        out.append((Qc * b[..., None].exp()) @ S + ((Qc @ Kc.transpose(-1, -2)) * L) @ Vc)
    return torch.cat(out, dim=2)
"""
GATED_PIECES_BY_LINEAR = GATED_DEF + """    import torch.nn.functional as F
    B, H, T, D_k = q.shape
    G = g.cumsum(-1)
    out = []
    for start in range(0, T, chunk_size):
        Qc = q[:, :, start:start + chunk_size]
        end = start + Qc.shape[2]
        rows = []
        for b in range(B):
            row = []
            for h in range(H):
                d = G[b, h, start:end, None] - G[b, h, None, :end]
                d = torch.where(torch.ones_like(d, dtype=torch.bool).tril(start), d, float("-inf")).exp()
                row.append(F.linear(F.linear(Qc[b, h], k[b, h, :end]) * d, v[b, h, :end].T))
            rows.append(torch.stack(row))
        out.append(torch.stack(rows))
    return torch.cat(out, dim=2)
"""

CASES += [
    l03_chunk("the state rebuilt from every earlier token at each chunk", source=CHUNK_REBUILT_EACH_CHUNK, hint=PAIR_WORK, slow=True),
    l03_chunk("each chunk against every earlier key, in pieces through F.linear", source=CHUNK_PIECES_BY_LINEAR, hint=PAIR_WORK, slow=True),
    l03_gated("the decayed state rebuilt from every earlier token at each chunk", source=GATED_REBUILT_EACH_CHUNK, hint=PAIR_WORK, slow=True),
    l03_gated("each chunk against every earlier key, in pieces through F.linear", source=GATED_PIECES_BY_LINEAR, hint=PAIR_WORK, slow=True),
]

# ------------------------------------------------------------------------------ lessons 04 and 05
L04, L05 = "04_hybrid_kv_cache", "05_inattention"
JAMBA = "jamba_256k_gib = kv_cache_gib(n_attn_layers=4, n_kv_heads=8, head_dim=128, context=256 * 1024)"
CROSS = "return -(-state // cache_per_token)                    # integer ceiling of state / cache_per_token"
KEPT = "return dim      # one initial state y per token; every layer reads the same Y"


HAND_LN = ("mu = y.mean(-1, keepdim=True)\n"
           "    y_norm = (y - mu) / torch.sqrt(y.var(-1, unbiased={unbiased}, keepdim=True) + norm.eps) * norm.weight + norm.bias")


def l05_kv(name, edit, hint=None):
    return Case(L05, "test_inattention_kv", name, {"inattention_kv": sol(L05, "inattention_kv", edit)}, hint)


def l04_pure(name, edit, hint=None):
    return Case(L04, "test_pure_attention", name, {"pure_attention": sol(L04, "pure_attention", edit)}, hint)


def l04_layers(name, body, hint=None):
    return Case(L04, "test_attention_layers", name, {"attention_layers": sol(
        L04, "attention_layers", ("return [i for i in range(n_layers) if i % period == offset]", body))}, hint)
CASES += [
    # Jamba at 256K: the query-head slip and "all layers, no factor 2" give the same number; the hint says both (item 6).
    Case(L04, "test_jamba_cache", "query heads", {"jamba_cache": sol(L04, "jamba_cache", (JAMBA, JAMBA.replace("n_kv_heads=8", "n_kv_heads=32")))}, "4x too large"),
    Case(L04, "test_jamba_cache", "all layers, no factor 2", {"jamba_cache": sol(L04, "jamba_cache", (JAMBA, JAMBA.replace("n_attn_layers=4", "n_attn_layers=16")))}, "4x too large"),
    Case(L04, "test_jamba_cache", "all layers", {"jamba_cache": sol(L04, "jamba_cache", (JAMBA, JAMBA.replace("n_attn_layers=4", "n_attn_layers=32")))}, "counts all 32 layers"),
    Case(L04, "test_jamba_cache", "typed", {"jamba_cache": sol(L04, "jamba_cache", (JAMBA, "jamba_256k_gib = 4.0"))}),
    # The crossover, with lesson 02's definition (item 8); hints without the code (item 7).
    Case(L04, "test_crossover", "math.ceil", {"crossover": sol(L04, "crossover", (CROSS, "return math.ceil(state / cache_per_token)"))}),
    Case(L04, "test_crossover", "strictly more", {"crossover": sol(L04, "crossover", (CROSS, "return state // cache_per_token + 1"))}, "off by one"),
    Case(L04, "test_crossover", "floor", {"crossover": sol(L04, "crossover", (CROSS, "return state // cache_per_token"))}, "rounds down"),
    Case(L04, "test_crossover", "fraction", {"crossover": sol(L04, "crossover", (CROSS, "return state / cache_per_token"))}, "a fraction of a token"),
    Case(L04, "test_crossover", "text", {"crossover": sol(L04, "crossover", (CROSS, "return str(-(-state // cache_per_token))"))}, "should return a number of tokens"),
    # Plain Python, not mlexp.kvcache: watched where the function runs (issue 26, item 1); and correct variants.
    l04_layers("list comprehension", "return [i for i in range(n_layers) if i % period == offset]"),
    l04_layers("range with a step", "return list(range(offset, n_layers, period))"),
    l04_layers("loop and append", "out = []\n    for i in range(n_layers):\n        if i % period == offset:\n            out.append(i)\n    return out"),
    l04_layers("tuple of numpy ints", "import numpy as np\n    return tuple(np.arange(n_layers)[np.arange(n_layers) % period == offset])"),
    l04_layers("mlexp.kvcache helper", "return kc.attention_layer_indices(n_layers, period, offset)", "Use plain Python, not mlexp.kvcache"),
    l04_layers("mlexp.kvcache layer kinds", "return [i for i, t in enumerate(kc.layer_types(n_layers, period, offset)) if t == 'attention']",
               "this exercise asks you to write it yourself"),
    Case(L04, "test_jamba_cache", "mlexp.kvcache bytes", {"jamba_cache": sol(L04, "jamba_cache", (
        "n_bytes = 2 * n_attn_layers * n_kv_heads * head_dim * bytes_per_number * context",
        "n_bytes = kc.kv_cache_bytes(n_attn_layers, n_kv_heads, head_dim, context, dtype={1: 'int8', 2: 'bf16', 4: 'fp32'}[bytes_per_number])"))},
        "Use plain Python arithmetic, not mlexp.kvcache"),
    Case(L04, "test_jamba_cache", "bytes per token first", {"jamba_cache": sol(L04, "jamba_cache", (
        "n_bytes = 2 * n_attn_layers * n_kv_heads * head_dim * bytes_per_number * context",
        "per_token = 2 * n_attn_layers * n_kv_heads * head_dim * bytes_per_number\n    n_bytes = per_token * context"))}),
    Case(L04, "test_jamba_cache", "GiB as 1024 cubed", {"jamba_cache": sol(L04, "jamba_cache", ("return n_bytes / 2**30", "return n_bytes / 1024 / 1024 / 1024"))}),
    Case(L04, "test_crossover", "mlexp.kvcache crossover", {"crossover": sol(L04, "crossover", (CROSS, "return kc.crossover_context(cache_per_token, state)"))},
         "Use plain Python, not mlexp.kvcache"),
    # Two slips give a crossover 2x too large; the hint names both (issue 26, item 3).
    Case(L04, "test_crossover", "no factor 2 for K and V", {"crossover": sol(L04, "crossover", (
        "cache_per_token = 2 * n_attn * n_kv_heads * head_dim * bytes_per_number", "cache_per_token = n_attn * n_kv_heads * head_dim * bytes_per_number"))},
        "Two slips give exactly this number"),
    Case(L04, "test_crossover", "cache in numbers, not bytes", {"crossover": sol(L04, "crossover", (
        "cache_per_token = 2 * n_attn * n_kv_heads * head_dim * bytes_per_number", "cache_per_token = 2 * n_attn * n_kv_heads * head_dim"))},
        "bytes_per_number left out of it"),
    Case(L04, "test_crossover", "cache in all layers", {"crossover": sol(L04, "crossover", (
        "cache_per_token = 2 * n_attn *", "cache_per_token = 2 * n_layers *"))}, "Only the attention layers"),
    Case(L04, "test_crossover", "state in all layers", {"crossover": sol(L04, "crossover", (
        "state = n_recurrent * state_bytes_per_layer", "state = n_layers * state_bytes_per_layer"))}, "counts a state in all"),
    Case(L04, "test_crossover", "unforeseen", {"crossover": sol(L04, "crossover", (CROSS, "return 3 * (-(-state // cache_per_token))"))},
         "not the context at which Qwen3-Next's cache"),
    Case(L04, "test_crossover", "lookup table of the visible cases", {"crossover": sol(L04, "crossover", (
        CROSS, "return {(48, 4): 1536, (12, 3): 53}.get((n_layers, attn_period), 1)"))}, "hybrid_crossover", hidden_only=True),
    l04_layers("counted from 1", "return [i + 1 for i in range(n_layers) if i % period == offset]", "counted from 1"),
    l04_layers("offset ignored", "return [i for i in range(n_layers) if i % period == 0]", "ignores the offset"),
    l04_layers("count", "return len(range(offset, n_layers, period))", "not how many there are"),
    Case(L04, "test_pure_attention", "solution", {}),
    l04_pure("ratio of layer counts", ("hybrid_saving = pure_attention_256k_gib / jamba_gib", "hybrid_saving = 32 / 4")),
    l04_pure("upside down", ("hybrid_saving = pure_attention_256k_gib / jamba_gib", "hybrid_saving = jamba_gib / pure_attention_256k_gib"), "upside down"),
    l04_pure("28 former Mamba layers", ("pure_attention_256k_gib = 2 * 32 *", "pure_attention_256k_gib = 2 * 28 *"), "28 former Mamba layers"),
    l04_pure("query heads", ("pure_attention_256k_gib = 2 * 32 * 8 *", "pure_attention_256k_gib = 2 * 32 * 32 *"), "uses the 32 query heads"),
    Case(L04, "test_jamba_cache", "decimal GB", {"jamba_cache": sol(L04, "jamba_cache", ("return n_bytes / 2**30", "return n_bytes / 1e9"))}, "decimal GB"),
    Case(L04, "test_jamba_cache", "bytes", {"jamba_cache": sol(L04, "jamba_cache", ("return n_bytes / 2**30", "return n_bytes"))}, "returns bytes"),
    Case(L04, "test_jamba_cache", "256,000 tokens", {"jamba_cache": sol(L04, "jamba_cache", ("context=256 * 1024)", "context=256_000)"))}, "not 256,000"),
    Case(L04, "test_crossover", "counted up", {"crossover": sol(L04, "crossover", (CROSS, "T = 0\n    while T * cache_per_token < state:\n        T += 1\n    return T"))}),
    Case(L04, "test_crossover", "divmod", {"crossover": sol(L04, "crossover", (CROSS, "n, r = divmod(state, cache_per_token)\n    return n + (r > 0)"))}),
    # The K/V path: other correct ways, and the slips of a hand-written LayerNorm; gradients in the visible part too.
    l05_kv("solution", ("y_norm = norm(y)", "y_norm = norm(y)")),
    l05_kv("F.linear and permute", ("k = w_k(y_norm).view(B, T, n_kv_heads, head_dim).transpose(1, 2)",
                                    "k = torch.nn.functional.linear(y_norm, w_k.weight).reshape(B, T, n_kv_heads, head_dim).permute(0, 2, 1, 3)")),
    l05_kv("hand-written LayerNorm", ("y_norm = norm(y)", HAND_LN.format(unbiased=False))),
    l05_kv("functional layer_norm", ("y_norm = norm(y)", "y_norm = torch.nn.functional.layer_norm(y, y.shape[-1:], norm.weight, norm.bias, norm.eps)")),
    l05_kv("unbiased variance", ("y_norm = norm(y)", HAND_LN.format(unbiased=True)), "divides by the unbiased variance"),
    l05_kv("no scale and shift", ("y_norm = norm(y)", "y_norm = torch.nn.functional.layer_norm(y, y.shape[-1:], eps=norm.eps)"),
           "without the LayerNorm's scale and shift"),
    l05_kv("under no_grad", ("y_norm = norm(y)", "with torch.no_grad():\n        y_norm = norm(y)"), "no gradient reaches y"),
    l05_kv("detached", ("y_norm = norm(y)", "y_norm = norm(y).detach()"), "no gradient reaches y"),
    Case(L05, "test_cache_per_token", "bytes of Y", {"cache_per_token": sol(L05, "cache_per_token", (KEPT, "return 2 * dim"))}, "is twice Y"),
    Case(L05, "test_cache_per_token", "K and V of every layer from Y", {"cache_per_token": sol(L05, "cache_per_token", (KEPT, "return 2 * n_layers * dim"))},
         "K and V are not stored here"),
    # What InAttention keeps: Y or the token id, both right (item 15).
    Case(L05, "test_cache_per_token", "token id", {"cache_per_token": sol(L05, "cache_per_token", (KEPT, "return 1      # the token id; Y is looked up again"))}),
    Case(L05, "test_cache_per_token", "a state per layer", {"cache_per_token": sol(L05, "cache_per_token", (KEPT, "return n_layers * dim"))}, "keeps a state per layer"),
    # The form the visible part checks, now that the counts are checked at grading (issue 39, item 4).
    Case(L05, "test_cache_per_token", "nothing kept", {"cache_per_token": sol(L05, "cache_per_token", (KEPT, "return 0"))},
         "a count of numbers is a positive whole number"),
    Case(L05, "test_cache_per_token", "half a number", {"cache_per_token": sol(L05, "cache_per_token", (KEPT, "return dim / 3"))},
         "a count of numbers is a positive whole number"),
]


# ------------------------------------------------------------------------------ lesson 06
L06 = "06_recall_per_byte"
GATE_MASK = 'L = torch.where(causal, diff, float("-inf")).exp()            # masked before exp: exactly 0 above'
GATE_OUT = "return (L * (q @ k.transpose(-1, -2))) @ v                    # (B, H, T, T) @ (B, H, T, d_v)"
GATE_LOOP = """
def parallel_scalar_gate(q, k, v, g):
    B, H, T, d_k = q.shape
    S = q.new_zeros(B, H, d_k, v.shape[-1])
    out = []
    for t in range(T):
        S = g[:, :, t, None, None].exp() * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(out, dim=2)
"""
STATE_LINE = "numbers += n_heads * head_dim * head_dim"
MEMORY_FROM_KVCACHE = """
def memory_per_sequence(layers, context, dim=64, n_heads=4, window=None, bytes_per_number=2):
    from mlexp import kvcache       # what mlexp.capstone.memory_bytes is built from (issue 51: forbidden too)
    head_dim, dtype = dim // n_heads, {2: "bf16", 4: "fp32"}[bytes_per_number]
    total = 0
    for kind in layers:
        if kind in ("attention", "window"):
            kept = context if kind == "attention" else min(context, window)
            total += kvcache.kv_bytes_per_token(1, n_heads, head_dim, dtype) * kept
        elif kind in ("gated_delta", "decay"):
            total += n_heads * head_dim * head_dim * kvcache.dtype_bytes(dtype)
    return total + (dim * context * kvcache.dtype_bytes(dtype) if "inattention" in layers else 0)
"""
MEMORY_FROM_CAPSTONE = """
def memory_per_sequence(layers, context, dim=64, n_heads=4, window=None, bytes_per_number=2):
    from mlexp.capstone import Design
    design = Design("mine", tuple(layers), window)
    dtype = {2: "bf16", 4: "fp32"}[bytes_per_number]
    return memory_bytes(design, context, dim, n_heads, dtype, conv_kernel=1)["total_bytes"]
"""


def l06_gate(name, *edits, hint=None, source=None):
    return Case(L06, "test_parallel_gate", name, {"parallel_gate": source or sol(L06, "parallel_gate", *edits)}, hint)


def l06_library(impl):
    return ("def parallel_scalar_gate(q, k, v, g):\n"
            f"    return gated_linear_attention(q, k, v, g, impl={impl!r})[0]")


CASES += [
    # Correct variants: masking before exp in other ways, float64 inside, einsum (issue 26, item 7).
    l06_gate("solution"),
    l06_gate("masked_fill before exp", (GATE_MASK, 'L = diff.masked_fill(~causal, float("-inf")).exp()')),
    l06_gate("clamped exponent, then masked", (GATE_MASK, "L = diff.clamp(max=0).exp() * causal")),
    l06_gate("float64 inside, input dtype out", (GATE_OUT, "return ((L.double() * (q.double() @ k.double().transpose(-1, -2))) @ v.double()).to(q.dtype)")),
    l06_gate("einsum", (GATE_OUT, "return torch.einsum('bhts,bhtk,bhsk,bhsv->bhtv', L, q, k, v)")),
    l06_gate("under torch.no_grad()", ("def parallel_scalar_gate", "@torch.no_grad()\ndef parallel_scalar_gate"), hint="the output carries no gradient with respect to g"),
    # The rules: no library op (any impl), no loop over t, the inputs' dtype (items 1 and 3).
    l06_gate("library recurrent path", source=l06_library("recurrent"), hint="it calls the library op"),
    l06_gate("library chunk path", source=l06_library("chunk"), hint="this exercise asks you to write it yourself"),
    l06_gate("the recurrence as a loop over t", source=GATE_LOOP, hint="Build the whole (T, T) decay mask L at once"),
    l06_gate("float64 output for float32 inputs", (GATE_OUT, "return (L.double() * (q.double() @ k.double().transpose(-1, -2))) @ v.double()"),
             hint="float32 inputs gave a torch.float64 output"),
    # Slips: the cumprod ratio and exp(b_t) exp(-b_s) overflow alike; the hint names both.
    l06_gate("cumprod ratio", (GATE_MASK, "P = g.exp().cumprod(-1)\n    L = torch.where(causal, P[..., :, None] / P[..., None, :], 0.0)"),
             hint="a ratio of running products of the gates"),
    l06_gate("cumprod ratio, masked after", (GATE_MASK, "P = g.exp().cumprod(-1)\n    L = (P[..., :, None] / P[..., None, :]) * causal"),
             hint="above the diagonal as well"),
    l06_gate("exp product", (GATE_MASK, "L = torch.where(causal, b.exp()[..., :, None] * (-b).exp()[..., None, :], 0.0)"), hint="exp(b_t) * exp(-b_s)"),
    # The memory of a design: plain Python, not mlexp.capstone.memory_bytes.
    Case(L06, "test_memory", "solution", {}),
    Case(L06, "test_memory", "memory_bytes", {"memory": MEMORY_FROM_CAPSTONE}, "not mlexp.capstone.memory_bytes"),
    Case(L06, "test_memory", "from mlexp.kvcache's helpers", {"memory": MEMORY_FROM_KVCACHE}, "not mlexp.capstone.memory_bytes"),
    Case(L06, "test_memory", "recurrent layers left out", {"memory": sol(L06, "memory", (STATE_LINE, "pass"))},
         "the Gated DeltaNet layers of the hybrid were left out"),
    Case(L06, "test_memory", "a state per token", {"memory": sol(L06, "memory", (STATE_LINE, STATE_LINE + " * context"))},
         "the recurrent state was counted once per token"),
]

BUDGET_RETURN = "    return max(fits)[2] if fits else None"


def l06_budget(name, *edits, hint=None, source=None):
    return Case(L06, "test_budget", name, {"budget": source or sol(L06, "budget", *edits)}, hint)


BUDGET_LOOP = """
def best_under_budget(table, budget_bytes):
    best = None
    for name, (n_bytes, accuracy) in table.items():
        if n_bytes > budget_bytes:
            continue
        if best is None or accuracy > table[best][1] or (accuracy == table[best][1] and n_bytes < table[best][0]):
            best = name
    return best
"""
BUDGET_FIRST_IN_TABLE = """
def best_under_budget(table, budget_bytes):
    fits = {name: accuracy for name, (n_bytes, accuracy) in table.items() if n_bytes <= budget_bytes}
    return max(fits, key=fits.get) if fits else None
"""

CASES += [
    # Issue 40: the budget's ties are broken by bytes in two tables where name order and byte order
    # disagree, so a tie broken by name (either way) or by the order of the table fails with its own
    # hint; the least accurate design is not the smallest, so it gets its own hint too.
    l06_budget("solution"),
    l06_budget("sorted by accuracy, then bytes", (BUDGET_RETURN, "    return sorted(fits, key=lambda f: (-f[0], -f[1]))[0][2] if fits else None")),
    l06_budget("a loop with an explicit tie rule", source=BUDGET_LOOP),
    l06_budget("ties by the later name", ("(accuracy, -n_bytes, name)", "(accuracy, name, n_bytes)"), (BUDGET_RETURN, "    return max(fits)[1] if fits else None"),
               hint="The tie was broken by the names"),
    l06_budget("ties by the earlier name", (BUDGET_RETURN, "    return min(fits, key=lambda f: (-f[0], f[2]))[2] if fits else None"),
               hint="The tie was broken by the names"),
    l06_budget("ties by the first in the table", source=BUDGET_FIRST_IN_TABLE, hint="The tie was broken by the names"),
    l06_budget("least accurate", (BUDGET_RETURN, "    return min(fits)[2] if fits else None"), hint="the least accurate design that fits"),
    # A softmax in the parallel form is named as such, and no hint prints the expected mask.
    l06_gate("softmax of the decayed scores",
             (GATE_OUT, 'return torch.softmax((L * (q @ k.transpose(-1, -2))).masked_fill(~causal, float("-inf")), -1) @ v'),
             hint="the scores went through a softmax"),
    l06_gate("decay times a softmax of the scores",
             (GATE_OUT, 'return (L * torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~causal, float("-inf")), -1)) @ v'),
             hint="the scores went through a softmax"),
    l06_gate("scaled softmax of the decayed scores",
             (GATE_OUT, 'return torch.softmax((L * (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5).masked_fill(~causal, float("-inf")), -1) @ v'),
             hint="the scores went through a softmax"),
    l06_gate("decay as a softmax bias",
             (GATE_OUT, 'return torch.softmax((q @ k.transpose(-1, -2)) + torch.where(causal, diff, float("-inf")), -1) @ v'),
             hint="every row of L sums to 1"),
    l06_gate("the decay mask of a later gate", (GATE_MASK, 'L = torch.where(causal, diff, float("-inf")).exp() ** 2'),
             hint="should hold the products alpha_(s+1) ... alpha_t"),
    l06_gate("cumulative sum from the end", ("b = g.cumsum(dim=-1)", "b = g.flip(-1).cumsum(dim=-1).flip(-1)"),
             hint="should hold the products alpha_(s+1) ... alpha_t"),
]


# Every catalogued mistake is made by a demo student or by one of these (see
# test_every_catalogued_mistake_is_made_by_a_demo_student_or_an_answer_case).
PURE = "pure_attention_256k_gib = 2 * 32 * 8 * 128 * 2 * (256 * 1024) / 2**30"
READS = {"plain": "S_plain = S1 + torch.outer(k2, v2)", "decay": "S_decay = 0.5 * S1 + torch.outer(k2, v2)",
         "read_plain": "read_plain = tuple((q_read @ S_plain).tolist())"}
GROWTH = "along_k = 1.0 - beta * float(k @ k)"
PAIRS_IN = "    return T                    #"


def _case(lesson, test, grade_id, name, edits, hint, partial=None):
    return Case(lesson, test, name, {grade_id: sol(lesson, grade_id, *edits)}, hint, partial=partial)


CASES += [
    l01_cost("scores of width one", attention="4 * t", hint="each score is a dot product of width d"),
    _case(L03, "test_delta_step", "delta_step", "plain sum when beta is 1",
          [("return S + beta * torch.outer(k, error)",
            "return S + beta * torch.outer(k, error) if beta != 1 else S + torch.outer(k, v)")],
          "like the plain sum"),
    _case(L03, "test_key_norm", "key_norm", "length of k ignored",
          [("    " + GROWTH + "             # eigenvalue for the direction of k\n    return max(1.0, abs(along_k))",
            "    return abs(1.0 - beta)")], "ignored the length of k"),
    _case(L03, "test_key_norm", "key_norm", "|k| for |k|^2", [(GROWTH, "along_k = 1.0 - beta * float(k.norm())")],
          "used |k| where |k|^2 belongs"),
    replace(_case(L03, "test_key_norm", "key_norm", "answer a", [('why_normalise = "b"', 'why_normalise = "a"')],
                  "why_normalise names a statement that is false. Work out"),
            hidden_only=True),   # the letter is judged by the hidden part only, one hint for any wrong one
    replace(_case(L03, "test_key_norm", "key_norm", "answer c", [('why_normalise = "b"', 'why_normalise = "c"')],
                  "why_normalise names a statement that is false. Work out"),
            hidden_only=True),   # the letter is judged by the hidden part only, one hint for any wrong one
    # The read-backs' values are judged by the hidden part only (issue 39, item 4).
    *(replace(c, hidden_only=True) for c in [
        _case(L03, "test_read_backs", "read_backs", "decay on the new write",
              [(READS["decay"], "S_decay = 0.5 * (S1 + torch.outer(k2, v2))")], "decays the new write too"),
        _case(L03, "test_read_backs", "read_backs", "no decay", [(READS["decay"], "S_decay = S1 + torch.outer(k2, v2)")],
              "read_decay equals the plain sum"),
        _case(L03, "test_read_backs", "read_backs", "first write only", [(READS["plain"], "S_plain = S1")],
              "read_plain holds only the first value"),
        _case(L03, "test_read_backs", "read_backs", "normalised read",
              [(READS["read_plain"], "read_plain = tuple((q_read @ S_plain / (q_read @ (k1 + k2))).tolist())")],
              "read_plain was divided by q.z"),
    ]),
    l04_pure("decimal GB", (PURE, PURE.replace("2**30", "1e9")), "is in decimal GB"),
    l04_pure("Jamba's own cache", (PURE, PURE.replace("2 * 32 *", "2 * 4 *")), "is Jamba's own cache"),
    l04_pure("no factor two", (PURE, PURE.replace("= 2 * 32 *", "= 32 *")), "is half the right size"),
    l04_pure("28 over 4", ("hybrid_saving = pure_attention_256k_gib / jamba_gib", "hybrid_saving = 28 / 4"),
             "compares 28 layers with 4"),
    _case(L05, "test_inattention_kv", "inattention_kv", "k and v swapped",
          [("k = w_k(y_norm)", "k = w_v(y_norm)"), ("v = w_v(y_norm)", "v = w_k(y_norm)")], "k and v are swapped"),
    _case(L05, "test_attention_pairs", "attention_pairs", "last position not itself",
          [(PAIRS_IN, "    return T - 1                #")], "leaves out the last position attending itself", partial=2),
    _case(L05, "test_attention_pairs", "attention_pairs", "one pair", [(PAIRS_IN, "    return 1                    #")],
          "one query, but it is scored against every key", partial=2),
    _case(L05, "test_attention_pairs", "attention_pairs", "mlexp.inattention's count",
          [("return T * (T + 1) // 2", "return __import__('mlexp.inattention').inattention.attention_pairs(T, 'standard')")],
          "Count the pairs yourself, not with mlexp.inattention", partial=1),
    _case(L05, "test_attention_pairs", "attention_pairs", "the library imported for the last query",
          [(PAIRS_IN, "    from mlexp.inattention import attention_pairs\n    return attention_pairs(T, 'inattention')  #")],
          "Count the pairs yourself, not with mlexp.inattention", partial=2),
    _case(L05, "test_attention_pairs", "attention_pairs", "no diagonal",
          [("return T * (T + 1) // 2", "return T * (T - 1) // 2")], "leaves out the diagonal", partial=1),
    _case(L05, "test_attention_pairs", "attention_pairs", "count as text", [(PAIRS_IN, "    return str(T)               #")],
          "a number of (t, s) pairs is a whole number", partial=2),      # the form, checked in the visible part too
    _case(L05, "test_cache_per_token", "cache_per_token", "one layer",
          [("return 2 * n_layers * n_kv_heads * head_dim", "return 2 * n_kv_heads * head_dim")], "is one layer's cache"),
]


CASES += [
    # Lesson 04: the form its visible part checks, now that the values are checked at grading (issue 39, item 4).
    l04_layers("in reverse order", "return [i for i in range(n_layers) if i % period == offset][::-1]",
               "once, in increasing order"),
    l04_layers("negative indices", "return [i - n_layers for i in range(n_layers) if i % period == offset]",
               "layer indices start at 0"),
    Case(L04, "test_jamba_cache", "negative", {"jamba_cache": sol(L04, "jamba_cache", (JAMBA, JAMBA.replace("= kv_cache_gib(", "= -kv_cache_gib(")))},
         "a finite, positive number"),
    l04_pure("saving not a number", ("hybrid_saving = pure_attention_256k_gib / jamba_gib", "hybrid_saving = float('nan')"),
             "a finite, positive number"),
    Case(L04, "test_crossover", "zero", {"crossover": sol(L04, "crossover", (CROSS, "return 0"))}, "of positive size"),
]

CASES += [
    # Lesson 06: the form its visible part checks, now that the bytes are checked at grading (issue 39, item 4).
    Case(L06, "test_memory", "a fraction of a byte",
         {"memory": sol(L06, "memory", ("return numbers * bytes_per_number", "return numbers * bytes_per_number / 3"))},
         "a positive whole number of bytes"),
    Case(L06, "test_memory", "bytes_per_number ignored",
         {"memory": sol(L06, "memory", ("return numbers * bytes_per_number", "return numbers * 2"))},
         "multiply by bytes_per_number"),
]

# Issue 39, item 4: where an answer comes from a small space, the visible part checks only its form and
# the hidden part its value (and each catalogued wrong value), so a hint on the value is given at grading
# only. {(lesson, test): the hints the visible part still gives: form, rules, missing code}.
FORM_HINTS = {
    (L02, "test_cache_vs_state"): ("not written yet", "not defined", "counts only keys", "a fraction of a token",
                                   "should return a number of tokens", "at least 1"),
    (L05, "test_attention_pairs"): ("not written yet", "not defined", "Count the pairs yourself", "write it yourself",
                                    "counts the full T x T square", "leaves out the diagonal",
                                    "leaves out the last position attending itself", "one query, but it is scored",
                                    "a number of (t, s) pairs is"),
    (L05, "test_cache_per_token"): ("not written yet", "not defined", "a count of numbers is"),
    (L00, "test_reach"): ("not written yet", "not defined", "counts the shared position once per layer",
                          "leaves out the current position", "not multiplicatively", "a whole number, at least 1",
                          "the number of input positions is a whole number", "no fewer positions"),
    (L00, "test_kv_bytes"): ("not written yet", "not defined", "Use plain Python", "write it yourself",
                             "should be a number", "it should be a positive", "must use all four arguments",
                             "set gqa_bytes", "set mha_over_gqa"),
    (L04, "test_attention_layers"): ("not written yet", "not defined", "Use plain Python", "write it yourself",
                                     "not how many there are", "a list of ints", "once, in increasing order",
                                     "layer indices start at 0"),
    (L04, "test_jamba_cache"): ("not written yet", "not defined", "Use plain Python", "write it yourself",
                                "ignores bytes_per_number", "a finite, positive number"),
    (L04, "test_pure_attention"): ("not defined", "a finite, positive number"),
    (L04, "test_crossover"): ("not written yet", "not defined", "Use plain Python", "write it yourself",
                              "a fraction of a token", "should return a number of tokens", "of positive size"),
    (L06, "test_memory"): ("not written yet", "not defined", "Count the numbers yourself", "write it yourself",
                           "not mlexp.capstone.memory_bytes",
                           "should return a number of bytes", "a positive whole number of bytes",
                           "multiply by bytes_per_number"),
}
CASES = [replace(c, hidden_only=True) if c.hint is not None and (c.lesson, c.test) in FORM_HINTS
         and not any(h in x for h in FORM_HINTS[c.lesson, c.test] for x in _either(c.hint)) else c for c in CASES]


# ------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=pytest.mark.slow if c.slow else ()) for c in CASES])
def test_answer_gets_its_verdict(case):
    for mode in case.modes:
        run = run_lesson(case.lesson, case.answers, mode=mode, only={case.test}, share=True)
        assert not run.violations, run.violations
        where = f"{case.id} ({mode})"
        check_outcome(run.outcomes[case.test, "full"], case.hint, where + " full", case.lesson, case.answers,
                      case.partial)
        visible_hint = None if case.hidden_only else case.hint
        check_outcome(run.outcomes[case.test, "visible"], visible_hint, where + " visible", case.lesson, case.answers,
                      case.partial)


PARTIAL_CREDIT = [   # (lesson, test, answer cell, edits: one part right, one wrong), the points, the wrong part's hint
    (L02, "test_write_read", "write_read", [(READ, "return S @ q")], 2, "read returned S q"),
    (L02, "test_write_read", "write_read", [(WRITE, "return S + torch.outer(v, k)")], 1, "written as v k^T"),
    (L05, "test_attention_pairs", "attention_pairs", [("return T * (T + 1) // 2", "return T * T")], 1,
     "counts the full T x T square"),
    (L05, "test_attention_pairs", "attention_pairs", [(PAIRS_IN, "    return T * (T + 1) // 2  #")], 2,
     "is the standard count"),
]


@pytest.mark.parametrize("lesson, test, grade_id, edits, points, hint", PARTIAL_CREDIT,
                         ids=[f"{c[0][:2]}-{c[1]}-{c[4]}" for c in PARTIAL_CREDIT])
def test_an_answer_with_one_part_right_gets_part_of_the_points(lesson, test, grade_id, edits, points, hint):
    """Issue 38, item 6: the two exercises with partial credit (write and read of lesson 02, the
    attention pairs of lesson 05) give the points of the part that is right, more than 0 and less
    than the test's, in the grader's run and in the student's own, and print the hint of the part
    that is wrong, which the class report files under its catalogued mistake."""
    from pathlib import Path
    from autograder.mistakes import load_mistakes, match_mistake
    assert 0 < points < points_per_test(lesson)[test]
    answers = {grade_id: sol(lesson, grade_id, *edits)}
    for mode in MODES:
        outcome = run_lesson(lesson, answers, mode=mode, only={test}).outcomes[test, "full"]
        assert (outcome.status, outcome.score) == ("partial", points), (mode, outcome)
        assert outcome.message.startswith("Hint:") and hint in outcome.message, (mode, outcome)
    mistakes = load_mistakes(Path(__file__).resolve().parent.parent, lesson)
    assert match_mistake(mistakes, test, outcome.message) is not None, outcome.message


def test_an_exercise_with_no_part_right_fails_with_the_hint_of_each_part():
    """Partial credit never turns a wholly wrong answer into a pass or a silent 0: with both write
    and read wrong the test raises, and its message holds both parts' hints."""
    answers = {"write_read": sol(L02, "write_read", (WRITE, "return S + torch.outer(v, k)"), (READ, "return S @ q"))}
    outcome = run_lesson(L02, answers, only={"test_write_read"}).outcomes["test_write_read", "full"]
    assert outcome.status == "fail", outcome
    assert "written as v k^T" in outcome.message and "read returned S q" in outcome.message, outcome


FAST_STUDENTS = 2   # per lesson, in catalogue order, in make test-fast; make test runs every student
# Lesson 03: every student whose chunkwise answers are right runs their timed calls (about 20 s, once per
# run, shared), so make test-fast takes its blank student only; make test runs them all.
FAST_CHOICE = {"03_gates_and_delta_rule": ["bea_blank"]}


def _demo_params():
    for a in LESSONS:
        fast = FAST_CHOICE.get(a, list(CATALOG[a]["students"])[:FAST_STUDENTS])
        for s in CATALOG[a]["students"]:
            yield pytest.param(a, s, id=f"{a[:2]}-{s}", marks=() if s in fast else pytest.mark.slow)


@pytest.mark.parametrize("lesson, student", list(_demo_params()))
def test_catalogued_student_gets_its_score_and_hints(lesson, student):
    spec = CATALOG[lesson]["students"][student]
    answers = {} if spec.get("from_solution") else blank_answers(lesson)
    answers.update(spec.get("answers", {}))
    points = points_per_test(lesson)
    for mode in MODES:
        run = run_lesson(lesson, answers, mode=mode, share=True)
        assert not run.violations, run.violations
        score = 0
        for test, pts in points.items():
            hint = spec["expect"]["hints"].get(test)
            partial = spec["expect"].get("partial", {}).get(test)   # points of a test with partial credit
            visible = None if test in spec["expect"].get("hidden_only", ()) else hint   # judged at grading only
            check_outcome(run.outcomes[test, "full"], hint, f"{student} {test} ({mode})", lesson, answers, partial)
            check_outcome(run.outcomes[test, "visible"], visible, f"{student} {test} visible ({mode})", lesson, answers,
                          partial)
            score += pts if run.outcomes[test, "full"].status == "pass" else (partial or 0)
        assert (score, sum(points.values())) == (spec["expect"]["score"], spec["expect"]["max_score"])


@pytest.mark.parametrize("lesson", LESSONS)
def test_blank_lesson_fails_every_test_with_a_hint(lesson):
    for mode in MODES:
        run = run_lesson(lesson, blank_answers(lesson), mode=mode)
        for (test, part), outcome in run.outcomes.items():
            assert outcome.status == "fail" and outcome.message.startswith("Hint:"), (test, part, mode, outcome)


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_lesson_cell_reads_a_name_only_a_test_cell_defines(lesson):
    """Rule 4: while grading, what a test cell defines never reaches the student's namespace."""
    assert names_from_test_cells(lesson) == []


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_test_cell_imports_the_modules_it_uses(lesson):
    """Rule 1, statically: a module a test cell names is imported in that cell (the solution run
    in grader mode checks the same dynamically, on the paths that run)."""
    import ast
    for cell in solution_notebook(lesson).cells:
        if not is_test(cell):
            continue
        tree = ast.parse(cell.source)
        imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        modules = {"torch", "F", "math", "nn", "np", "numpy", "hashlib", "mlexp", "kc"}
        missing = (used & modules) - imported
        assert not missing, f"{lesson} {grade_meta(cell)['grade_id']}: uses {sorted(missing)} without importing"


def test_lesson01_your_turn_separates_every_slip():
    """Item 2 of issue 14: with the lesson's numbers the state is not symmetric and each slip gives
    its own pair, at least 0.05 away from every other one at two decimals."""
    keys, values, q = [(1, 0), (1, 1), (0, 1)], [(2, 0), (0, 4), (2, 2)], (3, 1)

    def state(pairs):                       # sum of k v^T as a 2 x 2 list
        return [[sum(k[i] * v[j] for k, v in pairs) for j in range(2)] for i in range(2)]

    def read(S, query):                     # q^T S
        return [query[0] * S[0][j] + query[1] * S[1][j] for j in range(2)]

    def output(S, query, z_keys):           # q^T S / (q . z), z = sum of z_keys
        z = [sum(k[i] for k in z_keys) for i in range(2)]
        return [x / (query[0] * z[0] + query[1] * z[1]) for x in read(S, query)]

    S2, S3 = state(list(zip(keys[:2], values[:2]))), state(list(zip(keys, values)))
    S3_T = [[S3[j][i] for j in range(2)] for i in range(2)]
    new_as_v_kT = state(list(zip(keys[:2], values[:2])) + [(values[2], keys[2])])
    pairs = {"right": output(S3, q, keys), "z not updated": output(S3, q, keys[:2]),
             "new token as v k^T": output(new_as_v_kT, q, keys), "transposed": output(S3_T, q, keys),
             "no division": read(S3, q), "token missing": output(S2, q, keys[:2]),
             "S not updated": output(S2, q, keys), "old query": output(S3, (1, 2), keys),
             "sum of z": [x / sum(map(sum, keys)) for x in read(S3, q)]}
    assert S3[0][1] != S3[1][0], "the final state must not be symmetric, or v k^T goes unnoticed"
    rounded = {name: tuple(round(x, 2) for x in p) for name, p in pairs.items()}
    assert rounded["right"] == (1.0, 2.25)
    for a, pa in rounded.items():
        for b, pb in rounded.items():
            assert a == b or max(abs(x - y) for x, y in zip(pa, pb)) > 0.05, (a, b, pa, pb)


# ------------------------------------------------------------------------------ the catalogue follows the hints
def _slip_hints(source: str) -> list:
    """The text of every hint of a test cell that names a slip: the message of each assert that
    the answer is *not* something (``assert not ...``, ``assert got != ...``), each value of a
    ``slips``/``recognised`` table of wrong answers, and each rule's ``instead=`` text (mlexp.rules).
    Formatted parts read as "{}", except names the cell binds to a string, which are filled in."""
    import ast
    tree = ast.parse(source)
    strings = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
               for t in n.targets if isinstance(t, ast.Name)
               and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}

    def text(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else
                           strings.get(getattr(v.value, "id", None), "{}") for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = text(node.left), text(node.right)
            return (left or "{}") + (right or "{}") if left or right else None
        return None

    def negative(test):
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return True
        if isinstance(test, ast.Compare):
            return all(isinstance(op, (ast.NotEq, ast.NotIn)) for op in test.ops)
        return isinstance(test, ast.BoolOp) and all(negative(v) for v in test.values)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and node.msg is not None and negative(node.test):
            found.append(text(node.msg))
        elif isinstance(node, ast.Call):
            # rules.uses_argument says "<name> is not used: ..." before its instead= (mlexp.rules)
            said = "".join(f"{text(kw.value)} is not used: " for kw in node.keywords if kw.arg == "name"
                           and getattr(node.func, "attr", "") == "uses_argument")
            found += [said + (text(kw.value) or "") for kw in node.keywords if kw.arg == "instead"]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                getattr(t, "id", "") in ("slips", "recognised") for t in node.targets):
            for value in node.value.values:
                found.append(text(value.elts[-1] if isinstance(value, ast.Tuple) else value))
    return [h for h in found if h and h.replace("{}", "").replace("Hint:", "").strip()]


ALL_LESSONS = LESSONS + ["06_recall_per_byte"]


@pytest.mark.parametrize("lesson", ALL_LESSONS)
def test_every_slip_hint_has_a_catalogue_entry(lesson):
    """Issue 26, item 4: each hint that names a slip is matched to a catalogued mistake of its test
    cell (autograder.mistakes.match_mistake), so the class report never files it as "no hint
    matched". Neutral hints (the final "expected ..., got ..." of an unforeseen answer), the
    "not defined" and form checks are positive asserts and need no entry."""
    from pathlib import Path
    from autograder.mistakes import load_mistakes, match_mistake
    mistakes = load_mistakes(Path(__file__).resolve().parent.parent, lesson)
    missing = [f"{grade_meta(c)['grade_id']}: {hint[:100]!r}" for c in solution_notebook(lesson).cells
               if is_test(c) for hint in _slip_hints(c.source)
               if match_mistake(mistakes, grade_meta(c)["grade_id"], hint) is None]
    assert not missing, f"{lesson}: hints with no entry in solutions/{lesson}/mistakes.json:\n" + "\n".join(missing)


@pytest.mark.slow   # reruns each lesson's hinted answer cases: left out of make test-fast (under 3 min); make test runs it
@pytest.mark.parametrize("lesson", ALL_LESSONS)
def test_every_catalogued_mistake_is_made_by_a_demo_student_or_an_answer_case(lesson):
    """Each mistake of solutions/<id>/mistakes.json is made somewhere the grader is held to it:
    by a demo student (autograder/demo/catalog) or by an answer case above, whose hint the grader
    then files under that mistake."""
    from pathlib import Path
    from autograder.mistakes import load_mistakes, match_mistake
    mistakes = load_mistakes(Path(__file__).resolve().parent.parent, lesson)
    made = {mid for spec in CATALOG.get(lesson, {}).get("students", {}).values()
            for mid in spec["expect"].get("mistakes", [])}
    left = {mid for mid in mistakes if mid not in made}
    tests = {mistakes[mid].test for mid in left}
    for case in CASES:
        if case.lesson == lesson and case.hint and case.test in tests and "grader" in case.modes:
            outcome = run_lesson(lesson, case.answers, mode="grader", only={case.test},
                                 share=True).outcomes[case.test, "full"]
            made.add(match_mistake(mistakes, case.test, outcome.message))
    assert not set(mistakes) - made, (f"no demo student or answer case makes "
                                      f"{sorted(set(mistakes) - made)}: add one to tests/test_exercises.py")


def test_lesson06_states_the_dtype_rule_where_the_student_reads_it():
    """Issue 40: test_parallel_gate fails a float64 output for float32 inputs, so the docstring of the
    released answer cell (what the student edits) states the rule, and so does the exercise's text."""
    import ast
    from exercise_runner import released_notebook
    nb = released_notebook(L06)
    cell = next(c for c in nb.cells if grade_meta(c).get("grade_id") == "parallel_gate")
    docstring = ast.get_docstring(ast.parse(cell.source).body[0])
    assert "the inputs' dtype" in docstring and "float32 in, float32 out" in docstring, docstring
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "float32 in, float32 out" in text


def test_a_shared_test_run_keys_on_every_answer_cell_that_can_change_it():
    """run_lesson(share=True) reuses a test's outcome across runs whose inputs_of_test are equal:
    the cells that bind what the test reads (through helpers), every cell that does more than bind
    names, and every cell when the test reads the namespace by a computed name."""
    from exercise_runner import inputs_of_test
    cells = [("helper", "def g(x):\n    return x + 1\n"),
             ("ruled", "def f(x):\n    '''doc'''\n    out = [0]\n    out[0] = g(x)\n    return out\n"),
             ("other", "def h(x):\n    return 2 * x\nWHY = 'b'\n"),
             ("values", "S = torch.outer(torch.ones(2), torch.ones(2))\nprint(S)\n")]   # torch: the setup's
    keys = lambda test, extra=(): [gid for gid, _ in inputs_of_test(test, cells + list(extra))]  # noqa: E731
    assert keys("assert f(1) == [2]") == ["helper", "ruled"]
    assert keys('assert "WHY" in globals() and globals()["WHY"] == "b"') == ["other"]
    assert keys("assert eval('f')(1) == [2]") == ["helper", "ruled", "other", "values"]
    for reaching in ("torch.manual_seed(1)\n", "def k():\n    global WHY\n    WHY = 'a'\n", "S[0, 0] = 5.0\n",
                     "def k(x):\n    S.add_(x)\n    return x\n", "import sys\nsys.setrecursionlimit(50)\n",
                     "@torch.no_grad()\ndef k(x):\n    return x\n", "def k(x, y=torch.ones(2)):\n    return x\n",
                     "def k(x):\n    return x +\n"):
        assert {"helper", "ruled", "late"} <= set(keys("assert f(1) == [2]", [("late", reaching)])), reaching
