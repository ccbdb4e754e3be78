"""Elementwise linear recurrence over time, the loop that RWKV / SSM / EMA code writes in Python:

    h_t = a_t * h_{t-1} + x_t,    t = 0 .. T-1,    h_{-1} = h0 (zeros if not given)

x: (B, T, *); a: x's shape, or one that broadcasts to it with the same T (a (B, T, D, 1)
against x (B, T, D, V), a (1, T, D) against x (B, T, D)); h0: (B, *). The result h has
x's shape, and h[:, -1] is the final state.

`linear_scan` computes it in chunks of C ~ sqrt(T) steps (at most 32):

1. within every chunk at once, from a zero state: h_c = a_c * h_{c-1} + x_c and the
   running product p_c = a_c * p_{c-1}, a loop of C elementwise steps over (B, T/C, *);
2. the states at the chunk ends, H_n = p_n * H_{n-1} + h_n (chunk n's last h and p), are
   the same recurrence over T/C steps: a Hillis-Steele doubling scan, log2(T/C) steps of
   (a, x)_t <- (a_t * a_{t-s}, a_t * x_{t-s} + x_t), s = 1, 2, 4, ...;
3. h += p * H_{n-1}, the state entering each chunk carried to every step in it.

Why this form: it only multiplies and adds, so it holds for any real a (zero, negative,
above one) and never divides by a cumulative product of a, which underflows to 0 within a
few dozen steps of small a (the cumprod-division form h_t = P_t cumsum(x / P) returns inf
or nan there; its log-space variant needs a > 0 and complex logs for negative x). The work
is O(T) plus O(T/C log T/C), against O(T log T) for a doubling scan over all of T; the
number of sequential steps (kernel launches) is C + log2(T/C) <= 32 + log2(T/32), against
T for the time loop; each output passes through at most that many roundings.

Gradients come from the adjoint recurrence, the same scan run backwards in time:
    g_t = dL/dh_t + a_{t+1} g_{t+1},  dL/dx_t = g_t,  dL/da_t = g_t h_{t-1},  dL/dh0 = a_0 g_0
so backward costs one more scan and saves only a and h (autograd through the chunked
steps would save every intermediate). float16/bfloat16 inputs are computed in float32.
On CUDA the scan runs through torch.compile where that works (see _compile.py).

`linear_recurrence` is the same recurrence as a Python loop `h = a[:, t] * h + x[:, t]`
writes it: time on any dim of each input, a_t, x_t and the state broadcast as the loop's
arithmetic does (a decay per channel, an initial state of zeros, a state with more dims
than the inputs), inputs that stay the same at every step.
"""

import math

import torch

from ._compile import compiled_on_cuda

MAX_CHUNK = 32


def linear_scan_reference(a: torch.Tensor, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """The time loop h_t = a_t * h_{t-1} + x_t: (B, T, *) -> (B, T, *). Tests compare against it."""
    h = torch.zeros_like(x[:, 0]) if h0 is None else h0
    hs = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + x[:, t]
        hs.append(h)
    return torch.stack(hs, dim=1)


def linear_scan(a: torch.Tensor, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """h_t = a_t * h_{t-1} + x_t over dim 1, h_{-1} = h0: (B, T, *) -> (B, T, *); see the module docstring."""
    if x.dim() < 2 or x.shape[1] == 0 or a.shape[1:2] != x.shape[1:2] or not broadcasts_to(a.shape, x.shape):
        raise ValueError(f"a {tuple(a.shape)} must broadcast to x {tuple(x.shape)} with the same T >= 1 (dim 1)")
    if h0 is not None and h0.shape != x[:, 0].shape:
        raise ValueError(f"h0 {tuple(h0.shape)} must have shape {tuple(x[:, 0].shape)}")
    return _LinearScan.apply(a, x, h0)


def linear_recurrence_reference(
    a, x, h0=None, dim: int = 1, before: bool = False, reverse: bool = False
) -> torch.Tensor:
    """The loop `h = a_t * h + x_t`, a_t and x_t taken at `dim` of each, stacked at `dim`
    (`reverse`: the loop over `reversed(range(T))`)."""
    T = max(_steps(a, dim), _steps(x, dim))
    h = 0.0 if h0 is None else h0
    hs = {}
    for t in reversed(range(T)) if reverse else range(T):
        new = _at(a, dim, t) * h + _at(x, dim, t)
        hs[t] = h * torch.ones_like(new) if before else new
        h = new
    return torch.stack([hs[t] for t in range(T)], dim=dim)


def linear_recurrence(a, x, h0=None, dim: int = 1, before: bool = False, final: bool = False, reverse: bool = False):
    """h_t = a_t * h_{t-1} + x_t for a_t = a.select(dim, t) and x_t = x.select(dim, t) (each
    in its own dims), broadcast as in the loop: the states after each step, stacked at
    `dim` like `torch.stack` (with `before=True`, the states each step starts from
    instead: h0, h_0, ..., h_{T-2}).

    With `reverse=True` the steps run from the last to the first, as a loop over
    `reversed(range(T))` (a discounted return, h_t = a_t * h_{t+1} + x_t): the states are
    still stacked in the order of t, and the last step is t = 0.

    With `final=True`, returns (states, h_{T-1}): the state after the last step too (which
    `before=True` leaves out). A number, a 0-dim tensor, or a tensor of size 1 at `dim`
    gives the same value at every step (a constant decay). h0, the state before the first step (zeros if None; a number
    or a tensor), broadcasts against a step, and so may have more dims than a_t and x_t.
    The result has the dtype the loop's first step gives (a * h0 + x).
    """
    if not isinstance(a, torch.Tensor) and not isinstance(x, torch.Tensor):
        raise ValueError("a or x must be a tensor")
    like = x if isinstance(x, torch.Tensor) and x.dim() > 0 else a
    T = max(_steps(a, dim), _steps(x, dim))
    for value in (a, x):
        if _steps(value, dim) not in (1, T):
            raise ValueError(
                f"a {tuple(_shape(a))} and x {tuple(_shape(x))} have different numbers of steps at dim {dim}"
            )
    if T == 0:
        raise ValueError("there must be at least one step")
    try:
        step = torch.broadcast_shapes(_step_shape(a, dim), _step_shape(x, dim), _shape(h0))
    except RuntimeError as err:
        raise ValueError(
            f"a {tuple(_shape(a))}, x {tuple(_shape(x))} and h0 {tuple(_shape(h0))} "
            f"do not broadcast at each step of dim {dim}"
        ) from err
    if not -len(step) - 1 <= dim <= len(step):
        raise ValueError(f"dim {dim} is out of range for steps of shape {tuple(step)}")
    dtype = _first_step_dtype(a, x, h0)
    device = like.device
    a_, x_ = (_over_steps(v, dim, T, step, dtype, device).reshape(1, T, -1) for v in (a, x))
    if reverse:  # the steps in the order they run
        a_, x_ = a_.flip(1), x_.flip(1)
    start = (
        None if h0 is None else torch.as_tensor(h0, dtype=dtype, device=device).to(dtype).expand(step).reshape(1, -1)
    )
    h = linear_scan(a_, x_, start)  # (1, T, N)
    last = h[0, -1].reshape(step)
    if before:
        first = torch.zeros_like(h[:, :1]) if start is None else start[:, None]
        h = torch.cat([first, h[:, :-1]], 1)
    if reverse:
        h = h.flip(1)
    states = h.reshape(T, *step).movedim(0, dim)
    return (states, last) if final else states


def _shape(value) -> torch.Size:
    return value.shape if isinstance(value, torch.Tensor) else torch.Size()


def _steps(value, dim: int) -> int:
    """How many steps `value` has at `dim` (1 for a number or a 0-dim tensor)."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return 1
    if not -value.dim() <= dim < value.dim():
        raise ValueError(f"dim {dim} is out of range for a tensor of shape {tuple(value.shape)}")
    return value.shape[dim]


def _step_shape(value, dim: int) -> torch.Size:
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return torch.Size()
    position = dim % value.dim()
    return value.shape[:position] + value.shape[position + 1 :]


def _at(value, dim: int, t: int):
    """`value` at step t (its one value when it has a single step)."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    return value.select(dim, t if value.shape[dim] > 1 else 0)


def _over_steps(value, dim: int, T: int, step: torch.Size, dtype, device) -> torch.Tensor:
    """`value` as a (T, *step) tensor: its steps first, its step dims broadcast to `step`."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return torch.as_tensor(value, dtype=dtype, device=device).to(dtype).expand(T, *step)
    moved = value.to(dtype).movedim(dim, 0)
    ones = (1,) * (len(step) - (moved.dim() - 1))
    return moved.reshape(moved.shape[0], *ones, *moved.shape[1:]).expand(T, *step)


def _first_step_dtype(a, x, h0) -> torch.dtype:
    """The dtype of `a * h0 + x` under torch's promotion rules (numbers and 0-dim tensors
    take part as scalars)."""

    def probe(value):
        if not isinstance(value, torch.Tensor):
            return value
        return value.new_empty(()) if value.dim() == 0 else value.new_empty((0,))

    h = 0.0 if h0 is None else probe(h0)
    result = probe(a) * h + probe(x)
    dtype = result.dtype if isinstance(result, torch.Tensor) else torch.get_default_dtype()
    return dtype


def broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """Whether a tensor of `shape` broadcasts to `target` with as many dims."""
    return len(shape) == len(target) and all(n in (1, m) for n, m in zip(shape, target))


class _LinearScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, x, h0):
        dtype = torch.promote_types(a.dtype, x.dtype)
        ct = torch.promote_types(dtype, torch.float32)  # compute type
        a_, x_ = a.to(ct), x.to(ct)
        if h0 is not None:  # fold the initial state into the first step: h_0 = a_0 h0 + x_0
            x_ = torch.cat([torch.addcmul(x_[:, :1], a_[:, :1], h0.to(ct)[:, None]), x_[:, 1:]], 1)
        h = _scan(a_, x_)  # (B, T, *)
        ctx.save_for_backward(a, h, h0)
        ctx.dtypes = a.dtype, x.dtype
        return h.to(dtype)

    @staticmethod
    def backward(ctx, grad_h):
        a, h, h0 = ctx.saved_tensors
        a_ = a.to(h.dtype)
        a_next = torch.cat([a_[:, 1:], torch.zeros_like(a_[:, :1])], 1)  # a_{t+1}, 0 after the end
        g = _scan(a_next.flip(1), grad_h.to(h.dtype).flip(1)).flip(1)  # (B, T, *)
        h_prev = torch.cat([torch.zeros_like(h[:, :1]) if h0 is None else h0.to(h.dtype)[:, None], h[:, :-1]], 1)
        grad_a = (g * h_prev).sum_to_size(a.shape).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        grad_x = g.to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        grad_h0 = (a_[:, 0] * g[:, 0]).to(h0.dtype) if ctx.needs_input_grad[2] else None
        return grad_a, grad_x, grad_h0


@compiled_on_cuda
def _scan(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The chunked scan from a zero state, no autograd: a broadcastable to x, both (B, T, *)."""
    B, T = x.shape[:2]
    C = min(MAX_CHUNK, math.isqrt(T - 1) + 1)  # ceil(sqrt(T)), at most MAX_CHUNK
    N = -(-T // C)  # number of chunks
    if N * C > T:  # pad the end with a = 1, x = 0: steps that change nothing before them
        a = torch.cat([a, a.new_ones(a.shape[0], N * C - T, *a.shape[2:])], 1)
        x = torch.cat([x, x.new_zeros(B, N * C - T, *x.shape[2:])], 1)
    a = a.unflatten(1, (N, C))  # (B, N, C, *)
    x = x.unflatten(1, (N, C))
    hs, ps = [x[:, :, 0]], [a[:, :, 0]]  # each (B, N, *)
    for c in range(1, C):
        hs.append(torch.addcmul(x[:, :, c], a[:, :, c], hs[-1]))
        ps.append(a[:, :, c] * ps[-1])
    carry = _doubling_scan(ps[-1], hs[-1])  # (B, N, *): the state at each chunk's end
    h, p = torch.stack(hs, 2), torch.stack(ps, 2)  # (B, N, C, *)
    h = torch.cat([h[:, :1], torch.addcmul(h[:, 1:], p[:, 1:], carry[:, :-1, None])], 1)
    return h.flatten(1, 2)[:, :T]


def _doubling_scan(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Hillis-Steele inclusive scan of h_t = a_t h_{t-1} + x_t over dim 1 in ceil(log2 T) steps."""
    s, T = 1, x.shape[1]
    while s < T:
        x = torch.cat([x[:, :s], torch.addcmul(x[:, s:], a[:, s:], x[:, :-s])], 1)
        a = torch.cat([a[:, :s], a[:, s:] * a[:, :-s]], 1)
        s *= 2
    return x
