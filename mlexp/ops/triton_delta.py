"""Triton forward and backward for the delta rule and the gated delta rule (chunkwise WY/UT form).

The equations, chunk by chunk (mlexp.ops.delta._chunk has the derivation and is the reference;
b, Gamma and e^b as in mlexp.ops.triton_chunk, with one log-decay per head or none):

    (D1) A = [beta_i (k_i . k_j) Gamma_ij]_{j < i},  X = (I + A)^-1,  Tm = X diag(beta)
         W = Tm (K * e^b),  U = Tm V                                     chunk-parallel (wy_fwd_kernel)
    (D2) V'_n = U_n - W_n S_n,  S_{n+1} = e^b_last S_n + (K * e^(b_last - b))^T V'_n
                                                                        sequential (delta_state_fwd_kernel)
    (D3) O_n = (Q * e^b) S_n + [(Q K^T) * Gamma, j <= i] V'_n           triton_chunk.output_kernel
and backward
    (D4) dV'_n = P^T dO_n + (K * e^(b_last - b)) dS_{n+1}, P = [(Q K^T) * Gamma, j <= i]
         dS_n = e^b_last dS_{n+1} + (Q * e^b)^T dO_n - W_n^T dV'_n      sequential (delta_state_bwd_kernel)
    (D5) dQ, dK through P and the state write, dW = -dV' S_n^T           triton_chunk.dqk_kernel (DELTA)
    (D6) through W, U, Tm, X and A: dTm = dU V^T + dW (K e^b)^T, dV = Tm^T dU,
         dX = dTm diag(beta), dA = -X^T dX X^T (strictly lower), then dK, dbeta, db   wy_bwd_kernel
"""
import torch
import triton
import triton.language as tl

from .triton_chunk import dqk_kernel, dv_kernel, output_kernel
from .triton_common import (GATE_SCALAR, MAX_STATE_DK, Gate, _causal_dot, _dexp, _gamma, _load_b, _load_b_row,
                            _program_ids, _put_rows, _rows, _state_ptr, block, check_chunk, chunk_cumsum, config,
                            launch, precision)

__all__ = ["delta_rule_triton"]

_F32 = tl.constexpr("tf32x3")   # precision of the fp32 (C, C) products inside the solve's gradient


@triton.jit
def wy_fwd_kernel(k, v, beta, b_hi, b_lo, x, w, u, T, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr, SOLVE: tl.constexpr,
                  PREC: tl.constexpr):
    """(D1), delta._chunk's ``T_mat``, ``W`` and ``U``: one program per (chunk, batch*head).

    SOLVE: build A, invert I + A by forward substitution, X_i = e_i - sum_{j<i} A_ij X_j (exact,
    no pivoting: the matrix is unit lower-triangular), and store X in x (B*H, T, C) fp32.
    Otherwise read X back from x (the backward's recompute). Then W and U, tile by tile.
    """
    i_n, i_bh, _ = _program_ids()
    rc = tl.arange(0, C)
    t = i_n * C + rc
    causal = rc[:, None] >= rc[None, :]
    DT = k.dtype.element_ty
    bt = tl.load(beta + i_bh * T + t, mask=t < T, other=0.0).to(tl.float32)    # (C,)
    if GATED:
        hi, lo = _load_b(b_hi, b_lo, i_bh, t, rc, t < T, T, 1, GATE_SCALAR)      # (C, 1)
    if SOLVE:
        kk = tl.zeros((C, C), dtype=tl.float32)
        for i_k in range(0, tl.cdiv(DK, BK)):
            rk = i_k * BK + tl.arange(0, BK)
            kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK)
            kk += tl.dot(kc, tl.trans(kc), input_precision=PREC)                # K K^T
        A = bt[:, None] * kk
        if GATED:
            A = A * _gamma(hi, lo, causal)
        A = tl.where(rc[:, None] > rc[None, :], A, 0.0)                          # strictly lower
        _put_rows(x, A, i_bh, t, t < T, rc, rc < C, T, C)
        tl.debug_barrier()
        X = tl.where(rc[:, None] == rc[None, :], 1.0, 0.0)
        for i in range(1, C):
            a_i = tl.load(x + (i_bh * T + i_n * C + i) * C + rc, mask=(i_n * C + i + 0 * rc < T) & (rc < i), other=0.0)
            x_i = tl.where(rc == i, 1.0, 0.0) - tl.sum(a_i[:, None] * X, axis=0)
            X = tl.where(rc[:, None] == i, x_i[None, :], X)
        tl.debug_barrier()
        _put_rows(x, X, i_bh, t, t < T, rc, rc < C, T, C)
    else:
        X = _rows(x, i_bh, t, t < T, rc, rc < C, T, C)
    Tm = tl.where(causal, X * bt[None, :], 0.0)                                   # (I + A)^-1 diag(beta)
    for i_k in range(0, tl.cdiv(DK, BK)):
        rk = i_k * BK + tl.arange(0, BK)
        kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)
        if GATED:
            kc = kc * tl.exp(hi + lo)                                             # diag(e^b) K
        _put_rows(w, _causal_dot(Tm, kc, DT, PREC), i_bh, t, t < T, rk, rk < DK, T, DK)
    for i_v in range(0, tl.cdiv(DV, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        vc = _rows(v, i_bh, t, t < T, rv, rv < DV, T, DV).to(tl.float32)
        _put_rows(u, _causal_dot(Tm, vc, DT, PREC), i_bh, t, t < T, rv, rv < DV, T, DV)


@triton.jit
def delta_state_fwd_kernel(k, w, u, b_hi, b_lo, s0, h, vn, s_out, T, DK: tl.constexpr, DV: tl.constexpr,
                           C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr,
                           STORE_FINAL: tl.constexpr, PREC: tl.constexpr):
    """(D2), delta._chunk's loop: one program per (V tile, batch*head) holding all Dk rows of the
    state (V' = U - W S contracts over all of Dk, so Dk is not split; BK * BV <= 64 * 64).
    Stores S_n (operand dtype) and V'_n for the output kernel, and the final state (fp32)."""
    i_v, i_bh, _ = _program_ids()
    N = tl.cdiv(T, C)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    ms = (rk < DK)[:, None] & (rv < DV)[None, :]
    DT = k.dtype.element_ty
    S = tl.load(_state_ptr(s0, i_bh, rk, rv, DK, DV), mask=ms, other=0.0)
    for n in range(0, N):
        tl.store(_state_ptr(h, i_bh * N + n, rk, rv, DK, DV), S.to(h.dtype.element_ty), mask=ms)
        t = n * C + tl.arange(0, C)
        wc = _rows(w, i_bh, t, t < T, rk, rk < DK, T, DK)
        uc = _rows(u, i_bh, t, t < T, rv, rv < DV, T, DV).to(tl.float32)
        v_new = (uc - tl.dot(wc, S.to(DT), input_precision=PREC)).to(DT)         # V' = U - W S
        _put_rows(vn, v_new, i_bh, t, t < T, rv, rv < DV, T, DV)
        kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)
        if GATED:
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rk, rk < DK, T, 1, GATE_SCALAR)
            hl, ll = _load_b_row(b_hi, b_lo, i_bh, n * C + C - 1, rk, rk < DK, T, 1, GATE_SCALAR)
            kc = kc * _dexp(hl, ll, hi, lo)                                       # K * e^(b_last - b)
            S = S * tl.exp(hl + ll)
        S += tl.dot(tl.trans(kc.to(DT)), v_new, input_precision=PREC)
    if STORE_FINAL:
        tl.store(_state_ptr(s_out, i_bh, rk, rv, DK, DV), S, mask=ms)


@triton.jit
def delta_state_bwd_kernel(q, k, w, b_hi, b_lo, do, dvl, ds_t, dh, dvn, ds0, T, DK: tl.constexpr,
                           DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           GATED: tl.constexpr, PREC: tl.constexpr):
    """(D4), the reverse of (D2): dh[n] = dS_{n+1} (operand dtype), dvn = dV' (fp32) from the local
    part dvl = P^T dO, and ds0 = dS_0. One program per (V tile, batch*head), all Dk rows."""
    i_v, i_bh, _ = _program_ids()
    N = tl.cdiv(T, C)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    ms = (rk < DK)[:, None] & (rv < DV)[None, :]
    DT = q.dtype.element_ty
    dS = tl.load(_state_ptr(ds_t, i_bh, rk, rv, DK, DV), mask=ms, other=0.0)
    for i in range(0, N):
        n = N - 1 - i
        tl.store(_state_ptr(dh, i_bh * N + n, rk, rv, DK, DV), dS.to(dh.dtype.element_ty), mask=ms)
        t = n * C + tl.arange(0, C)
        qc = _rows(q, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)
        kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)
        wc = _rows(w, i_bh, t, t < T, rk, rk < DK, T, DK)
        doc = _rows(do, i_bh, t, t < T, rv, rv < DV, T, DV)
        dv_new = _rows(dvl, i_bh, t, t < T, rv, rv < DV, T, DV).to(tl.float32)
        if GATED:
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rk, rk < DK, T, 1, GATE_SCALAR)
            hl, ll = _load_b_row(b_hi, b_lo, i_bh, n * C + C - 1, rk, rk < DK, T, 1, GATE_SCALAR)
            qc = qc * tl.exp(hi + lo)
            kc = kc * _dexp(hl, ll, hi, lo)
        dv_new += tl.dot(kc.to(DT), dS.to(DT), input_precision=PREC)            # + (K e^(b_last - b)) dS_{n+1}
        _put_rows(dvn, dv_new, i_bh, t, t < T, rv, rv < DV, T, DV)
        if GATED:
            dS = dS * tl.exp(hl + ll)
        dS += tl.dot(tl.trans(qc.to(DT)), doc, input_precision=PREC)
        dS -= tl.dot(tl.trans(wc), dv_new.to(DT), input_precision=PREC)
    tl.store(_state_ptr(ds0, i_bh, rk, rv, DK, DV), dS, mask=ms)


@triton.jit
def wy_bwd_kernel(k, v, beta, b_hi, b_lo, x, dw, du, dk_in, dg_in, dk, dv, dbeta, dg, T, DK: tl.constexpr,
                  DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr,
                  PREC: tl.constexpr):
    """(D6): the gradient through delta._chunk's ``T_mat``, ``W = T_mat @ (b.exp() * k)`` and
    ``U = T_mat @ v``, given dW (fp32), dU = dV' (fp32), and dk_in, dg_in (fp32) from (D5).
    Writes dv, dk (= dk_in + the W and A paths), dbeta and dg (the reverse cumulative sum of db
    inside the chunk plus dg_in). One program per (chunk, batch*head)."""
    i_n, i_bh, _ = _program_ids()
    rc = tl.arange(0, C)
    t = i_n * C + rc
    causal = rc[:, None] >= rc[None, :]
    DT = k.dtype.element_ty
    bt = tl.load(beta + i_bh * T + t, mask=t < T, other=0.0).to(tl.float32)
    X = _rows(x, i_bh, t, t < T, rc, rc < C, T, C)
    Tm = tl.where(causal, X * bt[None, :], 0.0)
    if GATED:
        hi, lo = _load_b(b_hi, b_lo, i_bh, t, rc, t < T, T, 1, GATE_SCALAR)
        eb = tl.exp(hi + lo)                                                      # (C, 1)
    db = tl.zeros((C,), dtype=tl.float32)
    dT = tl.zeros((C, C), dtype=tl.float32)
    kk = tl.zeros((C, C), dtype=tl.float32)
    for i_v in range(0, tl.cdiv(DV, BV)):                                        # U = Tm V
        rv = i_v * BV + tl.arange(0, BV)
        vc = _rows(v, i_bh, t, t < T, rv, rv < DV, T, DV)
        duc = _rows(du, i_bh, t, t < T, rv, rv < DV, T, DV).to(DT)
        dT += tl.dot(duc, tl.trans(vc), input_precision=PREC)                   # dU V^T
        _put_rows(dv, tl.dot(tl.trans(Tm.to(DT)), duc, input_precision=PREC), i_bh, t, t < T, rv, rv < DV, T, DV)
    for i_k in range(0, tl.cdiv(DK, BK)):                                        # W = Tm (K e^b)
        rk = i_k * BK + tl.arange(0, BK)
        kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK)
        kd = kc.to(tl.float32)
        if GATED:
            kd = kd * eb
        dwc = _rows(dw, i_bh, t, t < T, rk, rk < DK, T, DK).to(DT)
        kk += tl.dot(kc, tl.trans(kc), input_precision=PREC)
        dT += tl.dot(dwc, tl.trans(kd.to(DT)), input_precision=PREC)            # dW (K e^b)^T
        if GATED:
            db += tl.sum(kd * tl.dot(tl.trans(Tm.to(DT)), dwc, input_precision=PREC), axis=1)
    dbt = tl.sum(tl.where(causal, dT * X, 0.0), axis=0)                           # Tm = X diag(beta)
    dX = tl.where(causal, dT * bt[None, :], 0.0)
    dA = -tl.dot(tl.dot(tl.trans(X), dX, input_precision=_F32), tl.trans(X), input_precision=_F32)
    dA = tl.where(rc[:, None] > rc[None, :], dA, 0.0)                            # X = (I + A)^-1, A strictly lower
    if GATED:
        kk = kk * _gamma(hi, lo, causal)                                          # A = beta_i (k_i.k_j) Gamma_ij
    dbt += tl.sum(dA * kk, axis=1)
    D = dA * bt[:, None]                                                          # dA_ij beta_i Gamma_ij
    if GATED:
        db += tl.sum(D * kk, axis=1) - tl.sum(D * kk, axis=0)                     # dA * A, by b_i and b_j
        D = D * _gamma(hi, lo, causal)
    for i_k in range(0, tl.cdiv(DK, BK)):
        rk = i_k * BK + tl.arange(0, BK)
        kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK)
        dwc = _rows(dw, i_bh, t, t < T, rk, rk < DK, T, DK).to(DT)
        dkw = tl.dot(tl.trans(Tm.to(DT)), dwc, input_precision=PREC)              # Tm^T dW, times e^b
        if GATED:
            dkw = dkw * eb
        dkc = _rows(dk_in, i_bh, t, t < T, rk, rk < DK, T, DK) + dkw
        dkc += tl.dot(D.to(DT), kc, input_precision=PREC) + tl.dot(tl.trans(D.to(DT)), kc, input_precision=PREC)
        _put_rows(dk, dkc, i_bh, t, t < T, rk, rk < DK, T, DK)
    tl.store(dbeta + i_bh * T + t, dbt.to(dbeta.dtype.element_ty), mask=t < T)
    if GATED:
        dgc = tl.cumsum(db, 0, reverse=True) + tl.load(dg_in + i_bh * T + t, mask=t < T, other=0.0)
        tl.store(dg + i_bh * T + t, dgc.to(dg.dtype.element_ty), mask=t < T)


def _state_tiles(Dk, Dv):
    """(BK, BV) of the delta-rule state kernels: all of Dk (<= 256) and BK * BV <= 64 * 64."""
    BK = block(Dk, cap=MAX_STATE_DK)
    if Dk > MAX_STATE_DK:
        raise ValueError(f"impl='triton' holds all Dk rows of a delta-rule state in one tile, so Dk <= "
                         f"{MAX_STATE_DK}; got {Dk}. Use impl='chunk'.")
    return BK, min(block(Dv), max(16, 4096 // BK))


def _wy(k, v, beta, b_hi, b_lo, x, C, gated, solve):
    """(D1): W (B, H, T, Dk) and U (B, H, T, Dv) in the operand dtype; solve: also write X into x."""
    B, H, T, Dk = k.shape
    Dv = v.shape[-1]
    w, u = torch.empty_like(k), torch.empty_like(v)
    launch(wy_fwd_kernel, (triton.cdiv(T, C), B * H), k, v, beta, b_hi, b_lo, x, w, u, T, **config("wy", k.dtype),
           DK=Dk, DV=Dv, C=C, BK=block(Dk), BV=block(Dv), GATED=gated, SOLVE=solve, PREC=precision(k.dtype))
    return w, u


def _delta_states(k, w, u, b_hi, b_lo, S0, C, gated, final):
    """(D2): S_n (B, H, N, Dk, Dv) and V' (B, H, T, Dv) in the operand dtype, and the final state."""
    B, H, T, Dk = k.shape
    Dv = u.shape[-1]
    BK, BV = _state_tiles(Dk, Dv)
    h = torch.empty(B, H, triton.cdiv(T, C), Dk, Dv, dtype=k.dtype, device=k.device)
    vn = torch.empty_like(u)
    S = torch.empty(B, H, Dk, Dv, dtype=torch.float32, device=k.device) if final else h
    launch(delta_state_fwd_kernel, (triton.cdiv(Dv, BV), B * H), k, w, u, b_hi, b_lo, S0, h, vn, S, T,
           **config("delta_state", k.dtype), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATED=gated, STORE_FINAL=final,
           PREC=precision(k.dtype))
    return h, vn, (S if final else None)


class _DeltaRuleTriton(torch.autograd.Function):
    """(Gated) delta rule, chunkwise in Triton, forward (D1)-(D3) and backward (D4)-(D6).

    Saves the contiguous copies the kernels read, the cumulative log-decay and X = (I + A)^-1;
    W, U, the states and V' are recomputed in the backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, beta, g, S0, C):
        B, H, T, Dk = q.shape
        Dv = v.shape[-1]
        gated = g is not None
        prec = precision(q.dtype)
        q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
        S0 = q.new_zeros(B, H, Dk, Dv, dtype=torch.float32) if S0 is None else S0.float().contiguous()
        b_hi, b_lo = chunk_cumsum(g.contiguous(), C) if gated else (beta, beta)   # unread without a gate
        x = torch.empty(B, H, T, C, dtype=torch.float32, device=q.device)
        w, u = _wy(k, v, beta, b_hi, b_lo, x, C, gated, solve=True)
        h, vn, S = _delta_states(k, w, u, b_hi, b_lo, S0, C, gated, final=True)
        o = torch.empty_like(v)
        BK, BV = block(Dk), block(Dv)
        launch(output_kernel, (triton.cdiv(Dv, BV), triton.cdiv(T, C), B * H), q, k, vn, b_hi, b_lo, h, q, o, T,
               **config("output", q.dtype), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV,
               GATE=int(Gate.SCALAR if gated else Gate.NONE), PREC=prec)
        ctx.save_for_backward(q, k, v, beta, b_hi, b_lo, S0, x)
        ctx.cfg = (C, gated, None if g is None else g.dtype)
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        q, k, v, beta, b_hi, b_lo, S0, x = ctx.saved_tensors
        C, gated, g_dtype = ctx.cfg
        B, H, T, Dk = q.shape
        Dv = v.shape[-1]
        N, BK, BV = triton.cdiv(T, C), block(Dk), block(Dv)
        prec = precision(q.dtype)
        gate = int(Gate.SCALAR if gated else Gate.NONE)
        f32 = dict(dtype=torch.float32, device=q.device)
        do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
        dS = torch.zeros_like(S0) if dS is None else dS.float().contiguous()
        w, u = _wy(k, v, beta, b_hi, b_lo, x, C, gated, solve=False)
        h, vn, _ = _delta_states(k, w, u, b_hi, b_lo, S0, C, gated, final=False)
        dvl = torch.empty(B, H, T, Dv, **f32)                                     # P^T dO
        launch(dv_kernel, (triton.cdiv(Dv, BV), N, B * H), q, k, b_hi, b_lo, q, do, q, dvl, T,
               **config("output", q.dtype), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATE=gate, WITH_DH=False, PREC=prec)
        SK, SV = _state_tiles(Dk, Dv)
        dh, dvn, dS0 = torch.empty_like(h), torch.empty(B, H, T, Dv, **f32), torch.empty_like(S0)
        launch(delta_state_bwd_kernel, (triton.cdiv(Dv, SV), B * H), q, k, w, b_hi, b_lo, do, dvl, dS, dh, dvn, dS0,
               T, **config("delta_state", q.dtype), DK=Dk, DV=Dv, C=C, BK=SK, BV=SV, GATED=gated, PREC=prec)
        NK = triton.cdiv(Dk, BK)
        dq, dk_in, dw = torch.empty_like(q), torch.empty(q.shape, **f32), torch.empty(q.shape, **f32)
        dgp = torch.empty(NK, B, H, T, **f32) if gated else q
        launch(dqk_kernel, (NK, N, B * H), q, k, vn, b_hi, b_lo, h, dh, do, dvn, dq, dk_in, dw, q, q, dgp, T,
               **config("dqk", q.dtype), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATE=gate, DELTA=True, PREC=prec)
        dg_in = (dgp.sum(0) if NK > 1 else dgp[0]) if gated else q
        dk, dv, dbeta = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
        dg = torch.empty(B, H, T, dtype=g_dtype, device=q.device) if gated else q
        launch(wy_bwd_kernel, (N, B * H), k, v, beta, b_hi, b_lo, x, dw, dvn, dk_in, dg_in, dk, dv, dbeta, dg, T,
               **config("wy", q.dtype), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATED=gated, PREC=prec)
        return dq, dk, dv, dbeta, (dg if gated else None), dS0, None


def delta_rule_triton(q, k, v, beta, g, S0, C):
    """(Gated) delta rule with the Triton kernels, forward and backward.

    Args as mlexp.ops.delta_rule after its checks (keys already normalised, q already scaled):
    q, k (B, H, T, Dk) with Dk <= 256, v (B, H, T, Dv), beta (B, H, T), g (B, H, T) or None,
    S0 (B, H, Dk, Dv) or None; bf16, fp16 or fp32; any strides. C in (16, 32, 64).
    Returns o (B, H, T, Dv) in v's dtype and S (B, H, Dk, Dv) in fp32.

    Raises:
        ValueError: C not in (16, 32, 64), Dk > 256, or float64 inputs.
    """
    check_chunk(C)
    precision(q.dtype)
    _state_tiles(q.shape[-1], v.shape[-1])
    if q.shape[2] == 0:
        B, H, _, Dk = q.shape
        S = q.new_zeros(B, H, Dk, v.shape[-1], dtype=torch.float32) if S0 is None else S0.float()
        return v.new_empty(v.shape), S
    return _DeltaRuleTriton.apply(q, k, v, beta, g, S0, C)
