"""mlexp.ops: the linear-attention kernel family, each op as recurrent, parallel, chunkwise and Triton.

Conventions shared by linear_attention, gated_linear_attention, delta_rule and gated_delta_rule:

- Layout (B, H, T, D): batch, heads, time, head_dim (split heads with
  x.view(B, T, H, D).transpose(1, 2)). flash-linear-attention (fla) takes (B, T, H, D): call
  .transpose(1, 2) on the way in and out.
- The state S is (B, H, Dk, Dv), key channels by value channels: written S += k v^T, read
  o = S^T q. fla's state has the same (K, V) orientation.
- g is a log-decay, g = log(alpha) <= 0 (alpha = exp(g) in [0, 1]; a positive g is refused):
  shape (B, H, T), one per head and token, or (B, H, T, Dk), one per key channel
  (gated_linear_attention only). g = -inf is a hard reset (alpha = 0: the state is forgotten),
  exact on every path, as is any g in [-inf, 0].
- beta (B, H, T) is the delta rule's write strength, in [0, 2].
- scale multiplies q; the default None means 1 (the equations as written). fla's ops default to
  Dk ** -0.5: pass scale=Dk ** -0.5 to match them.
- dtypes: float16/bfloat16/float32 inputs are computed in float32, float64 in float64; the
  final state is float32 (float64 for float64 inputs); the output has the input dtype. The same
  holds under torch.autocast: each op runs with autocast off inside (_common.autocast_off), so a
  model under autocast passes its bf16 q, k, v and gets a bf16 output computed in float32.
- impl=None picks "triton" for CUDA tensors and "chunk" otherwise, except float64, which always
  goes to "chunk" (the Triton kernels compute in float32); impl="triton" with float64 raises.
- Edges: B, H or T = 0 gives an empty output and a copy of the initial state (a new tensor,
  never the caller's object) as the final state; a NaN or
  infinite input spoils no output before its token (see _common.finite_guard).

Example (a hard reset at token 1, then two halvings):

    >>> import torch
    >>> from mlexp.ops import gated_linear_attention
    >>> q = k = v = torch.ones(1, 1, 4, 1)
    >>> half = torch.tensor(0.5).log().item()
    >>> g = torch.tensor([[[0.0, float("-inf"), half, half]]])
    >>> o, S = gated_linear_attention(q, k, v, g)
    >>> [round(x, 4) for x in o.flatten().tolist()]
    [1.0, 1.0, 1.5, 1.75]
"""
from .delta import delta_rule, gated_delta_rule
from .gated import gated_linear_attention
from .linear import linear_attention

__all__ = ["delta_rule", "gated_delta_rule", "linear_attention", "gated_linear_attention"]
