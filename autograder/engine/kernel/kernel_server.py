"""The kernel side of the grader's channel: a server answering the harness's requests.

:class:`KernelServer` runs inside the student's kernel. The harness (autograder.engine.calls
``KernelLink.install``) sends this module's source, after the codec's (:mod:`autograder.engine.kernel.wire` and
its parts), into the kernel as ``sys.modules["_autograder_wire"]``, where one server answers
each request cell (``kernel_request``) with a display message of type :data:`WIRE_MIME`. It is
part of the untrusted side: a student may replace it, which can only change the values of the
student's own names, never a test. Requests and replies are the kernel contract of
:mod:`autograder.engine.protocol`. A server built here on the trusted side (the in-process dry run,
:mod:`autograder.engine.dryrun`) answers from a namespace it is given, with tables of its own.
"""
import builtins
import json
import sys

if __package__:   # on the trusted side; in the kernel the codec's source runs ahead of this one
    from .measure import measure
    from .wire import WIRE_MIME, WireError, decode, encode, visible
    from .wire_format import _SURROGATE

__all__ = ["KernelServer", "kernel_safe_messages"]

_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})
_KERNEL_MANAGED = frozenset({"input", "raw_input", "getpass"})   # swapped at every execution


def _user_ns():
    from IPython import get_ipython
    shell = get_ipython()
    return shell.user_ns if shell is not None else sys.modules["__main__"].__dict__


def _publish(reply) -> None:
    from IPython.display import publish_display_data
    publish_display_data({WIRE_MIME: reply})


def _exception(exc) -> dict:
    names = [c.__name__ for c in type(exc).__mro__ if getattr(builtins, c.__name__, None) is c]
    return {"error": {"types": names, "type": visible(type(exc).__name__),
                      "message": visible(str(exc)[:2000])}}


def kernel_safe_messages() -> None:
    """Make this kernel's messages always sendable: a lone surrogate in any text it sends (a
    printed string, a traceback, a display) is written out as ``\\udXXX`` instead of making
    the kernel's message packer fail (ipykernel then prints its own traceback and sends
    nothing). Called once, when the grader sets up its channel."""
    from IPython import get_ipython
    from jupyter_client import jsonutil
    shell = get_ipython()
    session = getattr(getattr(shell, "kernel", None), "session", None)
    if session is None:
        return
    packer = session.pack

    def pack(obj):
        try:
            text = json.dumps(obj, default=jsonutil.json_default, ensure_ascii=False,
                              allow_nan=False)
        except (TypeError, ValueError):
            return packer(visible(jsonutil.json_clean(obj)))
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:   # inside a JSON string: written out, read back as text
            return _SURROGATE.sub(lambda m: f"\\\\u{ord(m[0]):04x}", text).encode("utf-8")

    session.pack = pack


def _parameter_names(fn, n: int) -> list:
    """The names of ``fn``'s first ``n`` positional parameters ("" where unknown)."""
    import inspect
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [str(x)[:40] for x in params[:n]] + [""] * max(0, n - len(params))


WATCHED_MODULES = ("builtins", "math", "operator", "functools", "cmath", "statistics", "json",
                   "numpy", "torch", "torch.nn.functional", "torch.linalg", "mlexp", "mlexp.ops",
                   "mlexp.rules", "mlexp.rules_sight",   # the watcher and its helpers: the rules' evidence
                   "mlexp.kvcache", "mlexp.capstone", "mlexp.inattention",   # modules rules forbid
                   "IPython.display", "IPython.core.display_functions")
# Of these, the library's own classes are watched too, with their methods (a watcher class
# swapped for a subclass whose report hides a call, or a method replaced on the class).
CLASS_MODULES = ("mlexp", "mlexp.")


def _watched_functions():
    """The functions tests and libraries rely on, by dotted name (and torch.Tensor's methods)."""
    import types
    found = {}
    for modname in WATCHED_MODULES:
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        for k, v in list(vars(mod).items()):
            if modname == "builtins" and k in _KERNEL_MANAGED:
                continue
            if callable(v) and not isinstance(v, (type, types.ModuleType)):
                found[f"{modname}.{k}"] = v
            elif isinstance(v, type) and modname.startswith(CLASS_MODULES):
                found[f"{modname}.{k}"] = v
                found.update({f"{modname}.{k}.{m}": _Member(f) for m, f in list(vars(v).items())
                              if callable(f) and not isinstance(f, type)})
    torch = sys.modules.get("torch")
    if torch is not None:
        found.update({f"torch.Tensor.{k}": v for k, v in vars(torch.Tensor).items() if callable(v)})
    return found


class _Member:
    """A method of a library class, as watched: compared by identity with the snapshot only
    (methods a library makes at import, such as a dataclass's ``__init__``, have no file of the
    library, so without a snapshot they cannot be told from the notebook's)."""
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


def _shell_hooks():
    """IPython's places where code can intercept a cell, each a list of what is registered."""
    from IPython import get_ipython
    shell = get_ipython()
    if shell is None:
        return {}
    hooks = {"IPython input transformers": list(shell.input_transformers_post)
             + list(shell.input_transformers_cleanup),
             "IPython AST transformers": list(shell.ast_transformers),
             # set_custom_exc wraps the handler in IPython's own function: compare what it catches
             "IPython custom exception handler": list(shell.custom_exceptions),
             "sys.settrace / sys.setprofile": [f for f in (sys.gettrace(), sys.getprofile()) if f]}
    for name in ("showtraceback", "showsyntaxerror", "run_cell", "run_ast_nodes", "run_code",
                 "transform_cell", "set_custom_exc"):
        own = vars(shell).get(name)    # a method replaced on the instance
        hooks[f"IPython shell.{name}"] = [own] if own is not None else []
    for event, callbacks in shell.events.callbacks.items():
        hooks[f"IPython event hook '{event}'"] = list(callbacks)
    # the way every reply leaves the kernel: any change to them is reported (CHANNEL_HOOKS)
    pub = getattr(shell, "display_pub", None)
    session = getattr(getattr(shell, "kernel", None), "session", None)
    hooks["IPython display publisher"] = [] if pub is None else \
        [x for x in (pub, vars(pub).get("publish")) if x is not None]
    hooks["the kernel's message session"] = [] if session is None else \
        [x for x in [session] + [vars(session).get(m) for m in ("send", "pack", "serialize", "sign")]
         if x is not None]
    return hooks


CHANNEL_HOOKS = ("IPython custom exception handler", "IPython display publisher",
                 "the kernel's message session")


def _install_dirs():
    import os
    import sysconfig
    dirs = {sys.prefix, sys.base_prefix, *sysconfig.get_paths().values()}
    mlexp = sys.modules.get("mlexp")
    if mlexp is not None and getattr(mlexp, "__file__", None):
        dirs.add(os.path.dirname(mlexp.__file__))
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def _from_notebook(obj) -> bool:
    """True when ``obj`` was written in the notebook (its code is not part of the Python
    installation, its libraries or mlexp): what a library does to itself on import, such as
    matplotlib's own IPython hooks or torch re-wrapping torch.manual_seed, is not the student's.
    A wrapper counts as written where any layer of it was: partials, bound methods and the
    ``__wrapped__`` chain that ``functools.wraps`` leaves (a ``contextlib.contextmanager`` made in
    the notebook is a function of contextlib wrapping the notebook's generator)."""
    import functools
    for _ in range(8):   # unwrap partials, bound methods and functools.wraps layers
        if _written_here(obj):
            return True
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif hasattr(obj, "__func__"):
            obj = obj.__func__
        elif callable(getattr(obj, "__wrapped__", None)):
            obj = obj.__wrapped__
        else:
            return False
    return True    # wrapped deeper than any library does


def _written_here(obj) -> bool:
    """``obj`` itself (not what it wraps) was written in the notebook."""
    import os
    code = getattr(obj, "__code__", None)
    if code is not None:
        return not os.path.realpath(code.co_filename).startswith(_install_dirs())
    if isinstance(obj, __import__("functools").partial) or hasattr(obj, "__func__"):
        return False    # a wrapper of the interpreter: what it holds is looked at next
    cls = obj if isinstance(obj, type) else type(obj)
    if cls.__module__ in ("builtins", "functools"):
        return False    # a function of the interpreter itself
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    return path is None or not os.path.realpath(path).startswith(_install_dirs())


class KernelServer:
    """Answers the harness's requests from one namespace (default: the IPython user namespace),
    with its own tables: the callables handed out as references (``refs``, by number), the
    calls kept for a backward pass (``graphs``) and the snapshot taken before the student's
    first cell (``before``)."""

    def __init__(self, namespace=None, publish=None):
        self.namespace = namespace or _user_ns
        self.publish = publish or _publish
        self.refs = []          # callables handed out as references, by number
        self.graphs = {}        # call number -> (input leaves, output tensors) for a backward pass
        self.before = {}        # what the notebook looked like before the student's first cell
        self._ops = {"lookup": lambda req: self.lookup(req.get("name")), "call": self.call,
                     "backward": self.backward, "snapshot": self.snapshot, "measure": lambda req: measure(self, req),
                     "tamper_report": self.tamper_report}

    error = staticmethod(_exception)    # an exception as a reply (the measured call's too)

    def answer(self, req: dict) -> dict:
        """The reply to one request (a dict): its op's reply, or the error it raised."""
        try:
            return self._ops[req["op"]](req)
        except Exception as exc:   # a malformed request or a failure of this helper itself
            return _exception(exc)

    def kernel_request(self, text: str) -> None:
        """Answer one request of the harness (JSON ``text``) with a display message of WIRE_MIME.

        Requests: ``{"op": "lookup", "name": ...}``, ``{"op": "call", "ref": n, "args": nodes,
        "kwargs": nodes, "grad": bool}``, ``{"op": "backward", "graph": n, "grads": nodes}``,
        ``{"op": "snapshot", "import": [...]}`` and ``{"op": "tamper_report"}``. Replies carry
        ``value`` (wire nodes), or ``error`` (the exception's built-in types and message), or
        ``missing`` / ``module`` for a lookup (autograder.engine.protocol.KernelReply), and the
        request's ``nonce``, echoed: the harness reads a reply only when it carries its request's
        nonce, is the cell's only reply and the cell then ends cleanly, so publishing is the last
        thing done here (KernelReply.of_request).
        """
        try:
            req = json.loads(text)
            reply = self.answer(req)
        except Exception as exc:   # not JSON
            req, reply = None, _exception(exc)
        nonce = req.get("nonce") if isinstance(req, dict) else None
        self.publish({**reply, "nonce": nonce} if isinstance(nonce, str) else reply)

    def kernel_request_file(self, path: str) -> None:
        """:meth:`kernel_request` for a large request, which the harness wrote to the file ``path``
        (in the folder it shares with the kernel for measured calls) instead of into the cell."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            self.publish(_exception(exc))
            return
        self.kernel_request(text)

    def lookup(self, name):
        """Answer a lookup of the student's global ``name``."""
        ns = self.namespace()
        if not isinstance(name, str) or name.startswith("_") or name in _IPYTHON_NAMES or name not in ns:
            return {"missing": True}
        value = ns[name]
        import types
        if isinstance(value, types.ModuleType):
            return {"module": getattr(value, "__name__", name)}
        try:
            return {"value": encode(value, kernel=True, refs=self.refs)}
        except WireError as exc:
            return {"value": {"t": "opaque", "type": visible(f"{type(value).__name__} ({exc})"[:150])}}

    def call(self, req):
        """Call the referenced callable with the decoded arguments; the reply carries the
        result, the tensor arguments as the call left them and, with ``grad``, a graph number."""
        import contextlib
        ref = req.get("ref")
        if type(ref) is not int or not 0 <= ref < len(self.refs):
            return {"error": {"types": ["LookupError"], "type": "LookupError",
                              "message": "the function is no longer available in the kernel"}}
        fn = self.refs[ref]
        leaves = {}
        torch = sys.modules.get("torch")
        try:
            args = decode(req["args"], leaves=leaves, modules=True)
            kwargs = decode(req["kwargs"], leaves=leaves, modules=True)
        except WireError as exc:
            return _exception(exc)
        grad = bool(req.get("grad")) and torch is not None
        mode = torch.set_grad_enabled(grad) if torch is not None else contextlib.nullcontext()
        watch, trace = req.get("watch"), None
        if isinstance(watch, list):   # the exercise's rules (mlexp.rules): watched where fn runs
            try:
                import importlib
                watcher = importlib.import_module("mlexp.rules").watching([str(m) for m in watch])
            except Exception:          # no mlexp here: the test side says the call was not watched
                watcher = None
        try:
            with mode:
                if isinstance(watch, list) and watcher is not None:
                    with watcher as trace:
                        result = fn(*args, **dict(kwargs))
                else:
                    result = fn(*args, **dict(kwargs))
        except KeyboardInterrupt:  # the harness's interrupt at a time limit ends the cell
            raise
        except BaseException as exc:   # the student's exception, sys.exit() too (the function
            return _exception(exc)     # cannot end the request cell before the reply), as data
        outputs = []
        try:
            reply = {"value": encode(result, kernel=True, refs=self.refs,
                                     grad_leaves=outputs if grad else None)}
            # Tensor arguments may have been changed in place: send them back (the harness fails
            # the call when one was; it never copies them into the test's tensors), with the names
            # of the parameters they were bound to, for its message.
            tensors = [a if torch is not None and isinstance(a, torch.Tensor) else None for a in args]
            reply["args"] = encode(tensors, kernel=True, refs=[])
            reply["names"] = _parameter_names(fn, len(args))
            reply["kwargs"] = encode({k: v for k, v in dict(kwargs).items()
                                      if torch is not None and isinstance(v, torch.Tensor)},
                                     kernel=True, refs=[])
        except WireError as exc:
            return {"value": {"t": "opaque", "type": visible(f"{type(result).__name__} ({exc})"[:150])}}
        if trace is not None:
            try:
                reply["watch"] = trace.as_dict()
            except Exception:
                pass
        if grad and outputs:
            call_id = len(self.graphs) + 1
            self.graphs[call_id] = ([leaves[i] for i in sorted(leaves)], outputs)
            reply["graph"] = call_id
        return reply

    def backward(self, req):
        """Run the backward pass of a call kept by :meth:`call`; the input gradients."""
        torch = sys.modules["torch"]
        inputs, outputs = self.graphs.pop(req.get("graph"), ([], []))
        grads_out = decode(req["grads"])
        pairs = [(o, g) for o, g in zip(outputs, grads_out) if g is not None and o.requires_grad]
        if not inputs or not pairs:
            return {"value": encode([None] * len(inputs))}
        try:
            grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g.to(o.dtype) for o, g in pairs],
                                        allow_unused=True)
        except Exception as exc:
            return _exception(exc)
        return {"value": encode(list(grads))}

    def snapshot(self, req):
        """Import the modules the notebook uses, then record the watched functions and hooks."""
        import importlib
        for name in req.get("import", []):
            try:
                importlib.import_module(name)
            except Exception:
                pass
        self.before.clear()
        self.before.update(functions=_watched_functions(), hooks=_shell_hooks())
        return {"value": True}

    def tamper_report(self, _req=None):
        """What code written in the notebook put into libraries, builtins and IPython's hooks.

        The copy that took the snapshot (before the student's first cell) reports what changed
        since; a fresh copy, sent in by the harness under a name the notebook could not know, has
        no snapshot to trust and reports every watched function, library class and hook whose
        code was written in the notebook, so replacing the first copy hides nothing. What passes
        a report on its way out (IPython's display publisher, the kernel's message session) is
        reported when it changed at all; a change there can still rewrite the reply itself, which
        is why the grader also reads the notebook's source (autograder.engine.audit).
        """
        snap = self.before or None
        changed = []
        for name, fn in _watched_functions().items():
            old = snap["functions"].get(name) if snap else None
            if isinstance(fn, _Member):
                fn, old = fn.fn, getattr(old, "fn", None)
                if not snap:
                    continue
            if (fn is not old if snap else True) and (old is not None or not snap) and _from_notebook(fn):
                changed.append(name)
        for name, now in _shell_hooks().items():
            before = snap["hooks"].get(name, []) if snap else []
            added = [h for h in now if not any(h is b for b in before)]
            if name in CHANNEL_HOOKS[1:] and not snap:
                continue    # the channel's own parts (our message packer) are not the notebook's
            if added and (name in CHANNEL_HOOKS or any(map(_from_notebook, added))):
                changed.append(name)
        return {"value": changed}


if not __package__:   # this copy runs in the student's kernel: one server, its entry points
    _server = KernelServer()
    kernel_request, kernel_request_file = _server.kernel_request, _server.kernel_request_file
