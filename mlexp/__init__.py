"""mlexp: the library behind the linear-attention course (data, training, kernels, plots)."""
import importlib

from .runtime import budget, is_grading

__version__ = "0.1.0"
__all__ = ["budget", "is_grading", "train_lm", "count_params", "__version__"]

# `import mlexp` stays light (no torch, no matplotlib): the names below and the submodules
# (mlexp.data, mlexp.train, mlexp.plot, mlexp.transformer, ...) are imported on first use.
_LAZY = {"train_lm": "train", "count_params": "train"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise  # the submodule exists but one of its own imports is missing
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
