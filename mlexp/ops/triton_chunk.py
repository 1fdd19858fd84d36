"""Triton kernels of the chunkwise form shared by every op: states, outputs and their gradients.

The equations (chunk n holds tokens nC .. nC + C - 1; S_n is the state entering it; b the
chunk-local cumulative log-decay, b_last its value at the chunk's last token; Gamma_ij =
e^(b_i - b_j) for j <= i, per key channel d when the gate is per channel):

    (E1) S_{n+1} = diag(e^b_last) S_n + (K * e^(b_last - b))^T V              state, sequential
    (E2) O_n     = (Q * e^b) S_n + [(Q K^T) * Gamma, j <= i] V                  chunk-parallel
    (E3) dS_n    = diag(e^b_last) dS_{n+1} + (Q * e^b)^T dO_n                   sequential, reversed
    (E4) dV_n    = [(Q K^T) * Gamma, j <= i]^T dO_n + (K * e^(b_last - b)) dS_{n+1}
    (E5) dQ_n    = (dO_n S_n^T) * e^b + [(dO V^T) * Gamma, j <= i] K
         dK_n    = (V dS_{n+1}^T) * e^(b_last - b) + [(dO V^T) * Gamma, j <= i]^T Q
    (E6) db_t    = q_t * dq_t - k_t * dk_t, plus at the chunk's last row the derivative by b_last,
                   e^b_last rowsum(S_n * dS_{n+1}) + sum_j k_j * dk_write_j; dg = the reverse
                   cumulative sum of db inside the chunk (GLA, Yang et al. 2023, section 4).

The readable PyTorch reference is mlexp.ops.gated._chunk (and linear._chunk); the delta rule
reuses (E2), (E4) and (E5) with V replaced by its corrected values V' (mlexp.ops.delta._chunk).
The sequential kernels run one program per (K tile, V tile, batch*head), tiles of at most
64 x 64; everything else runs one program per chunk and tile.
"""
import triton
import triton.language as tl

from .triton_common import (GATE_CHANNEL, GATE_NONE, GATE_SCALAR, _causal_dot, _dexp, _gamma, _load_b,
                            _load_b_row, _program_ids, _put_rows, _rows, _state_ptr)

__all__ = []


@triton.jit
def state_fwd_kernel(k, v, b_hi, b_lo, s0, h, s_out, T, DK: tl.constexpr, DV: tl.constexpr,
                     C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
                     STORE_FINAL: tl.constexpr, PREC: tl.constexpr):
    """(E1), gated._chunk's loop ``S = block_decay * S + kv``: stores S_n for every chunk into h
    (B*H, N, DK, DV) in the operand dtype and the final state (fp32) into s_out. The running
    state stays in fp32 registers. One program per (K tile, V tile, batch*head)."""
    i_k, i_v, i_bh = _program_ids()
    N = tl.cdiv(T, C)
    rc = tl.arange(0, C)
    rk = i_k * BK + tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    ms = (rk < DK)[:, None] & (rv < DV)[None, :]
    S = tl.load(_state_ptr(s0, i_bh, rk, rv, DK, DV), mask=ms, other=0.0)
    for n in range(0, N):
        tl.store(_state_ptr(h, i_bh * N + n, rk, rv, DK, DV), S.to(h.dtype.element_ty), mask=ms)
        t = n * C + rc
        kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)          # (C, BK)
        vc = _rows(v, i_bh, t, t < T, rv, rv < DV, T, DV)                         # (C, BV)
        if GATE != GATE_NONE:
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rk, rk < DK, T, DK, GATE)
            hl, ll = _load_b_row(b_hi, b_lo, i_bh, n * C + C - 1, rk, rk < DK, T, DK, GATE)
            if GATE == GATE_CHANNEL:
                kc = kc * _dexp(hl[None, :], ll[None, :], hi, lo)                # K * e^(b_last - b)
                S = S * tl.exp(hl + ll)[:, None]                                  # diag(e^b_last) S
            else:
                kc = kc * _dexp(hl, ll, hi, lo)
                S = S * tl.exp(hl + ll)
        S += tl.dot(tl.trans(kc.to(vc.dtype)), vc, input_precision=PREC)       # (BK, C) @ (C, BV)
    if STORE_FINAL:
        tl.store(_state_ptr(s_out, i_bh, rk, rv, DK, DV), S, mask=ms)


@triton.jit
def state_bwd_kernel(q, b_hi, b_lo, do, ds_t, dh, ds0, T, DK: tl.constexpr, DV: tl.constexpr,
                     C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
                     PREC: tl.constexpr):
    """(E3), the reverse of (E1): dh[n] = dS_{n+1}, the gradient of the state leaving chunk n
    (operand dtype); ds0 = dS_0 (fp32). Reference: autograd through gated._chunk's loop."""
    i_k, i_v, i_bh = _program_ids()
    N = tl.cdiv(T, C)
    rk = i_k * BK + tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    ms = (rk < DK)[:, None] & (rv < DV)[None, :]
    dS = tl.load(_state_ptr(ds_t, i_bh, rk, rv, DK, DV), mask=ms, other=0.0)
    for i in range(0, N):
        n = N - 1 - i
        tl.store(_state_ptr(dh, i_bh * N + n, rk, rv, DK, DV), dS.to(dh.dtype.element_ty), mask=ms)
        t = n * C + tl.arange(0, C)
        qc = _rows(q, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)
        doc = _rows(do, i_bh, t, t < T, rv, rv < DV, T, DV)
        if GATE != GATE_NONE:
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rk, rk < DK, T, DK, GATE)
            hl, ll = _load_b_row(b_hi, b_lo, i_bh, n * C + C - 1, rk, rk < DK, T, DK, GATE)
            qc = qc * tl.exp(hi + lo)                                             # Q * e^b
            if GATE == GATE_CHANNEL:
                dS = dS * tl.exp(hl + ll)[:, None]
            else:
                dS = dS * tl.exp(hl + ll)
        dS += tl.dot(tl.trans(qc.to(doc.dtype)), doc, input_precision=PREC)
    tl.store(_state_ptr(ds0, i_bh, rk, rv, DK, DV), dS, mask=ms)


@triton.jit
def scores_channel_kernel(q, k, b_hi, b_lo, a, T, DK: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                          SUB: tl.constexpr, PREC: tl.constexpr):
    """The intra-chunk scores of a per-channel gate, A_ij = sum_d q_id k_jd e^(b_id - b_jd), j <= i,
    into a (B*H, T, C) fp32 (gated._intra_channel). One program per (chunk, row sub-block I).

    Sub-block J < I: split the weight at r, the first token of I, e^(b_i - b_r) e^(b_r - b_j):
    two factors <= 1 on 2-D (SUB, BK) tiles and one matmul. Diagonal sub-block: one key j at a
    time, a (SUB, BK) tile each, exact. Entries above the diagonal are left unwritten.
    """
    NC: tl.constexpr = C // SUB
    i_s, i_bh, _ = _program_ids()
    i_n, I = i_s // NC, i_s % NC
    rs = tl.arange(0, SUB)
    ti = i_n * C + I * SUB + rs
    r = i_n * C + I * SUB                                                         # the split token
    DT = q.dtype.element_ty
    for J in range(0, I):
        tj = i_n * C + J * SUB + rs
        acc = tl.zeros((SUB, SUB), dtype=tl.float32)
        for i_k in range(0, tl.cdiv(DK, BK)):
            rk = i_k * BK + tl.arange(0, BK)
            hi, lo = _load_b(b_hi, b_lo, i_bh, ti, rk, rk < DK, T, DK, GATE_CHANNEL)
            hj, lj = _load_b(b_hi, b_lo, i_bh, tj, rk, rk < DK, T, DK, GATE_CHANNEL)
            hr, lr = _load_b_row(b_hi, b_lo, i_bh, r, rk, rk < DK, T, DK, GATE_CHANNEL)
            qg = _rows(q, i_bh, ti, ti < T, rk, rk < DK, T, DK).to(tl.float32) * _dexp(hi, lo, hr[None, :], lr[None, :])
            kg = _rows(k, i_bh, tj, tj < T, rk, rk < DK, T, DK).to(tl.float32) * _dexp(hr[None, :], lr[None, :], hj, lj)
            acc += tl.dot(qg.to(DT), tl.trans(kg.to(DT)), input_precision=PREC)  # q_i e^(b_i-b_r) . k_j e^(b_r-b_j)
        _put_rows(a + J * SUB, acc, i_bh, ti, ti < T, rs, rs < SUB, T, C)
    acc = tl.zeros((SUB, SUB), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(DK, BK)):
        rk = i_k * BK + tl.arange(0, BK)
        qi = _rows(q, i_bh, ti, ti < T, rk, rk < DK, T, DK).to(tl.float32)
        hi, lo = _load_b(b_hi, b_lo, i_bh, ti, rk, rk < DK, T, DK, GATE_CHANNEL)
        for j in range(0, SUB):
            tj = i_n * C + I * SUB + j
            kj = tl.load(k + (i_bh * T + tj) * DK + rk, mask=(rk < DK) & (tj + 0 * rk < T), other=0.0).to(tl.float32)
            hj, lj = _load_b_row(b_hi, b_lo, i_bh, tj, rk, rk < DK, T, DK, GATE_CHANNEL)
            w = _dexp(hi, lo, hj[None, :], lj[None, :])                            # e^(b_i - b_j), (SUB, BK)
            col = tl.sum(tl.where(rs[:, None] >= j, qi * kj[None, :] * w, 0.0), axis=1)
            acc += tl.where(rs[None, :] == j, col[:, None], 0.0)
    _put_rows(a + I * SUB, acc, i_bh, ti, ti < T, rs, rs < SUB, T, C)


@triton.jit
def _scores(q, k, b_hi, b_lo, a, i_bh, t, T, DK: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
            GATE: tl.constexpr, PREC: tl.constexpr):
    """The bracket of (E2): [(Q K^T) * Gamma, j <= i] for one chunk, (C, C) fp32, zero above the
    diagonal (gated._chunk's ``A``); a per-channel gate reads it from scores_channel_kernel."""
    rc = tl.arange(0, C)
    causal = rc[:, None] >= rc[None, :]
    if GATE == GATE_CHANNEL:
        A = tl.load(a + (i_bh * T + t[:, None]) * C + rc[None, :], mask=(t < T)[:, None] & causal, other=0.0)
    else:
        A = tl.zeros((C, C), dtype=tl.float32)
        for i_k in range(0, tl.cdiv(DK, BK)):
            rk = i_k * BK + tl.arange(0, BK)
            qc = _rows(q, i_bh, t, t < T, rk, rk < DK, T, DK)
            kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK)
            A += tl.dot(qc, tl.trans(kc), input_precision=PREC)                   # Q K^T
        if GATE == GATE_SCALAR:
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rc, rc < C, T, 1, GATE)
            A = A * _gamma(hi, lo, causal)
    return tl.where(causal, A, 0.0)


@triton.jit
def output_kernel(q, k, v, b_hi, b_lo, h, a, o, T, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, PREC: tl.constexpr):
    """(E2), gated._chunk's ``o = A @ v + (q * b.exp()) @ S_prev``: one program per (V tile, chunk,
    batch*head), looping over K tiles for (Q * e^b) S_n."""
    i_v, i_n, i_bh = _program_ids()
    N = tl.cdiv(T, C)
    t = i_n * C + tl.arange(0, C)
    rv = i_v * BV + tl.arange(0, BV)
    DT = q.dtype.element_ty
    acc = tl.zeros((C, BV), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(DK, BK)):
        rk = i_k * BK + tl.arange(0, BK)
        qc = _rows(q, i_bh, t, t < T, rk, rk < DK, T, DK)
        hn = tl.load(_state_ptr(h, i_bh * N + i_n, rk, rv, DK, DV), mask=(rk < DK)[:, None] & (rv < DV)[None, :],
                     other=0.0)
        if GATE == GATE_CHANNEL:
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rk, rk < DK, T, DK, GATE)
            qc = (qc.to(tl.float32) * tl.exp(hi + lo)).to(DT)                     # Q * e^b
        acc += tl.dot(qc, hn, input_precision=PREC)
    if GATE == GATE_SCALAR:
        hi, lo = _load_b(b_hi, b_lo, i_bh, t, rv, rv < DV, T, 1, GATE)
        acc = acc * tl.exp(hi + lo)                                               # diag(e^b) Q S_n
    A = _scores(q, k, b_hi, b_lo, a, i_bh, t, T, DK, C, BK, GATE, PREC)
    vc = _rows(v, i_bh, t, t < T, rv, rv < DV, T, DV).to(tl.float32)
    acc += _causal_dot(A, vc, DT, PREC)                                           # + A V
    _put_rows(o, acc, i_bh, t, t < T, rv, rv < DV, T, DV)


@triton.jit
def dv_kernel(q, k, b_hi, b_lo, a, do, dh, dv, T, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
              BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, WITH_DH: tl.constexpr,
              PREC: tl.constexpr):
    """(E4): dV_n = A^T dO_n + (K * e^(b_last - b)) dS_{n+1}, A the bracket of (E2).
    WITH_DH=False leaves out the state term (the delta rule's local part, P^T dO)."""
    i_v, i_n, i_bh = _program_ids()
    N = tl.cdiv(T, C)
    t = i_n * C + tl.arange(0, C)
    rv = i_v * BV + tl.arange(0, BV)
    DT = q.dtype.element_ty
    acc = tl.zeros((C, BV), dtype=tl.float32)
    if WITH_DH:
        for i_k in range(0, tl.cdiv(DK, BK)):
            rk = i_k * BK + tl.arange(0, BK)
            kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK)
            dhn = tl.load(_state_ptr(dh, i_bh * N + i_n, rk, rv, DK, DV), mask=(rk < DK)[:, None] & (rv < DV)[None, :],
                          other=0.0)
            if GATE == GATE_CHANNEL:
                hi, lo = _load_b(b_hi, b_lo, i_bh, t, rk, rk < DK, T, DK, GATE)
                hl, ll = _load_b_row(b_hi, b_lo, i_bh, i_n * C + C - 1, rk, rk < DK, T, DK, GATE)
                kc = (kc.to(tl.float32) * _dexp(hl[None, :], ll[None, :], hi, lo)).to(DT)
            acc += tl.dot(kc, dhn, input_precision=PREC)                          # K dS_{n+1}
        if GATE == GATE_SCALAR:
            hi, lo = _load_b(b_hi, b_lo, i_bh, t, rv, rv < DV, T, 1, GATE)
            hl, ll = _load_b_row(b_hi, b_lo, i_bh, i_n * C + C - 1, rv, rv < DV, T, 1, GATE)
            acc = acc * _dexp(hl, ll, hi, lo)                                     # rows times e^(b_last - b)
    A = _scores(q, k, b_hi, b_lo, a, i_bh, t, T, DK, C, BK, GATE, PREC)
    doc = _rows(do, i_bh, t, t < T, rv, rv < DV, T, DV)
    acc += tl.dot(tl.trans(A.to(DT)), doc, input_precision=PREC)                 # + A^T dO
    _put_rows(dv, acc, i_bh, t, t < T, rv, rv < DV, T, DV)


@triton.jit
def dqk_kernel(q, k, v, b_hi, b_lo, h, dh, do, dvn, dq, dk, dw, dp, dbl, dg, T, DK: tl.constexpr,
               DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
               DELTA: tl.constexpr, PREC: tl.constexpr):
    """(E5) and (E6): dQ, dK and the gate's gradient for one (K tile, chunk, batch*head).

    Loops over V tiles for dO S_n^T, V dS_{n+1}^T and dP = dO V^T. Per-head or no gate: adds the
    intra-chunk terms and writes dq, dk and this K tile's share of dg (B*H, T), reverse-summed in
    the chunk. Per-channel gate: writes the inter-chunk parts, dP (B*H, T, C) and the b_last term
    dbl (B*H, N, DK); dqk_intra_channel_kernel finishes. DELTA: v holds V' and dvn its gradient;
    also writes dW = -dV' S_n^T (delta._chunk's ``V_new = U - W @ S``).
    """
    i_k, i_n, i_bh = _program_ids()
    N = tl.cdiv(T, C)
    rc = tl.arange(0, C)
    t = i_n * C + rc
    rk = i_k * BK + tl.arange(0, BK)
    causal = rc[:, None] >= rc[None, :]
    DT = q.dtype.element_ty
    dqa = tl.zeros((C, BK), dtype=tl.float32)
    dka = tl.zeros((C, BK), dtype=tl.float32)
    dwa = tl.zeros((C, BK), dtype=tl.float32)
    dP = tl.zeros((C, C), dtype=tl.float32)
    hd = tl.zeros((BK,), dtype=tl.float32)
    for i_v in range(0, tl.cdiv(DV, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        doc = _rows(do, i_bh, t, t < T, rv, rv < DV, T, DV)
        vc = _rows(v, i_bh, t, t < T, rv, rv < DV, T, DV)
        ms = (rk < DK)[:, None] & (rv < DV)[None, :]
        hn = tl.load(_state_ptr(h, i_bh * N + i_n, rk, rv, DK, DV), mask=ms, other=0.0)
        dhn = tl.load(_state_ptr(dh, i_bh * N + i_n, rk, rv, DK, DV), mask=ms, other=0.0)
        dqa += tl.dot(doc, tl.trans(hn), input_precision=PREC)                    # dO S_n^T
        dka += tl.dot(vc, tl.trans(dhn), input_precision=PREC)                    # V dS_{n+1}^T
        dP += tl.dot(doc, tl.trans(vc), input_precision=PREC)                     # dO V^T
        if GATE != GATE_NONE:
            hd += tl.sum(hn.to(tl.float32) * dhn.to(tl.float32), axis=1)          # rowsum(S_n * dS_{n+1})
        if DELTA:
            dvc = _rows(dvn, i_bh, t, t < T, rv, rv < DV, T, DV)
            dwa -= tl.dot(dvc.to(DT), tl.trans(hn), input_precision=PREC)         # -dV' S_n^T
    qc = _rows(q, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)
    kc = _rows(k, i_bh, t, t < T, rk, rk < DK, T, DK).to(tl.float32)
    if GATE != GATE_NONE:
        hi, lo = _load_b(b_hi, b_lo, i_bh, t, rk, rk < DK, T, DK, GATE)
        hl, ll = _load_b_row(b_hi, b_lo, i_bh, i_n * C + C - 1, rk, rk < DK, T, DK, GATE)
        dqa = dqa * tl.exp(hi + lo)
        if GATE == GATE_CHANNEL:
            dka = dka * _dexp(hl[None, :], ll[None, :], hi, lo)
        else:
            dka = dka * _dexp(hl, ll, hi, lo)
        # d/d b_last: e^b_last rowsum(S_n * dS_{n+1}) + sum_j k_j * dk_write_j, per channel
        last = hd * tl.exp(hl + ll) + tl.sum(kc * dka, axis=0)
    if DELTA:
        _put_rows(dw, dwa, i_bh, t, t < T, rk, rk < DK, T, DK)
    if GATE == GATE_CHANNEL:
        _put_rows(dq, dqa, i_bh, t, t < T, rk, rk < DK, T, DK)
        _put_rows(dk, dka, i_bh, t, t < T, rk, rk < DK, T, DK)
        tl.store(dbl + (i_bh * N + i_n) * DK + rk, last, mask=rk < DK)
        if i_k == 0:
            _put_rows(dp, dP, i_bh, t, t < T, rc, rc < C, T, C)
    else:
        if GATE == GATE_SCALAR:
            dP = dP * _gamma(hi, lo, causal)
        dP = tl.where(causal, dP, 0.0)
        dqa += tl.dot(dP.to(DT), kc.to(DT), input_precision=PREC)                # [dP * Gamma] K
        dka += tl.dot(tl.trans(dP.to(DT)), qc.to(DT), input_precision=PREC)      # [dP * Gamma]^T Q
        _put_rows(dq, dqa, i_bh, t, t < T, rk, rk < DK, T, DK)
        _put_rows(dk, dka, i_bh, t, t < T, rk, rk < DK, T, DK)
        if GATE == GATE_SCALAR:
            db = tl.sum(qc * dqa - kc * dka, axis=1)                              # (E6) per token
            db += tl.where(rc == C - 1, tl.sum(last, axis=0), 0.0)
            tl.store(dg + (i_k * tl.num_programs(2) + i_bh) * T + t, tl.cumsum(db, 0, reverse=True), mask=t < T)


@triton.jit
def dqk_intra_channel_kernel(q, k, b_hi, b_lo, dp, dq_in, dk_in, dbl, dq, dk, dg, T, DK: tl.constexpr,
                             C: tl.constexpr, BK: tl.constexpr, SUB: tl.constexpr, PREC: tl.constexpr):
    """(E5)'s intra-chunk terms and (E6) for a per-channel gate, on (SUB, BK) tiles:
    dq_i += sum_{j <= i} dP_ij k_j e^(b_i - b_j),  dk_j += sum_{i >= j} dP_ij q_i e^(b_i - b_j).
    Sub-blocks off the diagonal split the weight at a token between them (two factors <= 1, one
    matmul); the diagonal sub-block goes one column j at a time. Sub-blocks run last to first so
    that dg, the reverse cumulative sum of db, carries over. dq_in, dk_in hold the inter-chunk
    parts (fp32) from dqk_kernel; dq, dk receive the full gradients (gated._intra_channel,
    differentiated)."""
    NC: tl.constexpr = C // SUB
    i_k, i_n, i_bh = _program_ids()
    N = tl.cdiv(T, C)
    rs = tl.arange(0, SUB)
    rk = i_k * BK + tl.arange(0, BK)
    mk = rk < DK
    DT = q.dtype.element_ty
    carry = tl.zeros((BK,), dtype=tl.float32)
    for ii in range(0, NC):
        I = NC - 1 - ii
        ti = i_n * C + I * SUB + rs
        qi = _rows(q, i_bh, ti, ti < T, rk, mk, T, DK).to(tl.float32)
        ki = _rows(k, i_bh, ti, ti < T, rk, mk, T, DK).to(tl.float32)
        hi, lo = _load_b(b_hi, b_lo, i_bh, ti, rk, mk, T, DK, GATE_CHANNEL)
        dqi = _rows(dq_in, i_bh, ti, ti < T, rk, mk, T, DK)
        dki = _rows(dk_in, i_bh, ti, ti < T, rk, mk, T, DK)
        # dq from sub-blocks J < I, split at r = the first token of I
        hr, lr = _load_b_row(b_hi, b_lo, i_bh, i_n * C + I * SUB, rk, mk, T, DK, GATE_CHANNEL)
        acc = tl.zeros((SUB, BK), dtype=tl.float32)
        for J in range(0, I):
            tj = i_n * C + J * SUB + rs
            hj, lj = _load_b(b_hi, b_lo, i_bh, tj, rk, mk, T, DK, GATE_CHANNEL)
            kg = _rows(k, i_bh, tj, tj < T, rk, mk, T, DK).to(tl.float32) * _dexp(hr[None, :], lr[None, :], hj, lj)
            dpij = _rows(dp + J * SUB, i_bh, ti, ti < T, rs, rs < SUB, T, C)
            acc += tl.dot(dpij.to(DT), kg.to(DT), input_precision=PREC)           # dP_IJ (k_j e^(b_r - b_j))
        dqi += acc * _dexp(hi, lo, hr[None, :], lr[None, :])                      # times e^(b_i - b_r)
        # dk from sub-blocks I2 > I, split at e = the last token of I
        he, le = _load_b_row(b_hi, b_lo, i_bh, i_n * C + I * SUB + SUB - 1, rk, mk, T, DK, GATE_CHANNEL)
        acc = tl.zeros((SUB, BK), dtype=tl.float32)
        for I2 in range(I + 1, NC):
            t2 = i_n * C + I2 * SUB + rs
            h2, l2 = _load_b(b_hi, b_lo, i_bh, t2, rk, mk, T, DK, GATE_CHANNEL)
            qg = _rows(q, i_bh, t2, t2 < T, rk, mk, T, DK).to(tl.float32) * _dexp(h2, l2, he[None, :], le[None, :])
            dp2 = _rows(dp + I * SUB, i_bh, t2, t2 < T, rs, rs < SUB, T, C)
            acc += tl.dot(tl.trans(dp2.to(DT)), qg.to(DT), input_precision=PREC)  # dP_I2,I^T (q_i e^(b_i - b_e))
        dki += acc * _dexp(he[None, :], le[None, :], hi, lo)                      # times e^(b_e - b_j)
        # the diagonal sub-block, one column j at a time
        for j in range(0, SUB):
            tj = i_n * C + I * SUB + j
            kj = tl.load(k + (i_bh * T + tj) * DK + rk, mask=mk & (tj + 0 * rk < T), other=0.0).to(tl.float32)
            hj, lj = _load_b_row(b_hi, b_lo, i_bh, tj, rk, mk, T, DK, GATE_CHANNEL)
            dpc = tl.load(dp + (i_bh * T + ti) * C + I * SUB + j, mask=ti < T, other=0.0)      # dP[:, j]
            w = tl.where(rs[:, None] >= j, dpc[:, None] * _dexp(hi, lo, hj[None, :], lj[None, :]), 0.0)
            dqi += w * kj[None, :]
            dki += tl.where(rs[:, None] == j, tl.sum(w * qi, axis=0)[None, :], 0.0)
        db = qi * dqi - ki * dki                                                  # (E6)
        last = tl.load(dbl + (i_bh * N + i_n) * DK + rk, mask=mk, other=0.0)
        db += tl.where((rs[:, None] == SUB - 1) & (I == NC - 1), last[None, :], 0.0)
        _put_rows(dg, tl.cumsum(db, 0, reverse=True) + carry[None, :], i_bh, ti, ti < T, rk, mk, T, DK)
        carry += tl.sum(db, axis=0)
        _put_rows(dq, dqi, i_bh, ti, ti < T, rk, mk, T, DK)
        _put_rows(dk, dki, i_bh, ti, ti < T, rk, mk, T, DK)
