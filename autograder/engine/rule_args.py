"""The arguments of an exercise rule's call in a test cell, read without running the cell.

A lesson's test states a rule as a call of :mod:`mlexp.rules` (``rules.write_it_yourself(fn, ...,
forbid=("mlexp.ops",), instead=RULE)``); the trusted side reads which function it rules and
what it forbids from the test cell's source (autograder.engine.audit, autograder.engine.room), and
``build --check`` reports a rule it cannot read as the author's error
(autograder.publishing.build.unread_rules). What is read: literals, f-strings, tuples and
arithmetic of those, and names the test cell itself binds once, at its top level, before the
statement that makes the call; a name the cell does not bind would be the student's, fetched
from the kernel when the test runs, so it is never assumed.
"""
from __future__ import annotations

import ast

__all__ = ["rule_calls"]


class Unread(Exception):
    """An argument the trusted side cannot evaluate without running the cell (the reason)."""


def rule_calls(tree: ast.Module, rules, problems: list | None = None) -> list:
    """[(function name, forbid modules, instead, rule, over)] of each call of one of ``rules``
    (function names) in the parsed test cell ``tree`` (``over``: the ``over=`` of a ``no_loop``,
    "t" when not given; for a ``uses_argument``, the ``name=`` of the argument it says is used).

    A rule's ``forbid``, ``instead``, ``over`` and ``name`` are read as the trusted side can evaluate them
    without running the cell: literals, f-strings, tuples and arithmetic of those, and names the
    cell itself binds, once, at its top level (``X = ...`` or ``A, B = ..., ...``), to such a value
    before the statement that makes the call (a name the cell does not bind would be the
    student's). A rule call that cannot be read so (its function is not a plain name, an argument
    is anything else, a ``**`` that may hold one of them) is not returned: ``problems``, when
    given, gets a line for each, naming the argument and why (``build --check`` reports them as
    the lesson author's errors); so does a rule function of mlexp.rules imported under another
    name or used other than by calling it, whose calls would not be read as a rule at all."""
    found = []
    binds, simple = {}, {}        # name -> times bound anywhere; name -> (statement, value node)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [(node.asname or node.name).split(".")[0]]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names = list(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names = [node.name]
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names = [node.name]
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names = [node.rest]
        for name in names:
            binds[name] = binds.get(name, 0) + 1
    for index, stmt in enumerate(tree.body):
        pairs = []
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                pairs = [(target, stmt.value)]
            elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(stmt.value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(stmt.value.elts):
                pairs = list(zip(target.elts, stmt.value.elts))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            pairs = [(stmt.target, stmt.value)]
        for target, value in pairs:
            if isinstance(target, ast.Name):
                simple[target.id] = (index, value)

    def value(node, before, depth=0):
        if depth > 20:
            raise Unread("it is nested too deeply")
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [value(e, before, depth + 1) for e in node.elts]
            return tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.Name):
            if binds.get(node.id) != 1 or node.id not in simple:
                raise Unread(f"`{node.id}` is not bound once, to a value, at the cell's top level"
                             if node.id in binds else f"`{node.id}` is not bound in the test cell")
            index, bound = simple[node.id]
            if index >= before:
                raise Unread(f"`{node.id}` is bound after the statement that reads it")
            return value(bound, index, depth + 1)
        if isinstance(node, ast.JoinedStr):
            return "".join(value(part, before, depth + 1) for part in node.values)
        if isinstance(node, ast.FormattedValue):
            got = value(node.value, before, depth + 1)
            got = {115: str, 114: repr, 97: ascii}.get(node.conversion, lambda v: v)(got)
            spec = value(node.format_spec, before, depth + 1) if node.format_spec is not None else ""
            try:
                return format(got, spec)
            except (TypeError, ValueError) as exc:
                raise Unread(f"its format does not apply ({exc})") from None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            got = value(node.operand, before, depth + 1)
            if isinstance(got, (int, float)) and not isinstance(got, bool):
                return -got if isinstance(node.op, ast.USub) else got
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div,
                                                                ast.FloorDiv, ast.Mod, ast.Pow)):
            left, right = value(node.left, before, depth + 1), value(node.right, before, depth + 1)
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
            if numbers and not (isinstance(node.op, ast.Pow) and abs(right) > 64):
                try:
                    return {ast.Add: lambda: left + right, ast.Sub: lambda: left - right,
                            ast.Mult: lambda: left * right, ast.Div: lambda: left / right,
                            ast.FloorDiv: lambda: left // right, ast.Mod: lambda: left % right,
                            ast.Pow: lambda: left ** right}[type(node.op)]()
                except (ArithmeticError, ValueError) as exc:
                    raise Unread(f"its arithmetic fails ({exc})") from None
            if isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str):
                return left + right
        raise Unread(f"`{ast.unparse(node)[:60]}` is not a value the grader can read without running the cell")

    statement_of = {}
    for index, stmt in enumerate(tree.body):
        for node in ast.walk(stmt):
            statement_of.setdefault(id(node), index)
    if problems is not None:
        problems += _renamed(tree, rules)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name not in rules:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        spread = any(k.arg is None for k in node.keywords)
        if name == "call" and "forbid" not in kw:
            continue               # rules.call without forbid states no rule (and other .call()s)
        call = f"{ast.unparse(f)}({ast.unparse(node.args[0]) if node.args else ''}, ...)"
        needed = ("forbid",) + (("instead",) if name != "call" else ()) + (("over",) if name == "no_loop" else ()) \
            + (("name",) if name == "uses_argument" else ())
        got, problem = {}, ""
        if not node.args or not isinstance(node.args[0], ast.Name):
            problem = "its function (the first argument) is not a plain name"
        elif spread and any(k not in kw for k in needed):
            problem = f"its ** may hold {' or '.join(k + '=' for k in needed if k not in kw)}"
        for k in ("forbid", "instead", "over", "name") if not problem else ():
            if k in kw:
                try:
                    got[k] = value(kw[k], statement_of.get(id(node), len(tree.body)))
                except Unread as exc:
                    problem = f"its {k}={ast.unparse(kw[k])[:80]}: {exc}"
                    break
        forbid = got.get("forbid", ())
        if not problem and not (isinstance(forbid, (tuple, list)) and all(isinstance(m, str) for m in forbid)):
            problem = f"its forbid= is {forbid!r}, not a tuple of module names"
        if not problem and not all(isinstance(got.get(k, ""), str) for k in ("instead", "over", "name")):
            problem = "its instead=, over= or name= is not text"
        if not problem and name == "uses_argument" and not got.get("name"):
            problem = "it does not say which argument (name=)"
        if problem:
            if problems is not None:
                problems.append(f"the rule {call} cannot be read: {problem}")
            continue
        if forbid or name in ("no_loop", "uses_argument"):
            found.append((node.args[0].id, tuple(forbid), got.get("instead", ""), name,
                          got["name"] if name == "uses_argument" else got.get("over", "t")))
    return found


def _renamed(tree: ast.Module, rules) -> list:
    """A rule function of mlexp.rules the cell imports under another name or uses other than by
    calling it (``w = rules.write_it_yourself``): its calls would not be read as a rule."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    modules, imported, said = {"mlexp.rules"}, set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "mlexp":
            modules |= {a.asname or a.name for a in node.names if a.name == "rules"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "mlexp.rules" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "mlexp.rules":
            for a in node.names:
                if a.name in rules and a.asname not in (None, a.name):
                    said.append(f"the rule {a.name} is imported as {a.asname}: its calls under that "
                                "name are not read")
                elif a.name in rules:
                    imported.add(a.name)
    for node in ast.walk(tree):
        ruled = (isinstance(node, ast.Attribute) and node.attr in rules and ast.unparse(node.value) in modules) \
            or (isinstance(node, ast.Name) and node.id in imported)
        if ruled and isinstance(node.ctx, ast.Load) and id(node) not in called:
            said.append(f"the rule {ast.unparse(node)} is used other than by calling it: its calls "
                        "through another name are not read")
    return said
