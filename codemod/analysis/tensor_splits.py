"""Loops over batches cut by `split`, and whether a DataLoader gives the same batches.

`for xb, yb in zip(X.split(bs), Y.split(bs))` (also `torch.split(X, bs)`, and one
tensor alone, `for xb in X.split(bs)`) visits the batches that
`DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False)` gives, in the same
order, when it is proven that:

- every tensor is split along its first dimension into batches of one size, the same
  expression for all, a Python int (not a list of section sizes);
- every tensor is a tensor in host memory, not re-bound in the loop nor written in
  place (its batches are views of it);
- the tensors have the same length (zip stops at the shortest, a TensorDataset
  requires equal ones), followed through parameters to what every call passes;
- every batch is bound to a name.

- `tensor_splits(context).of(loop)`: the TensorSplit a `for` iterates over, or None when
  it does not iterate splits only; `TensorSplit.problem` is None when a DataLoader gives
  the same batches, "" when the loop is not one to rewrite (tensors already on the
  device, where a split is the fastest batch; windows along another dimension are not
  read as splits at all), otherwise the reason, in words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.names import integer_value, kwarg, method_name
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.values import Kind, Place

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "tensor_splits"


def tensor_splits(context: FileContext) -> TensorSplits:
    return context.shared(KEY, TensorSplits)


@dataclass(frozen=True, eq=False)
class TensorSplit:
    """`loop` iterates `iterable` (the `zip(...)` call, or the one split), the batches of
    `tensors` cut in `batch_size`, bound to `targets`."""

    loop: cst.For
    iterable: cst.BaseExpression
    tensors: list[cst.Name]
    batch_size: cst.BaseExpression
    targets: list[cst.BaseExpression]
    problem: str | None


class TensorSplits:
    """The split-batch loops of one file (see the module's docstring)."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    def of(self, loop: cst.For) -> TensorSplit | None:
        found = self.context.loaders.iterated(loop.iter, loop.target)
        splits = [self.split_of(iterable) for iterable, _ in found]
        if not splits or any(split is None for split in splits):
            return None
        if len(splits) == 1:  # `for xb in X.split(bs)`
            iterable = found[0][0]
            if loop.iter is not iterable or not isinstance(loop.target, cst.Name):
                return None
        else:
            parents = self.context.parents
            iterable = parents.get(parents.get(found[0][0]))
            if not isinstance(iterable, cst.Call) or not all(
                parents.get(parents.get(each)) is iterable for each, _ in found
            ):
                return None
        targets = [target for _, target in found]
        return TensorSplit(
            loop,
            iterable,
            [tensor for tensor, _ in splits],
            splits[0][1],
            targets,
            self._problem(loop, splits, targets),
        )

    def split_of(self, expr: cst.BaseExpression) -> tuple[cst.Name, cst.BaseExpression] | None:
        """(X, bs) for `X.split(bs)` / `torch.split(X, bs)` along the first dimension."""
        if not isinstance(expr, cst.Call) or any(a.star for a in expr.args):
            return None
        positional_values = [a.value for a in expr.args if a.keyword is None]
        if method_name(expr) == "split" and not self.context.names.of(expr.func):
            tensor, rest = expr.func.value, positional_values
        elif self.context.names.is_(expr.func, "torch.split") and positional_values:
            tensor, rest = positional_values[0], positional_values[1:]
        else:
            return None
        dim = kwarg(expr, "dim")
        sizes = kwarg(expr, "split_size_or_sections") or kwarg(expr, "split_size")
        if sizes is not None:
            rest = [*rest, sizes.value]
        if len(rest) == 2 and dim is None:
            rest, dim_value = rest[:1], rest[1]
        else:
            dim_value = dim.value if dim is not None else None
        if len(rest) != 1 or not isinstance(tensor, cst.Name):
            return None
        if dim_value is not None and integer_value(dim_value) != 0:
            return None  # windows along another dimension (time, for truncated BPTT)
        return tensor, rest[0]

    def _problem(self, loop: cst.For, splits: list, targets: list) -> str | None:
        kinds, shapes, source = self.context.kinds, layouts(self.context), self.context.source
        batch_size = splits[0][1]
        if not all(_same(size, batch_size) for _, size in splits):
            return "the tensors are split into batches of different sizes"
        if not (shapes.is_number(batch_size) or self.context.training.is_int(batch_size)):
            return f"perfmod cannot tell that `{source(batch_size)}` is one batch size, not a list of sizes"
        lengths = []
        for tensor, _ in splits:
            fact = kinds.fact(tensor)
            if fact.kind is Kind.TENSOR and fact.place in (Place.CUDA, Place.DEVICE):
                return ""  # batches of tensors already on the device: a split is the fastest batch
            if fact.kind is not Kind.TENSOR or fact.place is not Place.HOST:
                return f"`{tensor.value}` is not known to be a tensor in host memory"
            if bound_in(self.context, tensor.value, loop):
                return f"`{tensor.value}` is re-bound inside the loop"
            if kinds.is_mutated_in_place(tensor):
                return f"`{tensor.value}` is written in place, and its batches would no longer be views of it"
            lengths.append(shapes.leading_size(tensor))
        if not all(length is not None and shapes.same_size(length, lengths[0]) for length in lengths):
            names = " / ".join(f"`{tensor.value}`" for tensor, _ in splits)
            return (
                f"perfmod cannot tell that {names} have the same length (zip stops at the shortest, "
                "a TensorDataset requires equal ones)"
            )
        for target in targets:
            if not isinstance(target, cst.Name):
                return f"the batch `{source(target)}` is not bound to a name"
        return None


def bound_in(context: FileContext, name: str, region: cst.CSTNode) -> bool:
    """Is `name` assigned anywhere inside `region`?"""
    scope = context.scopes.get(region)
    if scope is None or name not in scope:
        return False
    return any(isinstance(a.node, cst.CSTNode) and context.inside(a.node, region) for a in scope.assignments[name])


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return a.deep_equals(b)
