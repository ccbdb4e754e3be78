from __future__ import annotations

import re

import libcst as cst

from codemod.analysis.attention import Attention, attentions, permuted
from codemod.analysis.names import atom
from codemod.analysis.torch_facts import SDPA, functional_alias
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

PREAMBLE = """\
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
"""


def _module(body: str) -> str:
    return PREAMBLE + body


def _pair(before: str, after: str) -> tuple[str, str]:
    """An example module and its fix: the fix also removes the imports that the
    rewritten chain was the last to use (imports it never used stay)."""
    names = {"math": "math.", "torch": "torch.", "torch.nn as nn": "nn.", "torch.nn.functional as F": "F."}

    def uses(text: str, line: str) -> bool:
        return re.search(r"(?<![\w.])" + re.escape(names[line[len("import ") :].strip()]), text) is not None

    kept = [line for line in PREAMBLE.splitlines(keepends=True) if uses(after, line) or not uses(before, line)]
    return PREAMBLE + before, "".join(kept) + after


CAUSAL = """
class SelfAttention(nn.Module):
    def __init__(self, d, n_head, block_size, dropout):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_dropout = nn.Dropout(dropout)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
{body}        return y.transpose(1, 2).reshape(B, T, C)
"""
MANUAL = """\
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
"""
REWRITTEN = """\
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.attn_dropout.p if self.attn_dropout.training else 0.0,
            is_causal=True,
        )
"""


class ManualAttention(Rule):
    """
    ## What it does
    Finds attention written out by hand, `softmax(q @ k^T * scale + mask) @ v`,
    in one expression or over consecutive statements (intermediate names may be
    reused), and replaces it with one `F.scaled_dot_product_attention` call.

    The chain is read as the math it computes: scores as `q @ k.transpose(-2, -1)`,
    `.mT`, `torch.matmul`, `torch.bmm`, `transpose(2, 3)` / `permute(0, 1, 3, 2)`
    on tensors of known rank, or an `einsum` contracting q and k, with heads
    before or after time (`"bhqd,bhkd->bhqk"`, `"bqhd,bkhd->bhqk"`: the operands
    are permuted for SDPA and its output back); a scale before or after the mask
    (`/ math.sqrt(d)`, `* d ** -0.5`, `* self.scale`, or a pre-scaled `q`),
    or several in a row (`* d ** -0.5 * self.log_temp.exp()`); masks
    by `masked_fill` (also in place, also under `if mask is not None:`),
    `torch.where`, or added; `softmax` as `F.softmax`, `torch.softmax`,
    `.softmax(-1)` or an `nn.Softmax(dim=-1)` module, maybe computed in float32
    and cast back; dropout on the weights as an `nn.Dropout` module or
    `F.dropout(..., training=...)`. A causal mask built in the code (`tril` /
    `triu` of ones, bool or 0/1, maybe inverted, a registered buffer sliced to
    its top-left `[:T, :T]` corner, an additive `triu` of -inf, a local function
    returning one) becomes `is_causal=True`; other masks become `attn_mask`
    (additive ones summed, keep-masks combined).

    ## Why is this bad?
    The hand-written form materialises the (B, H, T, T) score matrix several
    times (scores, masked scores, softmax, dropout mask) and reads it back from
    memory at each step: attention's time and memory grow with T^2 and the GPU
    waits on memory. `scaled_dot_product_attention` dispatches to fused kernels
    (FlashAttention-2 for fp16/bf16 on recent GPUs, a memory-efficient kernel
    for fp32, a fused kernel on CPU) that never store the T x T matrix.
    FlashAttention-2 (Dao, 2023) reports 2-4x over the standard PyTorch form on
    A100/H100 for the attention op, and O(T) instead of O(T^2) memory for it,
    which often allows larger batches or context; the whole training step gains
    less. No extra package is needed. Measured on 2 CPU threads
    (`python -m benchmarks.bench_kernels --device cpu`, forward + backward,
    fp32, causal, B=4, H=8, d=64, T=512): SDPA 1.7x faster than the manual
    form. The flash kernel
    takes no arbitrary `attn_mask`: a padding mask runs on the memory-efficient
    or math kernel; `is_causal=True` keeps flash.

    ## Example
    ```python
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    att = self.attn_dropout(att)
    y = att @ v
    ```
    Use instead:
    ```python
    y = F.scaled_dot_product_attention(
        q,
        k,
        v,
        dropout_p=self.attn_dropout.p if self.attn_dropout.training else 0.0,
        is_causal=True,
    )
    ```

    ## Fix safety
    Numeric: the fused kernels sum in another order (within 1e-6 of the manual
    form in float32 on CPU, 1e-12 in float64), and a row whose keys are all
    masked gives zeros instead of NaN. Unsafe where the weights go through a
    dropout whose probability is not a literal 0: SDPA draws its masks from the
    RNG differently (the same p, other dropped entries), so training losses
    differ from the original's; in eval mode the results are the same. A finite fill (`-1e9`,
    `torch.finfo(dtype).min`) gives exactly the -inf result whenever a row keeps
    a key, as exp(fill - max) underflows to 0: it is rewritten only with a
    causal mask, which keeps the diagonal in every row; with another mask a
    fully masked row would average the values instead, so it is reported. The
    scale is passed as `scale=` unless it is provably the default
    1/sqrt(head dim); a scale that is a tensor (a learned temperature,
    `self.log_temperature.exp()`: SDPA's `scale=` takes only a float) is
    folded into q instead (`sdpa(q * scale, k, v, scale=1.0)`, which keeps its
    gradient), as long as it is the same for every key (its last dim, where
    the code shows it, of size 1: a per-head temperature); of several scales,
    the numbers multiply into `scale=` and the tensors fold into q. One that
    is neither provably a number nor provably a tensor
    (`self.temperature`) is passed as `scale=` and makes the fix unsafe. `is_causal=True` is used only when the mask is
    provably the square causal mask (which also proves T_q == T_k); a causal
    buffer then goes unused but is kept, as removing it would change the
    state_dict keys. An additive mask is passed as a float `attn_mask` (a
    boolean tensor added to the scores is reported: SDPA would read it as
    keep/drop).

    Reported without a fix: the attention weights or scores are used elsewhere
    (returned, stored, read again: SDPA does not return them), softmax over
    another dim or with a dtype, weights changed after the softmax
    (renormalized), a dropout that is not provably an `nn.Dropout` of the
    module, a transpose of k whose rank is not known, an additive mask beside a
    masked_fill. Left alone: code in a branch beside an SDPA fast path
    (`if self.flash: ... else: <manual>`), and softmaxes that are not
    attention (`F.softmax(logits / temperature, dim=-1)`).
    """

    CODE = "PM504"
    NAME = "manual-attention"
    LEVEL = Level.NUMERIC
    REQUIRES = ("softmax",)
    MESSAGE = "hand-written softmax(q @ k^T) @ v attention; use F.scaled_dot_product_attention"
    GAIN = "2-4x faster attention op on recent GPUs (FlashAttention-2's reported range) and O(T) memory for it"

    VALID = [
        Valid(
            _module(
                CAUSAL.format(
                    body="""\
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
"""
                    + MANUAL.replace("        ", "            ")
                )
            ),
            "beside an SDPA fast path",
        ),
        Valid(
            _module("""
def sample(logits, temperature):
    probs = F.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1)
"""),
            "a sampling softmax is not attention",
        ),
        Valid(
            _module("""
def softmax(x, dim):
    return x
def attend(q, k, v):
    return softmax(q @ k.transpose(-2, -1), dim=-1) @ v
"""),
            "a local softmax",
        ),
        Valid(
            _module(CAUSAL.format(body=MANUAL.replace("y = att @ v\n", "y = att @ v  # perfmod: ignore[PM504]\n"))),
            "suppressed on a line of the chain",
        ),
    ]
    INVALID = [
        Invalid(
            *_pair(CAUSAL.format(body=MANUAL), CAUSAL.format(body=REWRITTEN)),
            "a dropout module of unknown p: SDPA draws other masks, so the fix is unsafe",
            config={"level": Level.UNSAFE},
        ),
        Invalid(
            *_pair(
                CAUSAL.format(body=MANUAL).replace("nn.Dropout(dropout)", "nn.Dropout(0.0)"),
                CAUSAL.format(body=REWRITTEN).replace("nn.Dropout(dropout)", "nn.Dropout(0.0)"),
            ),
            "a dropout that drops nothing: the same values (numeric)",
        ),
        Invalid(
            *_pair(
                """
def attend(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + mask, dim=-1) @ v
""",
                """
def attend(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
""",
            ),
            "one expression, an additive mask",
        ),
        Invalid(
            *_pair(
                """
def attend(q, k, v, pad):
    scores = torch.matmul(q, k.mT) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(pad, -math.inf)
    return torch.matmul(scores.softmax(-1), v)
""",
                """
def attend(q, k, v, pad):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~pad)
""",
            ),
            "torch.matmul, .mT, a padding mask",
        ),
        Invalid(
            *_pair(
                """
def attend(q, k, v, head_dim):
    w = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)
    return w @ v
""",
                """
def attend(q, k, v, head_dim):
    return F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(head_dim))
""",
            ),
            "a scale that is not provably the default is passed",
        ),
        Invalid(
            *_pair(
                """
def attend(q, k, v, scale):
    w = F.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    return w @ v
""",
                """
def attend(q, k, v, scale):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)
""",
            ),
            "a scale that may be a tensor: the fix is unsafe",
            config={"level": Level.UNSAFE},
        ),
        Invalid(
            *_pair(
                """
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, q, k, v):
        w = F.softmax(q @ k.transpose(-2, -1) / self.log_temperature.exp(), dim=-1)
        return w @ v
""",
                """
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(
            q / self.log_temperature.exp(), k, v, scale=1.0
        )
""",
            ),
            "a learned temperature (a tensor) divides q: scale= takes only a float",
        ),
        Invalid(
            _module("""
def attend(q, k, v):
    w = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return w @ v, w
"""),
            None,
            "the weights are returned",
        ),
        Invalid(
            _module("""
def attend(q, k, v):
    w = F.softmax(q @ k.transpose(-2, -1), dim=1)
    return w @ v
"""),
            None,
            "softmax over another dim",
        ),
        Invalid(
            """import torch
from torch.nn.functional import softmax as sm

def attend(q, k, v):
    return sm(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1) @ v
""",
            """import torch

def attend(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)
""",
            "an aliased softmax; no alias of torch.nn.functional: spelled out; the alias goes with its last use",
        ),
        Invalid(
            _module("""
class Attention(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.drop = nn.Identity() if p == 0 else nn.Dropout(p)

    def forward(self, q, k, v):
        w = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
        w = self.drop(w)
        return w @ v
"""),
            None,
            "a module on the weights that may not be Dropout",
        ),
        Invalid(
            _module("""
def attend(q, k, v, mask):
    w = F.softmax((q @ k.transpose(-2, -1)).masked_fill(mask, -1e4), dim=-1)
    return w @ v
"""),
            None,
            "a mask fill other than -inf",
        ),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self.attentions = attentions(context)
        self.blocks_with_softmax: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        """Note the block of each call that may be a softmax: only those blocks can hold a chain."""
        if self.attentions.may_be_softmax(node):
            block = self.context.index.first_enclosing(node, cst.IndentedBlock)
            if block is not None:
                self.blocks_with_softmax.add(id(block))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        if id(original_node) not in self.blocks_with_softmax:
            return
        found = self.attentions.in_block(original_node)
        if not found or self.attentions.beside_fast_path(original_node):
            return
        statements = list(original_node.body)
        for chain in found:
            attention = chain.attention
            if attention is None:
                self.report(chain.product, f"hand-written attention, not rewritten: {chain.problem}", at=chain.at)
                continue
            if any(suppressed_on(statements[j], self.CODE) for j in [chain.index, *attention.consumed]):
                continue
            message = self.MESSAGE
            if attention.scale_unproven:
                message = "hand-written attention; its scale " + attention.scale_unproven
            if attention.dropout_draws:
                message += (
                    "; unsafe: SDPA's dropout drops other entries than the hand-written one (the same p, "
                    "another draw from the RNG), so training losses differ; eval-mode results are the same"
                )
            edits = [Remove(statements[j]) for j in sorted(set(attention.consumed))]
            edits.append(Replace(chain.product, lambda updated, a=attention: self._sdpa_call(a, updated)))
            self.report(
                chain.product,
                message,
                edits=edits,
                imports=self._imports(),
                level=Level.UNSAFE if attention.scale_unproven or attention.dropout_draws else None,
                at=chain.at,
            )

    def _sdpa_call(self, attention: Attention, product: cst.BaseExpression) -> cst.BaseExpression:
        """The SDPA call that replaces `product` (maybe with edits inside v already made)."""
        if isinstance(product, cst.BinaryOperation):
            v = product.right
        elif isinstance(product.func, cst.Attribute) and product.func.attr.value == "matmul" and len(product.args) == 1:
            v = product.args[0].value
        else:
            v = product.args[attention.v_argument].value
        if attention.v_order is not None:
            v = permuted(v, *attention.v_order)
        q = atom(attention.q) if attention.folded else attention.q
        for scale, divide in attention.folded:  # (q * s) @ k^T is s * (q @ k^T), and keeps s's gradient
            q = cst.BinaryOperation(
                left=q,
                operator=cst.Divide() if divide else cst.Multiply(),
                right=atom(scale.with_changes(lpar=[], rpar=[])),
            )
        args = [cst.Arg(q), cst.Arg(attention.k), cst.Arg(v)]
        keywords = [
            ("attn_mask", attention.mask),
            ("dropout_p", attention.dropout),
            ("is_causal", cst.Name("True") if attention.causal else None),
            ("scale", attention.scale),
        ]
        args += [
            cst.Arg(
                value, keyword=cst.Name(key), equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
            )
            for key, value in keywords
            if value is not None
        ]
        args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in args[:-1]] + args[
            -1:
        ]
        call = cst.Call(func=self._sdpa_name(), args=args)
        if attention.out_order is not None:
            call = permuted(call, *attention.out_order)
        return call

    def _sdpa_name(self) -> cst.BaseExpression:
        """`F.scaled_dot_product_attention` through the file's alias of torch.nn.functional, else spelled out."""
        alias = self._functional_alias()
        if alias is not None:
            return cst.parse_expression(f"{alias}.scaled_dot_product_attention")
        return cst.parse_expression(SDPA)

    def _functional_alias(self) -> str | None:
        alias = functional_alias(self.context.module)
        return None if alias == "torch.nn.functional" else alias

    def _imports(self) -> list[tuple[str, str | None]]:
        """`import torch.nn.functional` when the call is spelled out and the file does not import torch."""
        if self._functional_alias() is not None:
            return []
        return [] if "torch" in self.context.index.plain_imports else [("torch.nn.functional", None)]
