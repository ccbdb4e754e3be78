"""PM505 on time loops in the layouts and spellings people write them in, each written
from the math (a state S updated as S = a * S + x, read by the step's output) and
checked against the rewrite in float64: outputs and gradients of every input.

A case is a function and the shapes of its inputs; the loop must be rewritten (`fix`)
or reported without a fix (`report`, with a word of the reason)."""

from __future__ import annotations

import ast
import textwrap

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level

B, H, T, K, V, D, N = 2, 3, 11, 4, 5, 6, 3

# name -> (source, {argument: shape or a float}, expected: "fix" or a word of the report)
CASES = {
    "time_on_dim_0": (
        """
        def f(a, x, h):
            ys = []
            for t in range(x.shape[0]):
                h = a[t] * h + x[t]
                ys.append(h)
            return torch.stack(ys)
        """,
        {"a": "rand(T, B, D)", "x": (T, B, D), "h": (B, D)},
        "fix",
    ),
    "time_last": (
        """
        def f(a, x):
            h = torch.zeros_like(x[..., 0])
            ys = []
            for t in range(x.size(-1)):
                h = a[..., t] * h + x[..., t]
                ys.append(h)
            return torch.stack(ys, dim=-1)
        """,
        {"a": "rand(B, D, T)", "x": (B, D, T)},
        "fix",
    ),
    "output_list_rebound_by_its_stack": (
        """
        def f(a, x, h):
            out = []
            for t in range(x.shape[1]):
                h = a[:, t] * h + x[:, t]
                out.append(h)
            out = torch.stack(out, dim=1)
            return out
        """,
        {"a": "rand(B, T, D)", "x": (B, T, D), "h": (B, D)},
        "fix",
    ),  # the read after the stack is the stacked tensor's, not the list's
    "state_read_after_the_loop_through_a_new_name": (
        """
        def f(a, x, h):
            ys = []
            for t in range(x.shape[1]):
                g = a[:, t]
                h = g * h + x[:, t]
                ys.append(h)
            g = torch.stack(ys, dim=1)
            return g * 2
        """,
        {"a": "rand(B, T, D)", "x": (B, T, D), "h": (B, D)},
        "fix",
    ),  # `g` after the loop is a new binding, not the loop's temporary
    "ema_constant_decay": (
        """
        def f(x):
            decay = 0.9
            h = x[:, 0]
            ys = []
            for t in range(x.shape[1]):
                h = decay * h + (1 - decay) * x[:, t]
                ys.append(h)
            return torch.stack(ys, dim=1)
        """,
        {"x": (B, T, D)},
        "fix",
    ),
    "per_channel_decay_tensor": (
        """
        def f(x, logit):
            B, T, D = x.shape
            decay = torch.sigmoid(logit).view(1, D)
            h = torch.zeros(B, D, dtype=x.dtype)
            out = torch.zeros(B, T, D, dtype=x.dtype)
            for t in range(T):
                h = decay * h + x[:, t]
                out[:, t] = h
            return out
        """,
        {"x": (B, T, D), "logit": (D,)},
        "fix",
    ),
    "gla_heads_after_time": (
        """
        def f(q, k, v, g):
            B, T, H, K = q.shape
            S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype)
            outs = []
            for t in range(T):
                kv = k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
                S = torch.sigmoid(g[:, t]).unsqueeze(-1) * S + kv
                outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
            return torch.stack(outs, dim=1)
        """,
        {"q": (B, T, H, K), "k": (B, T, H, K), "v": (B, T, H, V), "g": (B, T, H, K)},
        "fix",
    ),
    "state_value_by_key": (
        """
        def f(r, k, v, w):
            B, H, T, K = r.shape
            S = torch.zeros(B, H, v.shape[-1], K, dtype=r.dtype)
            outs = []
            for t in range(T):
                S = w[:, :, t].unsqueeze(-2) * S + v[:, :, t].unsqueeze(-1) * k[:, :, t].unsqueeze(-2)
                outs.append((S * r[:, :, t].unsqueeze(-2)).sum(-1))
            return torch.stack(outs, dim=2)
        """,
        {"r": (B, H, T, K), "k": (B, H, T, K), "v": (B, H, T, V), "w": "rand(B, H, T, K)"},
        "fix",
    ),
    "matmul_outer_and_readout_keep_dims": (
        """
        def f(x, wq, wk, wv):
            B, T, C = x.shape
            q, k, v = ((x @ w).view(B, T, 3, -1).transpose(1, 2) for w in (wq, wk, wv))
            S = torch.zeros(B, 3, q.shape[-1], v.shape[-1], dtype=q.dtype)
            outs = []
            for t in range(T):
                S = S + k[:, :, t:t + 1].mT @ v[:, :, t:t + 1]
                outs.append(q[:, :, t:t + 1] @ S)
            return torch.cat(outs, dim=2)
        """,
        {"x": (B, T, D), "wq": (D, 12), "wk": (D, 12), "wv": (D, 6)},
        "fix",
    ),
    "matmul_outer_of_tensors_of_unknown_rank": (
        """
        def f(q, k, v):
            B, H, T, K = q.shape
            S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype)
            outs = []
            for t in range(T):
                S = S + k[:, :, t:t + 1].mT @ v[:, :, t:t + 1]
                outs.append(q[:, :, t:t + 1] @ S)
            return torch.cat(outs, dim=2)
        """,
        {"q": (B, H, T, K), "k": (B, H, T, K), "v": (B, H, T, V)},
        "concatenated",
    ),
    # reported by a user: the output read the state before the update (o = r S; S = w S + k v),
    # and an earlier rewrite computed it after the update (outputs off by up to 4, losses by 83%)
    "output_reads_the_state_before_its_update": (
        """
        def f(r, k, v, w, S):
            outs = []
            for t in range(r.shape[2]):
                o = torch.einsum("bhk,bhkv->bhv", r[:, :, t], S)
                S = w[:, :, t, :, None] * S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
                outs.append(o)
            return torch.stack(outs, dim=2), S
        """,
        {"r": (B, H, T, K), "k": (B, H, T, K), "v": (B, H, T, V), "w": "rand(B, H, T, K)", "S": (B, H, K, V)},
        "fix",
    ),
    "rwkv_bonus_constant_decay": (
        """
        def f(r, k, v, time_decay, u):
            H, K = time_decay.shape
            w = torch.exp(-torch.exp(time_decay))
            state = torch.zeros(r.shape[0], H, K, v.shape[-1], dtype=r.dtype)
            outs = []
            for t in range(r.shape[2]):
                kv = k[:, :, t, :, None] * v[:, :, t, None, :]
                outs.append((r[:, :, t, :, None] * (state + u.unsqueeze(-1) * kv)).sum(-2))
                state = w[:, :, None] * state + kv
            return torch.stack(outs, 2)
        """,
        {"r": (B, H, T, K), "k": (B, H, T, K), "v": (B, H, T, V), "time_decay": (H, K), "u": (H, K)},
        "fix",
    ),
    "per_step_decay_computed_in_the_loop": (
        """
        def f(q, k, v, w_log):
            S = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], dtype=q.dtype)
            outs = []
            for t in range(q.shape[2]):
                decay = torch.exp(-torch.exp(w_log[:, :, t]))
                S = decay[..., None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]
                outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S) * torch.sigmoid(q[:, :, t, :1]))
            return torch.stack(outs, dim=2)
        """,
        {"q": (B, H, T, K), "k": (B, H, T, K), "v": (B, H, T, V), "w_log": (B, H, T, K)},
        "fix",
    ),
    "selective_scan": (
        """
        def f(x, dt, A_log, Bm, C):
            A = -torch.exp(A_log)
            b, l, d = x.shape
            h = torch.zeros(b, d, A.shape[-1], dtype=x.dtype)
            ys = []
            for t in range(l):
                h = torch.exp(dt[:, t, :, None] * A) * h + dt[:, t, :, None] * Bm[:, t, None, :] * x[:, t, :, None]
                ys.append((h * C[:, t, None, :]).sum(-1))
            return torch.stack(ys, dim=1)
        """,
        {"x": (B, T, D), "dt": "rand(B, T, D)", "A_log": (D, N), "Bm": (B, T, N), "C": (B, T, N)},
        "fix",
    ),
    "linear_attention_with_normalizer": (
        """
        def f(q, k, v):
            q, k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
            B, H, T, K = q.shape
            S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype)
            z = torch.zeros(B, H, K, dtype=q.dtype)
            outs = []
            for t in range(T):
                S = S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
                z = z + k[:, :, t]
                num = torch.einsum("bhk,bhkv->bhv", q[:, :, t], S)
                den = (q[:, :, t] * z).sum(-1, keepdim=True)
                outs.append(num / den)
            return torch.stack(outs, dim=2)
        """,
        {"q": (B, H, T, K), "k": (B, H, T, K), "v": (B, H, T, V)},
        "fix",
    ),
    "unbind_iteration": (
        """
        def f(a, x, h):
            ys = []
            for a_t, x_t in zip(a.unbind(1), x.unbind(1)):
                h = a_t * h + x_t
                ys.append(h)
            return torch.stack(ys, 1), h
        """,
        {"a": "rand(B, T, D)", "x": (B, T, D), "h": (B, D)},
        "fix",
    ),
    "lagged_states": (
        """
        def f(a, x):
            h = torch.zeros_like(x[:, 0])
            hs = []
            for t in range(x.shape[1]):
                hs.append(h)
                h = a[:, t] * h + x[:, t]
            return torch.stack(hs, dim=1)
        """,
        {"a": "rand(B, T, D)", "x": (B, T, D)},
        "fix",
    ),
    "fewer_steps_than_the_tensor": (
        """
        def f(a, x):
            steps = 7
            h = torch.zeros_like(x[:, 0])
            hs = []
            for t in range(steps):
                h = a[:, t] * h + x[:, t]
                hs.append(h)
            return torch.stack(hs, dim=1)
        """,
        {"a": "rand(B, T, D)", "x": (B, T, D)},
        "fix",
    ),
    "decay_along_values": (
        """
        def f(q, k, v, w, S):
            outs = []
            for t in range(q.shape[2]):
                S = w[:, :, t].unsqueeze(-2) * S + k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
                outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
            return torch.stack(outs, dim=2)
        """,
        {"q": (B, H, T, K), "k": (B, H, T, K), "v": (B, H, T, V), "w": "rand(B, H, T, V)", "S": (B, H, K, V)},
        "fix",
    ),
    "time_major_preallocated": (
        """
        def f(gates, inputs):
            state = torch.zeros_like(inputs[0])
            out = torch.empty_like(inputs)
            for t in range(inputs.shape[0]):
                state = gates[t] * state + inputs[t]
                out[t] = state
            return out
        """,
        {"gates": "rand(T, B, D)", "inputs": (T, B, D)},
        "fix",
    ),
    "nonlinear_update": (
        """
        def f(a, x):
            h = torch.zeros_like(x[:, 0])
            hs = []
            for t in range(x.shape[1]):
                h = torch.tanh(a[:, t] * h + x[:, t])
                hs.append(h)
            return torch.stack(hs, dim=1)
        """,
        {"a": "rand(B, T, D)", "x": (B, T, D)},
        "linear",
    ),
    "head_scrambling_reshape": (
        """
        def f(q, k, v):
            B, H, T, K = q.shape
            S = torch.zeros(B, H, K, K, dtype=q.dtype)
            outs = []
            for t in range(T):
                kv = (k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)).reshape(B, K, H, K).transpose(1, 2)
                S = 0.9 * S + kv
                outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
            return torch.stack(outs, dim=2)
        """,
        {"q": (B, H, T, K), "k": (B, H, T, K), "v": (B, H, T, K)},
        "reshape",
    ),
    "dropout_in_the_loop": (
        """
        def f(a, x):
            h = torch.zeros_like(x[:, 0])
            hs = []
            for t in range(x.shape[1]):
                h = a[:, t] * h + torch.nn.functional.dropout(x[:, t], 0.1)
                hs.append(h)
            return torch.stack(hs, dim=1)
        """,
        {"a": "rand(B, T, D)", "x": (B, T, D)},
        "random",
    ),
    "decay_of_unknown_kind": (
        """
        def f(x, decay):
            h = torch.zeros_like(x[:, 0])
            hs = []
            for t in range(x.shape[1]):
                h = decay * h + x[:, t]
                hs.append(h)
            return torch.stack(hs, dim=1)
        """,
        {"x": (B, T, D), "decay": 0.5},
        "number or a tensor",
    ),
}


def make_inputs(spec: dict, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    sizes = {"B": B, "H": H, "T": T, "K": K, "V": V, "D": D, "N": N}
    inputs = {}
    for name, shape in spec.items():
        if isinstance(shape, float):
            inputs[name] = shape
            continue
        if isinstance(shape, str):  # "rand(...)", "-rand(...)": values in (0, 1) or (-1, 0)
            sign = -1.0 if shape.startswith("-") else 1.0
            dims = [sizes[d.strip()] for d in shape[shape.index("(") + 1 : -1].split(",")]
            value = sign * (0.05 + 0.9 * torch.rand(dims, generator=gen, dtype=torch.float64))
        else:
            value = torch.randn(
                [sizes[d] if isinstance(d, str) else d for d in shape], generator=gen, dtype=torch.float64
            )
        inputs[name] = value.requires_grad_()
    return inputs


def run(source: str, inputs: dict):
    namespace = {"torch": torch}
    exec(compile(source, "<case>", "exec"), namespace)
    fresh = {k: v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    result = namespace["f"](**fresh)
    outputs = list(result) if isinstance(result, tuple) else [result]
    weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(7), dtype=o.dtype) for o in outputs]
    tensors = [v for v in fresh.values() if isinstance(v, torch.Tensor)]
    grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outputs, weights)), tensors, allow_unused=True)
    return [o.detach() for o in outputs], grads


def rewritten(source: str):
    result = process_source(source.encode(), "case.py", Settings(select=("PM505",), level=Level.NUMERIC))
    assert result.error is None, result.error
    return result


@pytest.mark.parametrize("name", CASES)
def test_time_loop(name):
    body, spec, expected = CASES[name]
    source = "import torch\n" + textwrap.dedent(body)
    result = rewritten(source)
    findings = [f for f in result.findings if f.code == "PM505"]
    assert len(findings) == 1, findings
    if expected != "fix":
        assert not findings[0].fixable and expected in findings[0].message, findings[0].message
        assert result.new_source.decode() == source
        return
    assert findings[0].applied, findings[0].message
    new = result.new_source.decode()
    assert not any(isinstance(node, ast.For) for node in ast.walk(ast.parse(new))), new
    inputs = make_inputs(spec)
    (want, want_grads), (got, got_grads) = run(source, inputs), run(new, inputs)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10 * w.abs().max().item())
    for g, w in zip(got_grads, want_grads):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10 * w.abs().max().item())
