"""Triton forward and backward for linear attention and gated linear attention (mlexp.ops.triton_chunk)."""
import torch
import triton

from .triton_chunk import (dqk_intra_channel_kernel, dqk_kernel, dv_kernel, output_kernel, scores_channel_kernel,
                           state_bwd_kernel, state_fwd_kernel)
from .triton_common import (SUB, Gate, check_chunk, chunk_cumsum, chunk_len, config, dqk_tiles, launch, precision,
                            state_tiles, tile)

__all__ = ["triton_linear_attention", "triton_gated_linear_attention"]


def _states(k, v, b_hi, b_lo, S0, C, gate, final):
    """Run (E1): S_n for every chunk, (B, H, N, Dk, Dv) in the operand dtype, and the final state."""
    B, H, T, Dk = k.shape
    Dv = v.shape[-1]
    BK, BV = state_tiles(Dk, Dv, B * H, k.device, k.dtype)
    h = torch.empty(B, H, triton.cdiv(T, C), Dk, Dv, dtype=k.dtype, device=k.device)
    S = torch.empty(B, H, Dk, Dv, dtype=torch.float32, device=k.device) if final else h
    launch(state_fwd_kernel, (triton.cdiv(Dk, BK), triton.cdiv(Dv, BV), B * H), k, v, b_hi, b_lo, S0, h, S, T,
           **config("state", k.dtype, k.device), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATE=int(gate), STORE_FINAL=final,
           PREC=precision(k.dtype))
    return h, (S if final else None)


class _ChunkTriton(torch.autograd.Function):
    """S_t = diag(e^{g_t}) S_{t-1} + k_t v_t^T, o_t = q_t^T S_t, chunkwise in Triton, forward and backward.

    Saves the contiguous copies the kernels read (never the caller's possibly strided tensors) and
    the cumulative log-decay; the states S_n are recomputed in the backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, S0, C, gate):
        B, H, T, Dk = q.shape
        Dv = v.shape[-1]
        prec = precision(q.dtype)
        q, k, v = (x.contiguous() for x in (q, k, v))
        S0 = S0.float().contiguous()
        b_hi, b_lo = chunk_cumsum(g.contiguous(), C) if gate else (q, q)     # unread without a gate
        h, S = _states(k, v, b_hi, b_lo, S0, C, gate, final=True)
        N, BK, BV = triton.cdiv(T, C), tile(Dk, q.dtype, q.device), tile(Dv, q.dtype, q.device)
        a = q
        if gate == Gate.CHANNEL:
            a = torch.empty(B, H, T, C, dtype=torch.float32, device=q.device)   # intra-chunk scores
            launch(scores_channel_kernel, (N * (C // SUB), B * H), q, k, b_hi, b_lo, a, T,
                   **config("scores", q.dtype, q.device), DK=Dk, C=C, BK=BK, SUB=SUB, PREC=prec)
        o = torch.empty_like(v)
        launch(output_kernel, (triton.cdiv(Dv, BV), N, B * H), q, k, v, b_hi, b_lo, h, a, o, T,
               **config("output", q.dtype, q.device), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATE=int(gate), PREC=prec)
        ctx.save_for_backward(q, k, v, b_hi, b_lo, S0, a)
        ctx.cfg = (C, gate, None if g is None else g.dtype)
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        q, k, v, b_hi, b_lo, S0, a = ctx.saved_tensors
        C, gate, g_dtype = ctx.cfg
        B, H, T, Dk = q.shape
        Dv = v.shape[-1]
        N, BK, BV = triton.cdiv(T, C), tile(Dk, q.dtype, q.device), tile(Dv, q.dtype, q.device)
        NK, NV = triton.cdiv(Dk, BK), triton.cdiv(Dv, BV)
        SK, SV = state_tiles(Dk, Dv, B * H, q.device, q.dtype)
        prec = precision(q.dtype)
        do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
        dS = torch.zeros_like(S0) if dS is None else dS.float().contiguous()
        meta = dict(DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATE=int(gate), PREC=prec)
        h, _ = _states(k, v, b_hi, b_lo, S0, C, gate, final=False)
        dh = torch.empty_like(h)                                                 # dS_{n+1} for chunk n
        dS0 = torch.empty_like(S0)
        launch(state_bwd_kernel, (triton.cdiv(Dk, SK), triton.cdiv(Dv, SV), B * H), q, b_hi, b_lo, do, dS, dh, dS0, T,
               **config("state", q.dtype, q.device), **dict(meta, BK=SK, BV=SV))
        dv = torch.empty_like(v)
        launch(dv_kernel, (NV, N, B * H), q, k, b_hi, b_lo, a, do, dh, dv, T, **config("output", q.dtype, q.device),
               WITH_DH=True, **meta)
        dq, dk, dg = torch.empty_like(q), torch.empty_like(k), None
        QK, QV = dqk_tiles(Dk, Dv, q.dtype, q.device)
        if gate == Gate.CHANNEL:
            f32 = dict(dtype=torch.float32, device=q.device)
            dq_in, dk_in = torch.empty(q.shape, **f32), torch.empty(k.shape, **f32)
            dp, dbl = torch.empty(B, H, T, C, **f32), torch.empty(B, H, N, Dk, **f32)
            launch(dqk_kernel, (triton.cdiv(Dk, QK), N, B * H), q, k, v, b_hi, b_lo, h, dh, do, q, dq_in, dk_in, q, dp,
                   dbl, q, T, **config("dqk", q.dtype, q.device), DELTA=False, **dict(meta, BK=QK, BV=QV))
            dg = torch.empty(B, H, T, Dk, dtype=g_dtype, device=q.device)
            launch(dqk_intra_channel_kernel, (NK, N, B * H), q, k, b_hi, b_lo, dp, dq_in, dk_in, dbl, dq, dk, dg, T,
                   **config("intra", q.dtype, q.device), DK=Dk, C=C, BK=BK, SUB=SUB, PREC=prec)
        else:
            dgp = torch.empty(triton.cdiv(Dk, QK), B, H, T, dtype=torch.float32, device=q.device) if gate else q
            launch(dqk_kernel, (triton.cdiv(Dk, QK), N, B * H), q, k, v, b_hi, b_lo, h, dh, do, q, dq, dk, q, q, q, dgp,
                   T, **config("dqk", q.dtype, q.device), DELTA=False, **dict(meta, BK=QK, BV=QV))
            if gate:
                dg = (dgp.sum(0) if dgp.shape[0] > 1 else dgp[0]).to(g_dtype)
        return dq, dk, dv, dg, dS0, None, None


def _apply(q, k, v, g, S0, C, gate):
    """Checks shared by both ops, then the autograd function. An empty dimension launches nothing:
    the output is zeros of v's shape (empty, or 0 for Dk = 0) and the state S0 is unchanged."""
    check_chunk(C, q.shape[2], q.shape[0] * q.shape[1])
    precision(q.dtype)                                                           # refuses float64
    if 0 in q.shape or v.shape[-1] == 0:
        return torch.zeros_like(v), S0.float()
    return _ChunkTriton.apply(q, k, v, g, S0, chunk_len(C, q.dtype, q.device), gate)


def triton_linear_attention(q, k, v, S0, z0, *, normalize, eps, chunk_size):
    """Linear attention with the Triton kernels; arguments as mlexp.ops.linear_attention after checks.

    q, k: (B, H, T, Dk), v: (B, H, T, Dv) in bf16, fp16 or fp32; S0 (B, H, Dk, Dv), z0 (B, H, Dk)
    or None. The normaliser is not a value column of the kernels: z_t = z_0 + k_1 + ... + k_t is
    a cumulative sum here, so Dv keeps its size (and its tiles). Returns o (B, H, T, Dv) (fp32
    when normalising, else v's dtype), S (B, H, Dk, Dv) fp32 and z (B, H, Dk) fp32 or None.

    Raises:
        ValueError: chunk_size not in (16, 32, 64), or float64 inputs.
    """
    o, S = _apply(q, k, v, None, S0, chunk_size, Gate.NONE)
    if not normalize:
        return o, S, None
    z = z0.float()[:, :, None] + k.float().cumsum(2)                            # z_t: (B, H, T, Dk)
    den = (q.float() * z).sum(-1, keepdim=True)                                 # q_t . z_t: (B, H, T, 1)
    return o.float() / (den + eps), S, z0.float() + k.float().sum(2)


def triton_gated_linear_attention(q, k, v, g, S0, *, chunk_size):
    """Gated linear attention with the Triton kernels; arguments as mlexp.ops.gated_linear_attention
    after checks: g (B, H, T) (one log-decay per head) or (B, H, T, Dk) (one per key channel), any
    strides. Returns o (B, H, T, Dv) in v's dtype and S (B, H, Dk, Dv) in fp32.

    Raises:
        ValueError: chunk_size not in (16, 32, 64), or float64 inputs.
    """
    gate = Gate.CHANNEL if g.dim() == 4 else Gate.SCALAR
    return _apply(q, k, v, g, S0, chunk_size, gate)
