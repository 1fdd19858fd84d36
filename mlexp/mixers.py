"""Token mixers x (B, T, dim) -> (B, T, dim): linear attention (also Based's Taylor form), decay-gated, DeltaNet, Gated DeltaNet, conv, LSTM."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .ops import delta_rule, gated_delta_rule, gated_linear_attention, linear_attention
from .transformer import Attention as SoftmaxAttention

__all__ = ["SoftmaxAttention", "LinearAttention", "taylor_features", "TaylorLinearAttention", "DecayLinearAttention",
           "DeltaNet", "GatedDeltaNet", "retnet_gammas", "CausalConv", "LSTMMixer", "lstm_hidden"]

# Softmax attention, the mixer every other one is compared with, is mlexp.transformer.Attention
# (dim, n_heads, n_kv_heads; RoPE, MHA/GQA/MQA), re-exported above as SoftmaxAttention so that a
# lesson can take every mixer from one place.


def retnet_gammas(n_heads):
    """RetNet's fixed per-head decays gamma_h = 1 - 2^(-5-h), h = 0..n_heads-1 (Sun et al. 2023).

    Head 0 keeps about 32 tokens (gamma 0.96875), head 7 about 4,096 (0.999756). Returns a float64
    tensor of shape (n_heads,).
    """
    h = torch.arange(n_heads, dtype=torch.float64)
    return 1 - 2.0 ** (-5 - h)


def _head_rms_norm(o, eps=1e-6):
    """Normalise each head's output vector to unit RMS: (B, H, T, D) -> (B, H, T, D).

    Without softmax's normalisation, a decayed or delta-rule state can read out vectors whose size
    depends on the head's memory length; RetNet (GroupNorm) and DeltaNet/Gated DeltaNet (RMSNorm)
    normalise per head before the output projection, and so do the mixers here.
    """
    return o * torch.rsqrt(o.pow(2).mean(dim=-1, keepdim=True) + eps)


class _HeadMixer(nn.Module):
    """Shared plumbing: q, k, v projections to n_heads of head_dim, and the output projection."""

    def __init__(self, dim, n_heads, head_dim=None, impl=None, chunk_size=64):
        super().__init__()
        if head_dim is None:
            if dim % n_heads:
                raise ValueError(f"dim {dim} is not divisible by n_heads {n_heads}; pass head_dim")
            head_dim = dim // n_heads
        self.dim, self.n_heads, self.head_dim = dim, n_heads, head_dim
        self.impl, self.chunk_size = impl, chunk_size
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(dim, inner, bias=False)
        self.k_proj = nn.Linear(dim, inner, bias=False)
        self.v_proj = nn.Linear(dim, inner, bias=False)
        self.out_proj = nn.Linear(inner, dim, bias=False)

    def _split(self, y):
        """(B, T, H * D) -> (B, H, T, D)."""
        B, T, _ = y.shape
        return y.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)

    def _qkv(self, x):
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"{type(self).__name__} expects x of shape (B, T, {self.dim}); got {tuple(x.shape)}")
        return self._split(self.q_proj(x)), self._split(self.k_proj(x)), self._split(self.v_proj(x))

    def _merge(self, o):
        """(B, H, T, D) -> (B, T, dim) through the output projection."""
        B, H, T, D = o.shape
        return self.out_proj(o.transpose(1, 2).reshape(B, T, H * D))

    def extra_repr(self):
        return f"dim={self.dim}, n_heads={self.n_heads}, head_dim={self.head_dim}, impl={self.impl}"


class LinearAttention(_HeadMixer):
    """Normalised causal linear attention with phi(x) = elu(x) + 1 (Katharopoulos et al. 2020).

    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t) with S_t = sum_i phi(k_i) v_i^T, z_t = sum_i phi(k_i).
    Args: dim, n_heads, head_dim (default dim // n_heads), impl and chunk_size for mlexp.ops.
    forward: x (B, T, dim) -> (B, T, dim).
    """

    def forward(self, x):
        q, k, v = self._qkv(x)                                   # (B, H, T, D) each
        o, _ = linear_attention(F.elu(q) + 1, F.elu(k) + 1, v, normalize=True, impl=self.impl,
                                chunk_size=self.chunk_size)
        return self._merge(o)


def taylor_features(x):
    """Based's 2nd-order Taylor feature map: phi(x) = [1, x / d^(1/4), (x (x) x) / (sqrt(2) sqrt(d))].

    x: (..., d) float -> (..., 1 + d + d^2), same dtype. The scales make
    phi(q) . phi(k) = 1 + q.k / sqrt(d) + (q.k)^2 / (2 d), the Taylor expansion of exp(q.k / sqrt(d))
    to second order, which is positive for every q, k (1 + u + u^2 / 2 > 0). The square term is the
    full outer product x x^T flattened (d^2 entries, each off-diagonal product twice), as in Based's
    TaylorExp (Arora et al. 2024, arXiv:2402.18668, Sec. 4).
    """
    d = x.shape[-1]
    ones = torch.ones_like(x[..., :1])                                       # (..., 1)
    square = (x[..., :, None] * x[..., None, :]).flatten(-2)                 # (..., d) -> (..., d * d)
    return torch.cat([ones, x / d ** 0.25, square / (math.sqrt(2) * math.sqrt(d))], dim=-1)


class TaylorLinearAttention(_HeadMixer):
    """Based's linear attention (Arora et al. 2024, arXiv:2402.18668): the Taylor feature map on small keys.

    Queries and keys are projected to ``feature_dim`` = d' numbers per head (Based uses d' = 16),
    passed through ``taylor_features`` (1 + d' + d'^2 = 273 features at d' = 16), and fed to
    normalised causal linear attention (``mlexp.ops.linear_attention``, normalize=True):
    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t), S_t = sum_i phi(k_i) v_i^T, z_t = sum_i phi(k_i).
    Values keep head_dim. The state per head is S of (1 + d' + d'^2) x head_dim numbers and the
    normaliser z of 1 + d' + d'^2, whatever the length (``mlexp.capstone.memory_bytes`` counts both).
    Based pairs this layer with sliding-window softmax attention in other layers of the stack
    (``mlexp.capstone.lesson_designs``); this mixer is the linear-attention layer alone.
    Args: dim, n_heads, head_dim (of the values; default dim // n_heads), feature_dim d',
    impl and chunk_size for mlexp.ops. forward: x (B, T, dim) -> (B, T, dim).
    """

    def __init__(self, dim, n_heads, head_dim=None, feature_dim=16, impl=None, chunk_size=64):
        super().__init__(dim, n_heads, head_dim, impl, chunk_size)
        if not isinstance(feature_dim, int) or isinstance(feature_dim, bool) or feature_dim < 1:
            raise ValueError(f"feature_dim must be a positive int; got {feature_dim!r}")
        self.feature_dim = feature_dim
        self.q_proj = nn.Linear(dim, n_heads * feature_dim, bias=False)   # q and k: d' per head, not head_dim
        self.k_proj = nn.Linear(dim, n_heads * feature_dim, bias=False)

    @property
    def n_features(self):
        """1 + d' + d'^2: the key dimension of the state."""
        return 1 + self.feature_dim + self.feature_dim ** 2

    def _features(self, x):
        """phi(q), phi(k) (B, H, T, 1 + d' + d'^2) and v (B, H, T, head_dim) from x (B, T, dim)."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"{type(self).__name__} expects x of shape (B, T, {self.dim}); got {tuple(x.shape)}")
        B, T, _ = x.shape
        qk = lambda proj: proj(x).view(B, T, self.n_heads, self.feature_dim).transpose(1, 2)  # (B, H, T, d')
        return taylor_features(qk(self.q_proj)), taylor_features(qk(self.k_proj)), self._split(self.v_proj(x))

    def forward(self, x, return_state=False):
        """x (B, T, dim) -> (B, T, dim); with ``return_state`` also the final (S, z):
        S (B, H, 1 + d' + d'^2, head_dim) and z (B, H, 1 + d' + d'^2), float32."""
        q, k, v = self._features(x)
        o, state = linear_attention(q, k, v, normalize=True, impl=self.impl, chunk_size=self.chunk_size)
        return (self._merge(o), state) if return_state else self._merge(o)

    def extra_repr(self):
        return super().extra_repr() + f", feature_dim={self.feature_dim}"


class DecayLinearAttention(_HeadMixer):
    """Linear attention with a decaying state, S_t = gamma S_{t-1} + k_t v_t^T (lesson 03).

    decay="fixed": RetNet's per-head constants gamma_h = 1 - 2^(-5-h) (Sun et al. 2023).
    decay="data": one decay per head and token, alpha_t = sigmoid(w_h . x_t + c_h), passed to the
    op in log space as g = logsigmoid(.): a scalar decay per head and token, as in Mamba-2 and Gated
    DeltaNet, but from a sigmoid rather than Mamba-2's exp(-dt_t a), and the write is not scaled
    by a step size (Mamba-2 writes dt_t k_t v_t^T; Dao and Gu 2024).
    The bias c_h starts at logit(gamma_h), so a fresh data-dependent mixer starts from RetNet's
    decays. Queries are scaled by head_dim^-1/2 and each head's output is RMS-normalised.
    forward: x (B, T, dim) -> (B, T, dim).
    """

    def __init__(self, dim, n_heads, head_dim=None, decay="fixed", impl=None, chunk_size=64):
        super().__init__(dim, n_heads, head_dim, impl, chunk_size)
        gammas = retnet_gammas(n_heads)
        if decay == "fixed":
            self.register_buffer("log_gamma", gammas.log().float())  # (H,) log-decay per head
            self.gate = None
        elif decay == "data":
            self.gate = nn.Linear(dim, n_heads)
            with torch.no_grad():
                self.gate.weight.mul_(0.1)
                self.gate.bias.copy_(torch.logit(gammas).float())
        else:
            raise ValueError(f"decay must be 'fixed' or 'data'; got {decay!r}")
        self.decay = decay

    def log_decay(self, x):
        """g = log(alpha): (B, T, dim) -> (B, H, T), every entry <= 0."""
        B, T, _ = x.shape
        if self.gate is None:
            return self.log_gamma.to(x.dtype)[None, :, None].expand(B, -1, T)
        return F.logsigmoid(self.gate(x)).transpose(1, 2)          # (B, T, H) -> (B, H, T)

    def forward(self, x):
        q, k, v = self._qkv(x)
        o, _ = gated_linear_attention(q, k, v, self.log_decay(x), impl=self.impl,
                                      chunk_size=self.chunk_size, scale=1 / math.sqrt(self.head_dim))
        return self._merge(_head_rms_norm(o))


class DeltaNet(_HeadMixer):
    """DeltaNet mixer (Schlag et al. 2021; Yang et al. 2024): the delta rule with learned beta.

    q and k are L2-normalised per head (normalize_qk in the op), beta_t = sigmoid(w_h . x_t + c_h)
    in (0, 1) per head and token, each head's output is RMS-normalised before the output
    projection. (The published models add short convolutions and SiLU; left out to stay minimal.)
    rule="additive" keeps all of that and changes only the write to S_t = S_{t-1} + beta_t k_t v_t^T
    (no read of the old value): the control of lesson 03, which isolates the update rule from
    the feature map, the normaliser and the output norm. forward: x (B, T, dim) -> (B, T, dim).
    Raises ValueError for another ``rule``.
    """

    def __init__(self, dim, n_heads, head_dim=None, impl=None, chunk_size=64, rule="delta"):
        super().__init__(dim, n_heads, head_dim, impl, chunk_size)
        if rule not in ("delta", "additive"):
            raise ValueError(f"rule must be 'delta' or 'additive'; got {rule!r}")
        self.rule = rule
        self.beta_proj = nn.Linear(dim, n_heads)

    def forward(self, x):
        q, k, v = self._qkv(x)
        beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)  # (B, T, H) -> (B, H, T)
        if self.rule == "additive":
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            # beta_t k_t v_t^T = k_t (beta_t v_t)^T: plain linear attention on beta-scaled values.
            o, _ = linear_attention(q, k, beta[..., None] * v, impl=self.impl, chunk_size=self.chunk_size)
        else:
            o, _ = delta_rule(q, k, v, beta, impl=self.impl, chunk_size=self.chunk_size, normalize_qk=True)
        return self._merge(_head_rms_norm(o))

    def extra_repr(self):
        return super().extra_repr() + (f", rule={self.rule}" if self.rule != "delta" else "")


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet mixer (Yang et al. 2025): DeltaNet plus a data-dependent decay per head and token.

    g_t = logsigmoid(w_h . x_t + c_h) <= 0 with c_h starting at logit of RetNet's gamma_h, so
    fresh heads span memories of about 32 to 4,096 tokens. forward: x (B, T, dim) -> (B, T, dim).
    rule="additive" keeps the gate, the L2-normalised q and k, the learned beta and the output norm,
    and changes only the write to S_t = alpha_t S_{t-1} + beta_t k_t v_t^T (no read of the old
    value): the control that separates the delta update from the rest (lesson 06), as DeltaNet's
    rule="additive" does without the gate (lesson 03). The same parameters, created in the same
    order, so a seed gives both rules the same initial weights. Raises ValueError for another ``rule``.
    """

    def __init__(self, dim, n_heads, head_dim=None, impl=None, chunk_size=64, rule="delta"):
        super().__init__(dim, n_heads, head_dim, impl, chunk_size, rule=rule)
        self.gate = nn.Linear(dim, n_heads)
        with torch.no_grad():
            self.gate.weight.mul_(0.1)
            self.gate.bias.copy_(torch.logit(retnet_gammas(n_heads)).float())

    def forward(self, x):
        q, k, v = self._qkv(x)
        beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)  # (B, H, T)
        g = F.logsigmoid(self.gate(x)).transpose(1, 2)          # (B, H, T) log-decay
        if self.rule == "additive":
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            # alpha_t S_{t-1} + beta_t k_t v_t^T = k_t (beta_t v_t)^T under a scalar gate: decayed
            # linear attention on beta-scaled values, no scale (q and k are unit vectors).
            o, _ = gated_linear_attention(q, k, beta[..., None] * v, g, impl=self.impl, chunk_size=self.chunk_size)
        else:
            o, _ = gated_delta_rule(q, k, v, beta, g, impl=self.impl, chunk_size=self.chunk_size,
                                    normalize_qk=True)
        return self._merge(_head_rms_norm(o))



# ---------------------------------------------------------------------------------------------
# The two mixers lesson 00 compares with attention: a causal convolution and an LSTM
# ---------------------------------------------------------------------------------------------


class CausalConv(nn.Module):
    """Causal convolution over time: output t mixes the inputs t-k+1 .. t, with k = kernel_size.

    A full (not depthwise) Conv1d from dim to dim channels, applied after k-1 zeros are padded on
    the left of the sequence, so no output sees a later input and the first outputs see zeros
    where the sequence has no past. dim^2 k parameters (16,384 at dim 64, k 4: the same as an
    attention mixer's four dim x dim projections). How far stacked layers reach is lesson 00's exercise.
    Source: causal convolutions of WaveNet (van den Oord et al. 2016, arXiv:1609.03499).
    forward: x (B, T, dim) -> (B, T, dim). Raises ValueError for kernel_size < 1 or a wrong shape.
    """

    def __init__(self, dim, kernel_size=4, bias=False):
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"kernel_size must be at least 1; got {kernel_size}")
        self.dim, self.kernel_size = dim, kernel_size
        self.conv = nn.Conv1d(dim, dim, kernel_size, bias=bias)

    def forward(self, x):
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"CausalConv expects x of shape (B, T, {self.dim}); got {tuple(x.shape)}")
        if x.shape[1] == 0:                                        # empty in, empty out (Conv1d refuses T = 0)
            return x * 0
        y = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))  # (B, dim, T) -> (B, dim, k-1 + T)
        return self.conv(y).transpose(1, 2)                        # (B, dim, T) -> (B, T, dim)

    def extra_repr(self):
        return f"dim={self.dim}, kernel_size={self.kernel_size}"


def lstm_hidden(dim, ratio=0.56):
    """Hidden width of the parameter-matched LSTM mixer: int(ratio * dim) (35 at dim 64)."""
    return int(ratio * dim)


class LSTMMixer(nn.Module):
    """A one-layer LSTM over time with a narrower hidden state, then a projection back to dim.

    An LSTM of hidden width h = lstm_hidden(dim) = int(0.56 dim) has 4h(dim + h) weights and two
    bias vectors of 4h (PyTorch's b_ih and b_hh); the output projection adds h x dim. At dim 64,
    h = 35: 13,860 + 280 + 2,240 = 16,380 parameters against attention's 16,384, so an LSTM
    model and an attention model of the same skeleton have (almost) the same size.
    Source: Hochreiter & Schmidhuber 1997 (LSTM); PyTorch nn.LSTM's gate equations.
    forward: x (B, T, dim) float -> (B, T, dim); the state starts at zero for every sequence.
    """

    def __init__(self, dim, hidden=None):
        super().__init__()
        hidden = lstm_hidden(dim) if hidden is None else hidden
        if hidden < 1:
            raise ValueError(f"hidden must be at least 1; got {hidden}")
        self.dim, self.hidden = dim, hidden
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.out_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"LSTMMixer expects x of shape (B, T, {self.dim}); got {tuple(x.shape)}")
        if x.shape[1] == 0:                                        # empty in, empty out (nn.LSTM refuses T = 0)
            return x * 0
        try:
            h, _ = self.lstm(x)                                    # (B, T, dim) -> (B, T, hidden)
        except RuntimeError:
            if not torch.is_autocast_enabled(x.device.type):
                raise
            # Under CPU autocast, a CPU whose oneDNN has no bfloat16 LSTM (no AVX-512 BF16: "could not
            # create a primitive descriptor") runs the LSTM in float32; the projection still autocasts.
            with torch.autocast(x.device.type, enabled=False):
                h, _ = self.lstm(x.float())
        return self.out_proj(h)                                    # (B, T, hidden) -> (B, T, dim)

    def extra_repr(self):
        return f"dim={self.dim}, hidden={self.hidden}"
