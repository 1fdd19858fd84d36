"""mlexp.ops: the linear-attention kernel family, each op as recurrent, parallel, chunkwise and Triton."""
from .linear import linear_attention

__all__ = ["linear_attention"]
