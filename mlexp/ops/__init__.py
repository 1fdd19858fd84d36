"""mlexp.ops: the linear-attention kernel family, each op as recurrent, parallel, chunkwise and Triton."""
from .delta import delta_rule, gated_delta_rule
from .gated import gated_linear_attention
from .linear import linear_attention

__all__ = ["delta_rule", "gated_delta_rule", "linear_attention", "gated_linear_attention"]
