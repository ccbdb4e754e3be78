"""Decayed linear attention with a matrix state (GLA, RWKV-6), computed in chunks.

Shapes: q (RWKV's r) and k (..., T, K); v (..., T, V); w (..., T, K), or a shape that
broadcasts to it (a number, (H, 1, K) for one decay per head and key dim); u (..., K),
broadcast over time (a number too); states (..., K, V). The leading dims ("...", usually
(B, H)) of all of them broadcast, as they would in the time loop. Rows are vectors: k_t^T v_t
is a (K, V) outer product, q_t S a (V,) vector. No 1/sqrt(K) scale is applied: scale q
first if the model wants it.

Without u (gated linear attention, GLA): the current token enters the state, then is read.
    S_t = diag(w_t) S_{t-1} + k_t^T v_t
    o_t = q_t S_t
With u (RWKV-6 "bonus"): the query reads the state before the current token, and the
current token through u instead; the state update is the same. u = 0 reads the state
before the current token and nothing else.
    o_t = q_t (S_{t-1} + diag(u) k_t^T v_t)
    S_t = diag(w_t) S_{t-1} + k_t^T v_t
S_{-1} is initial_state (zeros if not given); both functions return (o, S_{T-1}).
Unrolled, with W(s, t] = w_{s+1} * ... * w_t (elementwise over K, empty product = 1):
    GLA:  o_t = sum_{s<=t} (q_t * W(s, t] . k_s) v_s  +  (q_t * W(-1, t]) S_{-1}
    RWKV: o_t = sum_{s<t} (q_t * W(s, t-1] . k_s) v_s + (q_t * u . k_t) v_t + (q_t * W(-1, t-1]) S_{-1}

`linear_attention` splits T into chunks of C steps (the last one padded with k = v = 0,
w = 1). Inside a chunk, the decay between two steps is exp of the sum of the log w between
them, computed as that sum: a cumulative sum over the (C, C, K) grid of pairs, not as
b_t - b_s of a cumulative log-decay b, which loses |b| * eps to cancellation (with small w,
|b| is hundreds within a chunk, and float32 gradients of w came out 1e-4 off). Every
exponent is a sum of log w <= 0, so nothing overflows; the common factorization
exp(b_t) * exp(-b_s) overflows once a chunk's decays multiply below ~1e-38 (float32).
- intra-chunk: o_t = sum_s (q_t * W(s, t] . k_s) v_s over the chunk's s <= t (RWKV: s < t,
  W(s, t-1], plus the bonus term), with the (C, C, K) decays masked to the causal pairs;
- chunk states: a chunk adds sum_s (k_s * W(s, end])^T v_s to the state it receives, which
  it decays by W(start, end]; the states at the chunk ends are that elementwise recurrence
  over chunks, run by `linear_scan` (no Python loop over chunks);
- inter-chunk: o_t += (q_t * W(start, t]) S_start (RWKV: W(start, t-1]), S_start being the
  state entering the chunk (start: the step before the chunk, end: its last step).
w below the smallest normal float (w = 0 included) counts as that value: decays through
it are < 1e-38 instead of 0, and its gradient is 0 instead of a finite value (not the nan
of log 0; models that make w = exp(...) multiply that gradient by w = 0 anyway).
One decay for all steps (w broadcast over T: (H, 1, K), (1, K), a number) takes a faster
form when its values allow: w^(t-s) = w^(t-m) * w^(m-s) about a chunk's middle m, so the
intra-chunk scores are one matmul of q and k scaled by those powers, in chunks of up to 64.
The factors grow as w^-(C/2), so the chunk is the largest whose factors stay within e^16
(`_constant_decay_chunk`); float32 results stay within about 1.4e-6 of the loop there.
Cost (per-step decays): the (C, C, K) decays are C*K floats per token, the chunk states K*V/C: C = sqrt(V)
balances them, and C = 8 (K = V = 64) ran fastest on CPU, 1.3x ahead of 16 and 2x ahead
of 4, with 32 and 64 slower still (benchmarks/bench_kernels.py --chunk-sizes sweeps it on
a GPU). Everything is differentiable by autograd; float16/bfloat16 inputs are computed
in float32 (the state too: the final state is float32, or float64 for float64 inputs).
The matmuls follow torch's settings: with TF32 on (PM302), float32 results are within
about 1e-3 of the loop instead of 1e-6; under bf16 autocast (PM301) they run in bf16 while
the chunk states still add up in float32 (measured within 4e-3 of the loop at T = 200).
"""

import math

import torch
import torch.nn.functional as F

from .scan import linear_scan


def linear_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w,
    u=None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The time loop of the module docstring's recurrences: (o (..., T, V), S (..., K, V))."""
    S = 0.0 if initial_state is None else initial_state
    outs = []
    for t in range(q.shape[-2]):
        kv = k[..., t, :, None] * v[..., t, None, :]  # (..., K, V)
        w_t = w[..., t if w.shape[-2] > 1 else 0, :, None] if isinstance(w, torch.Tensor) and w.dim() >= 2 else w
        if u is None:
            S = w_t * S + kv
            outs.append(torch.einsum("...k,...kv->...v", q[..., t, :], S))
        else:
            bonus = u[..., None] * kv if isinstance(u, torch.Tensor) else u * kv
            outs.append(torch.einsum("...k,...kv->...v", q[..., t, :], S + bonus))
            S = w_t * S + kv
    return torch.stack(outs, dim=-2), S


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w,
    u=None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GLA (u=None) or RWKV-6 (u given) in chunks: (o (..., T, V), S (..., K, V)); see the module docstring.

    chunk_size None: 8 steps for a decay per step; for one decay for all steps, the largest
    of 64, 32, 16 and 8 that the decay allows (see `_constant_decay_chunk`).
    """
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError("q, k and v must have a time and a feature dim")
    T, K, V = q.shape[-2], q.shape[-1], v.shape[-1]
    if k.shape[-2:] != (T, K) or v.shape[-2] != T:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must be (..., T, K), v {tuple(v.shape)} (..., T, V)"
        )
    if T == 0 or (chunk_size is not None and chunk_size < 1):
        raise ValueError(f"T = {T} and chunk_size = {chunk_size} must be at least 1")
    w_shape = w.shape if isinstance(w, torch.Tensor) else torch.Size()
    u_shape = u.shape if isinstance(u, torch.Tensor) else torch.Size()
    leading = [q.shape[:-2], k.shape[:-2], v.shape[:-2]]
    if len(w_shape) > 2:
        leading.append(w_shape[:-2])
    if len(u_shape) > 1:
        leading.append(u_shape[:-1])
    if initial_state is not None:
        if initial_state.dim() < 2 or initial_state.shape[-2:] != (K, V):
            raise ValueError(f"initial_state {tuple(initial_state.shape)} must be (..., K, V) = (..., {K}, {V})")
        leading.append(initial_state.shape[:-2])
    try:
        batch = torch.broadcast_shapes(*leading)
        torch.broadcast_shapes(w_shape, (*batch, T, K))
        torch.broadcast_shapes(u_shape, (*batch, K))
    except RuntimeError as err:
        raise ValueError(
            f"the leading dims of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"w {tuple(w_shape)}, u {tuple(u_shape)} and the state do not broadcast"
        ) from err
    if torch.broadcast_shapes(w_shape, (*batch, T, K)) != (*batch, T, K) or torch.broadcast_shapes(
        u_shape, (*batch, K)
    ) != (*batch, K):
        raise ValueError(f"w {tuple(w_shape)} and u {tuple(u_shape)} must broadcast to (..., T, K) and (..., K)")
    N = batch.numel()
    q, k = (t.expand(*batch, T, K).reshape(N, 1, T, K) for t in (q, k))
    v = v.expand(*batch, T, V).reshape(N, 1, T, V)
    number = torch.promote_types(q.dtype, torch.float32)  # the dtype a Python number w or u is taken in
    w = w if isinstance(w, torch.Tensor) else torch.tensor(w, dtype=number, device=q.device)
    w = w.to(torch.promote_types(w.dtype, torch.float32))
    if u is not None:
        u = u if isinstance(u, torch.Tensor) else torch.tensor(u, dtype=number, device=q.device)
        u = u.to(torch.promote_types(u.dtype, torch.float32)).expand(*batch, K).reshape(N, 1, K)
    if initial_state is not None:
        initial_state = initial_state.expand(*batch, K, V).reshape(N, 1, K, V)
    if len(w_shape) < 2 or w_shape[-2] == 1:  # one decay for every step
        log_w = w.log().expand(*batch, 1, K).reshape(N, 1, 1, K)
        C = _constant_decay_chunk(log_w, T, chunk_size)
        if C:
            o, S = _chunked_constant_decay(q, k, v, log_w, u, initial_state, C)
            return o.reshape(*batch, T, V), S.reshape(*batch, K, V)
    w = w.expand(*batch, T, K).reshape(N, 1, T, K)
    o, S = _chunked(q, k, v, w, u, initial_state, chunk_size or 8)
    return o.reshape(*batch, T, V), S.reshape(*batch, K, V)


FACTOR_RANGE = 16.0  # the chunked constant-decay form keeps its factors w^j within e^-16 .. e^16
LOOP_CHUNKS = 16  # up to this many chunks it carries the state in a loop (measured 10% faster at 4), then linear_scan


def _constant_decay_chunk(log_w, T, chunk_size):
    """The chunk for `_chunked_constant_decay`, or 0 where it does not apply.

    Its factors are w^j for |j| <= (C + 1) / 2, so C is the largest of chunk_size (or 64,
    32, 16, 8 when None) with (C + 1) / 2 * max |log w| <= FACTOR_RANGE: C = 64 for decays
    w >= 0.61, 8 down to w = 0.029. It does not apply inside torch.compile (the chunk depends
    on the values of w), for w outside (0, 1], or for steeper decays than chunks of 8 allow:
    those take the per-step form. Choosing reads two numbers from the device (a sync on CUDA).
    """
    if torch.compiler.is_compiling():
        return 0
    lo, hi = torch.stack(torch.aminmax(log_w)).tolist()
    if not (hi <= 0 and lo > -math.inf):  # also false for nan (w < 0)
        return 0
    sizes = [chunk_size] if chunk_size else [64, 32, 16, 8]
    fits = [C for C in sizes if (min(C, T) + 1) / 2 * -lo <= FACTOR_RANGE]
    return min(fits[0], T) if fits else 0


def _chunked_constant_decay(q, k, v, log_w, u, initial_state, C):
    """The chunked form for one decay for all steps: q, k (B, 1, T, K), v (B, 1, T, V), log_w (B, 1, 1, K).

    Inside a chunk, w^(t-s) = w^(t-m) * w^(m-s) about the chunk's middle m: two scaled copies
    of q and k and one matmul, the scores of the pairs s > t masked after it. The state is
    carried across chunks as in `_chunked` (by `linear_scan` over the chunk ends, a loop for
    up to LOOP_CHUNKS chunks).
    """
    B, _, T, K = q.shape
    V = v.shape[-1]
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    ct = torch.promote_types(dtype, torch.float32)  # compute type
    N = -(-T // C)  # number of chunks
    pad = (0, 0, 0, N * C - T)
    q, k, v = (F.pad(t[:, 0].to(ct), pad).unflatten(1, (N, C)) for t in (q, k, v))  # (B, N, C, *)
    log_w = log_w[:, 0].to(ct)  # (B, 1, K), broadcast over (N, C)
    shift = 0 if u is None else 1  # RWKV reads the state before its own step
    pos = torch.arange(C, dtype=ct, device=q.device)[:, None]  # (C, 1): step within the chunk
    middle = (C - 1) / 2

    # within chunks: o_t = sum_s (q_t * w^(t-s) . k_s) v_s, s <= t (GLA); w^(t-1-s), s < t (RWKV)
    q_scaled = q * ((pos - shift - middle) * log_w[:, None]).exp()
    k_scaled = k * ((middle - pos) * log_w[:, None]).exp()
    o = (q_scaled @ k_scaled.mT).tril(-shift) @ v  # (B, N, C, V)
    if u is not None:  # RWKV's bonus: the current token through u
        o = o + (q * u.to(ct)[:, :, None] * k).sum(-1, keepdim=True) * v

    # across chunks: each chunk's share of the state at its last step, the states there, then what each query reads
    last = (torch.arange(1, N + 1, dtype=ct, device=q.device) * C).clamp_max(T) - 1  # (N,): chunk ends, in T
    to_last = (last[:, None] - C * torch.arange(N, dtype=ct, device=q.device)[:, None] - pos.T).clamp_min(0)
    kv = (k * (to_last[..., None] * log_w[:, None]).exp()).mT @ v  # (B, N, K, V)
    length = torch.diff(last, prepend=last.new_full((1,), -1.0))  # (N,): steps in each chunk
    chunk_decay = (length[:, None] * log_w).exp()  # (B, N, K)
    S = q.new_zeros(B, K, V) if initial_state is None else initial_state[:, 0].to(ct)
    if N <= LOOP_CHUNKS:  # a few chunks: a loop costs less than the scan's setup
        starts = []
        for n in range(N):
            starts.append(S)
            S = chunk_decay[:, n, :, None] * S + kv[:, n]
        starts = torch.stack(starts, 1)  # (B, N, K, V): the state entering each chunk
    else:
        ends = linear_scan(chunk_decay[..., None], kv, S)  # (B, N, K, V)
        starts, S = torch.cat([S[:, None], ends[:, :-1]], 1), ends[:, -1]
    o = o + (q * ((pos + 1 - shift) * log_w[:, None]).exp()) @ starts
    return o.flatten(1, 2)[:, :T].to(dtype), S


def _chunked(q, k, v, w, u, initial_state, chunk_size):
    """The chunked form on q, k (B, H, T, K), v (B, H, T, V), w (B, H, T, K), u (B, H, K), S (B, H, K, V)."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    ct = torch.promote_types(dtype, torch.float32)  # compute type
    C = min(chunk_size, T)
    N = -(-T // C)  # number of chunks
    pad = (0, 0, 0, N * C - T)  # zeros at the end of T
    q, k, v = (F.pad(t.to(ct), pad).unflatten(2, (N, C)) for t in (q, k, v))  # (B, H, N, C, *)
    log_w = w.to(ct).clamp_min(torch.finfo(ct).tiny).log()
    log_w = F.pad(torch.broadcast_to(log_w, (B, H, T, K)), pad).unflatten(2, (N, C))  # (B, H, N, C, K)
    # The log-decays a query has seen up to: through its own step (GLA), before it (RWKV).
    shift = 0 if u is None else 1
    log_wq = F.pad(log_w[..., : C - 1, :], (0, 0, 1, 0)) if shift else log_w  # (B, H, N, C, K)
    # Each log-decay below is the sum of the log w it spans, never a difference of cumulative sums.
    steps = torch.ones(C, C, dtype=torch.bool, device=q.device)
    span = log_wq[..., :, None, :].masked_fill(~steps.tril(-1 - shift)[..., None], 0).cumsum(3)
    decay = span.exp().masked_fill(~steps.tril(-shift)[..., None], 0)  # (B, H, N, C, C, K): query t, key s

    # within chunks: o_t = sum_s (q_t * decay_ts . k_s) v_s, s <= t (GLA), s < t (RWKV)
    scores = (q[..., :, None, :] * k[..., None, :, :] * decay).sum(-1)  # (B, H, N, C, C)
    o = scores @ v  # (B, H, N, C, V)
    if u is not None:  # RWKV's bonus: the current token through u
        o = o + (q * u.to(ct)[:, :, None, None] * k).sum(-1, keepdim=True) * v

    # across chunks: the state at each chunk end, then what each query reads from the one entering its chunk
    to_end = F.pad(log_w.flip(3).cumsum(3).flip(3)[..., 1:, :], (0, 0, 0, 1))  # after step s to the chunk end
    kv = (k * to_end.exp()).transpose(-1, -2) @ v  # (B, H, N, K, V): a chunk's own share of its end state
    S0 = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(ct)
    chunk_decay = log_w.sum(3).exp()  # (B, H, N, K)
    ends = linear_scan(chunk_decay.flatten(0, 1)[..., None], kv.flatten(0, 1), S0.flatten(0, 1))
    ends = ends.unflatten(0, (B, H))  # (B, H, N, K, V)
    starts = torch.cat([S0[:, :, None], ends[:, :, :-1]], 2)  # (B, H, N, K, V)
    o = o + (q * log_wq.cumsum(3).exp()) @ starts
    return o.flatten(2, 3)[:, :, :T].to(dtype), ends[:, :, -1]
