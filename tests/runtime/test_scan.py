import pytest
import torch

import runtime
from runtime.kernels.scan import linear_recurrence, linear_recurrence_reference, linear_scan, linear_scan_reference

# Tolerance against the float64 reference loop on the same (rounded) inputs, as rtol and as
# atol relative to the reference's largest magnitude (elements near 0 cancel). Measured
# max |error| / max |reference|: float64 1.3e-15, float32 5.2e-7, bfloat16 3.4e-3 (the
# output's own rounding, bf16's unit roundoff is 2^-8 = 3.9e-3: it is computed in float32).
TOL = {torch.float64: 1e-13, torch.float32: 1e-5, torch.bfloat16: 1e-2}
# Ranges of a: cumulative products underflow within a chunk near 0; growth for |a| > 1.
DECAYS = {"uniform": (0.0, 1.0), "near0": (1e-6, 1e-3), "near1": (1 - 1e-4, 1.0), "signed": (-1.05, 1.05)}
# (shape of a, shape of x): T not a multiple of the chunk, T = 1, a broadcast over trailing dims and batch.
SHAPES = [
    ((3, 97, 33), (3, 97, 33)),
    ((2, 1, 33), (2, 1, 33)),
    ((2, 130, 4, 1), (2, 130, 4, 6)),
    ((1, 50, 7), (3, 50, 7)),
]


def scan_inputs(shape_a, shape_x, decay, dtype, with_h0, seed=0):
    """a, x, h0 (or None) in dtype, and the same values in float64, all leaves that want grads."""
    gen = torch.Generator().manual_seed(seed)
    lo, hi = DECAYS[decay]
    a = lo + (hi - lo) * torch.rand(shape_a, generator=gen, dtype=torch.float64)
    x = torch.randn(shape_x, generator=gen, dtype=torch.float64)
    h0 = torch.randn(x[:, 0].shape, generator=gen, dtype=torch.float64) if with_h0 else None
    low = [None if t is None else t.to(dtype).requires_grad_() for t in (a, x, h0)]
    ref = [None if t is None else t.detach().double().requires_grad_() for t in low]
    return low, ref


def assert_close(got, want, tol):
    torch.testing.assert_close(got.double(), want, atol=tol * want.abs().max().item(), rtol=tol)


def run_both(shape_a, shape_x, decay, dtype, with_h0):
    """Forward and backward of linear_scan (in dtype) and of the reference (float64): [(got, want)...]."""
    low, ref = scan_inputs(shape_a, shape_x, decay, dtype, with_h0)
    got, want = linear_scan(*low), linear_scan_reference(*ref)
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    got.backward(grad)
    want.backward(grad.double())
    assert got.dtype == dtype
    return [(got, want)] + [(lo.grad, re.grad) for lo, re in zip(low, ref) if lo is not None]


@pytest.mark.parametrize("shape_a,shape_x", SHAPES)
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("dtype", TOL)
def test_forward_and_grads_match_reference(shape_a, shape_x, decay, dtype):
    for got, want in run_both(shape_a, shape_x, decay, dtype, with_h0=shape_x[1] != 50):
        assert_close(got, want, TOL[dtype])


def test_underflowing_products_stay_exact_in_float32():
    # a = 1e-3: products of a within one chunk underflow float32 (1e-3 ** 13 < 1e-38), and
    # a scan dividing by them would give inf/nan; h_t is then x_t + 1e-3 x_{t-1} + ...
    a = torch.full((2, 200, 3), 1e-3)
    x = torch.randn(2, 200, 3)
    assert_close(linear_scan(a, x), linear_scan_reference(a.double(), x.double()), TOL[torch.float32])


def test_second_derivatives():
    (a, x, h0), _ = scan_inputs((1, 6, 2), (1, 6, 2), "signed", torch.float64, with_h0=True)
    assert torch.autograd.gradgradcheck(linear_scan, (a, x, h0))


def test_final_state_continues_a_split_sequence():
    (a, x, h0), _ = scan_inputs((2, 97, 5), (2, 97, 5), "uniform", torch.float64, with_h0=True)
    first = linear_scan(a[:, :40], x[:, :40], h0)
    torch.testing.assert_close(
        torch.cat([first, linear_scan(a[:, 40:], x[:, 40:], first[:, -1])], 1), linear_scan(a, x, h0)
    )


@pytest.mark.parametrize(
    "a_shape,x_shape,h0_shape",
    [
        ((2, 9, 3), (2, 10, 3), None),  # T differs
        ((2, 10, 4), (2, 10, 3), None),  # does not broadcast
        ((2, 0, 3), (2, 0, 3), None),  # T = 0
        ((2, 10, 3), (2, 10, 3), (2, 1, 3)),  # h0 not (B, D)
    ],
)
def test_rejects_bad_shapes(a_shape, x_shape, h0_shape):
    h0 = None if h0_shape is None else torch.zeros(h0_shape)
    with pytest.raises(ValueError):
        linear_scan(torch.rand(a_shape), torch.randn(x_shape), h0)


# (a, x, h0, dim) as a time loop may have them: a decay per channel, a number, a state with
# more dims than the inputs, time last or first, one input constant over time.
RECURRENCES = [
    ((3, 7, 5), (3, 7, 5), (3, 5), 1),
    ((5, 1), (2, 5, 9), None, -1),
    (None, (2, 5, 9), (4, 2, 5), -1),
    ((2, 4, 6, 1, 1), (2, 4, 6, 3, 5), (2, 6, 3, 5), 1),
    ((7, 5), (2, 7, 5), (5,), -2),
    ((9, 2, 3), (9, 1, 3), (), 0),
    ((2, 6, 3), (2, 1, 3), (2, 3), 1),
    ((3, 8), (4, 8, 3), None, 1),  # inputs of different ranks, time at dim 1 of each
    ((8, 3), (4, 8, 3), (2, 1, 1, 3), -2),
]


@pytest.mark.parametrize("reverse", [False, True], ids=["forwards", "backwards"])
@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
@pytest.mark.parametrize("a_shape,x_shape,h0_shape,dim", RECURRENCES)
def test_linear_recurrence_broadcasts_as_the_loop_does(a_shape, x_shape, h0_shape, dim, before, reverse):
    gen = torch.Generator().manual_seed(2)
    a = 0.9 if a_shape is None else torch.rand(a_shape, generator=gen, dtype=torch.float64).requires_grad_()
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64).requires_grad_()
    h0 = None if h0_shape is None else torch.randn(h0_shape, generator=gen, dtype=torch.float64).requires_grad_()
    got = linear_recurrence(a, x, h0, dim, before=before, reverse=reverse)
    want = linear_recurrence_reference(a, x, h0, dim, before=before, reverse=reverse)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_close(got, want.detach(), TOL[torch.float64])
    inputs = [t for t in (a, x, h0) if isinstance(t, torch.Tensor)]
    weights = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    for g, w in zip(
        torch.autograd.grad((got * weights).sum(), inputs), torch.autograd.grad((want * weights).sum(), inputs)
    ):
        assert_close(g, w, TOL[torch.float64])


@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
def test_linear_recurrence_gives_the_final_state(before):
    gen = torch.Generator().manual_seed(4)
    a, x, h0 = (
        torch.rand(2, 6, 3, generator=gen, dtype=torch.float64),
        torch.randn(2, 6, 3, generator=gen, dtype=torch.float64),
        torch.randn(2, 3, generator=gen, dtype=torch.float64),
    )
    states, last = linear_recurrence(a, x, h0, dim=1, before=before, final=True)
    torch.testing.assert_close(states, linear_recurrence_reference(a, x, h0, 1, before=before))
    torch.testing.assert_close(last, linear_recurrence_reference(a, x, h0, 1)[:, -1])


def test_linear_recurrence_backwards_is_the_discounted_return():
    """`reverse=True` is the loop over `reversed(range(T))` an RL return writes,
    R_t = r_t + gamma * R_{t+1}; its final state is R_0, the state after the last step run."""
    gen = torch.Generator().manual_seed(5)
    rewards = torch.randn(3, 9, generator=gen, dtype=torch.float64)
    running, returns = torch.zeros(3, dtype=torch.float64), torch.zeros(3, 9, dtype=torch.float64)
    for t in reversed(range(9)):
        running = rewards[:, t] + 0.97 * running
        returns[:, t] = running
    states, last = linear_recurrence(
        0.97, rewards, torch.zeros(3, dtype=torch.float64), dim=1, final=True, reverse=True
    )
    torch.testing.assert_close(states, returns)
    torch.testing.assert_close(last, returns[:, 0])
    torch.testing.assert_close(linear_recurrence_reference(0.97, rewards, None, 1, reverse=True), returns)


def test_linear_recurrence_takes_the_dtype_of_the_first_step():
    x = torch.randn(2, 5, 3)
    assert linear_recurrence(0.5, x, torch.zeros(2, 3, dtype=torch.float64)).dtype == torch.float64
    assert linear_recurrence(torch.rand(2, 5, 3, dtype=torch.bfloat16), x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "a_shape,x_shape,h0_shape,dim",
    [
        ((2, 5, 3), (2, 4, 3), None, 1),  # T differs
        ((2, 5, 3), (2, 5, 3), (2, 5, 3), 1),  # h0 has a time dim (and so does not broadcast to a step)
        ((2, 5, 3), (2, 5, 3), (4, 3), 1),  # h0 does not broadcast
        ((2, 5, 3), (2, 5, 3), None, 3),  # no such dim
    ],
)
def test_linear_recurrence_rejects_bad_shapes(a_shape, x_shape, h0_shape, dim):
    h0 = None if h0_shape is None else torch.zeros(h0_shape)
    with pytest.raises(ValueError):
        linear_recurrence(torch.rand(a_shape), torch.randn(x_shape), h0, dim)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_reference(dtype):
    low, ref = scan_inputs((4, 1000, 64), (4, 1000, 64), "uniform", dtype, with_h0=True)
    low = [t.detach().cuda().requires_grad_() for t in low]
    got, want = linear_scan(*low), linear_scan_reference(*ref)
    got.sum().backward()
    want.sum().backward()
    for g, w in [(got, want)] + [(lo.grad, re.grad) for lo, re in zip(low, ref)]:
        assert_close(g.cpu(), w, TOL[dtype])


def test_exported_from_runtime():
    assert runtime.linear_scan is runtime.kernels.linear_scan is linear_scan
