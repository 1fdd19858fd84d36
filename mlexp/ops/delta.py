"""Delta-rule ops (DeltaNet, Gated DeltaNet): a recurrent loop and the chunkwise WY/UT form."""
import torch
import torch.nn.functional as F

from ._common import (autocast_off, check_chunk_size, check_log_decay, check_qkv, check_state, check_values,
                      compute_dtype, decay_after, decay_pairs, empty_output, finite_guard, fresh_state,
                      matmul_add, mild_decay, resolve_impl)

__all__ = ["delta_rule", "gated_delta_rule", "KEY_NORM_TOL"]

IMPLS = ("recurrent", "chunk", "triton")                         # no "parallel" form for the delta rule

# How far |k_t| may stray from 1 before the keys count as "not L2-normalised", per input dtype.
# A unit vector rounded to bf16 keeps its norm within about 4e-3 of 1, hence the looser 16-bit bound.
KEY_NORM_TOL = {torch.float64: 1e-3, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def delta_rule(q, k, v, beta, *, initial_state=None, impl=None, chunk_size=64, scale=None,
               normalize_qk=False):
    """DeltaNet: S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t.

    Each token first reads what the state holds for its key (S^T k) and then writes only the
    error beta (v - S^T k): one step of online least squares (Schlag et al. 2021, "Linear
    Transformers Are Secretly Fast Weight Programmers"; chunkwise training form from Yang et al.
    2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length").

    Args:
        q, k: (B, H, T, Dk) queries and keys; keys must be L2-normalised along Dk (|k| within
            ``KEY_NORM_TOL[dtype]`` of 1: 1e-3 for fp32/fp64, 1e-2 for fp16/bf16) unless
            ``normalize_qk=True``, which L2-normalises q and k here.
        v: (B, H, T, Dv) values.
        beta: (B, H, T) write strength, in [0, 2] (usually a sigmoid, in [0, 1]).
        initial_state: optional (B, H, Dk, Dv) state S_0 (write convention: S = sum k v^T).
        impl: "recurrent" (the readable loop, the test oracle), "chunk" (chunkwise PyTorch,
            autograd works) or "triton" (Triton kernels forward and backward: bf16/fp16
            operands multiplied as such with fp32 accumulation, fp32 in tf32x3; see "The Triton kernels"
            in docs/contributors.md). None picks "triton" for CUDA tensors when triton imports and the
            dtype is not float64, else "chunk".
        chunk_size: tokens per chunk C for "chunk" and "triton" (triton: 16, 32 or 64; fp32
            inputs run in chunks of at most 32 there).
        scale: optional multiplier applied to q (after normalize_qk), e.g. Dk ** -0.5; None
            means 1, the syllabus' equations as written (the same default as linear_attention).
        normalize_qk: L2-normalise q and k along Dk before use.

    Returns:
        o: (B, H, T, Dv) in v's dtype; S: (B, H, Dk, Dv) final state in the accumulation dtype:
        float32 (float64 for float64 inputs), a new tensor (at T = 0 a copy of ``initial_state``).
        fp16/bf16 inputs are computed in float32.

    Raises:
        ValueError: wrong shapes, dtypes or devices, keys not L2-normalised (an infinite key is
            not; with normalize_qk=True it becomes NaN), beta outside [0, 2], an unknown impl, a
            bad chunk size, or "triton" where it cannot run (no triton, a CPU tensor without
            TRITON_INTERPRET=1, float64 inputs).

    Non-finite inputs: a NaN or +-inf in q spoils only that token's output; one in k, v, beta (NaN)
        or g
        spoils that token's output, every later output of its batch and head, and the final
        state (all NaN), and nothing before it, on every path (see _common.finite_guard).

    Example (the same key written twice with beta = 1: the second value replaces the first):

        >>> import torch
        >>> k = torch.tensor([1.0, 0.0]).expand(1, 1, 2, 2)
        >>> v = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
        >>> o, S = delta_rule(k, k, v, torch.ones(1, 1, 2))
        >>> o[0, 0].tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    return _run(q, k, v, beta, None, initial_state, impl, chunk_size, scale, normalize_qk)


def gated_delta_rule(q, k, v, beta, g, *, initial_state=None, impl=None, chunk_size=64, scale=None,
                     normalize_qk=False):
    """Gated DeltaNet: S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t.

    The decay alpha_t = exp(g_t) erases the whole state quickly, the delta rule overwrites one key
    precisely (Yang, Kautz, Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta
    Rule"). Arguments and returns as in :func:`delta_rule`, plus

    Args:
        g: (B, H, T) log-decay, g <= 0 (alpha = exp(g) in [0, 1]); e.g. ``F.logsigmoid(x)``;
            g = -inf is a hard reset. Decays between tokens are direct sums of the gates they
            span (as in :func:`mlexp.ops.gated_linear_attention`), exact for any g in [-inf, 0].

    Raises:
        ValueError: as :func:`delta_rule`, and when g has a positive entry or the wrong shape.

    Example (a hard reset at token 1 with beta = 1/2, then two halvings):

        >>> import torch
        >>> q = k = v = torch.ones(1, 1, 4, 1)
        >>> half = torch.tensor(0.5).log().item()
        >>> g = torch.tensor([[[0.0, float("-inf"), half, half]]])
        >>> o, S = gated_delta_rule(q, k, v, torch.full((1, 1, 4), 0.5), g)
        >>> [round(x, 4) for x in o.flatten().tolist()]
        [0.5, 0.5, 0.625, 0.6562]
    """
    if g is None:
        raise ValueError("gated_delta_rule needs g (B, H, T); use delta_rule for no decay")
    return _run(q, k, v, beta, g, initial_state, impl, chunk_size, scale, normalize_qk)


# ----------------------------------------------------------------------------- input checks


def _check(q, k, v, beta, g, initial_state, chunk_size):
    """Raise ValueError with a hint if shapes or value ranges break the op's contract."""
    B, H, T, Dk, Dv = check_qkv(q, k, v)
    check_chunk_size(chunk_size)
    if initial_state is not None:
        check_state(initial_state, (B, H, Dk, Dv), q.device)
    if not isinstance(beta, torch.Tensor) or beta.shape != (B, H, T):
        raise ValueError(f"beta must be a tensor of shape (B, H, T) = {(B, H, T)}, one write strength "
                         f"per head and token; got {getattr(beta, 'shape', type(beta).__name__)}")
    if beta.device != q.device:
        raise ValueError(f"beta is on {beta.device} but q is on {q.device}; move it with .to(q.device)")
    if g is not None and check_log_decay(g, q):
        raise ValueError(f"gated_delta_rule takes one decay per head and token, g of shape (B, H, T) "
                         f"= {(B, H, T)}; per-key-channel decay (B, H, T, Dk) is not supported")
    with torch.no_grad():
        if check_values(beta) and beta.numel() and (beta.min() < 0 or beta.max() > 2):
            raise ValueError(f"beta must lie in [0, 2] (eigenvalue 1 - beta |k|^2 of the update "
                             f"must stay in [-1, 1]); got range [{beta.min().item():.3g}, "
                             f"{beta.max().item():.3g}]. Use torch.sigmoid(x) for beta.")
    return B, H, T, Dk, Dv


def _check_keys(k):
    """Raise ValueError unless every key has L2 norm 1 within KEY_NORM_TOL[k.dtype] (a value
    check: see _common.check_values)."""
    if k.numel() == 0 or not check_values(k):
        return
    tol = KEY_NORM_TOL[k.dtype]
    with torch.no_grad():
        err = (k.float().norm(dim=-1) - 1).abs().max().item()
    if err > tol:
        raise ValueError(f"delta-rule keys must be L2-normalised along the last dim (|k| = 1 within "
                         f"{tol:g}); the largest deviation is {err:.3g}. Pass normalize_qk=True or "
                         f"apply F.normalize(k, dim=-1) first.")


def _run(q, k, v, beta, g, initial_state, impl, chunk_size, scale, normalize_qk):
    """Check, normalise and scale the inputs, then call the chosen implementation, with autocast off."""
    B, H, T, Dk, Dv = _check(q, k, v, beta, g, initial_state, chunk_size)
    with autocast_off(q.device):                                 # the dtype rule holds under autocast too
        return _dispatch(q, k, v, beta, g, initial_state, impl, chunk_size, scale, normalize_qk)


def _dispatch(q, k, v, beta, g, initial_state, impl, chunk_size, scale, normalize_qk):
    """_run after the checks: the empty case, normalisation, scale, then the chosen path."""
    B, H, T, Dk, Dv = *q.shape, v.shape[-1]
    chosen = resolve_impl(impl, q.device, q.dtype, IMPLS)
    acc = compute_dtype(q.dtype)                                 # fp16/bf16/fp32 -> fp32, fp64 stays
    if B * H * T == 0:                                           # empty in, empty out; a copy of the state
        S0 = q.new_zeros(B, H, Dk, Dv, dtype=acc) if initial_state is None else initial_state.to(acc)
        return empty_output(v, q, k, beta, g), fresh_state(S0)
    if normalize_qk:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    else:
        _check_keys(k)
    if scale is not None:
        q = q * scale
    if chosen == "triton":
        from .triton_delta import delta_rule_triton  # imported late: TRITON_INTERPRET is read at import
        return delta_rule_triton(q, k, v, beta, g, initial_state, chunk_size)
    out_dtype = v.dtype
    q, k, v, beta, g, S0 = [None if x is None else x.to(acc) for x in (q, k, v, beta, g, initial_state)]
    if chosen == "recurrent":
        o, S = _recurrent(q, k, v, beta, g, S0)
    else:
        o, S = finite_guard(lambda q, k, v, g, beta: _chunk(q, k, v, beta, g, S0, chunk_size), q, k, v, g, beta)
    return o.to(out_dtype), S


# ----------------------------------------------------------------------------- recurrent loop


def _recurrent(q, k, v, beta, g, S0):
    """The readable ground truth: one token at a time. Shapes as delta_rule; g may be None."""
    B, H, T, Dk = k.shape
    S = k.new_zeros(B, H, Dk, v.shape[-1]) if S0 is None else S0.clone()  # (B, H, Dk, Dv)
    out = []
    for t in range(T):
        if g is not None:
            S = g[:, :, t, None, None].exp() * S                  # decay: alpha_t S
        k_t, v_t, b_t = k[:, :, t], v[:, :, t], beta[:, :, t, None]
        v_old = torch.einsum("bhk,bhkv->bhv", k_t, S)             # what S holds for k_t: S^T k_t
        S = S + torch.einsum("bhk,bhv->bhkv", k_t, b_t * (v_t - v_old))  # write the error only
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))  # read: o_t = S_t^T q_t
    o = torch.stack(out, dim=2) if out else v.new_zeros(v.shape)  # (B, H, T, Dv)
    return o, S


# ----------------------------------------------------------------------------- chunkwise form


def _chunk(q, k, v, beta, g, S0, C):
    """Chunkwise WY/UT form (Yang et al. 2024; gated: Yang et al. 2025). g and S0 may be None.

    Derivation in one paragraph. Write u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t) for what token t
    actually adds, so S_t = alpha_t S_{t-1} + k_t u_t^T. Unrolled from the chunk's incoming state
    S_0 with log-decays b_t = g_1 + ... + g_t (decay_into) and Gamma_tj = exp(g_{j+1} + .. + g_t):
        S_t = e^{b_t} S_0 + sum_{j<=t} Gamma_tj k_j u_j^T.
    Putting that into u_t gives a unit lower-triangular system for all u of the chunk at once:
        (I + A) U = diag(beta) (V - diag(e^b) K S_0),   A_tj = beta_t Gamma_tj k_t.k_j (j < t)
    so with W = (I + A)^-1 diag(beta) diag(e^b) K and U~ = (I + A)^-1 diag(beta) V we get
    U = V' = U~ - W S_0 (the UT transform; W and U~ need no S_0 and are computed for every chunk
    in parallel). Then
        O = diag(e^b) Q S_0 + (Q K^T * Gamma, causal incl. diagonal) V',
        S_C = e^{b_C} S_0 + (diag(e^{b_C - b}) K)^T V'   (e^{b_C - b}: decay_after, a direct sum).
    Gamma comes as one matmul of pre-scaled keys (K e^b)(K e^-b)^T for chunks that decay by at
    most e^-30, exactly from decay_pairs for the others (a hard reset, a strong gate); see
    _common.mild_decay. Without a gate all decays are 1. A ragged tail is zero-padded:
    k = v = beta = g = 0 changes neither S nor the kept outputs.
    """
    B, H, T, Dk = k.shape
    Dv = v.shape[-1]
    N = -(-T // C)                                               # number of chunks
    pad = N * C - T
    if N == 0:                                                   # empty sequence: nothing is written
        return v.new_zeros(v.shape), (k.new_zeros(B, H, Dk, Dv) if S0 is None else S0)
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta, g = F.pad(beta, (0, pad)), (None if g is None else F.pad(g, (0, pad)))
    q, k = q.reshape(B, H, N, C, Dk), k.reshape(B, H, N, C, Dk)  # (B, H, T, D) -> (B, H, N, C, D)
    v, beta = v.reshape(B, H, N, C, Dv), beta.reshape(B, H, N, C, 1)

    if g is None:                                                # no decay: every factor is 1
        q_in, k_in, k_out, k_end = q, k, k, k
    else:
        g = g.reshape(B, H, N, C, 1)
        b, e_in, e_out, strong = mild_decay(g)                   # (B, H, N, C, 1) x3, (B, H, N)
        q_in, k_in, k_out = q * e_in, k * e_in, k * e_out        # decayed from / back to the chunk start
        k_end = k_out * e_in[..., -1:, :]                        # keys decayed to the chunk's end
    kb = beta * k_in                                             # diag(beta) diag(e^b) K: (B, H, N, C, Dk)
    A = kb @ k_out.transpose(-1, -2)                             # beta_t Gamma_tj k_t.k_j (read below the diagonal)
    P = (q_in @ k_out.transpose(-1, -2)).tril_()                 # Q K^T * Gamma, causal: (B, H, N, C, C)
    if g is not None and bool(strong.any()):
        gamma = decay_pairs(g[strong])[..., 0].exp()             # exact decays of the strong chunks
        kk = k[strong] @ k[strong].transpose(-1, -2)
        A = A.index_put((strong,), beta[strong] * kk * gamma)
        P = P.index_put((strong,), (q[strong] @ k[strong].transpose(-1, -2)) * gamma)
        k_end = k_end.index_put((strong,), k[strong] * decay_after(g[strong]).exp())
    inv = _unit_lower_inverse(A)                                 # (I + A)^-1, A strictly lower
    W = inv @ kb                                                 # (B, H, N, C, Dk)
    U = inv @ (beta * v)                                         # (B, H, N, C, Dv)

    S0 = k.new_zeros(B, H, Dk, Dv) if S0 is None else S0        # (B, H, Dk, Dv)
    chunk_decay = None if g is None else b[..., -1:, :].exp()    # (B, H, N, 1, 1) e^{b_C}
    S_prev, V_new, S = _StateScan.apply(U, W, k_end, chunk_decay, S0)   # the only sequential part
    o = matmul_add(q_in @ S_prev, P, V_new)                      # (B, H, N, C, Dv)
    return o.reshape(B, H, N * C, Dv)[:, :, :T], S


class _StateScan(torch.autograd.Function):
    """The sequential part of the chunkwise form, chunk by chunk, with a hand-written backward.

    Forward, from S_0 = S0: V'_n = U_n - W_n S_n and S_{n+1} = d_n S_n + K_n^T V'_n (K: keys
    decayed to the chunk's end, d: the chunk's decay e^{b_C}, 1 without a gate). Returns the
    states entering each chunk (B, H, N, Dk, Dv), V' (B, H, N, C, Dv) and the final state.
    Backward, with G the gradient of S_{n+1}, walking back:
        dV'_n += K_n G,  G <- d_n G + dS_n - W_n^T dV'_n,
    and then, batched over all chunks at once: dU = dV', dW = -dV' S_n^T, dK = V' G^T and
    dd_n = sum(G * S_n). Two small matmuls per chunk stay in the loop each way, instead of the
    dozen autograd nodes per chunk of the same loop written with plain tensor ops.
    """

    @staticmethod
    def forward(ctx, U, W, K, decay, S0):
        B, H, N, C, Dv = U.shape
        U, W, K = (x.flatten(0, 1) for x in (U, W, K))          # (B*H, N, C, D)
        d = None if decay is None else decay.flatten(0, 1)      # (B*H, N, 1, 1)
        S, S_prev, V_new = S0.flatten(0, 1), [], []
        for n in range(N):
            S_prev.append(S)
            V_new.append(torch.baddbmm(U[:, n], W[:, n], S, alpha=-1))            # V' = U - W S
            S = torch.baddbmm(S if d is None else d[:, n] * S, K[:, n].transpose(1, 2), V_new[-1])
        S_prev, V_new = torch.stack(S_prev, dim=1), torch.stack(V_new, dim=1)
        ctx.save_for_backward(W, K, d, S_prev, V_new)
        ctx.BH = (B, H)
        return S_prev.view(B, H, *S_prev.shape[1:]), V_new.view(B, H, N, C, Dv), S.view(S0.shape)

    @staticmethod
    def backward(ctx, dS_prev, dV_new, dS):
        W, K, d, S_prev, V_new = ctx.saved_tensors
        BH, N = S_prev.shape[:2]
        dS_prev = torch.zeros_like(S_prev) if dS_prev is None else dS_prev.reshape(S_prev.shape)
        dV_new = torch.zeros_like(V_new) if dV_new is None else dV_new.reshape(V_new.shape)
        G = torch.zeros_like(S_prev[:, 0]) if dS is None else dS.reshape(S_prev[:, 0].shape)
        dV, G_after = [None] * N, [None] * N
        for n in reversed(range(N)):
            G_after[n] = G
            dV[n] = torch.baddbmm(dV_new[:, n], K[:, n], G)                    # dV'_n + K_n G
            G = torch.baddbmm((G if d is None else d[:, n] * G) + dS_prev[:, n],
                              W[:, n].transpose(1, 2), dV[n], alpha=-1)
        dV, G_after = torch.stack(dV, dim=1), torch.stack(G_after, dim=1)   # (B*H, N, ...)
        need = ctx.needs_input_grad
        dW = -(dV @ S_prev.transpose(-1, -2)) if need[1] else None
        dK = V_new @ G_after.transpose(-1, -2) if need[2] else None
        dd = (G_after * S_prev).sum((-1, -2), keepdim=True) if d is not None and need[3] else None
        return tuple(None if x is None else x.view(*ctx.BH, *x.shape[1:]) for x in (dV, dW, dK, dd, G))


def _unit_lower_inverse(A, base=16):
    """(I + L)^-1 with L the strictly lower triangle of A (..., n, n); A's diagonal and upper part are not read.

    2 x 2 block recursion, [[L11, 0], [L21, L22]]^-1 = [[X11, 0], [-X22 L21 X11, X22]], down to
    blocks of ``base``, which a unit lower-triangular solve against the identity inverts by
    forward substitution. Exact (no pivoting needed), differentiable, and on CPU about twice as
    fast as one solve for the whole (n, n) block.
    """
    n = A.shape[-1]
    if n <= base:
        eye = torch.eye(n, dtype=A.dtype, device=A.device).expand(A.shape)
        return torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True)
    h = n // 2
    X11, X22 = _unit_lower_inverse(A[..., :h, :h], base), _unit_lower_inverse(A[..., h:, h:], base)
    X21 = -(X22 @ A[..., h:, :h]) @ X11
    top = torch.cat([X11, X11.new_zeros(*X11.shape[:-1], n - h)], dim=-1)
    return torch.cat([top, torch.cat([X21, X22], dim=-1)], dim=-2)
