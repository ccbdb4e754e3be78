"""`attentions`: which `weights @ v` products are hand-written attention, and what
`scaled_dot_product_attention` needs to compute the same (q, k, scale, mask, causal,
dropout), or why a part of the chain cannot be proven.

The answers are checked by running them: SDPA called with what the analysis read must
give what the hand-written chain gave."""

import math

import libcst as cst
import torch
import torch.nn.functional as F

from codemod.analysis.attention import attentions
from codemod.context import FileContext

HEAD = """\
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
"""


def found(body: str):
    """The context, and what the analysis found in the first block that holds a softmax."""
    context = FileContext.of_source(HEAD + body)
    analysis = attentions(context)
    for block in context.index.find(cst.IndentedBlock, within=context.module):
        chains = analysis.in_block(block)
        if chains:
            return context, chains
    return context, []


def code(context, node) -> str | None:
    return None if node is None else cst.Module([]).code_for_node(node)


def sdpa(context, attention, names: dict):
    """SDPA called with the analysis' answer, its expressions evaluated over `names`."""
    scope = {"torch": torch, "F": F, "math": math, **names}

    def value(node):
        return None if node is None else eval(code(context, node), scope)

    q = value(attention.q)
    for scale, divide in attention.folded:
        q = q / value(scale) if divide else q * value(scale)
    return F.scaled_dot_product_attention(
        q,
        value(attention.k),
        names["v"],
        attn_mask=value(attention.mask),
        is_causal=attention.causal,
        scale=value(attention.scale),
    )


def run(body: str, function: str, *args):
    scope: dict = {}
    exec(HEAD + body, scope)
    return scope[function](*args)


CAUSAL = """
def decoder(q, k, v):
    t = q.size(-2)
    keep = torch.tril(torch.ones(t, t, dtype=torch.bool, device=q.device))
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)
"""


def test_a_causal_tril_mask_is_is_causal_and_gives_the_same_output():
    context, chains = found(CAUSAL)
    assert len(chains) == 1 and chains[0].problem is None
    attention = chains[0].attention
    assert attention.causal and attention.mask is None
    assert attention.scale is None  # 1/sqrt(q.size(-1)) is SDPA's default
    assert (code(context, attention.q), code(context, attention.k)) == ("q", "k")
    assert len(attention.consumed) == 3  # scores, the masked scores and the softmax fold into the product
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    assert torch.allclose(
        sdpa(context, attention, {"q": q, "k": k, "v": v}), run(CAUSAL, "decoder", q, k, v), atol=1e-5
    )


PADDING = """
def encoder(q, k, v, lengths):
    keys = torch.arange(k.shape[2])[None, :] < lengths[:, None]
    w = (q @ k.mT) * q.shape[-1] ** -0.5
    w = w.masked_fill(keys[:, None, None, :] == 0, -math.inf)
    return w.softmax(-1) @ v
"""


def test_a_padding_mask_by_masked_fill_becomes_the_keep_mask():
    context, chains = found(PADDING)
    attention = chains[0].attention
    assert chains[0].problem is None and not attention.causal
    assert code(context, attention.mask) == "keys[:, None, None, :] != 0"
    assert attention.scale is None
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)
    lengths = torch.tensor([6, 2, 4])
    keys = torch.arange(6)[None, :] < lengths[:, None]
    ours = sdpa(context, attention, {"q": q, "k": k, "v": v, "keys": keys})
    assert torch.allclose(ours, run(PADDING, "encoder", q, k, v, lengths), atol=1e-5)


def test_a_finite_fill_beside_a_padding_mask_is_the_reason_it_stays():
    body = PADDING.replace("-math.inf", "-1e9")
    _, chains = found(body)
    assert chains[0].attention is None
    assert "not -inf" in chains[0].problem and "average the values" in chains[0].problem


TEMPERATURE = """
class Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(torch.full((1,), 2.0))

    def forward(self, q, k, v):
        logits = q @ k.transpose(-2, -1) / self.temperature
        return F.softmax(logits, dim=-1) @ v
"""


def test_a_learned_temperature_is_folded_into_q_and_keeps_its_gradient():
    context, chains = found(TEMPERATURE)
    attention = chains[0].attention
    assert chains[0].problem is None and attention.scale_unproven is None
    [(scale, divide)] = attention.folded
    assert code(context, scale) == "self.temperature" and divide
    assert code(context, attention.scale) == "1.0"
    scope: dict = {}
    exec(HEAD + TEMPERATURE, scope)
    pool = scope["Pool"]()
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 5, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    ours = sdpa(context, attention, {"q": q, "k": k, "v": v, "self": pool})
    ours.sum().backward()
    theirs_grad, pool.temperature.grad = pool.temperature.grad.clone(), None
    theirs = pool(q, k, v)
    theirs.sum().backward()
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert torch.allclose(theirs_grad, pool.temperature.grad, atol=1e-5)


TWO_SCALES = """
class Attn(nn.Module):
    def __init__(self, h=4):
        super().__init__()
        self.log_temp = nn.Parameter(torch.linspace(-0.5, 0.5, h).view(h, 1, 1))

    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5 * self.log_temp.exp()
        return s.softmax(dim=-1) @ v
"""


def test_scores_scaled_twice_keep_the_default_scale_and_fold_the_temperature_into_q():
    """A learned per-head temperature after the usual 1/sqrt(d) (the blind round's #11: no
    finding at all). The number stays SDPA's default scale, the tensor goes into q."""
    context, chains = found(TWO_SCALES)
    attention = chains[0].attention
    assert chains[0].problem is None and attention.scale_unproven is None
    assert attention.scale is None  # q.size(-1) ** -0.5 is SDPA's default
    assert [(code(context, s), divide) for s, divide in attention.folded] == [("self.log_temp.exp()", False)]
    scope: dict = {}
    exec(HEAD + TWO_SCALES, scope)
    attn = scope["Attn"]().double()
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    ours = sdpa(context, attention, {"q": q, "k": k, "v": v, "self": attn})
    ours.square().sum().backward()
    ours_grad, attn.log_temp.grad = attn.log_temp.grad.clone(), None
    theirs = attn(q, k, v)
    theirs.square().sum().backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_grad, attn.log_temp.grad, rtol=1e-10, atol=1e-12)


def test_numbers_among_several_factors_multiply_into_one_scale():
    body = """
def attend(q, k, v):
    w = 2.0 * (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1)) * 0.5
    return w.softmax(-1) @ v
"""
    context, chains = found(body)
    attention = chains[0].attention
    assert not attention.folded and code(context, attention.scale) == "2.0 / math.sqrt(q.size(-1)) * 0.5"
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 5, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(sdpa(context, attention, {"q": q, "k": k, "v": v}), run(body, "attend", q, k, v))


def test_a_tensor_scale_that_varies_along_the_keys_is_the_reason_it_stays():
    body = TWO_SCALES.replace("torch.linspace(-0.5, 0.5, h).view(h, 1, 1)", "torch.zeros(6, 6)")
    _, chains = found(body)
    assert chains[0].attention is None
    assert "`self.log_temp.exp()` varies along the keys (its last dim is 6)" in chains[0].problem


def test_a_scale_that_may_be_a_tensor_says_so():
    body = """
def attend(q, k, v, tau):
    return torch.softmax(q @ k.transpose(-2, -1) * tau, dim=-1) @ v
"""
    _, chains = found(body)
    assert "not provably a Python number" in chains[0].attention.scale_unproven


WEIGHTS_READ_LATER = """
def attend(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    weights = F.softmax(scores, dim=-1)
    out = weights @ v
    entropy = -(weights * weights.log()).sum(-1)
    return out, entropy
"""


def test_softmax_weights_read_again_later_are_the_reason_it_stays():
    context, chains = found(WEIGHTS_READ_LATER)
    assert chains[0].attention is None
    assert "`weights` are also read on line 10" in chains[0].problem
    assert context.line(chains[0].at) == 7  # the statement computing q @ k^T


CAUSAL_WHEN_ASKED = """
def attend(q, k, v, causal):
    scores = q @ k.transpose(-2, -1)
    if causal:
        future = torch.triu(torch.ones(q.size(-2), k.size(-2), dtype=torch.bool), diagonal=1)
        scores.masked_fill_(future, float("-inf"))
    weights = torch.softmax(scores / math.sqrt(q.size(-1)), dim=-1)
    return weights @ v
"""


def test_scores_masked_in_place_under_a_condition_give_the_condition_as_the_reason():
    _, chains = found(CAUSAL_WHEN_ASKED)
    assert chains[0].attention is None
    assert chains[0].problem.startswith("`scores` is masked in place only when `causal` (line 8)")


def test_a_softmax_over_other_than_scores_is_no_attention():
    body = """
def mix(gates, experts):
    return F.softmax(gates, dim=-1) @ experts
"""
    assert found(body)[1] == []


def test_causal_masks_and_fills_built_in_the_code():
    context = FileContext.of_source(
        HEAD
        + """
n = 8
upper = torch.triu(torch.ones(n, n), diagonal=1).bool()
lower = torch.ones(n, n).tril() == 1
halved = torch.tril(torch.ones(n, n)).half().cuda() != 0
other = torch.triu(torch.ones(n, n)).bool()
fills = [float("-inf"), -float("inf"), float("-Infinity"), -torch.inf, -1e9, -1e4, float("inf")]
"""
    )
    analysis = attentions(context)
    values = {
        a.targets[0].target.value: a.value
        for a in context.index.find(cst.Assign, within=context.module)
        if isinstance(a.targets[0].target, cst.Name)
    }
    assert analysis.causal(values["upper"], "fill") and not analysis.causal(values["upper"], "keep")
    assert analysis.causal(values["lower"], "keep") and not analysis.causal(values["lower"], "fill")
    assert analysis.causal(values["halved"], "keep")  # a cast and a move keep where the mask is set
    assert not analysis.causal(values["other"], "fill")  # the diagonal is masked too
    fills = [element.value for element in values["fills"].elements]
    assert [analysis.fill(v) for v in fills] == ["-inf"] * 4 + ["finite", None, None]
