from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from codemod.analysis.names import kwarg, names_read, positional
from codemod.analysis.torch_facts import DROPOUTS, SDPA, SOFTMAXES, functional_alias
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on
NEG_INF = (
    m.Call(func=m.Name("float"), args=[m.Arg(m.SimpleString(m.MatchIfTrue(
        lambda s: s.strip("'\"").lower() in ("-inf", "-infinity"))))])
    | m.UnaryOperation(operator=m.Minus(), expression=m.Call(func=m.Name("float"), args=[m.Arg(
        m.SimpleString(m.MatchIfTrue(lambda s: s.strip("'\"").lower() in ("inf", "infinity"))))]))
    | m.UnaryOperation(operator=m.Minus(), expression=m.Attribute(value=m.Name("math") | m.Name("torch"),
                                                                  attr=m.Name("inf")))
)
FULL_SLICE = m.SubscriptElement(m.Slice(lower=None, upper=None, step=None))

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
        return re.search(r"(?<![\w.])" + re.escape(names[line[len("import "):].strip()]), text) is not None

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
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout.p if self.attn_dropout.training else 0.0, is_causal=True)
"""


@dataclass
class _Attention:
    """What one matched chain computes, and the statements it spans."""

    q: cst.BaseExpression | None = None
    k: cst.BaseExpression | None = None
    v: cst.BaseExpression | None = None
    scale: cst.BaseExpression | None = None  # None: the default 1/sqrt(q.size(-1))
    scale_unproven: str | None = None  # why `scale=` may not be a Python number
    causal: bool = False
    mask: cst.BaseExpression | None = None  # SDPA's attn_mask
    dropout: cst.BaseExpression | None = None  # SDPA's dropout_p
    consumed: list[int] = field(default_factory=list)  # indices of the statements folded into the last
    links: list[str] = field(default_factory=list)  # the intermediate names, one per consumed statement
    skipped: list[int] = field(default_factory=list)  # assignments between the chain's statements, kept


class _NoMatch(Exception):
    """The chain is hand-written attention, but a part is not one the rule can prove; the message says which."""


class ManualAttention(Rule):
    """
    ## What it does
    Finds attention written out by hand, `softmax(q @ k^T * scale + mask) @ v`,
    in one expression or over consecutive statements (`att = ...` lines), and
    replaces it with one `F.scaled_dot_product_attention` call.

    Recognised: the scores `q @ k.transpose(-2, -1)` (or `-1, -2`, `.mT`,
    `torch.matmul`) scaled by `/ math.sqrt(d)`, `/ d ** 0.5`, `* d ** -0.5`,
    `* (1.0 / math.sqrt(d))` or not at all; then a mask: the causal
    lower-triangular buffer (`masked_fill(self.bias[:, :, :T, :T] == 0,
    float("-inf"))`, nanoGPT) becomes `is_causal=True`, another
    `masked_fill(mask, -inf)` becomes `attn_mask=~mask`, `+ mask` becomes
    `attn_mask=mask`; `softmax` over the last dim; then an `nn.Dropout` module
    of the same class on the weights becomes `dropout_p`.

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
    less. No extra package is needed. Measured here on 2 CPU threads
    (`python -m benchmarks.bench_kernels --device cpu`, forward + backward,
    fp32, causal): see the "attention" rows of that table. The flash kernel
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
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout.p if self.attn_dropout.training else 0.0, is_causal=True)
    ```

    ## Fix safety
    Numeric: the fused kernels sum in another order (within 1e-6 of the manual
    form in float32 on CPU, see tests/rules/test_pm504_execution.py), and two
    cases change values: dropout draws its masks from the RNG differently (same
    p, different dropped entries; identical in eval mode), and a row whose keys
    are all masked gives zeros instead of NaN. The scale is passed as `scale=`
    unless it is provably the default 1/sqrt(q.size(-1)); a scale that is not
    provably a Python number (`self.scale`, maybe a learned tensor whose
    gradient SDPA would drop) makes the fix unsafe. `is_causal=True` is used
    only when the mask is provably the lower-triangular buffer sliced
    `[:T, :T]` in both dims (which also proves T_q == T_k, else the mask would
    not broadcast); the causal buffer then goes unused but is kept, as removing
    it would change the state_dict keys and break loading checkpoints.

    Reported without a fix: the attention weights are used elsewhere (returned,
    stored: SDPA does not return them), softmax over another dim or with a
    dtype, a dropout that is not provably an `nn.Dropout` of the module, a mask
    fill other than -inf. Left alone: code in a branch beside an SDPA fast path
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
        Valid(_module(CAUSAL.format(body="""\
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
""" + MANUAL.replace("        ", "            "))), "beside an SDPA fast path"),
        Valid(_module("""
def sample(logits, temperature):
    probs = F.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1)
"""), "a sampling softmax is not attention"),
        Valid(_module("""
def softmax(x, dim):
    return x
def attend(q, k, v):
    return softmax(q @ k.transpose(-2, -1), dim=-1) @ v
"""), "a local softmax"),
        Valid(_module(CAUSAL.format(body=MANUAL.replace("y = att @ v\n", "y = att @ v  # perfmod: ignore[PM504]\n"))),
              "suppressed on a line of the chain"),
    ]
    INVALID = [
        Invalid(*_pair(CAUSAL.format(body=MANUAL), CAUSAL.format(body=REWRITTEN))),
        Invalid(*_pair("""
def attend(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + mask, dim=-1) @ v
""", """
def attend(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
"""), "one expression, an additive mask"),
        Invalid(*_pair("""
def attend(q, k, v, pad):
    scores = torch.matmul(q, k.mT) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(pad, -math.inf)
    return torch.matmul(scores.softmax(-1), v)
""", """
def attend(q, k, v, pad):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~pad)
"""), "torch.matmul, .mT, a padding mask"),
        Invalid(*_pair("""
def attend(q, k, v, head_dim):
    w = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)
    return w @ v
""", """
def attend(q, k, v, head_dim):
    return F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(head_dim))
"""), "a scale that is not provably the default is passed"),
        Invalid(*_pair("""
def attend(q, k, v, scale):
    w = F.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    return w @ v
""", """
def attend(q, k, v, scale):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)
"""), "a scale that may be a tensor: the fix is unsafe", config={"level": Level.UNSAFE}),
        Invalid(_module("""
def attend(q, k, v):
    w = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return w @ v, w
"""), None, "the weights are returned"),
        Invalid(_module("""
def attend(q, k, v):
    w = F.softmax(q @ k.transpose(-2, -1), dim=1)
    return w @ v
"""), None, "softmax over another dim"),
        Invalid("""import torch
from torch.nn.functional import softmax as sm

def attend(q, k, v):
    return sm(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1) @ v
""", """import torch

def attend(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)
""", "an aliased softmax; no alias of torch.nn.functional: spelled out; the alias goes with its last use"),
        Invalid(_module("""
class Attention(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.drop = nn.Identity() if p == 0 else nn.Dropout(p)

    def forward(self, q, k, v):
        w = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
        w = self.drop(w)
        return w @ v
"""), None, "a module on the weights that may not be Dropout"),
        Invalid(_module("""
def attend(q, k, v, mask):
    w = F.softmax((q @ k.transpose(-2, -1)).masked_fill(mask, -1e4), dim=-1)
    return w @ v
"""), None, "a mask fill other than -inf"),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self.bindings = context.bindings
        self.blocks_with_softmax: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        """Note the block of each call spelled `softmax`: only those blocks can hold a chain."""
        if m.matches(node.func, m.Name("softmax") | m.Attribute(attr=m.Name("softmax"))) or \
                m.matches(node.func, m.Name()) and self.context.names.of(node.func) & SOFTMAXES:
            block = self.context.index.first_enclosing(node, cst.IndentedBlock)
            if block is not None:
                self.blocks_with_softmax.add(id(block))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        if id(original_node) not in self.blocks_with_softmax:
            return
        node = original_node
        statements = list(node.body)
        matches: list[tuple[int, _Attention, cst.BaseExpression]] = []
        for index, statement in enumerate(statements):
            for product in self._attention_products(statement):
                try:
                    attention = self._match(statements, index, product)
                except _NoMatch as why:
                    if not self._beside_fast_path(node):
                        self.report(product, f"hand-written attention, not rewritten: {why}")
                    continue
                if attention is not None and not self._beside_fast_path(node):
                    matches.append((index, attention, product))
        for index, attention, product in matches:
            if any(suppressed_on(statements[j], self.CODE) for j in [index, *attention.consumed]):
                continue
            message = self.MESSAGE
            if attention.scale_unproven:
                message = "hand-written attention; its scale " + attention.scale_unproven
            edits = [Remove(statements[j]) for j in attention.consumed]
            edits.append(Replace(product, lambda updated, a=attention: self._sdpa_call(a, updated)))
            self.report(product, message, edits=edits, imports=self._imports(),
                        level=Level.UNSAFE if attention.scale_unproven else None, at=statements[index])

    # -- matching ----------------------------------------------------------

    def _attention_products(self, statement: cst.CSTNode) -> list[cst.BaseExpression]:
        """`w @ v` / `torch.matmul(w, v)` in a simple statement whose left side is, or names, a softmax."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return []
        found = []
        for node in self.context.index.find((cst.BinaryOperation, cst.Call), within=statement):
            left = self._matmul_operands(node)
            if left is not None and (isinstance(left[0], cst.Name) or self._softmax_input(left[0]) is not None):
                found.append(node)
        return found

    def _matmul_operands(self, node: cst.CSTNode) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            return node.left, node.right
        if isinstance(node, cst.Call) and self.context.names.is_(node.func, "torch.matmul") and len(node.args) == 2 \
                and all(a.keyword is None and not a.star for a in node.args):
            return node.args[0].value, node.args[1].value
        return None

    def _match(self, statements, index: int, product) -> _Attention | None:
        """The attention that `product` (`weights @ v`) computes, reading back through the
        statements before `index`; None when it is no softmax attention at all."""
        attention = _Attention()
        cursor = [index]

        def expand(expr):
            """`expr`, or the value of the closest statement before the cursor that assigns the name `expr`;
            the assignments between (`v = self.value(x)`) stay where they are."""
            if not isinstance(expr, cst.Name):
                return expr
            skipped = []
            for j in range(cursor[0] - 1, -1, -1):
                previous = statements[j]
                if m.matches(previous, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(expr.value))])])):
                    cursor[0] = j
                    attention.consumed.append(j)
                    attention.links.append(expr.value)
                    attention.skipped += skipped
                    return previous.body[0].value
                if not m.matches(previous, m.SimpleStatementLine(body=[m.Assign()])) \
                        or expr.value in _bound_names(previous.body[0]):
                    return expr
                skipped.append(j)
            return expr

        weights, attention.v = self._matmul_operands(product)
        weights = expand(weights)
        dropout_module = self._dropout_module(weights)
        if dropout_module is not None:
            weights = expand(weights.args[0].value)
        softmax = self._softmax_input(weights)
        if softmax is None:
            return None
        scores, dim = softmax
        scores = expand(scores)
        mask_expr = None
        if m.matches(scores, m.Call(func=m.Attribute(attr=m.Name("masked_fill")))):
            mask_expr = scores
            scores = expand(scores.func.value)
        elif isinstance(scores, cst.BinaryOperation) and isinstance(scores.operator, cst.Add):
            mask_expr = scores
            scores = expand(scores.left)
        qk = self._scaled_scores(scores, attention, expand)
        if qk is None:
            return None  # a softmax over something other than q @ k^T
        if dim is None:
            raise _NoMatch("softmax is not provably over the last dim (dim=-1 and no other argument)")
        if mask_expr is not None:
            self._mask(mask_expr, attention)
        if dropout_module is not None:
            self._dropout(dropout_module, attention)
        self._check_links(statements, index, product, attention)
        return attention

    def _softmax_input(self, expr) -> tuple[cst.BaseExpression, int | None] | None:
        """(input, -1) for a softmax over the last dim, (input, None) for another softmax call."""
        if not isinstance(expr, cst.Call):
            return None
        names = self.context.names.of(expr.func)
        if names & SOFTMAXES:
            source, rest = positional(expr, 0), [a for a in expr.args if a is not positional(expr, 0)]
        elif m.matches(expr.func, m.Attribute(attr=m.Name("softmax"))) and not self.context.names.of(expr.func):
            source, rest = cst.Arg(expr.func.value), list(expr.args)
        else:
            return None
        if source is None:
            return None
        last = len(rest) == 1 and (rest[0].keyword is None or rest[0].keyword.value == "dim") \
            and m.matches(rest[0].value, m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1")))
        return source.value, -1 if last else None

    def _scaled_scores(self, scores, attention: _Attention, expand) -> bool | None:
        """Fills q, k and the scale from `q @ k^T`, `q @ k^T * s`, `q @ k^T / d`; None if `scores` is none of these."""
        scale, divide = None, False
        if isinstance(scores, cst.BinaryOperation) and isinstance(scores.operator, (cst.Multiply, cst.Divide)):
            scale, divide = scores.right, isinstance(scores.operator, cst.Divide)
            scores = expand(scores.left)
        operands = self._matmul_operands(scores)
        if operands is None:
            return None
        q, kt = operands
        k = self._transposed(kt)
        if k is None:
            return None
        attention.q, attention.k = q, k
        code = self.context.module.code_for_node
        head_dims = {f"{code(t)}{suffix}" for t in (q, k) for suffix in (".size(-1)", ".shape[-1]")}
        if scale is None:
            attention.scale = cst.Float("1.0")
        elif self._is_default(scale, divide, head_dims):
            attention.scale = None
        else:
            attention.scale = _reciprocal(scale) if divide else scale.with_changes(lpar=[], rpar=[])
            if not self._is_number(scale):
                attention.scale_unproven = (f"`{code(scale)}` is not provably a Python number: SDPA's scale= takes a "
                                            "float, and a tensor scale (a learned temperature) would lose its gradient")
        return True

    def _transposed(self, expr) -> cst.BaseExpression | None:
        """k for `k.transpose(-2, -1)`, `k.transpose(-1, -2)`, `k.mT`."""
        if m.matches(expr, m.Attribute(attr=m.Name("mT"))):
            return expr.value
        if not m.matches(expr, m.Call(func=m.Attribute(attr=m.Name("transpose")), args=[m.Arg(keyword=None, star="")] * 2)):
            return None
        dims = {self.context.module.code_for_node(a.value) for a in expr.args}
        return expr.func.value if dims == {"-2", "-1"} else None

    def _is_default(self, scale, divide: bool, head_dims: set[str]) -> bool:
        """Is `scale` (a divisor when `divide`) provably 1/sqrt(q.size(-1))?"""
        code = self.context.module.code_for_node
        scale = scale.with_changes(lpar=[], rpar=[])
        if divide:
            return self._is_sqrt_of(scale, head_dims)
        if isinstance(scale, cst.BinaryOperation) and isinstance(scale.operator, cst.Divide):
            one = m.matches(scale.left, m.Integer("1") | m.Float(m.MatchIfTrue(lambda s: float(s) == 1.0)))
            return one and self._is_sqrt_of(scale.right.with_changes(lpar=[], rpar=[]), head_dims)
        return isinstance(scale, cst.BinaryOperation) and isinstance(scale.operator, cst.Power) \
            and code(scale.left) in head_dims and m.matches(scale.right, m.UnaryOperation(
                operator=m.Minus(), expression=m.Float(m.MatchIfTrue(lambda s: float(s) == 0.5))))

    def _is_sqrt_of(self, expr, head_dims: set[str]) -> bool:
        code = self.context.module.code_for_node
        if isinstance(expr, cst.Call) and self.context.names.is_(expr.func, "math.sqrt") and len(expr.args) == 1:
            return code(expr.args[0].value) in head_dims
        return isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Power) \
            and code(expr.left) in head_dims and m.matches(expr.right, m.Float(m.MatchIfTrue(lambda s: float(s) == 0.5)))

    def _is_number(self, expr) -> bool:
        """Provably a Python int or float: literals, math.* calls, .size(i), .shape[i], arithmetic of these."""
        if isinstance(expr, (cst.Integer, cst.Float)):
            return True
        if isinstance(expr, cst.UnaryOperation):
            return self._is_number(expr.expression)
        if isinstance(expr, cst.BinaryOperation):
            return self._is_number(expr.left) and self._is_number(expr.right)
        if isinstance(expr, cst.Call):
            if self.context.names.startswith(expr.func, ["math"]) or self.context.names.is_(expr.func, "builtins.float"):
                return True
            return m.matches(expr, m.Call(func=m.Attribute(attr=m.Name("size")), args=[m.Arg()]))
        return m.matches(expr, m.Subscript(value=m.Attribute(attr=m.Name("shape"))))

    def _mask(self, expr, attention: _Attention) -> None:
        if isinstance(expr, cst.BinaryOperation):  # scores + mask
            attention.mask = expr.right.with_changes(lpar=[], rpar=[])
            return
        fill, value = positional(expr, 0), positional(expr, 1)
        if fill is None or value is None or len(expr.args) != 2:
            raise _NoMatch("masked_fill with other than (mask, value) arguments")
        if not m.matches(value.value, NEG_INF):
            raise _NoMatch(f"the mask fills {self.context.module.code_for_node(value.value)}, not -inf")
        condition = fill.value.with_changes(lpar=[], rpar=[])
        if self._is_causal_buffer(condition):
            attention.causal = True
        elif m.matches(condition, m.Comparison(comparisons=[m.ComparisonTarget(m.Equal(), m.Integer("0"))])):
            attention.mask = condition.with_changes(comparisons=[
                condition.comparisons[0].with_changes(operator=cst.NotEqual())])
        elif isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, cst.BitInvert):
            attention.mask = condition.expression.with_changes(lpar=[], rpar=[])
        else:
            attention.mask = cst.UnaryOperation(cst.BitInvert(), _parenthesized(condition))

    def _is_causal_buffer(self, condition) -> bool:
        """`self.<buffer>[..., :T, :T] == 0` for a buffer registered once as tril(ones(n, n)), maybe viewed."""
        if not m.matches(condition, m.Comparison(left=m.Subscript(value=m.Attribute(value=m.Name("self"))),
                                                 comparisons=[m.ComparisonTarget(m.Equal(), m.Integer("0"))])):
            return False
        subscript = condition.left
        *leading, rows, cols = subscript.slice
        code = self.context.module.code_for_node
        for element in (rows, cols):
            if not m.matches(element, m.SubscriptElement(m.Slice(lower=None, step=None, upper=m.DoNotCare()))) \
                    or element.slice.upper is None:
                return False
        if code(rows.slice.upper) != code(cols.slice.upper) or not all(m.matches(e, FULL_SLICE) for e in leading):
            return False
        values = self._buffer_values(subscript.value)
        return values is not None and len(values) == 1 and self._is_square_tril(values[0], len(subscript.slice))

    def _buffer_values(self, attribute: cst.Attribute) -> list[cst.BaseExpression] | None:
        """Values of `self.register_buffer("<name>", value)` and `self.<name> = value` in the class."""
        classdef = self._enclosing(attribute, cst.ClassDef)
        if classdef is None:
            return None
        name = attribute.attr.value
        values = []
        for call in self.context.index.find(cst.Call, within=classdef):
            if not m.matches(call.func, m.Attribute(value=m.Name("self"), attr=m.Name("register_buffer"))):
                continue
            first = positional(call, 0)
            if first is None or not isinstance(first.value, cst.SimpleString):
                return None  # a buffer named at run time could be this one
            if first.value.evaluated_value == name:
                second = positional(call, 1) or kwarg(call, "tensor")
                if second is None:
                    return None
                values.append(second.value)
        values += self.bindings.attribute_values(attribute) or []
        return values

    def _is_square_tril(self, value, dims: int) -> bool:
        """torch.tril(torch.ones(n, n)) or torch.ones(n, n).tril(), optionally .view(1, 1, n, n) to `dims` dims."""
        names = self.context.names
        code = self.context.module.code_for_node
        if m.matches(value, m.Call(func=m.Attribute(attr=m.Name("view") | m.Name("reshape")))):
            sizes = [code(a.value) for a in value.args]
            if any(a.keyword or a.star for a in value.args) or len(sizes) != dims or any(s != "1" for s in sizes[:-2]):
                return False
            value, view = value.func.value, sizes[-2:]
        else:
            view = None
        if isinstance(value, cst.Call) and names.is_(value.func, "torch.tril") and len(value.args) == 1:
            ones = value.args[0].value
        elif m.matches(value, m.Call(func=m.Attribute(attr=m.Name("tril")), args=[])):
            ones = value.func.value
        else:
            return False
        if not (isinstance(ones, cst.Call) and names.is_(ones.func, "torch.ones")):
            return False
        sizes = [code(a.value) for a in ones.args if a.keyword is None]
        if len(sizes) != 2 or sizes[0] != sizes[1] or any(a.star for a in ones.args):
            return False
        return view is None and dims == 2 or view == sizes

    def _dropout_module(self, expr) -> cst.Attribute | None:
        """`self.<name>` for `self.<name>(weights)`."""
        if m.matches(expr, m.Call(func=m.Attribute(value=m.Name("self")), args=[m.Arg(keyword=None, star="")])):
            return expr.func
        return None

    def _dropout(self, module: cst.Attribute, attention: _Attention) -> None:
        values = self.bindings.attribute_values(module)
        if not values or not all(isinstance(v, cst.Call) and self.context.names.of(v.func) & DROPOUTS for v in values):
            raise _NoMatch(f"self.{module.attr.value} on the weights is not provably an nn.Dropout of this module")
        p = cst.Attribute(module, cst.Name("p"))
        attention.dropout = cst.IfExp(test=cst.Attribute(module, cst.Name("training")), body=p, orelse=cst.Float("0.0"))

    def _check_links(self, statements, index: int, product, attention: _Attention) -> None:
        """Each intermediate name is read once, by the next statement of the chain, and nowhere else."""
        chain = [statements[i] for i in attention.consumed] + [statements[index]]
        moved = [attention.q, attention.k, attention.v, attention.scale, attention.mask, attention.dropout]
        links = set(attention.links)
        for expr in moved:
            if expr is not None and any(n.value in links for n in names_read(expr)):
                raise _NoMatch(f"`{self.context.module.code_for_node(expr)}` reads an intermediate of the attention")
        code = self.context.module.code_for_node
        # v stays in the last statement; q, k, the scale and the mask move down to it past the skipped lines
        moved = [e for e in moved if e is not None and e is not attention.v]
        moved_code = " ".join(code(e) for e in moved)
        moved_reads = {n.value for e in moved for n in names_read(e)}
        for j in attention.skipped:
            for bound in _bound_names(statements[j].body[0]):
                if bound in links or bound in moved_reads or ("." in bound or "[" in bound) and bound in moved_code:
                    line = self.context.line(statements[j])
                    raise _NoMatch(f"line {line} assigns `{bound}` between the attention's statements")
        scope = self.context.scopes.get(statements[index])
        reads_in_chain = sum(1 for s in chain for n in names_read(s) if n.value in links)
        for name in sorted(links):
            for access in scope.accesses[name] if scope is not None else ():
                if not any(self.context.inside(access.node, s) for s in chain):
                    line = self.context.line(access.node)
                    raise _NoMatch(f"the attention weights `{name}` are also read on line {line} "
                                   "(SDPA does not return them)")
        if reads_in_chain != len(attention.links):
            raise _NoMatch("an intermediate of the attention is read more than once")

    def _beside_fast_path(self, block: cst.IndentedBlock) -> bool:
        """In a branch of an `if` that calls scaled_dot_product_attention or tests a `flash` flag."""
        current = block
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
            if isinstance(current, cst.If):
                code = self.context.module.code_for_node(current.test)
                if "flash" in code.lower() or "scaled_dot_product_attention" in code:
                    return True
                for call in self.context.index.find(cst.Call, within=current):
                    if m.matches(call.func, m.Attribute(attr=m.Name("scaled_dot_product_attention"))
                                 | m.Name("scaled_dot_product_attention")) and self.context.names.is_(call.func, SDPA):
                        return True
            current = self.context.parents.get(current)
        return False

    # -- rewriting ---------------------------------------------------------

    def _sdpa_call(self, attention: _Attention, product: cst.BaseExpression) -> cst.Call:
        """The SDPA call that replaces `product` (`weights @ v`, maybe with edits inside v already made)."""
        v = product.right if isinstance(product, cst.BinaryOperation) else product.args[1].value
        args = [cst.Arg(attention.q), cst.Arg(attention.k), cst.Arg(v)]
        keywords = [("attn_mask", attention.mask), ("dropout_p", attention.dropout),
                    ("is_causal", cst.Name("True") if attention.causal else None), ("scale", attention.scale)]
        args += [cst.Arg(value, keyword=cst.Name(key), equal=cst.AssignEqual(
            cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))) for key, value in keywords if value is not None]
        args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in args[:-1]] + args[-1:]
        return cst.Call(func=self._sdpa_name(), args=args, lpar=product.lpar, rpar=product.rpar)

    def _sdpa_name(self) -> cst.BaseExpression:
        """`F.scaled_dot_product_attention` through the file's alias of torch.nn.functional, else spelled out."""
        alias = self._functional_alias()
        if alias is not None:
            return cst.Attribute(cst.Name(alias), cst.Name("scaled_dot_product_attention"))
        return cst.parse_expression(SDPA)

    def _functional_alias(self) -> str | None:
        alias = functional_alias(self.context.module)
        return None if alias == "torch.nn.functional" else alias

    def _imports(self) -> list[tuple[str, str | None]]:
        """`import torch.nn.functional` when the call is spelled out and the file does not import torch."""
        if self._functional_alias() is not None:
            return []
        imported = any(alias.name.value == "torch" and alias.asname is None
                       for node in self.context.index.find(cst.Import) for alias in node.names
                       if isinstance(alias.name, cst.Name))
        return [] if imported else [("torch.nn.functional", None)]

    def _enclosing(self, node: cst.CSTNode, kind: type) -> cst.CSTNode | None:
        return self.context.index.first_enclosing(node, kind)

def _parenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or expr.lpar:
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _reciprocal(divisor: cst.BaseExpression) -> cst.BaseExpression:
    """`1 / divisor`, parenthesizing a divisor that binds less tightly than `/`'s right operand."""
    divisor = divisor.with_changes(lpar=[], rpar=[])
    if isinstance(divisor, cst.BinaryOperation) and not isinstance(divisor.operator, cst.Power):
        divisor = _parenthesized(divisor)
    return cst.BinaryOperation(cst.Integer("1"), cst.Divide(), divisor)


def _bound_names(assign: cst.Assign) -> set[str]:
    """What an assignment binds: names, and the code of attribute / subscript targets."""
    bound = set()
    module = cst.Module([])

    def add(target):
        if isinstance(target, cst.Name):
            bound.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                add(element.value)
        elif isinstance(target, cst.StarredElement):
            add(target.value)
        else:
            bound.add(module.code_for_node(target))

    for target in assign.targets:
        add(target.target)
    return bound
