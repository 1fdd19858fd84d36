"""Pieces shared by the Triton kernels: gate codes, tile chooser, launcher, and the jit helpers.

Conventions of every kernel in mlexp.ops.triton_*:

* Tensors are contiguous (B*H, T, D) rows; the wrappers make them so and save those copies.
* A sequence of T tokens is cut into N = ceil(T / C) chunks of C tokens; tokens past T load as 0.
* b is the chunk-local cumulative log-decay, b_t = g_(chunk start) + ... + g_t, kept as a
  compensated pair (b_hi, b_lo) with b = b_hi + b_lo (see ``_cumsum_kernel``). A weight
  e^(b_i - b_j) is always formed as exp of a difference of pairs (``_dexp``) and only for
  j <= i, so every exponent is <= 0: nothing overflows and a hard reset (g = -inf) gives 0.
* Dot operands are the input dtype (bf16 / fp16 multiplied as such) with fp32 accumulation;
  fp32 inputs use ``input_precision="tf32x3"`` (three TF32 products, about fp32 accuracy) on
  chunks and K/V tiles of 32 (``chunk_len``, ``tile``), which fit the registers of sm_80 (so do
  all dtypes before sm_80).
* Every program id is converted to int64 before it enters an offset (B*H*T*D may pass 2^31).
"""
import enum

import torch
import triton
import triton.language as tl

__all__ = ["Gate", "CHUNKS", "SUB", "G_FLOOR", "MAX_STATE_DK", "block", "tile", "dqk_tiles", "chunk_len", "check_chunk",
           "precision", "sm_count", "state_tiles",
           "config", "launch", "recording", "chunk_cumsum"]


class Gate(enum.IntEnum):
    """What decays the state: nothing, one log-decay per head and token, or one per key channel."""
    NONE = 0
    SCALAR = 1
    CHANNEL = 2


# The same codes as compile-time constants inside the kernels.
GATE_NONE = tl.constexpr(int(Gate.NONE))
GATE_SCALAR = tl.constexpr(int(Gate.SCALAR))
GATE_CHANNEL = tl.constexpr(int(Gate.CHANNEL))

CHUNKS = (16, 32, 64)      # chunk sizes C the kernels accept: (C, C) score tiles fit in registers
SUB = 16                   # sub-chunk for per-channel decay: the (16, 16) tiles of gated._intra_channel
G_FLOOR = -1000.0          # g below this is a hard reset either way: e^-1000 is 0 in float32 and float64
_G_FLOOR = tl.constexpr(G_FLOOR)
MAX_STATE_DK = 256         # the delta-rule state kernel holds all of Dk in one tile
TILE = 64                  # K and V tiles of the linear/gated kernels (at most 64 x 64)
F32_PRECISION = "tf32x3"   # dot precision for fp32 operands: three TF32 products, ~fp32 accuracy
_F32_PRECISION = tl.constexpr(F32_PRECISION)


def block(D, cap=TILE):
    """Tile length for a dimension of size D: a power of two, at least 16 (a tl.dot tile), at most cap."""
    return min(cap, max(16, triton.next_power_of_2(D)))


# fp32 operands take twice the registers of 16-bit ones and tf32x3 splits each in two: on sm_80
# (operands of mma in registers) 64-wide fp32 tiles spilled up to 14 KB per thread. On sm_75 (a T4,
# Colab's free GPU) even 16-bit 64-wide tiles did. Those run with chunks and K/V tiles of 32; the
# result does not depend on them beyond rounding.
NARROW_TILE = 32
CAPABILITY_ELSEWHERE = (9, 0)   # compute capability assumed off CUDA; the AOT check sets its target's


def capability(device):
    """(major, minor) compute capability of a CUDA device (no synchronisation); CAPABILITY_ELSEWHERE otherwise."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else CAPABILITY_ELSEWHERE


def _narrow(dtype, device):
    return dtype == torch.float32 or capability(device) < (8, 0)


def tile(D, dtype, device):
    """K or V tile of the chunk kernels: block(D), at most 32 for fp32 operands or before sm_80."""
    return block(D, NARROW_TILE if _narrow(dtype, device) else TILE)


def dqk_tiles(Dk, Dv, dtype, device):
    """(BK, BV) of dqk_kernel: tiles, halved (to at least 16) before sm_90, where the operands of mma
    stay in registers and the kernel's (C, BK) accumulators and (C, C) dP already take half of them,
    and for fp32 operands (tf32x3 splits each in two)."""
    BK, BV = tile(Dk, dtype, device), tile(Dv, dtype, device)
    if _dqk_small(dtype, device):
        BK, BV = max(16, BK // 2), max(16, BV // 2)
    return BK, BV


def _dqk_small(dtype, device):
    """Before sm_90 (mma operands in registers), or with fp32 operands split in two by tf32x3."""
    return capability(device) < (9, 0) or dtype == torch.float32


def chunk_len(C, dtype, device):
    """The chunk the kernels use for a requested C (already checked): C, at most 32 where tiles are narrow."""
    return min(C, NARROW_TILE) if _narrow(dtype, device) else C


SMS_ELSEWHERE = 132       # the SM count assumed off CUDA (an H100); tests lower it to get the widest tiles


def sm_count(device):
    """Streaming multiprocessors of a CUDA device (no synchronisation); SMS_ELSEWHERE otherwise."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else SMS_ELSEWHERE


def state_tiles(Dk, Dv, heads, device, dtype):
    """(BK, BV) of the sequential state kernels of linear/gated attention: 64 x 64 tiles, narrowed to
    32 and then 16 while the grid (K tiles x V tiles x heads) would leave SMs idle; the chunk loop is
    the one sequential part, so small batches need the parallelism across tiles (fla autotunes the
    same choice among 32 and 64)."""
    BK, BV = tile(Dk, dtype, device), tile(Dv, dtype, device)
    while BK * BV > 256 and triton.cdiv(Dk, BK) * triton.cdiv(Dv, BV) * heads < sm_count(device):
        if BK >= BV:
            BK //= 2
        else:
            BV //= 2
    return BK, BV


def check_chunk(C, T=0, heads=0):
    """Raise ValueError unless C is a chunk size the kernels accept (16, 32 or 64) and the grids fit
    CUDA's limits: chunks and batch*heads each index a grid axis of at most 65535 programs."""
    if C not in CHUNKS:
        raise ValueError(f"impl='triton' needs chunk_size in {CHUNKS} ((C, C) score tiles held in registers); "
                         f"got {C}. The chunk size does not change the result; use 64.")
    if triton.cdiv(T, C) > 65535 or heads > 65535:
        raise ValueError(f"impl='triton' runs one program per chunk and per batch*head on grid axes of at most "
                         f"65535; got {triton.cdiv(T, C)} chunks of {C} and {heads} batch*heads. Split the batch "
                         "or the sequence (carrying the state), or use impl='chunk'.")


def precision(dtype):
    """input_precision for tl.dot on operands of ``dtype``: tf32x3 for fp32, unused for 16-bit."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"impl='triton' computes bf16, fp16 and fp32 inputs; got {dtype}. "
                         "Use impl='chunk' for float64.")
    return F32_PRECISION if dtype == torch.float32 else "tf32"


# ----------------------------------------------------------------------------- launching

# (num_warps, num_stages) per kind of kernel, for 16-bit and for fp32 operands. The AOT check
# (mlexp.ops.triton_check) compiles every kernel with these for sm_80 and sm_90a and reports
# registers, spills and shared memory; fp32 tiles take twice the bytes and tf32x3 splits each
# operand in two, hence fewer pipeline stages there.
_CONFIGS = {
    "state": ((4, 2), (4, 2)),        # (E1), (E3): sequential over chunks, one (BK, BV) state tile
    "output": ((4, 2), (4, 2)),       # (E2), (E4): chunk-parallel, loop over K tiles
    "scores": ((4, 2), (4, 2)),       # per-channel intra-chunk scores on (16, 16) sub-tiles
    "dqk": ((8, 2), (8, 2)),          # (E5), (E6): chunk-parallel, loop over V tiles; four (C, 64) accumulators
    "intra": ((4, 2), (4, 2)),        # per-channel intra-chunk dq, dk, dg
    "wy": ((8, 1), (8, 1)),           # delta rule: triangular solve, W and U, and their gradients: (C, C) tiles
    "delta_state": ((8, 2), (4, 1)),  # delta rule: sequential, the state as up to four (64, BV) slices
}


# Before sm_90 the operands of mma live in registers; the dqk kernel's second pipeline stage cost
# up to 430 B of spill per thread there (and nothing on sm_90a with 16-bit operands; fp32 ones
# take this configuration everywhere).
_CONFIGS_BEFORE_SM90 = {"dqk": ((8, 1), (8, 1))}


def config(kind, dtype, device):
    """dict(num_warps=..., num_stages=...) for a kind of kernel, operand dtype and device (see _CONFIGS)."""
    table = _CONFIGS_BEFORE_SM90 if kind in _CONFIGS_BEFORE_SM90 and _dqk_small(dtype, device) else _CONFIGS
    num_warps, num_stages = table[kind][dtype == torch.float32]
    return dict(num_warps=num_warps, num_stages=num_stages)


_RECORD = None


def launch(kernel, grid, *args, num_warps, num_stages, **constexprs):
    """Run ``kernel[grid](*args, **constexprs)``; under :func:`recording`, note the call instead.

    Every kernel of mlexp.ops goes through here, so the ahead-of-time compile check
    (mlexp.ops.triton_check) compiles exactly the launches the wrappers make.
    """
    if _RECORD is not None:
        _RECORD.append(dict(kernel=kernel, grid=tuple(grid), args=args, constexprs=constexprs,
                            num_warps=num_warps, num_stages=num_stages))
        return
    kernel[tuple(grid)](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)


class recording:
    """Context manager: collect launches (a list of dicts) instead of running them."""

    def __enter__(self):
        global _RECORD
        self._prev, _RECORD = _RECORD, []
        return _RECORD

    def __exit__(self, *exc):
        global _RECORD
        _RECORD = self._prev
        return False


# ----------------------------------------------------------------------------- jit helpers


@triton.jit
def _program_ids():
    """The three program ids as int64 (a 2-D grid gets 0 for the third): every offset built from
    them is then 64-bit, so (B*H) * T * D past 2^31 cannot wrap. Kernels take ids only from here."""
    return (tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64))


@triton.jit
def _rows(ptr, bh, t, mt, rd, md, T, D: tl.constexpr):
    """Load the (len(t), len(rd)) tile of a (B*H, T, D) tensor at tokens t, columns rd; 0 where masked."""
    return tl.load(ptr + (bh * T + t[:, None]) * D + rd[None, :], mask=mt[:, None] & md[None, :], other=0.0)


@triton.jit
def _put_rows(ptr, x, bh, t, mt, rd, md, T, D: tl.constexpr):
    """Store x into the tile of a (B*H, T, D) tensor read by _rows, cast to the tensor's dtype."""
    tl.store(ptr + (bh * T + t[:, None]) * D + rd[None, :], x.to(ptr.dtype.element_ty), mask=mt[:, None] & md[None, :])


@triton.jit
def _state_ptr(ptr, i, rk, rv, DK: tl.constexpr, DV: tl.constexpr):
    """Pointers to the (BK, BV) tile of state number i in a (..., DK, DV) stack of states."""
    return ptr + (i * DK + rk[:, None]) * DV + rv[None, :]


@triton.jit
def _two_sum(a_hi, a_lo, b_hi, b_lo):
    """(a_hi + a_lo) + (b_hi + b_lo) as a pair: the rounding error of a_hi + b_hi is kept exactly
    (Knuth's TwoSum), so a cumulative sum of pairs loses nothing to large partial sums."""
    s = a_hi + b_hi
    bb = s - a_hi
    return s, a_lo + b_lo + ((a_hi - (s - bb)) + (b_hi - bb))


@triton.jit
def _dexp(hi_a, lo_a, hi_b, lo_b):
    """e^(b_a - b_b) from compensated pairs; the callers only pass b_b >= b_a (a decay <= 1)."""
    return tl.exp((hi_a - hi_b) + (lo_a - lo_b))


@triton.jit
def _load_b(b_hi, b_lo, bh, t, rk, mk, T, DK: tl.constexpr, GATE: tl.constexpr):
    """b at tokens t: (C, BK) per channel, (C, 1) per head. Rows past T read row T - 1, which is
    what a zero-padded g would give, so pads never see an exponent > 0."""
    tc = tl.minimum(t, T - 1)
    if GATE == GATE_CHANNEL:
        off = (bh * T + tc[:, None]) * DK + rk[None, :]
        return (tl.load(b_hi + off, mask=mk[None, :], other=0.0),
                tl.load(b_lo + off, mask=mk[None, :], other=0.0))
    else:
        off = bh * T + tc
        return tl.load(b_hi + off)[:, None], tl.load(b_lo + off)[:, None]


@triton.jit
def _load_b_row(b_hi, b_lo, bh, t, rk, mk, T, DK: tl.constexpr, GATE: tl.constexpr):
    """b at one token t (clamped to T - 1): (BK,) per channel, a scalar per head."""
    tc = tl.minimum(t, T - 1)
    if GATE == GATE_CHANNEL:
        off = (bh * T + tc) * DK + rk
        return tl.load(b_hi + off, mask=mk, other=0.0), tl.load(b_lo + off, mask=mk, other=0.0)
    else:
        return tl.load(b_hi + bh * T + tc), tl.load(b_lo + bh * T + tc)


@triton.jit
def _gamma(hi, lo, causal):
    """Gamma_ij = e^(b_i - b_j) for j <= i, 0 above the diagonal; hi, lo (C, 1) -> (C, C).
    The exponent is set to -inf above the diagonal before exp (gated._decay_matrix)."""
    d = (hi - tl.trans(hi)) + (lo - tl.trans(lo))
    return tl.exp(tl.where(causal, d, float("-inf")))


@triton.jit
def _causal_dot(P, X, DT: tl.constexpr, PREC: tl.constexpr):
    """P @ X for a causally masked P (C, C) and X (C, D) in fp32, without leaking non-finite rows.

    Row i of P has exact zeros for j > i, but 0 * nan = nan, so a NaN in a later row of X would
    reach earlier outputs. X is used with non-finite entries replaced by 0, and output (i, d) is
    set to NaN when some X_jd with j <= i is non-finite: what the recurrent loop gives (a NaN
    written at step j reaches every later read of that column, never an earlier one).
    """
    bad = ~(tl.abs(X) < float("inf"))                                   # NaN or +-inf
    out = tl.dot(P.to(DT), tl.where(bad, 0.0, X).to(DT), input_precision=PREC)
    seen = tl.cumsum(bad.to(tl.int32), 0) > 0                           # some j <= i was bad
    return tl.where(seen, float("nan"), out)


# ----------------------------------------------------------------------------- cumulative log-decay


@triton.jit
def _cumsum_kernel(g, b_hi, b_lo, T, D: tl.constexpr, C: tl.constexpr, BD: tl.constexpr):
    """b = chunk-local cumulative sum of g as a compensated pair (gated._chunk: ``g.cumsum(dim=3)``).

    One program per (block of BD channels, chunk, batch*head); g is (B*H, T, D) (D = 1 per head).
    g is clamped below at G_FLOOR first (a hard reset stays a hard reset, -inf becomes finite),
    and the TwoSum scan keeps small gates exact after a large one: with g = [-1e30, -0.69]
    the pair still holds the -0.69 that a float32 cumsum rounds away.
    """
    i_d, i_n, i_bh = _program_ids()
    t = i_n * C + tl.arange(0, C)
    rd = i_d * BD + tl.arange(0, BD)
    m = (t < T)[:, None] & (rd < D)[None, :]
    off = (i_bh * T + t[:, None]) * D + rd[None, :]
    x = tl.load(g + off, mask=m, other=0.0).to(tl.float32)
    x = tl.where(x < _G_FLOOR, _G_FLOOR, x)                             # NaN stays NaN
    hi, lo = tl.associative_scan((x, tl.zeros_like(x)), 0, _two_sum)
    tl.store(b_hi + off, hi, mask=m)
    tl.store(b_lo + off, lo, mask=m)


def chunk_cumsum(g, C):
    """(b_hi, b_lo), float32 of g's shape: the chunk-local cumulative log-decay of g (B, H, T[, Dk])."""
    D = g.shape[3] if g.dim() == 4 else 1
    B, H, T = g.shape[:3]
    b_hi = torch.empty(g.shape, dtype=torch.float32, device=g.device)
    b_lo = torch.empty_like(b_hi)
    BD = block(D)
    launch(_cumsum_kernel, (triton.cdiv(D, BD), triton.cdiv(T, C), B * H), g, b_hi, b_lo, T,
           num_warps=4, num_stages=1, D=D, C=C, BD=BD)
    return b_hi, b_lo
