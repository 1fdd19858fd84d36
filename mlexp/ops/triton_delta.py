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
    (D6) through W, U, Tm, X and A: dV = Tm^T dU, dX = dTm diag(beta) with dTm = dU V^T + dW (K e^b)^T
         (wy_bwd_dx_kernel); dA = -X^T dX X^T (strictly lower), then dK, dbeta, db (wy_bwd_da_kernel)
"""
import torch
import triton
import triton.language as tl

from .triton_chunk import dqk_kernel, dv_kernel, output_kernel
from .triton_common import (GATE_SCALAR, MAX_STATE_DK, Gate, _causal_dot, _dexp, _gamma, _load_b, _load_b_row,
                            _narrow, _program_ids, _put_rows, _rows, _state_ptr, block, check_chunk, chunk_cumsum,
                            chunk_len, config, dqk_tiles, launch, precision, sm_count, tile)

__all__ = ["delta_rule_triton"]


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
def _slice_dot(x, bh, t, s, S, scale, T, DK: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """(X[:, slice s] * scale) @ S_s: the part of a product over Dk that state slice s (rows s*BK ..)
    holds; x is (B*H, T, DK), S_s (BK, BV) fp32, scale (C, 1) or 1.0. Returns (C, BV) fp32."""
    r = s * BK + tl.arange(0, BK)
    xs = _rows(x, bh, t, t < T, r, r < DK, T, DK)
    return tl.dot((xs.to(tl.float32) * scale).to(x.dtype.element_ty), S.to(x.dtype.element_ty), input_precision=PREC)


@triton.jit
def _slice_write(x, bh, t, s, scale, y, T, DK: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """(X[:, slice s] * scale)^T Y: what the chunk writes into state slice s; Y (C, BV). Returns (BK, BV)."""
    r = s * BK + tl.arange(0, BK)
    xs = _rows(x, bh, t, t < T, r, r < DK, T, DK)
    return tl.dot(tl.trans((xs.to(tl.float32) * scale).to(x.dtype.element_ty)), y.to(x.dtype.element_ty),
                  input_precision=PREC)


@triton.jit
def _slice_back(q, w, bh, t, s, dS, dec, sq, do, dv, T, DK: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """Slice s of (D4)'s dS_n = e^b_last dS_{n+1} + (Q e^b)^T dO - W^T dV' (dec = e^b_last, sq = e^b)."""
    return (dS * dec + _slice_write(q, bh, t, s, sq, do, T, DK, BK, PREC)
            - _slice_write(w, bh, t, s, 1.0, dv, T, DK, BK, PREC))


@triton.jit
def _slice_ptr(ptr, i, s, rv, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr):
    """Pointers and mask of rows s*BK .. of state number i in a (..., DK, DV) stack of states."""
    r = s * BK + tl.arange(0, BK)
    return _state_ptr(ptr, i, r, rv, DK, DV), (r < DK)[:, None] & (rv < DV)[None, :]


@triton.jit
def _slice_load(ptr, i, s, rv, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, NS: tl.constexpr):
    """State slice s as fp32 (zeros when s >= NS, the slices a head size does not use)."""
    if s < NS:
        p, m = _slice_ptr(ptr, i, s, rv, DK, DV, BK)
        return tl.load(p, mask=m, other=0.0).to(tl.float32)
    else:
        return tl.zeros((BK, rv.shape[0]), dtype=tl.float32)


@triton.jit
def _slice_store(ptr, i, s, S, rv, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, NS: tl.constexpr):
    if s < NS:
        p, m = _slice_ptr(ptr, i, s, rv, DK, DV, BK)
        tl.store(p, S.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def delta_state_fwd_kernel(k, w, u, b_hi, b_lo, s0, h, vn, s_out, T, DK: tl.constexpr, DV: tl.constexpr,
                           C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr,
                           STORE_FINAL: tl.constexpr, PREC: tl.constexpr):
    """(D2), delta._chunk's loop: one program per (V tile, batch*head). V' = U - W S contracts over
    all of Dk, so a program holds all Dk rows of its state, as up to four slices S0..S3 of BK <= 64
    rows (Triton has no arrays of register tiles), and every operand tile is (C, BK).
    Stores S_n (operand dtype) and V'_n for the output kernel, and the final state (fp32)."""
    NS: tl.constexpr = (DK + BK - 1) // BK
    i_v, i_bh, _ = _program_ids()
    N = tl.cdiv(T, C)
    rv = i_v * BV + tl.arange(0, BV)
    DT = k.dtype.element_ty
    S0 = _slice_load(s0, i_bh, 0, rv, DK, DV, BK, NS)
    S1 = _slice_load(s0, i_bh, 1, rv, DK, DV, BK, NS)
    S2 = _slice_load(s0, i_bh, 2, rv, DK, DV, BK, NS)
    S3 = _slice_load(s0, i_bh, 3, rv, DK, DV, BK, NS)
    for n in range(0, N):
        t = n * C + tl.arange(0, C)
        _slice_store(h, i_bh * N + n, 0, S0, rv, DK, DV, BK, NS)
        _slice_store(h, i_bh * N + n, 1, S1, rv, DK, DV, BK, NS)
        _slice_store(h, i_bh * N + n, 2, S2, rv, DK, DV, BK, NS)
        _slice_store(h, i_bh * N + n, 3, S3, rv, DK, DV, BK, NS)
        v = _rows(u, i_bh, t, t < T, rv, rv < DV, T, DV).to(tl.float32)           # V' = U - W S
        v -= _slice_dot(w, i_bh, t, 0, S0, 1.0, T, DK, BK, PREC)
        if NS > 1:
            v -= _slice_dot(w, i_bh, t, 1, S1, 1.0, T, DK, BK, PREC)
        if NS > 2:
            v -= _slice_dot(w, i_bh, t, 2, S2, 1.0, T, DK, BK, PREC)
        if NS > 3:
            v -= _slice_dot(w, i_bh, t, 3, S3, 1.0, T, DK, BK, PREC)
        v = v.to(DT)
        _put_rows(vn, v, i_bh, t, t < T, rv, rv < DV, T, DV)
        if GATED:                                                 # S <- e^b_last S + (K e^(b_last - b))^T V'
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rv, rv < DV, T, 1, GATE_SCALAR)
            hl, ll = _load_b_row(b_hi, b_lo, i_bh, n * C + C - 1, rv, rv < DV, T, 1, GATE_SCALAR)
            dec, sc = tl.exp(hl + ll), _dexp(hl, ll, hi, lo)
        else:
            dec, sc = 1.0, 1.0
        S0 = S0 * dec + _slice_write(k, i_bh, t, 0, sc, v, T, DK, BK, PREC)
        if NS > 1:
            S1 = S1 * dec + _slice_write(k, i_bh, t, 1, sc, v, T, DK, BK, PREC)
        if NS > 2:
            S2 = S2 * dec + _slice_write(k, i_bh, t, 2, sc, v, T, DK, BK, PREC)
        if NS > 3:
            S3 = S3 * dec + _slice_write(k, i_bh, t, 3, sc, v, T, DK, BK, PREC)
    if STORE_FINAL:
        _slice_store(s_out, i_bh, 0, S0, rv, DK, DV, BK, NS)
        _slice_store(s_out, i_bh, 1, S1, rv, DK, DV, BK, NS)
        _slice_store(s_out, i_bh, 2, S2, rv, DK, DV, BK, NS)
        _slice_store(s_out, i_bh, 3, S3, rv, DK, DV, BK, NS)


@triton.jit
def delta_state_bwd_kernel(q, k, w, b_hi, b_lo, do, dvl, ds_t, dh, dvn, ds0, T, DK: tl.constexpr,
                           DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           GATED: tl.constexpr, PREC: tl.constexpr):
    """(D4), the reverse of (D2): dh[n] = dS_{n+1} (operand dtype), dvn = dV' (fp32) from the local
    part dvl = P^T dO, and ds0 = dS_0. One program per (V tile, batch*head), the state's gradient
    held as slices dS0..dS3 of BK rows as in delta_state_fwd_kernel."""
    NS: tl.constexpr = (DK + BK - 1) // BK
    i_v, i_bh, _ = _program_ids()
    N = tl.cdiv(T, C)
    rv = i_v * BV + tl.arange(0, BV)
    dS0 = _slice_load(ds_t, i_bh, 0, rv, DK, DV, BK, NS)
    dS1 = _slice_load(ds_t, i_bh, 1, rv, DK, DV, BK, NS)
    dS2 = _slice_load(ds_t, i_bh, 2, rv, DK, DV, BK, NS)
    dS3 = _slice_load(ds_t, i_bh, 3, rv, DK, DV, BK, NS)
    for i in range(0, N):
        n = N - 1 - i
        t = n * C + tl.arange(0, C)
        _slice_store(dh, i_bh * N + n, 0, dS0, rv, DK, DV, BK, NS)
        _slice_store(dh, i_bh * N + n, 1, dS1, rv, DK, DV, BK, NS)
        _slice_store(dh, i_bh * N + n, 2, dS2, rv, DK, DV, BK, NS)
        _slice_store(dh, i_bh * N + n, 3, dS3, rv, DK, DV, BK, NS)
        if GATED:
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rv, rv < DV, T, 1, GATE_SCALAR)
            hl, ll = _load_b_row(b_hi, b_lo, i_bh, n * C + C - 1, rv, rv < DV, T, 1, GATE_SCALAR)
            dec, sq, sk = tl.exp(hl + ll), tl.exp(hi + lo), _dexp(hl, ll, hi, lo)
        else:
            dec, sq, sk = 1.0, 1.0, 1.0
        dv = _rows(dvl, i_bh, t, t < T, rv, rv < DV, T, DV).to(tl.float32)      # dV' = P^T dO + K_dec dS_{n+1}
        dv += _slice_dot(k, i_bh, t, 0, dS0, sk, T, DK, BK, PREC)
        if NS > 1:
            dv += _slice_dot(k, i_bh, t, 1, dS1, sk, T, DK, BK, PREC)
        if NS > 2:
            dv += _slice_dot(k, i_bh, t, 2, dS2, sk, T, DK, BK, PREC)
        if NS > 3:
            dv += _slice_dot(k, i_bh, t, 3, dS3, sk, T, DK, BK, PREC)
        _put_rows(dvn, dv, i_bh, t, t < T, rv, rv < DV, T, DV)
        doc = _rows(do, i_bh, t, t < T, rv, rv < DV, T, DV)
        dS0 = _slice_back(q, w, i_bh, t, 0, dS0, dec, sq, doc, dv, T, DK, BK, PREC)
        if NS > 1:
            dS1 = _slice_back(q, w, i_bh, t, 1, dS1, dec, sq, doc, dv, T, DK, BK, PREC)
        if NS > 2:
            dS2 = _slice_back(q, w, i_bh, t, 2, dS2, dec, sq, doc, dv, T, DK, BK, PREC)
        if NS > 3:
            dS3 = _slice_back(q, w, i_bh, t, 3, dS3, dec, sq, doc, dv, T, DK, BK, PREC)
    _slice_store(ds0, i_bh, 0, dS0, rv, DK, DV, BK, NS)
    _slice_store(ds0, i_bh, 1, dS1, rv, DK, DV, BK, NS)
    _slice_store(ds0, i_bh, 2, dS2, rv, DK, DV, BK, NS)
    _slice_store(ds0, i_bh, 3, dS3, rv, DK, DV, BK, NS)


@triton.jit
def wy_bwd_dx_kernel(k, v, beta, b_hi, b_lo, x, dw, du, dk_in, dv, dx, dbeta1, db1, T, DK: tl.constexpr,
                     DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     GATED: tl.constexpr, PREC: tl.constexpr):
    """(D6), first half: the gradient through delta._chunk's ``W = T_mat @ (b.exp() * k)`` and
    ``U = T_mat @ v`` with T_mat = X diag(beta), given dW and dU = dV' (fp32):
    dV = beta * X^T dU (written), dK += beta e^b * X^T dW (added to dk_in in place),
    dbeta_j = V_j . (X^T dU)_j + (e^b K)_j . (X^T dW)_j and db_j = beta_j (e^b K)_j . (X^T dW)_j
    (partial, into dbeta1 and db1), and dX = [dU (beta V)^T + dW (beta e^b K)^T]_(j <= i) into dx
    (B*H, T, C) fp32. X^T is loaded transposed by its strides. One program per (chunk, batch*head).
    """
    i_n, i_bh, _ = _program_ids()
    rc = tl.arange(0, C)
    t = i_n * C + rc
    DT = k.dtype.element_ty
    bt = tl.load(beta + i_bh * T + t, mask=t < T, other=0.0).to(tl.float32)
    XT = tl.load(x + (i_bh * T + t[None, :]) * C + rc[:, None], mask=(t < T)[None, :], other=0.0).to(DT)  # X^T
    if GATED:
        hi, lo = _load_b(b_hi, b_lo, i_bh, t, rc, t < T, T, 1, GATE_SCALAR)
    db = tl.zeros((C,), dtype=tl.float32)
    dbt = tl.zeros((C,), dtype=tl.float32)
    dX = tl.zeros((C, C), dtype=tl.float32)
    for i_v in range(0, tl.cdiv(DV, BV)):                                        # U = X (beta V)
        rv = i_v * BV + tl.arange(0, BV)
        vc = _rows(v, i_bh, t, t < T, rv, rv < DV, T, DV).to(tl.float32)
        duc = _rows(du, i_bh, t, t < T, rv, rv < DV, T, DV).to(DT)
        y = tl.dot(XT, duc, input_precision=PREC)                                # X^T dU
        _put_rows(dv, bt[:, None] * y, i_bh, t, t < T, rv, rv < DV, T, DV)       # dV = beta X^T dU
        dbt += tl.sum(vc * y, axis=1)
        dX += tl.dot(duc, tl.trans((bt[:, None] * vc).to(DT)), input_precision=PREC)
    for i_k in range(0, tl.cdiv(DK, BK)):                                        # W = X (beta e^b K)
        rk = i_k * BK + tl.arange(0, BK)
        ke = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)
        dwc = _rows(dw, i_bh, t, t < T, rk, rk < DK, T, DK).to(DT)
        y = tl.dot(XT, dwc, input_precision=PREC)                                # X^T dW
        if GATED:
            ke = ke * tl.exp(hi + lo)                                             # e^b K
        dbt += tl.sum(ke * y, axis=1)
        if GATED:
            db += bt * tl.sum(ke * y, axis=1)                                     # by b_j through e^(b_j)
        dX += tl.dot(dwc, tl.trans((bt[:, None] * ke).to(DT)), input_precision=PREC)
        dkw = y * bt[:, None]                                                     # beta e^b X^T dW
        if GATED:
            dkw = dkw * tl.exp(hi + lo)
        _put_rows(dk_in, _rows(dk_in, i_bh, t, t < T, rk, rk < DK, T, DK) + dkw, i_bh, t, t < T, rk, rk < DK, T, DK)
    _put_rows(dx, tl.where(rc[:, None] >= rc[None, :], dX, 0.0), i_bh, t, t < T, rc, rc < C, T, C)
    tl.store(dbeta1 + i_bh * T + t, dbt, mask=t < T)
    if GATED:
        tl.store(db1 + i_bh * T + t, db, mask=t < T)


@triton.jit
def wy_bwd_da_kernel(k, beta, b_hi, b_lo, x, dx, dbeta1, db1, dk_in, dg_in, dk, dbeta, dg, T, DK: tl.constexpr,
                     C: tl.constexpr, BK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr):
    """(D6), second half: X = (I + A)^-1 gives dA = -X^T dX X^T (strictly lower); A = beta_i Gamma_ij
    k_i . k_j gives dbeta_i += sum_j dA_ij Gamma_ij k_i . k_j, db from dA * A (by b_i and -b_j) and
    dK_A = (D + D^T) K with D = dA beta_i Gamma_ij. Writes dk = dk_in + dK_A, dbeta, and dg: the
    reverse cumulative sum of db inside the chunk plus dg_in. One program per (chunk, batch*head)."""
    i_n, i_bh, _ = _program_ids()
    rc = tl.arange(0, C)
    t = i_n * C + rc
    causal = rc[:, None] >= rc[None, :]
    DT = k.dtype.element_ty
    bt = tl.load(beta + i_bh * T + t, mask=t < T, other=0.0).to(tl.float32)
    XT = tl.load(x + (i_bh * T + t[None, :]) * C + rc[:, None], mask=(t < T)[None, :], other=0.0).to(DT)  # X^T
    dX = _rows(dx, i_bh, t, t < T, rc, rc < C, T, C).to(DT)
    dA = -tl.dot(tl.dot(XT, dX, input_precision=PREC).to(DT), XT, input_precision=PREC)   # -X^T dX X^T
    dA = tl.where(rc[:, None] > rc[None, :], dA, 0.0)                            # A is strictly lower
    kk = tl.zeros((C, C), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(DK, BK)):
        rk = i_k * BK + tl.arange(0, BK)
        kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK)
        kk += tl.dot(kc, tl.trans(kc), input_precision=PREC)                     # K K^T
    if GATED:
        hi, lo = _load_b(b_hi, b_lo, i_bh, t, rc, t < T, T, 1, GATE_SCALAR)
        kk = kk * _gamma(hi, lo, causal)                                          # A = beta_i (k_i.k_j) Gamma_ij
    dbt = tl.load(dbeta1 + i_bh * T + t, mask=t < T, other=0.0) + tl.sum(dA * kk, axis=1)
    D = dA * bt[:, None]
    if GATED:
        db = tl.load(db1 + i_bh * T + t, mask=t < T, other=0.0)
        db += tl.sum(D * kk, axis=1) - tl.sum(D * kk, axis=0)                     # dA * A, by b_i and b_j
        D = D * _gamma(hi, lo, causal)
    D = (D + tl.trans(D)).to(DT)                                                  # D K + D^T K = (D + D^T) K
    for i_k in range(0, tl.cdiv(DK, BK)):
        rk = i_k * BK + tl.arange(0, BK)
        dkc = _rows(dk_in, i_bh, t, t < T, rk, rk < DK, T, DK)
        dkc += tl.dot(D, _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK), input_precision=PREC)
        _put_rows(dk, dkc, i_bh, t, t < T, rk, rk < DK, T, DK)
    tl.store(dbeta + i_bh * T + t, dbt.to(dbeta.dtype.element_ty), mask=t < T)
    if GATED:
        dgc = tl.cumsum(db, 0, reverse=True) + tl.load(dg_in + i_bh * T + t, mask=t < T, other=0.0)
        tl.store(dg + i_bh * T + t, dgc.to(dg.dtype.element_ty), mask=t < T)


# Programs per SM the delta-rule state pass aims at. It is the one sequential pass (a chain of
# dependent dots per chunk), so one or two programs per SM leave it latency-bound: at (8, 16, 2048,
# 64) one program per SM gave V tiles of 32, 256 programs on an H200's 132 SMs, and a forward 2.87x
# fla's. fla's chunk_gated_delta_rule state pass (chunk_gated_delta_rule_fwd_h) splits V into
# tiles of 32 or 64 by autotuning, with 2 or 4 warps; here V tiles of 16 where the batch allows.
STATE_PROGRAMS_PER_SM = 4
STATE_SMALL_WARPS = 4      # warps of a state kernel whose (Dk, BV) state is at most 2048 values (None: config's)


def _state_tiles(Dk, Dv, dtype, heads, device):
    """(BK, BV) of the delta-rule state kernels: slices of BK <= 64 rows, at most four (Dk <= 256);
    BV so that the whole (Dk, BV) fp32 state stays near 64 x 64 values (32 x 64 where tiles are
    narrow: fp32 operands, or before sm_80), halved down to 16 while the grid (V tiles x heads)
    has fewer than STATE_PROGRAMS_PER_SM programs per SM."""
    if Dk > MAX_STATE_DK:
        raise ValueError(f"impl='triton' holds all Dk rows of a delta-rule state in one program, as at most "
                         f"four 64-row slices, so Dk <= {MAX_STATE_DK}; got {Dk}. Use impl='chunk'.")
    budget = 2048 if _narrow(dtype, device) else 4096
    BV = min(block(Dv), max(16, budget // block(Dk, cap=MAX_STATE_DK)))
    while BV > 16 and triton.cdiv(Dv, BV) * heads < STATE_PROGRAMS_PER_SM * sm_count(device):
        BV //= 2
    return block(Dk), BV


def _state_config(Dk, BV, dtype, device):
    """num_warps and num_stages of the delta-rule state kernels: config("delta_state"), with
    STATE_SMALL_WARPS (4) warps instead of 8 where the (Dk, BV) state is at most 2048 values (16
    per thread), as fla runs its state pass with 2 or 4: the per-chunk dots are (C, Dk) x (Dk, BV),
    small for 8 warps."""
    cfg = config("delta_state", dtype, device)
    if STATE_SMALL_WARPS is not None and block(Dk, cap=MAX_STATE_DK) * BV <= 2048:
        cfg["num_warps"] = min(cfg["num_warps"], STATE_SMALL_WARPS)
    return cfg


def _wy(k, v, beta, b_hi, b_lo, x, C, gated, solve):
    """(D1): W (B, H, T, Dk) and U (B, H, T, Dv) in the operand dtype; solve: also write X into x."""
    B, H, T, Dk = k.shape
    Dv = v.shape[-1]
    w, u = torch.empty_like(k), torch.empty_like(v)
    launch(wy_fwd_kernel, (triton.cdiv(T, C), B * H), k, v, beta, b_hi, b_lo, x, w, u, T,
           **config("wy", k.dtype, k.device),
           DK=Dk, DV=Dv, C=C, BK=tile(Dk, k.dtype, k.device), BV=tile(Dv, k.dtype, k.device), GATED=gated, SOLVE=solve,
           PREC=precision(k.dtype))
    return w, u


def _delta_states(k, w, u, b_hi, b_lo, S0, C, gated, final):
    """(D2): S_n (B, H, N, Dk, Dv) and V' (B, H, T, Dv) in the operand dtype, and the final state."""
    B, H, T, Dk = k.shape
    Dv = u.shape[-1]
    BK, BV = _state_tiles(Dk, Dv, k.dtype, B * H, k.device)
    h = torch.empty(B, H, triton.cdiv(T, C), Dk, Dv, dtype=k.dtype, device=k.device)
    vn = torch.empty_like(u)
    S = torch.empty(B, H, Dk, Dv, dtype=torch.float32, device=k.device) if final else h
    launch(delta_state_fwd_kernel, (triton.cdiv(Dv, BV), B * H), k, w, u, b_hi, b_lo, S0, h, vn, S, T,
           **_state_config(Dk, BV, k.dtype, k.device), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATED=gated, STORE_FINAL=final,
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
        gated, initial_given = g is not None, S0 is not None
        prec = precision(q.dtype)
        q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
        S0 = q.new_zeros(B, H, Dk, Dv, dtype=torch.float32) if S0 is None else S0.float().contiguous()
        b_hi, b_lo = chunk_cumsum(g.contiguous(), C) if gated else (beta, beta)   # unread without a gate
        x = torch.empty(B, H, T, C, dtype=torch.float32, device=q.device)
        w, u = _wy(k, v, beta, b_hi, b_lo, x, C, gated, solve=True)
        h, vn, S = _delta_states(k, w, u, b_hi, b_lo, S0, C, gated, final=True)
        o = torch.empty_like(v)
        BK, BV = tile(Dk, q.dtype, q.device), tile(Dv, q.dtype, q.device)
        launch(output_kernel, (triton.cdiv(Dv, BV), triton.cdiv(T, C), B * H), q, k, vn, b_hi, b_lo, h, q, o, T,
               **config("output", q.dtype, q.device), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV,
               GATE=int(Gate.SCALAR if gated else Gate.NONE), PREC=prec)
        ctx.save_for_backward(q, k, v, beta, b_hi, b_lo, S0, x)
        ctx.cfg = (C, gated, None if g is None else g.dtype, initial_given)
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        q, k, v, beta, b_hi, b_lo, S0, x = ctx.saved_tensors
        C, gated, g_dtype, initial_given = ctx.cfg
        B, H, T, Dk = q.shape
        Dv = v.shape[-1]
        N, BK, BV = triton.cdiv(T, C), tile(Dk, q.dtype, q.device), tile(Dv, q.dtype, q.device)
        prec = precision(q.dtype)
        gate = int(Gate.SCALAR if gated else Gate.NONE)
        f32 = dict(dtype=torch.float32, device=q.device)
        do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
        dS = torch.zeros_like(S0) if dS is None else dS.float().contiguous()
        w, u = _wy(k, v, beta, b_hi, b_lo, x, C, gated, solve=False)
        h, vn, _ = _delta_states(k, w, u, b_hi, b_lo, S0, C, gated, final=False)
        dvl = torch.empty(B, H, T, Dv, **f32)                                     # P^T dO
        launch(dv_kernel, (triton.cdiv(Dv, BV), N, B * H), q, k, b_hi, b_lo, q, do, q, dvl, T,
               **config("output", q.dtype, q.device), DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATE=gate, WITH_DH=False,
               PREC=prec)
        SK, SV = _state_tiles(Dk, Dv, q.dtype, B * H, q.device)
        dh, dvn, dS0 = torch.empty_like(h), torch.empty(B, H, T, Dv, **f32), torch.empty_like(S0)
        launch(delta_state_bwd_kernel, (triton.cdiv(Dv, SV), B * H), q, k, w, b_hi, b_lo, do, dvl, dS, dh, dvn, dS0,
               T, **_state_config(Dk, SV, q.dtype, q.device), DK=Dk, DV=Dv, C=C, BK=SK, BV=SV, GATED=gated, PREC=prec)
        QK, QV = dqk_tiles(Dk, Dv, q.dtype, q.device)
        NK = triton.cdiv(Dk, QK)
        dq, dk_in, dw = torch.empty_like(q), torch.empty(q.shape, **f32), torch.empty(q.shape, **f32)
        dgp = torch.empty(NK, B, H, T, **f32) if gated else q
        launch(dqk_kernel, (NK, N, B * H), q, k, vn, b_hi, b_lo, h, dh, do, dvn, dq, dk_in, dw, q, q, dgp, T,
               **config("dqk", q.dtype, q.device), DK=Dk, DV=Dv, C=C, BK=QK, BV=QV, GATE=gate, DELTA=True, PREC=prec)
        dg_in = (dgp.sum(0) if NK > 1 else dgp[0]) if gated else q
        dk, dv, dbeta = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
        dx, dbeta1 = torch.empty(B, H, T, C, **f32), torch.empty(B, H, T, **f32)
        db1 = torch.empty(B, H, T, **f32) if gated else q
        meta = dict(DK=Dk, C=C, BK=BK, GATED=gated, PREC=prec)
        launch(wy_bwd_dx_kernel, (N, B * H), k, v, beta, b_hi, b_lo, x, dw, dvn, dk_in, dv, dx, dbeta1, db1, T,
               **config("wy", q.dtype, q.device), DV=Dv, BV=BV, **meta)
        dg = torch.empty(B, H, T, dtype=g_dtype, device=q.device) if gated else q
        launch(wy_bwd_da_kernel, (N, B * H), k, beta, b_hi, b_lo, x, dx, dbeta1, db1, dk_in, dg_in, dk, dbeta, dg, T,
               **config("wy", q.dtype, q.device), **meta)
        return dq, dk, dv, dbeta, (dg if gated else None), (dS0 if initial_given else None), None


def delta_rule_triton(q, k, v, beta, g, S0, C):
    """(Gated) delta rule with the Triton kernels, forward and backward.

    Args as mlexp.ops.delta_rule after its checks (keys already normalised, q already scaled):
    q, k (B, H, T, Dk) with Dk <= 256, v (B, H, T, Dv), beta (B, H, T), g (B, H, T) or None,
    S0 (B, H, Dk, Dv) or None; bf16, fp16 or fp32; any strides. C in (16, 32, 64).
    Returns o (B, H, T, Dv) in v's dtype and S (B, H, Dk, Dv) in fp32.

    Raises:
        ValueError: C not in (16, 32, 64), Dk > 256, or float64 inputs.
    """
    check_chunk(C, q.shape[2], q.shape[0] * q.shape[1])
    precision(q.dtype)
    _state_tiles(q.shape[-1], v.shape[-1], q.dtype, 1, q.device)
    if 0 in q.shape or v.shape[-1] == 0:                                        # launch nothing
        B, H, _, Dk = q.shape
        S = q.new_zeros(B, H, Dk, v.shape[-1], dtype=torch.float32) if S0 is None else S0.float()
        return torch.zeros_like(v), S
    return _DeltaRuleTriton.apply(q, k, v, beta, g, S0, chunk_len(C, q.dtype, q.device))
