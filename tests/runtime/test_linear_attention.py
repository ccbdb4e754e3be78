import math

import pytest
import torch

import runtime
from runtime.kernels.linear_attention import (
    FACTOR_RANGE,
    _constant_decay_chunk,
    linear_attention,
    linear_attention_reference,
)

# Tolerance against the float64 reference loop on the same (rounded) inputs, as rtol and as
# atol relative to the reference's largest magnitude. Measured max |error| / max |reference|
# over o, the final state and all gradients in test_forward_and_grads_match_reference:
# float64 1.0e-15, float32 2.1e-7, bfloat16 3.1e-3 (the rounding of the bf16 results: they
# are computed in float32; the float32 final state is within 2.4e-7).
TOL = {torch.float64: 1e-13, torch.float32: 2e-6, torch.bfloat16: 1e-2}
# Ranges of w: near 0 a chunk's decays multiply far below float32's range (1e-12 ** 8).
DECAYS = {"uniform": (0.05, 1.0), "near0": (1e-12, 1e-3), "near1": (1 - 1e-3, 1.0)}


def attention_inputs(
    B, H, T, K, V, decay="uniform", dtype=torch.float64, bonus=False, state=True, w_shape=None, seed=0
):
    """q, k, v, w, u, initial_state in dtype (u and the state may be None), and the same in float64."""
    gen = torch.Generator().manual_seed(seed)
    lo, hi = DECAYS[decay]
    low = [
        torch.randn(B, H, T, K, generator=gen, dtype=torch.float64),
        torch.randn(B, H, T, K, generator=gen, dtype=torch.float64),
        torch.randn(B, H, T, V, generator=gen, dtype=torch.float64),
        lo + (hi - lo) * torch.rand(w_shape or (B, H, T, K), generator=gen, dtype=torch.float64),
        torch.randn(H, K, generator=gen, dtype=torch.float64) if bonus else None,
        torch.randn(B, H, K, V, generator=gen, dtype=torch.float64) if state else None,
    ]
    low = [None if t is None else t.to(dtype).requires_grad_() for t in low]
    return low, [None if t is None else t.detach().double().requires_grad_() for t in low]


def run_both(low, ref, **kwargs):
    """Forward and backward of both: [(got, want)] for o, the final state and each input's gradient."""
    got, want = linear_attention(*low, **kwargs), linear_attention_reference(*ref)
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(low[0].dtype) for t in want]
    sum((g * d.to(g)).sum() for g, d in zip(got, grads)).backward()
    sum((w * d.double()).sum() for w, d in zip(want, grads)).backward()
    assert got[0].dtype == low[0].dtype
    return list(zip(got, want)) + [(lo.grad, re.grad) for lo, re in zip(low, ref) if lo is not None]


def assert_close(got, want, tol):
    torch.testing.assert_close(got.double(), want, atol=tol * want.abs().max().item(), rtol=tol)


@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv"])
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("dtype", TOL)
def test_forward_and_grads_match_reference(dtype, decay, bonus):
    low, ref = attention_inputs(2, 2, 97, 9, 7, decay, dtype, bonus)
    for got, want in run_both(low, ref):
        assert_close(got, want, TOL[dtype])


@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv"])
@pytest.mark.parametrize(
    "T,chunk_size,state,w_shape",
    [
        (1, 8, False, None),
        (130, 16, True, (1, 3, 1, 5)),  # one decay per head and key dim, broadcast over B and T
        (16, 16, True, None),  # exactly one chunk
        (97, 64, False, None),
        (33, 1, True, None),  # chunks of one step
    ],
)
def test_odd_shapes_match_reference(T, chunk_size, state, w_shape, bonus):
    low, ref = attention_inputs(2, 3, T, 5, 4, bonus=bonus, state=state, w_shape=w_shape)
    for got, want in run_both(low, ref, chunk_size=chunk_size):
        assert_close(got, want, TOL[torch.float64])


@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv"])
def test_final_state_continues_a_split_sequence(bonus):
    (q, k, v, w, u, state), _ = attention_inputs(1, 2, 50, 4, 3, bonus=bonus)
    o1, s1 = linear_attention(q[:, :, :21], k[:, :, :21], v[:, :, :21], w[:, :, :21], u, state)
    o2, s2 = linear_attention(q[:, :, 21:], k[:, :, 21:], v[:, :, 21:], w[:, :, 21:], u, s1)
    o, s = linear_attention(q, k, v, w, u, state)
    torch.testing.assert_close(torch.cat([o1, o2], 2), o)
    torch.testing.assert_close(s2, s)


@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv"])
def test_zero_decays_have_no_nan(bonus):
    low, ref = attention_inputs(2, 2, 40, 4, 3, bonus=bonus)
    zero = torch.zeros(low[3].shape, dtype=torch.bool)
    zero[:, :, 3::7] = True
    for w in (low[3], ref[3]):
        w.detach().masked_fill_(zero, 0.0)
    (o, want_o), (state, want_state), *grads = run_both(low, ref)
    ((dw, want_dw),) = grads[3:4]
    assert (dw[zero] == 0).all()  # the documented exception: the exact gradient there is finite
    for got, want in [(o, want_o), (state, want_state), (dw[~zero], want_dw[~zero])] + grads[:3] + grads[4:]:
        assert_close(got, want, TOL[torch.float64])


@pytest.mark.parametrize("change", ["k", "v", "w", "u", "state", "chunk"])
def test_rejects_bad_shapes(change):
    (q, k, v, w, u, state), _ = attention_inputs(2, 3, 10, 4, 5, bonus=True)
    args = {"q": q, "k": k, "v": v, "w": w, "u": u, "initial_state": state}
    bad = {"k": k[..., :3], "v": v[:, :2], "w": w[..., :1, :2], "u": u.T, "state": state[:, :2]}
    if change == "chunk":
        args["chunk_size"] = 0
    else:
        args["initial_state" if change == "state" else change] = bad[change]
    with pytest.raises(ValueError):
        linear_attention(**args)


@pytest.mark.parametrize("bonus", [False, True, 0.0], ids=["gla", "rwkv", "before"])
def test_leading_dims_broadcast_as_in_the_loop(bonus):
    """Leading dims that only broadcast (one k and v for the whole batch, one decay per head
    and key dim, a state with an extra dim, no head dim at all) give the loop's values."""
    gen = torch.Generator().manual_seed(3)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    cases = [
        (
            rand(2, 3, 11, 4),
            rand(3, 11, 4),
            rand(3, 11, 5),
            torch.rand(3, 1, 4, generator=gen, dtype=torch.float64),
            rand(2, 3, 4, 5),
        ),
        (rand(6, 11, 4), rand(6, 11, 4), rand(6, 11, 5), 0.9, rand(2, 6, 4, 5)),
        (rand(11, 4), rand(11, 4), rand(11, 5), torch.rand(11, 4, generator=gen, dtype=torch.float64), None),
    ]
    for q, k, v, w, state in cases:
        u = rand(*q.shape[:-2], 4) if bonus is True else (None if bonus is False else bonus)
        got = linear_attention(q, k, v, w, u, state)
        want = linear_attention_reference(q, k, v, w, u, state)
        for g, r in zip(got, want):
            assert g.shape == r.shape
            assert_close(g, r.detach(), TOL[torch.float64])
        inputs = [t for t in (q, k, v, state, u) if isinstance(t, torch.Tensor) and t.requires_grad]
        grads = torch.autograd.grad(sum(g.sum() for g in got), inputs)
        expected = torch.autograd.grad(sum(r.sum() for r in want), inputs)
        for g, r in zip(grads, expected):
            assert_close(g, r, TOL[torch.float64])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_reference(dtype, bonus):
    low, ref = attention_inputs(2, 4, 300, 64, 64, "uniform", dtype, bonus)
    low = [None if t is None else t.detach().cuda().requires_grad_() for t in low]
    for got, want in run_both(low, ref):
        assert_close(got.cpu(), want, TOL[dtype])


# One decay for all steps: the lowest w each chunk of the constant-decay form allows, and the
# chunk it takes for w in (lowest, 1] (chunks of 64 for w >= 0.61, of 8 down to w = 0.029).
CONSTANT_DECAYS = {64: 0.62, 32: 0.4, 8: 0.03}


def constant_decay_inputs(T, lowest, dtype=torch.float64, bonus=False, w_shape=(3, 1, 5), seed=0):
    """attention_inputs with one decay per head and key dim, drawn from [lowest, 1], lowest among them."""
    low, ref = attention_inputs(2, 3, T, 5, 4, dtype=dtype, bonus=bonus, w_shape=w_shape, seed=seed)
    for w in (low[3], ref[3]):
        w.detach().mul_(1 - lowest).add_(lowest).view(-1)[0] = lowest
    return low, ref


@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv"])
@pytest.mark.parametrize("chunk", CONSTANT_DECAYS)
@pytest.mark.parametrize("T", [1, 50, 64, 97, 130])
def test_constant_decay_matches_reference(T, chunk, bonus):
    """Chunks of 64, 32 and 8, T not a multiple of them, the state carried across chunks; gradients too."""
    low, ref = constant_decay_inputs(T, CONSTANT_DECAYS[chunk], bonus=bonus)
    assert _constant_decay_chunk(low[3].log(), T, None) == min(chunk, T)
    for got, want in run_both(low, ref):
        assert_close(got, want, TOL[torch.float64])


@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv"])
def test_constant_decay_in_float32(bonus):
    """At the steepest decays chunks of 64 allow, where the factors w^j reach e^16, float32
    stays within the per-step form's tolerance (measured: 1.4e-6 on the gradient of w, the
    per-step form 4.4e-7; everything else within 3.5e-7)."""
    dtype = torch.float32
    low, ref = constant_decay_inputs(200, CONSTANT_DECAYS[64], dtype, bonus)
    with torch.no_grad():
        for w in (low[3], ref[3]):
            w[..., ::2] = CONSTANT_DECAYS[64]  # half the channels at the steepest decay
    assert _constant_decay_chunk(low[3].float().log(), 200, None) == 64
    for got, want in run_both(low, ref):
        assert_close(got, want, TOL[dtype])


@pytest.mark.parametrize("chunk_size", [1, 16, 64])
def test_constant_decay_takes_a_given_chunk(chunk_size):
    low, ref = constant_decay_inputs(97, 0.9, bonus=True)
    assert _constant_decay_chunk(low[3].log(), 97, chunk_size) == chunk_size
    for got, want in run_both(low, ref, chunk_size=chunk_size):
        assert_close(got, want, TOL[torch.float64])


@pytest.mark.parametrize("w_shape", [(1, 5), (), (2, 3, 1, 5)], ids=["per-channel", "number", "per-batch"])
def test_constant_decay_shapes(w_shape):
    """A decay per key dim only, one for everything, one per batch element and head."""
    low, ref = constant_decay_inputs(70, 0.7, w_shape=w_shape)
    assert _constant_decay_chunk(low[3].log(), 70, None) == 64
    for got, want in run_both(low, ref):
        assert_close(got, want, TOL[torch.float64])


@pytest.mark.parametrize(
    "w, chunk_size",
    [(1e-3, None), (0.5, 64), (0.0, None), (1.5, None)],
    ids=["too-steep", "too-steep-for-the-chunk", "zero", "growing"],
)
def test_constant_decay_leaves_other_decays_to_the_per_step_form(w, chunk_size):
    """Decays steeper than the chunk allows, zero, above 1 or negative: the per-step form, the loop's values."""
    low, ref = constant_decay_inputs(97, 0.5)
    for t in (low[3], ref[3]):
        t.detach().fill_(w)
    assert _constant_decay_chunk(low[3].log(), 97, chunk_size) == 0
    (o, want_o), (state, want_state), *grads = run_both(low, ref, chunk_size=chunk_size)
    for got, want in [(o, want_o), (state, want_state)] + grads[:3]:
        assert_close(got, want, TOL[torch.float64])


def test_constant_decay_chunk_leaves_negative_decays():
    assert _constant_decay_chunk(torch.tensor([[0.9, -0.5]]).log(), 10, None) == 0


def test_factor_range_is_what_the_chunks_assume():
    assert (64 + 1) / 2 * -math.log(CONSTANT_DECAYS[64]) <= FACTOR_RANGE < (64 + 1) / 2 * -math.log(0.6)


def test_exported_from_runtime():
    assert runtime.linear_attention is runtime.kernels.linear_attention is linear_attention
