"""Loops a ruled function certainly runs over the tokens, read from its source (autograder.engine.audit).

:func:`sequence_loops` finds, in one parsed ``def``, the loops that take a turn per token (or per
chunk of tokens): the exercise rules "no loop over t" and "no loop over the tokens of a chunk" are
read from it where the reading is certain. What is certain is kept narrow: the course's kernels take
(B, H, T, ...) tensors as their first three arguments, so dimension 2 of those, and of names bound
only to casts, copies and slices of them, is the sequence (:class:`_Sequence`); after a reshape, a
transpose or anything the reading does not follow, nothing is assumed.
"""
from __future__ import annotations

import ast

__all__ = ["sequence_loops", "LOOPING_CALLS"]

# Calls that run a function once per item of what they are given: a loop written as a call.
LOOPING_CALLS = {"map", "filter", "reduce", "functools.reduce", "itertools.accumulate", "accumulate",
                 "itertools.starmap", "starmap"}
SEQUENCE_DIM = 2        # the course's tensors are (B, H, T, ...): the tokens are dimension 2
TENSOR_ARGS = 3         # the first three arguments of a ruled kernel are (B, H, T, D) tensors


KEEPS = {"float", "double", "half", "to", "type", "contiguous", "clone", "detach", "cpu", "numpy",
         "requires_grad_", "tril", "triu", "exp", "abs", "neg", "sigmoid", "softmax", "masked_fill", "clamp",
         "relu", "sqrt", "square"}                      # methods that give the same tensor's dimensions
ARRAYS = {"asarray", "array", "ascontiguousarray", "as_tensor", "tensor", "from_numpy"}
MODULES = {"np", "numpy", "torch"}


def _bindings(fn) -> dict:
    """{name: [value node, or None for a binding the reading does not follow]} of ``fn``'s own body
    (nested functions and lambdas bind names of their own); a tuple target takes the matching item
    of a tuple value, or of a generator over a tuple (``a, b = (x.numpy() for x in (q, k))``)."""
    out = {}

    def bind(target, value):
        if isinstance(target, ast.Name):
            out.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = None
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                items = value.elts
            elif isinstance(value, (ast.GeneratorExp, ast.ListComp)) and len(value.generators) == 1 \
                    and isinstance(value.generators[0].iter, (ast.Tuple, ast.List)) \
                    and isinstance(value.generators[0].target, ast.Name) and not value.generators[0].ifs \
                    and len(value.generators[0].iter.elts) == len(target.elts):
                gen = value.generators[0]
                items = [_Substituted(value.elt, gen.target.id, e) for e in gen.iter.elts]
            for i, t in enumerate(target.elts):
                bind(t.value if isinstance(t, ast.Starred) else t, items[i] if items else None)
        elif isinstance(target, ast.Starred):
            bind(target.value, None)

    todo = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            if not isinstance(node, ast.Lambda):
                out.setdefault(node.name, []).append(None)
            continue
        if isinstance(node, ast.Assign):
            for t in node.targets:
                bind(t, node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            bind(node.target, node.value)
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension)):
            bind(node.target, None)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            bind(node.optional_vars, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out.setdefault((a.asname or a.name).split(".")[0], []).append(None)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.setdefault(node.name, []).append(None)
        elif isinstance(node, (ast.Global, ast.Nonlocal, ast.Delete)):
            for n in getattr(node, "names", []) or [t.id for t in node.targets if isinstance(t, ast.Name)]:
                out.setdefault(n, []).append(None)
        todo.extend(ast.iter_child_nodes(node))
    return out


class _Substituted:
    """The element of a generator over a tuple for one item: ``x.numpy()`` with ``x`` that item."""

    def __init__(self, expr, var, item):
        self.expr, self.var, self.item = expr, var, item


def _trusted(fn, params) -> set:
    """The names of ``fn`` that certainly hold one of its (B, H, T, ...) tensor parameters
    ``params`` (dimension 2 the tokens, or a slice of them): the parameters, and names bound only
    to such a tensor cast, copied, converted to numpy, sliced or multiplied on the right (``q.double()``,
    ``k.numpy()``, ``q[:, :, s:e]``, ``x * scale``, ``q @ k.transpose(-1, -2)``), in any number of steps. A name also bound to anything else
    (a reshape, a transpose, a loop target) is not."""
    bound = _bindings(fn)
    trusted = {p for p in params if p not in bound}
    for _ in range(6):
        more = {name for name, values in bound.items()
                if (name in params or name not in trusted) and values
                and all(v is not None and _keeps(v, trusted | ({name} if name in params else set()))
                        for v in values)}
        if more <= trusted:
            break
        trusted |= more
    return trusted


def _keeps(node, trusted, env=None) -> bool:
    """``node`` has the dimensions of a tensor a ``trusted`` name holds (see :func:`_trusted`)."""
    env = env or {}
    if isinstance(node, _Substituted):
        return _keeps(node.expr, trusted, {**env, node.var: node.item})
    if isinstance(node, ast.Name):
        return _keeps(env[node.id], trusted) if node.id in env else node.id in trusted
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        if f.attr in KEEPS and not (isinstance(f.value, ast.Name) and f.value.id in MODULES):
            return _keeps(f.value, trusted, env)
        if f.attr in ARRAYS and isinstance(f.value, ast.Name) and f.value.id in MODULES and node.args:
            return _keeps(node.args[0], trusted, env)
        return False
    if isinstance(node, ast.Subscript):
        index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return _keeps(node.value, trusted, env) and all(isinstance(i, ast.Slice) for i in index)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):     # (B, H, T, D) @ (.., D, X): its T rows
        return _keeps(node.left, trusted, env)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.Add, ast.Sub)):
        sides = (node.left, node.right)
        return any(_keeps(s, trusted, env) for s in sides) and \
            any(isinstance(s, ast.Constant) and isinstance(s.value, (int, float)) for s in sides)
    return False


class _Sequence:
    """What in one function is certainly the sequence's length: ``X.shape[2]``, ``X.size(2)``
    (and ``-2``), the third name of ``B, H, T, D = X.shape``, for ``X`` one of the function's
    first three parameters (q, k, v in every ruled kernel, four-dimensional) or a name bound only
    to a cast, copy or slice of one (:func:`_trusted`), and every local name computed from one of
    them (``T = q.shape[2]``, ``n = (T + C - 1) // C``)."""

    def __init__(self, fn):
        args = fn.args.posonlyargs + fn.args.args
        self.trusted = _trusted(fn, [a.arg for a in args[:TENSOR_ARGS]])
        self.rank = {name: 4 for name in self.trusted}
        self.names = set()            # names computed from the length
        self.exact = set()            # names bound to the length itself (T, not T // C)
        assigns = [n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                   and n.value is not None]
        for _ in range(4):            # names computed from names computed from the length
            for node in assigns:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Tuple) and self._shape_of(node.value) in self.trusted:
                        elts = target.elts
                        if len(elts) > SEQUENCE_DIM and isinstance(elts[SEQUENCE_DIM], ast.Name) \
                                and not any(isinstance(e, ast.Starred) for e in elts[:SEQUENCE_DIM + 1]):
                            self.names.add(elts[SEQUENCE_DIM].id)
                            self.exact.add(elts[SEQUENCE_DIM].id)
                    elif isinstance(target, ast.Name) and self.derived(node.value):
                        self.names.add(target.id)
                        if isinstance(node, ast.Assign) and self.is_length(node.value):
                            self.exact.add(target.id)

    @staticmethod
    def _shape_of(node) -> str:
        """The name whose shape ``node`` is (``q.shape``, ``q.size()``), or ""."""
        if isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "size":
            node = node.func
        elif isinstance(node, ast.Attribute) and node.attr == "shape":
            pass
        else:
            return ""
        return node.value.id if isinstance(node.value, ast.Name) else ""

    def _is_length(self, node) -> bool:
        """``node`` is the size of a tensor's sequence dimension."""
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and \
                node.value.attr == "shape" and isinstance(node.value.value, ast.Name):
            name, index = node.value.value.id, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size" \
                and isinstance(node.func.value, ast.Name) and (node.args or node.keywords):
            name, index = node.func.value.id, node.args[0] if node.args else node.keywords[0].value
        else:
            return False
        try:
            i = ast.literal_eval(index)
        except (ValueError, TypeError, SyntaxError):
            return False
        if not isinstance(i, int) or name not in self.trusted:
            return False
        return i == SEQUENCE_DIM or (i < 0 and self.rank[name] + i == SEQUENCE_DIM)

    def is_length(self, node) -> bool:
        """``node`` is the sequence's length itself (``q.shape[2]``, or a name bound to it)."""
        return self._is_length(node) or (isinstance(node, ast.Name) and node.id in self.exact)

    def derived(self, node) -> bool:
        """``node`` is computed from the sequence's length."""
        return any(self._is_length(n) or (isinstance(n, ast.Name) and n.id in self.names)
                   for n in ast.walk(node))

    def over(self, node, per_token: bool = False) -> bool:
        """Iterating ``node`` takes one turn per token (or, unless ``per_token``, per chunk of
        tokens): ``range`` of the length (with a step of 1 when ``per_token``), a tensor split or
        unbound along the sequence, a tensor whose sequence dimension was moved first
        (``np.moveaxis(x, 2, 0)``, ``x.transpose(0, 2)``, ``x.permute(2, ...)``, sliced on after
        it), ``zip``/``enumerate``/``reversed`` of one of those."""
        if isinstance(node, ast.Subscript) and _keeps_first(node.slice):
            return self.over(node.value, per_token)
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        if isinstance(f, ast.Name) and f.id == "range":
            if not per_token:
                return any(self.derived(a) for a in node.args)
            stop = node.args[0] if len(node.args) == 1 else node.args[1] if len(node.args) > 1 else None
            step = node.args[2] if len(node.args) > 2 else None     # a turn per token: up to T, by 1
            return stop is not None and self.is_length(stop) and \
                (step is None or (isinstance(step, ast.Constant) and step.value == 1))
        wrapper = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if wrapper in WRAPPERS:
            return any(self.over(a, per_token) for a in node.args[:None if wrapper == "zip" else 1])
        if self.moved_first(node):
            return True
        if isinstance(f, ast.Attribute) and f.attr in ("unbind", "split"):
            on_module = isinstance(f.value, ast.Name) and f.value.id in MODULES     # torch.unbind(q, 2)
            args = node.args[1:] if on_module else node.args
            tensor = node.args[0] if on_module and node.args else f.value
            if on_module and not node.args:
                return False
            dim = [k.value for k in node.keywords if k.arg == "dim"] or args[1 if f.attr == "split" else 0:][:1]
            if per_token and f.attr == "split" and not (args and isinstance(args[0], ast.Constant)
                                                        and args[0].value == 1):
                return False
            try:
                d = ast.literal_eval(dim[0]) if dim else 0
            except (ValueError, TypeError, SyntaxError):
                return False
            return isinstance(d, int) and d in (SEQUENCE_DIM, SEQUENCE_DIM - 4) and _keeps(tensor, self.trusted)
        return False

    def moved_first(self, node) -> bool:
        """``node`` is a tensor of the function's (:func:`_trusted`) with the sequence's dimension
        moved to the front, so that iterating it takes a turn per token: ``np.moveaxis(x, 2, 0)``,
        ``x.movedim(2, 0)``, ``x.transpose(0, 2)``, ``np.swapaxes(x, 2, 0)``, ``x.permute(2, 0, 1, 3)``."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MOVES):
            return False
        on_module = isinstance(node.func.value, ast.Name) and node.func.value.id in MODULES
        tensor = node.args[0] if on_module and node.args else None if on_module else node.func.value
        if tensor is None or not _keeps(tensor, self.trusted):
            return False
        args = _literals(node.args[1:] if on_module else node.args)
        if len(args) == 1 and isinstance(args[0], (tuple, list)):          # x.permute((2, 0, 1, 3))
            args = list(args[0])
        if not args or not all(isinstance(a, int) for a in args):
            return False
        if node.func.attr in ("moveaxis", "movedim"):
            return args[:2] == [SEQUENCE_DIM, 0]
        if node.func.attr in ("swapaxes", "swapdims") or (node.func.attr == "transpose" and len(args) == 2):
            return sorted(args[:2]) == [0, SEQUENCE_DIM]
        return args[0] == SEQUENCE_DIM                                    # permute, numpy's transpose(axes)


MOVES = {"moveaxis", "movedim", "swapaxes", "swapdims", "transpose", "permute"}
WRAPPERS = {"zip", "enumerate", "reversed", "list", "tuple", "iter", "tqdm", "trange"}   # iterate what they get


def _literals(nodes) -> list:
    try:
        return [ast.literal_eval(n) for n in nodes]
    except (ValueError, TypeError, SyntaxError):
        return []


def _keeps_first(index) -> bool:
    """Indexing with ``index`` keeps the first dimension as it is (``[..., None]``, ``[:, :, 1:]``)."""
    first = index.elts[0] if isinstance(index, ast.Tuple) and index.elts else index
    return (isinstance(first, ast.Constant) and first.value is Ellipsis) or \
        (isinstance(first, ast.Slice) and first.lower is None and first.upper is None and first.step is None)


def _walk_own(fn, names):
    """ast.walk of ``fn``, without the bodies of the functions and lambdas nested in it that
    rebind one of ``names`` (their ``q`` is another tensor: ``q.shape[2]`` there is not known)."""
    todo = [fn]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = child.args
                own = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
                own |= {n.id for n in ast.walk(child) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                if own & names:
                    continue
            todo.append(child)


def sequence_loops(fn, per_token: bool = False) -> list:
    """[(line, what)] for each loop of the function ``fn`` (a parsed ``def``) that certainly runs
    once per token, or per chunk of tokens: a ``for``, a comprehension or a looping call
    (``map``, ``functools.reduce``) over ``range`` of the sequence's length or over a tensor
    unbound along the sequence, and a ``while`` whose test compares with that length
    (:class:`_Sequence` says what the length is). A loop over heads, the batch, the features, a
    fixed range or a literal tuple is not one; nor is a call of the function itself, or a list
    it appends to. ``per_token``: only the loops that take a turn per token (a loop over chunks
    is the chunkwise form; a ``while`` is not read then). What this cannot be sure of is not
    judged."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    seq, found = _Sequence(fn), []
    for sub in _walk_own(fn, set(seq.rank) | seq.names):
        if isinstance(sub, (ast.For, ast.AsyncFor)) and seq.over(sub.iter, per_token):
            found.append((sub.lineno, f"for ... in {ast.unparse(sub.iter)[:60]}"))
        elif isinstance(sub, ast.While) and not per_token and seq.derived(sub.test):
            found.append((sub.lineno, f"while {ast.unparse(sub.test)[:60]}"))
        elif isinstance(sub, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            found += [(sub.lineno, f"a comprehension over {ast.unparse(gen.iter)[:60]}")
                      for gen in sub.generators if seq.over(gen.iter, per_token)]
        elif isinstance(sub, ast.Call) and isinstance(sub.func, (ast.Name, ast.Attribute)) and \
                ast.unparse(sub.func) in LOOPING_CALLS and any(seq.over(a, per_token) for a in sub.args):
            found.append((sub.lineno, f"{ast.unparse(sub.func)[:60]}(...) over the sequence"))
    return sorted(set(found))
