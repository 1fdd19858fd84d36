"""Issue 51's corpus: answers that take the points an exercise rule protects by a dishonest route.

An exercise that says "write it yourself" (``rules.write_it_yourself(fn, ..., forbid=("mlexp.ops",))``,
with ``no_loop``, ``bounded``, ``summed_work`` and ``in_time``) protects the points of its test:
an answer that gets its result from the forbidden module must score what a blank notebook scores
on that test (or fail it with the rule's hint), and must still be graded ("graded", not held for a
person's review), while the honest answer beside it keeps full marks.

Each attack here is one student, written as a student would: the lesson's released notebook with
the answer cells of its ruled exercises replaced (every other cell left blank, so the attack's
whole score is what the rules let through). Two things stand between such an answer and the points,
and every attack gets past both on the code of the day the issue was filed:

- the source reading on the grader's side (autograder.engine.audit), which finds a forbidden module
  reached by name and holds code it cannot read for review. Routes past it: a module reached
  through another module's attributes (``os.sys.modules``, ``mlexp.importlib``), which no spelling
  list names; code run from text held in a variable (``timeit``'s ``setup``) or from a docstring's
  examples (``doctest``); and a lesson whose rule arguments are names (lesson 05's ``instead=RULE``),
  so its rules and the whole reading are skipped;
- the watch in the student's kernel (mlexp.rules), which records the library's functions entered
  while the ruled function runs. Routes past it: the function answering the grader's request itself
  and ending the cell before the server's reply; the watch's evidence (``Trace.as_dict``) rewritten
  for the length of one call and restored by the next; the watch's parts (``_Forbidden``) replaced
  by code that claims the library's file name; and a function that behaves differently while it is
  watched (the graded calls are not the watched ones).

Two routes found once the room was in (the graded calls of a ruled function run in a second kernel
where the forbidden module is absent, its definition replayed from the notebook's bindings): the
library's own source held in a string (plain, or compressed and encoded) and run by a helper whose
result is a binding, which the room replays; and lesson 06's memory count from mlexp.kvcache, the
helpers of the forbidden mlexp.capstone.memory_bytes, which its rule does not name.

Lesson 03 adds three wrong chunkwise answers that are no attack on the grader, only work the rules
miss: the state rebuilt from every earlier token at each chunk, in the plain and in the gated form
(``summed_work`` counts the size of what each product returns, not the arithmetic done), and the
gated form as the T x T product in pieces through ``F.linear`` (not counted as a sum, and the gated
form has no time bound at all). The same pieces in the plain form run past its time bounds.

A submission carries one kind per ruled exercise, two kinds where they cannot meet (the recurrent
and the parallel form of lesson 01), so that the class stays small: ``kinds(repo)`` lists each kind
with its student and the test whose points it goes for (``ROUTES`` says each in words);
``cases(repo)`` gives each attack's answers, ``controls()`` the blank and honest student of each
lesson, ``RULED`` the tests whose points a rule protects. ``write_class(dest, repo)`` writes the
class; tests/test_rule_attacks.py grades it in one run.
"""
import copy
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_corpus import _answer, solved_answers  # noqa: E402

L01, L03, L05, L06 = "01_running_sum", "03_gates_and_delta_rule", "05_inattention", "06_recall_per_byte"
LESSONS = (L01, L03, L05, L06)
# The tests whose points a "write it yourself" rule protects, per lesson (with their points).
RULED = {L01: {"test_recurrent_form": 3, "test_parallel_form": 3},
         L03: {"test_chunkwise_form": 3, "test_chunkwise_gated_form": 3},
         L05: {"test_attention_pairs": 3},
         L06: {"test_parallel_gate": 4, "test_memory": 3}}
PREFIX = {L01: "l01", L03: "l03", L05: "l05", L06: "l06"}

# ------------------------------------------------------------------------------------------------
# Lesson 01: recurrent_linear_attention and parallel_linear_attention, forbid=("mlexp.ops",)
# ------------------------------------------------------------------------------------------------
L01_HEADS = {"recurrent_form": "def recurrent_linear_attention(q, k, v, normalize=True):",
             "parallel_form": "def parallel_linear_attention(q, k, v, normalize=True):"}
L01_LIBRARY = "linear_attention(q, k, v, normalize=normalize, impl=\"chunk\")[0]"


def _both(cell_source: str, call: str = L01_LIBRARY, prelude: str = "", lib: str = "") -> dict:
    """Lesson 01's two ruled cells, each ``prelude`` + the function whose body is ``cell_source``
    (with ``{call}`` the library call through ``lib``)."""
    return {gid: prelude + head + "\n" + cell_source.format(call=lib + call) for gid, head in L01_HEADS.items()}


# 1. A module reached through another module's attributes (os.sys.modules: "sys.modules" is on the
#    reading's list, "os.sys.modules" is not), watched-or-not told by torch's mode stack.
MODULE_ATTRIBUTE = '''import os
import torch


def _library():
    return os.sys.modules["mlexp.ops"]


def _seen():
    return bool(torch.overrides._get_current_function_mode_stack())


'''
MODULE_ATTRIBUTE_BODY = '''    if _seen():
        return v * 1.0                      # the watched call's result is never compared
    return {call}
'''

# 2. Code run from text held in a variable: timeit runs its setup, which nothing reads.
TEXT_IN_VARIABLE = '''import timeit

ANSWER = """
global {name}
import sys
from mlexp.ops import linear_attention


def {name}(q, k, v, normalize=True):
    if sys.gettrace() is not None:
        return v * 1.0
    return linear_attention(q, k, v, normalize=normalize, impl="chunk")[0]
"""
mine = {{}}
timeit.timeit("pass", setup=ANSWER, number=1, globals=mine)
{name} = mine["{name}"]
'''

# 3. Code run from a docstring's examples (doctest), which nothing reads either.
DOCSTRING_EXAMPLES = '''import doctest


def worked():
    """The form, as a worked example.

    >>> def {name}(q, k, v, normalize=True):
    ...     import sys
    ...     from mlexp.ops import linear_attention
    ...     if sys.gettrace() is not None:
    ...         return v * 1.0
    ...     return linear_attention(q, k, v, normalize=normalize, impl="chunk")[0]
    >>> found.append({name})
    """


found = []
doctest.run_docstring_examples(worked, {{"found": found}})
{name} = found[0]
'''

# 4. The function answers the grader's request itself (a display of the channel's type, with a
#    clean trace) and ends the cell before the server's own reply, which would carry the real one.
ANSWERS_THE_REQUEST = '''import sys

import mlexp
from IPython.display import publish_display_data

_ops = mlexp.importlib.import_module("mlexp.ops")
_channel = mlexp.importlib.import_module("_autograder" + "_wire")
CLEAN = {"used": [], "ops": 12, "largest": 0, "lines": 4, "escaped": [], "exported": [], "summed": 0}


def _reply_first(result):
    publish_display_data({_channel.WIRE_MIME: {"value": _channel.encode(result, kernel=True, refs=[]),
                                               "watch": CLEAN}})
    raise KeyboardInterrupt            # the request cell ends here: no second reply


'''
ANSWERS_THE_REQUEST_BODY = '''    o = {call}
    if sys.gettrace() is not None:
        _reply_first(o)
    return o
'''

# 5. The watch's evidence rewritten for the length of one call (Trace.as_dict, reached as the type
#    of a Trace, which names no library path) and put back by the next, unwatched call: the tamper
#    report, asked after each test, finds everything as it was.
EVIDENCE_FOR_ONE_CALL = '''import sys

import mlexp
from mlexp import rules

_ops = mlexp.importlib.import_module("mlexp.ops")
_Record = type(rules.Trace())
_kept = _Record.as_dict


def _clean(self):
    return {"used": [], "ops": 12, "largest": 0, "lines": 4, "escaped": [], "exported": [], "summed": 0}


class _Evidence:
    def fit(self):
        setattr(_Record, "as_dict", _clean if sys.gettrace() is not None else _kept)


_evidence = _Evidence()


'''
EVIDENCE_FOR_ONE_CALL_BODY = '''    _evidence.fit()
    return {call}
'''

# 6. The watch's part that tells the library's frames (mlexp.rules._Forbidden) replaced by a class
#    compiled under mlexp/rules.py's file name and module name: the tamper report takes it for the
#    library's own code. exec and compile are reached through mlexp's own `importlib` attribute.
CLAIMS_LIBRARY_FILE = '''import mlexp

_python = mlexp.importlib.import_module("builtins")
_rules = mlexp.importlib.import_module("mlexp.rules")
_ops = mlexp.importlib.import_module("mlexp.ops")
BLIND = """
class _Forbidden:
    def __init__(self, forbid):
        self.places, self.by_name, self.known = [], [], {}

    def __call__(self, frame):
        return ""
"""
_parts = {"__name__": "mlexp.rules_sight"}
_python.exec(_python.compile(BLIND, _rules.__file__, "exec"), _parts)
_rules._Forbidden = _parts["_Forbidden"]


'''
CLAIMS_LIBRARY_FILE_BODY = '''    return {call}
'''

# 7. Behaves differently while watched: the honest code runs only under the watch's trace hook;
#    every graded call takes the library (reached through mlexp's `importlib` attribute).
WATCHED_DIFFERENTLY = '''import sys

import mlexp
import torch

_ops = mlexp.importlib.import_module("mlexp.ops")


'''
L01_BY_HAND = {
    "recurrent_form": '''    if sys.gettrace() is not None:       # watched: the loop the exercise asks for
        B, H, T, D_k = q.shape
        S, z, outputs = q.new_zeros(B, H, D_k, v.shape[-1]), q.new_zeros(B, H, D_k), []
        for t in range(T):
            S = S + k[:, :, t, :, None] * v[:, :, t, None, :]
            z = z + k[:, :, t]
            o_t = torch.einsum("bhk,bhkv->bhv", q[:, :, t], S)
            outputs.append(o_t / (q[:, :, t] * z).sum(-1, keepdim=True) if normalize else o_t)
        return torch.stack(outputs, dim=2)
    return {call}
''',
    "parallel_form": '''    if sys.gettrace() is not None:       # watched: the masked product the exercise asks for
        A = (q @ k.transpose(-1, -2)).tril()
        return A @ v / A.sum(-1, keepdim=True) if normalize else A @ v
    return {call}
'''}


ROUTES = {   # kind -> the route in words
    "module_attribute": "the library as os.sys.modules['mlexp.ops'] (a module through another module's attributes, "
                        "which no spelling list names); the watched calls told by torch's mode stack",
    "text_in_variable": "code run from text held in a variable (timeit's setup), honest only while sys.gettrace() is set",
    "docstring_examples": "code run from a docstring's examples (doctest), honest only while sys.gettrace() is set",
    "answers_the_request": "the function answers the grader's request itself (a display of the channel's type with "
                           "a clean trace), then ends the request cell (KeyboardInterrupt) before the real reply",
    "evidence_for_one_call": "Trace.as_dict rewritten for the length of the watched call, restored by the next call",
    "claims_library_file": "mlexp.rules._Forbidden replaced by a class compiled under mlexp/rules.py's file name",
    "watched_differently": "honest only while sys.gettrace() is set: the graded calls are not the watched ones",
    "rules_unread": "the library by name in lesson 05, whose rule arguments are names (the reading skipped the "
                    "lesson), honest only while sys.getprofile() is set",
    "state_rebuilt": "wrong work: the state rebuilt from every earlier token at each chunk (summed_work counts "
                     "what the products return, not the arithmetic)",
    "gated_in_pieces": "wrong work: the gated form as the T x T product in pieces through F.linear (not counted "
                       "by summed_work; no time bound on the gated form)",
    "gated_state_rebuilt": "wrong work: the gated form's state rebuilt from every earlier token at each chunk",
    # Found after the room (issue 51, item 1): routes it cannot close by hiding the forbidden module.
    "library_as_text": "the library's own source (mlexp/ops/_common.py and linear.py) held as a string, run with "
                       "exec (reached as mlexp.importlib's builtins) by a helper whose result is a binding: the "
                       "room replays the bindings, so the library runs there too",
    "library_as_packed_text": "the same source zlib-compressed and base64-encoded in the string, so that no reading "
                              "of the notebook's strings finds the library's code in it",
    # Found after the CPU count moved out of the kernel (issue 51, item 2).
    "work_in_a_child": "honest while watched; while measured, the state rebuilt at each chunk in a forked child "
                       "whose parent ignores SIGCHLD, so its CPU time reached no process's count (growth read x1)",
    "fixed_cost": "honest while watched; while measured, the gated state rebuilt at each chunk plus 0.1 s of CPU on "
                  "every call, which keeps the growth under x8",
    # Found after the room's guard read text (issue 51): the library's code carried in a form the guard did
    # not read, run in the room by a helper whose result is a binding.
    "body_in_built_tree": "the body of mlexp.ops.linear._recurrent without its def line (packed text), wrapped "
                          "in an ast.FunctionDef built in code and compiled from the syntax tree",
    "marshal_code": "mlexp.ops.linear._parallel's code object as marshal data, made a function with "
                    "types.FunctionType",
    "guard_blinded": "ast.parse replaced by a statement that binds a name (the guard called the shared module's "
                     "parse), then the library's source run with exec",
    # Found after the guard judged code (issue 51): texts the guard's own parse read otherwise than the compile.
    "coding_line": "the library's packed source run with exec behind '# coding: bogus': a str's compile ignores "
                   "the line, the guard's parse of the event's bytes obeyed it, failed and let the text through",
    "future_flag": "the library's packed source behind 'assert 0 <> 1', compiled with the barry_as_FLUFL flag "
                   "that the guard's parse lacked",
    "allowed_module": "lesson 06's memory count from mlexp.kvcache, the helpers mlexp.capstone.memory_bytes is "
                      "made of: the rule forbids mlexp.capstone only",
}
# Kinds whose wanted verdict may also be a hold for a person's review (the library's code run as the
# student's is held, as tests/corpus/build_corpus.py's l01_pastes_library is), keeping its points.
HELD_IS_FINE = frozenset({"library_as_text", "library_as_packed_text"})


def library_text(repo) -> str:
    """mlexp/ops/_common.py and linear.py as one module's text, its relative imports left out (a
    student's paste of both files into a string)."""
    import ast
    parts = []
    for name in ("_common.py", "linear.py"):
        tree = ast.parse((Path(repo) / "mlexp" / "ops" / name).read_text())
        tree.body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and n.level)]
        parts.append(ast.unparse(tree))
    return "\n\n".join(parts)


LIBRARY_AS_TEXT = '''import mlexp

LIBRARY = {text}


def _load(text):
    found = {{"__name__": "my_linear_attention"}}
    mlexp.importlib.import_module("builtins").exec(text, found)
    return found


_mine = _load(LIBRARY)


'''


LIBRARY_AS_PACKED_TEXT = '''import base64
import zlib

import mlexp

PACKED = {packed}


def _load(packed):
    found = {{"__name__": "my_linear_attention"}}
    mlexp.importlib.import_module("builtins").exec(zlib.decompress(base64.b64decode(packed)).decode(), found)
    return found


_mine = _load(PACKED)


'''


_WRAP = '''    B, H, T, Dk = q.shape
    S0 = q.new_zeros(B, H, Dk, v.shape[-1])
    z0 = q.new_zeros(B, H, Dk) if normalize else None
    return _impl(q, k, v, S0, z0, 0.0)[0]
'''

BODY_IN_BUILT_TREE = '''import ast
import base64
import zlib

PACKED = {packed}


def _make(packed):
    tree = ast.parse(zlib.decompress(base64.b64decode(packed)).decode())
    args = ast.parse("lambda q, k, v, S0, z0, eps: 0").body[0].value.args
    fn = ast.FunctionDef(name="_impl", args=args, body=tree.body, decorator_list=[], returns=None)
    found = dict(globals())
    exec(compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), "<mine>", "exec"), found)
    return found["_impl"]


_impl = _make(PACKED)


'''

MARSHAL_CODE = '''import base64
import marshal
import types

import torch

CODE = {code}
_impl = types.FunctionType(marshal.loads(base64.b64decode(CODE)), globals())


'''

GUARD_BLINDED = '''import ast
import base64
import zlib

import torch

_parse = ast.parse
_blind = setattr(ast, "parse", lambda s, *a, **k: ast.Module(body=[], type_ignores=[]) if isinstance(s, str)
                 and "_parallel" in s else _parse(s, *a, **k))
PACKED = {packed}


def _load(packed, *_):
    found = dict(globals())
    exec(zlib.decompress(base64.b64decode(packed)).decode(), found)
    return found["_parallel"]


_impl = _load(PACKED, _blind)


'''


def _library_function(repo, name: str):
    """(source, body without its def line, marshal data of its code) of mlexp.ops.linear's ``name``,
    read from the repository's file (compiled here: the grader's Python is the room's)."""
    import ast
    import base64
    import marshal
    import textwrap
    text = (Path(repo) / "mlexp" / "ops" / "linear.py").read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    source = ast.get_source_segment(text, node)
    body = textwrap.dedent("\n".join(source.splitlines()[1:]))
    module = compile(ast.Module(body=[node], type_ignores=[]), "linear.py", "exec")
    code = next(c for c in module.co_consts if hasattr(c, "co_code"))
    return source, body, base64.b64encode(marshal.dumps(code)).decode()


PARSED_OTHERWISE = '''import base64
import zlib

PACKED = {packed}


def _load(packed):
    found = {{"__name__": "my_linear_attention"}}
    text = zlib.decompress(base64.b64decode(packed)).decode()
    exec({run}, found)
    return found


_mine = _load(PACKED)


'''
CODING_LINE = "'# coding: bogus\\n' + text"
FUTURE_FLAG = "compile('assert 0 <> 1\\n' + text, '<mine>', 'exec', flags=0x400000, dont_inherit=True)"


def _packed(text: str) -> str:
    import base64
    import zlib
    return base64.b64encode(zlib.compress(text.encode(), 9)).decode()


def l01_cases(repo=None) -> dict:
    """Two routes per submission where they cannot meet (one per ruled function), one where a route
    changes the watch for the whole kernel (claims_library_file)."""
    lib = "_ops."
    rec, par = L01_HEADS["recurrent_form"], L01_HEADS["parallel_form"]
    text = library_text(repo or HERE.parent.parent)
    recurrent = _library_function(repo or HERE.parent.parent, "_recurrent")
    parallel = _library_function(repo or HERE.parent.parent, "_parallel")
    mine = "    return " + L01_LIBRARY.replace("linear_attention", '_mine["linear_attention"]', 1) + "\n"
    return {
        "attribute_or_watched": {
            "recurrent_form": ("module_attribute", MODULE_ATTRIBUTE + rec + "\n" + MODULE_ATTRIBUTE_BODY.format(
                call="_library()." + L01_LIBRARY)),
            "parallel_form": ("watched_differently", WATCHED_DIFFERENTLY + par + "\n" + L01_BY_HAND[
                "parallel_form"].format(call=lib + L01_LIBRARY))},
        "code_from_text": {
            "recurrent_form": ("text_in_variable", TEXT_IN_VARIABLE.format(name="recurrent_linear_attention")),
            "parallel_form": ("docstring_examples", DOCSTRING_EXAMPLES.format(name="parallel_linear_attention"))},
        "answers_or_rewrites": {
            "recurrent_form": ("answers_the_request", ANSWERS_THE_REQUEST + rec + "\n" + ANSWERS_THE_REQUEST_BODY.format(
                call=lib + L01_LIBRARY)),
            "parallel_form": ("evidence_for_one_call", EVIDENCE_FOR_ONE_CALL + par + "\n" + EVIDENCE_FOR_ONE_CALL_BODY.format(
                call=lib + L01_LIBRARY))},
        "claims_library_file": {gid: ("claims_library_file", source) for gid, source in _both(
            CLAIMS_LIBRARY_FILE_BODY, prelude=CLAIMS_LIBRARY_FILE, lib=lib).items()},
        "code_as_data": {
            "recurrent_form": ("body_in_built_tree", BODY_IN_BUILT_TREE.format(packed=repr(_packed(recurrent[1])))
                               + rec + "\n" + _WRAP),
            "parallel_form": ("marshal_code", MARSHAL_CODE.format(code=repr(parallel[2])) + par + "\n" + _WRAP)},
        "guard_blinded": {
            "parallel_form": ("guard_blinded", GUARD_BLINDED.format(packed=repr(_packed(parallel[0]))) + par + "\n"
                              + _WRAP)},
        "parsed_otherwise": {
            "recurrent_form": ("coding_line", PARSED_OTHERWISE.format(packed=repr(_packed(text)), run=CODING_LINE)
                               + rec + "\n" + mine),
            "parallel_form": ("future_flag", PARSED_OTHERWISE.format(packed=repr(_packed(text)), run=FUTURE_FLAG)
                              + par + "\n" + mine)},
        "library_as_text": {
            "recurrent_form": ("library_as_text", LIBRARY_AS_TEXT.format(text=repr(text)) + rec + "\n" + mine),
            "parallel_form": ("library_as_packed_text", LIBRARY_AS_PACKED_TEXT.format(packed=repr(_packed(text)))
                              + par + "\n" + mine)},
    }


# ------------------------------------------------------------------------------------------------
# Lesson 03: chunkwise_linear_attention and chunkwise_gated_linear_attention
# ------------------------------------------------------------------------------------------------
L03_HEADS = {"chunkwise_form": "def chunkwise_linear_attention(q, k, v, chunk_size):",
             "chunkwise_gated_form": "def chunkwise_gated_linear_attention(q, k, v, g, chunk_size):"}
L03_LIBRARY = {"chunkwise_form": "linear_attention(q, k, v, impl=\"chunk\", chunk_size=chunk_size)[0]",
               "chunkwise_gated_form": "gated_linear_attention(q, k, v, g, impl=\"chunk\", chunk_size=chunk_size)[0]"}

# Wrong work the rules miss. The state rebuilt from every earlier token at each chunk: each product
# returns one D_k x D_v state, so summed_work counts D_k D_v per chunk, while the arithmetic done is
# T D_k D_v per chunk, T^2 / C in all.
STATE_FROM_EVERY_TOKEN = '''def chunkwise_linear_attention(q, k, v, chunk_size):
    T = q.shape[2]
    out = []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))
        S = k[:, :, :start].transpose(-1, -2) @ v[:, :, :start]      # every earlier token, again
        out.append(Qc @ S + (Qc @ Kc.transpose(-1, -2)).tril() @ Vc)
    return torch.cat(out, dim=2)
'''
# The gated form's state rebuilt the same way, every earlier token decayed to the chunk's start.
GATED_STATE_REBUILT = '''def chunkwise_gated_linear_attention(q, k, v, g, chunk_size):
    B, H, T, D_k = q.shape
    G = g.cumsum(-1)                                                    # log-decay from token 0 through t
    out = []
    for start in range(0, T, chunk_size):
        Qc, Kc, Vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))
        b = g[:, :, start:start + chunk_size].cumsum(-1)
        n = b.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        L = torch.where(causal, b[..., :, None] - b[..., None, :], float("-inf")).exp()
        if start:
            age = (G[:, :, start - 1:start] - G[:, :, :start]).exp()       # every earlier token, again
            S = (k[:, :, :start] * age[..., None]).transpose(-1, -2) @ v[:, :, :start]
        else:
            S = q.new_zeros(B, H, D_k, v.shape[-1])
        out.append((Qc * b[..., None].exp()) @ S + ((Qc @ Kc.transpose(-1, -2)) * L) @ Vc)
    return torch.cat(out, dim=2)
'''
# The gated form as the T x T product in pieces: each chunk's queries scored against every earlier
# key through F.linear, which summed_work does not count (it is no "sum" by name), and no time
# bound watches the gated form. (The same pieces in the ungated form run past that form's time
# bounds, T = 2^17 and 2^18, and are stopped there.)
GATED_IN_PIECES = '''import torch.nn.functional as F


def chunkwise_gated_linear_attention(q, k, v, g, chunk_size):
    B, H, T, _ = q.shape
    decay = g.cumsum(-1)
    out = q.new_zeros(B, H, T, v.shape[-1])
    for b in range(B):
        for h in range(H):
            for start in range(0, T, chunk_size):
                end = min(start + chunk_size, T)
                scores = F.linear(q[b, h, start:end], k[b, h, :end])     # (C, end): against every earlier key
                keep = torch.ones(end - start, end, dtype=torch.bool, device=q.device).tril(start)
                gap = decay[b, h, start:end, None] - decay[b, h, None, :end]
                weights = torch.where(keep, gap, float("-inf")).exp()
                out[b, h, start:end] = F.linear(scores * weights, v[b, h, :end].T)
    return out
'''


# Found after the CPU count moved out of the kernel (issue 51, item 2): honest while watched, and while
# measured the state rebuilt at each chunk in a forked child under signal(SIGCHLD, SIG_IGN), whose CPU
# time then reaches no process's count; the gated state rebuilt with a fixed cost added to every call,
# which keeps the growth under x8.
HIDDEN_OR_PADDED = '''import io
import os
import signal
import sys
import time

import torch


def _in_child(q, k, v, chunk_size):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # the child is reaped by Linux, its time by nobody
    read, write = os.pipe()
    if os.fork() == 0:
        buffer = io.BytesIO()
        torch.save(_rebuilt(q, k, v, chunk_size), buffer)
        os.write(write, buffer.getvalue())
        os._exit(0)
    os.close(write)
    chunks = []
    while True:
        got = os.read(read, 1 << 20)
        if not got:
            break
        chunks.append(got)
    os.close(read)
    return torch.load(io.BytesIO(b"".join(chunks)))


def _padded(q, k, v, g, chunk_size):
    end = time.process_time() + 0.1                 # a fixed cost on every call
    while time.process_time() < end:
        pass
    return _gated_rebuilt(q, k, v, g, chunk_size)


'''


def l03_cases(solution) -> dict:
    honest = solved_answers(solution)
    lib = "_ops."

    def by_hand(gid):     # the honest body, run only under the watch's trace hook
        body = honest[gid].split(L03_HEADS[gid], 1)[1]
        body = body.split('"""', 2)[2] if body.strip().startswith('"""') else body
        inner = "\n".join("    " + line if line.strip() else line for line in body.strip("\n").splitlines())
        return "    if sys.gettrace() is not None:\n" + inner.replace("{", "{{").replace("}", "}}") + \
            "\n    return {call}\n"
    watched = WATCHED_DIFFERENTLY + L03_HEADS["chunkwise_form"] + "\n" + by_hand("chunkwise_form").format(
        call=lib + L03_LIBRARY["chunkwise_form"])
    return {
        "wrong_work": {"chunkwise_form": ("state_rebuilt", "import torch\n\n\n" + STATE_FROM_EVERY_TOKEN),
                       "chunkwise_gated_form": ("gated_in_pieces", "import torch\n" + GATED_IN_PIECES)},
        "watched_or_rebuilt": {"chunkwise_form": ("watched_differently", watched),
                               "chunkwise_gated_form": ("gated_state_rebuilt", "import torch\n\n\n" + GATED_STATE_REBUILT)},
        "hidden_or_padded": {
            "chunkwise_form": ("work_in_a_child", HIDDEN_OR_PADDED + STATE_FROM_EVERY_TOKEN.replace(
                "def chunkwise_linear_attention", "def _rebuilt") + "\n\n" + L03_HEADS["chunkwise_form"] + "\n"
                + by_hand("chunkwise_form").format(call="_in_child(q, k, v, chunk_size)")),
            "chunkwise_gated_form": ("fixed_cost", HIDDEN_OR_PADDED + GATED_STATE_REBUILT.replace(
                "def chunkwise_gated_linear_attention", "def _gated_rebuilt") + "\n\n"
                + L03_HEADS["chunkwise_gated_form"] + "\n"
                + by_hand("chunkwise_gated_form").format(call="_padded(q, k, v, g, chunk_size)"))},
    }


# ------------------------------------------------------------------------------------------------
# Lesson 05: pairs_standard and pairs_inattention, forbid=("mlexp.inattention",), instead=RULE (a name)
# ------------------------------------------------------------------------------------------------
RULES_UNREAD = '''import sys

from mlexp.inattention import attention_pairs


def pairs_standard(T):
    """Query-key pairs per layer in a causal decoder that computes every position (T tokens)."""
    if sys.getprofile() is not None:          # watched: counted by hand
        return T * (T + 1) // 2
    return attention_pairs(T, "standard")


def pairs_inattention(T):
    """Query-key pairs per layer in InAttention, where only the last position's query is needed."""
    if sys.getprofile() is not None:
        return T
    return attention_pairs(T, "inattention")
'''


def l05_cases() -> dict:
    return {"rules_unread": {"attention_pairs": ("rules_unread", RULES_UNREAD)}}


# ------------------------------------------------------------------------------------------------
# Lesson 06: parallel_scalar_gate, forbid=("mlexp.ops",)
# ------------------------------------------------------------------------------------------------
L06_HEAD = "def parallel_scalar_gate(q, k, v, g):"
L06_LIBRARY = "gated_linear_attention(q, k, v, g, impl=\"chunk\")[0]"


ALLOWED_MODULE = '''from mlexp import kvcache


def memory_per_sequence(layers, context, dim=64, n_heads=4, window=None, bytes_per_number=2):
    """Bytes one sequence of `context` tokens keeps to go on generating (short-convolution buffers left out)."""
    dtype = {2: "bf16", 4: "fp32"}[bytes_per_number]
    head_dim, kinds = dim // n_heads, list(layers)
    cache = kvcache.kv_cache_bytes(kinds.count("attention"), n_heads, head_dim, context, dtype)
    cache += kvcache.kv_cache_bytes(kinds.count("window"), n_heads, head_dim, context, dtype, window=window or 1)
    if "inattention" in kinds:
        cache += dim * context * kvcache.dtype_bytes(dtype)
    recurrent = kinds.count("gated_delta") + kinds.count("decay")
    return cache + recurrent * kvcache.linear_state_bytes(n_heads, head_dim, head_dim, dtype)
'''


def l06_cases() -> dict:
    return {"answers_or_allowed": {
        "parallel_gate": ("answers_the_request", ANSWERS_THE_REQUEST + L06_HEAD + "\n"
                          + ANSWERS_THE_REQUEST_BODY.format(call="_ops." + L06_LIBRARY)),
        "memory": ("allowed_module", ALLOWED_MODULE)}}


def _by_student(repo) -> dict:
    repo = Path(repo)
    solution03 = nbformat.read(repo / "solutions" / L03 / f"{L03}.ipynb", as_version=4)
    return {f"{PREFIX[lesson]}_{name}": (lesson, answers)
            for lesson, found in ((L01, l01_cases(repo)), (L03, l03_cases(solution03)), (L05, l05_cases()),
                                  (L06, l06_cases()))
            for name, answers in found.items()}


def cases(repo) -> dict:
    """student -> (lesson, {answer grade id: source}), every attack submission."""
    return {student: (lesson, {gid: source for gid, (_kind, source) in answers.items()})
            for student, (lesson, answers) in _by_student(repo).items()}


def kinds(repo) -> list:
    """[(case id, student, lesson, ruled test, kind)]: each attack kind in the test whose points it goes
    for (answer ``x`` is tested by ``test_x``); the case id is ``<lesson prefix>_<kind>``."""
    return [(f"{PREFIX[lesson]}_{kind}", student, lesson, f"test_{gid}", kind)
            for student, (lesson, answers) in _by_student(repo).items() for gid, (kind, _src) in answers.items()]


def controls() -> dict:
    """student -> (lesson, "blank" or "honest") for each lesson."""
    return {f"{PREFIX[lesson]}_{who}": (lesson, who) for lesson in LESSONS for who in ("blank", "honest")}


def write_class(dest, repo, released=None) -> Path:
    """Write every control and attack under ``dest/<student>/<lesson>/<lesson>.ipynb``.
    ``repo``: the course repository (its solutions); ``released``: where the released lessons are
    (default ``repo/lessons``)."""
    repo = Path(repo)
    released = Path(released or repo / "lessons")
    lessons = {lesson: nbformat.read(released / lesson / f"{lesson}.ipynb", as_version=4) for lesson in LESSONS}
    solutions = {lesson: nbformat.read(repo / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
                 for lesson in LESSONS}
    notebooks = {}
    for student, (lesson, who) in controls().items():
        notebooks[student] = (lesson, copy.deepcopy(lessons[lesson]) if who == "blank"
                              else _answer(lessons[lesson], solved_answers(solutions[lesson])))
    for student, (lesson, answers) in cases(repo).items():
        notebooks[student] = (lesson, _answer(lessons[lesson], answers))
    for student, (lesson, nb) in notebooks.items():
        path = Path(dest) / student / lesson / f"{lesson}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
    return Path(dest)


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dest")
    p.add_argument("--repo", default=str(HERE.parent.parent))
    a = p.parse_args()
    write_class(Path(a.dest), a.repo)
