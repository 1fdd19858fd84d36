"""mlexp: the library behind the linear-attention course (data, training, kernels, plots)."""
from .runtime import budget, is_grading

__version__ = "0.1.0"
__all__ = ["budget", "is_grading", "__version__"]
