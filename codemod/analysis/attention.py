"""Hand-written attention: which `weights @ v` products compute
`softmax(q @ k^T * scale + mask) @ v`, and what SDPA needs to compute the same.

A chain may be written in one expression or over consecutive statements of a block
(intermediate names may be reused); it is read back from its product, through casts and
a dropout on the weights, the softmax, casts of the scores to float32, masks (masked_fill,
also in place or under `if m is not None:`, torch.where, additive), a scale before or
after the mask, down to the scores `q @ k^T` (matmul, bmm, `.mT`, a transpose or permute
of known rank, or an einsum contracting q and k).

`attentions(context)` answers:

- `may_be_softmax(call)`: could `call` be a softmax (only blocks holding one can hold a chain);
- `in_block(block)`: a `Found` for each product of the block that is hand-written attention:
  its `Attention` (q, k, the scale: numbers as one, tensors folded into q; causal or an
  attn_mask, dropout_p, the permutes an einsum layout needs, the statements the chain spans),
  or the true reason (`problem`) a part of it cannot be proven (a finite fill beside a
  padding mask, the weights read again later, a scale that may be a tensor...);
- `beside_fast_path(block)`: is the block a branch beside an SDPA / flash fast path;
- `causal(condition, kind)`: is a mask built in the code the causal one;
- `fill(value)`: "-inf", "finite" (low enough to act as -inf) or None for a mask fill.

`permuted(expr, letters, target)` moves dims of an einsum operand into SDPA's order.

Built once per file (FileContext.shared).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.bindings import returned_values
from codemod.analysis.names import atom, integer_literal, integer_value, is_dotted_name, kwarg, number_value, positional
from codemod.analysis.tensor_layout import Spec, layouts, normalize_dim, read_names, reads
from codemod.analysis.torch_facts import (
    DROPOUTS,
    FUNCTIONAL_DROPOUTS,
    INFINITIES,
    MASK_KEEPING_METHODS,
    SDPA,
    SOFTMAX_MODULES,
    SOFTMAXES,
)
from codemod.analysis.values import Kind, values

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "attention"


def attentions(context: FileContext) -> Attentions:
    return context.shared(KEY, Attentions)


@dataclass
class Attention:
    """What one matched chain computes, and the statements it spans."""

    q: cst.BaseExpression | None = None
    k: cst.BaseExpression | None = None
    v: cst.BaseExpression | None = None
    scale: cst.BaseExpression | None = None  # None: the default 1/sqrt(q.size(-1))
    scale_unproven: str | None = None  # why `scale=` may not be a Python number
    # Tensor scales (a learned temperature): SDPA's scale= takes a float, so each multiplies
    # (divide False) or divides q instead.
    folded: list[tuple[cst.BaseExpression, bool]] = field(default_factory=list)
    causal: bool = False
    mask: cst.BaseExpression | None = None  # SDPA's attn_mask
    dropout: cst.BaseExpression | None = None  # SDPA's dropout_p
    # A dropout whose probability may be above 0 in training: SDPA draws its masks from the
    # RNG otherwise than the hand-written one, so the losses are not those of the original.
    dropout_draws: bool = False
    score_spec: Spec | None = None  # the einsum of q and k, if the scores are one
    out_spec: Spec | None = None  # the einsum of the weights and v, if the output is one
    v_order: tuple | None = None  # (v's letters, SDPA's order) when v must be permuted
    out_order: tuple | None = None  # (SDPA's output letters, the product's) when the output must be
    scores: cst.BaseExpression | None = None  # the q @ k^T product (where the finding points)
    v_argument: int = -1  # where v is among the product call's arguments
    origins: list = field(default_factory=list)  # the code the chain moves down to the product, as written
    consumed: list[int] = field(default_factory=list)  # indices of the statements folded into the last
    links: list[str] = field(default_factory=list)  # the intermediate names, one per consumed statement
    skipped: list[int] = field(default_factory=list)  # assignments between the chain's statements, kept
    ignored: list = field(default_factory=list)  # code whose reads of intermediates are fine (finfo(x.dtype))


class NotAttention(Exception):
    """The chain is hand-written attention, but a part is not one this analysis can prove; the message says which."""


@dataclass
class Found:
    """A product `weights @ v` that is hand-written attention: `attention` when SDPA computes
    it, else `problem` (why a part cannot be proven); `at` is the statement to point at."""

    product: cst.BaseExpression
    index: int  # of the product's statement in its block
    attention: Attention | None
    problem: str | None
    at: cst.CSTNode


class Attentions:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.layouts = layouts(context)
        self._strict = False
        self._finfo: list = []
        self._partial: Attention | None = None

    def may_be_softmax(self, node: cst.Call) -> bool:
        """Could `node` be a softmax (a call spelled softmax, or a module of self that may be one)?"""
        func = node.func
        return bool(
            isinstance(func, cst.Attribute)
            and func.attr.value == "softmax"
            or isinstance(func, cst.Name)
            and (func.value == "softmax" or self.context.names.of(func) & SOFTMAXES)
            or isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == "self"
            and "soft" in func.attr.value.lower()
            or isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == "self"
            and self._softmax_module(func) is not None
        )

    def in_block(self, block: cst.IndentedBlock) -> list[Found]:
        """The hand-written attention of the block's statements, each read back from its product."""
        statements = list(block.body)
        found = []
        for index, statement in enumerate(statements):
            for product in self._attention_products(statement):
                try:
                    attention = self._match(statements, index, product)
                except NotAttention as why:
                    at = self._where(self._partial, statements, index)
                    found.append(Found(product, index, None, str(why), at))
                    continue
                if attention is not None:
                    found.append(Found(product, index, attention, None, self._where(attention, statements, index)))
        return found

    def causal(self, condition: cst.BaseExpression, kind: str = "fill") -> bool:
        """Is `condition` the causal mask, built in the code? `kind`: "fill" (masked_fill drops
        where True), "keep" (torch.where keeps where True), "add" (an additive mask)."""
        return self._causal(_Mask(kind, condition, None))

    def fill(self, value: cst.BaseExpression) -> str | None:
        return self._fill(value)

    def _where(self, attention: Attention | None, statements, index: int) -> cst.CSTNode:
        """The statement a finding points at: the one computing q @ k^T, else the chain's first."""
        if attention is not None and attention.scores is not None and attention.scores in self.context.index:
            return self.context.index.statement_of(attention.scores)
        first = min(attention.consumed) if attention is not None and attention.consumed else index
        for j in range(first, -1, -1):  # the closest product before: where q @ k^T is
            if any(
                self._product(node) is not None and not self._weights_like(self._product(node)[0])
                for node in self.context.index.find((cst.BinaryOperation, cst.Call), within=statements[j])
            ):
                return statements[j]
            if index - j > 12:
                break
        return statements[first]

    def _qualified(self, func) -> set[str]:
        """The imported names `func` refers to; none for a method of a computed value."""
        return self.context.names.of(func) if is_dotted_name(func) else set()

    # -- the product ---------------------------------------------------------------

    def _attention_products(self, statement: cst.CSTNode) -> list[cst.BaseExpression]:
        """Products `w @ v` in a simple statement whose weights are, or name, a softmax (maybe
        through a dropout or a cast)."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return []
        found = []
        for node in self.context.index.find((cst.BinaryOperation, cst.Call), within=statement):
            operands = self._product(node)
            if operands is not None and any(isinstance(o, cst.Name) or self._weights_like(o) for o in operands[:2]):
                found.append(node)
        return found

    def _weights_like(self, expr) -> bool:
        """A softmax, maybe behind casts and a dropout (not through names)."""
        for _ in range(4):
            if self._softmax_input(expr) is not None:
                return True
            inner = self._cast_input(expr) or self._dropout_input(expr)
            if inner is None:
                return False
            expr = inner
        return False

    def _product(self, node) -> tuple[cst.BaseExpression, cst.BaseExpression, Spec | None] | None:
        """(weights, v, einsum spec or None) for `w @ v`, `torch.matmul(w, v)`, `w.matmul(v)`,
        `torch.bmm(w, v)`, `torch.einsum(spec, w, v)`."""
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            return node.left, node.right, None
        if not isinstance(node, cst.Call) or any(a.star for a in node.args):
            return None
        values = [a.value for a in node.args if a.keyword is None]
        if len(values) != len(node.args):
            return None
        if (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "matmul"
            and len(values) == 1
            and not self._qualified(node.func)
        ):
            return node.func.value, values[0], None
        if self.context.names.is_(node.func, "torch.matmul", "torch.bmm") and len(values) == 2:
            return values[0], values[1], None
        if (
            self.context.names.is_(node.func, "torch.einsum")
            and len(values) == 3
            and isinstance(values[0], cst.SimpleString)
        ):
            spec = Spec.parse(values[0].evaluated_value)
            if spec is not None and len(spec.inputs) == 2:
                return values[1], values[2], spec
        return None

    # -- the chain -----------------------------------------------------------------

    def _match(self, statements, index: int, product) -> Attention | None:
        """The attention that `product` (`weights @ v`) computes, reading back through the
        statements before `index`; None when it is no softmax attention at all."""
        found = self._match_order(statements, index, product, swapped=False)
        operands = self._product(product)
        if found is None and operands is not None and operands[2] is not None:
            found = self._match_order(statements, index, product, swapped=True)  # einsum(spec, v, weights)
        return found

    def _match_order(self, statements, index: int, product, swapped: bool) -> Attention | None:
        attention = self._partial = Attention()
        self._finfo.clear()
        chain = _Chain(self, statements, index, attention)
        weights = chain.expand(self._weights(product, attention, swapped))
        weights = self._undropped_weights(weights, chain, attention)
        softmax = self._softmax_input(weights)
        if softmax is None:
            if self._mentions_softmax(weights, chain):
                raise NotAttention("the weights are changed after the softmax (SDPA's weights are the softmax itself)")
            return None
        scores, dim = softmax
        if chain.opaque(scores):
            return None  # a softmax of a value the rule cannot read: not shown to be over q @ k^T
        chain.strict = True
        scores, masks = self._unmasked_scores(chain.expand(scores), chain)
        self._strict = True
        try:
            if not self._scores(scores, attention, chain):
                return None  # a softmax over something other than q @ k^T
        finally:
            self._strict = False
        if dim is None or not self._last_dim(dim, attention):
            raise NotAttention("softmax is not provably over the keys (the last dim)")
        self._record_masks(masks, attention)
        self._layout(attention)
        attention.ignored = list(self._finfo)
        self._finfo.clear()
        chain.check(product)
        return attention

    def _weights(self, product, attention: Attention, swapped: bool):
        """The weights operand of `product`, with v and the product's einsum recorded
        (`swapped`: `einsum(spec, v, weights)`)."""
        weights, attention.v, attention.out_spec = self._product(product)
        if swapped:
            spec = attention.out_spec
            weights, attention.v = attention.v, weights
            attention.out_spec = Spec((spec.inputs[1], spec.inputs[0]), spec.output)
        attention.v_argument = 1 if swapped else -1
        return weights

    def _undropped_weights(self, weights, chain, attention: Attention):
        """The weights under their casts and their dropout (recorded as SDPA's dropout_p)."""
        while True:
            cast = self._cast_input(weights)
            if cast is not None:
                weights = chain.expand(cast)
                continue
            dropped = self._dropout_input(weights)
            if dropped is None:
                return weights
            if attention.dropout is not None:
                raise NotAttention("two dropouts on the weights")
            attention.dropout = self._dropout_p(weights)
            attention.dropout_draws = self._dropout_draws(weights)
            if self.context.names.is_(weights.func, *FUNCTIONAL_DROPOUTS):
                attention.origins += [a.value for a in weights.args if a.value is not dropped]
            else:
                attention.origins.append(weights.func)
            weights = chain.expand(dropped)

    def _unmasked_scores(self, scores, chain):
        """(the scores under the softmax's upcasts, masks and a scale applied around the
        masks, the masks from the outermost in)."""
        while self._upcast_input(scores) is not None:
            scores = chain.expand(self._upcast_input(scores))
        masks = []
        outer_scale = None
        while True:
            masked = self._masked(scores, chain)
            if masked is not None:
                mask, scores = masked
                masks.append(mask)
                scores = chain.expand(scores)
                continue
            if self._upcast_input(scores) is not None:
                scores = chain.expand(self._upcast_input(scores))
                continue
            scaled = self._scaled_masks(scores, chain) if masks == [] and outer_scale is None else None
            if scaled is None:
                break
            outer_scale, scores = scaled
            scores = chain.expand(scores)
        if outer_scale is not None:
            if not masks or masks[0].kind == "add":
                raise NotAttention("a scale applied after an additive mask")
            scores = _Scaled(scores, *outer_scale)
        return scores, masks

    def _record_masks(self, masks: list, attention: Attention) -> None:
        """The masks as SDPA's mask (or causal), their code among the chain's origins."""
        for mask in masks:
            attention.origins += [n for n in (mask.condition, mask.optional) if n is not None]
        if len(masks) == 1:
            self._mask(masks[0], attention)
        elif masks:
            self._masks(masks, attention)

    def _mentions_softmax(self, expr, chain, depth: int = 0) -> bool:
        """Is a softmax of scores among the values `expr` is computed from (through names,
        arithmetic)? A softmax of a value the rule cannot read (`q.softmax(dim=-2)` with
        `q, k, v = map(...)`: linear attention's feature maps) is not taken for one."""
        if depth > 6:
            return False
        expr = chain.peek(expr) if isinstance(expr, cst.Name) else expr
        softmax = self._softmax_input(expr)
        if softmax is not None:
            return not chain.opaque(softmax[0])
        if isinstance(expr, cst.BinaryOperation):
            return self._mentions_softmax(expr.left, chain, depth + 1) or self._mentions_softmax(
                expr.right, chain, depth + 1
            )
        return False

    def _softmax_input(self, expr) -> tuple[cst.BaseExpression, cst.BaseExpression | None] | None:
        """(input, dim) for a softmax call, dim None when it is not given plainly."""
        if not isinstance(expr, cst.Call):
            return None
        names = self._qualified(expr.func)
        if isinstance(expr.func, cst.Attribute) and self._softmax_module(expr.func) is not None:
            if len(expr.args) != 1 or expr.args[0].keyword is not None:
                return None
            return expr.args[0].value, self._softmax_module(expr.func)
        if names & SOFTMAXES:
            source, rest = positional(expr, 0), [a for a in expr.args if a is not positional(expr, 0)]
        elif (
            isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value == "softmax"
            and not names
            and not (isinstance(expr.func.value, cst.Name) and expr.func.value.value == "self")
        ):
            source, rest = cst.Arg(expr.func.value), list(expr.args)
        else:
            return None
        if source is None:
            return None
        dim = rest[0].value if len(rest) == 1 and (rest[0].keyword is None or rest[0].keyword.value == "dim") else None
        return source.value, dim

    def _softmax_module(self, func: cst.Attribute) -> cst.BaseExpression | None:
        """The dim of `self.<name>` when every value it is given is `nn.Softmax(dim=d)`."""
        values = self.context.kinds.attribute_values(func)
        if not values:
            return None
        dims = []
        for value in values:
            if not (isinstance(value, cst.Call) and self.context.names.of(value.func) & SOFTMAX_MODULES):
                return None
            arg = positional(value, 0) or kwarg(value, "dim")
            if arg is None or integer_value(arg.value) is None:
                return None
            dims.append(integer_value(arg.value))
        return integer_literal(dims[0]) if len(set(dims)) == 1 else None

    def _cast_input(self, expr) -> cst.BaseExpression | None:
        """x for casts of the weights back to the inputs' dtype: `x.type_as(q)`, `x.to(q.dtype)`,
        `x.half()`, `x.bfloat16()`, `x.float()`."""
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not self._qualified(expr.func):
            method = expr.func.attr.value
            if method in ("half", "bfloat16", "float") and not expr.args:
                return expr.func.value
            if method in ("type_as",) and len(expr.args) == 1:
                return expr.func.value
            if (
                method == "type"
                and len(expr.args) == 1
                and expr.args[0].keyword is None
                and self.context.kinds.is_dtype(expr.args[0].value)
            ):
                return expr.func.value
            if (
                method == "to"
                and len(expr.args) == 1
                and expr.args[0].keyword is None
                and self.context.kinds.is_dtype(expr.args[0].value)
            ):
                return expr.func.value
        return None

    def _upcast_input(self, expr) -> cst.BaseExpression | None:
        """x for `x.float()` / `x.to(torch.float32)` on the scores before the softmax."""
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not self._qualified(expr.func):
            if expr.func.attr.value == "float" and not expr.args:
                return expr.func.value
            if (
                expr.func.attr.value == "to"
                and len(expr.args) == 1
                and self.context.names.is_(expr.args[0].value, "torch.float32", "torch.float")
            ):
                return expr.func.value
            if (
                expr.func.attr.value == "to"
                and len(expr.args) == 1
                and isinstance(expr.args[0].value, cst.Attribute)
                and expr.args[0].value.attr.value == "dtype"
                and self.context.source(expr.args[0].value.value) == self.context.source(expr.func.value)
            ):
                return expr.func.value  # x.to(x.dtype)
        return None

    # -- dropout -------------------------------------------------------------------

    def _dropout_input(self, expr) -> cst.BaseExpression | None:
        if not isinstance(expr, cst.Call) or not expr.args:
            return None
        if self.context.names.is_(expr.func, *FUNCTIONAL_DROPOUTS):
            first = positional(expr, 0) or kwarg(expr, "input")
            return first.value if first is not None else None
        if (
            isinstance(expr.func, (cst.Attribute, cst.Name))
            and len(expr.args) == 1
            and expr.args[0].keyword is None
            and self._module_values(expr.func) is not None
        ):
            return expr.args[0].value
        return None

    def _module_values(self, func) -> list | None:
        values = (
            self.context.kinds.attribute_values(func)
            if isinstance(func, cst.Attribute)
            else (
                [self.layouts.value_of(func)]
                if isinstance(func, cst.Name) and func in self.context.index and self.layouts.value_of(func) is not None
                else None
            )
        )
        if not values:
            return None
        if all(isinstance(v, cst.Call) and self.context.names.of(v.func) & DROPOUTS for v in values):
            return values
        if (
            any(isinstance(v, cst.Call) and self.context.names.of(v.func) & DROPOUTS for v in values)
            or isinstance(func, cst.Attribute)
            and any("drop" in self.context.source(v).lower() for v in values)
        ):
            raise NotAttention(
                f"{self.context.source(func)} on the weights is not provably an nn.Dropout of this module"
            )
        return None

    def _dropout_p(self, expr: cst.Call) -> cst.BaseExpression:
        if self.context.names.is_(expr.func, *FUNCTIONAL_DROPOUTS):
            p = positional(expr, 1) or kwarg(expr, "p")
            training = positional(expr, 2) or kwarg(expr, "training")
            if (positional(expr, 3) or kwarg(expr, "inplace")) is not None:
                raise NotAttention("an in-place dropout on the weights")
            p_value = p.value if p is not None else cst.Float("0.5")
            if training is None:
                return p_value
            return cst.IfExp(test=training.value, body=p_value, orelse=cst.Float("0.0"))
        module = expr.func
        return cst.IfExp(
            test=cst.Attribute(module, cst.Name("training")),
            body=cst.Attribute(module.deep_clone(), cst.Name("p")),  # a node of its own: the tree stays a tree
            orelse=cst.Float("0.0"),
        )

    def _dropout_draws(self, expr: cst.Call) -> bool:
        """Can the dropout `expr` drop anything: its probability is not a literal 0 (in its call,
        or in every construction of the `nn.Dropout` it calls), or the call is not told
        `training=False`?"""
        if self.context.names.is_(expr.func, *FUNCTIONAL_DROPOUTS):
            p = positional(expr, 1) or kwarg(expr, "p")
            training = positional(expr, 2) or kwarg(expr, "training")
            if training is not None and isinstance(training.value, cst.Name) and training.value.value == "False":
                return False
            return p is None or number_value(p.value) != 0
        built = self._module_values(expr.func) or []
        probabilities = [positional(call, 0) or kwarg(call, "p") for call in built]
        return not built or any(p is None or number_value(p.value) != 0 for p in probabilities)

    # -- masks ---------------------------------------------------------------------

    def _masked(self, scores, chain) -> tuple[_Mask, cst.BaseExpression] | None:
        """(mask, the scores before it) for `s.masked_fill(c, v)`, `torch.masked_fill(s, c, v)`,
        `torch.where(c, s, v)`, `s + m`; the chain's in-place and conditional masks too."""
        pending = chain.pending_mask(scores)
        if pending is not None:
            return pending
        if isinstance(scores, cst.Call):
            if (
                isinstance(scores.func, cst.Attribute)
                and scores.func.attr.value == "masked_fill"
                and not self._qualified(scores.func)
            ):
                fill, value = (
                    positional(scores, 0) or kwarg(scores, "mask"),
                    positional(scores, 1) or kwarg(scores, "value"),
                )
                if fill is None or value is None or len(scores.args) != 2:
                    raise NotAttention("masked_fill with other than (mask, value) arguments")
                return _Mask("fill", fill.value, value.value), scores.func.value
            if self.context.names.is_(scores.func, "torch.masked_fill") and len(scores.args) == 3:
                return _Mask("fill", scores.args[1].value, scores.args[2].value), scores.args[0].value
            if self.context.names.is_(scores.func, "torch.where") and len(scores.args) == 3:
                return _Mask("keep", scores.args[0].value, scores.args[2].value), scores.args[1].value
        if isinstance(scores, cst.BinaryOperation) and isinstance(scores.operator, cst.Add):
            for side, other in ((scores.left, scores.right), (scores.right, scores.left)):
                if self._leads_to_scores(side, chain):
                    return _Mask("add", other.with_changes(lpar=[], rpar=[]), None), side
        return None

    def _leads_to_scores(self, expr, chain, depth: int = 0) -> bool:
        """Does `expr` (maybe through names, scales and other masks) hold q @ k^T?"""
        if depth > 8:
            return False
        for _ in range(6):
            expr = chain.peek(expr)
            if isinstance(expr, (cst.BinaryOperation, cst.Call)) and self._product(expr) is not None:
                return True
            if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Multiply, cst.Divide, cst.Add)):
                if self._leads_to_scores(expr.left, chain, depth + 1):
                    return True
                if isinstance(expr.operator, (cst.Multiply, cst.Add)) and self._leads_to_scores(
                    expr.right, chain, depth + 1
                ):
                    return True
                return False
            if (
                isinstance(expr, cst.Call)
                and isinstance(expr.func, cst.Attribute)
                and expr.func.attr.value in ("masked_fill", "float")
            ):
                expr = expr.func.value
                continue
            return False
        return False

    def _mask(self, mask: _Mask, attention: Attention) -> None:
        causal = self._causal(mask)
        if mask.kind == "add":
            if causal:
                attention.causal = True
            elif self._is_bool(mask.condition):
                raise NotAttention("a boolean mask added to the scores")
            else:
                attention.mask = _optional(mask, mask.condition)
            return
        fill = self._fill(mask.value)
        if fill is None:
            raise NotAttention(f"the mask fills {self.context.source(mask.value)}, not -inf")
        if causal:
            attention.causal = True
            return
        if fill != "-inf":
            raise NotAttention(
                f"the mask fills {self.context.source(mask.value)}, not -inf: a row whose keys are all "
                "masked would average the values instead of giving zeros (only a causal mask, which keeps "
                "a key in every row, is rewritten with a finite fill)"
            )
        condition = mask.condition.with_changes(lpar=[], rpar=[])
        if mask.kind == "keep":
            attention.mask = _optional(mask, condition)
            return
        attention.mask = _optional(mask, _negated(condition))

    def _masks(self, masks: list[_Mask], attention: Attention) -> None:
        """Several masks on the scores as SDPA's one attn_mask: additive ones summed, masked_fill /
        where ones as one keep-mask (keys kept by all)."""
        if any(m.optional is not None for m in masks):
            raise NotAttention("several masks, some applied only when given")
        kinds = {"add" if m.kind == "add" else "bool" for m in masks}
        if len(kinds) > 1:
            raise NotAttention("an additive mask and a masked_fill on the same scores")
        if kinds == {"add"}:
            if any(self._is_bool(m.condition) for m in masks):
                raise NotAttention("a boolean mask added to the scores")
            total = None
            for mask in reversed(masks):  # masks were read from the last applied back
                part = atom(mask.condition.with_changes(lpar=[], rpar=[]))
                total = part if total is None else cst.BinaryOperation(total, cst.Add(), part)
            attention.mask = total
            return
        keeps = []
        for mask in reversed(masks):
            fill = self._fill(mask.value) if mask.kind == "fill" else self._fill(mask.value)
            if fill is None:
                raise NotAttention(f"the mask fills {self.context.source(mask.value)}, not -inf")
            if fill != "-inf" and not self._causal(mask):
                raise NotAttention(
                    f"the mask fills {self.context.source(mask.value)}, not -inf, beside another mask: a row "
                    "whose keys are all masked would average the values instead of giving zeros"
                )
            condition = mask.condition.with_changes(lpar=[], rpar=[])
            keeps.append(atom(condition if mask.kind == "keep" else _negated(condition)))
        if any(self._fill(m.value) != "-inf" for m in masks):
            raise NotAttention(
                "a finite fill beside another mask: a row whose keys are all masked would average the values"
            )
        total = keeps[0]
        for keep in keeps[1:]:
            total = cst.BinaryOperation(total, cst.BitAnd(), keep)
        attention.mask = total

    def _fill(self, value) -> str | None:
        """ "-inf" for -inf spelled any way; "finite" for a fill so low that exp(fill - max) is 0 in
        float32 whenever a row keeps a key (-1e9 and below, torch.finfo(...).min); else None."""
        if _literal_float(value) == -math.inf or (
            isinstance(value, cst.UnaryOperation)
            and isinstance(value.operator, cst.Minus)
            and self.context.names.is_(value.expression, *INFINITIES)
        ):
            return "-inf"
        if (
            isinstance(value, cst.Attribute)
            and value.attr.value == "min"
            and isinstance(value.value, cst.Call)
            and self.context.names.is_(value.value.func, "torch.finfo")
        ):
            self._finfo.append(value)
            return "finite"
        number = _literal_float(value)
        if number is not None and number <= -1e9:
            return "finite"
        if isinstance(value, cst.Name):
            bound = self.layouts.value_of(value) if value in self.context.index else None
            if bound is not None and bound is not value:
                return self._fill(bound)
        return None

    def _causal(self, mask: _Mask) -> bool:
        """Is the mask the causal one (a key after the query masked), built in the code?"""
        meaning = _MaskReader(self).read(mask.condition)
        if meaning is None:
            return False
        if mask.kind == "fill":
            return meaning == "upper"
        if mask.kind == "keep":
            return meaning == "lower"
        return meaning == "additive"

    def _is_bool(self, expr) -> bool:
        return (
            isinstance(expr, (cst.Comparison,))
            or (isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.BitInvert))
            or (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "bool")
        )

    # -- the scores ----------------------------------------------------------------

    def _scaled_masks(self, scores, chain):
        """((scale, divide), masked) for `masked * s` / `masked / d` where `masked` is a masked_fill of
        the scores: the scale moves inside (a positive scale keeps -inf at -inf)."""
        if isinstance(scores, cst.BinaryOperation) and isinstance(scores.operator, (cst.Multiply, cst.Divide)):
            inner = chain.peek(scores.left)
            masked = (
                isinstance(inner, cst.Call)
                and isinstance(inner.func, cst.Attribute)
                and inner.func.attr.value in ("masked_fill",)
                or isinstance(inner, cst.Call)
                and self.context.names.is_(inner.func, "torch.masked_fill", "torch.where")
            )
            if masked:
                return (scores.right, isinstance(scores.operator, cst.Divide)), scores.left
        return None

    def _scores(self, scores, attention: Attention, chain) -> bool:
        """Fills q, k and the scale from `q @ k^T` times or divided by any number of factors
        (`q @ k^T * s`, `q @ k^T / d`, `q @ k^T * d ** -0.5 * self.log_temp.exp()`); False if
        `scores` is none of these. Numbers multiply into `scale=`; tensors (a learned
        temperature) fold into q, where SDPA's float `scale=` cannot hold them."""
        factors: list[tuple[cst.BaseExpression, bool]] = []
        if isinstance(scores, _Scaled):
            if not self._positive(scores.scale, scores.divide):
                raise NotAttention("a scale after the mask that is not provably positive")
            factors.append((scores.scale, scores.divide))
            scores = scores.scores
        while isinstance(scores, cst.BinaryOperation) and isinstance(scores.operator, (cst.Multiply, cst.Divide)):
            divide = isinstance(scores.operator, cst.Divide)
            if self._scaled_qk(chain.peek(scores.left), chain):
                factors.append((scores.right, divide))
                scores = chain.expand(scores.left)
            elif not divide and self._scaled_qk(chain.peek(scores.right), chain):
                factors.append((scores.left, False))
                scores = chain.expand(scores.right)
            else:
                break
        qk = self._qk(scores)
        if qk is None:
            return False
        factors.reverse()  # read from the product outwards: back in the order they are written
        attention.q, attention.k, attention.score_spec = qk
        attention.scores = scores
        attention.origins += [attention.q, attention.k] + [scale for scale, _ in factors]
        numbers = []
        for scale, divide in factors:
            if scale in self.context.index and self.context.kinds.fact(scale).kind is Kind.TENSOR:
                self._foldable(scale)
                attention.folded.append((scale, divide))
            else:
                numbers.append((scale, divide))
        if not numbers:
            attention.scale = cst.Float("1.0")
        elif len(numbers) == 1 and self._is_default(*numbers[0], self._head_dims(attention)):
            attention.scale = None
        else:
            attention.scale = _product(numbers)
            unproven = [scale for scale, _ in numbers if values(self.context).number(scale) is None]
            if unproven:
                attention.scale_unproven = (
                    f"`{self.context.source(unproven[0])}` is not provably a Python number: "
                    "SDPA's scale= takes a float, and a tensor scale (a learned temperature) "
                    "would lose its gradient"
                )
        return True

    def _scaled_qk(self, expr, chain, depth: int = 0) -> bool:
        """Is `expr` q @ k^T, or it times or divided by factors (through the names the chain holds)?"""
        if self._qk(expr) is not None:
            return True
        if depth > 8 or not (
            isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Multiply, cst.Divide))
        ):
            return False
        return self._scaled_qk(chain.peek(expr.left), chain, depth + 1) or (
            isinstance(expr.operator, cst.Multiply) and self._scaled_qk(chain.peek(expr.right), chain, depth + 1)
        )

    def _foldable(self, scale) -> None:
        """A tensor scale folds into q only if it is the same for every key: q's features
        would take a scale that varies along the keys' dim otherwise."""
        shape = self.layouts.shape(scale)
        if shape and shape[-1] is not None and shape[-1] != "1":
            raise NotAttention(
                f"`{self.context.source(scale)}` varies along the keys (its last dim is {shape[-1]}): "
                "SDPA's scale= takes a float, and folding it into q would scale q's features instead"
            )

    def _positive(self, scale, divide: bool) -> bool:
        """sqrt(...), x ** -0.5, a positive literal, or 1 / one of these."""
        scale = scale.with_changes(lpar=[], rpar=[])
        number = _literal_float(scale)
        if number is not None:
            return number > 0
        if isinstance(scale, cst.Call) and self.context.names.is_(scale.func, "math.sqrt", "numpy.sqrt"):
            return True
        if isinstance(scale, cst.BinaryOperation) and isinstance(scale.operator, cst.Power):
            return _literal_float(scale.right) in (0.5, -0.5)
        if isinstance(scale, cst.BinaryOperation) and isinstance(scale.operator, cst.Divide):
            return (
                _literal_float(scale.left) is not None
                and _literal_float(scale.left) > 0
                and self._positive(scale.right, True)
            )
        return False

    def _qk(self, expr) -> tuple[cst.BaseExpression, cst.BaseExpression, Spec | None] | None:
        """(q, k, spec) for `q @ k^T` (k transposed in its last two dims by `.transpose`, `.mT`,
        `.permute`, or for 2-dim k `.T`) or an einsum contracting q and k."""
        product = self._product(expr) if isinstance(expr, (cst.BinaryOperation, cst.Call)) else None
        if product is None:
            return None
        q, kt, spec = product
        if spec is not None:
            return q, kt, spec
        k = self._transposed(kt, bmm=isinstance(expr, cst.Call) and self.context.names.is_(expr.func, "torch.bmm"))
        if (
            k is None
            and isinstance(kt, cst.Call)
            and isinstance(kt.func, cst.Attribute)
            and kt.func.attr.value in ("transpose", "permute")
            and self._strict
        ):
            raise NotAttention(
                f"`{self.context.source(kt)}` is not provably k with its last two dims swapped (its rank is not known)"
            )
        return (q, k, None) if k is not None else None

    def _transposed(self, expr, bmm: bool = False) -> cst.BaseExpression | None:
        """k for k with its last two dims swapped."""
        if isinstance(expr, cst.Attribute) and expr.attr.value in ("mT",):
            return expr.value
        if isinstance(expr, cst.Attribute) and expr.attr.value == "T" and self.layouts.rank(expr.value) == 2:
            return expr.value
        if not isinstance(expr, cst.Call) or not isinstance(expr.func, cst.Attribute):
            return None
        method = expr.func.attr.value
        values = [integer_value(a.value) for a in expr.args]
        if any(a.keyword is not None and a.keyword.value not in ("dim0", "dim1") for a in expr.args) or None in values:
            return None
        tensor = expr.func.value
        rank = 3 if bmm else self.layouts.rank(tensor)
        if method in ("transpose", "swapaxes") and len(values) == 2:
            if set(values) == {-2, -1}:
                return tensor
            if rank is not None and {normalize_dim(v, rank) for v in values} == {rank - 2, rank - 1}:
                return tensor
        if method == "permute" and rank is not None and len(values) == rank:
            order = [normalize_dim(v, rank) for v in values]
            if order == [*range(rank - 2), rank - 1, rank - 2]:
                return tensor
        return None

    def _last_dim(self, dim, attention: Attention) -> bool:
        value = integer_value(dim)
        if value == -1:
            return True
        if value is None or value < 0:
            return False
        rank = self._scores_rank(attention)
        return rank is not None and value == rank - 1

    def _scores_rank(self, attention: Attention) -> int | None:
        if attention.score_spec is not None and "." not in attention.score_spec.output:
            return len(attention.score_spec.output)
        ranks = [self.layouts.rank(attention.q), self.layouts.rank(attention.k)]
        return ranks[0] if ranks[0] is not None and ranks[0] == ranks[1] else None

    def _head_dims(self, attention: Attention) -> set[str]:
        code = self.context.source
        dims = {
            f"{code(t)}{suffix}"
            for t in (attention.q, attention.k)
            if attention.score_spec is None
            for suffix in (".size(-1)", ".shape[-1]")
        }
        sizes = set()
        for tensor in (attention.q, attention.k):
            shape = self.layouts.shape(tensor)
            if shape is not None and attention.score_spec is None and shape[-1] is not None:
                sizes.add(shape[-1])
        if attention.score_spec is not None:
            q_letters, k_letters = attention.score_spec.inputs
            contracted = [c for c in q_letters if c in k_letters and c not in attention.score_spec.output and c != "."]
            if len(contracted) == 1:
                for tensor, letters in ((attention.q, q_letters), (attention.k, k_letters)):
                    if "." not in letters:
                        position = letters.index(contracted[0])
                        dims |= {f"{code(tensor)}.size({position})", f"{code(tensor)}.shape[{position}]"}
                        if position == len(letters) - 1:
                            dims |= {f"{code(tensor)}.size(-1)", f"{code(tensor)}.shape[-1]"}
                        shape = self.layouts.shape(tensor)
                        if shape is not None and len(shape) == len(letters) and shape[position] is not None:
                            sizes.add(shape[position])
        return dims | {f"size:{s}" for s in sizes}

    def _is_default(self, scale, divide: bool, head_dims: set[str]) -> bool:
        """Is `scale` (a divisor when `divide`) provably 1/sqrt(head dim)?"""
        scale = scale.with_changes(lpar=[], rpar=[])
        if divide:
            return self._is_sqrt_of(scale, head_dims)
        if isinstance(scale, cst.BinaryOperation) and isinstance(scale.operator, cst.Divide):
            one = _literal_float(scale.left) == 1.0
            return one and self._is_sqrt_of(scale.right.with_changes(lpar=[], rpar=[]), head_dims)
        if isinstance(scale, cst.BinaryOperation) and isinstance(scale.operator, cst.Power):
            return self._is_head_dim(scale.left, head_dims) and _literal_float(scale.right) == -0.5
        return False

    def _is_sqrt_of(self, expr, head_dims: set[str]) -> bool:
        if (
            isinstance(expr, cst.Call)
            and len(expr.args) == 1
            and (self.context.names.is_(expr.func, "math.sqrt", "numpy.sqrt"))
        ):
            return self._is_head_dim(expr.args[0].value, head_dims)
        return (
            isinstance(expr, cst.BinaryOperation)
            and isinstance(expr.operator, cst.Power)
            and self._is_head_dim(expr.left, head_dims)
            and _literal_float(expr.right) == 0.5
        )

    def _is_head_dim(self, expr, head_dims: set[str]) -> bool:
        expr = expr.with_changes(lpar=[], rpar=[])
        if self.context.source(expr) in head_dims:
            return True
        size = self.layouts.size(expr)
        return size is not None and f"size:{size}" in head_dims

    # -- layouts -------------------------------------------------------------------

    def _layout(self, attention: Attention) -> None:
        """q, k, v in SDPA's (..., L, E) layout, and how to put its output in the product's."""
        scores, out = attention.score_spec, attention.out_spec
        if scores is None and out is None:
            return
        if scores is None or out is None:
            raise NotAttention("scores and values combined with an einsum on one side only")
        (q_letters, k_letters), s_letters = scores.inputs, scores.output
        (w_letters, v_letters), o_letters = out.inputs, out.output
        if len(s_letters) < 2 or len(w_letters) != len(s_letters) or "." in s_letters[-2:]:
            raise NotAttention("an einsum whose scores do not end with the query and key dims")
        qi, kj = s_letters[-2], s_letters[-1]
        batch = s_letters[:-2]
        rename = dict(zip(w_letters, s_letters))  # the weights' letters in the second einsum -> the scores'
        v_named = tuple(rename.get(c, c) if c in w_letters else c for c in v_letters)
        o_named = tuple(rename.get(c, c) if c in w_letters else c for c in o_letters)
        contracted = [c for c in q_letters if c in k_letters and c not in s_letters]
        values = [c for c in v_named if c not in s_letters]
        if len(contracted) != 1 or len(values) != 1 or qi in k_letters or kj in q_letters:
            raise NotAttention("an einsum that is not q and k contracted over one head dim")
        d, e = contracted[0], values[0]
        if (
            sorted(q_letters) != sorted((*batch, qi, d))
            or sorted(k_letters) != sorted((*batch, kj, d))
            or sorted(v_named) != sorted((*batch, kj, e))
            or sorted(o_named) != sorted((*batch, qi, e))
            or kj in o_named
        ):
            raise NotAttention("einsum letters that are not batch, query, key and head dims")
        attention.q = permuted(attention.q, q_letters, (*batch, qi, d))
        attention.k = permuted(attention.k, k_letters, (*batch, kj, d))
        attention.v_order = (v_named, (*batch, kj, e))
        attention.out_order = ((*batch, qi, e), o_named)

    # -- the rest ------------------------------------------------------------------

    def beside_fast_path(self, block: cst.IndentedBlock) -> bool:
        """In a branch of an `if` that calls scaled_dot_product_attention or tests a `flash` flag."""
        for current in self.context.index.ancestors(block):
            if isinstance(current, (cst.FunctionDef, cst.Module)):
                return False
            if isinstance(current, cst.If):
                code = self.context.source(current.test)
                if "flash" in code.lower() or "scaled_dot_product_attention" in code:
                    return True
                for call in self.context.index.find(cst.Call, within=current):
                    if (
                        isinstance(call.func, (cst.Attribute, cst.Name))
                        and (getattr(call.func, "attr", call.func).value == "scaled_dot_product_attention")
                        and self.context.names.is_(call.func, SDPA)
                    ):
                        return True
        return False


@dataclass
class _Scaled:
    """Scores scaled after their mask: `(s.masked_fill(m, -inf)) / sqrt(d)`."""

    scores: cst.BaseExpression
    scale: cst.BaseExpression
    divide: bool


@dataclass
class _Mask:
    kind: str  # "fill" (masked_fill: drop where True), "keep" (torch.where: keep where True), "add"
    condition: cst.BaseExpression  # the boolean mask, or the additive one
    value: cst.BaseExpression | None  # the fill
    optional: cst.BaseExpression | None = None  # `m` of `if m is not None:` around it


class _Chain:
    """The statements of one attention chain, read backwards from its product: each name's
    value is taken from the closest assignment before (`expand`), which the chain then
    consumes; assignments of other names between stay where they are."""

    def __init__(self, reader: Attentions, statements, index: int, attention: Attention) -> None:
        self.reader = reader
        self.statements = statements
        self.cursor = index
        self.attention = attention
        self.pending: list[tuple[str, _Mask, cst.BaseExpression]] = []
        self.strict = False  # past the softmax: a binding the chain cannot follow is reported

    def _position(self, node) -> int:
        """The index of the chain block's statement that holds `node` (the cursor if none does)."""
        index = self.reader.context.index
        if node not in index:
            return self.cursor
        for ancestor in [node, *index.ancestors(node)]:
            for i, statement in enumerate(self.statements):
                if statement is ancestor:
                    return i
        return self.cursor

    def _find(self, name: str, before: int | None = None):
        """(position, value, kind) of the closest statement before the cursor (or `before`) that
        binds `name`: an assignment, an in-place masked_fill_, or `if m is not None:` around one;
        None if another kind of statement binds it or none does."""
        skipped = []
        start = self.cursor if before is None else before
        for j in range(start - 1, -1, -1):
            statement = self.statements[j]
            simple = (
                statement.body[0]
                if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                else None
            )
            if (
                isinstance(simple, cst.Assign)
                and len(simple.targets) == 1
                and isinstance(simple.targets[0].target, cst.Name)
                and simple.targets[0].target.value == name
            ):
                return j, simple.value, "assign", skipped
            if (
                isinstance(simple, cst.Expr)
                and isinstance(simple.value, cst.Call)
                and isinstance(simple.value.func, cst.Attribute)
                and simple.value.func.attr.value == "masked_fill_"
                and isinstance(simple.value.func.value, cst.Name)
                and simple.value.func.value.value == name
            ):
                return j, simple.value, "inplace", skipped
            if (
                isinstance(simple, cst.AugAssign)
                and isinstance(simple.target, cst.Name)
                and simple.target.value == name
                and isinstance(simple.operator, cst.AddAssign)
            ):
                return j, simple, "augadd", skipped
            if isinstance(statement, cst.If) and self._optional_mask(statement, name) is not None:
                return j, statement, "optional", skipped
            if isinstance(simple, cst.Assign) and name in _bound_names(simple):
                return j, statement, "other", skipped
            if name in self.reader.context.bound_in(statement):
                return j, statement, "other", skipped
            skipped.append(j)  # kept where it is; what it reads and binds is checked against the chain
        return None

    def _optional_mask(self, statement: cst.If, name: str):
        """(m, value) for `if m is not None: name = <value>` (no else), value reading `name`."""
        test = statement.test
        if (
            statement.orelse is not None
            or not isinstance(statement.body, cst.IndentedBlock)
            or len(statement.body.body) != 1
            or not isinstance(test, cst.Comparison)
            or len(test.comparisons) != 1
            or not isinstance(test.comparisons[0].operator, cst.IsNot)
            or not (
                isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None"
            )
        ):
            return None
        line = statement.body.body[0]
        simple = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if (
            isinstance(simple, cst.Assign)
            and len(simple.targets) == 1
            and isinstance(simple.targets[0].target, cst.Name)
            and simple.targets[0].target.value == name
        ):
            return test.left, simple.value
        return None

    def peek(self, expr):
        """`expr`, or what the name `expr` holds where it is read (without consuming anything)."""
        if not isinstance(expr, cst.Name):
            return expr
        found = self._find(expr.value, min(self._position(expr), self.cursor))
        if found is None or found[2] not in ("assign",):
            return expr
        return found[1]

    def opaque(self, expr) -> bool:
        """Is `expr` a name unpacked, where it is read, from a value the rule does not read
        (`a, b, weights = out.split(...)`, `q, k, v = map(...)`)? Scores built up in a
        block (`if mask is not None: scores = scores + mask`) are not: they may be q @ k^T."""
        if not isinstance(expr, cst.Name):
            return False
        found = self._find(expr.value, min(self._position(expr), self.cursor))
        if found is None or found[2] != "other" or not isinstance(found[1], cst.SimpleStatementLine):
            return False
        simple = found[1].body[0]
        return isinstance(simple, cst.Assign) and any(
            isinstance(target.target, (cst.Tuple, cst.List)) for target in simple.targets
        )

    def expand(self, expr):
        if not isinstance(expr, cst.Name):
            return expr
        found = self._find(expr.value)
        if found is None:
            return expr
        j, value, kind, skipped = found
        if kind == "other":
            if self.strict:
                raise NotAttention(
                    f"`{expr.value}` is changed on line {self.reader.context.line(value)} by a statement "
                    "the rule does not follow"
                )
            return expr
        self.cursor = j
        self.attention.consumed.append(j)
        self.attention.links.append(expr.value)
        self.attention.skipped += skipped
        if kind == "assign":
            return value
        if kind == "augadd":
            self.pending.append((expr.value, _Mask("add", value.value.with_changes(lpar=[], rpar=[]), None), expr))
            return expr
        if kind == "inplace":
            fill, fill_value = positional(value, 0), positional(value, 1)
            if fill is None or fill_value is None or len(value.args) != 2:
                raise NotAttention("masked_fill_ with other than (mask, value) arguments")
            self.pending.append((expr.value, _Mask("fill", fill.value, fill_value.value), expr))
            return expr
        optional, inner = self._optional_mask(value, expr.value)
        masked = self.reader._masked(inner, self)
        if masked is None:
            raise NotAttention(
                f"`{expr.value}` is changed under `if {self.reader.context.source(optional)} is not None:` by "
                "other than a mask (a module passed in, whose effect the rule cannot see)"
            )
        mask, rest = masked
        if not (isinstance(rest, cst.Name) and rest.value == expr.value):
            raise NotAttention("the mask under `if ... is not None:` is not applied to the scores")
        self.pending.append((expr.value, _Mask(mask.kind, mask.condition, mask.value, optional), expr))
        return expr

    def pending_mask(self, scores):
        """The in-place or conditional mask met while expanding `scores`, with the name that
        still holds the scores before it."""
        if (
            self.pending
            and isinstance(scores, cst.Name)
            and self.pending[-1][0] == scores.value
            and self.pending[-1][2] is scores
        ):
            name, mask, node = self.pending.pop()
            return mask, cst.Name(name)
        return None

    def check(self, product) -> None:
        """Each intermediate is read once, by the next statement of the chain, and nowhere
        else; nothing the chain moves down to the product is changed by the lines it skips."""
        context = self.reader.context
        attention = self.attention
        chain = [self.statements[i] for i in attention.consumed] + [context.index.statement_of(product)]
        moved = [node for node in attention.origins if node in context.index]
        links = set(attention.links)
        for expr in moved:
            if expr is not None and read_names(context, expr) & links:
                raise NotAttention(f"`{context.source(expr)}` reads an intermediate of the attention")
        for j in attention.skipped:
            self._check_skipped(j, moved, links)
        for name in sorted(links):
            self._check_weights_not_read_elsewhere(name, chain)
        self._check_links_read_once(chain, links)

    def _check_skipped(self, j: int, moved: list, links: set[str]) -> None:
        """The statement the chain skips at `j` binds nothing the chain moves down to the
        product reads, nor an intermediate."""
        context = self.reader.context
        skipped = self.statements[j]
        bound_here = (
            set().union(*(_bound_names(small) for small in skipped.body))
            if isinstance(skipped, cst.SimpleStatementLine)
            else context.bound_in(skipped)
        )
        for expr in moved:
            if self._position(expr) > j:
                continue  # read after this statement: what it binds is what the chain read
            reads_here = read_names(context, expr)
            code = context.source(expr)
            for bound in bound_here:
                if bound in reads_here or ("." in bound or "[" in bound) and bound in code:
                    raise NotAttention(
                        f"line {context.line(skipped)} assigns `{bound}` between the attention's statements"
                    )
        for bound in bound_here & links:
            raise NotAttention(f"line {context.line(skipped)} assigns `{bound}` between the attention's statements")

    def _check_weights_not_read_elsewhere(self, name: str, chain: list) -> None:
        """The intermediate `name` is read by the chain's statements only (a name the
        product's statement binds again holds the output from there on)."""
        context = self.reader.context
        kinds = context.kinds
        intermediate_reads = [
            read
            for consumed in chain[:-1]
            for binding in kinds.bindings_in(consumed, name)
            for read in kinds.reached_reads(binding)
        ]
        for read in sorted(intermediate_reads, key=context.index.order):  # the first read is reported
            if not any(context.inside(read, s) for s in chain):
                guard = self._masked_under(read)
                if guard is not None:
                    raise NotAttention(
                        f"`{name}` is masked in place only when `{context.source(guard.test)}` (line "
                        f"{context.line(guard)}): SDPA would take that mask as `attn_mask` or `is_causal`, which "
                        "perfmod does not pass under a condition"
                    )
                raise NotAttention(
                    f"the attention weights `{name}` are also read on line {context.line(read)} "
                    "(SDPA does not return them)"
                )

    def _masked_under(self, read: cst.Name) -> cst.If | None:
        """The `if` (without `else`) whose block holds `read.masked_fill_(mask, value)` as a
        statement of its own: scores masked only when its test holds."""
        context = self.reader.context
        method = context.parents.get(read)
        call = context.parents.get(method)
        if not (
            isinstance(method, cst.Attribute)
            and method.attr.value == "masked_fill_"
            and isinstance(call, cst.Call)
            and isinstance(context.parents.get(call), cst.Expr)
        ):
            return None
        guard = context.index.block_owner(context.index.statement_of(call))
        return guard if isinstance(guard, cst.If) and guard.orelse is None else None

    def _check_links_read_once(self, chain: list, links: set[str]) -> None:
        """The chain's statements read each intermediate once (the reads the chain
        ignores aside)."""
        context = self.reader.context
        ignored = self.attention.ignored
        over = [
            n
            for s in chain
            for n in reads(context, s)
            if n.value in links and not any(context.inside(n, i) for i in ignored)
        ]
        if len(over) != len(self.attention.links):
            extra = over[-1]
            raise NotAttention(
                f"`{extra.value}` is read again on line {context.line(extra)}: SDPA does not return "
                "the attention weights or the scores"
            )


class _MaskReader:
    """What a mask expression built in the code means: "lower" (1 where key <= query: a
    causal keep-mask), "upper" (1 where key > query: the causal drop-mask), "additive" (0 on
    and below the diagonal, -inf above), or None. Follows names, self attributes and
    registered buffers, and the returns of local functions."""

    def __init__(self, reader: Attentions) -> None:
        self.reader = reader
        self.context = reader.context

    def read(self, expr, depth: int = 0):
        if depth > 8 or expr is None:
            return None
        expr = expr.with_changes(lpar=[], rpar=[]) if hasattr(expr, "lpar") and expr.lpar else expr
        reader = self._READERS.get(type(expr))
        return reader(self, expr, depth) if reader is not None else None

    def _read_name(self, expr: cst.Name, depth: int):
        value = self.reader.layouts.value_of(expr) if expr in self.context.index else None
        return self.read(value, depth + 1) if value is not None else None

    def _read_attribute(self, expr: cst.Attribute, depth: int):
        """A self attribute or registered buffer: the one meaning of all its values."""
        values = self.reader.context.kinds.attribute_values(expr)
        if not values:
            return None
        meanings = {self.read(v, depth + 1) for v in values}
        return meanings.pop() if len(meanings) == 1 else None

    def _read_subscript(self, expr: cst.Subscript, depth: int):
        return self.read(expr.value, depth + 1) if _top_left_square(expr, self.context) else None

    def _read_comparison(self, expr: cst.Comparison, depth: int):
        """`m == 0`, `m != 1`, `m == True`: a mask or its flip."""
        if len(expr.comparisons) != 1:
            return None
        target = expr.comparisons[0]
        inner = self.read(expr.left, depth + 1)
        value = _compared_number(target.comparator)
        if inner not in ("lower", "upper") or value not in (0.0, 1.0):
            return None
        if isinstance(target.operator, cst.Equal):
            return inner if value == 1.0 else _flip(inner)
        if isinstance(target.operator, cst.NotEqual):
            return _flip(inner) if value == 1.0 else inner
        return None

    def _read_unary(self, expr: cst.UnaryOperation, depth: int):
        if isinstance(expr.operator, cst.BitInvert):
            return _flip(self.read(expr.expression, depth + 1))
        return None

    def _read_call(self, expr: cst.Call, depth: int):
        func = expr.func
        qualified = self.context.names.of(func) if is_dotted_name(func) else set()
        if isinstance(func, cst.Attribute) and not qualified:
            return self._read_method(expr, func.attr.value, func.value, depth)
        if qualified & {"torch.tril", "torch.triu"} and expr.args:
            diagonal = positional(expr, 1) or kwarg(expr, "diagonal")
            return self._triangle(
                next(iter(qualified)).rsplit(".", 1)[1],
                expr.args[0].value,
                diagonal.value if diagonal is not None else None,
            )
        if qualified & {"torch.logical_not"} and expr.args:
            return _flip(self.read(expr.args[0].value, depth + 1))
        function = self.context.bindings.local_function(func) if isinstance(func, cst.Name) else None
        if function is not None:
            values = returned_values(function)
            if len(values) == 1:
                return self.read(values[0], depth + 1)
        return None

    def _read_method(self, expr: cst.Call, method: str, receiver, depth: int):
        """A method of a mask: one that keeps its meaning (a cast, a view adding only
        leading dims of 1), `logical_not`, `tril` / `triu`, `masked_fill`."""
        if method in MASK_KEEPING_METHODS and (
            method not in ("view", "reshape", "expand") or all(integer_value(a.value) == 1 for a in expr.args[:-2])
        ):
            return self.read(receiver, depth + 1)
        if method == "logical_not" and not expr.args:
            return _flip(self.read(receiver, depth + 1))
        if method in ("tril", "triu"):
            return self._triangle(method, receiver, expr.args[0].value if expr.args else None)
        if method == "masked_fill" and len(expr.args) == 2:
            return self._additive(receiver, expr.args[0].value, expr.args[1].value, depth)
        return None

    _READERS = {
        cst.Name: _read_name,
        cst.Attribute: _read_attribute,
        cst.Subscript: _read_subscript,
        cst.Comparison: _read_comparison,
        cst.UnaryOperation: _read_unary,
        cst.Call: _read_call,
    }

    def _triangle(self, which: str, base, diagonal) -> str | None:
        offset = integer_value(diagonal) if diagonal is not None else 0
        filled = self._square_fill(base)
        if filled == "ones":
            if which == "tril" and offset == 0:
                return "lower"
            if which == "triu" and offset == 1:
                return "upper"
        if filled == "-inf" and which == "triu" and offset == 1:
            return "additive"
        return None

    def _square_fill(self, expr) -> str | None:
        """ "ones" for torch.ones(n, n) (any dtype, device), "-inf" for torch.full((n, n), -inf)."""
        if isinstance(expr, cst.Name) and expr in self.context.index:
            value = self.reader.layouts.value_of(expr)
            return self._square_fill(value) if value is not None else None
        if not isinstance(expr, cst.Call):
            return None
        names = self.context.names.of(expr.func)
        sizes = [a.value for a in expr.args if a.keyword is None]
        if names & {"torch.ones"}:
            if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
                sizes = [e.value for e in sizes[0].elements]
            return "ones" if _square(sizes, self.context) else None
        if names & {"torch.full"} and len(sizes) == 2 and isinstance(sizes[0], (cst.Tuple, cst.List)):
            if _square([e.value for e in sizes[0].elements], self.context) and self.reader._fill(sizes[1]) == "-inf":
                return "-inf"
        return None

    def _additive(self, receiver, condition, value, depth) -> str | None:
        """`torch.zeros(n, n).masked_fill(<upper>, -inf)`: the additive causal mask."""
        if not (isinstance(receiver, cst.Call) and self.context.names.of(receiver.func) & {"torch.zeros"}):
            return None
        if self.reader._fill(value) != "-inf":
            return None
        return "additive" if self.read(condition, depth + 1) == "upper" else None


def _compared_number(comparator) -> float | None:
    """The number a mask is compared with: a literal, or 1.0 / 0.0 for `True` / `False`."""
    if isinstance(comparator, cst.Name) and comparator.value in ("False", "True"):
        return 1.0 if comparator.value == "True" else 0.0
    return _literal_float(comparator)


def _flip(meaning):
    return {"lower": "upper", "upper": "lower"}.get(meaning)


def _square(sizes, context) -> bool:
    code = context.source if all(s in context.index for s in sizes) else cst.Module([]).code_for_node
    return len(sizes) == 2 and code(sizes[0]) == code(sizes[1])


def _top_left_square(subscript: cst.Subscript, context) -> bool:
    """`m[:T, :T]`, `m[:, :, :T, :T]`, `m[None, None]`, `m[:T, :T][None]`: the top-left T x T
    corner, maybe with leading full slices or new dims."""
    elements = list(subscript.slice)
    kinds = []
    for element in elements:
        s = element.slice
        if isinstance(s, cst.Index) and isinstance(s.value, cst.Name) and s.value.value == "None":
            kinds.append("new")
        elif isinstance(s, cst.Slice) and s.step is None and s.lower is None:
            kinds.append("full" if s.upper is None else context.source(s.upper) if s.upper in context.index else "?")
        else:
            return False
    sliced = [k for k in kinds if k not in ("new", "full")]
    if not sliced:
        return True
    tail = kinds[-2:]
    return len(sliced) == 2 and tail == sliced and sliced[0] == sliced[1] and sliced[0] != "?"


def _literal_float(expr) -> float | None:
    expr = expr.with_changes(lpar=[], rpar=[]) if hasattr(expr, "lpar") and expr.lpar else expr
    number = number_value(expr)
    if number is not None:
        return float(number)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        inner = _literal_float(expr.expression)
        return -inner if inner is not None else None
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Name)
        and expr.func.value == "float"
        and len(expr.args) == 1
        and isinstance(expr.args[0].value, cst.SimpleString)
    ):
        try:
            return float(expr.args[0].value.evaluated_value)
        except ValueError:
            return None
    return None


def _optional(mask: _Mask, value: cst.BaseExpression) -> cst.BaseExpression:
    """`value`, or `None if m is None else value` for a mask applied under `if m is not None:`."""
    if mask.optional is None:
        return value
    if (
        mask.kind == "add"
        and isinstance(value, cst.Name)
        and isinstance(mask.optional, cst.Name)
        and value.value == mask.optional.value
    ):
        return value  # attn_mask=None is no mask
    return cst.IfExp(
        test=cst.Comparison(mask.optional, [cst.ComparisonTarget(cst.Is(), cst.Name("None"))]),
        body=cst.Name("None"),
        orelse=value,
    )


def _negated(condition: cst.BaseExpression) -> cst.BaseExpression:
    """The keep-mask for a masked_fill drop-mask: `m == 0` -> `m != 0`, `~m` -> `m`, `m` -> `~m`."""
    if isinstance(condition, cst.Comparison) and len(condition.comparisons) == 1:
        target = condition.comparisons[0]
        flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(target.operator))
        if flipped is not None:
            return condition.with_changes(
                comparisons=[
                    target.with_changes(
                        operator=flipped(
                            whitespace_before=target.operator.whitespace_before,
                            whitespace_after=target.operator.whitespace_after,
                        )
                    )
                ]
            )
    if isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, cst.BitInvert):
        return condition.expression.with_changes(lpar=[], rpar=[])
    if (
        isinstance(condition, cst.Call)
        and isinstance(condition.func, cst.Attribute)
        and condition.func.attr.value == "logical_not"
        and not condition.args
    ):
        return condition.func.value
    return cst.UnaryOperation(cst.BitInvert(), atom(condition))


def permuted(expr: cst.BaseExpression, letters, target) -> cst.BaseExpression:
    """`expr` (dims named `letters`) with its dims in `target`'s order: as is, one transpose, or a permute."""
    letters, target = tuple(letters), tuple(target)
    if letters == target:
        return expr
    if "." in letters:
        raise NotAttention("an einsum with `...` that needs its dims moved")
    order = [letters.index(c) for c in target]
    moved = [i for i, j in enumerate(order) if i != j]
    if len(moved) == 2:
        a, b = moved
        call = f"transpose({a}, {b})"
    else:
        call = f"permute({', '.join(str(i) for i in order)})"
    return (
        cst.parse_expression(f"({cst.Module([]).code_for_node(expr)}).{call}")
        if not isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
        else cst.Call(
            cst.Attribute(expr, cst.Name(call.split("(")[0])),
            [
                cst.Arg(cst.Integer(n.strip()))
                if not n.strip().startswith("-")
                else cst.Arg(cst.parse_expression(n.strip()))
                for n in call[call.index("(") + 1 : -1].split(",")
            ],
        )
    )


def _product(factors: list[tuple[cst.BaseExpression, bool]]) -> cst.BaseExpression:
    """The product of the factors (each a divisor where its flag says so), in their order."""
    first, divide = factors[0]
    product = _reciprocal(first) if divide else first.with_changes(lpar=[], rpar=[])
    for factor, divide in factors[1:]:
        factor = factor.with_changes(lpar=[], rpar=[])
        if not (isinstance(factor, cst.BinaryOperation) and isinstance(factor.operator, cst.Power)):
            factor = atom(factor)  # `s * (C // h)`: `//` would take the product as its left
        if isinstance(product, cst.BinaryOperation) and not isinstance(
            product.operator, (cst.Multiply, cst.Divide, cst.Power)
        ):
            product = atom(product)
        product = cst.BinaryOperation(product, cst.Divide() if divide else cst.Multiply(), factor)
    return product


def _reciprocal(divisor: cst.BaseExpression) -> cst.BaseExpression:
    """`1 / divisor`, parenthesizing a divisor that binds less tightly than `/`'s right operand."""
    divisor = divisor.with_changes(lpar=[], rpar=[])
    if isinstance(divisor, cst.BinaryOperation) and not isinstance(divisor.operator, cst.Power):
        divisor = atom(divisor)
    return cst.BinaryOperation(cst.Integer("1"), cst.Divide(), divisor)


def _bound_names(assign) -> set[str]:
    """What an assignment binds: names, and the code of attribute / subscript targets."""
    bound = set()
    module = cst.Module([])
    if not isinstance(assign, cst.Assign):
        return bound

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
