"""PM504 on attention in the spellings people write it in, each written from the math,
softmax(q k^T * scale + mask) v, and checked against the rewrite in float64: outputs and
gradients of every input. A case is a function `f` and the shapes of its inputs; the
attention must be rewritten (`fix`) or reported without a fix (a word of the reason)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level

B, H, T, D = 2, 3, 7, 8
PREAMBLE = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
HEADS = {"q": (B, H, T, D), "k": (B, H, T, D), "v": (B, H, T, D)}
TIME_MAJOR_HEADS = {"q": (B, T, H, D), "k": (B, T, H, D), "v": (B, T, H, D)}

CASES = {
    "causal_mask_built_in_between": (
        """
        def f(q, k, v):
            T = q.size(-2)
            mask = torch.tril(torch.ones(T, T, device=q.device))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            att = att.masked_fill(mask == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            return att @ v
        """,
        HEADS,
        "fix",
    ),
    "triu_bool_mask": (
        """
        def f(q, k, v):
            T = q.shape[2]
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            scores = torch.matmul(q, k.mT) * q.shape[-1] ** -0.5
            scores = scores.masked_fill(causal, -float("inf"))
            return torch.matmul(scores.softmax(-1), v)
        """,
        HEADS,
        "fix",
    ),
    "ones_tril_bool_inverted": (
        """
        def f(q, k, v):
            T = q.size(2)
            keep = torch.ones(T, T).tril().bool()
            w = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf) / math.sqrt(q.size(-1)), dim=-1)
            return w @ v
        """,
        HEADS,
        "fix",
    ),
    "finite_fill_with_causal_mask": (
        """
        def f(q, k, v):
            T = q.size(-2)
            mask = torch.tril(torch.ones(T, T))
            att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
            att = att.masked_fill(mask == 0, -1e9)
            return att.softmax(dim=-1) @ v
        """,
        HEADS,
        "fix",
    ),
    "finfo_min_fill_with_causal_mask": (
        """
        def f(q, k, v):
            T = q.size(-2)
            future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
            att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
            att = att.masked_fill(future, torch.finfo(att.dtype).min)
            return att.softmax(dim=-1) @ v
        """,
        HEADS,
        "fix",
    ),
    "finite_fill_with_padding_mask": (
        """
        def f(q, k, v, pad):
            att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
            att = att.masked_fill(pad, -1e9)
            return att.softmax(dim=-1) @ v
        """,
        {**HEADS, "pad": "pad"},
        "all masked",
    ),
    "additive_causal_mask": (
        """
        def f(q, k, v):
            T = q.size(2)
            bias = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.size(-1)))
            return F.softmax(scores + bias, dim=-1) @ v
        """,
        HEADS,
        "fix",
    ),
    "inf_padding_mask": (
        """
        def f(q, k, v, pad):
            att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
            att = att.masked_fill(pad, float("-inf"))
            return att.softmax(dim=-1) @ v
        """,
        {**HEADS, "pad": "pad"},
        "fix",
    ),
    "einsum_heads_first": (
        """
        def f(q, k, v):
            scale = q.shape[-1] ** -0.5
            scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
            probs = scores.softmax(dim=-1)
            return torch.einsum("bhqk,bhkd->bhqd", probs, v)
        """,
        HEADS,
        "fix",
    ),
    "einsum_heads_after_time": (
        """
        def f(q, k, v):
            T = q.shape[1]
            causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
            sim = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
            sim = sim.masked_fill(~causal, float("-inf"))
            attn = sim.softmax(dim=-1)
            return torch.einsum("bhij,bjhd->bihd", attn, v)
        """,
        TIME_MAJOR_HEADS,
        "fix",
    ),
    "heads_after_time_with_transposes": (
        """
        def f(x, w_qkv):
            B, T, C = x.shape
            q, k, v = (x @ w_qkv).view(B, T, 3, 4, C // 4).unbind(2)
            att = q.transpose(1, 2) @ k.transpose(1, 2).transpose(2, 3) / math.sqrt(C // 4)
            att = F.softmax(att, dim=-1)
            return (att @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, C)
        """,
        {"x": (B, T, 16), "w_qkv": (16, 48)},
        "fix",
    ),
    "prescaled_query": (
        """
        def f(q, k, v):
            q = q * q.size(-1) ** -0.5
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            return attn @ v
        """,
        HEADS,
        "fix",
    ),
    "dropout_in_eval": (
        """
        def f(q, k, v):
            att = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
            att = F.dropout(att, p=0.1, training=False)
            return att @ v
        """,
        HEADS,
        "fix",
    ),
    "softmax_module_and_dropout_module": (
        """
        class Attention(nn.Module):
            def __init__(self, head_dim: int):
                super().__init__()
                self.scale = head_dim ** -0.5
                self.softmax = nn.Softmax(dim=-1)
                self.drop = nn.Dropout(0.1)

            def forward(self, q, k, v):
                dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
                attn = self.softmax(dots)
                attn = self.drop(attn)
                return torch.matmul(attn, v)

        def f(q, k, v):
            return Attention(q.shape[-1]).eval()(q, k, v)
        """,
        HEADS,
        "fix",
    ),
    "llama_optional_additive_mask": (
        """
        def f(x, wq, wk, wv, mask):
            bsz, seqlen, _ = x.shape
            n_heads, head_dim = 2, 4
            xq = (x @ wq).view(bsz, seqlen, n_heads, head_dim).transpose(1, 2)
            keys = (x @ wk).view(bsz, seqlen, n_heads, head_dim).transpose(1, 2)
            values = (x @ wv).view(bsz, seqlen, n_heads, head_dim).transpose(1, 2)
            scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(head_dim)
            if mask is not None:
                scores = scores + mask
            scores = F.softmax(scores.float(), dim=-1).type_as(xq)
            output = torch.matmul(scores, values)
            return output
        """,
        {"x": (B, T, D), "wq": (D, 8), "wk": (D, 8), "wv": (D, 8), "mask": "causal_additive"},
        "fix",
        1e-6,
    ),  # its softmax runs in float32 (`.float()`), SDPA's in float64
    "weights_name_rebound_by_the_output": (
        """
        def f(q, k, v):
            attn = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            attn = F.softmax(attn, dim=-1) @ v
            return attn
        """,
        HEADS,
        "fix",
    ),  # the read on the return line is the output's (this was "the weights are also read")
    "weights_read_after_the_output": (
        """
        def f(q, k, v):
            w = F.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1)), dim=-1)
            y = w @ v
            return y + w.sum()
        """,
        HEADS,
        "also read",
    ),
    "hex_and_binary_literal_sizes": (
        """
        def f(x, w_qkv):
            q, k, v = (x @ w_qkv).split(0x8, dim=-1)
            q = q.view(2, 0x7, 2, 4).transpose(1, 2)
            k = k.view(2, 0x7, 2, 4).transpose(1, 2)
            v = v.view(2, 0b111, 2, 4).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(0x4))
            return F.softmax(att, dim=-1) @ v
        """,
        {"x": (B, T, D), "w_qkv": (D, 24)},
        "fix",
    ),  # every literal is read as Python reads it (this was an internal error)
    "in_place_mask": (
        """
        def f(q, k, v):
            T = q.size(-2)
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            att = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
            att.masked_fill_(mask, float("-inf"))
            att = att.softmax(-1)
            return att @ v
        """,
        HEADS,
        "fix",
    ),
    "where_keep_mask": (
        """
        def f(q, k, v, keep):
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
            scores = torch.where(keep, scores, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v
        """,
        {**HEADS, "keep": "keep"},
        "fix",
    ),
    "bmm_three_dims": (
        """
        def f(q, k, v):
            q, k, v = (t.flatten(0, 1) for t in (q, k, v))
            w = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.size(-1))
            return torch.bmm(torch.softmax(w, dim=-1), v)
        """,
        HEADS,
        "fix",
    ),
    "weights_returned": (
        """
        def f(q, k, v):
            att = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
            return att @ v, att
        """,
        HEADS,
        "SDPA does not return",
    ),
    "softmax_over_queries": (
        """
        def f(q, k, v):
            att = F.softmax(q @ k.transpose(-2, -1), dim=-2)
            return att @ v
        """,
        HEADS,
        "last dim",
    ),
}


def make_inputs(spec: dict, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    inputs = {}
    for name, shape in spec.items():
        if shape == "pad":  # key padding: the last keys of the second sequence, never a whole row
            pad = torch.zeros(B, 1, 1, T, dtype=torch.bool)
            pad[1, ..., T - 3 :] = True
            inputs[name] = pad
        elif shape == "keep":
            keep = torch.ones(B, 1, T, T, dtype=torch.bool)
            keep[0, ..., 2:4] = False
            inputs[name] = keep
        elif shape == "causal_additive":
            inputs[name] = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), diagonal=1)
        else:
            inputs[name] = torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
    return inputs


def run(source: str, inputs: dict):
    namespace = {}
    exec(compile(source, "<case>", "exec"), namespace)
    fresh = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in inputs.items()}
    torch.manual_seed(0)
    out = namespace["f"](**fresh)
    outputs = list(out) if isinstance(out, tuple) else [out]
    weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(7), dtype=o.dtype) for o in outputs]
    tensors = [v for v in fresh.values() if v.requires_grad]
    grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outputs, weights)), tensors)
    return [o.detach() for o in outputs], grads


DROPPING = {"softmax_module_and_dropout_module"}


@pytest.mark.parametrize("name", CASES)
def test_attention(name):
    body, spec, expected, *tolerance = CASES[name]
    tol = tolerance[0] if tolerance else 1e-10
    source = PREAMBLE + textwrap.dedent(body)
    # (unsafe where a dropout may drop: SDPA draws other masks)
    level = Level.UNSAFE if name in DROPPING else Level.NUMERIC
    result = process_source(source.encode(), "case.py", Settings(select=("PM504",), level=level))
    assert result.error is None, result.error
    findings = [f for f in result.findings if f.code == "PM504"]
    assert all(f.level is level for f in findings if f.fixable), findings
    assert len(findings) == 1, findings
    if expected != "fix":
        assert not findings[0].fixable and expected in findings[0].message, findings[0].message
        assert result.new_source.decode() == source
        return
    assert findings[0].applied, findings[0].message
    new = result.new_source.decode()
    assert "scaled_dot_product_attention" in new and "softmax(" not in new.replace("nn.Softmax(", ""), new
    inputs = make_inputs(spec)
    (want, want_grads), (got, got_grads) = run(source, inputs), run(new, inputs)
    for g, w in zip([*got, *got_grads], [*want, *want_grads]):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=tol, atol=tol * w.abs().max().item())


@pytest.mark.parametrize(
    "body",
    [
        # linear attention: softmax over the features of q and of k, no q @ k^T
        """\
        q, k, v = map(lambda t: t.reshape(b, h, c, n), qkv)
        q = q.softmax(dim=-2)
        k = k.softmax(dim=-1)
        q = q * scale
        context = torch.einsum('b h d n, b h e n -> b h d e', k, v)
        out = torch.einsum('b h d e, b h d n -> b h e n', context, q)
        """,
        # a mixture of two predictions, weighted by a softmax of what the model predicts
        """\
        a, c, weights = out.split((3, 3, 2), dim=1)
        mixed = torch.einsum('b j h w, b j c h w -> b c h w', weights.softmax(dim=1), torch.stack((a, c), dim=1))
        """,
    ],
    ids=["linear_attention", "predicted_mixture"],
)
def test_a_softmax_of_what_the_rule_cannot_read_is_not_called_attention(body):
    source = PREAMBLE + "\n\ndef f(qkv, out, b, h, c, n, scale):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    result = process_source(source.encode(), "case.py", Settings(select=("PM504",), level=Level.UNSAFE))
    assert result.error is None and result.findings == []
